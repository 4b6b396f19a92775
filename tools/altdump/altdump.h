/* SPDX-License-Identifier: MIT */
/*
 * altdump: internal interfaces between the tool's modules.
 *
 *   elfread.c   libelf -> struct ad_image (sections, relocated copies for .o,
 *               note, view, records, sites, symbols); the fuzzed path
 *   symbols.c   address -> symbol+offset
 *   decide.c    runs the library's planner over every site
 *   text.c      the readable table and the per-site lines of --check
 *   json.c      a tiny JSON writer and every view in JSON
 *   size.c      --size and --compare
 *   pidmem.c    --pid: /proc/PID/maps + /proc/PID/mem
 *   main.c      options, exit codes
 *
 * Nomenclature follows docs/format.md and <altpatch/image.h> (record, site,
 * original, replacement, final). Public headers only: the records, the view
 * and every plan come from the library's image API
 * (altpatch_image_open_regions), which builds its view, groups the records
 * and plans every site as the runtime does.
 */
#ifndef ALTDUMP_H
#define ALTDUMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>
#include <altpatch/image.h>

#include "kernel.h"

/** Longest site (a record's u8 length). */
#define AD_MAX_SITE 255
/** Note format versions of pre-patched files (docs/format.md): of format 1, of format 3. */
#define AD_FORMAT_PREPATCHED 2
#define AD_FORMAT_COMPACT_PREPATCHED 4
/** The section of a pre-patched file that keeps the originals. */
#define AD_PREPATCH_SECTION ".altpatch.orig"

/** Bytes at an address: a table, the replacements, one text region. */
struct ad_region {
    uint64_t addr;
    uint64_t size;
    const uint8_t *data;
};

/** The altpatch note's descriptor, resolved to addresses (docs/format.md). */
struct ad_note {
    uint32_t version, record_size;
    uint64_t table_start, table_end; /* altinstructions */
    uint64_t repl_start, repl_end;   /* altinstr_replacement */
};

/** One record, decoded (altpatch_image_site_entry()). */
struct ad_entry {
    uint64_t site;     /* address of the original */
    uint64_t repl;     /* address of the replacement */
    uint16_t feature;  /* X86_FEATURE_* (a kernel's numbering for kernel images) */
    uint16_t flags;    /* ALT_FLAG_* */
    uint8_t instrlen;
    uint8_t repllen;
    uint32_t index;    /* position in the table */
};

/** One site: entries[first .. first+count) share the address @c addr. */
struct ad_site {
    uint64_t addr;
    uint32_t first, count;
    uint8_t len;
    int reason;          /* refusal known from the table alone, else 0 */
    const uint8_t *orig; /* the original bytes (owned by the image), NULL outside the text */
};

/** The plan of one site (altpatch_image_plan(), then the kernel's direct calls). */
struct ad_plan {
    int reason;       /* ALTPATCH_REASON_*; NONE when final is valid */
    int bad_entry;    /* entry (within the site) that caused a refusal, or -1 */
    int chosen;       /* entry (within the site) selected; -1 = original */
    uint8_t len;      /* site length */
    uint8_t orig[AD_MAX_SITE];
    uint8_t final[AD_MAX_SITE]; /* == orig when chosen == -1 or refused */
    char detail[160]; /* why a site was refused, or what a direct call became */
};

/** altinstructions, altinstr_replacement and altinstr_table: the sections a .o may hold
 * several of. */
#define AD_NJOINED 3

/** Exit codes (documented in docs/altdump.1). */
enum ad_exit {
    AD_EXIT_OK = 0,
    AD_EXIT_REFUSED = 1, /* refused sites, or --pid mismatches */
    AD_EXIT_USAGE = 2,
    AD_EXIT_BADINPUT = 3,
    AD_EXIT_INTERNAL = 4, /* out of memory and the like */
};

/** Flags of ad_read_memory(). */
enum ad_read_flags {
    /** A file without altpatch tables is not an error (--compare, --pid). */
    AD_READ_ALLOW_NOALT = 1u << 0,
};

/** One section header, resolved. */
struct ad_section {
    const char *name;     /* from .shstrtab (points into the ELF image) */
    uint32_t type;        /* SHT_* */
    uint64_t flags;       /* SHF_* */
    uint64_t addr;        /* sh_addr, or the fake address of a .o layout */
    uint64_t size;
    uint64_t offset;
    uint64_t align;
    const uint8_t *data;  /* file bytes or relocated copy; NULL for NOBITS */
    uint8_t *copy;        /* owned relocated copy (.o), else NULL */
};

/** One symbol usable to name an address. */
struct ad_symbol {
    uint64_t addr;
    uint64_t size;
    uint64_t sec_end;     /* end address of the symbol's section */
    const char *name;
    bool func;
};

