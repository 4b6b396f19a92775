/* SPDX-License-Identifier: MIT */
/*
 * One pass over a record table (record.c, ap_table_scan): the sites, their
 * preset reasons, the entries, the features named, the table's hash. Each
 * answer is compared with the two-step path it replaces (ap_records_parse()
 * then ap_sites_group()) on tables built byte by byte, in both formats:
 * nested sites, empty entries, overlaps in and out of address order, sites
 * at the end of the address space, feature ids past the bitmap.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pure.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* One record as the assembler lays it out (format 1 or 3). */
struct rec {
    uint64_t site, repl;
    uint16_t feature, flags;
    uint8_t instrlen, repllen;
};

static void put_record(uint8_t *t, uint64_t table_addr, unsigned rs, size_t i, const struct rec *r)
{
    uint8_t *p = t + i * rs;
    uint64_t at = table_addr + i * rs;

    put32(p + 0, (uint32_t)(r->site - at));
    put32(p + 4, (uint32_t)(r->repl - (at + 4)));
    if (rs == ALTPATCH_RECORD_SIZE_KERNEL) {
        put32(p + 8, (uint32_t)r->feature | (uint32_t)r->flags << 16);
        p[12] = r->instrlen;
        p[13] = r->repllen;
    } else {
        uint16_t ft = (uint16_t)((r->feature & 0x7fff) | ((r->flags & ALT_FLAG_NOT) ? 0x8000 : 0));
        p[8] = (uint8_t)ft;
        p[9] = (uint8_t)(ft >> 8);
        p[10] = r->instrlen;
        p[11] = r->repllen;
    }
}

/* A small deterministic generator (xorshift). */
static uint64_t rnd_state;
static uint64_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

/*
 * Scan @p t both ways and compare everything the scan promises with the
 * two-step path. Returns the scan (with entries) for further checks.
 */
static void compare(const uint8_t *t, size_t size, uint64_t table_addr, unsigned rs,
                    struct ap_table_scan *keep)
{
    struct ap_entry *e = NULL;
    struct ap_site *s = NULL;
    size_t ne = 0, ns = 0;
    struct ap_table_scan a, b, c;

