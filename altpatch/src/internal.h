/* SPDX-License-Identifier: MIT */
/*
 * Private declarations shared inside libaltpatch (and by tools that link the
 * static library: altdump, altbench). Everything here has hidden visibility.
 *
 * Data flow, one direction (see ../shared/ARCHITECTURE.md):
 *
 *   records (record.c) -> sites (record.c) -> features (cpu.c)
 *     -> plan (plan.c: insn.c, nop.c, reloc.c; PURE: no syscalls, no globals)
 *     -> poke (poke.c: knows nothing of x86) -> stats / log (apply.c)
 *
 * Nomenclature:
 *   record / entry  one 14-byte struct altpatch_record in `altinstructions`
 *   site            the bytes at one address that one or more consecutive
 *                   entries describe (nested ALTERNATIVE_2/3); its length is
 *                   the largest instrlen among them
 *   original        the bytes the compiler emitted at the site
 *   replacement     the bytes one entry points at in `altinstr_replacement`
 *   final           the bytes the planner decided the site must hold
 *   view            the address ranges (with their bytes) of one module, as
 *                   the planner sees them: live memory or an ELF file
 */
#ifndef ALTPATCH_INTERNAL_H
#define ALTPATCH_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#define AP_HIDDEN __attribute__((visibility("hidden")))

/** Longest site: instrlen is a u8. */
#define AP_MAX_SITE 255
/** Longest single NOP in the table (kernel x86-64: 11). */
#define AP_NOP_MAX 11

/* ------------------------------------------------------------------------- */
/* Record format (on disk / in memory), see docs/format.md                   */
/* ------------------------------------------------------------------------- */

/** The kernel's struct alt_instr, packed, 14 bytes. Offsets are self-relative. */
struct altpatch_record {
    int32_t instr_offset; /* site        = &instr_offset + instr_offset */
    int32_t repl_offset;  /* replacement = &repl_offset  + repl_offset  */
    uint32_t ft_flags;    /* feature (low 16) | flags (high 16) */
    uint8_t instrlen;
    uint8_t replacementlen;
} __attribute__((packed));

_Static_assert(sizeof(struct altpatch_record) == ALTPATCH_RECORD_SIZE, "record size");

/** Descriptor of the `.note.altpatch` note, resolved to addresses. */
struct ap_note {
    uint32_t version;     /* ALTPATCH_FORMAT_VERSION */
    uint32_t record_size; /* ALTPATCH_RECORD_SIZE */
    uint64_t table_start, table_end; /* altinstructions */
    uint64_t repl_start, repl_end;   /* altinstr_replacement */
};

/** Size of the note descriptor in bytes (6 x u32). */
#define AP_NOTE_DESCSZ 24

/**
 * Parse a note descriptor found at address @p desc_addr (the offsets in it are
 * relative to their own field). Returns ALTPATCH_REASON_NONE, or
 * ALTPATCH_REASON_BAD_VERSION if @p descsz, the version or the record size is
 * not one this library understands (out is then still filled as far as read).
 */
AP_HIDDEN int ap_note_parse(const uint8_t *desc, size_t descsz, uint64_t desc_addr,
                            struct ap_note *out);

/** One record, decoded to absolute addresses (of whatever address space the caller uses). */
struct ap_entry {
    uint64_t site;     /* address of the original */
    uint64_t repl;     /* address of the replacement */
    uint16_t feature;  /* X86_FEATURE_* */
    uint16_t flags;    /* ALT_FLAG_* */
    uint8_t instrlen;
    uint8_t repllen;
    uint32_t index;    /* position in the table */
};

/** One site: entries[first .. first+count) share the address @c addr. */
struct ap_site {
    uint64_t addr;
    uint32_t first, count;
    uint8_t len;       /* max instrlen of the group */
    int reason;        /* refusal known before planning (SITE_OVERLAP, EMPTY_SITE), else 0 */
};

/**
 * Decode the table of @p size bytes whose first byte is at @p table_addr.
 * Returns ALTPATCH_REASON_NONE, ALTPATCH_REASON_BAD_TABLE (size not a multiple
 * of the record size: nothing decoded), or -ENOMEM. *out is malloc'ed.
 */
AP_HIDDEN int ap_records_parse(const uint8_t *table, size_t size, uint64_t table_addr,
                               struct ap_entry **out, size_t *n);

/**
 * Group consecutive entries with the same site address into sites (in table
 * order). Marks sites that overlap another site with ALTPATCH_REASON_SITE_OVERLAP
 * (both of them) and sites of length 0 with ALTPATCH_REASON_EMPTY_SITE.
 * Returns 0 or -ENOMEM. *out is malloc'ed.
 */
