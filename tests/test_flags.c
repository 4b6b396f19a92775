/* SPDX-License-Identifier: MIT */
/*
 * Record flags and wide sites:
 *   - the planner refuses an entry whose flags carry bits other than
 *     ALT_FLAG_NOT (e.g. the kernel's ALT_FLAG_DIRECT_CALL) instead of
 *     planning it as a plain replacement (ALTPATCH_REASON_UNKNOWN_FLAGS);
 *   - a site of more than 127 entries reports the chosen entry's index
 *     (not -1) through altpatch_site_foreach().
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <string.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"
#include "host.h"

/* ---- planner: unknown flag bits ------------------------------------------ */

/* Site: 5-byte mov at S; replacement: 5-byte mov at R. */
#define S_ADDR 0x1000u
#define R_ADDR 0x2000u
static const uint8_t ORIG[5] = {0xb8, 1, 0, 0, 0};
static const uint8_t REPL[5] = {0xb8, 2, 0, 0, 0};

static void make_view(struct ap_view *v)
{
    memset(v, 0, sizeof(*v));
    v->text[0] = (struct ap_region){S_ADDR, sizeof(ORIG), ORIG};
    v->ntext = 1;
    v->repl = (struct ap_region){R_ADDR, sizeof(REPL), REPL};
}

static void plan_with_flags(uint16_t flags, struct ap_plan *out)
{
    struct ap_view v;
    make_view(&v);
    struct ap_entry e = {.site = S_ADDR, .repl = R_ADDR, .feature = X86_FEATURE_ALWAYS,
                         .flags = flags, .instrlen = 5, .repllen = 5};
    struct ap_site s = {.addr = S_ADDR, .first = 0, .count = 1, .len = 5};
    struct altpatch_features fs;
    memset(&fs, 0, sizeof(fs));
    fs.word[X86_FEATURE_ALWAYS / 32] |= 1u << (X86_FEATURE_ALWAYS % 32);
    ap_plan_site(&v, &s, &e, NULL, &fs, out);
}

Test(flags, no_flags_is_planned)
{
    struct ap_plan p;
    plan_with_flags(0, &p);
    cr_assert_eq(p.reason, ALTPATCH_REASON_NONE, "reason %d", p.reason);
    cr_assert_eq(p.chosen, 0);
    cr_assert_arr_eq(p.final, REPL, 5);
}

Test(flags, not_flag_is_known)
{
    struct ap_plan p;
    plan_with_flags(ALT_FLAG_NOT, &p); /* ALWAYS is present: NOT keeps the original */
    cr_assert_eq(p.reason, ALTPATCH_REASON_NONE, "reason %d", p.reason);
    cr_assert_eq(p.chosen, -1);
    cr_assert_arr_eq(p.final, ORIG, 5);
}

Test(flags, unknown_flag_bits_refused)
{
    /* The kernel's ALT_FLAG_DIRECT_CALL is bit 1; bit 15 is unassigned. */
    static const uint16_t bad[] = {1u << 1, (1u << 1) | ALT_FLAG_NOT, 1u << 15, 0xfffe};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct ap_plan p;
        plan_with_flags(bad[i], &p);
        cr_assert_eq(p.reason, ALTPATCH_REASON_UNKNOWN_FLAGS, "flags 0x%x: reason %d", bad[i],
                     p.reason);
        cr_assert_eq(p.bad_entry, 0, "flags 0x%x", bad[i]);
        cr_assert_arr_eq(p.final, ORIG, 5, "flags 0x%x: final must be the original", bad[i]);
        cr_assert(p.detail[0], "flags 0x%x: a detail is given", bad[i]);
    }
}

Test(flags, strreason)
{
    cr_assert_str_eq(altpatch_strreason(ALTPATCH_REASON_UNKNOWN_FLAGS),
                     "unknown record flags");
    cr_assert_eq(ALTPATCH_REASON_LIVE_REALTIME + 1, ALTPATCH_REASON__COUNT,
                 "new reasons go at the end");
    cr_assert_lt(ALTPATCH_REASON_UNKNOWN_FLAGS, ALTPATCH_REASON_LIVE_NO_FLIP,
                 "existing values do not move");
}

/* ---- a site of 130 entries ------------------------------------------------ */

#define WIDE_N 130

/* One site, WIDE_N entries, every one ALWAYS: the last (index WIDE_N-1) wins. */
__attribute__((noinline)) static long site_wide(void)
{
    long v;
    __asm__ __volatile__(ALTPATCH_NOTE_
                         ALTPATCH_REPLACEMENT_("movl $2, %%eax")
                         "771:\n\tmovl $1, %%eax\n772:\n773:\n"
                         ".rept " ALTPATCH_STR(WIDE_N) "\n"
                         ALTPATCH_ENTRY_(X86_FEATURE_ALWAYS, "movl $2, %%eax")
                         ".endr\n"
                         : "=a"(v));
    return v;
}

struct wide_result {
    int rc, found, chosen, entries, state;
    long value;
};

static int wide_cb(const struct altpatch_site_info *si, void *ctx)
{
    struct wide_result *r = ctx;
    uintptr_t fn = (uintptr_t)site_wide;
    if (si->addr >= fn && si->addr < fn + 64 && !r->found) {
        r->found = 1;
        r->chosen = si->chosen;
        r->entries = (int)si->entries;
        r->state = si->state;
    }
    return 0;
}

static void wide_child(void *out, void *ctx)
{
    (void)ctx;
    struct wide_result *r = out;
    r->rc = altpatch_apply();
    altpatch_site_foreach(wide_cb, r);
    r->value = site_wide();
}

Test(flags, wide_site_chosen_index)
{
    struct wide_result *r = ap_isolated(sizeof(*r), wide_child, NULL);
    cr_assert_eq(r->rc, 0, "apply: %d", r->rc);
    cr_assert(r->found, "site listed");
    cr_assert_eq(r->entries, WIDE_N);
    cr_assert_eq(r->state, ALTPATCH_SITE_PATCHED);
    cr_assert_eq(r->chosen, WIDE_N - 1, "chosen %d", r->chosen);
    cr_assert_eq(r->value, 2);
}
