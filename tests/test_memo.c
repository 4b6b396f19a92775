/* SPDX-License-Identifier: MIT */
/*
 * The plan memo (memo.c) must never change an answer: every site planned
 * through the memo gives exactly what the planner alone gives (reason,
 * bad entry, chosen entry, original and final bytes, detail). The module is
 * generated: many copies of a few site shapes (so the memo answers most of
 * them) mixed with relative replacements (memoized, relocated again for each
 * site's addresses), refusals, preset reasons, sites outside the text and
 * replacements outside altinstr_replacement.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ap_hex.h"
#include "plan.h"

#define TEXT0 0x400000ull
#define TEXT1 0x7f0000000000ull /* far from REPL: relocations overflow here */
#define REPL 0x480000ull
#define TEXT_SIZE 0x8000u
#define REPL_SIZE 0x8000u
#define MAX_SITES 2400

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

/* A site shape: original, up to three replacements with their ft_flags. */
struct shape {
    const char *orig;
    int n;
    const char *repl[3];
    uint32_t ft[3];
};

#define NOT (ALT_FLAG_NOT << ALT_FLAGS_SHIFT)

static const struct shape shapes[] = {
    /* the six primitives of altbench, and variants */
    {"0f ae f0 0f ae e8", 1, {""}, {NOT | X86_FEATURE_APIC_MSRS_FENCE}},
    {"64 48 8b 04 25 00 00 00 00", 1, {"f3 48 0f ae c0"}, {X86_FEATURE_FSGSBASE}},
    {"65 48 8b 04 25 00 00 00 00", 1, {"f3 48 0f ae c8"}, {X86_FEATURE_FSGSBASE}},
    {"b9 ff ff ff ff", 1, {"f3 0f c7 f9"}, {X86_FEATURE_RDPID}},
    {"0f 31 90 90 90", 2, {"0f ae e8 0f 31", "0f 01 f9"},
     {X86_FEATURE_LFENCE_RDTSC, X86_FEATURE_RDTSCP}},
    {"e8 00 00 00 00", 1, {"e8 00 01 00 00"}, {X86_FEATURE_ALWAYS}}, /* relative */
    /* NOP runs to fold, padding over 11 bytes (jmp over int3) */
    {"90 90 90 90 90 90 90 90 90 90 90 90 90 90 90 90", 1, {"90 66 90"}, {X86_FEATURE_ALWAYS}},
    {"0f 1f 44 00 00 0f 1f 44 00 00", 1, {"0f 0b 90 90"}, {X86_FEATURE_AVX2}},
    /* branches inside a replacement: targets inside keep their value (relative) */
    {"90 90 90 90 90 90", 1, {"75 02 90 90 90 90"}, {X86_FEATURE_ALWAYS}},
    /* jmp rel8 out of the replacement: overflows from far sites */
    {"90 90 90 90 90", 1, {"eb 10 90 90 90"}, {X86_FEATURE_ALWAYS}},
    /* RIP-relative load in the replacement */
    {"48 8b 04 25 00 10 00 00", 1, {"48 8b 05 00 10 00 00"}, {X86_FEATURE_ALWAYS}},
    /* refusals known from the content alone */
    {"90 90 90", 1, {"0f 0b"}, {1023u}},                                   /* unknown feature */
    {"90 90", 1, {"0f 1f 00"}, {X86_FEATURE_ALWAYS}},                      /* too long */
    {"90 90 90", 1, {"0f ff"}, {X86_FEATURE_ALWAYS}},                      /* undecodable */
    {"e8 00 00", 1, {"90"}, {X86_FEATURE_ALWAYS}},                         /* orig crosses end */
    /* nested, none eligible / the last eligible wins */
    {"0f ae e8 0f 31", 3, {"90", "0f 01 f9", "66 90"},
     {X86_FEATURE_AVX512F, NOT | X86_FEATURE_ALWAYS, X86_FEATURE_ALWAYS}},
    {"0f ae e8 0f 31", 2, {"90", "0f 01 f9"}, {X86_FEATURE_AVX512F, X86_FEATURE_SHA512}},
    /* no entry applies: the apply path keeps the original after the record
     * checks; the planner refuses the instructions of the first three */
    {"90 90 90", 1, {"0f ff"}, {X86_FEATURE_AVX512F}},                     /* undecodable */
    {"e8 00 00", 1, {"90"}, {X86_FEATURE_AVX512F}},                        /* orig crosses end */
    {"90 90 90 90 90", 1, {"eb 10 90 90 90"}, {NOT | X86_FEATURE_ALWAYS}}, /* rel8 from far */
    {"90 90", 1, {"0f 1f 00"}, {X86_FEATURE_AVX512F}},                     /* too long: refused */
    {"0f 01 f9 90", 1, {"f3 0f c7 f9"}, {X86_FEATURE_RDPID}}, /* an older getcpu original */
};

#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

struct module {
    uint8_t text[2][TEXT_SIZE];
    uint8_t repl[REPL_SIZE];
    struct ap_view v;
    struct ap_entry e[MAX_SITES * 3];
    struct ap_site s[MAX_SITES];
    const uint8_t *orig[MAX_SITES]; /* caller-supplied original, or NULL */
    size_t ne, ns;
    struct altpatch_features fs;
};

/* Place one copy of @sh: site in text region @t at @*to, replacements at
 * @*ro; @vary: random gaps, and now and then a refusal that only the address
 * checks find, or a caller-supplied original. */