/** A PT_LOAD program header (for --pid). */
struct ad_load {
    uint64_t offset, vaddr, filesz, memsz;
};

/** Everything altdump knows about one ELF file. */
struct ad_image {
    const char *file;          /* name used in messages */
    int elf_type;              /* ET_EXEC, ET_DYN, ET_REL */
    uint8_t *buf;              /* owned copy of the file */
    size_t len;
    void *elf;                 /* Elf * */
    struct ad_section *secs;
    size_t nsecs;
    struct ad_load *loads;
    size_t nloads;
    bool has_alt;              /* note and tables present */
    struct ad_note note;
    uint64_t note_size;        /* bytes of .note.altpatch */
    uint64_t table_addr;
    const uint8_t *table;
    size_t table_size;
    /* What the library's view is built from: the replacements and the
     * executable sections (merged into one when there are more than
     * ALTPATCH_IMAGE_MAX_TEXT). */
    struct ad_region repl;
    struct ad_region text[ALTPATCH_IMAGE_MAX_TEXT];
    size_t ntext;
    uint8_t *merged;           /* owned: text regions merged to fit ALTPATCH_IMAGE_MAX_TEXT */
    struct altpatch_image *ai; /* the library's image of the tables (owned) */
    uint8_t *origs;            /* owned: every site's original bytes (ad_site.orig) */
    /* .o only: the relocated altinstructions [0] and altinstr_replacement [1]
     * sections, joined at their fake addresses when there are several (one
     * per COMDAT group); data NULL otherwise. */
    struct ad_region joined[AD_NJOINED];
    uint8_t *joined_buf[AD_NJOINED]; /* owned: joined[k].data */
    struct ad_entry *entries;
    size_t nentries;
    struct ad_site *sites;
    size_t nsites;
    struct ad_symbol *syms;
    size_t nsyms;
    /* A pre-patched file (format 2): the sites' bytes in the view are the
     * originals kept in .altpatch.orig (put back by ad_prepatched_read);
     * what the file holds at site i is pp_written + pp_off[i]. */
    bool prepatched;
    char pp_profile[64];
    unsigned pp_planner; /* the planner version .altpatch.orig records */
    unsigned pp_plan_note; /* ALTPATCH_PLAN_NOTE_NONE, _EMPTY, _FILLED or _STALE */
    struct altpatch_features *pp_fs; /* owned: the set the file was planned for */
    uint8_t *pp_written;            /* owned */
    size_t pp_nsites;               /* sites of the library's reading of the file */
    size_t *pp_off;                 /* owned; SIZE_MAX: site outside the text */
    uint64_t *pp_addr;              /* owned: the library's site addresses */
    uint8_t *pp_len;                /* owned: the library's site lengths */
    struct ad_kernel kernel;   /* a Linux kernel image or module (kernel.c) */
    uint64_t banner_addr;      /* address of linux_banner, or 0 */
};

/**
 * Read an ELF image of @p len bytes (copied; @p buf may be freed afterwards)
 * into @p img. @p name is used in messages. Returns 0, AD_EXIT_BADINPUT with
 * "what is wrong" in @p err, or AD_EXIT_INTERNAL. On failure @p img is freed.
 */
int ad_read_memory(const void *buf, size_t len, const char *name, unsigned flags,
                   struct ad_image *img, char *err, size_t errsz);
/** Read the file @p path with ad_read_memory(). */
int ad_read_file(const char *path, unsigned flags, struct ad_image *img, char *err,
                 size_t errsz);
/** Release everything @p img owns (safe on a zeroed or already freed image). */
void ad_image_free(struct ad_image *img);
/** A library message made one of altdump's: its trailing newline, the
 * library's "altpatch: " prefix and a leading "NAME: " taken off, in place. */
void ad_strip_msg(char *m, const char *name);
/** Bytes of [addr, addr+len) in one allocated section with contents, or NULL. */
const uint8_t *ad_bytes_at(const struct ad_image *img, uint64_t addr, uint64_t len);
/** Section by exact name, or NULL. */
const struct ad_section *ad_section_by_name(const struct ad_image *img, const char *name);

/**
 * For a file whose note says format 2 (called by the reader before the
 * records): the library reads the file (altpatch_image_open_mem) and checks
 * its .altpatch.orig record against the tables and the bytes; what the file
 * holds at each site is kept, and the originals go back into the text.
 * Returns 0, or AD_EXIT_BADINPUT / AD_EXIT_INTERNAL with a message in @p err.
 */
int ad_prepatched_read(struct ad_image *img, char *err, size_t errsz);
/**
 * After the records: the sites of the pre-patched file's record are the
 * table's. 0 or AD_EXIT_BADINPUT with a message in @p err.
 */
