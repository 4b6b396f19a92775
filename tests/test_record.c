/* SPDX-License-Identifier: MIT */
/*
 * Record format (record.c): the note descriptor, the 14-byte (format 1) and
 * 12-byte (format 3) records with self-relative offsets, and grouping of
 * entries into sites. The byte images are built by hand, as the assembler would lay them out.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pure.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A note descriptor at @at pointing at the four given addresses. */
static void make_note(uint8_t *d, uint64_t at, uint32_t version, uint32_t recsize,
                      uint64_t ts, uint64_t te, uint64_t rs, uint64_t re)
{
    put32(d + 0, version);
    put32(d + 4, recsize);
    put32(d + 8, (uint32_t)(ts - (at + 8)));
    put32(d + 12, (uint32_t)(te - (at + 12)));
    put32(d + 16, (uint32_t)(rs - (at + 16)));
    put32(d + 20, (uint32_t)(re - (at + 20)));
}

/* Record @i of a table at @table_addr, as `.long 771b - .` etc. would emit it. */
static void make_record(uint8_t *t, uint64_t table_addr, size_t i, uint64_t site, uint64_t repl,
                        uint32_t ft_flags, uint8_t instrlen, uint8_t repllen)
{
    uint8_t *p = t + i * ALTPATCH_RECORD_SIZE_KERNEL;
    uint64_t at = table_addr + i * ALTPATCH_RECORD_SIZE_KERNEL;

    put32(p + 0, (uint32_t)(site - at));
    put32(p + 4, (uint32_t)(repl - (at + 4)));
    put32(p + 8, ft_flags);
    p[12] = instrlen;
    p[13] = repllen;
}

Test(note, parses_self_relative_offsets)
{
    uint8_t d[AP_NOTE_DESCSZ];
    struct ap_note n;
    const uint64_t at = 0x400300;

    /* tables both after and before the note */
    make_note(d, at, 1, 14, 0x404000, 0x40401c, 0x400100, 0x400120);
    cr_assert_eq(ap_note_parse(d, sizeof(d), at, &n), ALTPATCH_REASON_NONE);
    cr_assert_eq(n.version, 1);
    cr_assert_eq(n.record_size, 14);
    cr_assert_eq(n.table_start, 0x404000);
    cr_assert_eq(n.table_end, 0x40401c);
    cr_assert_eq(n.repl_start, 0x400100);
    cr_assert_eq(n.repl_end, 0x400120);
}

Test(note, unaligned_descriptor)
{
    uint8_t raw[AP_NOTE_DESCSZ + 1];
    struct ap_note n;

    make_note(raw + 1, 0x1001, 1, 14, 0x2000, 0x200e, 0x3000, 0x3004);
    cr_assert_eq(ap_note_parse(raw + 1, AP_NOTE_DESCSZ, 0x1001, &n), ALTPATCH_REASON_NONE);
    cr_assert_eq(n.table_end, 0x200e);
    cr_assert_eq(n.repl_end, 0x3004);
}

