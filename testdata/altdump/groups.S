/* SPDX-License-Identifier: MIT */
/*
 * altdump fixture: sites in COMDAT groups, as <altpatch/alternative.h> emits
 * them for C++ inline functions and templates: each record and replacement
 * joins the group of its site through the "?" section flag, so the .o holds
 * one altinstructions and one altinstr_replacement section (each with its
 * own .rela) per group, plus those of the plain .text site. The linker
 * concatenates them; altdump must do the same for the .o (same sites as the
 * linked program), and the runtime must patch every site of the program.
 *
 * Feature 117 is X86_FEATURE_ALWAYS (3*32+21): every site is replaced on any
 * CPU. The replacements are never executed (main in groups_main.c only
 * applies and walks the sites), but each decodes.
 */
#include "altsites.inc"

/* A site whose record and replacement follow the current section's group. */
.macro GALT n, orig, repl, ft
.Ls\n:
    \orig
.Le\n:
    .skip -(((.Lre\n - .Lrs\n) - (.Le\n - .Ls\n)) > 0) * ((.Lre\n - .Lrs\n) - (.Le\n - .Ls\n)), 0x90
.Lt\n:
    .pushsection altinstructions, "a?R"
    .long .Ls\n - .
    .long .Lrs\n - .
    .4byte \ft
    .byte .Lt\n - .Ls\n
    .byte .Lre\n - .Lrs\n
    .popsection
    .pushsection altinstr_replacement, "ax?R"
.Lrs\n:
    \repl
.Lre\n:
    .popsection
.endm

    ALT_NOTE

    .text
    .globl grp_plain
    .hidden grp_plain
    .type grp_plain, @function
grp_plain:
    GALT 0, "mfence", "lfence", 117
    ret
    .size grp_plain, . - grp_plain

/* Two "inline functions", each in its own COMDAT group; the second's
 * replacement calls a helper of its group (a relocation in the second
 * altinstr_replacement section). */
    .section .text.grp_one, "axG", @progbits, grp_one, comdat
    .weak grp_one
    .hidden grp_one
    .type grp_one, @function
grp_one:
    GALT 1, "lfence", "mfence", 117
    movl $1, %eax
    ret
    .size grp_one, . - grp_one

    .section .text.grp_two, "axG", @progbits, grp_two, comdat
    .weak grp_two
    .hidden grp_two
    .type grp_two, @function
grp_two:
    GALT 2, "movl $2, %eax", "call grp_two_helper", 117
    ret
grp_two_helper:
    movl $22, %eax
    ret
    .size grp_two, . - grp_two

    .section .note.GNU-stack, "", @progbits