static void add_site(struct module *m, const struct shape *sh, int t, size_t *to, size_t *ro,
                     bool vary)
{
    uint64_t base = t ? TEXT1 : TEXT0;
    size_t olen = hex(sh->orig, m->text[t] + *to), len = olen;
    struct ap_site *s = &m->s[m->ns];

    *s = (struct ap_site){.addr = base + *to, .first = (uint32_t)m->ne,
                          .count = (uint32_t)sh->n};
    for (int k = 0; k < sh->n; k++) {
        struct ap_entry *e = &m->e[m->ne++];
        size_t rl = hex(sh->repl[k], m->repl + *ro);

        *e = (struct ap_entry){.site = s->addr, .repl = REPL + *ro,
                               .feature = (uint16_t)(sh->ft[k] & 0xffff),
                               .flags = (uint16_t)(sh->ft[k] >> ALT_FLAGS_SHIFT),
                               .repllen = (uint8_t)rl, .index = (uint32_t)(m->ne - 1)};
        *ro += rl + (vary ? rnd() % 3 : 0);
    }
    s->len = (uint8_t)len;
    for (uint32_t k = 0; k < s->count; k++)
        m->e[s->first + k].instrlen = s->len;
    /* a few that only the address checks refuse */
    switch (vary ? rnd() % 40 : 39) {
    case 0:
        s->reason = ALTPATCH_REASON_SITE_OVERLAP;
        break;
    case 1:
        s->addr = base + TEXT_SIZE - 1; /* runs past the text region */
        break;
    case 2:
        m->e[s->first].repl = REPL + REPL_SIZE + 16; /* outside altinstr_replacement */
        break;
    case 3:
        m->orig[m->ns] = m->text[t] + *to; /* caller keeps the original */
        break;
    default:
        break;
    }
    *to += len + (vary ? rnd() % 4 : 0);
    m->ns++;
}

/* A module of @n sites drawn from the shapes, in both text regions. */
static void module_make(struct module *m, size_t n)
{
    size_t to[2] = {16, 16}, ro = 16;

    memset(m, 0, sizeof(*m));
    memset(m->text, 0xcc, sizeof(m->text));
    memset(m->repl, 0xcc, sizeof(m->repl));
    m->v.text[0] = (struct ap_region){TEXT0, TEXT_SIZE, m->text[0]};
    m->v.text[1] = (struct ap_region){TEXT1, TEXT_SIZE, m->text[1]};
    m->v.ntext = 2;
    m->v.repl = (struct ap_region){REPL, REPL_SIZE, m->repl};
    for (size_t i = 0; i < n; i++) {
        int t = rnd() % 4 == 0;

        add_site(m, &shapes[rnd() % NSHAPES], t, &to[t], &ro, true);
        cr_assert_lt(to[t] + 64, TEXT_SIZE, "test module overflows its text");
        cr_assert_lt(ro + 64, REPL_SIZE, "test module overflows its replacements");
    }
    m->fs.word[X86_FEATURE_ALWAYS / 32] |= 1u << (X86_FEATURE_ALWAYS % 32);
    m->fs.word[X86_FEATURE_FSGSBASE / 32] |= 1u << (X86_FEATURE_FSGSBASE % 32);
    m->fs.word[X86_FEATURE_RDPID / 32] |= 1u << (X86_FEATURE_RDPID % 32);
    m->fs.word[X86_FEATURE_RDTSCP / 32] |= 1u << (X86_FEATURE_RDTSCP % 32);
    m->fs.word[X86_FEATURE_LFENCE_RDTSC / 32] |= 1u << (X86_FEATURE_LFENCE_RDTSC % 32);
}

/* The two plans are the same answer. */
static void expect_same(const struct ap_plan *a, const struct ap_plan *b, size_t i)
{
    cr_assert_eq(b->reason, a->reason, "site %zu: reason %d, planner %d", i, b->reason,
                 a->reason);
    cr_assert_eq(b->bad_entry, a->bad_entry, "site %zu: bad_entry", i);
    cr_assert_eq(b->chosen, a->chosen, "site %zu: chosen %d, planner %d", i, b->chosen,
                 a->chosen);
    cr_assert_eq(b->len, a->len, "site %zu: len", i);
    cr_assert_arr_eq(b->orig, a->orig, a->len, "site %zu: orig", i);
    cr_assert_arr_eq(b->final, a->final, a->len, "site %zu: final", i);
    cr_assert_str_eq(b->detail, a->detail, "site %zu: detail", i);
    if (a->reason == ALTPATCH_REASON_NONE)
        cr_assert_eq(b->relative, a->relative, "site %zu: relative", i);
}

/* Sites the apply path (ap_memo_find + ap_memo_inst) answered, and of them
 * those with a relative template; sites it kept original because no entry
 * applies, and of them those the planner refuses. */
static size_t fast_answers, fast_relative, fast_original, fast_kept;

/* A refusal that only the instructions show (decoding, relative fields). */
static bool insn_reason(int reason)
{
    return reason == ALTPATCH_REASON_ORIG_UNDECODABLE ||
           reason == ALTPATCH_REASON_ORIG_CROSSES_END ||
           reason == ALTPATCH_REASON_REPL_UNDECODABLE ||
           reason == ALTPATCH_REASON_REPL_CROSSES_END || reason == ALTPATCH_REASON_RELOC_OVERFLOW;
}

/*
 * The apply path on site @s: a site inside the text none of whose entries
 * applies keeps its original (the planner agrees, or refuses it for an
 * instruction only: memory stays the same either way); else, when the memo
 * finds its template and instantiates it here, the answer is the planner's
 * @a (made under the memo's set): accepted, the same entry, the same final
 * bytes.
 */
static void fast_same(const struct ap_memo *memo, const struct ap_view *v,
                      const struct ap_site *s, const struct ap_entry *e, const uint8_t *orig,
                      const struct altpatch_features *fs, const struct ap_plan *a, size_t i)
{
    static uint8_t buf[AP_MAX_SITE];
    const uint8_t *fin = NULL, *bytes = orig ? orig : ap_view_text(v, s->addr, s->len);
    uint32_t id;
    int chosen;

    if (!memo || !bytes || memcmp(fs, &memo->fs, sizeof(*fs)) != 0)
        return;
    if (ap_view_text(v, s->addr, s->len) && ap_memo_keeps_original(memo, v, s, e)) {
        for (uint32_t k = 0; k < s->count; k++)
            cr_assert(!ap_entry_eligible(&e[s->first + k], fs), "site %zu: entry %u applies", i,
                      k);
        if (a->reason == ALTPATCH_REASON_NONE) {
            cr_assert_eq(a->chosen, -1, "site %zu: kept, the planner chose %d", i, a->chosen);
            cr_assert_arr_eq(bytes, a->final, a->len, "site %zu: final bytes", i);
            fast_original++;
            fast_answers++;
        } else {
            cr_assert(insn_reason(a->reason), "site %zu: kept, the planner refuses: %s", i,
                      a->detail);
            fast_kept++;
        }
        return;
    }
    cr_assert(a->reason != ALTPATCH_REASON_NONE || a->chosen >= 0 ||
                  !ap_view_text(v, s->addr, s->len),
              "site %zu: the original, yet not kept by the feature test", i);
    id = ap_memo_find((struct ap_memo *)memo, v, s, e, bytes);
    if (!id)
        return;
    memset(buf, 0xa5, sizeof(buf));
    chosen = ap_memo_inst(memo, id, v, s, e, buf, &fin);
    if (chosen < -1)
        return; /* declined: a relative field does not fit here, the planner decides */
    cr_assert_eq(a->reason, ALTPATCH_REASON_NONE, "site %zu: template for a refused site (%s)",
                 i, a->detail);
    cr_assert_eq(chosen, a->chosen, "site %zu: template chose %d, planner %d", i, chosen,
                 a->chosen);
    cr_assert_arr_eq(chosen >= 0 ? fin : bytes, a->final, a->len, "site %zu: final bytes", i);
    fast_answers++;
    fast_relative += a->relative;
}

