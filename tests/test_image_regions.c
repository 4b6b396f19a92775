/* SPDX-License-Identifier: MIT */
/*
 * altpatch_image_open_regions(): an image described by the caller's memory.
 * Public API only. Oracles: the bytes the test wrote into its own table,
 * replacement and text (a planned site ends with the replacement's bytes or
 * its own), and the feature set each test builds.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>
#include <altpatch/cpufeatures.h>
#include <altpatch/image.h>

#define TEXT_ADDR 0x401000ull
#define REPL_ADDR 0x402000ull
#define TABLE_ADDR 0x403000ull
#define FEAT X86_FEATURE_POPCNT

/* 5-byte NOP at TEXT_ADDR + 16, surrounded by int3. */
static uint8_t text[64];
static const uint8_t nop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
/* mov eax, 1 */
static const uint8_t repl[5] = {0xb8, 0x01, 0x00, 0x00, 0x00};

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

/* One 14-byte record: site at @p site, replacement at REPL_ADDR. */
static void rec14(uint8_t *r, uint64_t at, uint64_t site, unsigned feature, unsigned flags)
{
    put32(r, (uint32_t)(site - at));
    put32(r + 4, (uint32_t)(REPL_ADDR - (at + 4)));
    put32(r + 8, feature | flags << ALT_FLAGS_SHIFT);
    r[12] = 5;
    r[13] = 5;
}

/* One 12-byte record of the older kernel layout. */
static void rec12(uint8_t *r, uint64_t at, uint64_t site, unsigned cpuid)
{
    put32(r, (uint32_t)(site - at));
    put32(r + 4, (uint32_t)(REPL_ADDR - (at + 4)));
    r[8] = (uint8_t)cpuid;
    r[9] = (uint8_t)(cpuid >> 8);
    r[10] = 5;
    r[11] = 5;
}

static struct altpatch_image_region text_region;

static struct altpatch_image_regions desc(const uint8_t *table, size_t tsize)
{
    memset(text, 0xcc, sizeof(text));
    memcpy(text + 16, nop5, sizeof(nop5));
    text_region = (struct altpatch_image_region){TEXT_ADDR, sizeof(text), text};
    return (struct altpatch_image_regions){
        .sz = sizeof(struct altpatch_image_regions),
        .name = "regions-test",
        .layout = ALTPATCH_LAYOUT_ALTPATCH,
        .table = {TABLE_ADDR, tsize, table},
        .repl = {REPL_ADDR, sizeof(repl), repl},
        .text = &text_region,
        .ntext = 1,
    };
}

struct seen {
    unsigned n;
    struct altpatch_image_site s[4];
    uint8_t orig[4][8], fin[4][8];
    int has_orig[4], has_fin[4];
};

static int collect(const struct altpatch_image_site *s, void *ctx)
{
    struct seen *v = ctx;
    if (v->n < 4) {
        v->s[v->n] = *s;
        v->has_orig[v->n] = s->original != NULL;
        v->has_fin[v->n] = s->final != NULL;
        if (s->original)
            memcpy(v->orig[v->n], s->original, s->len < 8 ? s->len : 8);
        if (s->final)
            memcpy(v->fin[v->n], s->final, s->len < 8 ? s->len : 8);
    }
    v->n++;
    return 0;
}

/* Plan @p img for @p fs and walk it into @p v. */
static void plan_walk(struct altpatch_image *img, const struct altpatch_features *fs,
                      struct seen *v)
{
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    memset(v, 0, sizeof(*v));
    cr_assert_eq(altpatch_image_site_foreach(img, collect, v), 0);
}

static struct altpatch_features *set_with(int feature)
{
    struct altpatch_features *fs = altpatch_features_new();
    cr_assert_not_null(fs);
    if (feature >= 0)
        cr_assert_eq(altpatch_features_set(fs, (unsigned)feature), 0);
    return fs;
}

