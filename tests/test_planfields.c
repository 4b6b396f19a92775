/* SPDX-License-Identifier: MIT */
/*
 * The relative fields a plan reports (ap_plan.fields) are exactly those that
 * decoding the original and every replacement again finds: same blocks,
 * offsets, lengths, field positions, sizes, kinds and values, in order. The
 * sites are generated from a pool of instructions with and without relative
 * fields (branches, RIP-relative operands, a RIP-relative NOP), some with
 * more fields than a plan holds.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "ap_hex.h"
#include "plan.h"

#define TEXT 0x401000ull
#define REPL 0x480000ull
#define NSITES 3000
#define SITE_STRIDE 64
#define TEXT_SIZE (NSITES * SITE_STRIDE)
#define REPL_SIZE (NSITES * 3 * 48)

static uint8_t text[TEXT_SIZE], repl[REPL_SIZE];
static struct ap_entry entries[NSITES * 3];

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

static const char *const pool[] = {
    "90",
    "0f ae e8",                   /* lfence */
    "0f 31",                      /* rdtsc */
    "64 48 8b 04 25 00 00 00 00", /* mov %fs:0, %rax */
    "f3 48 0f ae c0",             /* rdfsbase %rax */
    "0f 1f 44 00 00",
    "e8 10 00 00 00",             /* call rel32 */
    "e9 f0 ff ff ff",             /* jmp rel32 backwards */
    "eb 02",                      /* jmp rel8 */
    "75 fe",                      /* jne to itself */
    "48 8d 05 00 10 00 00",       /* lea 0x1000(%rip), %rax */
    "48 8b 0d f8 ff ff ff",       /* mov -8(%rip), %rcx */
    "ff 15 00 00 00 00",          /* call *0(%rip) */
    "0f 1f 05 44 33 22 11",       /* nopl 0x11223344(%rip) */
    "0f 84 00 00 00 00",          /* je rel32 */
};

/* Append 0..max pieces from the pool to @b (at most @room bytes). */
static size_t gen_block(uint8_t *b, size_t room, unsigned min, unsigned max)
{
    size_t n = 0;
    unsigned k = min + rnd() % (max - min + 1);

    for (unsigned i = 0; i < k; i++) {
        uint8_t tmp[16];
        size_t m = hex(pool[rnd() % (sizeof(pool) / sizeof(pool[0]))], tmp);

        if (n + m > room)
            break;
        memcpy(b + n, tmp, m);
        n += m;
    }
    return n;
}

/* The relative fields of block @b (@len bytes) of @entry, decoded now. */
static size_t decode_fields(const uint8_t *b, size_t len, int entry, struct ap_plan_field *f,
                            size_t nf)
{
    struct ap_insn in;

    for (size_t off = 0; off < len; off += in.len) {
        cr_assert_eq(ap_insn_decode(b + off, len - off, &in), 0, "accepted block decodes");
        if (!in.has_rel)
            continue;
        if (nf < 64)
            f[nf] = (struct ap_plan_field){.entry = (int16_t)entry, .off = (uint8_t)off,
                                           .len = in.len, .rel_off = in.rel_off,
                                           .rel_size = in.rel_size,
                                           .branch = in.rel_is_branch, .is_nop = in.is_nop,
                                           .value = (int32_t)in.rel_value};
        nf++;
    }
    return nf;
}

