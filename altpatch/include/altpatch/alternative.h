/* SPDX-License-Identifier: MIT */
/**
 * @file alternative.h
 * @brief Mark instruction sites that altpatch_apply() may rewrite.
 *
 * A *site* is a sequence of original instructions ("oldinstr") that is always
 * correct, padded with one-byte NOPs up to the length of its longest
 * replacement. Each replacement ("newinstr") lives in the section
 * `altinstr_replacement`, once per distinct text in a translation unit, and
 * each (site, replacement, feature) triple is described by one 12-byte
 * record in the section `altinstr_table` (format 3: the Linux kernel's
 * `struct alt_instr` before 6.3), or a 14-byte one in `altinstructions`
 * (format 1: Linux 6.3 on) where ALTPATCH_KERNEL_RECORDS is defined before
 * the first include; see docs/format.md.
 *
 *     asm volatile(ALTERNATIVE("movq %%fs:0, %0", "rdfsbase %0",
 *                              X86_FEATURE_FSGSBASE) : "=r"(v));
 *
 * The kernel-compatible names `ALTERNATIVE`, `ALTERNATIVE_2`, `ALTERNATIVE_3`,
 * `ALT_NOT`, `alternative()` and `alternative_io()` are the documented
 * exception to the `altpatch_` prefix rule.
 *
 * Nomenclature (as in the kernel):
 *   771  start of the site (original instructions)
 *   772  end of the original instructions, start of the NOP padding
 *   773  end of the site
 *   774  start of the replacement (in altinstr_replacement)
 *   775  end of the replacement
 *
 * Every expansion also emits, once per object file and once per linked module
 * (a COMDAT group), the ELF note `.note.altpatch` that tells the runtime and
 * the tools where the tables of this module are and which format version they
 * use. The note holds only self-relative offsets: no dynamic relocation.
 */
#ifndef ALTPATCH_ALTERNATIVE_H
#define ALTPATCH_ALTERNATIVE_H

#include <altpatch/cpufeatures.h>

/** Format 1: the Linux kernel's 14-byte `struct alt_instr` in `altinstructions`. */
#define ALTPATCH_FORMAT_KERNEL 1
/** Size in bytes of a format-1 record. */
#define ALTPATCH_RECORD_SIZE_KERNEL 14
/** Format 3: 12-byte records (Linux's layout before 6.3) in `altinstr_table`. */
#define ALTPATCH_FORMAT_COMPACT 3
/** Size in bytes of a format-3 record. */
#define ALTPATCH_RECORD_SIZE_COMPACT 12

/*
 * What this header emits (see docs/format.md): format 3, or format 1 where
 * ALTPATCH_KERNEL_RECORDS is defined before the first include. Readers of
 * this library take both. The two formats use different record sections, so
 * a module that links objects of both formats patches the sites of one of
 * them (the format of the note the linker kept) and leaves the others'
 * original bytes in place.
 */
#ifdef ALTPATCH_KERNEL_RECORDS
#define ALTPATCH_FORMAT_VERSION ALTPATCH_FORMAT_KERNEL
#define ALTPATCH_RECORD_SIZE ALTPATCH_RECORD_SIZE_KERNEL
#define ALTPATCH_TABLE_NAME_ altinstructions
#else
#define ALTPATCH_FORMAT_VERSION ALTPATCH_FORMAT_COMPACT
#define ALTPATCH_RECORD_SIZE ALTPATCH_RECORD_SIZE_COMPACT
#define ALTPATCH_TABLE_NAME_ altinstr_table
#endif
/** ELF note owner name and type of the table note. */
#define ALTPATCH_NOTE_NAME "altpatch"
#define ALTPATCH_NOTE_TYPE 0x41505431 /* 'APT1' */
/**
 * Type and descriptor size of the plan note: space the header reserves next
 * to the table note (zeros as compiled) where altprepatch records the plan it
 * wrote into the sites, so that a pre-patched module's first apply settles
 * from loaded memory without reading its file (docs/format.md, "The plan
 * note"). Define ALTPATCH_NO_PLAN_NOTE before the first include to leave it
 * out: a pre-patched copy then reads its file to settle, as before the note.
 */