AP_HIDDEN int ap_sites_group(const struct ap_entry *e, size_t n, struct ap_site **out,
                             size_t *nsites);

/* ------------------------------------------------------------------------- */
/* Features (cpu.c)                                                          */
/* ------------------------------------------------------------------------- */

/** Words of 32 feature bits; kernel numbering word*32+bit. */
#define AP_NCAPWORDS 32

struct altpatch_features {
    uint32_t word[AP_NCAPWORDS];
    char vendor[16];
};

/** True when @p id names a feature in this library's table. */
AP_HIDDEN bool ap_feature_known(unsigned id);
/** Raw test, no allocation; false for ids outside the bitmap. */
AP_HIDDEN bool ap_features_test(const struct altpatch_features *f, unsigned id);
/** This process's features, computed once (thread-safe). Never NULL. */
AP_HIDDEN const struct altpatch_features *ap_host_features(void);
/**
 * Clear the comma-separated feature names of @p list from @p f (the
 * ALTPATCH_CLEARCPUID syntax). Unknown names are warned about through
 * ap_log(ALTPATCH_WARN) and skipped. Returns the number of names cleared.
 */
AP_HIDDEN int ap_clearcpuid(struct altpatch_features *f, const char *list);
/** The effective host set: ap_host_features() minus ALTPATCH_CLEARCPUID (unless AT_SECURE). */
AP_HIDDEN void ap_effective_features(struct altpatch_features *out);
/** Serializing instruction (CPUID), after writing code. */
AP_HIDDEN void ap_sync_core(void);

/* ------------------------------------------------------------------------- */
/* Instructions (insn.c: the only place that includes Zydis)                 */
/* ------------------------------------------------------------------------- */

/** One decoded instruction, reduced to what the planner needs. */
struct ap_insn {
    uint8_t len;
    bool is_nop;        /* a true NOP (90, 66 90, 0f 1f /0, ...); not PAUSE (f3 90), not 41 90 */
    bool is_int3;       /* cc */
    /* The relative field, if any: a rel8/rel32 branch immediate or a
     * RIP-relative displacement. Target = address + len + rel_value. */
    bool has_rel;
    bool rel_is_branch; /* immediate of jmp/call/jcc/loop/jrcxz; else RIP-relative disp */
    uint8_t rel_off;    /* byte offset of the field within the instruction */
    uint8_t rel_size;   /* 1, 2 or 4 */
    int64_t rel_value;  /* sign-extended */
};

/**
 * Decode one instruction of 64-bit code from @p buf (@p avail bytes readable).
 * Returns 0; -ENODATA when the instruction runs past @p avail; -EILSEQ when the
 * bytes are not a valid instruction.
 */
AP_HIDDEN int ap_insn_decode(const uint8_t *buf, size_t avail, struct ap_insn *out);

/**
 * Format the instruction at @p buf (runtime address @p addr) into @p out:
 * AT&T syntax, or Intel when @p intel. Returns its length, or a negative errno
 * as ap_insn_decode() (then @p out holds "(bad)").
 */
AP_HIDDEN int ap_insn_format(const uint8_t *buf, size_t avail, uint64_t addr, bool intel,
                             char *out, size_t outsz);

/* ------------------------------------------------------------------------- */
/* NOPs (nop.c)                                                              */
/* ------------------------------------------------------------------------- */

/** ap_nops[n] = the n-byte NOP, 1 <= n <= AP_NOP_MAX (the kernel's x86-64 table). */
extern AP_HIDDEN const uint8_t *const ap_nops[AP_NOP_MAX + 1];

/**
 * Fill @p len bytes with the fewest instructions that do nothing: one NOP from
 * the table up to AP_NOP_MAX; above that a short jmp over int3 filler (as the
 * kernel does; a rel32 jmp above 129 bytes).
 */
AP_HIDDEN void ap_nop_fill(uint8_t *buf, size_t len);

/**
 * Re-fill every maximal run of NOP instructions (ap_insn.is_nop) in @p buf with
 * ap_nop_fill(). Stops at the first byte that does not decode and leaves the
 * rest untouched. Returns the number of runs rewritten.
 */
AP_HIDDEN size_t ap_nop_fold(uint8_t *buf, size_t len);

/* ------------------------------------------------------------------------- */
/* Relocation (reloc.c)                                                      */
/* ------------------------------------------------------------------------- */

