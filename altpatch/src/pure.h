/* SPDX-License-Identifier: MIT */
/*
 * pure.h - floor 1 of libaltpatch: pure layers over bytes and data, no
 * system calls (floors: util.h).
 *
 *   record.c     the record table and the note (format versions 1 to 4)
 *   prepatch.c   the section of a pre-patched file that keeps the originals
 *   elfsec.c     a section or the altpatch note of an ELF file, through a reader
 *   features.c   the feature table: names, sets, the edit language, profiles
 *   insn.c       instruction facts (the only file that includes Zydis)
 *   nop.c        NOPs
 *   reloc.c      relative fields moved to another address
 *
 * Nomenclature:
 *   record / entry  one record of the table: 14 bytes (struct altpatch_record,
 *                   format 1) or 12 (format 3)
 *   site            the bytes at one address that one or more consecutive
 *                   entries describe (nested ALTERNATIVE_2/3); its length is
 *                   the largest instrlen among them
 *   original        the bytes the compiler emitted at the site
 *   replacement     the bytes one entry points at in `altinstr_replacement`
 *   final           the bytes the planner decided the site must hold
 *   view            the address ranges (with their bytes) of one module, as
 *                   the planner sees them: live memory or an ELF file
 */
#ifndef ALTPATCH_PURE_H
#define ALTPATCH_PURE_H

#include "util.h"

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

_Static_assert(sizeof(struct altpatch_record) == ALTPATCH_RECORD_SIZE_KERNEL, "record size");

