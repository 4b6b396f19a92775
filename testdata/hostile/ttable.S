/* SPDX-License-Identifier: MIT */
/*
 * libaphost_ttable.so: a record table in .text, as a layout that puts
 * read-only data in the executable segment gives it (ld -z noseparate-code;
 * see README.md). aph_ttable_fn's record is valid; the second record's site
 * is the upper half of the first record's instr_offset (bytes 00 00, which
 * decode as `add %al,(%rax)`), replaced by `int3; int3` under ALWAYS. Written,
 * it would move the first site ~850 MB away for every later read of the
 * table. The second site must be refused (SITE_BOUNDS) and the table never
 * change; the first is patched (aph_ttable_fn() returns 2).
 */
#include "hostile.inc"

    APH_NOTE ts=.Laph_ttable_start, te=.Laph_ttable_end
    /* the note macro names these sections' bounds: one byte of each */
    .pushsection altinstructions, "aR"
    .byte 0
    .popsection

    .text
    .balign 16
    .globl aph_ttable_start
aph_ttable_start:
.Laph_ttable_start:
    .long .Laph_ttable_site - .
    .long .Laph_ttable_repl - .
    .long APH_ALWAYS
    .byte 5
    .byte 5
    .long (.Laph_ttable_start + 2) - .
    .long .Laph_ttable_repl1 - .
    .long APH_ALWAYS
    .byte 2
    .byte 2
.Laph_ttable_end:

    .balign 16
    .globl aph_ttable_fn
    .type aph_ttable_fn, @function
aph_ttable_fn:
.Laph_ttable_site:
    movl $1, %eax
    ret
    .size aph_ttable_fn, . - aph_ttable_fn

    .pushsection altinstr_replacement, "axR"
.Laph_ttable_repl:
    movl $2, %eax
.Laph_ttable_repl1:
    int3
    int3
    .popsection

    .section .note.GNU-stack, "", @progbits