/* Plan every site of @m alone and through @memo; compare (and the apply path). */
static void compare_all(struct module *m, struct ap_memo *memo, const struct altpatch_features *fs)
{
    static struct ap_plan a, b;

    for (size_t i = 0; i < m->ns; i++) {
        memset(&a, 0x5a, sizeof(a));
        memset(&b, 0xa5, sizeof(b));
        ap_plan_site(&m->v, &m->s[i], m->e, m->orig[i], fs, &a);
        ap_memo_plan(memo, &m->v, &m->s[i], m->e, m->orig[i], fs, &b);
        expect_same(&a, &b, i);
        fast_same(memo, &m->v, &m->s[i], m->e, m->orig[i], fs, &a, i);
    }
}

static struct module mod;

Test(memo, same_plans_as_the_planner)
{
    struct ap_memo memo;
    size_t accepted = 0, relative = 0, refused = 0;
    static struct ap_plan p;

    module_make(&mod, MAX_SITES);
    ap_memo_init(&memo, &mod.fs);
    compare_all(&mod, &memo, &mod.fs);
    for (size_t i = 0; i < mod.ns; i++) {
        ap_plan_site(&mod.v, &mod.s[i], mod.e, mod.orig[i], &mod.fs, &p);
        accepted += p.reason == ALTPATCH_REASON_NONE && !p.relative;
        relative += p.reason == ALTPATCH_REASON_NONE && p.relative;
        refused += p.reason != ALTPATCH_REASON_NONE;
    }
    /* the mix covers what it claims, and the memo did answer */
    cr_assert_gt(accepted, MAX_SITES / 3, "accepted %zu", accepted);
    cr_assert_gt(relative, 100, "relative %zu", relative);
    cr_assert_gt(refused, 100, "refused %zu", refused);
    cr_assert_gt(memo.hits, accepted - 2 * NSHAPES, "hits %llu of %zu",
                 (unsigned long long)memo.hits, accepted);
    cr_assert_eq(memo.hits + memo.misses + memo.known, mod.ns);
    cr_assert_leq(memo.nplans, NSHAPES, "one plan per distinct shape, %zu", memo.nplans);
    ap_memo_free(&memo);
}

/*
 * The apply path (a template found by its signature and bytes, then
 * instantiated at the site) gives the planner's decision and bytes on the
 * generated module: every site it answers, and it answers nearly every
 * accepted one once the shapes are known.
 */
Test(memo, apply_path_same_as_the_planner)
{
    struct ap_memo memo;
    static struct ap_plan p;
    size_t accepted = 0;

    module_make(&mod, MAX_SITES);
    ap_memo_init(&memo, &mod.fs);
    compare_all(&mod, &memo, &mod.fs); /* stores the templates */
    fast_answers = fast_relative = fast_original = fast_kept = 0;
    compare_all(&mod, &memo, &mod.fs);
    for (size_t i = 0; i < mod.ns; i++) {
        ap_plan_site(&mod.v, &mod.s[i], mod.e, mod.orig[i], &mod.fs, &p);
        accepted += p.reason == ALTPATCH_REASON_NONE;
    }
    cr_assert_gt(fast_answers, accepted * 9 / 10, "apply path answered %zu of %zu accepted",
                 fast_answers, accepted);
    cr_assert_gt(fast_relative, 50, "relative answers %zu", fast_relative);
    cr_assert_gt(fast_original, 100, "kept original %zu", fast_original);
    cr_assert_gt(fast_kept, 100, "kept original, refused by the planner %zu", fast_kept);
    ap_memo_free(&memo);
}

Test(memo, second_pass_all_from_the_memo)
{
    struct ap_memo memo;

    module_make(&mod, MAX_SITES);
    ap_memo_init(&memo, &mod.fs);
    compare_all(&mod, &memo, &mod.fs);
    uint64_t hits = memo.hits;
    compare_all(&mod, &memo, &mod.fs); /* every stored shape hits now */
    cr_assert_gt(memo.hits - hits, hits, "second pass hits %llu",
                 (unsigned long long)(memo.hits - hits));
    ap_memo_free(&memo);
}

Test(memo, relative_plans_relocated_per_site)
{
    struct ap_memo memo;
    static struct ap_plan a, b;
    uint8_t prev[5];

    module_make(&mod, 0);
    size_t to = 16, ro = 16;
    for (size_t i = 0; i < 50; i++) {
        add_site(&mod, &shapes[5], 0, &to, &ro, false); /* call rel32: bytes differ per address */
        ro += i + 1;                                    /* distance site - replacement varies */
    }
    ap_memo_init(&memo, &mod.fs);
    for (size_t i = 0; i < mod.ns; i++) {
        ap_plan_site(&mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &a);
        ap_memo_plan(&memo, &mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &b);
        cr_assert_eq(a.reason, ALTPATCH_REASON_NONE, "site %zu: %s", i, a.detail);
        cr_assert(a.relative);
        expect_same(&a, &b, i);
        if (i)
            cr_assert_arr_neq(b.final, prev, 5, "site %zu: relocated per address", i);
        memcpy(prev, b.final, 5);
    }
    cr_assert_eq(memo.nplans, 1, "one plan for 50 calls");
    cr_assert_eq(memo.hits, 49, "hits %llu", (unsigned long long)memo.hits);
    ap_memo_free(&memo);
}