int ad_prepatched_match(const struct ad_image *img, char *err, size_t errsz);
/**
 * --check of a pre-patched file: every site must hold the plan for the set
 * it was written for. One line per site that does not, to @p f ("FILE: site
 * N at 0xADDR (sym+off): holds HEX, the plan for PROFILE is HEX"). Returns
 * the number of such sites, or (size_t)-1 when out of memory.
 */
size_t ad_prepatched_check(FILE *f, const struct ad_image *img);

/** Write "sym+0xoff" (or "" when no symbol covers @p addr) into @p out. */
void ad_symbolize(const struct ad_image *img, uint64_t addr, char *out, size_t outsz);
/** objdump's " <sym>" / " <sym+0x10>" for @p addr, or "" (disasm.c). */
void ad_symbol_ref(const struct ad_image *img, uint64_t addr, char *out, size_t outsz);
/** Symbol covering @p addr or NULL; *off gets addr - symbol address. */
const struct ad_symbol *ad_symbol_at(const struct ad_image *img, uint64_t addr, uint64_t *off);
/** Sort and index img->syms (called by the reader). */
void ad_symbols_sort(struct ad_image *img);

/** CPU selection: a profile plus edits, resolved to a feature set. */
struct ad_cpu {
    char spec[128];                 /* as given, e.g. "amd-zen4,-fsgsbase" */
    struct altpatch_features *fs;
    /* An edit names no feature of this library (it may be a kernel's name:
     * kernel images resolve the spec themselves): the message for other
     * files, "" when every edit applied. */
    char edit_err[192];
};

/**
 * Resolve "PROFILE[,+feat,-feat...]" (the profile may be omitted: "+x,-y"
 * edits the host). Returns 0, or AD_EXIT_USAGE with a message in @p err.
 */
int ad_cpu_parse(const char *spec, struct ad_cpu *cpu, char *err, size_t errsz);
/** Free the feature set of @p cpu. */
void ad_cpu_free(struct ad_cpu *cpu);

/** Plans of every site of @p img for @p fs: *out is malloc'ed (nsites entries). */
int ad_decide(const struct ad_image *img, const struct altpatch_features *fs,
              struct ad_plan **out);
/**
 * ad_decide() for the CPU @p cpu: a kernel image gets the feature set that
 * kernel sets on that profile (ad_kernel_cpu). Returns 0, AD_EXIT_USAGE (a
 * feature edit the kernel does not know, message in @p err) or AD_EXIT_INTERNAL.
 */
int ad_decide_cpu(const struct ad_image *img, const struct ad_cpu *cpu, struct ad_plan **out,
                  char *err, size_t errsz);

/* --- kernel front end (kernel.c) -------------------------------------------- */

/**
 * The planner's rules for a kernel image: its version's feature ids into
 * @p known (room for ALTPATCH_FEATURE_BITS; their count in *@p nknown) and
 * the flags it resolves itself (DIRECT_CALL), returned.
 */
unsigned ad_kernel_rules(const struct ad_image *img, unsigned *known, size_t *nknown);
/**
 * The feature set the kernel of @p img sets on CPU @p spec (profile and
 * +name/-name edits, names of that kernel's cpufeatures.h). *out is freed
 * with altpatch_features_free(). Returns 0 or AD_EXIT_USAGE / AD_EXIT_INTERNAL.
 */
int ad_kernel_cpu(const struct ad_image *img, const char *spec, struct altpatch_features **out,
                  char *err, size_t errsz);
/**
 * Sites whose chosen entry has ALT_FLAG_DIRECT_CALL: final bytes become the
 * direct call the kernel writes when the image's own static data holds the
 * target, and the plan's detail says which (or "decided at boot").
 */
void ad_kernel_direct_calls(const struct ad_image *img, struct ad_plan *plans);
/** Number of refused sites in @p plans. */
size_t ad_count_refused(const struct ad_image *img, const struct ad_plan *plans);
/** "replaced", "kept" or "refused". */
const char *ad_decision_name(const struct ad_plan *p);
/** Feature id of an entry of @p img as "name" (or "unknown"). */
const char *ad_feature_name(const struct ad_image *img, unsigned id);
/** Flags as "NOT", "NOT|0x4", "NOT|DIRECT_CALL" (kernel images), "none". */
void ad_flags_str(const struct ad_image *img, unsigned flags, char *out, size_t outsz);
/**
 * Total length of the trailing NOP instructions of the original bytes of a site
 * (the padding the build added), decoding with the library's decoder.
 */
size_t ad_padding(const uint8_t *orig, size_t len);

/** Output options shared by the views. */
struct ad_opts {
    bool intel;
    bool json;
    const struct ad_cpu *cpu;
};

/** The readable table of every site of @p img. */
void ad_print_table(FILE *f, const struct ad_image *img, const struct ad_plan *plans,
                    const struct ad_opts *o);
/**
 * One line per refused site to @p f: "[prefix]FILE: site N at 0xADDR (sym+off): REASON
 * (detail)". Returns the number printed.
 */
