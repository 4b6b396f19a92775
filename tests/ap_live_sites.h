/* SPDX-License-Identifier: MIT */
/* Two sites whose values tell original, patched and torn apart (live tests). */
#ifndef AP_TEST_LIVE_SITES_H
#define AP_TEST_LIVE_SITES_H

#include <altpatch/alternative.h>

/* One instruction: 1, or 2 once patched. */
__attribute__((noinline)) static long site_one(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", X86_FEATURE_ALWAYS)
                         : "=a"(v));
    return v;
}

/* Two instructions: 11, or 22 once patched (12 or 21 = torn). */
__attribute__((noinline)) static long site_pair(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %%eax\n\taddl $10, %%eax",
                                     "movl $2, %%eax\n\taddl $20, %%eax", X86_FEATURE_ALWAYS)
                         : "=a"(v)
                         :
                         : "cc");
    return v;
}

#endif /* AP_TEST_LIVE_SITES_H */