/* Relative shapes for the address sweep: original, entries (features), each
 * replacement 32 bytes after the previous one. */
static const struct shape rel_shapes[] = {
    {"e8 00 00 00 00", 1, {"e8 00 01 00 00"}, {X86_FEATURE_ALWAYS}},         /* call rel32 */
    {"90 90 90 90 90 90 90 90", 1, {"e9 f0 ff ff ff"}, {X86_FEATURE_ALWAYS}},   /* jmp rel32 back */
    {"90 90 90 90 90 90 90 90", 1, {"0f 85 00 02 00 00"}, {X86_FEATURE_ALWAYS}}, /* jcc rel32 */
    {"90 90 90 90 90 90", 1, {"75 10 90 90"}, {X86_FEATURE_ALWAYS}},           /* jcc rel8 out */
    {"90 90 90 90 90 90", 1, {"75 02 90 90 90 90"}, {X86_FEATURE_ALWAYS}},     /* jcc rel8 in */
    {"90 90 90 90 90 90 90 90", 1, {"eb 02 90 90"}, {X86_FEATURE_ALWAYS}},     /* to its end */
    {"90 90 90 90 90 90 90 90 90 90", 1, {"eb 04 90 90 90"}, {X86_FEATURE_ALWAYS}}, /* into it? */
    {"90 90 90 90 90 90 90 90 90 90", 1, {"e3 80 90"}, {X86_FEATURE_ALWAYS}},  /* jrcxz -128 */
    {"90 90 90 90 90 90 90 90", 1, {"48 8b 05 00 10 00 00"}, {X86_FEATURE_ALWAYS}}, /* rip */
    {"90 90 90 90 90 90 90 90", 1, {"48 8d 05 00 00 00 80"}, {X86_FEATURE_ALWAYS}}, /* INT32_MIN */
    {"90 90 90 90 90 90 90 90 90 90", 1, {"0f 1f 05 10 00 00 00"}, {X86_FEATURE_ALWAYS}}, /* nopl rip */
    {"0f 1f 44 00 00 e8 00 00 00 00 0f 1f 44 00 00", 1, {"48 8b 05 00 00 00 00 e8 f0 ff ff ff"},
     {X86_FEATURE_ALWAYS}},                                                  /* two fields */
    {"e8 00 00 00 00", 2, {"eb 7f 90 90 90", "e8 00 00 00 80"},
     {X86_FEATURE_AVX512F, X86_FEATURE_ALWAYS}},             /* rel8 not chosen, still checked */
    {"e8 00 00 00 00", 2, {"e8 10 00 00 00", "eb 80 90"},
     {X86_FEATURE_ALWAYS, X86_FEATURE_AVX512F}},             /* chosen first, rel8 after */
    {"e8 00 00 00 00", 1, {"e8 00 00 00 00"}, {X86_FEATURE_AVX512F}},        /* none chosen */
    {"66 90 66 90 66 90", 2, {"eb fe", "74 00 90"}, {X86_FEATURE_ALWAYS, X86_FEATURE_RDPID}},
    {"90 90 90 90 90", 1, {"e9 00 00 00 00"}, {X86_FEATURE_ALWAYS}}, /* jmp rel32 to its end */
    {"90 90 90 90 90 90 90 90 90 90 90 90 90 90 90 90", 1, {"e9 f0 ff ff ff 90 90 90"},
     {X86_FEATURE_ALWAYS}}, /* jmp rel32 back: between its NOPs from some places */
};

#define NREL (sizeof(rel_shapes) / sizeof(rel_shapes[0]))

static uint8_t sw_text[64], sw_repl[128];
static struct ap_entry sw_e[3];

/* Plan shape @sh with the site at @site and entry k's replacement at
 * @repl + 16 + 32k, alone and through @memo; the two answers must agree. */
static int sweep_one(struct ap_memo *memo, const struct shape *sh, uint64_t site, uint64_t repl,
                     const struct altpatch_features *fs)
{
    static struct ap_plan a, b;
    struct ap_view v = {.ntext = 1};
    struct ap_site s = {.addr = site, .first = 0, .count = (uint32_t)sh->n};

    memset(sw_text, 0xcc, sizeof(sw_text));
    memset(sw_repl, 0xcc, sizeof(sw_repl));
    s.len = (uint8_t)hex(sh->orig, sw_text + 16);
    v.text[0] = (struct ap_region){site - 16, sizeof(sw_text), sw_text};
    v.repl = (struct ap_region){repl, sizeof(sw_repl), sw_repl};
    for (int k = 0; k < sh->n; k++)
        sw_e[k] = (struct ap_entry){.site = site, .repl = repl + 16 + 32 * (uint64_t)k,
                                    .feature = (uint16_t)(sh->ft[k] & 0xffff),
                                    .flags = (uint16_t)(sh->ft[k] >> ALT_FLAGS_SHIFT),
                                    .instrlen = s.len,
                                    .repllen = (uint8_t)hex(sh->repl[k], sw_repl + 16 + 32 * k)};
    memset(&a, 0x5a, sizeof(a));
    memset(&b, 0xa5, sizeof(b));
    if (memo)
        ap_memo_hints_drop(memo); /* other replacement bytes at the same addresses */
    ap_plan_site(&v, &s, sw_e, NULL, fs, &a);
    fast_same(memo, &v, &s, sw_e, NULL, fs, &a, (size_t)(site - repl)); /* before it is stored */
    ap_memo_plan(memo, &v, &s, sw_e, NULL, fs, &b);
    expect_same(&a, &b, (size_t)(site - repl));
    fast_same(memo, &v, &s, sw_e, NULL, fs, &a, (size_t)(site - repl));
    return a.reason;
}

/*
 * Every relative shape at many distances replacement - site: around each
 * field range's ends (rel8, rel16, rel32, both signs; every distance within
 * 24 of an end, every 5th up to 300, so every field crosses its end, the
 * small ones at the exact boundary), near 0 (branches into the site),
 * and at random; memo and planner give the same answer each time, while the
 * memo answers many of them.
 */