#define ALTPATCH_PLAN_NOTE_TYPE 0x41504c31 /* 'APL1' */
#define ALTPATCH_PLAN_NOTE_SIZE 176

/** Flags live in the upper 16 bits of an ft_flags word (a format-1 record holds it as is). */
#define ALT_FLAGS_SHIFT 16
/** Patch when the feature is *absent*. */
#define ALT_FLAG_NOT (1 << 0)
/** Replacement is taken when @p feature is NOT usable. */
#define ALT_NOT(feature) ((ALT_FLAG_NOT << ALT_FLAGS_SHIFT) | (feature))

#define ALTPATCH_STR_(x) #x
#define ALTPATCH_STR(x) ALTPATCH_STR_(x)
#define ALTPATCH_PASTE2_(a, b) a##b
#define ALTPATCH_PASTE_(a, b) ALTPATCH_PASTE2_(a, b)

/* The plan note, in the same section right after the table note (one per
 * module with it). */
#ifdef ALTPATCH_NO_PLAN_NOTE
#define ALTPATCH_PLAN_NOTE_ ""
#else
#define ALTPATCH_PLAN_NOTE_                                                                \
    ".long 9\n"                                                                            \
    ".long " ALTPATCH_STR(ALTPATCH_PLAN_NOTE_SIZE) "\n"                                     \
    ".long " ALTPATCH_STR(ALTPATCH_PLAN_NOTE_TYPE) "\n"                                     \
    ".asciz \"altpatch\"\n"                                                                \
    ".balign 4\n"                                                                          \
    ".zero " ALTPATCH_STR(ALTPATCH_PLAN_NOTE_SIZE) "\n"
#endif

/* One note per module: the .ifndef keeps it to one per object file, the COMDAT
 * group to one per linked module. */
#define ALTPATCH_NOTE_                                                                     \
    ".ifndef .Laltpatch_note_emitted\n"                                                    \
    ".set .Laltpatch_note_emitted, 1\n"                                                    \
    ".hidden " ALTPATCH_STR(ALTPATCH_PASTE_(__start_, ALTPATCH_TABLE_NAME_)) ", "              \
    ALTPATCH_STR(ALTPATCH_PASTE_(__stop_, ALTPATCH_TABLE_NAME_)) "\n"                        \
    ".hidden __start_altinstr_replacement, __stop_altinstr_replacement\n"                  \
    ".pushsection .note.altpatch,\"aGR\",@note,.note.altpatch,comdat\n"                     \
    ".balign 4\n"                                                                          \
    ".long 9\n"                             /* namesz: "altpatch\0" */                     \
    ".long 24\n"                            /* descsz */                                   \
    ".long " ALTPATCH_STR(ALTPATCH_NOTE_TYPE) "\n"                                         \
    ".asciz \"altpatch\"\n"                                                                \
    ".balign 4\n"                                                                          \
    ".long " ALTPATCH_STR(ALTPATCH_FORMAT_VERSION) "\n"                                    \
    ".long " ALTPATCH_STR(ALTPATCH_RECORD_SIZE) "\n"                                       \
    ".long " ALTPATCH_STR(ALTPATCH_PASTE_(__start_, ALTPATCH_TABLE_NAME_)) " - .\n"          \
    ".long " ALTPATCH_STR(ALTPATCH_PASTE_(__stop_, ALTPATCH_TABLE_NAME_)) " - .\n"           \
    ".long __start_altinstr_replacement - .\n"                                             \
    ".long __stop_altinstr_replacement - .\n"                                              \
    ALTPATCH_PLAN_NOTE_                                                                    \
    ".popsection\n"                                                                        \
    ".endif\n"

