/* SPDX-License-Identifier: MIT */
/* A plugin that patches itself from its constructor (test_ctor). */
#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

int ctor_apply_result = 1;

__attribute__((constructor)) static void ctor_apply_init(void)
{
    ctor_apply_result = altpatch_apply();
}

int ctor_apply_site(void)
{
    int v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %0", "movl $2, %0", X86_FEATURE_ALWAYS) : "=r"(v));
    return v;
}