Test(image_regions, plans_a_site_from_described_memory)
{
    uint8_t table[14];
    rec14(table, TABLE_ADDR, TEXT_ADDR + 16, FEAT, 0);
    struct altpatch_image_regions d = desc(table, sizeof(table));
    struct altpatch_image *img = NULL;
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0);
    cr_assert_not_null(img);

    struct altpatch_image_info info = {.sz = sizeof(info)};
    cr_assert_eq(altpatch_image_get_info(img, &info), 0);
    cr_assert_eq(info.entries, 1);
    cr_assert_eq(info.sites, 1);
    cr_assert_eq(info.format_version, 1);
    cr_assert_eq(info.table_addr, TABLE_ADDR);
    cr_assert_eq(info.repl_addr, REPL_ADDR);
    cr_assert_eq(info.repl_size, sizeof(repl));
    cr_assert_str_eq(info.name, "regions-test");

    struct altpatch_features *with = set_with(FEAT), *without = set_with(-1);
    struct seen v;
    plan_walk(img, with, &v);
    cr_assert_eq(v.n, 1);
    cr_assert_eq(v.s[0].addr, TEXT_ADDR + 16);
    cr_assert_eq(v.s[0].len, 5);
    cr_assert_eq(v.s[0].reason, ALTPATCH_REASON_NONE);
    cr_assert_eq(v.s[0].chosen, 0);
    cr_assert(v.has_orig[0] && v.has_fin[0]);
    cr_assert_arr_eq(v.orig[0], nop5, 5);
    cr_assert_arr_eq(v.fin[0], repl, 5);

    plan_walk(img, without, &v);
    cr_assert_eq(v.s[0].reason, ALTPATCH_REASON_NONE);
    cr_assert_eq(v.s[0].chosen, -1);
    cr_assert_arr_eq(v.fin[0], nop5, 5);

    struct altpatch_image_entry e = {.sz = sizeof(e)};
    cr_assert_eq(altpatch_image_site_entry(img, 0, 0, &e), 0);
    cr_assert_eq(e.feature, FEAT);
    cr_assert_eq(e.repl_addr, REPL_ADDR);
    cr_assert_not_null(e.replacement);
    cr_assert_arr_eq(e.replacement, repl, 5);

    /* Bytes were copied: changing the caller's text changes nothing. */
    memset(text, 0, sizeof(text));
    plan_walk(img, with, &v);
    cr_assert_arr_eq(v.orig[0], nop5, 5);

    /* No file behind it: no pre-patched copy. */
    void *buf = NULL;
    size_t len = 0;
    cr_assert_eq(altpatch_image_write_mem(img, NULL, &buf, &len), -ENOTSUP);
    cr_assert_null(buf);
    altpatch_features_free(with);
    altpatch_features_free(without);
    altpatch_image_close(img);
}

Test(image_regions, old_kernel_layout_and_inverted_condition)
{
    uint8_t table[24];
    rec12(table, TABLE_ADDR, TEXT_ADDR + 16, FEAT);
    rec12(table + 12, TABLE_ADDR + 12, TEXT_ADDR + 32, FEAT | 0x8000u);
    struct altpatch_image_regions d = desc(table, sizeof(table));
    memcpy(text + 32, nop5, sizeof(nop5));
    d.layout = ALTPATCH_LAYOUT_LINUX_12;
    struct altpatch_image *img = NULL;
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0);
    struct altpatch_image_entry e = {.sz = sizeof(e)};
    cr_assert_eq(altpatch_image_site_entry(img, 1, 0, &e), 0);
    cr_assert_eq(e.feature, FEAT);
    cr_assert_eq(e.flags, ALT_FLAG_NOT);
    cr_assert_eq(e.instrlen, 5);

    struct altpatch_features *with = set_with(FEAT);
    struct seen v;
    plan_walk(img, with, &v);
    cr_assert_eq(v.n, 2);
    cr_assert_arr_eq(v.fin[0], repl, 5);
    cr_assert_arr_eq(v.fin[1], nop5, 5); /* inverted: kept when the feature is present */
    altpatch_features_free(with);
    altpatch_image_close(img);
}

