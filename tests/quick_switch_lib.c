/* SPDX-License-Identifier: MIT */
/*
 * A library with one site between the labels qs_lib_lo and qs_lib_hi:
 * mov $1,%eax, which ALWAYS patches to mov $2,%eax (test_quick_switch).
 */
#include <altpatch/alternative.h>

__attribute__((visibility("default"))) int qs_lib_site(void)
{
    int r;
    __asm__ __volatile__(".globl qs_lib_lo\n"
                         "qs_lib_lo:\n" ALTERNATIVE("mov $1,%%eax", "mov $2,%%eax",
                                                    X86_FEATURE_ALWAYS) ".globl qs_lib_hi\n"
                                                                        "qs_lib_hi:\n"
                         : "=a"(r)::"memory");
    return r;
}