size_t ad_print_refusals(FILE *f, const char *prefix, const struct ad_image *img,
                         const struct ad_plan *plans);
/** Disassemble @p len bytes at @p addr, one "    0xADDR  bytes  insn" line each. */
void ad_print_insns(FILE *f, const struct ad_image *img, const uint8_t *bytes, size_t len,
                    uint64_t addr, bool intel, const char *indent);
/**
 * Format the instruction at @p buf (at @p addr) the way objdump prints it,
 * targets named by the symbols of @p img (may be NULL). Returns its length,
 * or a negative errno with "(bad)" in @p out.
 */
int ad_format_insn(const struct ad_image *img, const uint8_t *buf, size_t avail, uint64_t addr,
                   bool intel, char *out, size_t outsz);

/** Text-size figures of one image (see docs/altdump.md for each rule). */
struct ad_size {
    uint64_t text;            /* executable sections except altinstr_replacement */
    uint64_t sites, records;
    uint64_t table_bytes, repl_bytes, padding_bytes, note_bytes;
    uint64_t total;           /* table + replacement + padding + note */
    uint64_t changed_sites, changed_bytes, pages; /* on the selected CPU */
    uint64_t sz_text, sz_data, sz_bss; /* size(1) Berkeley rule */
};

/** Compute the figures of @p img (plans may be NULL when it has no tables). */
void ad_size_compute(const struct ad_image *img, const struct ad_plan *plans,
                     struct ad_size *out);
/** The --size block of one image. */
void ad_print_size(FILE *f, const struct ad_image *img, const struct ad_size *s,
                   const struct ad_opts *o);
/** size(1)-style lines of two builds, their delta and delta %, and the cost in @p b. */
void ad_print_compare(FILE *f, const struct ad_image *a, const struct ad_size *sa,
                      const struct ad_image *b, const struct ad_size *sb);

/* --- JSON ------------------------------------------------------------------ */

/**
 * A streaming JSON writer: keeps track of commas and indentation. Each call
 * writes one member (@p key non-NULL, inside an object) or one element (@p key
 * NULL, inside an array or at the top); ad_json_obj/ad_json_arr open a
 * container that the matching ad_json_end_* closes.
 */
struct ad_json {
    FILE *f;
    int depth;
    bool first[64];
};

void ad_json_begin(struct ad_json *j, FILE *f);
void ad_json_obj(struct ad_json *j, const char *key);  /* key NULL inside arrays */
void ad_json_arr(struct ad_json *j, const char *key);
void ad_json_end_obj(struct ad_json *j);
void ad_json_end_arr(struct ad_json *j);
void ad_json_str(struct ad_json *j, const char *key, const char *val);
void ad_json_int(struct ad_json *j, const char *key, long long val);
void ad_json_uint(struct ad_json *j, const char *key, unsigned long long val);
void ad_json_hex(struct ad_json *j, const char *key, uint64_t val);
void ad_json_bool(struct ad_json *j, const char *key, bool val);
void ad_json_double(struct ad_json *j, const char *key, double val);
void ad_json_null(struct ad_json *j, const char *key);
void ad_json_finish(struct ad_json *j);

/** The "file" object of one image: sites with their plans, and size when @p sz. */
void ad_json_image(struct ad_json *j, const struct ad_image *img, const struct ad_plan *plans,
                   const struct ad_size *sz, const struct ad_opts *o);
/** The "cpu" member: spec, vendor, feature names. */
void ad_json_cpu(struct ad_json *j, const struct ad_cpu *cpu);
/** The "compare" member of --compare. */
void ad_json_compare(struct ad_json *j, const struct ad_image *a, const struct ad_size *sa,
                     const struct ad_image *b, const struct ad_size *sb);

/* --- --pid ----------------------------------------------------------------- */

/** Memory state of one site in a live process. */
enum ad_mem_state {
    AD_MEM_FINAL,      /* memory holds the planned bytes */
    AD_MEM_ORIGINAL,   /* memory holds the original bytes */
    AD_MEM_MISMATCH,   /* neither */
    AD_MEM_UNREADABLE, /* pread failed */
    AD_MEM_REFUSED,    /* refused site outside the file's sections: nothing to compare */
    AD_MEM__COUNT
};

/**
 * Inspect process @p pid: every mapped file carrying altpatch tables, every
 * site compared with its original and its plan for @p o->cpu. Returns an
 * AD_EXIT_* code (AD_EXIT_REFUSED when any site mismatches).
 */
int ad_pid_report(long pid, const struct ad_opts *o);

/** "none", "empty", "filled" or "stale": a pre-patched file's plan note (ALTPATCH_PLAN_NOTE_*). */
const char *ad_plan_note_name(unsigned state);

#endif /* ALTDUMP_H */