Test(memo, relative_plans_across_addresses)
{
    static const int64_t ends[] = {0, 127, -128, 32767, -32768, INT32_MAX, INT32_MIN,
                                   (int64_t)INT32_MAX + 4096, (int64_t)INT32_MIN - 4096};
    const uint64_t base = 0x100000000000ull;
    size_t accepted = 0, overflow = 0, n = 0;
    struct ap_memo memo;

    module_make(&mod, 0); /* its feature set */
    ap_memo_init(&memo, &mod.fs);
    fast_answers = 0;
    for (size_t k = 0; k < NREL; k++) {
        for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++)
            for (int64_t j = -300; j <= 300; j += (j >= -24 && j < 24) ? 1 : 5) {
                int64_t d = ends[i] + j - 16; /* distance site - (first replacement) */
                int r = sweep_one(&memo, &rel_shapes[k], base + (uint64_t)d, base, &mod.fs);

                accepted += r == ALTPATCH_REASON_NONE;
                overflow += r == ALTPATCH_REASON_RELOC_OVERFLOW;
                n++;
            }
        for (int i = 0; i < 200; i++) {
            int64_t d = (int64_t)(int32_t)rnd() * (rnd() % 3);
            int r = sweep_one(&memo, &rel_shapes[k], base + (uint64_t)d, base, &mod.fs);

            accepted += r == ALTPATCH_REASON_NONE;
            overflow += r == ALTPATCH_REASON_RELOC_OVERFLOW;
            n++;
        }
    }
    cr_assert_gt(accepted, n / 4, "accepted %zu of %zu", accepted, n);
    cr_assert_gt(overflow, n / 4, "overflow %zu of %zu", overflow, n);
    cr_assert_gt(memo.hits, accepted / 2, "hits %llu, accepted %zu",
                 (unsigned long long)memo.hits, accepted);
    cr_assert_leq(memo.nplans, NREL);
    cr_assert_eq(memo.hits + memo.misses + memo.known, n);
    cr_assert_gt(fast_answers, accepted / 2, "apply path answered %zu, accepted %zu",
                 fast_answers, accepted);
    ap_memo_free(&memo);
}

/* A relative field of the chosen entry that lands inside the site cuts the
 * NOP folding there: such a site is planned, never answered from the memo. */
Test(memo, branch_into_the_site_goes_to_the_planner)
{
    const uint64_t base = 0x200000000000ull;
    const struct shape *sh = &rel_shapes[6]; /* jmp rel8 +4, 3 NOPs, in a 10-byte site */
    struct ap_memo memo;
    static struct ap_plan a;

    module_make(&mod, 0);
    ap_memo_init(&memo, &mod.fs);
    cr_assert_eq(sweep_one(&memo, sh, base + 100, base, &mod.fs), ALTPATCH_REASON_NONE);
    cr_assert_eq(memo.nplans, 1);
    /* site == replacement: the jmp lands at site +6, inside the padding NOP */
    cr_assert_eq(sweep_one(&memo, sh, base + 16, base, &mod.fs), ALTPATCH_REASON_NONE);
    cr_assert_eq(memo.hits, 0, "answered from the memo although the jmp lands in the site");
    /* what the planner made of it: jmp +4, nothing folded (+6 is no instruction boundary) */
    struct ap_view v = {.ntext = 1};
    struct ap_site s = {.addr = base + 16, .count = 1, .len = 10};
    v.text[0] = (struct ap_region){base, sizeof(sw_text), sw_text};
    v.repl = (struct ap_region){base, sizeof(sw_repl), sw_repl};
    ap_plan_site(&v, &s, sw_e, NULL, &mod.fs, &a);
    expect_bytes(a.final, 10, "eb 04 90 90 90 0f 1f 44 00 00");
    /* another site whose jmp lands before it hits again */
    cr_assert_eq(sweep_one(&memo, sh, base + 40, base, &mod.fs), ALTPATCH_REASON_NONE);
    cr_assert_eq(memo.hits, 1);
    ap_memo_free(&memo);
    /* first seen where it lands inside: that plan's folding is not kept for others */
    ap_memo_init(&memo, &mod.fs);
    cr_assert_eq(sweep_one(&memo, sh, base + 16, base, &mod.fs), ALTPATCH_REASON_NONE);
    for (uint64_t d = 17; d < 80; d++)
        cr_assert_eq(sweep_one(&memo, sh, base + d, base, &mod.fs), ALTPATCH_REASON_NONE);
    ap_memo_free(&memo);
}

/* Store @v at @p as 4 bytes, little-endian. */
static void put32(uint8_t *p, int64_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)((uint64_t)v >> (8 * i));
}

/*
 * ALTPATCH_ALT_CALL as the compiler emits it: every site a `call oldfn`
 * (its rel32 differs per site) whose replacement is a `call newfn` (its rel32
 * differs per replacement). One plan serves them all, relocated per site;
 * with the feature absent, each keeps its own original. Also an original
 * with a RIP-relative load, and originals that differ in a byte that is not
 * a relative field (not the same content: no false hit).
 */
