/* SPDX-License-Identifier: MIT */
/*
 * The templates this library carries for its primitives' shapes
 * (known_plans.c) against the planner, on the sites of every primitive in
 * this program (ap_every_primitive.h): each answer the planner can give at
 * each site (the original, each entry, under a feature set that selects it)
 * makes a template that is in the table byte for byte, every entry of the
 * table is one of them, a memo that takes the table's template answers
 * exactly as one that plans the site, and a first apply of this program
 * decodes no instruction.
 *
 * The table was printed from a gcc build (tests/known_plans_gen.c); clang
 * 14's assembler encodes the primitives the same. Another's may not: its
 * sites are then planned, never misread, and the tests that need this
 * build's bytes to be the table's say so when they fail under it.
 */
#include <criterion/criterion.h>
#include <errno.h>

#include "ap_every_primitive.h"
#include "ap_known_walk.h"

static struct ap_module *list, *m;

static void setup(void)
{
    cr_assert_eq(ap_modules_refresh(&list), 0);
    m = apk_main_module(list);
    cr_assert_not_null(m, "this program's table");
    cr_assert_geq(m->nsites, 8, "the primitives' sites: %zu", m->nsites);
}

static void teardown(void)
{
    ap_known_plans_off = false;
    ap_modules_free(list);
}

/* Calls @p fn(site, entries, c, set) for each answer of each site. */
static size_t each_answer(void (*fn)(size_t i, const struct ap_site *s,
                                     const struct ap_entry *e, int c,
                                     const struct altpatch_features *fs))
{
    size_t n = 0;
    for (size_t i = 0; i < m->nsites; i++) {
        struct ap_site_entries eb;
        const struct ap_site *s;
        const struct ap_entry *e = ap_module_site_entries(m, i, &eb, &s);
        for (int c = -1; c < (int)s->count; c++) {
            struct altpatch_features fs;
            if (!apk_set_for(&m->view, s, e, c, &fs))
                continue;
            fn(i, s, e, c, &fs);
            n++;
        }
    }
    return n;
}

static bool met[64];

static void planner_template_in_table(size_t i, const struct ap_site *s,
                                      const struct ap_entry *e, int c,
                                      const struct altpatch_features *fs)
{
    struct ap_memo memo;
    struct ap_plan out;
    ap_memo_init(&memo, fs);
    ap_known_plans_off = true;
    uint32_t id = ap_memo_plan(&memo, &m->view, s, e, (const uint8_t *)(uintptr_t)s->addr, fs,
                               &out);
    ap_known_plans_off = false;
    cr_assert_eq(out.reason, ALTPATCH_REASON_NONE, "site %zu, entry %d: %s", i, c, out.detail);
    cr_assert_neq(id, 0, "site %zu, entry %d: the planner's answer stored", i, c);
    cr_assert_eq(memo.known, 0);
    struct apk_plan k;
    apk_normal(&memo.tmpl[id - 1], &k);
    size_t j = 0;
    while (j < ap_known_nplans && !apk_same(&k, &ap_known_plans[j]))
        j++;
    cr_assert_lt(j, ap_known_nplans,
                 "site %zu, entry %d: the planner's template is not in known_plans.c "
                 "(print it again: known_plans_gen > altpatch/src/known_plans.c)%s",
                 i, c, AP_KNOWN_OTHER_CC);
    cr_assert_lt(j, sizeof(met) / sizeof(met[0]));
    met[j] = true;
    ap_memo_free(&memo);
}

Test(known, the_table_is_the_planner_s_templates, .init = setup, .fini = teardown)
{
    size_t n = each_answer(planner_template_in_table);
    cr_assert_geq(n, 13, "answers looked at: %zu", n);
    for (size_t j = 0; j < ap_known_nplans; j++)
        cr_assert(met[j], "known_plans.c entry %zu is no template of this program's sites%s", j,
                  AP_KNOWN_OTHER_CC);
}

static void same_answer(size_t i, const struct ap_site *s, const struct ap_entry *e, int c,
                        const struct altpatch_features *fs)
{
    static struct ap_plan a, b;
    struct ap_memo ma, mb;
    const uint8_t *orig = (const uint8_t *)(uintptr_t)s->addr;
    ap_memo_init(&ma, fs);
    ap_memo_init(&mb, fs);
    memset(&a, 0x5a, sizeof(a));
    memset(&b, 0xa5, sizeof(b));
    ap_known_plans_off = true;
    ap_memo_plan(&ma, &m->view, s, e, orig, fs, &a);
    ap_known_plans_off = false;
    uint32_t id = ap_memo_plan(&mb, &m->view, s, e, orig, fs, &b);
    cr_assert_eq(a.reason, ALTPATCH_REASON_NONE, "site %zu, entry %d: %s", i, c, a.detail);
    cr_assert_eq(b.reason, a.reason, "site %zu, entry %d", i, c);
    cr_assert_eq(b.chosen, c, "site %zu: entry %d, not %d", i, b.chosen, c);
    cr_assert_eq(b.chosen, a.chosen);
    cr_assert_eq(b.len, a.len);
    cr_assert_eq(b.relative, a.relative);
    cr_assert_arr_eq(b.final, a.final, a.len, "site %zu, entry %d: final bytes", i, c);
    cr_assert_arr_eq(b.orig, a.orig, a.len);
    cr_assert_eq(ma.misses, 1);
    cr_assert_eq(mb.misses + mb.known, 1);
    /* the template taken answers the next site of the shape as a stored one */
    if (mb.known) {
        cr_assert_neq(id, 0);
        cr_assert_eq(ap_memo_find(&mb, &m->view, s, e, orig), id, "site %zu, entry %d", i, c);
    }
    ap_memo_free(&ma);
    ap_memo_free(&mb);
}