    int r1 = ap_records_parse(t, size, table_addr, rs, &e, &ne);
    int r2 = ap_table_scan(t, size, table_addr, rs, AP_SCAN_ENTRIES | AP_SCAN_HASH, &a);
    int r3 = ap_table_scan(t, size, table_addr, rs, AP_SCAN_HASH, &b);
    int r4 = ap_table_scan(t, size, table_addr, rs, AP_SCAN_ENTRIES, &c); /* no hash */
    cr_assert_eq(r2, r1);
    cr_assert_eq(r3, r1);
    cr_assert_eq(r4, r1);
    cr_assert_eq(a.hash, ap_table_hash(t, size, rs));
    cr_assert_eq(b.hash, a.hash);
    cr_assert_eq(c.hash, 0);
    if (r1 != ALTPATCH_REASON_NONE) {
        cr_assert_null(a.sites);
        cr_assert_null(a.entries);
        cr_assert_null(c.sites);
        *keep = a;
        return;
    }
    cr_assert_eq(ap_sites_group(e, ne, &s, &ns), 0);
    cr_assert_eq(a.nsites, ns);
    cr_assert_eq(b.nsites, ns);
    cr_assert_eq(c.nsites, ns);
    cr_assert_eq(a.nentries, ne);
    cr_assert_eq(c.nentries, ne);
    cr_assert_null(b.entries);
    cr_assert_eq(b.nentries, 0);
    uint64_t bytes = 0;
    uint32_t maxc = 0;
    for (size_t k = 0; k < ns; k++) {
        for (int w = 0; w < 3; w++) {
            const struct ap_table_scan *y = w == 2 ? &c : w ? &b : &a;
            const struct ap_tsite *x = &y->sites[k];
            /* its first record: the records of the sites before it (every
             * AP_SITE_GROUP-th site's kept), and its address that record's */
            uint32_t first = ap_tsite_first(y->sites, y->at, k);
            cr_assert_eq(first, s[k].first, "site %zu", k);
            /* a group's first site: where its bytes start, laid end to end */
            if (k % AP_SITE_GROUP == 0)
                cr_assert_eq(y->at[k / AP_SITE_GROUP].off, bytes, "site %zu: offset %u, not %llu",
                             k, y->at[k / AP_SITE_GROUP].off, (unsigned long long)bytes);
            cr_assert_eq(ap_record_site(t, table_addr, rs, first), s[k].addr, "site %zu", k);
            cr_assert_eq(ap_tsite_site(t, table_addr, rs, first, x).addr, s[k].addr, "site %zu", k);
            cr_assert_eq(x->count, s[k].count, "site %zu", k);
            cr_assert_eq(x->len, s[k].len, "site %zu", k);
            cr_assert_eq(x->reason, s[k].reason, "site %zu: reason %d, not %d", k, x->reason,
                         s[k].reason);
        }
        bytes += s[k].len;
        if (s[k].count > maxc)
            maxc = s[k].count;
    }
    cr_assert_eq(a.site_bytes, bytes);
    cr_assert_eq(a.max_count, maxc);
    cr_assert_eq(b.site_bytes, bytes);
    cr_assert_eq(b.max_count, maxc);
    cr_assert_eq(c.site_bytes, bytes);
    cr_assert_eq(c.max_count, maxc);
    uint64_t feat[AP_SCAN_FEATURES / 64] = {0};
    bool high = false;
    for (size_t i = 0; i < ne; i++) {
        for (int w = 0; w < 2; w++) {
            const struct ap_entry *x = w ? &c.entries[i] : &a.entries[i];
            cr_assert_eq(x->site, e[i].site, "entry %zu", i);
            cr_assert_eq(x->repl, e[i].repl, "entry %zu", i);
            cr_assert_eq(x->feature, e[i].feature, "entry %zu", i);
            cr_assert_eq(x->flags, e[i].flags, "entry %zu", i);
            cr_assert_eq(x->instrlen, e[i].instrlen, "entry %zu", i);
            cr_assert_eq(x->repllen, e[i].repllen, "entry %zu", i);
            cr_assert_eq(x->index, e[i].index, "entry %zu", i);
        }
        if (e[i].feature < AP_SCAN_FEATURES)
            feat[e[i].feature / 64] |= 1ull << (e[i].feature % 64);
        else
            high = true;
    }
    cr_assert_eq(memcmp(a.features, feat, sizeof(feat)), 0);
    cr_assert_eq(memcmp(b.features, feat, sizeof(feat)), 0);
    cr_assert_eq(memcmp(c.features, feat, sizeof(feat)), 0);
    cr_assert_eq(a.feature_high != 0, high);
    cr_assert_eq(c.feature_high, a.feature_high);
    if (high)
        cr_assert_geq(a.feature_high, AP_SCAN_FEATURES);
    /* the facts, from the two-step path's entries and sites */
    bool flags_known = ne > 0, text_span = ns > 0;
    int64_t rlo = INT64_MAX;
    uint64_t rhi = 0, thi = 0;
    for (size_t i = 0; i < ne; i++) {
        flags_known &= e[i].flags <= ALT_FLAG_NOT;
        if ((int64_t)e[i].repl < rlo)
            rlo = (int64_t)e[i].repl;
        if (e[i].repl + e[i].repllen > rhi)
            rhi = e[i].repl + e[i].repllen;
    }
    for (size_t k = 0; k < ns; k++) {
        text_span &= s[k].len > 0 && !s[k].reason && (k == 0 || s[k].addr >= s[k - 1].addr) &&
                     s[k].addr < UINT64_MAX - s[k].len;
        if (s[k].addr + s[k].len > thi)
            thi = s[k].addr + s[k].len;
    }
    for (int w = 0; w < 2; w++) {
        const struct ap_table_scan *x = w ? &c : &a;
        cr_assert_eq(x->flags_known, flags_known);
        cr_assert_eq(x->text_span, text_span);
        if (ne) {
            cr_assert_eq(x->repl_lo, rlo);
            cr_assert_eq(x->repl_hi, rhi);
        }
        if (text_span) {
            cr_assert_eq(x->text_lo, s[0].addr);
            cr_assert_eq(x->text_hi, thi);
        }
    }
    cr_assert(!b.flags_known && b.repl_lo == 0 && !b.text_span, "no facts without the entries");
    /* the facts without the entries: the same sites and facts, no entries,
     * the hash only when asked */
    for (int h = 0; h < 2; h++) {
        struct ap_table_scan d;
        cr_assert_eq(ap_table_scan(t, size, table_addr, rs, AP_SCAN_FACTS | (h ? AP_SCAN_HASH : 0),
                                   &d),
                     ALTPATCH_REASON_NONE);
        cr_assert_null(d.entries);
        cr_assert_eq(d.nentries, 0);
        cr_assert_eq(d.hash, h ? a.hash : 0);
        cr_assert_eq(d.nsites, ns);
        for (size_t k = 0; k < ns; k++) {
            cr_assert_eq(ap_tsite_first(d.sites, d.at, k),
                         ap_tsite_first(a.sites, a.at, k), "site %zu", k);
            cr_assert_eq(d.sites[k].count, a.sites[k].count, "site %zu", k);
            cr_assert_eq(d.sites[k].len, a.sites[k].len, "site %zu", k);
            cr_assert_eq(d.sites[k].reason, a.sites[k].reason, "site %zu", k);
        }
        cr_assert_eq(d.site_bytes, a.site_bytes);
        cr_assert_eq(d.max_count, a.max_count);
        cr_assert_eq(memcmp(d.features, a.features, sizeof(d.features)), 0);
        cr_assert_eq(d.feature_high, a.feature_high);
        cr_assert_eq(d.flags_known, a.flags_known);
        cr_assert_eq(d.repl_lo, a.repl_lo);
        cr_assert_eq(d.repl_hi, a.repl_hi);
        cr_assert_eq(d.text_span, a.text_span);
        cr_assert_eq(d.text_lo, a.text_lo);
        cr_assert_eq(d.text_hi, a.text_hi);
        ap_mem_free(d.sites);
        ap_mem_free(d.at);
    }
    /* one record decoded inline, as a first decision reads its site's */
    for (size_t i = 0; i < ne; i++) {
        struct ap_entry x;
        memset(&x, 0xa5, sizeof(x));
        ap_record_at(t, table_addr, rs, i, &x);
        cr_assert_eq(x.site, e[i].site, "entry %zu", i);
        cr_assert_eq(x.repl, e[i].repl, "entry %zu", i);
        cr_assert_eq(x.feature, e[i].feature, "entry %zu", i);
        cr_assert_eq(x.flags, e[i].flags, "entry %zu", i);
        cr_assert_eq(x.instrlen, e[i].instrlen, "entry %zu", i);
        cr_assert_eq(x.repllen, e[i].repllen, "entry %zu", i);
        cr_assert_eq(x.index, e[i].index, "entry %zu", i);
    }
    ap_mem_free(b.sites);
    ap_mem_free(b.at);
    ap_mem_free(c.sites);
    ap_mem_free(c.at);
    ap_mem_free(c.entries);
    free(e);
    free(s);
    *keep = a;
}