Test(memo, alt_call_sites_share_one_plan)
{
    static const struct shape calls[] = {
        {"e8 00 00 00 00", 1, {"e8 00 00 00 00"}, {X86_FEATURE_ALWAYS}},
        {"e8 00 00 00 00", 1, {"e8 00 00 00 00"}, {X86_FEATURE_AVX512F}}, /* none chosen */
        {"48 8b 05 00 00 00 00", 1, {"e8 00 00 00 00"}, {X86_FEATURE_ALWAYS}},
        {"48 8b 05 00 00 00 00", 1, {"e8 00 00 00 00"}, {X86_FEATURE_AVX512F}},
    };
    const uint64_t oldfn = TEXT0 + 8, newfn = TEXT0 + 12;
    struct ap_memo memo;
    static struct ap_plan a, b;
    size_t per = 60;

    module_make(&mod, 0);
    size_t to = 16, ro = 16;
    for (size_t i = 0; i < per * 4; i++) {
        const struct shape *sh = &calls[i % 4];
        size_t at = to, rat = ro;
        struct ap_site *s = &mod.s[mod.ns];

        add_site(&mod, sh, 0, &to, &ro, false);
        size_t ol = s->len, fo = ol - 4; /* the field ends the instruction */
        put32(mod.text[0] + at + fo, (int64_t)(oldfn - (s->addr + ol)));
        put32(mod.repl + rat + 1, (int64_t)(newfn - (mod.e[s->first].repl + 5)));
        if (i % 7 == 3)
            mod.text[0][at] ^= 0x01; /* e9 jmp / 49 8b: other content */
        to += 3 * (i % 5);
        ro += i % 3;
    }
    ap_memo_init(&memo, &mod.fs);
    fast_answers = 0;
    for (size_t i = 0; i < mod.ns; i++) {
        ap_plan_site(&mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &a);
        fast_same(&memo, &mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &a, i);
        ap_memo_plan(&memo, &mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &b);
        cr_assert_eq(a.reason, ALTPATCH_REASON_NONE, "site %zu: %s", i, a.detail);
        expect_same(&a, &b, i);
        if (a.chosen < 0)
            cr_assert_arr_eq(b.final, a.orig, a.len, "site %zu keeps its original", i);
        else
            cr_assert_eq(b.final[0], 0xe8);
    }
    cr_assert_gt(memo.hits, mod.ns * 3 / 4, "hits %llu of %zu, plans %zu masks %zu", (unsigned long long)memo.hits,
                 mod.ns, memo.nplans, memo.nmasks);
    cr_assert_gt(fast_answers, mod.ns * 3 / 4, "apply path answered %zu of %zu", fast_answers,
                 mod.ns);
    cr_assert_leq(memo.nplans, 8, "plans %zu", memo.nplans);
    ap_memo_free(&memo);
}

Test(memo, hit_rechecks_addresses)
{
    struct ap_memo memo;
    static struct ap_plan a, b;

    module_make(&mod, 0);
    size_t to = 16, ro = 16;
    for (int i = 0; i < 4; i++)
        add_site(&mod, &shapes[1], 0, &to, &ro, false); /* fs self: memoizable */
    cr_assert_eq(mod.s[3].addr, TEXT0 + 16 + 9 * 3);
    ap_memo_init(&memo, &mod.fs);
    ap_memo_plan(&memo, &mod.v, &mod.s[0], mod.e, NULL, &mod.fs, &b);
    cr_assert_eq(b.reason, ALTPATCH_REASON_NONE);
    cr_assert_eq(memo.nplans, 1);
    /* same content, but: preset reason / replacement outside / site outside the text */
    mod.s[1].reason = ALTPATCH_REASON_SITE_OVERLAP;
    mod.e[mod.s[2].first].repl = REPL + REPL_SIZE - 2;
    mod.v.text[0].size = 16 + 9 * 3 + 4; /* site 3 now runs past the end */
    for (size_t i = 1; i < 4; i++) {
        ap_plan_site(&mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &a);
        fast_same(&memo, &mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &a, i);
        ap_memo_plan(&memo, &mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &b);
        cr_assert_neq(a.reason, ALTPATCH_REASON_NONE, "site %zu refused by the planner", i);
        expect_same(&a, &b, i);
    }
    cr_assert_eq(memo.hits, 0, "a site failing an address check was answered from the memo");
    ap_memo_free(&memo);
}

Test(memo, other_feature_set_goes_to_the_planner)
{
    struct ap_memo memo;
    struct altpatch_features none;

    module_make(&mod, 600);
    memset(&none, 0, sizeof(none));
    ap_memo_init(&memo, &mod.fs);
    compare_all(&mod, &memo, &mod.fs);
    uint64_t hits = memo.hits;
    size_t plans = memo.nplans;
    compare_all(&mod, &memo, &none); /* same sites, no features: different choices */
    cr_assert_eq(memo.hits, hits, "answered for another feature set");
    cr_assert_eq(memo.nplans, plans);
    ap_memo_free(&memo);
    cr_assert_null(memo.slots);
    compare_all(&mod, NULL, &mod.fs); /* no memo: the planner */
}

/*
 * A site of one or two entries is first looked up by its records alone:
 * its replacements' addresses and headers name the template last found for
 * them (identical replacements are emitted once); the site's own bytes still
 * decide. Shapes that share a replacement address but differ in the
 * original, the feature, the flags or the second entry; one replacement's
 * bytes at two addresses; the bytes at a shared address rewritten (then the
 * caller drops the hints, as each apply does); the region cut short under a
 * kept lookup; the memo emptied and used again under another feature set.
 * Each answer is the planner's.
 */
static const struct shape shared[] = {
    {"64 48 8b 04 25 00 00 00 00", 1, {"f3 48 0f ae c0"}, {X86_FEATURE_FSGSBASE}},
    {"65 48 8b 04 25 00 00 00 00", 1, {"f3 48 0f ae c0"}, {X86_FEATURE_FSGSBASE}}, /* original */
    {"64 48 8b 04 25 00 00 00 00", 1, {"f3 48 0f ae c0"}, {X86_FEATURE_RDPID}},    /* feature */
    {"64 48 8b 04 25 00 00 00 00", 1, {"f3 48 0f ae c0"}, {NOT | X86_FEATURE_AVX512F}}, /* flags */
    {"0f 31 90 90 90", 2, {"0f ae e8 0f 31", "0f 01 f9"},
     {X86_FEATURE_LFENCE_RDTSC, X86_FEATURE_RDTSCP}},
    {"0f 31 90 90 90", 2, {"0f ae e8 0f 31", "0f 01 f9"},
     {X86_FEATURE_AVX512F, X86_FEATURE_RDTSCP}}, /* the first entry does not apply */
    {"e8 00 00 00 00", 1, {"e8 00 01 00 00"}, {X86_FEATURE_ALWAYS}}, /* relative */
};

#define NSHARED (sizeof(shared) / sizeof(shared[0]))

/* Where shape k's replacements lie: one address per distinct replacement
 * (the first entries of shapes 0-3 share one, so do those of 4 and 5). */
static const size_t shared_at[NSHARED] = {64, 64, 64, 64, 128, 128, 192};

static size_t shared_shape[MAX_SITES];