Test(note, bad_version_and_sizes)
{
    uint8_t d[AP_NOTE_DESCSZ + 4] = {0};
    struct ap_note n;

    make_note(d, 0x1000, 5, 14, 0x2000, 0x2000, 0x3000, 0x3000);
    cr_assert_eq(ap_note_parse(d, AP_NOTE_DESCSZ, 0x1000, &n), ALTPATCH_REASON_BAD_VERSION);
    cr_assert_eq(n.version, 5, "filled as far as read");
    /* each version with its own record size only */
    static const uint32_t vs[][2] = {{1, 12}, {2, 12}, {3, 14}, {4, 14}, {0, 14}, {0, 12}};
    for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++) {
        make_note(d, 0x1000, vs[i][0], vs[i][1], 0x2000, 0x2000, 0x3000, 0x3000);
        cr_assert_eq(ap_note_parse(d, AP_NOTE_DESCSZ, 0x1000, &n), ALTPATCH_REASON_BAD_VERSION,
                     "version %u, record size %u", vs[i][0], vs[i][1]);
    }
    static const uint32_t ok[][2] = {{1, 14}, {2, 14}, {3, 12}, {4, 12}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        make_note(d, 0x1000, ok[i][0], ok[i][1], 0x2000, 0x2000, 0x3000, 0x3000);
        cr_assert_eq(ap_note_parse(d, AP_NOTE_DESCSZ, 0x1000, &n), ALTPATCH_REASON_NONE,
                     "version %u, record size %u", ok[i][0], ok[i][1]);
        cr_assert_eq(ap_note_prepatched(&n), ok[i][0] == 2 || ok[i][0] == 4);
    }
    make_note(d, 0x1000, 1, 16, 0x2000, 0x2000, 0x3000, 0x3000);
    cr_assert_eq(ap_note_parse(d, AP_NOTE_DESCSZ, 0x1000, &n), ALTPATCH_REASON_BAD_VERSION);
    cr_assert_eq(n.record_size, 16);
    make_note(d, 0x1000, 1, 14, 0x2000, 0x2000, 0x3000, 0x3000);
    cr_assert_eq(ap_note_parse(d, AP_NOTE_DESCSZ - 4, 0x1000, &n), ALTPATCH_REASON_BAD_VERSION);
    cr_assert_eq(ap_note_parse(d, AP_NOTE_DESCSZ + 4, 0x1000, &n), ALTPATCH_REASON_BAD_VERSION);
    cr_assert_eq(ap_note_parse(d, 3, 0x1000, &n), ALTPATCH_REASON_BAD_VERSION);
    cr_assert_eq(ap_note_parse(NULL, AP_NOTE_DESCSZ, 0x1000, &n), ALTPATCH_REASON_BAD_VERSION);
    cr_assert_eq(ap_note_parse(d, AP_NOTE_DESCSZ, 0x1000, &n), ALTPATCH_REASON_NONE);
}

Test(note, inverted_ranges)
{
    uint8_t d[AP_NOTE_DESCSZ];
    struct ap_note n;

    make_note(d, 0x1000, 1, 14, 0x2010, 0x2000, 0x3000, 0x3000);
    cr_assert_eq(ap_note_parse(d, sizeof(d), 0x1000, &n), ALTPATCH_REASON_BAD_TABLE);
    make_note(d, 0x1000, 1, 14, 0x2000, 0x2000, 0x3001, 0x3000);
    cr_assert_eq(ap_note_parse(d, sizeof(d), 0x1000, &n), ALTPATCH_REASON_BAD_TABLE);
}

/* A note segment of @p size bytes that ends where an unreadable page begins:
 * a read past it faults. */
static uint8_t *seg_before_guard(size_t size)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED);
    cr_assert_eq(mprotect(m + pg, pg, PROT_NONE), 0);
    cr_assert_leq(size, pg);
    return m + pg - size;
}

/* One note at @p p: header, owner name (@p namesz bytes of @p name), padded
 * to 4, descriptor of @p descsz bytes (filled with @p fill). Returns the
 * bytes it takes, padding included. */
static size_t put_note(uint8_t *p, const char *name, uint32_t namesz, uint32_t type,
                       uint32_t descsz, uint8_t fill)
{
    put32(p, namesz);
    put32(p + 4, descsz);
    put32(p + 8, type);
    memcpy(p + 12, name, namesz);
    size_t d = 12 + ((namesz + 3u) & ~3u);
    memset(p + d, fill, descsz);
    return d + ((descsz + 3u) & ~3u);
}

Test(note, segment_walk_finds_both_notes_and_stays_inside)
{
    /* a foreign note, the table note, the plan note, the segment ending
     * exactly at the last one's end */
    uint8_t tmp[128];
    size_t n = put_note(tmp, "GNU", 4, 3, 16, 0x11);
    size_t at_table = n + 12 + 12;
    n += put_note(tmp + n, ALTPATCH_NOTE_NAME, sizeof(ALTPATCH_NOTE_NAME), ALTPATCH_NOTE_TYPE, 8, 0x22);
    size_t at_plan = n + 12 + 12;
    n += put_note(tmp + n, ALTPATCH_NOTE_NAME, sizeof(ALTPATCH_NOTE_NAME), ALTPATCH_PLAN_NOTE_TYPE, 12,
                  0x33);
    uint8_t *seg = seg_before_guard(n);
    memcpy(seg, tmp, n);
    uint32_t dsz = 0, psz = 0;
    const uint8_t *plan = NULL;
    cr_assert_eq(ap_note_find(seg, n, 4, &dsz), seg + at_table);
    cr_assert_eq(dsz, 8u);
    cr_assert_eq(ap_note_find_plan(seg, n, 4, &dsz, &plan, &psz), seg + at_table);
    cr_assert_eq(plan, seg + at_plan);
    cr_assert_eq(psz, 12u);
    cr_assert_eq(seg[at_plan], 0x33);
}