/**
 * @p buf holds @p len bytes of code assembled to run at @p src; they will run
 * at @p dst. Rewrite each relative field whose target lies outside
 * [src, src+len] (the end counts as inside) so that it reaches the same
 * target from @p dst:  new = old + src_insn - dst_insn  (= old + src - dst).
 * Targets inside keep their value. Returns ALTPATCH_REASON_NONE,
 * ALTPATCH_REASON_RELOC_OVERFLOW (the new value does not fit the field),
 * ALTPATCH_REASON_REPL_UNDECODABLE or ALTPATCH_REASON_REPL_CROSSES_END.
 * On refusal @p buf may be partly rewritten; @p detail (may be NULL) says
 * which instruction and why.
 */
/** Does @p v fit a signed relative field of @p size bytes (1, 2 or 4)? */
AP_HIDDEN bool ap_rel_fits(int64_t v, unsigned size);
/** Store the low @p size bytes of @p v at @p p, little-endian. */
AP_HIDDEN void ap_rel_store(uint8_t *p, int64_t v, unsigned size);

AP_HIDDEN int ap_reloc(uint8_t *buf, size_t len, uint64_t src, uint64_t dst, char *detail,
                       size_t detailsz);

/**
 * ap_reloc() for a block already decoded: @p insns[0..n) are its instructions
 * in order, as ap_insn_decode() gave them for these bytes (relocating one
 * field changes no length). Same result as ap_reloc(); a list that does not
 * cover exactly @p len bytes is refused with ALTPATCH_REASON_REPL_CROSSES_END.
 */
AP_HIDDEN int ap_reloc_insns(uint8_t *buf, size_t len, const struct ap_insn *insns, size_t n,
                             uint64_t src, uint64_t dst, char *detail, size_t detailsz);

/* ------------------------------------------------------------------------- */
/* Planner (plan.c) -- pure                                                  */
/* ------------------------------------------------------------------------- */

/** An address range and its bytes (data may be NULL for "no bytes available"). */
struct ap_region {
    uint64_t addr;
    uint64_t size;
    const uint8_t *data;
};

#define AP_MAX_TEXT 16

/** A module as the planner sees it. */
struct ap_view {
    struct ap_region text[AP_MAX_TEXT]; /* where sites may lie (executable, minus repl) */
    size_t ntext;
    struct ap_region repl;              /* altinstr_replacement */
};

struct ap_plan {
    int reason;       /* ALTPATCH_REASON_*; NONE when final is valid */
    int bad_entry;    /* index (within the site) of the entry that caused a refusal, or -1 */
    int chosen;       /* index (within the site) of the selected entry; -1 = original */
    uint8_t len;      /* site length */
    uint8_t orig[AP_MAX_SITE];
    uint8_t final[AP_MAX_SITE]; /* == orig when chosen == -1 or refused */
    char detail[160]; /* human-readable detail of a refusal */
    /* Some entry's replacement has a relative field, so the plan depends on
     * the site's and the replacements' addresses, not on bytes alone (memo.c
     * relocates such a stored plan again for each site). Valid when reason
     * is NONE. */
    bool relative;
};

/** Whether entry @p e applies under @p fs (feature present, or absent with ALT_FLAG_NOT). */
AP_HIDDEN bool ap_entry_eligible(const struct ap_entry *e, const struct altpatch_features *fs);

/**
 * Decide one site. Validates the site and *every* entry of it (so a refusal does
 * not depend on the CPU), then picks the last eligible entry, copies its
 * replacement, relocates it from the replacement's address to the site's,
 * pads to the site length and folds NOP runs. @p orig: the site's original
 * bytes if the caller keeps them (memory may already be patched), else NULL to
 * read them from @p v. Never fails outright: refusals are in out->reason, and
 * then out->final == out->orig.
 */
AP_HIDDEN void ap_plan_site(const struct ap_view *v, const struct ap_site *s,
                            const struct ap_entry *entries, const uint8_t *orig,
                            const struct altpatch_features *fs, struct ap_plan *out);

/**
 * What a caller with its own record dialect (a Linux kernel image, read by
 * altdump) tells the planner instead of this library's tables: the feature
 * ids that exist (bit id of @c known, word*32+bit as in a feature set), and
 * the flags besides ALT_FLAG_NOT that it resolves itself. An entry with such
 * a flag is validated and planned like any other; the caller then adjusts the
 * final bytes it stands for (the kernel's ALT_FLAG_DIRECT_CALL).
 */
struct ap_plan_rules {
    uint32_t known[AP_NCAPWORDS];
    unsigned flags;
};

/** ap_plan_site() under @p rules (NULL: this library's features and flags). */
AP_HIDDEN void ap_plan_site_rules(const struct ap_view *v, const struct ap_site *s,
                                  const struct ap_entry *entries, const uint8_t *orig,
                                  const struct altpatch_features *fs,
                                  const struct ap_plan_rules *rules, struct ap_plan *out);