/* @n sites of the shapes above, every shape among the first sites; the
 * second entry of every other two-entry site at a second copy of its bytes. */
static void shared_module(struct module *m, size_t n)
{
    size_t to = 16;

    module_make(m, 0);
    for (size_t i = 0; i < n; i++) {
        size_t k = i < NSHARED ? i : rnd() % NSHARED, ro = shared_at[k];
        struct ap_site *s = &m->s[m->ns];

        shared_shape[m->ns] = k;
        add_site(m, &shared[k], 0, &to, &ro, false);
        if (s->count == 2 && i % 2) {
            struct ap_entry *e = &m->e[s->first + 1];

            hex(shared[k].repl[1], m->repl + 256);
            e->repl = REPL + 256;
        }
        to += rnd() % 3;
        cr_assert_lt(to + 64, TEXT_SIZE, "test module overflows its text");
    }
}

/* Every site alone, through the apply path (fast_same) and through
 * ap_memo_plan(): the planner's answers. Returns the apply path's answers. */
static size_t shared_pass(struct module *m, struct ap_memo *memo)
{
    static struct ap_plan a, b;

    fast_answers = 0;
    for (size_t i = 0; i < m->ns; i++) {
        ap_plan_site(&m->v, &m->s[i], m->e, NULL, &memo->fs, &a);
        fast_same(memo, &m->v, &m->s[i], m->e, NULL, &memo->fs, &a, i);
        ap_memo_plan(memo, &m->v, &m->s[i], m->e, NULL, &memo->fs, &b);
        expect_same(&a, &b, i);
    }
    return fast_answers;
}

/* The template of site @i (its original read from the view), or 0. */
static uint32_t shared_find(struct module *m, struct ap_memo *memo, size_t i)
{
    const struct ap_site *s = &m->s[i];

    return ap_memo_find(memo, &m->v, s, m->e, ap_view_text(&m->v, s->addr, s->len));
}

/* True when one of the two slots of entry @p e's key holds a hint for template @p id. */
static bool hinted(const struct ap_memo *memo, const struct ap_entry *e, uint32_t id)
{
    uint64_t key = ap_memo_hint_key(e);

    return memo->hint[ap_memo_hint_at(memo, key)].id == id ||
           memo->hint[ap_memo_hint_at2(memo, key)].id == id;
}

/*
 * Shapes whose first replacements lie at one address (an empty replacement
 * lies where the next one starts) but whose headers differ, met in turn: each
 * keeps a hint of its own (a key per replacement address and header), so
 * neither evicts the other's on every site. Two shapes of one key (the same
 * first record, another original) keep one each too.
 */
Test(memo, shapes_sharing_a_replacement_keep_their_hints)
{
    struct ap_memo memo;

    shared_module(&mod, NSHARED);
    ap_memo_init(&memo, &mod.fs);
    shared_pass(&mod, &memo); /* stores the templates */
    const size_t k[4] = {0, 1, 2, 3}; /* one address; FSGSBASE twice, RDPID, NOT AVX512F */
    uint32_t id[4];
    for (int round = 0; round < 3; round++)
        for (int j = 0; j < 4; j++) {
            id[j] = shared_find(&mod, &memo, k[j]);
            cr_assert_neq(id[j], 0, "shape %zu", k[j]);
        }
    for (int j = 0; j < 4; j++) {
        const struct ap_entry *e = &mod.e[mod.s[k[j]].first];
        cr_assert_eq(e->repl, mod.e[mod.s[0].first].repl);
        cr_assert(hinted(&memo, e, id[j]), "shape %zu: no hint", k[j]);
        for (int i = 0; i < j; i++)
            cr_assert_neq(id[i], id[j]);
    }
    ap_memo_free(&memo);
}

/*
 * Two keys whose first hint slot is the same, their sites met in turn: each
 * gets a hint and every later site of either is answered by its hint, not
 * by the full lookup (with one slot per key each miss took the other's turn
 * and neither ever got one), and each in a first slot of its own: the fill
 * chose another multiplier rather than leave one to the second slot, looked
 * up out of line.
 */
Test(memo, keys_sharing_a_slot_met_in_turn_keep_their_hints)
{
    struct ap_memo memo;
    static struct ap_plan b;

    module_make(&mod, 0);
    ap_memo_init(&memo, &mod.fs);
    const struct shape *sa = &shapes[1], *sb = &shapes[2]; /* fs self, gs self */
    size_t to = 16, ra = 64, rb = 0;
    /* a replacement address for the second shape whose key shares the
     * first's slot */
    struct ap_entry ea = {.repl = REPL + ra, .feature = X86_FEATURE_FSGSBASE, .repllen = 5};
    uint64_t ka = ap_memo_hint_key(&ea);
    for (size_t r = 256; r < REPL_SIZE - 64 && !rb; r++) {
        struct ap_entry eb = {.repl = REPL + r, .feature = X86_FEATURE_FSGSBASE, .repllen = 5};
        uint64_t kb = ap_memo_hint_key(&eb);
        if (kb != ka && ap_memo_hint_at(&memo, kb) == ap_memo_hint_at(&memo, ka))
            rb = r;
    }
    cr_assert_neq(rb, 0, "no replacement address shares the slot");
    for (size_t i = 0; i < 40; i++) {
        size_t ro = i % 2 ? rb : ra;
        add_site(&mod, i % 2 ? sb : sa, 0, &to, &ro, false);
    }
    const struct ap_entry *e0 = &mod.e[mod.s[0].first], *e1 = &mod.e[mod.s[1].first];
    cr_assert_eq(ap_memo_hint_key(e0), ka, "the first shape's key");
    uint64_t kb = ap_memo_hint_key(e1);
    cr_assert_eq(ap_memo_hint_at(&memo, kb), ap_memo_hint_at(&memo, ka), "one first slot");
    for (size_t i = 0; i < 2; i++) /* the templates */
        ap_memo_plan(&memo, &mod.v, &mod.s[i], mod.e, NULL, &mod.fs, &b);
    for (size_t i = 0; i < mod.ns; i++)
        cr_assert_neq(shared_find(&mod, &memo, i), 0, "site %zu", i);
    for (size_t i = 0; i < mod.ns; i++) {
        const struct ap_site *s = &mod.s[i];
        uint32_t id = ap_memo_find_hint(&memo, s, mod.e, ap_view_text(&mod.v, s->addr, s->len));
        cr_assert_neq(id, 0, "site %zu (shape %s): no hint", i, i % 2 ? "gs" : "fs");
        cr_assert_eq(id, shared_find(&mod, &memo, i), "site %zu: the hint's template", i);
    }
    size_t at_a = ap_memo_hint_at(&memo, ka), at_b = ap_memo_hint_at(&memo, kb);
    cr_assert_neq(at_a, at_b, "the two keys still share a first slot");
    cr_assert_eq(memo.hint[at_a].id, shared_find(&mod, &memo, 0), "the first key's hint");
    cr_assert_eq(memo.hint[at_b].id, shared_find(&mod, &memo, 1), "the second key's hint");
    ap_memo_free(&memo);
}