Test(plan_fields, same_as_decoding_again)
{
    struct ap_view v = {.ntext = 1};
    struct altpatch_features fs;
    size_t nrepl = 0, nent = 0, accepted = 0, compared = 0, over = 0, nops = 0, origs = 0;

    memset(text, 0xcc, sizeof(text));
    v.text[0] = (struct ap_region){TEXT, sizeof(text), text};
    v.repl = (struct ap_region){REPL, sizeof(repl), repl};
    for (size_t i = 0; i < NSITES; i++) {
        struct ap_site s = {.addr = TEXT + i * SITE_STRIDE, .first = (uint32_t)nent};
        size_t len = gen_block(text + i * SITE_STRIDE, 40, 1, 5);
        struct ap_plan_field want[64];
        struct ap_plan p;
        size_t nf;

        s.len = (uint8_t)len;
        s.count = 1 + rnd() % 3;
        for (uint32_t k = 0; k < s.count; k++) {
            size_t rl = gen_block(repl + nrepl, len, 0, i % 7 == 0 ? 12 : 3);

            entries[nent] = (struct ap_entry){.site = s.addr, .repl = REPL + nrepl,
                                              .feature = X86_FEATURE_ALWAYS,
                                              .instrlen = (uint8_t)len,
                                              .repllen = (uint8_t)rl,
                                              .index = (uint32_t)nent};
            nent++;
            nrepl += rl;
        }
        memset(&fs, 0, sizeof(fs));
        if (rnd() % 2)
            fs.word[X86_FEATURE_ALWAYS / 32] |= 1u << (X86_FEATURE_ALWAYS % 32);
        ap_plan_site(&v, &s, entries, NULL, &fs, &p);
        if (p.reason)
            continue;
        accepted++;
        nf = decode_fields(text + i * SITE_STRIDE, len, -1, want, 0);
        origs += nf;
        for (uint32_t k = 0; k < s.count; k++) {
            const struct ap_entry *e = &entries[s.first + k];

            nf = decode_fields(repl + (e->repl - REPL), e->repllen, (int)k, want, nf);
        }
        cr_assert_eq(p.fields_over, nf > AP_PLAN_MAX_FIELDS, "site %zu: %zu fields, over %d", i,
                     nf, p.fields_over);
        cr_assert_eq(p.nfields, nf > AP_PLAN_MAX_FIELDS ? AP_PLAN_MAX_FIELDS : nf,
                     "site %zu: %u fields listed, %zu decoded", i, p.nfields, nf);
        over += p.fields_over;
        for (size_t j = 0; j < p.nfields; j++) {
            const struct ap_plan_field *a = &p.fields[j], *b = &want[j];

            cr_assert(a->entry == b->entry && a->off == b->off && a->len == b->len &&
                          a->rel_off == b->rel_off && a->rel_size == b->rel_size &&
                          a->branch == b->branch && a->is_nop == b->is_nop &&
                          a->value == b->value,
                      "site %zu field %zu: entry %d +%u len %u rel +%u/%u %d nop %d value %d; "
                      "decoded entry %d +%u len %u rel +%u/%u %d nop %d value %d",
                      i, j, a->entry, a->off, a->len, a->rel_off, a->rel_size, a->branch,
                      a->is_nop, a->value, b->entry, b->off, b->len, b->rel_off, b->rel_size,
                      b->branch, b->is_nop, b->value);
            nops += a->is_nop;
        }
        compared += p.nfields;
    }
    /* the corpus exercises what it claims to */
    cr_assert_gt(accepted, NSITES / 4, "%zu plans accepted", accepted);
    cr_assert_gt(compared, 1000, "%zu fields compared", compared);
    cr_assert_gt(origs, 100, "%zu fields in originals", origs);
    cr_assert_gt(over, 0, "some site has more fields than a plan lists");
    cr_assert_gt(nops, 0, "a RIP-relative NOP is listed");
}

/* A refusal before decoding lists nothing; a site without relative fields lists none. */
Test(plan_fields, none_without_fields)
{
    uint8_t t[16], r[16];
    struct ap_view v = {.ntext = 1};
    struct ap_entry e = {.site = TEXT, .repl = REPL, .feature = X86_FEATURE_ALWAYS};
    struct ap_site s = {.addr = TEXT, .count = 1};
    struct altpatch_features fs = {0};
    struct ap_plan p;

    v.text[0] = (struct ap_region){TEXT, sizeof(t), t};
    v.repl = (struct ap_region){REPL, sizeof(r), r};
    s.len = (uint8_t)hex("0f ae e8", t);
    e.instrlen = s.len;
    e.repllen = (uint8_t)hex("0f 31", r);
    memset(&p, 0x5a, sizeof(p));
    ap_plan_site(&v, &s, &e, NULL, &fs, &p);
    cr_assert_eq(p.reason, 0, "%s", p.detail);
    cr_assert_eq(p.nfields, 0);
    cr_assert_not(p.fields_over);
    s.reason = ALTPATCH_REASON_SITE_OVERLAP;
    memset(&p, 0x5a, sizeof(p));
    ap_plan_site(&v, &s, &e, NULL, &fs, &p);
    cr_assert_eq(p.reason, ALTPATCH_REASON_SITE_OVERLAP);
    cr_assert_eq(p.nfields, 0);
    cr_assert_not(p.fields_over);
}