/** Descriptor of the `.note.altpatch` note, resolved to addresses. */
struct ap_note {
    uint32_t version;     /* 1 or 3, or 2 / 4 for the same pre-patched */
    uint32_t record_size; /* ALTPATCH_RECORD_SIZE_KERNEL or _COMPACT, as the version says */
    uint64_t table_start, table_end; /* the record table */
    uint64_t repl_start, repl_end;   /* altinstr_replacement */
    uint64_t desc_start, desc_end;   /* the descriptor itself (0, 0: none read) */
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

/**
 * One site: entries[first .. first+count) share the address @c addr: what
 * the planner and the memo take. A site holds at most AP_SITE_MAX_RECORDS
 * records: a further record at its address opens a site of its own there,
 * and the two overlap (SITE_OVERLAP), as any two sites at one address do.
 */
struct ap_site {
    uint64_t addr;
    uint32_t first;
    uint16_t count;
    int8_t reason;     /* refusal known before planning (SITE_OVERLAP, EMPTY_SITE), else 0 */
    uint8_t len;       /* max instrlen of the group */
};

_Static_assert(sizeof(struct ap_site) == 16, "struct ap_site: 16 bytes");
_Static_assert(ALTPATCH_REASON__COUNT <= INT8_MAX, "a preset reason fits in ap_site.reason");

/** Most records of one site (struct ap_site's count). */
#define AP_SITE_MAX_RECORDS INT16_MAX

/**
 * One site of a record table as ap_table_scan() gives it and a module keeps
 * it: struct ap_site without its address, which is its first record's
 * (ap_record_site()), and without the index of that record: a site's
 * records follow the sites' before it in the table, so the index is the sum
 * of their counts, kept for every AP_SITE_GROUP-th site (struct ap_site_at:
 * ap_tsite_first()). 4 bytes: a module keeps one per site, made present in a
 * fresh process, so its pages are a cold apply's cost.
 */
struct ap_tsite {
    uint16_t count;
    int8_t reason;
    uint8_t len;
};

_Static_assert(sizeof(struct ap_tsite) == 4, "struct ap_tsite: 4 bytes");

/** Sites per struct ap_site_at. */
#define AP_SITE_GROUP 16u

/**
 * What is kept of every AP_SITE_GROUP-th site of a table: the index of its
 * first record (the sum of the counts before it) and where its bytes start
 * in the sites' bytes laid end to end in site order (the sum of the lengths
 * before it; a module's saved originals and plans: host.h, ap_orig_off()).
 */
struct ap_site_at {
    uint32_t first;
    uint32_t off;
};

/** The index of the first record of site @p i of @p s, whose groups are
 * @p at (at most AP_SITE_GROUP - 1 counts added). */
static inline uint32_t ap_tsite_first(const struct ap_tsite *s, const struct ap_site_at *at,
                                      size_t i)
{
    uint32_t first = at[i / AP_SITE_GROUP].first;
    for (size_t j = i & ~(size_t)(AP_SITE_GROUP - 1); j < i; j++)
        first += s[j].count;
    return first;
}

/**
 * Decode the table of @p size bytes whose first byte is at @p table_addr, of
 * records of @p record_size bytes (a note's: ALTPATCH_RECORD_SIZE_KERNEL or
 * ALTPATCH_RECORD_SIZE_COMPACT). Returns ALTPATCH_REASON_NONE,
 * ALTPATCH_REASON_BAD_VERSION (another record size), ALTPATCH_REASON_BAD_TABLE
 * (size not a multiple of the record size: nothing decoded), or -ENOMEM.
 * *out is malloc'ed.
 */
AP_HIDDEN int ap_records_parse(const uint8_t *table, size_t size, uint64_t table_addr,
                               uint32_t record_size, struct ap_entry **out, size_t *n);
/**
 * Record @p i of a table already accepted by ap_records_parse() (first byte
 * at @p table, runtime address @p table_addr), decoded into @p e: the same
 * entry ap_records_parse() gives, for a caller that decodes a site's records
 * from the table as it goes (@p record_size ALTPATCH_RECORD_SIZE_KERNEL or
 * ALTPATCH_RECORD_SIZE_COMPACT). Format 1: s32 site, s32 replacement (each
 * relative to its own field), u32 feature | flags << 16, u8 site length, u8
 * replacement length; format 3: the same with a u16 feature word (bits 0..14
 * the feature, bit 15 ALT_FLAG_NOT).
 */
/*
 * The record at @p p past its two offsets, as one word: format 3 its four
 * bytes (u16 feature word, u8 site length, u8 replacement length), format 1
 * its six (u32 feature | flags << 16, the two lengths). Nothing past the
 * record is read.
 */
static inline uint64_t ap_record_tail(const uint8_t *p, uint32_t record_size)
{
    uint32_t a;
    uint16_t b = 0;
    memcpy(&a, p + 8, 4);
    if (record_size == ALTPATCH_RECORD_SIZE_KERNEL)
        memcpy(&b, p + 12, 2);
    return a | (uint64_t)b << 32;
}

/*
 * ap_record_tail()'s word @p w as struct ap_entry's bytes 16..23: feature |
 * flags << 16 | instrlen << 32 | repllen << 40 -- format 1's word as it is,
 * format 3's feature word's bit 15 moved to bit 16 (ALT_FLAG_NOT).
 */
static inline uint64_t ap_record_packed(uint64_t w, uint32_t record_size)
{
    _Static_assert(ALT_FLAG_NOT == 1, "ALT_FLAG_NOT: bit 0 of the flags");
    if (record_size == ALTPATCH_RECORD_SIZE_COMPACT)
        return (w & 0x7fffu) | (w & 0x8000u) << 1 | (w >> 16) << 32;
    return w;
}

/* ap_record_tail()'s word @p w: the record's feature. */
static inline unsigned ap_record_feature(uint64_t w, uint32_t record_size)
{
    return (unsigned)(record_size == ALTPATCH_RECORD_SIZE_COMPACT ? w & 0x7fffu : w & 0xffffu);
}

/* ap_record_tail()'s word @p w: the record's replacement length. */
static inline unsigned ap_record_repllen(uint64_t w, uint32_t record_size)
{
    return (unsigned)(record_size == ALTPATCH_RECORD_SIZE_COMPACT ? w >> 24 : w >> 40) & 0xffu;
}

/* ap_record_tail()'s word @p w: the record's feature times two plus its
 * flags (ALT_FLAG_NOT, bit 0; format 1's other flags above it). */
static inline unsigned ap_record_feature2(uint64_t w, uint32_t record_size)
{
    if (record_size == ALTPATCH_RECORD_SIZE_COMPACT) {
        uint16_t fw = (uint16_t)w; /* the feature word turned left by one */
        return (unsigned)(uint16_t)(fw << 1 | fw >> 15);
    }
    uint32_t fw = (uint32_t)w;
    return (fw & 0xffffu) << 1 | fw >> 16;
}

/** The site address of record @p i: ap_record_at()'s e->site alone. */
static inline uint64_t ap_record_site(const uint8_t *table, uint64_t table_addr,
                                      uint32_t record_size, size_t i)
{
    int32_t so;
    memcpy(&so, table + i * record_size, 4);
    return table_addr + (uint64_t)i * record_size + (uint64_t)(int64_t)so;
}

/** Site @p t of a table, whose first record is record @p first, as struct
 * ap_site: its address from that record. */
static inline struct ap_site ap_tsite_site(const uint8_t *table, uint64_t table_addr,
                                           uint32_t record_size, uint32_t first,
                                           const struct ap_tsite *t)
{
    return (struct ap_site){ap_record_site(table, table_addr, record_size, first), first,
                            t->count, t->reason, t->len};
}

static inline void ap_record_at(const uint8_t *table, uint64_t table_addr, uint32_t record_size,
                                size_t i, struct ap_entry *e)
{
    const uint8_t *p = table + i * record_size;
    uint64_t at = table_addr + (uint64_t)i * record_size;
    int32_t so, ro;
    memcpy(&so, p, 4);
    memcpy(&ro, p + 4, 4);
    /* feature | flags << 16 | instrlen << 32 | repllen << 40 */
    uint64_t packed = ap_record_packed(ap_record_tail(p, record_size), record_size);
    e->site = at + (uint64_t)(int64_t)so;
    e->repl = at + 4 + (uint64_t)(int64_t)ro;
    /* bytes 16..23 in one store (22 and 23 are padding) */
    _Static_assert(offsetof(struct ap_entry, feature) == 16 &&
                       offsetof(struct ap_entry, flags) == 18 &&
                       offsetof(struct ap_entry, instrlen) == 20 &&
                       offsetof(struct ap_entry, repllen) == 21 &&
                       offsetof(struct ap_entry, index) == 24,
                   "struct ap_entry: feature, flags, instrlen, repllen in bytes 16..21");
    memcpy((uint8_t *)e + 16, &packed, 8);
    e->index = (uint32_t)i;
}

/**
 * Group consecutive entries with the same site address into sites (in table
 * order), at most AP_SITE_MAX_RECORDS a site (the next one opens a site of
 * its own at that address). Marks sites that overlap another site with
 * ALTPATCH_REASON_SITE_OVERLAP (both of them) and sites of length 0 with
 * ALTPATCH_REASON_EMPTY_SITE.
 * Returns 0 or -ENOMEM. *out is malloc'ed.
 */
AP_HIDDEN int ap_sites_group(const struct ap_entry *e, size_t n, struct ap_site **out,
                             size_t *nsites);

/** Feature ids the scan's bitmap covers (the feature words: AP_NCAPWORDS * 32). */
#define AP_SCAN_FEATURES 1024

/** What one pass over a record table gives (ap_table_scan()). */
struct ap_table_scan {
    struct ap_tsite *sites;   /* malloc'ed: the sites of ap_sites_group(), reasons set,
                               * each without its address (its first record's) */
    struct ap_site_at *at;    /* malloc'ed: every AP_SITE_GROUP-th site's first record
                               * and bytes' offset (ap_tsite_first()) */
    size_t nsites;
    struct ap_entry *entries; /* malloc'ed: every record as ap_records_parse() decodes
                               * it, when asked for, else NULL */
    size_t nentries;
    uint64_t site_bytes;      /* the sum of the sites' lengths */
    uint32_t max_count;       /* most records of one site */
    unsigned feature_high;    /* a feature id >= AP_SCAN_FEATURES the records name, or 0 */
    uint64_t features[AP_SCAN_FEATURES / 64]; /* bit id: some record names feature id */
    uint64_t hash;            /* ap_table_hash() of the table (AP_SCAN_HASH), else 0 */
    /* Facts about every record, for checks a caller would otherwise make per
     * site (with AP_SCAN_ENTRIES or AP_SCAN_FACTS and at least one record;
     * else all zero): */
    bool flags_known;         /* every record's flags are 0 or ALT_FLAG_NOT */
    int64_t repl_lo;          /* the lowest replacement start as a signed number
                               * (one at or above 2^63 counts below 0) */
    uint64_t repl_hi;         /* the highest end (start + repllen, mod 2^64) */
    bool text_span;           /* the sites come in address order and none has a
                               * preset reason (empty, overlap): every site lies
                               * in [text_lo, text_hi) */
    uint64_t text_lo, text_hi; /* the first site's address, the largest site end */
};

/**
 * One pass over the table of @p size bytes at @p table (runtime address
 * @p table_addr, records of @p record_size bytes): the sites, their preset
 * reasons (EMPTY_SITE, SITE_OVERLAP) and what else the records say, exactly
 * as ap_records_parse() followed by ap_sites_group() (the overlap scan needs
 * no sorted copy while the sites come in address order); the entries only
 * when @p what has AP_SCAN_ENTRIES, the hash only when it has AP_SCAN_HASH
 * (else out->hash is 0). Returns ALTPATCH_REASON_NONE, BAD_VERSION or
 * BAD_TABLE as ap_records_parse() (then only out->hash is set), or -ENOMEM.
 */
AP_HIDDEN int ap_table_scan(const uint8_t *table, size_t size, uint64_t table_addr,
                            uint32_t record_size, unsigned what, struct ap_table_scan *out);
/** ap_table_scan()'s @c what: the entries, the table's hash. */
#define AP_SCAN_ENTRIES 0x1u
#define AP_SCAN_HASH 0x2u
/** ap_table_scan()'s @c what: the facts about every record (struct
 * ap_table_scan) without keeping the entries (AP_SCAN_ENTRIES gives both). */
#define AP_SCAN_FACTS 0x4u
/**
 * A 64-bit hash of a table of records of @p record_size bytes (any size:
 * bytes past the last whole record count too), the one ap_table_scan() gives.
 */
AP_HIDDEN uint64_t ap_table_hash(const uint8_t *table, size_t size, uint32_t record_size);
/** A 64-bit hash of @p n bytes (the same construction over 16-byte blocks). */
AP_HIDDEN uint64_t ap_bytes_hash(const uint8_t *p, size_t n);

/* ------------------------------------------------------------------------- */
/* Features (features.c): the table, sets, names, edits, profiles            */
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
/** Set / clear bit @p id (no check: the caller knows it is a known id). */
AP_HIDDEN void ap_bit_set(struct altpatch_features *f, unsigned id);
AP_HIDDEN void ap_bit_clear(struct altpatch_features *f, unsigned id);
/** Set the vendor string (truncated to 15 characters). */
AP_HIDDEN void ap_set_vendor(struct altpatch_features *f, const char *vendor);
/** The empty set, vendor "unknown". */
AP_HIDDEN void ap_features_init(struct altpatch_features *f);
/** Keep only the bits the table names. */
AP_HIDDEN void ap_mask_known(struct altpatch_features *f);
/**
 * Derive the synthetic bits from the vendor and the CPUID bits, as the
 * kernel does: ALWAYS, APIC_MSRS_FENCE, LFENCE_RDTSC, 3DNOWPREFETCH.
 */
AP_HIDDEN void ap_derive_synthetic(struct altpatch_features *f);
/**
 * Clear the comma-separated feature names of @p list from @p f (the
 * ALTPATCH_CLEARCPUID syntax); ALWAYS is never cleared. Unknown names and
 * ALWAYS are warned about through ap_log(ALTPATCH_WARN) when @p warn, and
 * skipped. Returns the number of
 * names cleared.
 */
AP_HIDDEN int ap_clear_names(struct altpatch_features *f, const char *list, bool warn);
/**
 * The first "flags" line of /proc/cpuinfo text @p text (@p len bytes, not
 * NUL-terminated): its names (after the colon) and their length in @p *n,
 * or NULL when @p text does not hold that line whole.
 */
AP_HIDDEN const char *ap_cpuinfo_flags(const char *text, size_t len, size_t *n);
/** Whether the first "flags" line of @p text names @p name (a whole word). */
AP_HIDDEN bool ap_cpuinfo_lists(const char *text, size_t len, const char *name);
/** ap_clear_names() with warnings; 0 when @p f is NULL. */
AP_HIDDEN int ap_clearcpuid(struct altpatch_features *f, const char *list);

/** ap_profile_fill(): the profile is "host" (the caller probes this CPU). */
#define AP_PROFILE_HOST 1
/**
 * Fill @p f with the profile called @p name (case-insensitive). 0, or
 * AP_PROFILE_HOST (@p f untouched), or -ENOENT.
 */
AP_HIDDEN int ap_profile_fill(const char *name, struct altpatch_features *f);

/* ------------------------------------------------------------------------- */
/* Pre-patched files (prepatch.c), see docs/format.md, "Version 2"           */
/* ------------------------------------------------------------------------- */

/*
 * A pre-patched file is a version-1 file whose sites already hold the plan
 * for one feature set (a CPU profile), written by altprepatch. Its note says
 * version 2, and a non-allocated section, AP_PREPATCH_SECTION, records the
 * profile, its feature set, and per site the compiler's original bytes and
 * the bytes written in their place. The layout of that section (the
 * "prepatch record") is parsed and built here, without touching any file.
 */

/** Note version of a pre-patched format-1 file (version 1 plus the section below). */
#define AP_FORMAT_PREPATCHED 2u
/** Note version of a pre-patched format-3 file (version 3 plus the same section). */
#define AP_FORMAT_COMPACT_PREPATCHED 4u

/** True when the note says the file is pre-patched (version 2 or 4). */
static inline bool ap_note_prepatched(const struct ap_note *n)
{
    return n->version == AP_FORMAT_PREPATCHED || n->version == AP_FORMAT_COMPACT_PREPATCHED;
}

/** The note version of a pre-patched copy of a file whose note says @p version. */
static inline uint32_t ap_format_prepatched(uint32_t version)
{
    return version == ALTPATCH_FORMAT_COMPACT || version == AP_FORMAT_COMPACT_PREPATCHED
               ? AP_FORMAT_COMPACT_PREPATCHED
               : AP_FORMAT_PREPATCHED;
}
/** Name of the non-allocated section that keeps the originals. */
#define AP_PREPATCH_SECTION ".altpatch.orig"
/** First 8 bytes of that section. */
#define AP_PREPATCH_MAGIC "ALTPREP1"
/** Bytes before the first site record. */
#define AP_PREPATCH_HDR 240u
/** Bytes of a site record before its two byte strings. */
#define AP_PREPATCH_SITE_HDR 16u
/** Longest profile text kept (with its NUL). */
#define AP_PREPATCH_PROFILE 64u
/**
 * The planner's version a writer records in the header (offset 12): the
 * bytes this library plans for the same records and feature set -- the
 * padding, NOP folding, relocation. Raise it with any change to them. A
 * file of another version (0: written before the field existed) is read as
 * before, its written bytes not taken as this library's plan: the runtime
 * plans its module instead of settling it on the file's choices.
 */
#define AP_PREPATCH_PLANNER 1u

/** The section's header, decoded. */
struct ap_prepatch {
    uint32_t nsites;
    uint32_t planner;     /* AP_PREPATCH_PLANNER of the writer (0: older files) */
    uint64_t table_addr;  /* link-time address of altinstructions */
    uint64_t table_size;
    char profile[AP_PREPATCH_PROFILE];
    struct altpatch_features fs; /* the set the sites were planned for */
    const uint8_t *sites; /* first site record */
    size_t sites_len;
};

/** One site record. */
struct ap_prepatch_site {
    uint64_t addr;           /* link-time address */
    uint8_t len;
    int32_t chosen;          /* entry written, -1: the original was kept */
    const uint8_t *orig;     /* @c len bytes: the compiler's */
    const uint8_t *written;  /* @c len bytes: what the file's site holds */
};

/**
 * Check and decode the section @p buf of @p len bytes. Every site record must
 * lie inside it and together they must fill it exactly. 0 or -EINVAL.
 */
AP_HIDDEN int ap_prepatch_parse(const uint8_t *buf, size_t len, struct ap_prepatch *out);

/**
 * The site record at *@p pos of @p p's site records (start with *pos = 0);
 * advances *pos. 0, or -ENOENT past the last one.
 */
AP_HIDDEN int ap_prepatch_next(const struct ap_prepatch *p, size_t *pos,
                               struct ap_prepatch_site *out);

/** Size of a section with @p nsites sites of total length @p site_bytes. */
AP_HIDDEN size_t ap_prepatch_size(size_t nsites, size_t site_bytes);

/** Write the header of a section into @p buf (AP_PREPATCH_HDR bytes). */
AP_HIDDEN void ap_prepatch_put_header(uint8_t *buf, const struct ap_prepatch *p);

/** Write one site record at @p buf; returns the bytes written. */
AP_HIDDEN size_t ap_prepatch_put_site(uint8_t *buf, const struct ap_prepatch_site *s);

/*
 * The plan note (docs/format.md, "The plan note"): ALTPATCH_PLAN_NOTE_SIZE
 * bytes the public header reserves, as zeros, right after the table note;
 * loaded with the module. altprepatch fills it when the plan it wrote is
 * exactly what its feature set selects at every site (no site refused, none
 * outside the text): then the planner version, that set and a hash of every
 * site's written bytes are all a first apply needs to settle the module
 * without reading its file. Layout (little-endian, 4-byte aligned):
 *   0   u32 state (0: empty, as compiled; 1: filled)
 *   4   u32 planner version (AP_PREPATCH_PLANNER)
 *   8   u32 nsites
 *   12  u32 zero
 *   16  u64 table size in bytes
 *   24  u64 ap_bytes_hash() of the sites' written bytes, concatenated in table order
 *   32  u32 feature words[32]
 *   160 char vendor[16], NUL-terminated
 */
#define AP_PLAN_NOTE_FILLED 1u

/** A filled plan note, decoded. */
struct ap_plan_note {
    uint32_t planner;
    uint32_t nsites;
    uint64_t table_size;
    uint64_t hash;
    struct altpatch_features fs;
};

/**
 * Decode the plan note descriptor @p desc of @p descsz bytes: 1 filled (*@p
 * out set); 0 not filled -- empty, or another size or state (a layout this
 * reader does not know: the file is read, as without a note); -EINVAL
 * filled but malformed (a nonzero reserved field, a vendor without its NUL).
 */
AP_HIDDEN int ap_plan_note_parse(const uint8_t *desc, size_t descsz, struct ap_plan_note *out);

/** Write @p n as a filled descriptor (ALTPATCH_PLAN_NOTE_SIZE bytes at @p buf). */
AP_HIDDEN void ap_plan_note_put(uint8_t *buf, const struct ap_plan_note *n);

/** ap_plan_note_sites.pick(): the site lies outside the text. */
#define AP_NOTE_OUTSIDE INT32_MIN

/** What a filled plan note is checked against (ap_plan_note_check()). */
struct ap_plan_note_sites {
    size_t nsites;
    uint64_t table_size;
    /* every site's bytes, concatenated in table order (read only when every
     * site lies in the text); NULL: the hash is not checked */
    const uint8_t *bytes;
    size_t nbytes;
    /* the file's record of originals; NULL: its choices and planner version
     * are not compared */
    const struct ap_prepatch *rec;
    /* site @p i's selection under @p fs: the entry, -1 the original, another
     * value below -1 when the planner refuses the site, AP_NOTE_OUTSIDE */
    int (*pick)(void *ctx, size_t i, const struct altpatch_features *fs);
    void *ctx;
};

/**
 * Check the filled plan note @p pn against @p s, on a file or in memory:
 * the same table (sites and size), every site in the text and planned
 * (not refused) under the note's set, with the file record's choice when
 * @p s has one, the bytes hashed, the record's planner version. NULL when
 * it holds, else why not. Pure: @p s->pick is called once per site, in
 * table order, until a site fails.
 */
AP_HIDDEN const char *ap_plan_note_check(const struct ap_plan_note *pn,
                                         const struct ap_plan_note_sites *s);

/* ------------------------------------------------------------------------- */
/* ELF sections and notes (elfsec.c)                                         */
/* ------------------------------------------------------------------------- */

/** Read @p len bytes at file offset @p off into @p dst: 0, or -errno (-EIO when short). */
typedef int (*ap_elf_read_fn)(void *ctx, uint64_t off, void *dst, size_t len);

/** A section header, reduced. */
struct ap_elf_section {
    uint32_t index;   /* in the section header table */
    uint32_t type;    /* SHT_* */
    uint64_t flags;   /* SHF_* */
    uint64_t offset;  /* sh_offset */
    uint64_t size;    /* sh_size */
    uint64_t hdr_off; /* file offset of the section header itself */
};

/**
 * Find the section called @p name. Checks the ELF header (64-bit,
 * little-endian, x86-64), the section header table and the section name
 * table against @p file_size before reading them. 0 (found), -ENOENT (no
 * such section, or no section headers), -ENOEXEC (not such an ELF file, or
 * headers out of bounds), -ENOMEM, or the reader's error.
 */
AP_HIDDEN int ap_elf_find_section(ap_elf_read_fn rd, void *ctx, uint64_t file_size,
                                  const char *name, struct ap_elf_section *out);

/**
 * Find the altpatch note (owner ALTPATCH_NOTE_NAME, type ALTPATCH_NOTE_TYPE)
 * among the notes of one PT_NOTE segment of @p size bytes at @p p (@p align:
 * 4 or 8). Returns its descriptor (its size in *@p descsz) or NULL. A
 * malformed note stops the search: nothing past the segment is read.
 */
AP_HIDDEN const uint8_t *ap_note_find(const uint8_t *p, size_t size, size_t align,
                                      uint32_t *descsz);

/**
 * ap_note_find(), and in the same walk of the segment the plan note
 * (ALTPATCH_PLAN_NOTE_TYPE) into *@p plan, its size in *@p plansz: NULL and 0
 * when the segment has none, or holds no altpatch note.
 */
AP_HIDDEN const uint8_t *ap_note_find_plan(const uint8_t *p, size_t size, size_t align,
                                           uint32_t *descsz, const uint8_t **plan,
                                           uint32_t *plansz);

/* ------------------------------------------------------------------------- */
/* Instructions (insn.c: the only place that includes Zydis)                 */
/* ------------------------------------------------------------------------- */

/**
 * One decoded instruction, reduced to what the planner needs: 8 bytes (the
 * planner keeps up to one per byte of two replacements on its stack).
 */
struct ap_insn {
    uint8_t len;
    uint8_t rel_off;         /* byte offset of the relative field within the instruction */
    uint8_t rel_size;        /* 1, 2 or 4 */
    bool is_nop : 1;         /* a true NOP (90, 66 90, 0f 1f /0, ...); not PAUSE (f3 90), not 41 90 */
    bool is_int3 : 1;        /* cc */
    bool is_call : 1;        /* call of any form (near, far, direct, indirect) */
    bool is_fence : 1;       /* lfence, mfence, sfence: no register or memory effect of its own */
    /* The relative field, if any: a rel8/rel32 branch immediate or a
     * RIP-relative displacement. Target = address + len + rel_value. */
    bool has_rel : 1;
    bool rel_is_branch : 1;  /* immediate of jmp/call/jcc/loop/jrcxz; else RIP-relative disp */
    int32_t rel_value;       /* sign-extended (fields are at most 32 bits in 64-bit code) */
};
_Static_assert(sizeof(struct ap_insn) == 8, "struct ap_insn: 8 bytes");

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
 * The instructions ap_nop_fill(@p len) writes, as ap_insn_decode() reports
 * them for those bytes, without decoding: one NOP up to AP_NOP_MAX, else a
 * jmp (rel8, or rel32 above 129 bytes) to the end followed by one int3 per
 * remaining byte. @p out has room for @p len entries (@p len <= AP_MAX_SITE).
 * Returns the count.
 */
AP_HIDDEN size_t ap_nop_fill_insns(size_t len, struct ap_insn *out);

/**
 * Whether the instruction starting at @p buf is ap_nop_fill(1)'s one-byte
 * NOP (ap_nops[1]: the assembler's padding of an original, `.fill n,1,0x90`);
 * then *@p out is what ap_insn_decode() reports for it, whatever bytes follow
 * (a one-byte opcode without prefix, ModRM or immediate ends where it starts;
 * test_insn checks it against Zydis for every following byte). For a caller
 * that is at an instruction boundary of @p avail >= 1 bytes: a run of
 * padding costs a compare per byte instead of a decode.
 */
static inline bool ap_nop1_at(const uint8_t *buf, struct ap_insn *out)
{
    if (buf[0] != ap_nops[1][0])
        return false;
    *out = (struct ap_insn){.len = 1, .is_nop = true}; /* ap_nop_fill_insns(1) */
    return true;
}

/**
 * Re-fill every maximal run of NOP instructions (ap_insn.is_nop) in @p buf with
 * ap_nop_fill(). Stops at the first byte that does not decode and leaves the
 * rest untouched. Returns the number of runs rewritten.
 */
AP_HIDDEN size_t ap_nop_fold(uint8_t *buf, size_t len);

/* ------------------------------------------------------------------------- */
/* Relocation (reloc.c)                                                      */
/* ------------------------------------------------------------------------- */

/** Does @p v fit a signed relative field of @p size bytes (1, 2 or 4)? */
AP_HIDDEN bool ap_rel_fits(int64_t v, unsigned size);
/** Store the low @p size bytes of @p v at @p p, little-endian. */
AP_HIDDEN void ap_rel_store(uint8_t *p, int64_t v, unsigned size);

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


#endif /* ALTPATCH_PURE_H */
