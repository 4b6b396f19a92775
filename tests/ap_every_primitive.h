/* SPDX-License-Identifier: MIT */
/*
 * One site of every primitive of <altpatch/primitives.h>, and ALT_CALL
 * sites under a plain, a negated and another feature, in a program that includes
 * this header once: the shapes the library knows (known_plans.c) are those
 * of these sites. Used by tests/known_plans_gen.c, which prints the table,
 * and tests/test_known.c, which checks it.
 */
#ifndef AP_EVERY_PRIMITIVE_H
#define AP_EVERY_PRIMITIVE_H

#include <altpatch/primitives.h>

#include <stdint.h>

__attribute__((visibility("hidden"), noinline)) long apx_every_old(long x) { return x + 1; }
__attribute__((visibility("hidden"), noinline)) long apx_every_new(long x) { return x + 2; }

/* Every primitive once (each a site of the program's table); the sum keeps
 * each result live. Never called: altpatch_gs_self() needs a GS block
 * installed (altpatch_gs_install()). */
__attribute__((noinline, used)) uintptr_t apx_every_primitive(long x)
{
    uintptr_t r = 0;
    altpatch_weak_fence();
    r += (uintptr_t)altpatch_gs_self();
    r += (uintptr_t)altpatch_fs_self();
    r += altpatch_getcpu();
    r += (uintptr_t)altpatch_rdtsc_ordered();
    r += (uintptr_t)ALTPATCH_ALT_CALL(apx_every_old, apx_every_new, X86_FEATURE_ALWAYS, x);
    r += (uintptr_t)ALTPATCH_ALT_CALL(apx_every_old, apx_every_new, ALT_NOT(X86_FEATURE_ALWAYS),
                                      x);
    /* the same shape under another feature: the table keys it without one */
    r += (uintptr_t)ALTPATCH_ALT_CALL(apx_every_old, apx_every_new, X86_FEATURE_FSGSBASE, x);
    return r;
}

#endif
