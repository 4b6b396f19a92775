/* SPDX-License-Identifier: MIT */
/*
 * Sites of five bytes that ALWAYS patches: mov $1,%eax becomes mov $2,%eax,
 * so that a function of N of them returns 1 unpatched and 2 patched, and the
 * bytes of each state (and of a foreign third, mov $3,%eax) can be told in
 * memory. AP_MOV_SITES("N") is the asm text of N of them (inside an asm
 * statement whose output is "=a").
 */
#ifndef AP_TEST_MOV_SITES_H
#define AP_TEST_MOV_SITES_H

#include <altpatch/alternative.h>

#define AP_MOV_STR2(x) #x
#define AP_MOV_STR(x) AP_MOV_STR2(x)
#define AP_MOV_SITES(n)                                                                        \
    ".rept " n "\n" ALTERNATIVE("mov $1,%%eax", "mov $2,%%eax", X86_FEATURE_ALWAYS) ".endr\n"

static const unsigned char ap_mov_orig[5] = {0xb8, 1, 0, 0, 0};
static const unsigned char ap_mov_repl[5] = {0xb8, 2, 0, 0, 0};
static const unsigned char ap_mov_foreign[5] = {0xb8, 3, 0, 0, 0};

#endif
