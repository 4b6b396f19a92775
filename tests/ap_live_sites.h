/* SPDX-License-Identifier: MIT */
/* Sites whose values tell original, patched and torn apart (live tests). */
#ifndef AP_TEST_LIVE_SITES_H
#define AP_TEST_LIVE_SITES_H

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include <stdint.h>
#include <string.h>

/* What altpatch_site_foreach() says of the first site of a function. */
struct site_view {
    uintptr_t addr;
    unsigned len;
    int state, reason;
    uint8_t cur[16], orig[16];
};

/* Keep @p s in @p v when it is the lowest site so far in the 64 bytes at @p fn. */
static inline void site_view_take(struct site_view *v, const struct altpatch_site_info *s,
                                  uintptr_t fn)
{
    if (s->addr >= fn && s->addr < fn + 64 && (!v->addr || s->addr < v->addr)) {
        v->addr = s->addr;
        v->len = s->len;
        v->state = s->state;
        v->reason = s->reason;
        memcpy(v->cur, s->current, s->len < 16 ? s->len : 16);
        memcpy(v->orig, s->original, s->len < 16 ? s->len : 16);
    }
}

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

__attribute__((used)) static long ap_live_five(void)
{
    return 5;
}

/* A call that is not the site's last instruction: 5, or 7 once patched. Its
 * return address lies inside the site, so the site is never patched live. */
__attribute__((noinline, unused)) static long site_callin(void)
{
    long v;
    __asm__ __volatile__("lea -128(%%rsp), %%rsp\n\t"
                         "push %%rbp\n\t"
                         "mov %%rsp, %%rbp\n\t"
                         "and $-16, %%rsp\n\t" ALTERNATIVE("call %P[fn]\n\tnop",
                                                           "movl $7, %%eax",
                                                           X86_FEATURE_ALWAYS)
                         "\n\tmov %%rbp, %%rsp\n\t"
                         "pop %%rbp\n\t"
                         "lea 128(%%rsp), %%rsp"
                         : "=a"(v)
                         : [fn] "i"(ap_live_five)
                         : "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "memory", "cc");
    return v;
}

#endif /* AP_TEST_LIVE_SITES_H */