Test(image_regions, caller_rules_for_features_and_flags)
{
    uint8_t table[28];
    rec14(table, TABLE_ADDR, TEXT_ADDR + 16, FEAT, 0);
    rec14(table + 14, TABLE_ADDR + 14, TEXT_ADDR + 32, FEAT, 1u << 2);
    struct altpatch_image_regions d = desc(table, sizeof(table));
    memcpy(text + 32, nop5, sizeof(nop5));
    struct altpatch_features *with = set_with(FEAT);
    struct altpatch_image *img = NULL;
    struct seen v;

    /* Library rules: the unknown flag is refused. */
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0);
    plan_walk(img, with, &v);
    cr_assert_eq(v.s[0].reason, ALTPATCH_REASON_NONE);
    cr_assert_eq(v.s[1].reason, ALTPATCH_REASON_UNKNOWN_FLAGS);
    cr_assert_arr_eq(v.fin[1], nop5, 5);
    altpatch_image_close(img);

    /* The flag handled by the caller: planned. */
    d.flags = 1u << 2;
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0);
    plan_walk(img, with, &v);
    cr_assert_eq(v.s[1].reason, ALTPATCH_REASON_NONE);
    cr_assert_arr_eq(v.fin[1], repl, 5);
    altpatch_image_close(img);

    /* A numbering that does not know FEAT: both refused. */
    unsigned known[] = {X86_FEATURE_RDPID};
    d.known = known;
    d.nknown = 1;
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0);
    plan_walk(img, with, &v);
    cr_assert_eq(v.s[0].reason, ALTPATCH_REASON_UNKNOWN_FEATURE);
    cr_assert_eq(v.s[1].reason, ALTPATCH_REASON_UNKNOWN_FEATURE);
    cr_assert_arr_eq(v.fin[0], nop5, 5);
    altpatch_image_close(img);
    altpatch_features_free(with);
}

Test(image_regions, site_outside_the_text_is_refused)
{
    uint8_t table[14];
    rec14(table, TABLE_ADDR, TEXT_ADDR + 0x800, FEAT, 0);
    struct altpatch_image_regions d = desc(table, sizeof(table));
    struct altpatch_image *img = NULL;
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0);
    struct altpatch_features *with = set_with(FEAT);
    struct seen v;
    plan_walk(img, with, &v);
    cr_assert_eq(v.s[0].reason, ALTPATCH_REASON_SITE_BOUNDS);
    cr_assert(!v.has_orig[0] && !v.has_fin[0]);
    altpatch_features_free(with);
    altpatch_image_close(img);
}

/* @p d must be refused with @p err, leaving *out NULL. */
static void refused(const struct altpatch_image_regions *d, int err, const char *what)
{
    struct altpatch_image *img = (struct altpatch_image *)(uintptr_t)0x1;
    int r = altpatch_image_open_regions(d, &img);
    cr_assert_eq(r, err, "%s: got %d, expected %d", what, r, err);
    cr_assert_null(img, "%s: *out not reset", what);
}

