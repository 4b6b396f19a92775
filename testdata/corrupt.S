/* SPDX-License-Identifier: MIT */
/*
 * libapfix_corrupt.so: three valid sites next to one record per kind of
 * corruption (see README.md for the list and the expected reasons). Every
 * record is an exported data symbol apfix_rec_<name>; the site address is
 * &rec + rec.instr_offset. Only apfix_valid_* are meant to be called.
 */
#include "corrupt_common.inc"

    APFIX_NOTE 1, 14

    .text
    /* Distance to altinstr_replacement, wherever the linker puts it, so that
     * the rel8 of .Lr_rel8 cannot reach its target from apfix_site_rel8. */
    .skip 256, 0xcc

APFIX_FUNC apfix_valid_mov              /* 1, or 2 once patched */
.Lv_mov:
    movl $1, %eax
    ret
    .size apfix_valid_mov, . - apfix_valid_mov

APFIX_FUNC apfix_valid_call             /* 10, or 20 once patched (rel32 relocated) */
.Lv_call:
    call .Limpl_a
    ret
    .size apfix_valid_call, . - apfix_valid_call

APFIX_FUNC apfix_valid_not              /* ALT_NOT(ALWAYS): stays 3 */
.Lv_not:
    movl $3, %eax
    ret
    .size apfix_valid_not, . - apfix_valid_not

.Limpl_a:
    movl $10, %eax
    ret
.Limpl_b:
    movl $20, %eax
    ret

    /* Sites of the corrupt records: never executed. */
    ud2
apfix_site_repl_text:   movl $1, %eax
apfix_site_repl_past:   movl $1, %eax
                 .byte 0x90, 0x90, 0x90, 0x90, 0x90
apfix_site_too_long:    movl $1, %eax
apfix_site_orig_bad:    .byte 0x06, 0x90, 0x90, 0x90, 0x90
apfix_site_repl_bad:    movl $1, %eax
apfix_site_cross:       movl $1, %eax
apfix_site_repl_cross:  movl $1, %eax
apfix_site_rel8:        movl $1, %eax
apfix_site_feature:     movl $1, %eax
apfix_site_empty:       nop
apfix_site_overlap:     .byte 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90
apfix_site_repl_src:    movl $1, %eax
    ud2
    .skip 256, 0xcc
    /* The last 2 bytes of .text: GNU ld puts altinstr_replacement right after. */
apfix_site_past_text: .byte 0x66, 0x90

    .section .rodata, "a"
.Ld_site:        .byte 0xb8, 0x01, 0x00, 0x00, 0x00

    .section altinstr_replacement, "axR"
.Lr_mov2:        movl $2, %eax
.Lr_callb:       call .Limpl_b
.Lr_mov4:        movl $4, %eax
.Lr_long:        .byte 0x48, 0xc7, 0xc0, 0x02, 0x00, 0x00, 0x00   /* movq $2, %rax: 7 bytes */
.Lr_bad:         .byte 0x06
.Lr_nop1:        nop
.Lr_rel8:        .byte 0xeb, 0x10                                  /* jmp .+18, outside */
                 .skip 16, 0xcc
.Lr_nop2:        .byte 0x66, 0x90
.Lr_past:        .byte 0xb8, 0x02, 0x00                            /* last bytes of the section */

    /* Valid sites, patched under ALWAYS. */
    APFIX_REC apfix_rec_valid_mov, .Lv_mov, .Lr_mov2, APFIX_ALWAYS, 5, 5
    APFIX_REC apfix_rec_valid_call, .Lv_call, .Lr_callb, APFIX_ALWAYS, 5, 5
    APFIX_REC apfix_rec_valid_not, .Lv_not, .Lr_mov4, APFIX_NOT(APFIX_ALWAYS), 5, 5
    /* SITE_BOUNDS: 256 MiB before / after the record, in .rodata, in altinstr_replacement. */
    APFIX_REC_RAW apfix_rec_site_below, -0x10000000, .Lr_mov2, APFIX_ALWAYS, 5, 5
    APFIX_REC_RAW apfix_rec_site_above, 0x10000000, .Lr_mov2, APFIX_ALWAYS, 5, 5
    APFIX_REC apfix_rec_site_data, .Ld_site, .Lr_mov2, APFIX_ALWAYS, 5, 5
    APFIX_REC apfix_rec_site_in_repl, .Lr_long, .Lr_mov2, APFIX_ALWAYS, 7, 5
    /* SITE_BOUNDS: a 10-byte site of which only 2 bytes are in .text. */
    APFIX_REC apfix_rec_site_past_text, apfix_site_past_text, .Lr_mov2, APFIX_ALWAYS, 10, 5
    /* REPL_BOUNDS: replacement in .text; replacement running past the section end. */
    APFIX_REC apfix_rec_repl_text, apfix_site_repl_text, apfix_site_repl_src, APFIX_ALWAYS, 5, 5
    APFIX_REC apfix_rec_repl_past, apfix_site_repl_past, .Lr_past, APFIX_ALWAYS, 10, 10
    /* REPL_TOO_LONG: 7-byte replacement, 5-byte site. */
    APFIX_REC apfix_rec_too_long, apfix_site_too_long, .Lr_long, APFIX_ALWAYS, 5, 7
    /* ORIG_UNDECODABLE: 0x06 (push %es) is invalid in 64-bit mode. */
    APFIX_REC apfix_rec_orig_bad, apfix_site_orig_bad, .Lr_mov2, APFIX_ALWAYS, 5, 5
    /* REPL_UNDECODABLE */
    APFIX_REC apfix_rec_repl_bad, apfix_site_repl_bad, .Lr_bad, APFIX_ALWAYS, 5, 1
    /* ORIG_CROSSES_END: the 5-byte mov with instrlen 3. */
    APFIX_REC apfix_rec_cross, apfix_site_cross, .Lr_nop1, APFIX_ALWAYS, 3, 1
    /* REPL_CROSSES_END: the 5-byte mov with replacementlen 3. */
    APFIX_REC apfix_rec_repl_cross, apfix_site_repl_cross, .Lr_mov2, APFIX_ALWAYS, 5, 3
    /* RELOC_OVERFLOW: a rel8 jmp to a target outside the replacement, too far from the site. */
    APFIX_REC apfix_rec_rel8, apfix_site_rel8, .Lr_rel8, APFIX_ALWAYS, 5, 2
    /* UNKNOWN_FEATURE: id 1000. */
    APFIX_REC apfix_rec_feature, apfix_site_feature, .Lr_mov2, 1000, 5, 5
    /* EMPTY_SITE: instrlen 0. */
    APFIX_REC apfix_rec_empty, apfix_site_empty, .Lr_nop1, APFIX_ALWAYS, 0, 0
    /* SITE_OVERLAP: [x, x+5) and [x+2, x+7). */
    APFIX_REC apfix_rec_overlap1, apfix_site_overlap, .Lr_nop2, APFIX_ALWAYS, 5, 2
    APFIX_REC apfix_rec_overlap2, apfix_site_overlap + 2, .Lr_nop2, APFIX_ALWAYS, 5, 2

    .section .note.GNU-stack, "", @progbits