Test(note, segment_walk_stops_at_a_last_note_padding)
{
    /* The segment ends inside a note's padding: 30 bytes, a foreign note
     * of an 8-byte name and a 10-byte descriptor (32 with its padding).
     * Nothing is found and nothing past the 30 bytes is read. */
    uint8_t *seg = seg_before_guard(30);
    memset(seg, 0, 30);
    put32(seg, 8);
    put32(seg + 4, 10);
    put32(seg + 8, 999);
    memcpy(seg + 12, "ABCDEFG", 8);
    uint32_t dsz = 7, psz = 7;
    const uint8_t *plan = seg;
    cr_assert_null(ap_note_find(seg, 30, 4, &dsz));
    cr_assert_null(ap_note_find_plan(seg, 30, 4, &dsz, &plan, &psz));
    cr_assert_null(plan);
    cr_assert_eq(psz, 0u);

    /* the table note last, its 6-byte descriptor ending the segment (its
     * padding outside): found; the walk for a plan note ends there */
    uint8_t tmp[64];
    size_t n = put_note(tmp, ALTPATCH_NOTE_NAME, sizeof(ALTPATCH_NOTE_NAME), ALTPATCH_NOTE_TYPE, 6,
                        0x44) - 2;
    seg = seg_before_guard(n);
    memcpy(seg, tmp, n);
    cr_assert_eq(ap_note_find_plan(seg, n, 4, &dsz, &plan, &psz), seg + n - 6);
    cr_assert_eq(dsz, 6u);
    cr_assert_null(plan);
    cr_assert_eq(ap_note_find(seg, n, 4, &dsz), seg + n - 6);
}

Test(records, self_relative_math)
{
    const uint64_t ta = 0x7f0000001000;
    uint8_t raw[3 * ALTPATCH_RECORD_SIZE_KERNEL + 1];
    uint8_t *t = raw + 1; /* deliberately misaligned */
    struct ap_entry *e;
    size_t n;

    make_record(t, ta, 0, 0x7f0000000100, 0x7f0000002000, X86_FEATURE_FSGSBASE, 9, 5);
    make_record(t, ta, 1, 0x7f0000000100, 0x7f0000002005, ALT_NOT(X86_FEATURE_RDPID), 9, 4);
    make_record(t, ta, 2, 0x7f0000003000, 0x7f0000000f00, X86_FEATURE_ALWAYS, 255, 0);
    cr_assert_eq(ap_records_parse(t, 3 * ALTPATCH_RECORD_SIZE_KERNEL, ta,
                                  ALTPATCH_RECORD_SIZE_KERNEL, &e, &n), ALTPATCH_REASON_NONE);
    cr_assert_eq(n, 3);
    cr_assert_eq(e[0].site, 0x7f0000000100);
    cr_assert_eq(e[0].repl, 0x7f0000002000);
    cr_assert_eq(e[0].feature, X86_FEATURE_FSGSBASE);
    cr_assert_eq(e[0].flags, 0);
    cr_assert_eq(e[0].instrlen, 9);
    cr_assert_eq(e[0].repllen, 5);
    cr_assert_eq(e[0].index, 0);
    cr_assert_eq(e[1].site, 0x7f0000000100, "second record: offsets relative to 0x...100e");
    cr_assert_eq(e[1].repl, 0x7f0000002005);
    cr_assert_eq(e[1].feature, X86_FEATURE_RDPID);
    cr_assert_eq(e[1].flags, ALT_FLAG_NOT);
    cr_assert_eq(e[1].index, 1);
    cr_assert_eq(e[2].site, 0x7f0000003000);
    cr_assert_eq(e[2].repl, 0x7f0000000f00, "negative repl_offset");
    cr_assert_eq(e[2].instrlen, 255);
    cr_assert_eq(e[2].repllen, 0);
    free(e);
}

