/* SPDX-License-Identifier: MIT */
/*
 * A library loaded after the program's first apply (test_undo): one refused
 * site (its original does not decode), jumped over, below UNDO_LIB_N sites of
 * mov $1,%eax that ALWAYS patches to mov $2,%eax, between the labels
 * undo_lib_lo and undo_lib_hi.
 */
#include <altpatch/alternative.h>

#define UNDO_LIB_N 16
#define UL_STR_(x) #x
#define UL_STR(x) UL_STR_(x)

__attribute__((visibility("default"))) int undo_lib_sites(void)
{
    int r;
    __asm__ __volatile__("jmp undo_lib_past_bad\n" ALTERNATIVE(
                             ".byte 0xd6", "nop", X86_FEATURE_ALWAYS) "undo_lib_past_bad:\n"
                         ".globl undo_lib_lo\n"
                         "undo_lib_lo:\n"
                         ".rept " UL_STR(UNDO_LIB_N) "\n" ALTERNATIVE(
                             "mov $1,%%eax", "mov $2,%%eax", X86_FEATURE_ALWAYS) ".endr\n"
                         ".globl undo_lib_hi\n"
                         "undo_lib_hi:\n"
                         : "=a"(r)::"memory");
    return r;
}
