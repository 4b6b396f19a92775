/* SPDX-License-Identifier: MIT */
/*
 * record.c - the on-disk/in-memory record format (docs/format.md).
 *
 * Turns the raw bytes of the `.note.altpatch` descriptor and of the record
 * table (`altinstr_table`, format 3, or `altinstructions`, format 1) into
 * absolute addresses, and groups table entries into sites. Every offset in
 * the format is self-relative: it is added to the address of the field that
 * holds it. Nothing here touches memory beyond the buffers it is given, and
 * the packed records are read with memcpy (no unaligned dereference).
 */
#include <emmintrin.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "pure.h"

/* Offsets of the fields of the note descriptor. */
#define NOTE_OFF_VERSION 0
#define NOTE_OFF_RECSIZE 4
#define NOTE_OFF_TABLE_START 8
#define NOTE_OFF_TABLE_END 12
#define NOTE_OFF_REPL_START 16
#define NOTE_OFF_REPL_END 20

static uint32_t rd_u32(const uint8_t *p)
{
    uint32_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

/* Absolute address of a self-relative s32 stored at @p (runtime @p at). */
static uint64_t rd_selfrel(const uint8_t *p, uint64_t at)
{
    int32_t off;

    memcpy(&off, p, sizeof(off));
    return at + (uint64_t)(int64_t)off;
}

AP_HOT int ap_note_parse(const uint8_t *desc, size_t descsz, uint64_t desc_addr, struct ap_note *out)
{
    memset(out, 0, sizeof(*out));
    if (!desc || descsz < NOTE_OFF_RECSIZE + 4)
        return ALTPATCH_REASON_BAD_VERSION;
    out->version = rd_u32(desc + NOTE_OFF_VERSION);
    out->record_size = rd_u32(desc + NOTE_OFF_RECSIZE);
    /* Versions 1 to 4 have exactly this descriptor; 1 and 2 (pre-patched)
     * 14-byte records, 3 and 4 (pre-patched) 12-byte records. Anything else
     * is another format. */
    bool kernel = out->version == ALTPATCH_FORMAT_KERNEL || out->version == AP_FORMAT_PREPATCHED;
    bool compact = out->version == ALTPATCH_FORMAT_COMPACT ||
                   out->version == AP_FORMAT_COMPACT_PREPATCHED;
    if (!(kernel && out->record_size == ALTPATCH_RECORD_SIZE_KERNEL) &&
        !(compact && out->record_size == ALTPATCH_RECORD_SIZE_COMPACT))
        return ALTPATCH_REASON_BAD_VERSION;
    if (descsz != AP_NOTE_DESCSZ)
        return ALTPATCH_REASON_BAD_VERSION;
    out->table_start = rd_selfrel(desc + NOTE_OFF_TABLE_START, desc_addr + NOTE_OFF_TABLE_START);
    out->table_end = rd_selfrel(desc + NOTE_OFF_TABLE_END, desc_addr + NOTE_OFF_TABLE_END);
    out->repl_start = rd_selfrel(desc + NOTE_OFF_REPL_START, desc_addr + NOTE_OFF_REPL_START);
    out->repl_end = rd_selfrel(desc + NOTE_OFF_REPL_END, desc_addr + NOTE_OFF_REPL_END);
    out->desc_start = desc_addr;
    out->desc_end = desc_addr + descsz;
    if (out->table_end < out->table_start || out->repl_end < out->repl_start)
        return ALTPATCH_REASON_BAD_TABLE;
    return ALTPATCH_REASON_NONE;
}

int ap_records_parse(const uint8_t *table, size_t size, uint64_t table_addr, uint32_t record_size,
                     struct ap_entry **out, size_t *n)
{
    size_t count;
    struct ap_entry *e;

    *out = NULL;
    *n = 0;
    if (record_size != ALTPATCH_RECORD_SIZE_KERNEL && record_size != ALTPATCH_RECORD_SIZE_COMPACT)
        return ALTPATCH_REASON_BAD_VERSION;
    count = size / record_size;
    if (size % record_size != 0 || (size && !table) || count > UINT32_MAX)
        return ALTPATCH_REASON_BAD_TABLE;
    if (count == 0)
        return ALTPATCH_REASON_NONE;
    e = calloc(count, sizeof(*e));
    if (!e)
        return -ENOMEM;
    for (size_t i = 0; i < count; i++)
        ap_record_at(table, table_addr, record_size, i, &e[i]);
    *out = e;
    *n = count;
    return ALTPATCH_REASON_NONE;
}

/* End of a site, saturating instead of wrapping past 2^64. */
static uint64_t site_end(const struct ap_site *s)
{
    uint64_t end = s->addr + s->len;

    return end < s->addr ? UINT64_MAX : end;
}

/* Sort key of one non-empty site (no global comparator state: thread-safe). */
struct site_key {
    uint64_t addr, end;
    size_t idx;
};

static int cmp_key(const void *a, const void *b)
{
    const struct site_key *x = a, *y = b;

    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

static int mark_overlaps_sorted_copy(struct ap_site *s, size_t n);

/*
 * In address order, site k overlaps another iff it starts before the largest
 * end seen so far, or ends after the start of the next one. Empty sites take
 * no part: they cover no byte.
 */
static int mark_overlaps(struct ap_site *s, size_t n)
{
    size_t last = SIZE_MAX;
    uint64_t maxend = 0;
    bool sorted = true;

    /* Tables are usually in address order already: then the same scan runs
     * on the sites themselves, without a sorted copy. */
    for (size_t i = 0; i < n && sorted; i++) {
        if (!s[i].len)
            continue;
        sorted = last == SIZE_MAX || s[last].addr <= s[i].addr;
        last = i;
    }
    if (sorted) {
        last = SIZE_MAX;
        for (size_t i = 0; i < n; i++) {
            if (!s[i].len)
                continue;
            if (last != SIZE_MAX && s[i].addr < maxend)
                s[i].reason = ALTPATCH_REASON_SITE_OVERLAP;
            if (last != SIZE_MAX && site_end(&s[last]) > s[i].addr)
                s[last].reason = ALTPATCH_REASON_SITE_OVERLAP;
            if (site_end(&s[i]) > maxend)
                maxend = site_end(&s[i]);
            last = i;
        }
        return 0;
    }
    return mark_overlaps_sorted_copy(s, n);
}

/*
 * Sort the @p m keys and move those of the sites that overlap another to the
 * front: returns how many (key[0 .. returned) name them by idx).
 */
static size_t overlapping_keys(struct site_key *key, size_t m)
{
    size_t r = 0;
    uint64_t maxend = 0;

    qsort(key, m, sizeof(*key), cmp_key);
    for (size_t k = 0; k < m; k++) {
        struct site_key cur = key[k];
        bool before = k > 0 && cur.addr < maxend;
        bool after = k + 1 < m && cur.end > key[k + 1].addr;

        if (cur.end > maxend)
            maxend = cur.end;
        if (before || after)
            key[r++] = cur; /* r <= k: no key still to be read */
    }
    return r;
}

/* The scan of mark_overlaps() on a sorted copy of the keys. */
static int mark_overlaps_sorted_copy(struct ap_site *s, size_t n)
{
    struct site_key *key = malloc((n ? n : 1) * sizeof(*key));
    size_t m = 0;

    if (!key)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (s[i].len)
            key[m++] = (struct site_key){s[i].addr, site_end(&s[i]), i};
    for (size_t k = 0, r = overlapping_keys(key, m); k < r; k++)
        s[key[k].idx].reason = ALTPATCH_REASON_SITE_OVERLAP;
    free(key);
    return 0;
}

/* mark_overlaps_sorted_copy() for the sites of a table (ap_table_scan()):
 * their addresses from their first records. */
static int mark_overlaps_tsites(const uint8_t *table, uint64_t table_addr, uint32_t rs,
                                struct ap_tsite *s, size_t n)
{
    struct site_key *key = malloc((n ? n : 1) * sizeof(*key));
    size_t m = 0;

    if (!key)
        return -ENOMEM;
    for (size_t i = 0, first = 0; i < n; first += s[i].count, i++)
        if (s[i].len) {
            struct ap_site t = ap_tsite_site(table, table_addr, rs, (uint32_t)first, &s[i]);
            key[m++] = (struct site_key){t.addr, site_end(&t), i};
        }
    for (size_t k = 0, r = overlapping_keys(key, m); k < r; k++)
        s[key[k].idx].reason = ALTPATCH_REASON_SITE_OVERLAP;
    free(key);
    return 0;
}

int ap_sites_group(const struct ap_entry *e, size_t n, struct ap_site **out, size_t *nsites)
{
    struct ap_site *s;
    size_t m = 0;

    *out = NULL;
    *nsites = 0;
    if (n == 0)
        return 0;
    s = calloc(n, sizeof(*s));
    if (!s)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        /*
         * An entry of length 0 (ALTERNATIVE("", "", f): nothing to patch) is
         * a site of its own: it shares its address with whatever follows it
         * in the text, and must not be taken for an outer nesting level of
         * that next site (its replacement would then overwrite that site).
         */
        bool joins = m > 0 && e[i].site == s[m - 1].addr && e[i].instrlen != 0 &&
                     s[m - 1].len != 0 && s[m - 1].count < AP_SITE_MAX_RECORDS;

        if (!joins) {
            s[m].addr = e[i].site;
            s[m].first = (uint32_t)i;
            m++;
        }
        s[m - 1].count++;
        if (e[i].instrlen > s[m - 1].len)
            s[m - 1].len = e[i].instrlen;
    }
    for (size_t k = 0; k < m; k++)
        if (s[k].len == 0)
            s[k].reason = ALTPATCH_REASON_EMPTY_SITE;
    if (mark_overlaps(s, m) < 0) {
        free(s);
        return -ENOMEM;
    }
    *out = s;
    *nsites = m;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* One pass over a mapped table                                              */
/* ------------------------------------------------------------------------- */

/*
 * The table hash: one lane modulo 2^64 over the records (each record's first
 * 8 bytes and the rest, 4 or 6 bytes, as two words), a second over the bytes
 * of an incomplete last record, then a final mix. Each step is invertible in
 * the lane and in each word, so a change of one word always changes the
 * lane; it identifies a table as first seen (a library rebuilt and loaded
 * again at the same address), it is not a defence against a chosen collision
 * (code in the process can rewrite anything anyway).
 */
#define HASH_K0 0x9e3779b97f4a7c15ull
/* The per-record multiplier: odd, and a sign-extended 32-bit immediate (no
 * register held for it in the scan). */
#define HASH_KR 0xffffffff9e3779b1ull
#define HASH_K1 0xc2b2ae3d27d4eb4full
#define HASH_SEED0 0x243f6a8885a308d3ull
#define HASH_SEED1 0x13198a2e03707344ull

static uint64_t hash_final(uint64_t h0, uint64_t h1, size_t size)
{
    uint64_t h = (h0 ^ (h1 >> 31) ^ (h1 << 33) ^ size) * 0xff51afd7ed558ccdull;

    h ^= h >> 29;
    h = (h ^ h1) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 32);
}

/*
 * One record into the lane: a bijection of h for fixed words and of each
 * word for a fixed h (an xor, a multiplication by an odd number, a
 * xorshift, an addition of the second word times an odd number), so one
 * changed word always changes the lane. The xorshift keeps the lane from
 * being linear in the words: a shift of every record's offset by the same
 * D (a section moved as a whole) would otherwise leave the hash unchanged
 * whenever D times a sum of powers of the multiplier is 0 modulo 2^64 (4096
 * records moved by 1 MiB, for one). The second word is multiplied before it
 * is added: added as it is, a change of its low bits and the same change
 * xored into the next record's first word cancel whenever the addition does
 * not carry (one feature id up by one and the next site's offset's low bit
 * flipped: half of all such pairs).
 */
static inline uint64_t hash_step(uint64_t h, uint64_t w0, uint64_t w1)
{
    h = (h ^ w0) * HASH_KR;
    return (h ^ (h >> 32)) + w1 * HASH_K1;
}


/* The bytes of an incomplete last record, into the second lane. */
static uint64_t hash_rest(uint64_t h1, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h1 = (h1 + p[i] + 1) * HASH_K1;
    return h1;
}

uint64_t ap_table_hash(const uint8_t *table, size_t size, uint32_t record_size)
{
    uint64_t h = HASH_SEED0, w;
    size_t i = 0;

    if (record_size == ALTPATCH_RECORD_SIZE_KERNEL || record_size == ALTPATCH_RECORD_SIZE_COMPACT)
        for (; size - i >= record_size; i += record_size) {
            memcpy(&w, table + i, 8);
            h = hash_step(h, w, ap_record_tail(table + i, record_size));
        }
    return hash_final(h, size > i ? hash_rest(HASH_SEED1, table + i, size - i) : HASH_SEED1, size);
}

AP_HOT uint64_t ap_bytes_hash(const uint8_t *p, size_t n)
{
    uint64_t h0 = HASH_SEED0, h1 = HASH_SEED1, a, b;
    size_t i = 0;

    for (; n - i >= 16; i += 16) {
        memcpy(&a, p + i, 8);
        memcpy(&b, p + i + 8, 8);
        h0 = (h0 + a) * HASH_K0;
        h1 = (h1 + b) * HASH_K1;
        h0 ^= h0 >> 29;
        h1 ^= h1 >> 29;
    }
    return hash_final(h0, n > i ? hash_rest(h1, p + i, n - i) : h1, n);
}

/*
 * The pass itself, for one record size (a constant after inlining). Per
 * record: the site address, feature and length, the table hash (when asked
 * for), the feature seen, the entry (when asked for). A record at the
 * address of the open site joins it (the rule of ap_sites_group()); any
 * other opens a site, stored at once with one record and grown by the
 * records that join it.
 *
 * The overlap scan runs while the nonempty sites come in address order
 * (empty sites cover no byte: they take no part, as in ap_sites_group()).
 * In address order a nonempty site overlaps an earlier one iff it starts
 * before the largest end seen so far (lim): then it and the site of that
 * end (maxsite) are marked. Every site that overlaps a later one is marked
 * so too: the next nonempty site starts before its end, and if another site
 * holds the larger end, that one covers its start. A nonempty site that
 * starts at or after lim and does not end past 2^64 is in order and
 * overlaps nothing before it: it takes the short path, where its end
 * becomes lim. Sites out of order (lim := UINT64_MAX, *@p sorted := false)
 * leave the scan to mark_overlaps_tsites(); the marks made so far are
 * overlaps too. (A site ending at 2^64 sets lim to UINT64_MAX as well: the
 * sorted copy then decides, with the same answer.)
 */
_Static_assert(offsetof(struct ap_entry, feature) == 16 && offsetof(struct ap_entry, flags) == 18 &&
                   offsetof(struct ap_entry, instrlen) == 20 &&
                   offsetof(struct ap_entry, repllen) == 21 && offsetof(struct ap_entry, index) >= 24,
               "struct ap_entry: feature, flags, instrlen, repllen in bytes 16..21 (scan_records)");

static inline __attribute__((always_inline)) size_t
scan_records(const uint8_t *table, size_t count, uint64_t table_addr, unsigned rs, bool want,
             bool store, bool hash, struct ap_tsite *s, struct ap_site_at *ga, struct ap_entry *e,
             struct ap_table_scan *out, bool *sorted)
{
    uint64_t h = HASH_SEED0;
    uint8_t seen[AP_SCAN_FEATURES]; /* seen[id] = 0x80: some record names feature id */
    unsigned high = 0;
    uint64_t site_bytes = 0, lim = 0;
    uint32_t max_count = count > 0;
    struct ap_tsite *maxsite = s, *o = s; /* o: past the open site (o[-1]) */
    uint64_t cur = 0;                     /* the open site's address */
    /* the address of the last nonempty site while the sites come in
     * order (lim below UINT64_MAX), 0 before the first: no address is below */
    uint64_t ne_addr = 0;
    unsigned gleft = 0; /* sites until the next group starts */
    /* the facts (want): the flags ORed (with the features below them), the
     * replacements' lowest start (signed) and highest end, a preset
     * reason (an empty site, an overlap) */
    uint32_t fl = 0;
    int64_t rlo = INT64_MAX;
    uint64_t rhi = 0;
    bool preset = false;
    /* Records by their runtime address @at; the buffer's byte at at + back. */
    const uint64_t back = (uint64_t)(uintptr_t)table - table_addr;
    uint64_t at = table_addr;
    /* The record's index in the low half of ic, 1 in the high one. A new
     * site is one word: count 1 (struct ap_tsite's bytes 0..1), its reason
     * (byte 2) 0, its len (byte 3); its reason set after where it has one;
     * every AP_SITE_GROUP-th site's first record and offset kept in ga. */
    const uint64_t one = 1ull << 32;
    _Static_assert(offsetof(struct ap_tsite, count) == 0 && offsetof(struct ap_tsite, reason) == 2 &&
                       offsetof(struct ap_tsite, len) == 3,
                   "struct ap_tsite: count, reason, len in bytes 0..3");

    memset(seen, 0, sizeof(seen));
    for (uint64_t ic = one, end_ic = one + count; ic != end_ic; ic++, at += rs) {
        const uint8_t *p = (const uint8_t *)(uintptr_t)(at + back);
        uint64_t w0, w1 = ap_record_tail(p, rs), packed;
        uint8_t ilen;

        memcpy(&w0, p, 8);
        if (hash)
            h = hash_step(h, w0, w1);
        uint64_t addr = at + (uint64_t)(int64_t)(int32_t)(uint32_t)w0;
        /* feature | flags << 16 | instrlen << 32 | repllen << 40: struct ap_entry's
         * bytes 16..23 */
        packed = ap_record_packed(w1, rs);
        unsigned feature = ap_record_feature(w1, rs);
        ilen = p[rs - 2]; /* (packed >> 32) & 0xff, read again: one load */
        if (__builtin_expect(feature < AP_SCAN_FEATURES, 1))
            seen[feature] = 0x80;
        else
            high = feature;
        if (want) {
            uint64_t repl = at + 4 + (uint64_t)(int64_t)(int32_t)(uint32_t)(w0 >> 32);
            if (store) {
                struct ap_entry *x = e++;
                x->site = addr;
                x->repl = repl;
                memcpy((uint8_t *)x + offsetof(struct ap_entry, feature), &packed, 8);
                x->index = (uint32_t)ic;
            }
            uint32_t rl = ap_record_repllen(w1, rs);
            uint64_t rend = repl + rl;
            if (rs != ALTPATCH_RECORD_SIZE_COMPACT) /* else one flag bit, ALT_FLAG_NOT */
                fl |= (uint32_t)w1;
            rlo = (int64_t)repl < rlo ? (int64_t)repl : rlo;
            rhi = rend > rhi ? rend : rhi;
        }
        uint64_t end = addr + ilen;
        /* the rule of ap_sites_group(): a nonempty record at the address of
         * a nonempty open site joins it, while the site has room */
        if (__builtin_expect(addr == cur, 0) && o != s && ilen != 0 && o[-1].len != 0 &&
            o[-1].count < AP_SITE_MAX_RECORDS) {
            struct ap_tsite *j = o - 1;
            if (++j->count > max_count)
                max_count = j->count;
            if (ilen > j->len) {
                site_bytes += (unsigned)(ilen - j->len);
                j->len = ilen;
                end = cur > UINT64_MAX - ilen ? UINT64_MAX : end;
                if (lim != UINT64_MAX && end > lim) { /* in order: the largest end */
                    lim = end;
                    maxsite = j;
                }
            }
            continue;
        }
        uint32_t word = 1u | (uint32_t)ilen << 24;
        memcpy(o, &word, 4);
        if (!gleft) {
            /* the sites before it are closed: their lengths are final (an
             * offset past 32 bits is never used: module.c refuses such a
             * table before it reads one) */
            *ga++ = (struct ap_site_at){(uint32_t)ic, (uint32_t)site_bytes};
            gleft = AP_SITE_GROUP;
        }
        gleft--;
        /* end > addr: not empty, and no wrap past 2^64 */
        if (__builtin_expect(addr >= lim && end > addr, 1)) {
            lim = end;
            maxsite = o;
            ne_addr = addr;
        } else if (!ilen) {
            o->reason = ALTPATCH_REASON_EMPTY_SITE;
            preset = true;
        } else if (lim != UINT64_MAX) {
            if (addr < ne_addr) { /* below the last nonempty site */
                lim = UINT64_MAX; /* out of order */
            } else {
                ne_addr = addr;
                if (addr < lim) {
                    o->reason = ALTPATCH_REASON_SITE_OVERLAP;
                    maxsite->reason = ALTPATCH_REASON_SITE_OVERLAP;
                    preset = true;
                }
                if (addr > UINT64_MAX - ilen)
                    end = UINT64_MAX;
                if (end > lim) {
                    lim = end;
                    maxsite = o;
                }
            }
        }
        o++;
        site_bytes += ilen;
        cur = addr;
    }
    _Static_assert(AP_SCAN_FEATURES % 64 == 0, "the map folds 64 bytes to a word");
    for (unsigned w = 0; w < AP_SCAN_FEATURES / 64; w++) { /* each byte's top bit (SSE2) */
        uint64_t bits = 0;
        for (unsigned b = 0; b < 64; b += 16)
            bits |= (uint64_t)(uint16_t)_mm_movemask_epi8(
                        _mm_loadu_si128((const void *)(seen + w * 64 + b)))
                    << b;
        out->features[w] = bits;
    }
    out->feature_high = high;
    out->site_bytes = site_bytes;
    out->max_count = max_count;
    out->hash = hash ? hash_final(h, HASH_SEED1, count * rs) : 0;
    *sorted = lim != UINT64_MAX;
    if (want && count) {
        out->flags_known = (fl >> 16) <= ALT_FLAG_NOT;
        out->repl_lo = rlo;
        out->repl_hi = rhi;
        /* in address order with no preset reason (no empty site, no
         * overlap: each is marked here while in order): the first site
         * starts lowest, lim is the largest end (no end past 2^64: that sets
         * lim to UINT64_MAX, as a site out of order does) */
        out->text_span = lim != UINT64_MAX && !preset;
        out->text_lo = ap_record_site(table, table_addr, rs, 0); /* the first site's */
        out->text_hi = lim;
    }
    return (size_t)(o - s);
}

/* The pass for one record size: with the entries (and the facts), with the
 * facts alone, each with or without the hash, or with the hash only (also
 * what a pass with none of them runs). */
static inline __attribute__((always_inline)) size_t
scan_dispatch(const uint8_t *table, size_t count, uint64_t table_addr, unsigned rs, unsigned what,
              struct ap_tsite *s, struct ap_site_at *ga, struct ap_entry *e, struct ap_table_scan *out,
              bool *sorted)
{
    bool hash = what & AP_SCAN_HASH;
    if (what & AP_SCAN_ENTRIES)
        return hash ? scan_records(table, count, table_addr, rs, true, true, true, s, ga, e, out,
                                   sorted)
                    : scan_records(table, count, table_addr, rs, true, true, false, s, ga, e, out,
                                   sorted);
    if (what & AP_SCAN_FACTS)
        return hash ? scan_records(table, count, table_addr, rs, true, false, true, s, ga, e, out,
                                   sorted)
                    : scan_records(table, count, table_addr, rs, true, false, false, s, ga, e,
                                   out, sorted);
    return scan_records(table, count, table_addr, rs, false, false, true, s, ga, e, out, sorted);
}

AP_HOT int ap_table_scan(const uint8_t *table, size_t size, uint64_t table_addr, uint32_t record_size,
                  unsigned what, struct ap_table_scan *out)
{
    size_t count;
    struct ap_tsite *s = NULL;
    struct ap_site_at *ga = NULL;
    struct ap_entry *e = NULL;
    bool sorted = true;
    bool want_entries = what & AP_SCAN_ENTRIES, want_hash = what & AP_SCAN_HASH;

    memset(out, 0, sizeof(*out));
    if (record_size != ALTPATCH_RECORD_SIZE_KERNEL && record_size != ALTPATCH_RECORD_SIZE_COMPACT) {
        out->hash = table && want_hash ? ap_table_hash(table, size, record_size) : 0;
        return ALTPATCH_REASON_BAD_VERSION;
    }
    count = size / record_size;
    if (size % record_size != 0 || (size && !table) || count > UINT32_MAX) {
        out->hash = table && want_hash ? ap_table_hash(table, size, record_size) : 0;
        return ALTPATCH_REASON_BAD_TABLE;
    }
    if (count == 0) {
        out->hash = want_hash ? ap_table_hash(table, 0, record_size) : 0;
        return ALTPATCH_REASON_NONE;
    }
    s = ap_malloc_filled(count * sizeof(*s)); /* both written from end to end */
    ga = ap_mem_alloc((count / AP_SITE_GROUP + 1) * sizeof(*ga));
    if (want_entries)
        e = ap_malloc_filled(count * sizeof(*e));
    if (!s || !ga || (want_entries && !e)) {
        ap_mem_free(s);
        ap_mem_free(ga);
        ap_mem_free(e);
        return -ENOMEM;
    }
    size_t m = record_size == ALTPATCH_RECORD_SIZE_COMPACT
                   ? scan_dispatch(table, count, table_addr, ALTPATCH_RECORD_SIZE_COMPACT, what, s,
                                   ga, e, out, &sorted)
                   : scan_dispatch(table, count, table_addr, ALTPATCH_RECORD_SIZE_KERNEL, what, s,
                                   ga, e, out, &sorted);
    if (!want_hash)
        out->hash = 0;
    if (!sorted && mark_overlaps_tsites(table, table_addr, record_size, s, m) < 0) {
        ap_mem_free(s);
        ap_mem_free(ga);
        ap_mem_free(e);
        return -ENOMEM;
    }
    /* several records in some site: the rest given back, unless it is a
     * few bytes */
    if (m < count && (count - m) * sizeof(*s) >= 256) {
        struct ap_tsite *t = ap_mem_realloc(s, m * sizeof(*s));
        if (t)
            s = t;
    }
    out->sites = s;
    out->at = ga;
    out->nsites = m;
    out->entries = e;
    out->nentries = e ? count : 0;
    return ALTPATCH_REASON_NONE;
}