Test(records, raw_field_values)
{
    /* The first record's instr_offset is relative to the table start, its
     * repl_offset to table start + 4: check the raw encoding as well. */
    uint8_t t[ALTPATCH_RECORD_SIZE_KERNEL] = {
        0x00, 0xf0, 0xff, 0xff,             /* -0x1000 */
        0x00, 0x10, 0x00, 0x00,             /* +0x1000 */
        0x00, 0x01, 0x01, 0x00,             /* feature 0x100 | flags 1 */
        0x07, 0x03,
    };
    struct ap_entry *e;
    size_t n;

    cr_assert_eq(ap_records_parse(t, sizeof(t), 0x10000,
                                  ALTPATCH_RECORD_SIZE_KERNEL, &e, &n), ALTPATCH_REASON_NONE);
    cr_assert_eq(n, 1);
    cr_assert_eq(e[0].site, 0xf000);
    cr_assert_eq(e[0].repl, 0x11004);
    cr_assert_eq(e[0].feature, 0x100);
    cr_assert_eq(e[0].flags, 1);
    cr_assert_eq(e[0].instrlen, 7);
    cr_assert_eq(e[0].repllen, 3);
    free(e);
}

Test(records, truncated_table_is_bad)
{
    uint8_t t[2 * ALTPATCH_RECORD_SIZE_KERNEL] = {0};
    struct ap_entry *e = (struct ap_entry *)1;
    size_t n = 99;

    cr_assert_eq(ap_records_parse(t, sizeof(t) - 1, 0x1000,
                                  ALTPATCH_RECORD_SIZE_KERNEL, &e, &n), ALTPATCH_REASON_BAD_TABLE);
    cr_assert_null(e);
    cr_assert_eq(n, 0);
    cr_assert_eq(ap_records_parse(t, 1, 0x1000,
                                  ALTPATCH_RECORD_SIZE_KERNEL, &e, &n), ALTPATCH_REASON_BAD_TABLE);
    cr_assert_eq(ap_records_parse(NULL, ALTPATCH_RECORD_SIZE_KERNEL, 0x1000,
                                  ALTPATCH_RECORD_SIZE_KERNEL, &e, &n),
                 ALTPATCH_REASON_BAD_TABLE);
}

/* Format 3: record @i of a 12-byte table, as the macros emit it. */
static void make_compact(uint8_t *t, uint64_t table_addr, size_t i, uint64_t site, uint64_t repl,
                         uint16_t ft, uint8_t instrlen, uint8_t repllen)
{
    uint8_t *p = t + i * ALTPATCH_RECORD_SIZE_COMPACT;
    uint64_t at = table_addr + i * ALTPATCH_RECORD_SIZE_COMPACT;

    put32(p + 0, (uint32_t)(site - at));
    put32(p + 4, (uint32_t)(repl - (at + 4)));
    p[8] = (uint8_t)ft;
    p[9] = (uint8_t)(ft >> 8);
    p[10] = instrlen;
    p[11] = repllen;
}

Test(records, compact_self_relative_math)
{
    const uint64_t ta = 0x7f0000001000;
    uint8_t raw[3 * ALTPATCH_RECORD_SIZE_COMPACT + 1];
    uint8_t *t = raw + 1; /* deliberately misaligned */
    struct ap_entry *e;
    size_t n;

    make_compact(t, ta, 0, 0x7f0000000100, 0x7f0000002000, X86_FEATURE_FSGSBASE, 9, 5);
    make_compact(t, ta, 1, 0x7f0000000100, 0x7f0000002005, 0x8000 | X86_FEATURE_RDPID, 9, 4);
    make_compact(t, ta, 2, 0x7f0000003000, 0x7f0000000f00, 0x7fff, 255, 0);
    cr_assert_eq(ap_records_parse(t, 3 * ALTPATCH_RECORD_SIZE_COMPACT, ta,
                                  ALTPATCH_RECORD_SIZE_COMPACT, &e, &n),
                 ALTPATCH_REASON_NONE);
    cr_assert_eq(n, 3);
    cr_assert_eq(e[0].site, 0x7f0000000100);
    cr_assert_eq(e[0].repl, 0x7f0000002000);
    cr_assert_eq(e[0].feature, X86_FEATURE_FSGSBASE);
    cr_assert_eq(e[0].flags, 0);
    cr_assert_eq(e[0].instrlen, 9);
    cr_assert_eq(e[0].repllen, 5);
    cr_assert_eq(e[1].site, 0x7f0000000100, "second record: offsets relative to 0x...100c");
    cr_assert_eq(e[1].repl, 0x7f0000002005);
    cr_assert_eq(e[1].feature, X86_FEATURE_RDPID);
    cr_assert_eq(e[1].flags, ALT_FLAG_NOT);
    cr_assert_eq(e[1].index, 1);
    cr_assert_eq(e[2].site, 0x7f0000003000);
    cr_assert_eq(e[2].repl, 0x7f0000000f00, "negative repl_offset");
    cr_assert_eq(e[2].feature, 0x7fff, "bit 15 only is the flag");
    cr_assert_eq(e[2].flags, 0);
    cr_assert_eq(e[2].instrlen, 255);
    cr_assert_eq(e[2].repllen, 0);
    free(e);
}