Test(memo, lookup_by_records_follows_the_bytes)
{
    struct ap_memo memo;
    struct altpatch_features other;
    static struct ap_plan a;
    size_t n = 600, got;
    uint32_t id;

    shared_module(&mod, n);
    ap_memo_init(&memo, &mod.fs);
    shared_pass(&mod, &memo); /* stores the templates */
    got = shared_pass(&mod, &memo);
    cr_assert_gt(got, n * 3 / 4, "answered %zu of %zu", got, n);
    cr_assert_leq(memo.nplans, NSHARED, "plans %zu", memo.nplans);

    /* one replacement address, shapes in turn: each finds its own template */
    for (int round = 0; round < 3; round++)
        for (size_t k = 0; k < NSHARED; k++) {
            id = shared_find(&mod, &memo, k);
            ap_plan_site(&mod.v, &mod.s[k], mod.e, NULL, &memo.fs, &a);
            fast_same(&memo, &mod.v, &mod.s[k], mod.e, NULL, &memo.fs, &a, k);
            cr_assert(id || a.chosen < 0, "shape %zu not found", k);
            for (size_t j = 0; j < k && id; j++)
                cr_assert_neq(shared_find(&mod, &memo, j), id, "shapes %zu and %zu: one template",
                              j, k);
        }

    /* the bytes at a replacement address the lookup just used rewritten
     * (rdfsbase -> rdgsbase), as when another library is mapped where one
     * was: no template of that shape yet, then its own */
    cr_assert_neq(shared_find(&mod, &memo, 0), 0);
    cr_assert_neq(shared_find(&mod, &memo, 0), 0);
    hex("f3 48 0f ae c8", mod.repl + 64);
    ap_memo_hints_drop(&memo);
    cr_assert_eq(shared_find(&mod, &memo, 0), 0, "answered for the old replacement bytes");
    shared_pass(&mod, &memo);
    got = shared_pass(&mod, &memo);
    cr_assert_gt(got, n * 3 / 4, "answered %zu of %zu after the rewrite", got, n);
    hex("f3 48 0f ae c0", mod.repl + 64);
    ap_memo_hints_drop(&memo);

    /* the region cut short under lookups just made (a hint is left the
     * second time in a row): the replacement at 192 lies outside it now
     * (REPL_BOUNDS) */
    cr_assert_neq(shared_find(&mod, &memo, 6), 0);
    cr_assert_neq(shared_find(&mod, &memo, 6), 0);
    cr_assert_neq(shared_find(&mod, &memo, 6), 0);
    mod.v.repl.size = 192 + 2;
    cr_assert_eq(shared_find(&mod, &memo, 6), 0, "answered outside the region");
    ap_plan_site(&mod.v, &mod.s[6], mod.e, NULL, &memo.fs, &a);
    cr_assert_eq(a.reason, ALTPATCH_REASON_REPL_BOUNDS);
    shared_pass(&mod, &memo);
    mod.v.repl.size = REPL_SIZE;
    got = shared_pass(&mod, &memo);
    cr_assert_gt(got, n * 3 / 4, "answered %zu of %zu with the region back", got, n);

    /* the memo emptied and used under another set: FSGSBASE, RDPID and
     * LFENCE_RDTSC gone, AVX512F there (other entries chosen) */
    memset(&other, 0, sizeof(other));
    other.word[X86_FEATURE_ALWAYS / 32] |= 1u << (X86_FEATURE_ALWAYS % 32);
    other.word[X86_FEATURE_AVX512F / 32] |= 1u << (X86_FEATURE_AVX512F % 32);
    other.word[X86_FEATURE_RDTSCP / 32] |= 1u << (X86_FEATURE_RDTSCP % 32);
    ap_memo_free(&memo);
    ap_memo_init(&memo, &other);
    shared_pass(&mod, &memo);
    got = shared_pass(&mod, &memo);
    cr_assert_gt(got, n / 2, "answered %zu of %zu under the other set", got, n);
    ap_memo_free(&memo);
    /* and back, on the same memo: nothing of the other set answers */
    ap_memo_init(&memo, &mod.fs);
    for (size_t k = 0; k < NSHARED; k++)
        cr_assert_eq(shared_find(&mod, &memo, k), 0);
    shared_pass(&mod, &memo);
    got = shared_pass(&mod, &memo);
    cr_assert_gt(got, n * 3 / 4, "answered %zu of %zu", got, n);
    ap_memo_free(&memo);
}

/* A memo of zero bytes (a static never used) made empty for a feature set
 * without clearing it: the same memo as ap_memo_init() makes of any bytes,
 * and it answers as the planner does. */
Test(memo, init_of_zero_bytes_is_init)
{
    static struct ap_memo zero;
    struct ap_memo *any = malloc(sizeof(*any));

    cr_assert_not_null(any);
    module_make(&mod, 200);
    memset(any, 0x5a, sizeof(*any));
    ap_memo_init(any, &mod.fs);
    ap_memo_init_zeroed(&zero, &mod.fs);
    cr_assert_eq(memcmp(any, &zero, sizeof(zero)), 0, "not the memo ap_memo_init() makes");
    compare_all(&mod, &zero, &mod.fs);
    cr_assert_gt(zero.nplans, 0);
    ap_memo_free(&zero);
    free(any);
}
