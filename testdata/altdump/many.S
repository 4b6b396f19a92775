/* SPDX-License-Identifier: MIT */
/*
 * altdump fixture: 20 functions, each in its own section (as with
 * -ffunction-sections), each with one site whose replacement calls a helper
 * in the same section. More executable sections than struct ap_view holds:
 * altdump merges them into one region for the .o; the .so links them into
 * one .text. Both must give the same sites.
 */
#include "altsites.inc"

    ALT_NOTE

.irp i, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19
    .section .text.f\i, "ax", @progbits
    .globl f\i
    .hidden f\i
    .type f\i, @function
f\i:
    ALT1 \i, "movl $\i, %eax", "call g\i", 293
    ret
g\i:
    movl $1\i, %eax
    ret
    .size f\i, . - f\i
.endr

    .section .note.GNU-stack, "", @progbits