/*
 * Replacements are shared: each distinct replacement text is assembled once per
 * translation unit, and every site that uses it points its record at that one
 * copy. The copy is named after the replacement's text as the assembler sees it
 * (after operand substitution): the text stringified twice is a quoted symbol
 * name that holds any character, the text stringified three times names the
 * end of the copy. `.ifndef` on the first name skips every later copy. A
 * relative operand of a replacement (call, jmp, RIP-relative load) designates
 * the same target from every copy of the same text, and the runtime relocates
 * it from wherever the copy lies, so sharing changes no site's final bytes.
 *
 * A replacement whose bytes depend on where it is assembled (it refers to a
 * numeric label outside itself, or to `.`) is not the same code at two sites:
 * define ALTPATCH_UNSHARED_REPLACEMENTS before including this header to give
 * every site its own copy, as the kernel does.
 */
#ifdef ALTPATCH_UNSHARED_REPLACEMENTS
#define ALTPATCH_REPL_START_(newinstr) "774f"
#define ALTPATCH_REPL_END_(newinstr) "775f"
#define ALTPATCH_REPL_FIRST_(newinstr) ""
#define ALTPATCH_REPL_LAST_(newinstr)                                                      \
    ".pushsection altinstr_replacement,\"ax?R\"\n"                                          \
    "774:\n\t" newinstr "\n775:\n"                                                         \
    ".popsection\n"
#else
#define ALTPATCH_REPL_START_(newinstr) ALTPATCH_STR(ALTPATCH_STR_(newinstr))
#define ALTPATCH_REPL_END_(newinstr) ALTPATCH_STR(ALTPATCH_STR(ALTPATCH_STR_(newinstr)))
/* Outside any section group: sites in different groups (C++ inline functions)
 * share it, and a group the linker discards does not take it along. */
#define ALTPATCH_REPL_FIRST_(newinstr)                                                     \
    ".ifndef " ALTPATCH_REPL_START_(newinstr) "\n"                                         \
    ".pushsection altinstr_replacement,\"axR\"\n"                                          \
    ALTPATCH_REPL_START_(newinstr) ":\n"                                                   \
    "774:\n\t" newinstr "\n775:\n"                                                         \
    ALTPATCH_REPL_END_(newinstr) ":\n"                                                     \
    ".popsection\n"                                                                        \
    ".endif\n"
#define ALTPATCH_REPL_LAST_(newinstr) ""
#endif

/* @p newinstr into altinstr_replacement, once per translation unit: before
 * the entries that use it (ALTPATCH_UNSHARED_REPLACEMENTS: a copy per use,
 * after its entry, as in the kernel). */
#define ALTPATCH_REPLACEMENT_(newinstr) ALTPATCH_REPL_FIRST_(newinstr) ALTPATCH_REPL_LAST_(newinstr)

#define ALTPATCH_ALT_SLEN_ "772b-771b"
#define ALTPATCH_ALT_TOTAL_SLEN_ "773b-771b"
#define ALTPATCH_ALT_RLEN_(newinstr)                                                       \
    "(" ALTPATCH_REPL_END_(newinstr) "-" ALTPATCH_REPL_START_(newinstr) ")"

/* The original, padded with 0x90 up to the replacement's length. The
 * comparison yields -1 when true in GNU as and LLVM's assembler alike. With
 * shared replacements the length is often known where the padding is
 * assembled, and GNU as warns about a `.skip` of 0 bytes but not about a
 * `.fill` of 0 bytes; both assemblers defer either until the length is known. */
#ifdef ALTPATCH_UNSHARED_REPLACEMENTS
#define ALTPATCH_PAD_(n) ".skip " n ",0x90\n"
#else
#define ALTPATCH_PAD_(n) ".fill " n ",1,0x90\n"
#endif
#define ALTPATCH_OLDINSTR_(oldinstr, newinstr)                                             \
    "771:\n\t" oldinstr "\n772:\n"                                                         \
    ALTPATCH_PAD_("-(((" ALTPATCH_ALT_RLEN_(newinstr) ")-(" ALTPATCH_ALT_SLEN_ ")) > 0) * " \
                  "((" ALTPATCH_ALT_RLEN_(newinstr) ")-(" ALTPATCH_ALT_SLEN_ "))")          \
    "773:\n"

