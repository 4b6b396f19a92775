/* SPDX-License-Identifier: MIT */
/*
 * Shared-library fixture with its own sites, built four times:
 *   libapfix_linked.so  (APFIX_MOD=linked) linked into test_modules (DT_NEEDED)
 *   libapfix_dl.so      (APFIX_MOD=dl)     dlopen'ed by test_modules
 *   libapfix_big.so     (APFIX_MOD=big, APFIX_TSC=3) dlopen'ed by test_modules:
 *                       more records than the others (three more sites, two
 *                       records each)
 *   libapfix_shapes.so  (APFIX_MOD=shapes, APFIX_TSC=1, APFIX_ONE_CALL) dlopen'ed by
 *                       test_modules: more records than libapfix_linked.so, no two
 *                       sites of one shape (no _call2)
 * Exported: apfix_<mod>_call(x)  ALTPATCH_ALT_CALL(old, new, ALWAYS): x+1 / x+2
 *           apfix_<mod>_call2(x) the same with hidden (non-static) targets: x+3 / x+4
 *           apfix_<mod>_fs()     altpatch_fs_self()
 *           apfix_<mod>_fence()  altpatch_weak_fence()
 *           apfix_<mod>_calls(n) the (old, new, ft_flags) pair for ap_expect.h
 *           apfix_<mod>_tsc()    with APFIX_TSC=N: the sum of N altpatch_rdtsc_ordered()
 *                                sites (two records each)
 * The ALT_CALL targets are local to the library (static, or hidden globals),
 * as primitives.h requires in position-independent code.
 */
#include "ap_expect.h"

#define APFIX_CAT_(a, b, c) a##b##c
#define APFIX_CAT(a, b, c) APFIX_CAT_(a, b, c)
#define APFIX_FN(name) APFIX_CAT(apfix_, APFIX_MOD, name)
#define APFIX_EXPORT __attribute__((visibility("default")))

static long old_impl(long x) { return x + 1; }
static long new_impl(long x) { return x + 2; }

APFIX_EXPORT long APFIX_FN(_call)(long x)
{
    return ALTPATCH_ALT_CALL(old_impl, new_impl, X86_FEATURE_ALWAYS, x);
}

#ifndef APFIX_ONE_CALL
__attribute__((visibility("hidden"))) long APFIX_FN(_old2)(long x) { return x + 3; }
__attribute__((visibility("hidden"))) long APFIX_FN(_new2)(long x) { return x + 4; }

APFIX_EXPORT long APFIX_FN(_call2)(long x)
{
    return ALTPATCH_ALT_CALL(APFIX_FN(_old2), APFIX_FN(_new2), X86_FEATURE_ALWAYS, x);
}
#endif

APFIX_EXPORT void *APFIX_FN(_fs)(void) { return altpatch_fs_self(); }

APFIX_EXPORT void APFIX_FN(_fence)(void) { altpatch_weak_fence(); }

APFIX_EXPORT const struct apx_call *APFIX_FN(_calls)(size_t *n)
{
    static struct apx_call c[2];
    c[0] = (struct apx_call){(uintptr_t)old_impl, (uintptr_t)new_impl, X86_FEATURE_ALWAYS};
#ifdef APFIX_ONE_CALL
    *n = 1;
#else
    c[1] = (struct apx_call){(uintptr_t)APFIX_FN(_old2), (uintptr_t)APFIX_FN(_new2),
                             X86_FEATURE_ALWAYS};
    *n = 2;
#endif
    return c;
}

#ifdef APFIX_TSC
#define APFIX_TSC_ONE() (t += altpatch_rdtsc_ordered())
APFIX_EXPORT uint64_t APFIX_FN(_tsc)(void)
{
    uint64_t t = 0;
#if APFIX_TSC >= 1
    APFIX_TSC_ONE();
#endif
#if APFIX_TSC >= 2
    APFIX_TSC_ONE();
#endif
#if APFIX_TSC >= 3
    APFIX_TSC_ONE();
#endif
#if APFIX_TSC > 3
#error "APFIX_TSC: at most 3"
#endif
    return t;
}
#endif