/** Find [addr, addr+len) inside one region of @p v->text; returns its bytes or NULL. */
AP_HIDDEN const uint8_t *ap_view_text(const struct ap_view *v, uint64_t addr, uint64_t len);

/* ------------------------------------------------------------------------- */
/* Plan memo (memo.c): identical sites planned once per apply                */
/* ------------------------------------------------------------------------- */

/**
 * Plans keyed on a site's content (length, original bytes, every entry's
 * feature, flags and replacement bytes) for one feature set. Owned by the
 * caller (one per apply); ap_memo_init() allocates nothing.
 */
/** Where the relative fields of a site's content lie in its memo key (memo.c
 * keys such sites without their values). */
struct ap_memo_mask {
    uint16_t keylen;
    uint16_t n;       /* fields */
    uint16_t pos[8];  /* offset in the key */
    uint8_t size[8];  /* bytes */
};

#define AP_MEMO_MAX_MASKS 8

struct ap_memo {
    struct altpatch_features fs; /* the set every plan was made for */
    const struct altpatch_features *fs_at; /* where the caller keeps it (unchanged while in use) */
    struct ap_memo_slot *slots;  /* open addressing, power-of-two size */
    size_t nslots, nplans;
    uint8_t *arena;              /* keys and final bytes */
    size_t arena_len, arena_cap;
    uint64_t hits, misses;       /* sites answered from the memo / by the planner */
    struct ap_memo_mask masks[AP_MEMO_MAX_MASKS]; /* relative field layouts seen */
    size_t nmasks;
};

/** An empty memo for plans made under @p fs. */
AP_HIDDEN void ap_memo_init(struct ap_memo *m, const struct altpatch_features *fs);
/** Free what @p m holds; it is then empty (and may be used again). */
AP_HIDDEN void ap_memo_free(struct ap_memo *m);
/**
 * ap_plan_site() with the same arguments and the same result, answered from
 * @p m when a site of the same content was planned before (the address checks
 * are made again, relative fields relocated again for this site's addresses).
 * Accepted plans are stored.
 * @p m NULL, or @p fs other than the memo's set: the planner alone. The set
 * given to ap_memo_init() is recognised by its address, so the caller must
 * not change it while it uses the memo; any other pointer is compared by
 * content.
 */
AP_HIDDEN void ap_memo_plan(struct ap_memo *m, const struct ap_view *v, const struct ap_site *s,
                            const struct ap_entry *entries, const uint8_t *orig,
                            const struct altpatch_features *fs, struct ap_plan *out);

/* ------------------------------------------------------------------------- */
/* Writer (poke.c) -- knows nothing of x86                                   */
/* ------------------------------------------------------------------------- */

/** One write: make [addr, addr+len) hold @c new where it holds @c old. */
struct ap_write {
    uintptr_t addr;
    const uint8_t *old;
    const uint8_t *new;
    size_t len;
    int result; /* out: ALTPATCH_REASON_NONE, MEM_MISMATCH (memory held neither), WRITE_DENIED */
    bool wrote; /* out: bytes were written (false when memory already held new) */
};

enum ap_poke_flags {
    AP_POKE_PROCMEM_ONLY = 1u << 0,
    AP_POKE_NO_PROCMEM = 1u << 1,
};

struct ap_poke_stats {
    uint64_t bytes, pages, syscalls;
    unsigned mprotect_writes, procmem_writes; /* number of windows / pwrite calls that succeeded */
};

/**
 * Write a batch. Groups writes by page, coalesces neighbouring pages into one
 * window, never maps a page writable and executable at once, restores the
 * original protections exactly, falls back to /proc/self/mem when mprotect is
 * denied, and serializes afterwards. Writes whose memory already equals @c new
 * are skipped. @p w must be sorted by address and not overlap. Returns 0 or a
 * negative errno for a failure that stopped the whole batch (per-write results
 * are in w[i].result either way).
 */
AP_HIDDEN int ap_poke(struct ap_write *w, size_t n, unsigned flags, struct ap_poke_stats *st);

/* live: begin (issue 5, docs/live.md) */
/** open("/proc/self/mem", O_RDWR | O_CLOEXEC): a descriptor or -errno (poke.c). */
AP_HIDDEN int ap_procmem_open(void);
/** pwrite() @p len bytes at @p addr through @p fd, EINTR retried: 0 or -errno (poke.c). */
AP_HIDDEN int ap_procmem_write(int fd, uintptr_t addr, const uint8_t *src, size_t len);

