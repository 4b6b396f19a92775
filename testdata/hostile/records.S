/* SPDX-License-Identifier: MIT */
/*
 * libaphost_records.so: kinds of corrupt records that ../corrupt.S does not
 * carry (see README.md), next to two valid sites. Each record is the exported
 * data symbol aph_rec_<name>; its site is &rec + rec.instr_offset.
 */
#include "hostile.inc"

    APH_NOTE

    APH_VALID_FN aph_valid_a
    APH_VALID_FN aph_valid_b

    .text
    .skip 64, 0xcc
    /* Sites of the corrupt records: never executed. */
aph_site_repl_below:  movl $1, %eax
aph_site_repl_above:  movl $1, %eax
aph_site_repl_data:   movl $1, %eax
aph_site_nested:      movl $1, %eax
aph_site_call_bad:    .byte 0xe8           /* call rel32 cut after its opcode */
                      .byte 0x90, 0x90
    ud2
    .skip 64, 0xcc

    .section .rodata, "a"
.Ld_repl:   .byte 0xb8, 0x02, 0x00, 0x00, 0x00

    .section altinstr_replacement, "axR"
.Lr_mov2:   movl $2, %eax

    /* REPL_BOUNDS: replacement 256 MiB before / after the record. */
    APH_REC_RAW aph_rec_repl_below, aph_site_repl_below-., -0x10000000, APH_ALWAYS, 5, 5
    APH_REC_RAW aph_rec_repl_above, aph_site_repl_above-., 0x10000000, APH_ALWAYS, 5, 5
    /* REPL_BOUNDS: replacement in .rodata. */
    APH_REC aph_rec_repl_data, aph_site_repl_data, .Ld_repl, APH_ALWAYS, 5, 5
    /* SITE_BOUNDS: the site is this very record (altinstructions, not code). */
    APH_REC_RAW aph_rec_site_self, 0, .Lr_mov2-., APH_ALWAYS, 5, 5
    /* SITE_BOUNDS: instr_offset 0x7fffffff / -0x80000000 (the extremes of s32). */
    APH_REC_RAW aph_rec_site_max, 0x7fffffff, .Lr_mov2-., APH_ALWAYS, 5, 5
    APH_REC_RAW aph_rec_site_min, -0x80000000, .Lr_mov2-., APH_ALWAYS, 5, 5
    /* Nested entries, the second one corrupt (unknown feature): the whole site is refused. */
    APH_REC aph_rec_nested, aph_site_nested, .Lr_mov2, APH_ALWAYS, 5, 5
    APH_REC aph_rec_nested2, aph_site_nested, .Lr_mov2, 0xffff, 5, 5
    /* ORIG_CROSSES_END: a call rel32 cut after 3 of its 5 bytes by instrlen. */
    APH_REC aph_rec_call_bad, aph_site_call_bad, .Lr_mov2, APH_ALWAYS, 3, 0

    .section .note.GNU-stack, "", @progbits
