/* SPDX-License-Identifier: MIT */
/*
 * A Linux-kernel-style image for altdump: .altinstructions records and
 * .altinstr_replacement code written the way the kernel's ALTERNATIVE()
 * macros lay them out, in either record layout, with the kernel's feature
 * numbering of that version:
 *
 *   -DKREC_SIZE=12  before 6.3: s32, s32, u16 cpuid (bit 15: ALTINSTR_FLAG_INV), u8, u8
 *   -DKREC_SIZE=14  6.3 on:     s32, s32, u32 ft_flags (flags << 16), u8, u8
 *   -DKVERSION="..."  the release the image carries
 *   -DMODULE   a module: vermagic in .modinfo, pointer and BUG_func undefined
 *              (else linux_banner in .rodata and everything defined)
 *   -DNOVERSION=1  no version string at all, 5 records (70 bytes: 14-byte only)
 *   -DNOVERSION=2  no version string, 6 records (84 bytes: 12 or 14, ambiguous)
 */
#if KREC_SIZE == 12
#define K_LFENCE_RDTSC (3*32+18)        /* 6.1 */
#define K_NOT(f) ((f) | 0x8000)
#else
#define K_LFENCE_RDTSC (20*32+2)        /* 6.12 */
#define K_NOT(f) ((1 << 16) | (f))
#define K_DIRECT_CALL(f) ((2 << 16) | (f))
#endif
#define K_ALWAYS (3*32+21)
#define K_XENPV (8*32+16)
#define K_AVX2 (9*32+5)
#define K_BUG_SPECTRE_V1 (22*32+15)

.macro k_record instr, repl, ft, ilen, rlen
	.long \instr - .
	.long \repl - .
#if KREC_SIZE == 12
	.word \ft
#else
	.long \ft
#endif
	.byte \ilen
	.byte \rlen
.endm

/* ALTERNATIVE(orig, repl, ft): the original padded with 0x90 to the replacement's length. */
.macro KALT orig, repl, ft
771:	\orig
772:	.skip -(((775f-774f)-(772b-771b)) > 0) * ((775f-774f)-(772b-771b)), 0x90
773:
	.pushsection .altinstructions, "a"
	k_record 771b, 774f, \ft, 773b-771b, 775f-774f
	.popsection
	.pushsection .altinstr_replacement, "ax"
774:	\repl
775:
	.popsection
.endm

	.text
	.globl k_start
	.type rdtsc_ordered, @function
k_start:
rdtsc_ordered:
	KALT "rdtsc", "lfence; rdtsc", K_LFENCE_RDTSC
	ret
	.size rdtsc_ordered, .-rdtsc_ordered

	.type irq_disable, @function
irq_disable:
	KALT "call *pv_irq_disable(%rip)", "cli", K_NOT(K_XENPV)
	ret
	.size irq_disable, .-irq_disable

	.type barrier_nospec, @function
barrier_nospec:
	KALT "", "lfence", K_BUG_SPECTRE_V1
	ret
	.size barrier_nospec, .-barrier_nospec

	.type alt_call, @function
alt_call:
	KALT "call old_impl", "call new_impl", K_AVX2
	ret
	.size alt_call, .-alt_call

#if KREC_SIZE == 14 && (!defined(NOVERSION) || NOVERSION == 2)
	.type nop_call, @function
nop_call:
	KALT "call *pv_nop(%rip)", "call BUG_func", K_DIRECT_CALL(K_ALWAYS)
	ret
	.size nop_call, .-nop_call
#endif

#if KREC_SIZE == 14
	.type direct_call, @function
direct_call:
	KALT "call *pv_irq_disable(%rip)", "call BUG_func", K_DIRECT_CALL(K_ALWAYS)
	ret
	.size direct_call, .-direct_call
#endif

	.type old_impl, @function
old_impl:
	xor %eax, %eax
	ret
	.size old_impl, .-old_impl
	.type new_impl, @function
new_impl:
	mov $1, %eax
	ret
	.size new_impl, .-new_impl
	.type nop_func, @function
nop_func:
	ret
	.size nop_func, .-nop_func
	.type native_irq_disable, @function
native_irq_disable:
	cli
	ret
	.size native_irq_disable, .-native_irq_disable

#ifndef MODULE
	.globl BUG_func
	.type BUG_func, @function
BUG_func:
	ud2
	.size BUG_func, .-BUG_func

	.data
	.balign 8
	.type pv_irq_disable, @object
pv_irq_disable:
	.quad native_irq_disable
	.size pv_irq_disable, 8
	.type pv_nop, @object
pv_nop:
	.quad nop_func
	.size pv_nop, 8
#endif

#ifndef NOVERSION
#ifdef MODULE
	.section .modinfo, "a"
	.asciz "license=MIT"
	.ascii "vermagic="
	.ascii KVERSION
	.asciz " SMP mod_unload modversions "
#else
	.section .rodata, "a"
	.globl linux_banner
	.type linux_banner, @object
linux_banner:
	.ascii "Linux version "
	.ascii KVERSION
	.asciz " (altdump@fixture) #1 SMP\n"
	.size linux_banner, .-linux_banner
#endif
#endif
	.section .note.GNU-stack, "", @progbits