static size_t known_taken;

static void counted(size_t i, const struct ap_site *s, const struct ap_entry *e, int c,
                    const struct altpatch_features *fs)
{
    struct ap_memo mb;
    struct ap_plan b;
    ap_memo_init(&mb, fs);
    ap_memo_plan(&mb, &m->view, s, e, (const uint8_t *)(uintptr_t)s->addr, fs, &b);
    cr_assert_eq(mb.known, 1, "site %zu, entry %d: planned, not from the table%s", i, c,
                 AP_KNOWN_OTHER_CC);
    known_taken++;
    ap_memo_free(&mb);
}

Test(known, every_answer_the_same_with_the_table, .init = setup, .fini = teardown)
{
    cr_assert_geq(each_answer(same_answer), 13);
}

Test(known, no_primitive_planned, .init = setup, .fini = teardown)
{
    size_t n = each_answer(counted);
    cr_assert_eq(known_taken, n);
}

/* The table off: the planner answers every primitive again. */
Test(known, the_switch_turns_it_off, .init = setup, .fini = teardown)
{
    struct ap_site_entries eb;
    const struct ap_site *s;
    const struct ap_entry *e = ap_module_site_entries(m, 0, &eb, &s);
    struct altpatch_features fs;
    int c = s->count ? 0 : -1;
    cr_assert(apk_set_for(&m->view, s, e, c, &fs));
    struct ap_memo memo;
    struct ap_plan out;
    ap_memo_init(&memo, &fs);
    ap_known_plans_off = true;
    ap_memo_plan(&memo, &m->view, s, e, (const uint8_t *)(uintptr_t)s->addr, &fs, &out);
    cr_assert_eq(memo.known, 0);
    cr_assert_eq(memo.misses, 1);
    ap_memo_free(&memo);
}

/*
 * The apply path: this program's decoder calls counted (the library's calls
 * to Zydis's decoder bind to this definition, which forwards to Zydis's).
 * Its sites are all primitives, so a first apply decodes nothing; without
 * the table it decodes. A dry run under a set of the test's own, in a
 * forked child each (the memo lives as long as the process): what each site
 * chooses follows from the set, not from this CPU, and nothing is written.
 */
#include <Zydis/Zydis.h>
#include <dlfcn.h>

#include "ap_isolate.h"

static unsigned decodes;

ZyanStatus ZydisDecoderDecodeInstruction(const ZydisDecoder *d, ZydisDecoderContext *ctx,
                                         const void *buffer, ZyanUSize length,
                                         ZydisDecodedInstruction *insn)
{
    static ZyanStatus (*real)(const ZydisDecoder *, ZydisDecoderContext *, const void *,
                              ZyanUSize, ZydisDecodedInstruction *);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "ZydisDecoderDecodeInstruction");
    decodes++;
    return real ? real(d, ctx, buffer, length, insn) : ZYAN_STATUS_FAILED;
}

struct apply_res {
    int rc;
    unsigned decodes;
    struct altpatch_stats st;
};

static void apply_body(void *out, void *ctx)
{
    struct apply_res *r = out;
    struct altpatch_features *fs = altpatch_features_new();
    if (!fs) {
        r->rc = -ENOMEM;
        return;
    }
    /* every entry of ap_every_primitive.h's sites applies but the fence's
     * (ALT_NOT(APIC_MSRS_FENCE): not set, so it applies too) and the
     * ALT_NOT(ALWAYS) call's: 7 of its 8 sites would be replaced */
    static const unsigned set[] = {X86_FEATURE_ALWAYS, X86_FEATURE_FSGSBASE, X86_FEATURE_RDPID,
                                   X86_FEATURE_LFENCE_RDTSC, X86_FEATURE_RDTSCP};
    for (size_t k = 0; k < sizeof(set) / sizeof(set[0]); k++)
        altpatch_features_set(fs, set[k]);
    ap_known_plans_off = ctx != NULL;
    decodes = 0;
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = fs,
                                    .flags = ALTPATCH_APPLY_DRY_RUN};
    r->rc = altpatch_apply_opts(&o);
    r->decodes = decodes;
    r->st.sz = sizeof(r->st);
    if (altpatch_get_stats(&r->st))
        r->st.sz = 0;
    altpatch_features_free(fs);
}

Test(known, a_first_apply_of_primitives_decodes_nothing)
{
    struct apply_res *r = ap_isolated(sizeof(*r), apply_body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->st.sz, sizeof(r->st));
    cr_assert_eq(r->st.sites_seen, 8, "sites %llu", (unsigned long long)r->st.sites_seen);
    cr_assert_eq(r->st.sites_patched, 7, "would be replaced: %llu",
                 (unsigned long long)r->st.sites_patched);
    cr_assert_eq(r->st.sites_refused, 0);
    cr_assert_eq(r->decodes, 0, "%u instructions decoded", r->decodes);
    struct apply_res *off = ap_isolated(sizeof(*off), apply_body, (void *)1);
    cr_assert_eq(off->rc, 0);
    cr_assert_gt(off->decodes, 0, "without the table the planner decodes");
    cr_assert_eq(off->st.sites_patched, 7);
    cr_assert_eq(off->st.sites_refused, 0);
}