static void scan_free(struct ap_table_scan *a)
{
    ap_mem_free(a->sites);
    ap_mem_free(a->at);
    ap_mem_free(a->entries);
}

/* Build a table from @p r (n records) at @p table_addr and compare. */
static void check(const struct rec *r, size_t n, uint64_t table_addr, unsigned rs,
                  struct ap_table_scan *out)
{
    uint8_t *t = malloc(n * rs + 1);
    cr_assert_not_null(t);
    for (size_t i = 0; i < n; i++)
        put_record(t, table_addr, rs, i, &r[i]);
    compare(t, n * rs, table_addr, rs, out);
    free(t);
}

static const unsigned formats[2] = {ALTPATCH_RECORD_SIZE_KERNEL, ALTPATCH_RECORD_SIZE_COMPACT};

Test(scan, nested_sites_and_reasons)
{
    const uint64_t T = 0x500000;
    /* A(3 entries), empty E at the address of B, B, C overlapping B, D */
    struct rec r[] = {
        {0x401000, 0x402000, 10, 0, 5, 2},  {0x401000, 0x402002, 11, 0, 7, 3},
        {0x401000, 0x402005, 12, 1, 6, 1},  {0x401010, 0x402006, 13, 0, 0, 0},
        {0x401010, 0x402006, 14, 0, 4, 4},  {0x401012, 0x40200a, 15, 0, 4, 4},
        {0x401020, 0x40200e, 16, 0, 2, 2},
    };
    for (int f = 0; f < 2; f++) {
        struct ap_table_scan a;
        check(r, sizeof(r) / sizeof(r[0]), T, formats[f], &a);
        cr_assert_eq(a.nsites, 5);
        cr_assert_eq(a.sites[0].count, 3);
        cr_assert_eq(a.sites[0].len, 7);
        cr_assert_eq(a.sites[0].reason, ALTPATCH_REASON_NONE);
        cr_assert_eq(a.sites[1].reason, ALTPATCH_REASON_EMPTY_SITE);
        cr_assert_eq(a.sites[2].reason, ALTPATCH_REASON_SITE_OVERLAP);
        cr_assert_eq(a.sites[3].reason, ALTPATCH_REASON_SITE_OVERLAP);
        cr_assert_eq(a.sites[4].reason, ALTPATCH_REASON_NONE);
        cr_assert_eq(a.max_count, 3);
        cr_assert_eq(a.site_bytes, 7 + 0 + 4 + 4 + 2);
        scan_free(&a);
    }
}

