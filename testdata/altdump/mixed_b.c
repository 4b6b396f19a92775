/* SPDX-License-Identifier: MIT */
/*
 * Half of altdump_mixed: a format-1 object (14-byte records in
 * altinstructions), as built with earlier headers. See mixed_main.c.
 */
#define ALTPATCH_KERNEL_RECORDS
#define ALTPATCH_UNSHARED_REPLACEMENTS
#include <altpatch/alternative.h>

int mixed_b(void);

__attribute__((noinline)) int mixed_b(void)
{
    int v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %0", "movl $2, %0", X86_FEATURE_ALWAYS)
                         : "=r"(v));
    return v;
}