Test(image_regions, bad_descriptions_are_refused)
{
    uint8_t table[14];
    rec14(table, TABLE_ADDR, TEXT_ADDR + 16, FEAT, 0);
    struct altpatch_image_regions good = desc(table, sizeof(table)), d;
    struct altpatch_image *img = NULL;

    cr_assert_eq(altpatch_image_open_regions(NULL, &img), -EINVAL);
    cr_assert_null(img);
    cr_assert_eq(altpatch_image_open_regions(&good, NULL), -EINVAL);

    d = good, d.sz = 8;
    refused(&d, -EINVAL, "short sz");
    struct {
        struct altpatch_image_regions d;
        uint64_t extra;
    } big = {good, 1};
    big.d.sz = sizeof(big);
    refused(&big.d, -EINVAL, "unknown non-zero field");
    big.extra = 0;
    cr_assert_eq(altpatch_image_open_regions(&big.d, &img), 0, "zero unknown field");
    altpatch_image_close(img);

    d = good, d.reserved = 1;
    refused(&d, -EINVAL, "reserved");
    d = good, d.layout = 7;
    refused(&d, -EINVAL, "layout");
    d = good, d.table.data = NULL;
    refused(&d, -EINVAL, "table without bytes");
    d = good, d.repl.addr = UINT64_MAX - 2;
    refused(&d, -EINVAL, "replacements wrapping around");
    d = good, d.table.size = 13;
    refused(&d, -EBADMSG, "partial record");
    d = good, d.layout = ALTPATCH_LAYOUT_LINUX_12;
    refused(&d, -EBADMSG, "14 bytes of 12-byte records");

    struct altpatch_image_region many[ALTPATCH_IMAGE_MAX_TEXT + 1];
    for (size_t i = 0; i < ALTPATCH_IMAGE_MAX_TEXT + 1; i++)
        many[i] = (struct altpatch_image_region){TEXT_ADDR + i * 0x100, 16, text};
    d = good, d.text = many, d.ntext = ALTPATCH_IMAGE_MAX_TEXT + 1;
    refused(&d, -EINVAL, "too many text regions");
    d.ntext = ALTPATCH_IMAGE_MAX_TEXT;
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0, "the most text regions");
    altpatch_image_close(img);
    d = good, d.text = NULL;
    refused(&d, -EINVAL, "text count without an array");
    struct altpatch_image_region overlap[2] = {{TEXT_ADDR, 64, text}, {TEXT_ADDR + 63, 1, text}};
    d = good, d.text = overlap, d.ntext = 2;
    refused(&d, -EINVAL, "overlapping text");
    struct altpatch_image_region nodata = {TEXT_ADDR, 64, NULL};
    d = good, d.text = &nodata;
    refused(&d, -EINVAL, "text without bytes");

    unsigned known[] = {FEAT, 1024};
    d = good, d.known = known, d.nknown = 2;
    refused(&d, -EINVAL, "known id out of range");
    d = good, d.nknown = 1;
    refused(&d, -EINVAL, "known count without an array");

    /* The description itself is never written to. */
    struct altpatch_image_regions copy = good;
    refused(&(struct altpatch_image_regions){.sz = 0}, -EINVAL, "zero sz");
    cr_assert_eq(memcmp(&copy, &good, sizeof(good)), 0);
}

Test(image_regions, another_numbering_through_raw_bits)
{
    /* Id 1000 is no feature of this library: a kernel-style numbering. */
    uint8_t table[14];
    rec14(table, TABLE_ADDR, TEXT_ADDR + 16, 1000, 0);
    struct altpatch_image_regions d = desc(table, sizeof(table));
    unsigned known[] = {1000};
    d.known = known;
    d.nknown = 1;
    struct altpatch_features *fs = altpatch_features_new();
    cr_assert_not_null(fs);
    cr_assert_eq(altpatch_features_set(fs, 1000), -EINVAL);
    cr_assert_eq(altpatch_features_set_bit(fs, 1000, true), 0);
    cr_assert(altpatch_features_test_bit(fs, 1000));
    cr_assert_not(altpatch_features_has(fs, 1000));
    cr_assert_eq(altpatch_features_set_bit(fs, ALTPATCH_FEATURE_BITS, true), -EINVAL);
    cr_assert_eq(altpatch_features_set_bit(NULL, 1, true), -EINVAL);
    cr_assert_not(altpatch_features_test_bit(fs, ALTPATCH_FEATURE_BITS));
    cr_assert_not(altpatch_features_test_bit(NULL, 1));

    struct altpatch_image *img = NULL;
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0);
    struct seen v;
    plan_walk(img, fs, &v);
    cr_assert_eq(v.s[0].reason, ALTPATCH_REASON_NONE);
    cr_assert_eq(v.s[0].bad_entry, -1);
    cr_assert_arr_eq(v.fin[0], repl, 5);
    cr_assert_eq(altpatch_features_set_bit(fs, 1000, false), 0);
    cr_assert_not(altpatch_features_test_bit(fs, 1000));
    plan_walk(img, fs, &v);
    cr_assert_arr_eq(v.fin[0], nop5, 5);
    altpatch_image_close(img);

    /* The library's own numbering refuses id 1000, naming the entry. */
    d.known = NULL;
    d.nknown = 0;
    cr_assert_eq(altpatch_image_open_regions(&d, &img), 0);
    plan_walk(img, fs, &v);
    cr_assert_eq(v.s[0].reason, ALTPATCH_REASON_UNKNOWN_FEATURE);
    cr_assert_eq(v.s[0].bad_entry, 0);
    altpatch_image_close(img);
    altpatch_features_free(fs);
}