/* A site overlapping one that is not the last before it (the largest end seen). */
Test(scan, overlap_with_an_earlier_site_than_the_last)
{
    struct rec r[] = {
        {0x1000, 0x9000, 1, 0, 200, 1}, /* [0x1000, 0x10c8) covers the two next */
        {0x1010, 0x9000, 2, 0, 4, 1},
        {0x1020, 0x9000, 3, 0, 4, 1},
        {0x1100, 0x9000, 4, 0, 4, 1},  /* after all: no overlap */
    };
    for (int f = 0; f < 2; f++) {
        struct ap_table_scan a;
        check(r, 4, 0x8000, formats[f], &a);
        cr_assert_eq(a.sites[0].reason, ALTPATCH_REASON_SITE_OVERLAP);
        cr_assert_eq(a.sites[1].reason, ALTPATCH_REASON_SITE_OVERLAP);
        cr_assert_eq(a.sites[2].reason, ALTPATCH_REASON_SITE_OVERLAP);
        cr_assert_eq(a.sites[3].reason, ALTPATCH_REASON_NONE);
        scan_free(&a);
    }
}

/* Out of address order: the sorted-copy fallback decides, marks made before stay right. */
Test(scan, unsorted_table_through_the_fallback)
{
    struct rec r[] = {
        {0x2000, 0x9000, 1, 0, 8, 1},  {0x2004, 0x9000, 2, 0, 8, 1}, /* overlap, in order */
        {0x1000, 0x9000, 3, 0, 8, 1},                               /* out of order */
        {0x3000, 0x9000, 4, 0, 8, 1},  {0x1004, 0x9000, 5, 0, 2, 1}, /* overlaps 0x1000 */
        {0x0ff0, 0x9000, 6, 0, 0, 0},                               /* empty, out of order */
        {0x5000, 0x9000, 7, 0, 8, 1},
    };
    for (int f = 0; f < 2; f++) {
        struct ap_table_scan a;
        check(r, sizeof(r) / sizeof(r[0]), 0x8000, formats[f], &a);
        cr_assert_eq(a.nsites, 7);
        int want[7] = {ALTPATCH_REASON_SITE_OVERLAP, ALTPATCH_REASON_SITE_OVERLAP,
                       ALTPATCH_REASON_SITE_OVERLAP, ALTPATCH_REASON_NONE,
                       ALTPATCH_REASON_SITE_OVERLAP, ALTPATCH_REASON_EMPTY_SITE,
                       ALTPATCH_REASON_NONE};
        for (int k = 0; k < 7; k++)
            cr_assert_eq(a.sites[k].reason, want[k], "site %d", k);
        scan_free(&a);
    }
}

/* Only an empty site out of order: still the same answer. */
Test(scan, empty_site_out_of_order)
{
    struct rec r[] = {
        {0x2000, 0x9000, 1, 0, 8, 1},
        {0x1000, 0x9000, 2, 0, 0, 0},
        {0x2004, 0x9000, 3, 0, 2, 1},
    };
    for (int f = 0; f < 2; f++) {
        struct ap_table_scan a;
        check(r, 3, 0x8000, formats[f], &a);
        cr_assert_eq(a.sites[0].reason, ALTPATCH_REASON_SITE_OVERLAP);
        cr_assert_eq(a.sites[1].reason, ALTPATCH_REASON_EMPTY_SITE);
        cr_assert_eq(a.sites[2].reason, ALTPATCH_REASON_SITE_OVERLAP);
        scan_free(&a);
    }
}

Test(scan, many_records_in_one_site)
{
    struct rec r[40];
    for (int i = 0; i < 40; i++)
        r[i] = (struct rec){0x4000, 0x9000 + (uint64_t)i, (uint16_t)i, 0, (uint8_t)(1 + i % 9), 1};
    for (int f = 0; f < 2; f++) {
        struct ap_table_scan a;
        check(r, 40, 0x8000, formats[f], &a);
        cr_assert_eq(a.nsites, 1);
        cr_assert_eq(a.sites[0].count, 40);
        cr_assert_eq(a.sites[0].len, 9);
        cr_assert_eq(a.max_count, 40);
        scan_free(&a);
    }
}

