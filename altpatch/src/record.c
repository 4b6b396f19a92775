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
#include <errno.h>
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

/* Offsets of the fields of a record (both formats; struct altpatch_record, packed). */
#define REC_OFF_INSTR 0
#define REC_OFF_REPL 4
#define REC_OFF_FT 8
/* The feature word of a format-3 record. */
#define REC_COMPACT_FEATURE 0x7fffu
#define REC_COMPACT_NOT 0x8000u

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

int ap_note_parse(const uint8_t *desc, size_t descsz, uint64_t desc_addr, struct ap_note *out)
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
    if (out->table_end < out->table_start || out->repl_end < out->repl_start)
        return ALTPATCH_REASON_BAD_TABLE;
    return ALTPATCH_REASON_NONE;
}

/* Decode format-1 record @i of @table (first byte at @table_addr) into @e. */
static void record_decode(const uint8_t *table, uint64_t table_addr, size_t i, struct ap_entry *e)
{
    const uint8_t *p = table + i * ALTPATCH_RECORD_SIZE_KERNEL;
    uint64_t at = table_addr + (uint64_t)i * ALTPATCH_RECORD_SIZE_KERNEL;
    struct altpatch_record r;

    memcpy(&r, p, sizeof(r));
    e->site = rd_selfrel(p + REC_OFF_INSTR, at + REC_OFF_INSTR);
    e->repl = rd_selfrel(p + REC_OFF_REPL, at + REC_OFF_REPL);
    e->feature = (uint16_t)(r.ft_flags & 0xffffu);
    e->flags = (uint16_t)(r.ft_flags >> ALT_FLAGS_SHIFT);
    e->instrlen = r.instrlen;
    e->repllen = r.replacementlen;
    e->index = (uint32_t)i;
}

/*
 * Decode format-3 record @i: s32 site, s32 replacement, u16 feature word
 * (bits 0..14 the feature, bit 15 ALT_FLAG_NOT), u8 site length, u8
 * replacement length.
 */
static void record_decode_compact(const uint8_t *table, uint64_t table_addr, size_t i,
                                  struct ap_entry *e)
{
    const uint8_t *p = table + i * ALTPATCH_RECORD_SIZE_COMPACT;
    uint64_t at = table_addr + (uint64_t)i * ALTPATCH_RECORD_SIZE_COMPACT;
    uint16_t ft;

    memcpy(&ft, p + REC_OFF_FT, sizeof(ft));
    e->site = rd_selfrel(p + REC_OFF_INSTR, at + REC_OFF_INSTR);
    e->repl = rd_selfrel(p + REC_OFF_REPL, at + REC_OFF_REPL);
    e->feature = (uint16_t)(ft & REC_COMPACT_FEATURE);
    e->flags = (ft & REC_COMPACT_NOT) ? ALT_FLAG_NOT : 0;
    e->instrlen = p[REC_OFF_FT + 2];
    e->repllen = p[REC_OFF_FT + 3];
    e->index = (uint32_t)i;
}

void ap_record_get(const uint8_t *table, uint64_t table_addr, uint32_t record_size, size_t i,
                   struct ap_entry *e)
{
    if (record_size == ALTPATCH_RECORD_SIZE_COMPACT)
        record_decode_compact(table, table_addr, i, e);
    else
        record_decode(table, table_addr, i, e);
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
    if (record_size == ALTPATCH_RECORD_SIZE_KERNEL)
        for (size_t i = 0; i < count; i++)
            record_decode(table, table_addr, i, &e[i]);
    else
        for (size_t i = 0; i < count; i++)
            record_decode_compact(table, table_addr, i, &e[i]);
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

/* The scan of mark_overlaps() on a sorted copy of the keys. */
static int mark_overlaps_sorted_copy(struct ap_site *s, size_t n)
{
    struct site_key *key = malloc((n ? n : 1) * sizeof(*key));
    size_t m = 0;
    uint64_t maxend = 0;

    if (!key)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (s[i].len)
            key[m++] = (struct site_key){s[i].addr, site_end(&s[i]), i};
    qsort(key, m, sizeof(*key), cmp_key);
    for (size_t k = 0; k < m; k++) {
        bool before = k > 0 && key[k].addr < maxend;
        bool after = k + 1 < m && key[k].end > key[k + 1].addr;

        if (before || after)
            s[key[k].idx].reason = ALTPATCH_REASON_SITE_OVERLAP;
        if (key[k].end > maxend)
            maxend = key[k].end;
    }
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
                     s[m - 1].len != 0;

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
