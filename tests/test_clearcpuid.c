/* SPDX-License-Identifier: MIT */
/*
 * ALTPATCH_CLEARCPUID never removes ALWAYS ("ALWAYS is in every set"): the
 * name (or its decimal id) is refused with a warning, the other names of the
 * list still apply, altpatch_cpu_has(ALWAYS) stays true, and after apply an
 * ALWAYS site holds its replacement while an ALT_NOT(ALWAYS) site keeps its
 * original.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"
#include "ap_warnlog.h"
#include "host.h"

static __attribute__((noinline)) int site_always(void)
{
    int v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %0", "movl $2, %0", X86_FEATURE_ALWAYS) : "=r"(v));
    return v;
}

static __attribute__((noinline)) int site_not_always(void)
{
    int v;
    __asm__ __volatile__(ALTERNATIVE("movl $3, %0", "movl $4, %0", ALT_NOT(X86_FEATURE_ALWAYS))
                         : "=r"(v));
    return v;
}

static int warned_about(const char *item)
{
    char want[64];
    snprintf(want, sizeof(want), "'%s' cannot be cleared", item);
    return strstr(ap_warn_log, want) != NULL;
}

Test(clearcpuid, always_is_refused_with_a_warning)
{
    altpatch_set_print(ap_warn_capture);
    struct altpatch_features f = *ap_host_features();
    cr_assert(ap_features_test(&f, X86_FEATURE_ALWAYS));
    cr_assert(ap_features_test(&f, X86_FEATURE_LM), "every x86-64 CPU has LM");
    ap_warn_log[0] = '\0';
    cr_assert_eq(ap_clearcpuid(&f, "ALWAYS,lm, 117"), 1, "only lm is cleared");
    cr_assert(ap_features_test(&f, X86_FEATURE_ALWAYS));
    cr_assert(!ap_features_test(&f, X86_FEATURE_LM));
    cr_assert(warned_about("ALWAYS"), "%s", ap_warn_log);
    cr_assert(warned_about("117"), "%s", ap_warn_log);
    altpatch_set_print(NULL);
}

Test(clearcpuid, cpu_has_keeps_always)
{
    altpatch_set_print(ap_warn_capture);
    ap_warn_log[0] = '\0';
    cr_assert_eq(setenv("ALTPATCH_CLEARCPUID", "always,lm", 1), 0);
    cr_assert(altpatch_cpu_has(X86_FEATURE_ALWAYS));
    cr_assert(!altpatch_cpu_has(X86_FEATURE_LM));
    cr_assert_eq(ap_warn_log[0], '\0', "a query stays quiet: %s", ap_warn_log);
    struct altpatch_features eff;
    ap_effective_features(&eff);
    cr_assert(ap_features_test(&eff, X86_FEATURE_ALWAYS));
    cr_assert(warned_about("always"), "%s", ap_warn_log);
    altpatch_set_print(NULL);
}

struct res {
    int rc;
    int before_always, before_not;
    int after_always, after_not;
    int warned;
};

static void body_apply(void *out, void *ctx)
{
    struct res *r = out;
    (void)ctx;
    altpatch_set_print(ap_warn_capture);
    ap_warn_log[0] = '\0';
    setenv("ALTPATCH_CLEARCPUID", "always", 1);
    r->before_always = site_always();
    r->before_not = site_not_always();
    r->rc = altpatch_apply();
    r->after_always = site_always();
    r->after_not = site_not_always();
    r->warned = warned_about("always");
}

Test(clearcpuid, apply_keeps_always)
{
    struct res *r = ap_isolated(sizeof(*r), body_apply, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->before_always, 1);
    cr_assert_eq(r->before_not, 3);
    cr_assert_eq(r->after_always, 2, "the ALWAYS site was not patched");
    cr_assert_eq(r->after_not, 3, "the ALT_NOT(ALWAYS) site was patched");
    cr_assert(r->warned, "apply did not warn about 'always'");
}