/*
 * A site holds at most AP_SITE_MAX_RECORDS records: the next record at its
 * address opens a site of its own there, and the two (and nothing after
 * them) are refused as overlapping, by the pass and the two-step path alike.
 */
Test(scan, records_past_a_sites_limit_open_an_overlapping_site)
{
    const size_t n = (size_t)AP_SITE_MAX_RECORDS + 3;
    struct rec *r = malloc((n + 1) * sizeof(*r));
    cr_assert_not_null(r);
    for (size_t i = 0; i < n; i++)
        r[i] = (struct rec){0x4000, 0x9000, (uint16_t)(i % 64), 0, (uint8_t)(1 + i % 5), 1};
    r[n] = (struct rec){0x4010, 0x9000, 1, 0, 4, 1}; /* after both: not refused */
    for (int f = 0; f < 2; f++) {
        struct ap_table_scan a;
        check(r, n + 1, 0x8000, formats[f], &a);
        cr_assert_eq(a.nsites, 3);
        cr_assert_eq(a.entries[ap_tsite_first(a.sites, a.at, 0)].site, 0x4000);
        cr_assert_eq(ap_tsite_first(a.sites, a.at, 0), 0); /* its first record's */
        cr_assert_eq(a.sites[0].count, AP_SITE_MAX_RECORDS);
        cr_assert_eq(a.sites[0].len, 5);
        cr_assert_eq(a.entries[ap_tsite_first(a.sites, a.at, 1)].site, 0x4000);
        cr_assert_eq(ap_tsite_first(a.sites, a.at, 1), AP_SITE_MAX_RECORDS);
        cr_assert_eq(a.sites[1].count, 3);
        cr_assert_eq(a.sites[0].reason, ALTPATCH_REASON_SITE_OVERLAP);
        cr_assert_eq(a.sites[1].reason, ALTPATCH_REASON_SITE_OVERLAP);
        cr_assert_eq(a.sites[2].reason, ALTPATCH_REASON_NONE);
        cr_assert_eq(a.max_count, AP_SITE_MAX_RECORDS);
        cr_assert(!a.text_span);
        scan_free(&a);
    }
    free(r);
}

/*
 * The bounds of the pass's short path: a site starting exactly where the
 * largest end is (no overlap), a nonempty record at the address of an empty
 * site (a site of its own, not a join), a record that grows the open site
 * over the next one, empty sites out of order among ordered ones (no part
 * in the order), and a site ending exactly at 2^64.
 */
Test(scan, short_path_bounds)
{
    struct rec r[] = {
        {0x1000, 0x9000, 1, 0, 4, 1},  /* [0x1000, 0x1004) */
        {0x1004, 0x9000, 2, 0, 4, 1},  /* starts at the end: no overlap */
        {0x1008, 0x9000, 3, 0, 0, 0},  /* empty */
        {0x1008, 0x9000, 4, 0, 2, 1},  /* at the empty site's address: a site */
        {0x1008, 0x9000, 5, 0, 9, 1},  /* joins it, now [0x1008, 0x1011) */
        {0x1010, 0x9000, 6, 0, 2, 1},  /* overlaps the grown site */
        {0x0800, 0x9000, 7, 0, 0, 0},  /* empty, before everything */
        {0x1020, 0x9000, 8, 0, 4, 1},  /* in order among the nonempty ones */
        {0x1022, 0x9000, 9, 0, 1, 1},  /* overlaps the one before */
        {0x1030, 0x9000, 10, 0, 0, 0}, /* empty, then sites before it */
        {0x1024, 0x9000, 11, 0, 4, 1},
        {0x1028, 0x9000, 12, 0, 4, 1},
    };
    size_t n = sizeof(r) / sizeof(r[0]);
    int want[] = {ALTPATCH_REASON_NONE,        ALTPATCH_REASON_NONE,
                  ALTPATCH_REASON_EMPTY_SITE,  ALTPATCH_REASON_SITE_OVERLAP,
                  ALTPATCH_REASON_SITE_OVERLAP, ALTPATCH_REASON_EMPTY_SITE,
                  ALTPATCH_REASON_SITE_OVERLAP, ALTPATCH_REASON_SITE_OVERLAP,
                  ALTPATCH_REASON_EMPTY_SITE,  ALTPATCH_REASON_NONE,
                  ALTPATCH_REASON_NONE};
    for (int f = 0; f < 2; f++) {
        struct ap_table_scan a;
        check(r, n, 0x8000, formats[f], &a);
        cr_assert_eq(a.nsites, sizeof(want) / sizeof(want[0]));
        for (size_t k = 0; k < a.nsites; k++)
            cr_assert_eq(a.sites[k].reason, want[k], "format %u site %zu", formats[f], k);
        cr_assert_eq(a.sites[3].count, 2);
        cr_assert_eq(a.sites[3].len, 9);
        scan_free(&a);
    }
    struct rec top[] = {
        {UINT64_MAX - 7, 0x9000, 1, 0, 4, 1}, /* [2^64 - 8, 2^64 - 4) */
        {UINT64_MAX - 3, 0x9000, 2, 0, 4, 1}, /* ends at 2^64 */
    };
    struct ap_table_scan a;
    check(top, 2, 0x10, ALTPATCH_RECORD_SIZE_COMPACT, &a);
    cr_assert_eq(a.sites[0].reason, ALTPATCH_REASON_NONE);
    cr_assert_eq(a.sites[1].reason, ALTPATCH_REASON_NONE);
    scan_free(&a);
}

