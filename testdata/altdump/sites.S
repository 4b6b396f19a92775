/* SPDX-License-Identifier: MIT */
/*
 * altdump golden fixture: one function per kind of site, every relative
 * target inside .text so that the .o and the linked program give the same
 * final bytes. Linked with sites.ld at fixed addresses (see altdump.cmake).
 */
#include "altsites.inc"

    ALT_NOTE

/* FS self pointer: movq %fs:0 -> rdfsbase under FSGSBASE (9*32+0). */
FUNC fs_self
    ALT1 0, "movq %fs:0, %rax", "rdfsbase %rax", 288
    ret
ENDFUNC fs_self

/* Weak fence: mfence; lfence -> NOPs under ALT_NOT(APIC_MSRS_FENCE (11*32+27)). */
FUNC weak_fence
    ALT1 1, "mfence; lfence", "", 0x1017b
    ret
ENDFUNC weak_fence

/* getcpu: rdtscp -> rdpid under RDPID (16*32+22); padded by one byte. */
FUNC getcpu
    ALT1 2, "rdtscp", "rdpid %rax", 534
    ret
ENDFUNC getcpu

/* rdtsc_ordered: ALTERNATIVE_2(rdtsc, lfence;rdtsc LFENCE_RDTSC (20*32+2), rdtscp RDTSCP (1*32+27)). */
FUNC rdtsc_ordered
    ALT2 3, "rdtsc", "lfence; rdtsc", 642, "rdtscp", 59
    shlq $32, %rdx
    orq %rdx, %rax
    ret
ENDFUNC rdtsc_ordered

/* Call switch: call impl_old -> call impl_new under AVX2 (9*32+5): rel32 relocated. */
FUNC alt_call
    ALT1 4, "call impl_old", "call impl_new", 293
    ret
ENDFUNC alt_call

/* popcount: call popcnt_sw -> popcnt %rdi, %rax under POPCNT (4*32+23). */
FUNC popcount
    ALT1 5, "call popcnt_sw", "popcnt %rdi, %rax", 151
    ret
ENDFUNC popcount

/* RIP-relative: leaq table_a -> leaq table_b under CLWB (9*32+24). */
FUNC pick_table
    ALT1 6, "leaq table_a(%rip), %rax", "leaq table_b(%rip), %rax", 312
    ret
ENDFUNC pick_table

/* A jmp rel8 whose target stays inside the replacement, under SERIALIZE (18*32+14). */
FUNC short_jump
    ALT1 7, "movl $1, %eax", "jmp 1f; int3; 1: movl $2, %eax", 590
    ret
ENDFUNC short_jump

/* Never replaced: ALT_NOT(ALWAYS (3*32+21)). */
FUNC never
    ALT1 8, "movl $3, %eax", "movl $4, %eax", 0x10075
    ret
ENDFUNC never

FUNC impl_old
    movq $1, %rax
    ret
ENDFUNC impl_old

FUNC impl_new
    movq $2, %rax
    ret
ENDFUNC impl_new

FUNC popcnt_sw
    xorl %eax, %eax
    ret
ENDFUNC popcnt_sw

    .text
    .p2align 4
table_a:
    .quad 1
table_b:
    .quad 2

    .section .note.GNU-stack, "", @progbits
