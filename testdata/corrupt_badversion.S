/* SPDX-License-Identifier: MIT */
/*
 * libapfix_badversion.so: a note with format version 99. The whole module
 * must be refused (BAD_VERSION): its site stays original, apfix_bv_fn()
 * keeps returning 1.
 */
#include "corrupt_common.inc"

    APFIX_NOTE 99, 14

    .text
APFIX_FUNC apfix_bv_fn
.Lv_site:
    movl $1, %eax
    ret
    .size apfix_bv_fn, . - apfix_bv_fn

    .section altinstr_replacement, "axR"
.Lv_repl:
    movl $2, %eax

    APFIX_REC apfix_rec_bv, .Lv_site, .Lv_repl, APFIX_ALWAYS, 5, 5

    .section .note.GNU-stack, "", @progbits