Test(scan, end_of_address_space)
{
    struct rec r[] = {
        {UINT64_MAX - 3, 0x9000, 1, 0, 8, 1}, /* wraps: ends at the top */
        {UINT64_MAX - 1, 0x9000, 2, 0, 1, 1},
    };
    /* offsets reach the top only from a table near address 0 */
    struct ap_table_scan a;
    check(r, 2, 0x10, ALTPATCH_RECORD_SIZE_COMPACT, &a);
    cr_assert_eq(a.sites[0].reason, ALTPATCH_REASON_SITE_OVERLAP);
    cr_assert_eq(a.sites[1].reason, ALTPATCH_REASON_SITE_OVERLAP);
    scan_free(&a);
}

Test(scan, bad_tables)
{
    uint8_t t[64] = {0};
    struct ap_table_scan a;
    const unsigned all = AP_SCAN_ENTRIES | AP_SCAN_HASH;

    cr_assert_eq(ap_table_scan(t, 13, 0x1000, ALTPATCH_RECORD_SIZE_COMPACT, all, &a),
                 ALTPATCH_REASON_BAD_TABLE);
    cr_assert_null(a.sites);
    cr_assert_eq(a.hash, ap_table_hash(t, 13, ALTPATCH_RECORD_SIZE_COMPACT));
    cr_assert_eq(ap_table_scan(t, 15, 0x1000, ALTPATCH_RECORD_SIZE_KERNEL, all, &a),
                 ALTPATCH_REASON_BAD_TABLE);
    cr_assert_eq(ap_table_scan(t, 24, 0x1000, 16, all, &a), ALTPATCH_REASON_BAD_VERSION);
    cr_assert_eq(ap_table_scan(NULL, 12, 0x1000, ALTPATCH_RECORD_SIZE_COMPACT, all, &a),
                 ALTPATCH_REASON_BAD_TABLE);
    cr_assert_eq(ap_table_scan(t, 0, 0x1000, ALTPATCH_RECORD_SIZE_COMPACT, all, &a),
                 ALTPATCH_REASON_NONE);
    cr_assert_eq(a.nsites, 0);
    cr_assert_null(a.sites);
}

/* The hash: a change of any one byte of the table changes it. */
Test(scan, hash_sees_every_byte)
{
    uint8_t t[14 * 9 + 5];
    for (size_t i = 0; i < sizeof(t); i++)
        t[i] = (uint8_t)(i * 37 + 11);
    for (int f = 0; f < 2; f++) {
        unsigned rs = formats[f];
        for (size_t size = 0; size <= sizeof(t); size += 7) {
            uint64_t h = ap_table_hash(t, size, rs);
            for (size_t i = 0; i < size; i++) {
                t[i] ^= 0x40;
                cr_assert_neq(ap_table_hash(t, size, rs), h, "size %zu byte %zu", size, i);
                t[i] ^= 0x40;
            }
            cr_assert_eq(ap_table_hash(t, size, rs), h);
        }
        uint64_t h = ap_bytes_hash(t, sizeof(t));
        for (size_t i = 0; i < sizeof(t); i++) {
            t[i] ^= 1;
            cr_assert_neq(ap_bytes_hash(t, sizeof(t)), h);
            t[i] ^= 1;
        }
        cr_assert_neq(ap_bytes_hash(t, sizeof(t) - 1), h);
    }
}

/*
 * Two words changed together: one record's second word up by a small amount
 * and the next record's first word changed in the same low bits (a feature
 * id up by one and the next site's offset one apart): every such pair of
 * tables hashes apart.
 */
