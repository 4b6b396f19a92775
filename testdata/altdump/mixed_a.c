/* SPDX-License-Identifier: MIT */
/*
 * Half of altdump_mixed: a format-3 object (the default), linked first, so
 * that its note is the one the linker keeps. See mixed_main.c.
 */
#include <altpatch/alternative.h>

int mixed_a(void);

__attribute__((noinline)) int mixed_a(void)
{
    int v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %0", "movl $2, %0", X86_FEATURE_ALWAYS)
                         : "=r"(v));
    return v;
}
