/* SPDX-License-Identifier: MIT */
/*
 * altdump fixture: 500 sites in one function, each a movl replaced by a
 * call: a dump of a few hundred kilobytes, more than a pipe holds, whose
 * later lines still read the file's bytes.
 */
#include "altsites.inc"

    ALT_NOTE

    .text
    .globl wide
    .hidden wide
    .type wide, @function
wide:
.irp a, 1, 2, 3, 4, 5
.irp b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
.irp c, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
    ALT1 \a\b\c, "movl $\a\b\c, %eax", "call helper", 293
.endr
.endr
.endr
    ret
helper:
    movl $1, %eax
    ret
    .size wide, . - wide

    .section .note.GNU-stack, "", @progbits