Test(scan, hash_sees_changes_in_two_records)
{
    enum { N = 8 };
    for (int f = 0; f < 2; f++) {
        unsigned rs = formats[f];
        unsigned same = 0, pairs = 0;
        for (unsigned i = 0; i + 1 < N; i++)
            for (unsigned d = 1; d <= 16; d++)
                for (unsigned base = 0; base < 64; base++) {
                    uint8_t a[N * 14] = {0}, b[N * 14];
                    for (unsigned k = 0; k < N; k++) {
                        a[k * rs] = (uint8_t)(3 * k + base);
                        a[k * rs + 8] = (uint8_t)(base + k);
                        a[k * rs + rs - 2] = a[k * rs + rs - 1] = 5;
                    }
                    memcpy(b, a, sizeof(a));
                    b[i * rs + 8] = (uint8_t)(b[i * rs + 8] + d);      /* feature + d */
                    b[(i + 1) * rs] ^= (uint8_t)(a[i * rs + 8] ^ b[i * rs + 8]); /* next site */
                    same += ap_table_hash(a, N * rs, rs) == ap_table_hash(b, N * rs, rs);
                    pairs++;
                }
        cr_assert_eq(same, 0, "format %u: %u of %u pairs collide", rs, same, pairs);
    }
}

/*
 * A section moved as a whole: every record's replacement offset shifted by
 * the same amount (4096 records, 1 MiB), and every site offset by the same
 * amount: other tables, other hashes. Also the bytes hash of two buffers
 * that differ by the same amount in every word.
 */
Test(scan, hash_sees_a_uniform_shift)
{
    enum { N = 4096 };
    for (int f = 0; f < 2; f++) {
        unsigned rs = formats[f];
        uint8_t *a = calloc(N, rs), *b = calloc(N, rs), *c = calloc(N, rs);
        cr_assert(a && b && c);
        for (size_t i = 0; i < N; i++) {
            uint8_t *p = a + i * rs;
            uint32_t site = (uint32_t)(-0x100000 + 7 * (int)i), repl = (uint32_t)(0x2000 + 5 * i);
            memcpy(p, &site, 4);
            memcpy(p + 4, &repl, 4);
            p[8] = (uint8_t)(i % 200);
            p[rs - 2] = p[rs - 1] = 5;
        }
        memcpy(b, a, (size_t)N * rs);
        memcpy(c, a, (size_t)N * rs);
        for (size_t i = 0; i < N; i++) {
            uint32_t v;
            memcpy(&v, b + i * rs + 4, 4);
            v += 0x100000u;
            memcpy(b + i * rs + 4, &v, 4);
            memcpy(&v, c + i * rs, 4);
            v += 0x100000u;
            memcpy(c + i * rs, &v, 4);
        }
        uint64_t ha = ap_table_hash(a, (size_t)N * rs, rs);
        cr_assert_neq(ap_table_hash(b, (size_t)N * rs, rs), ha, "format %u: replacements moved", rs);
        cr_assert_neq(ap_table_hash(c, (size_t)N * rs, rs), ha, "format %u: sites moved", rs);
        struct ap_table_scan sa, sb;
        cr_assert_eq(ap_table_scan(a, (size_t)N * rs, 0x400000, rs, AP_SCAN_HASH, &sa), 0);
        cr_assert_eq(ap_table_scan(b, (size_t)N * rs, 0x400000, rs, AP_SCAN_HASH, &sb), 0);
        cr_assert_eq(sa.hash, ha);
        cr_assert_neq(sb.hash, sa.hash);
        ap_mem_free(sa.sites);
        ap_mem_free(sa.at);
        ap_mem_free(sb.sites);
        ap_mem_free(sb.at);
        free(a);
        free(b);
        free(c);
    }
    uint64_t x[2 * N], y[2 * N];
    for (size_t i = 0; i < 2 * N; i++) {
        x[i] = 0x1000 * i + 17;
        y[i] = x[i] + (1ull << 20);
    }
    cr_assert_neq(ap_bytes_hash((const uint8_t *)x, sizeof(x)),
                  ap_bytes_hash((const uint8_t *)y, sizeof(y)));
}

/*
 * The facts for a caller's per-site checks: true on a clean table, and each
 * false when exactly one record breaks it (the others unchanged).
 */