/*
 * The feature word of a record. Format 1: ft_flags as is (u32). Format 3:
 * u16, bits 0..14 the feature, bit 15 ALT_FLAG_NOT; any other flag or a
 * feature id above 0x7fff cannot be written there and stops the assembly.
 */
#ifdef ALTPATCH_KERNEL_RECORDS
#define ALTPATCH_FT_(ft) " .4byte " ft "\n"
#else
#define ALTPATCH_FT_(ft)                                                                   \
    ".if (" ft ") & 0xfffe8000\n"                                                           \
    ".error \"altpatch: format-3 records hold a feature id below 0x8000 and only the "       \
    "ALT_NOT flag\"\n"                                                                       \
    ".endif\n"                                                                              \
    " .2byte ((" ft ") & 0x7fff) | (((" ft ") >> 1) & 0x8000)\n"
#endif

#define ALTPATCH_ENTRY_(ft_flags, newinstr)                                                \
    ".pushsection " ALTPATCH_STR(ALTPATCH_TABLE_NAME_) ",\"a?R\"\n"                        \
    " .long 771b - .\n"                                                                    \
    " .long " ALTPATCH_REPL_START_(newinstr) " - .\n"                                      \
    ALTPATCH_FT_(ALTPATCH_STR(ft_flags))                                                   \
    " .byte " ALTPATCH_ALT_TOTAL_SLEN_ "\n"                                                \
    " .byte " ALTPATCH_ALT_RLEN_(newinstr) "\n"                                            \
    ".popsection\n"

/**
 * Asm string of a site: run @p oldinstr, or @p newinstr where @p ft_flags holds
 * (a feature id, optionally wrapped in ALT_NOT()).
 */
#define ALTERNATIVE(oldinstr, newinstr, ft_flags)                                          \
    ALTPATCH_NOTE_                                                                         \
    ALTPATCH_REPL_FIRST_(newinstr)                                                         \
    ALTPATCH_OLDINSTR_(oldinstr, newinstr)                                                 \
    ALTPATCH_ENTRY_(ft_flags, newinstr)                                                    \
    ALTPATCH_REPL_LAST_(newinstr)

/**
 * Two replacements; nested like the kernel's (6.11+): the entries are
 * consecutive, the longest instrlen is the site, and the last entry whose
 * feature condition holds wins (so @p newinstr2 beats @p newinstr1).
 */
#define ALTERNATIVE_2(oldinstr, newinstr1, ft_flags1, newinstr2, ft_flags2)                \
    ALTERNATIVE(ALTERNATIVE(oldinstr, newinstr1, ft_flags1), newinstr2, ft_flags2)

/** Three replacements; see ALTERNATIVE_2(). */
#define ALTERNATIVE_3(oldinstr, newinstr1, ft_flags1, newinstr2, ft_flags2, newinstr3,     \
                      ft_flags3)                                                           \
    ALTERNATIVE(ALTERNATIVE_2(oldinstr, newinstr1, ft_flags1, newinstr2, ft_flags2),       \
                newinstr3, ft_flags3)

/** A site with no operands: asm volatile, clobbers memory. */
#define alternative(oldinstr, newinstr, ft_flags)                                          \
    __asm__ __volatile__(ALTERNATIVE(oldinstr, newinstr, ft_flags) : : : "memory")

/**
 * A site with operands: @p output is one output operand, the rest are inputs.
 * As in the kernel, the input list starts with operand number 1.
 */
#define alternative_io(oldinstr, newinstr, ft_flags, output, ...)                          \
    __asm__ __volatile__(ALTERNATIVE(oldinstr, newinstr, ft_flags)                         \
                         : output                                                          \
                         : __VA_ARGS__)

#endif /* ALTPATCH_ALTERNATIVE_H */