Test(records, sizes_per_format)
{
    uint8_t t[12 * 14] = {0};
    struct ap_entry *e = (struct ap_entry *)1;
    size_t n = 99;

    /* 84 bytes: 6 records of 14 or 7 of 12; 70 bytes: 5 of 14, not whole records of 12 */
    cr_assert_eq(ap_records_parse(t, 84, 0x1000, ALTPATCH_RECORD_SIZE_KERNEL, &e, &n), 0);
    cr_assert_eq(n, 6);
    free(e);
    cr_assert_eq(ap_records_parse(t, 84, 0x1000, ALTPATCH_RECORD_SIZE_COMPACT, &e, &n), 0);
    cr_assert_eq(n, 7);
    free(e);
    cr_assert_eq(ap_records_parse(t, 70, 0x1000, ALTPATCH_RECORD_SIZE_COMPACT, &e, &n),
                 ALTPATCH_REASON_BAD_TABLE);
    cr_assert_null(e);
    cr_assert_eq(n, 0);
    for (uint32_t rs = 0; rs < 20; rs++) {
        if (rs == ALTPATCH_RECORD_SIZE_KERNEL || rs == ALTPATCH_RECORD_SIZE_COMPACT)
            continue;
        cr_assert_eq(ap_records_parse(t, 84, 0x1000, rs, &e, &n), ALTPATCH_REASON_BAD_VERSION,
                     "record size %u", rs);
        cr_assert_null(e);
    }
}

Test(records, empty_table)
{
    struct ap_entry *e = (struct ap_entry *)1;
    size_t n = 99;

    cr_assert_eq(ap_records_parse(NULL, 0, 0x1000,
                                  ALTPATCH_RECORD_SIZE_KERNEL, &e, &n), ALTPATCH_REASON_NONE);
    cr_assert_null(e);
    cr_assert_eq(n, 0);
}

/* Entries for grouping tests: only site and instrlen matter. */
static struct ap_entry ent(uint64_t site, uint8_t instrlen)
{
    return (struct ap_entry){.site = site, .instrlen = instrlen};
}

Test(sites, consecutive_entries_form_one_site)
{
    struct ap_entry e[] = {ent(0x100, 5), ent(0x100, 8), ent(0x100, 6), ent(0x200, 3),
                           ent(0x300, 0)};
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(e, 5, &s, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(s[0].addr, 0x100);
    cr_assert_eq(s[0].first, 0);
    cr_assert_eq(s[0].count, 3);
    cr_assert_eq(s[0].len, 8, "longest instrlen is the site");
    cr_assert_eq(s[0].reason, 0);
    cr_assert_eq(s[1].addr, 0x200);
    cr_assert_eq(s[1].first, 3);
    cr_assert_eq(s[1].count, 1);
    cr_assert_eq(s[1].len, 3);
    cr_assert_eq(s[1].reason, 0);
    cr_assert_eq(s[2].first, 4);
    cr_assert_eq(s[2].len, 0);
    cr_assert_eq(s[2].reason, ALTPATCH_REASON_EMPTY_SITE);
    free(s);
}

Test(sites, overlap_marks_both)
{
    /* [0x100,0x105) and [0x103,0x105) overlap; [0x105,0x108) only touches */
    struct ap_entry e[] = {ent(0x103, 2), ent(0x105, 3), ent(0x100, 5), ent(0x400, 1)};
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(e, 4, &s, &n), 0);
    cr_assert_eq(n, 4);
    cr_assert_eq(s[0].reason, ALTPATCH_REASON_SITE_OVERLAP);
    cr_assert_eq(s[1].reason, 0, "adjacent is not overlapping");
    cr_assert_eq(s[2].reason, ALTPATCH_REASON_SITE_OVERLAP);
    cr_assert_eq(s[3].reason, 0);
    free(s);
}