Test(scan, facts_fail_for_one_record)
{
    enum { N = 40 };
    static struct rec r[N];
    /* low addresses: a replacement offset from the table can reach past 2^64 */
    const uint64_t table = 0x100000, text = 0x10000, repl = 0x200000;
    for (size_t f = 0; f < 2; f++) {
        unsigned rs = formats[f];
        for (int bad = 0; bad < 9; bad++) {
            for (size_t i = 0; i < N; i++) /* sites 8 apart, 2 records per site at 10 and 11 */
                r[i] = (struct rec){text + 8 * i - 8 * (i == 11), repl + 6 * i,
                                    (uint16_t)(i % 300), (uint16_t)(i % 2), 5, 3};
            struct ap_table_scan a;
            bool want_flags = true, want_span = true;
            switch (bad) {
            case 1: /* flags beyond ALT_FLAG_NOT (format 1 alone can say so) */
                if (rs == ALTPATCH_RECORD_SIZE_KERNEL) {
                    r[20].flags = 2;
                    want_flags = false;
                }
                break;
            case 2: /* a replacement longer than its site: a per-site check, no fact */
                r[20].repllen = 6;
                break;
            case 3: /* the highest end moves with a longer replacement */
                r[39].repllen = 9;
                break;
            case 4: /* a replacement whose end would pass 2^64: below 0 as signed */
                r[20].repl = UINT64_MAX - 1;
                break;
            case 5: /* an empty site */
                r[20].instrlen = 0;
                r[20].repllen = 0;
                want_span = false;
                break;
            case 6: /* a site out of address order */
                r[20].site = text - 8;
                want_span = false;
                break;
            case 8: /* two sites overlap */
                r[20].instrlen = 9;
                want_span = false;
                break;
            case 7: /* the lowest replacement start and the highest end move */
                r[5].repl = repl - 100;
                r[30].repl = repl + 0x10000;
                break;
            }
            check(r, N, table, rs, &a);
            cr_assert_eq(a.flags_known, want_flags, "format %u, case %d", rs, bad);
            cr_assert_eq(a.text_span, want_span, "format %u, case %d", rs, bad);
            cr_assert_eq(a.repl_lo, bad == 7 ? (int64_t)repl - 100 : bad == 4 ? -2 : (int64_t)repl,
                         "case %d", bad);
            /* (case 4's end wraps to 1: not the highest) */
            cr_assert_eq(a.repl_hi,
                         bad == 7   ? repl + 0x10000 + 3
                         : bad == 3 ? repl + 6 * (N - 1) + 9
                                    : repl + 6 * (N - 1) + 3,
                         "case %d", bad);
            if (want_span) {
                cr_assert_eq(a.text_lo, text);
                cr_assert_eq(a.text_hi, text + 8 * (N - 1) + 5);
            }
            scan_free(&a);
        }
    }
}

/*
 * Random tables: runs of nested records, empty entries, steps forward and
 * sometimes back, lengths that overlap the next site, features anywhere in
 * the format's range (format 1: past the bitmap too).
 */
Test(scan, random_tables_match_the_two_step_path)
{
    rnd_state = 0x9e3779b97f4a7c15ull;
    struct rec *r = malloc(600 * sizeof(*r));
    cr_assert_not_null(r);
    for (int round = 0; round < 400; round++) {
        unsigned rs = formats[round % 2];
        size_t n = 1 + rnd() % 600;
        uint64_t table_addr = 0x7f0000000000ull + (rnd() % 4096) * 2;
        uint64_t addr = table_addr - 0x100000 + rnd() % 4096;
        unsigned back = (unsigned)(rnd() % 4); /* 0: never back; else 1 in 2^(back+3) */
        for (size_t i = 0; i < n; i++) {
            uint64_t x = rnd();
            if (i == 0 || x % 4 != 0) { /* a new site (else another record of the last) */
                uint64_t step = 1 + (x >> 8) % 24;
                if (back && (x >> 16) % (1u << (back + 3)) == 0)
                    addr -= step * 4;
                else
                    addr += step;
            }
            uint8_t len = (x >> 24) % 9 == 0 ? 0 : (uint8_t)((x >> 32) % 20);
            uint16_t feat = rs == ALTPATCH_RECORD_SIZE_KERNEL && (x >> 40) % 16 == 0
                                ? (uint16_t)(x >> 48)
                                : (uint16_t)((x >> 40) % 700);
            r[i] = (struct rec){addr, table_addr + 0x10000 + (x >> 20) % 4096,
                                (uint16_t)(rs == ALTPATCH_RECORD_SIZE_COMPACT ? feat & 0x7fff : feat),
                                (uint16_t)((x >> 60) & 1), len, (uint8_t)((x >> 52) % 16)};
        }
        struct ap_table_scan a;
        check(r, n, table_addr, rs, &a);
        scan_free(&a);
    }
    free(r);
}
