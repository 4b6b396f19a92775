/* SPDX-License-Identifier: MIT */
/*
 * libapfix_badtable.so: a table of 31 bytes (2 records + 3 stray bytes, not a
 * multiple of 14). The whole module must be refused (BAD_TABLE): its valid
 * looking site stays original, apfix_bt_fn() keeps returning 1.
 */
#include "corrupt_common.inc"

    APFIX_NOTE 1, 14

    .text
APFIX_FUNC apfix_bt_fn
.Lb_site:
    movl $1, %eax
    ret
    .size apfix_bt_fn, . - apfix_bt_fn

    .section altinstr_replacement, "axR"
.Lb_repl:
    movl $2, %eax

    APFIX_REC apfix_rec_bt_1, .Lb_site, .Lb_repl, APFIX_ALWAYS, 5, 5
    APFIX_REC apfix_rec_bt_2, .Lb_site, .Lb_repl, APFIX_ALWAYS, 5, 5
    .pushsection altinstructions, "aR"
    .byte 0x01, 0x02, 0x03
    .popsection

    .section .note.GNU-stack, "", @progbits
