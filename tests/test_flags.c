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
#include "internal.h"

/* ---- a site of 130 entries ------------------------------------------------ */

#define WIDE_N 130

/* One site, WIDE_N entries, every one ALWAYS: the last (index WIDE_N-1) wins. */
__attribute__((noinline)) static long site_wide(void)
{
    long v;
    __asm__ __volatile__(ALTPATCH_NOTE_
                         "771:\n\tmovl $1, %%eax\n772:\n773:\n"
                         ".rept " ALTPATCH_STR(WIDE_N) "\n"
                         ALTPATCH_ENTRY_(X86_FEATURE_ALWAYS)
                         ALTPATCH_REPLACEMENT_("movl $2, %%eax")
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
