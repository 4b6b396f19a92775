/* SPDX-License-Identifier: MIT */
/*
 * libaphost_onebad_<N>.so: one function of many valid sites, in address
 * order, and one record (the N-th kind below) that the planner refuses,
 * among them in the middle of the table. Its entry would not apply (feature
 * ALWAYS under ALT_FLAG_NOT): no feature test may keep that site as it is
 * without the refusal. N = 0: every record valid.
 *
 *   1  REPL_BOUNDS      the replacement lies in .rodata
 *   2  REPL_TOO_LONG    a replacement of 4 bytes for a site of 3
 *   3  UNKNOWN_FLAGS    flags ALT_FLAG_NOT | 2
 *   4  UNKNOWN_FEATURE  feature 0xffff
 *   5  SITE_BOUNDS      the site lies in .rodata
 *
 * aph_onebad_fn() returns 40 + 16 * 1 + 16 * 4 + 16 = 136, and 168 once the
 * 16 sites under ALWAYS are patched (addl $1 -> addl $3); the 16 under
 * ALT_FLAG_NOT and the middle one never change. aph_onebad_site: the middle
 * site (N = 5: its stand-in; the record names aph_onebad_rodata_site).
 */
#include "hostile.inc"

/* ft words without blanks (macro arguments): ALWAYS alone, under
 * ALT_FLAG_NOT, under ALT_FLAG_NOT | 2; feature 0xffff under ALT_FLAG_NOT */
#define OB_ALWAYS 0x75
#define OB_NOT 0x10075
#define OB_FLAGS3 0x30075
#define OB_FEATURE 0x1ffff

    APH_NOTE

/* A site "addl $\val, %eax" (3 bytes) with the replacement \repl under \ft. */
.macro OB_SITE val, repl, ft
1:  addl $\val, %eax
    .pushsection altinstr_replacement, "axR"
2:  addl $\repl, %eax
    .popsection
    .pushsection altinstructions, "aR"
    .long 1b - .
    .long 2b - .
    .long \ft
    .byte 3
    .byte 3
    .popsection
.endm

/* Eight valid pairs: one patched under ALWAYS, one kept under NOT ALWAYS. */
.macro OB_PAIRS
    .rept 8
    OB_SITE 1, 3, OB_ALWAYS
    OB_SITE 4, 8, OB_NOT
    .endr
.endm

    .text
    .globl aph_onebad_fn
    .type aph_onebad_fn, @function
aph_onebad_fn:
    movl $40, %eax
    OB_PAIRS
    .globl aph_onebad_site
aph_onebad_site:
.Lob_bad:
#if APH_BAD == 0
    OB_SITE 16, 32, OB_NOT
#elif APH_BAD == 1
    addl $16, %eax
    APH_REC aph_onebad_rec, .Lob_bad, .Lob_rodata, OB_NOT, 3, 3
#elif APH_BAD == 2
    addl $16, %eax
    .pushsection altinstr_replacement, "axR"
.Lob_long:
    addl $32, %eax
    nop
    .popsection
    APH_REC aph_onebad_rec, .Lob_bad, .Lob_long, OB_NOT, 3, 4
#elif APH_BAD == 3
    addl $16, %eax
    .pushsection altinstr_replacement, "axR"
.Lob_repl:
    addl $32, %eax
    .popsection
    APH_REC aph_onebad_rec, .Lob_bad, .Lob_repl, OB_FLAGS3, 3, 3
#elif APH_BAD == 4
    addl $16, %eax
    .pushsection altinstr_replacement, "axR"
.Lob_repl:
    addl $32, %eax
    .popsection
    APH_REC aph_onebad_rec, .Lob_bad, .Lob_repl, OB_FEATURE, 3, 3
#elif APH_BAD == 5
    addl $16, %eax /* the stand-in: the record names a site in .rodata */
    .pushsection altinstr_replacement, "axR"
.Lob_repl:
    addl $32, %eax
    .popsection
    APH_REC aph_onebad_rec, .Lob_rodata_site, .Lob_repl, OB_NOT, 3, 3
#else
#error "APH_BAD: 0 to 5"
#endif
    OB_PAIRS
    ret
    .size aph_onebad_fn, . - aph_onebad_fn

    .section .rodata, "a"
    .globl aph_onebad_rodata_site
aph_onebad_rodata_site:
.Lob_rodata_site:
    addl $16, %eax
.Lob_rodata:
    addl $32, %eax

    .section .note.GNU-stack, "", @progbits