/**
 * Whether the live protocol can run: membarrier SYNC_CORE registered,
 * /proc/self/mem writable, SIGTRAP and handshake handlers installed (live.c).
 * 0, or -errno with *why set to a sentence for the log.
 */
AP_HIDDEN int ap_live_ready(const char **why);
/**
 * Write a batch while other threads may run it (live.c, the x86 side of the
 * writer): int3 on every first byte, membarrier, handshake, tails, membarrier,
 * first bytes, membarrier. Same contract as ap_poke() (flags: none); results
 * may also be the ALTPATCH_REASON_LIVE_* reasons.
 */
AP_HIDDEN int ap_live_poke(struct ap_write *w, size_t n, struct ap_poke_stats *st);
/**
 * fork() waits while a round runs (no child starts with int3s in its text):
 * apply.c's pthread_atfork handlers call these after taking its own lock,
 * the order an apply takes both.
 */
AP_HIDDEN void ap_live_fork_prepare(void);
/** A module's text [start, end) was unloaded: its sites leave the trap handler's set. */
AP_HIDDEN void ap_live_forget(uintptr_t start, uintptr_t end);
AP_HIDDEN void ap_live_fork_release(void);
/* live: end */

/* ------------------------------------------------------------------------- */
/* Modules (module.c) and apply (apply.c)                                    */
/* ------------------------------------------------------------------------- */

/** Per-site outcome of the last apply. */
struct ap_site_result {
    uint8_t state;  /* enum altpatch_site_state */
    int32_t chosen; /* entry index within the site (any number of entries), -1 = original */
    int16_t reason;
    uint32_t warned; /* bit r: a WARN line was printed for reason r (once per site and reason) */
};

struct ap_module {
    struct ap_module *next;
    char *path;                 /* dlpi_name, "" for the main program */
    uintptr_t base;             /* dlpi_addr */
    const void *phdr;           /* dlpi_phdr: identity together with base and path */
    struct ap_view view;        /* live memory */
    struct ap_note note;
    int reason;                 /* module-wide refusal (BAD_TABLE, BAD_VERSION), else 0 */
    uint8_t *table_copy;        /* the table as first seen: identity check after dlclose */
    size_t table_size;
    uint8_t *repl_copy;         /* the replacement bytes as first seen: identity too */
    struct ap_entry *entries;
    size_t nentries;
    struct ap_site *sites;
    size_t nsites;
    uint8_t *orig;              /* original bytes of all sites, concatenated */
    size_t *orig_off;           /* per site: offset into orig (and planned), or AP_NO_ORIG */
    struct ap_site_result *res; /* per site */
    bool present;               /* scratch for refresh */
    /* Pin (apply.c): a dlopen() reference held for the length of one apply or
     * site walk, so that a concurrent dlclose() cannot unmap bytes being read
     * or written. gone: the module could not be pinned (unloaded since the
     * refresh): it is skipped until the next refresh drops it. */
    void *pin;
    bool gone;
    uint8_t *planned;           /* per site (at orig_off): the bytes the last apply left */
    /* Plan cache (apply.c): the planner is pure, so for the same feature set
     * a site's plan does not change. Only accepted plans are cached. */
    bool cache_valid;           /* cache_fs holds the set the cache was made for */
    struct altpatch_features cache_fs;
    int32_t *cache_chosen;      /* per site: AP_NOT_CACHED, -1 (original) or the entry */
    uint8_t *cache_final;       /* per site (at orig_off): the planned final bytes */
};

/** cache_chosen of a site without a cached plan. */
#define AP_NOT_CACHED (-2)

/** orig_off of a site outside the module's text: no bytes saved (refused by the planner). */
#define AP_NO_ORIG ((size_t)-1)

/**
 * Bring @p *list up to date with the loaded modules (dl_iterate_phdr): add
 * modules carrying an altpatch note (saving their original site bytes), drop
 * modules no longer loaded, and re-read a module whose table changed (a new
 * library at the same address). Returns 0 or -ENOMEM.
 */
AP_HIDDEN int ap_modules_refresh(struct ap_module **list);
AP_HIDDEN void ap_modules_free(struct ap_module *list);

/** Log through the callback set by altpatch_set_print(). */
AP_HIDDEN void ap_log(enum altpatch_print_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/** getenv(), or NULL when AT_SECURE is set. */
AP_HIDDEN const char *ap_getenv(const char *name);
/** Monotonic nanoseconds. */
AP_HIDDEN uint64_t ap_now_ns(void);

#endif /* ALTPATCH_INTERNAL_H */