Test(sites, non_consecutive_same_address_overlap)
{
    struct ap_entry e[] = {ent(0x100, 4), ent(0x200, 4), ent(0x100, 4)};
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(e, 3, &s, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(s[0].reason, ALTPATCH_REASON_SITE_OVERLAP);
    cr_assert_eq(s[1].reason, 0);
    cr_assert_eq(s[2].reason, ALTPATCH_REASON_SITE_OVERLAP);
    free(s);
}

Test(sites, containment_marks_all)
{
    /* one big site holding two small ones that do not touch each other */
    struct ap_entry e[] = {ent(0x102, 1), ent(0x100, 20), ent(0x110, 2), ent(0x200, 2)};
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(e, 4, &s, &n), 0);
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(s[i].reason, ALTPATCH_REASON_SITE_OVERLAP, "site %zu", i);
    cr_assert_eq(s[3].reason, 0);
    free(s);
}

Test(sites, empty_site_inside_another_is_only_empty)
{
    struct ap_entry e[] = {ent(0x100, 8), ent(0x104, 0)};
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(e, 2, &s, &n), 0);
    cr_assert_eq(s[0].reason, 0);
    cr_assert_eq(s[1].reason, ALTPATCH_REASON_EMPTY_SITE);
    free(s);
}

Test(sites, empty_entry_does_not_swallow_the_next_site)
{
    /* ALTERNATIVE("", "", f) right before another site shares its address:
     * it must stay a separate, empty site, and so must a 0-length entry
     * right after a site at the same address. */
    struct ap_entry e[] = {ent(0x100, 0), ent(0x100, 5), ent(0x100, 0)};
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(e, 3, &s, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(s[0].count, 1);
    cr_assert_eq(s[0].reason, ALTPATCH_REASON_EMPTY_SITE);
    cr_assert_eq(s[1].first, 1);
    cr_assert_eq(s[1].count, 1);
    cr_assert_eq(s[1].len, 5);
    cr_assert_eq(s[1].reason, 0);
    cr_assert_eq(s[2].reason, ALTPATCH_REASON_EMPTY_SITE);
    free(s);
}

Test(sites, end_of_address_space)
{
    struct ap_entry e[] = {ent(UINT64_MAX - 2, 8), ent(0x100, 4)};
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(e, 2, &s, &n), 0);
    cr_assert_eq(s[0].reason, 0, "wrapping end saturates, overlaps nothing here");
    cr_assert_eq(s[1].reason, 0);
    free(s);
}

Test(sites, none)
{
    struct ap_site *s = (struct ap_site *)1;
    size_t n = 5;

    cr_assert_eq(ap_sites_group(NULL, 0, &s, &n), 0);
    cr_assert_null(s);
    cr_assert_eq(n, 0);
}

Test(sites, from_parsed_nested_records)
{
    /* ALTERNATIVE_2 layout: inner entry (instrlen 2), outer entry (instrlen 6) */
    const uint64_t ta = 0x5000;
    uint8_t t[2 * ALTPATCH_RECORD_SIZE_KERNEL];
    struct ap_entry *e;
    struct ap_site *s;
    size_t n, ns;

    make_record(t, ta, 0, 0x1000, 0x6000, X86_FEATURE_RDTSCP, 2, 2);
    make_record(t, ta, 1, 0x1000, 0x6002, X86_FEATURE_RDPID, 6, 6);
    cr_assert_eq(ap_records_parse(t, sizeof(t), ta, ALTPATCH_RECORD_SIZE_KERNEL, &e, &n), 0);
    cr_assert_eq(ap_sites_group(e, n, &s, &ns), 0);
    cr_assert_eq(ns, 1);
    cr_assert_eq(s[0].count, 2);
    cr_assert_eq(s[0].len, 6);
    cr_assert_eq(s[0].reason, 0);
    free(s);
    free(e);
}
