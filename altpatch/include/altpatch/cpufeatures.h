/* SPDX-License-Identifier: MIT */
/**
 * @file cpufeatures.h
 * @brief X86_FEATURE_* ids in the Linux kernel's numbering.
 *
 * Every id is `word*32 + bit`, with the same words and bits as the kernel's
 * arch/x86/include/asm/cpufeatures.h, so a site written against the kernel's
 * header reads the same here. Words that mirror a CPUID register:
 *
 *   word  0  CPUID 0x00000001 EDX        word  9  CPUID 0x00000007.0 EBX
 *   word  1  CPUID 0x80000001 EDX        word 10  CPUID 0x0000000d.1 EAX
 *   word  4  CPUID 0x00000001 ECX        word 12  CPUID 0x00000007.1 EAX
 *   word  6  CPUID 0x80000001 ECX        word 13  CPUID 0x80000008 EBX
 *   word 16  CPUID 0x00000007.0 ECX      word 17  CPUID 0x80000007 EBX
 *   word 18  CPUID 0x00000007.0 EDX      word 20  CPUID 0x80000021 EAX
 *
 * Words 3 and 11 are the kernel's synthetic words: their bits are derived,
 * not read (ALWAYS, CONSTANT_TSC, NONSTOP_TSC, APIC_MSRS_FENCE). Bit 2 of
 * word 20 (LFENCE_RDTSC) is both a CPUID bit and set by vendor rule, as in
 * the kernel. Only the ids listed here are known to altpatch; a record naming
 * any other id is refused (ALTPATCH_REASON_UNKNOWN_FEATURE).
 *
 * A feature in a set means *usable by this process*, not merely reported by
 * CPUID: FSGSBASE needs the kernel's permission (AT_HWCAP2 bit 1), the AVX and
 * AVX-512 families need OSXSAVE and the matching XCR0 state components, AMX
 * additionally the process's XCOMP permission, PKU needs OSPKE and SHSTK an
 * enabled shadow stack. System features (vmx, monitor, xsaves, ...) keep
 * their CPUID meaning. See altpatch_features_host().
 *
 * The values are plain integer expressions because ALTERNATIVE() stringifies
 * them into assembler directives: no casts, no suffixes, no enums.
 * Feature names (altpatch_feature_name()) are those /proc/cpuinfo prints, or
 * the lower-case macro name for ids the kernel does not print.
 *
 * This header is the library's only list of features: the build reads every
 * `#define X86_FEATURE_<NAME> (<word>*32+<bit>)` line, whose comment starts
 * with the feature's name in double quotes (followed by "(not in
 * /proc/cpuinfo)" when the kernel does not print it), into the library's
 * feature table. Keep that form when adding one.
 */
#ifndef ALTPATCH_CPUFEATURES_H
#define ALTPATCH_CPUFEATURES_H

/* CPUID 0x00000001 EDX, word 0 */
#define X86_FEATURE_FPU                 ( 0*32+ 0) /* "fpu" */
#define X86_FEATURE_VME                 ( 0*32+ 1) /* "vme" */
#define X86_FEATURE_DE                  ( 0*32+ 2) /* "de" */
#define X86_FEATURE_PSE                 ( 0*32+ 3) /* "pse" */
#define X86_FEATURE_TSC                 ( 0*32+ 4) /* "tsc" */
#define X86_FEATURE_MSR                 ( 0*32+ 5) /* "msr" */
#define X86_FEATURE_PAE                 ( 0*32+ 6) /* "pae" */
#define X86_FEATURE_MCE                 ( 0*32+ 7) /* "mce" */
#define X86_FEATURE_CX8                 ( 0*32+ 8) /* "cx8" CMPXCHG8B */
#define X86_FEATURE_APIC                ( 0*32+ 9) /* "apic" */
#define X86_FEATURE_SEP                 ( 0*32+11) /* "sep" SYSENTER/SYSEXIT */
#define X86_FEATURE_MTRR                ( 0*32+12) /* "mtrr" */
#define X86_FEATURE_PGE                 ( 0*32+13) /* "pge" */
#define X86_FEATURE_MCA                 ( 0*32+14) /* "mca" */
#define X86_FEATURE_CMOV                ( 0*32+15) /* "cmov" */
#define X86_FEATURE_PAT                 ( 0*32+16) /* "pat" */
#define X86_FEATURE_PSE36               ( 0*32+17) /* "pse36" */
#define X86_FEATURE_CLFLUSH             ( 0*32+19) /* "clflush" */
#define X86_FEATURE_MMX                 ( 0*32+23) /* "mmx" */
#define X86_FEATURE_FXSR                ( 0*32+24) /* "fxsr" FXSAVE/FXRSTOR */
#define X86_FEATURE_XMM                 ( 0*32+25) /* "sse" */
#define X86_FEATURE_XMM2                ( 0*32+26) /* "sse2" */
#define X86_FEATURE_HT                  ( 0*32+28) /* "ht" */

/* CPUID 0x80000001 EDX, word 1 (bits that duplicate word 0 are not used) */
#define X86_FEATURE_SYSCALL             ( 1*32+11) /* "syscall" */
#define X86_FEATURE_NX                  ( 1*32+20) /* "nx" */
#define X86_FEATURE_MMXEXT              ( 1*32+22) /* "mmxext" */
#define X86_FEATURE_FXSR_OPT            ( 1*32+25) /* "fxsr_opt" */
#define X86_FEATURE_GBPAGES             ( 1*32+26) /* "pdpe1gb" */
#define X86_FEATURE_RDTSCP              ( 1*32+27) /* "rdtscp" */
#define X86_FEATURE_LM                  ( 1*32+29) /* "lm" long mode */
#define X86_FEATURE_3DNOWEXT            ( 1*32+30) /* "3dnowext" */
#define X86_FEATURE_3DNOW               ( 1*32+31) /* "3dnow" */

/* Synthetic, word 3 */
#define X86_FEATURE_CONSTANT_TSC        ( 3*32+ 8) /* "constant_tsc" */
#define X86_FEATURE_ALWAYS              ( 3*32+21) /* "always" (not in /proc/cpuinfo): every set has it */
#define X86_FEATURE_NONSTOP_TSC         ( 3*32+24) /* "nonstop_tsc" */

/* CPUID 0x00000001 ECX, word 4 */
#define X86_FEATURE_XMM3                ( 4*32+ 0) /* "pni" SSE3 */
#define X86_FEATURE_PCLMULQDQ           ( 4*32+ 1) /* "pclmulqdq" */
#define X86_FEATURE_MWAIT               ( 4*32+ 3) /* "monitor" */
#define X86_FEATURE_VMX                 ( 4*32+ 5) /* "vmx" */
#define X86_FEATURE_SMX                 ( 4*32+ 6) /* "smx" */
#define X86_FEATURE_SSSE3               ( 4*32+ 9) /* "ssse3" */
#define X86_FEATURE_FMA                 ( 4*32+12) /* "fma" */
#define X86_FEATURE_CX16                ( 4*32+13) /* "cx16" CMPXCHG16B */
#define X86_FEATURE_PCID                ( 4*32+17) /* "pcid" */
#define X86_FEATURE_XMM4_1              ( 4*32+19) /* "sse4_1" */
#define X86_FEATURE_XMM4_2              ( 4*32+20) /* "sse4_2" */
#define X86_FEATURE_X2APIC              ( 4*32+21) /* "x2apic" */
#define X86_FEATURE_MOVBE               ( 4*32+22) /* "movbe" */
#define X86_FEATURE_POPCNT              ( 4*32+23) /* "popcnt" */
#define X86_FEATURE_TSC_DEADLINE_TIMER  ( 4*32+24) /* "tsc_deadline_timer" */
#define X86_FEATURE_AES                 ( 4*32+25) /* "aes" AES-NI */
#define X86_FEATURE_XSAVE               ( 4*32+26) /* "xsave" */
#define X86_FEATURE_OSXSAVE             ( 4*32+27) /* "osxsave" (not in /proc/cpuinfo) */
#define X86_FEATURE_AVX                 ( 4*32+28) /* "avx" */
#define X86_FEATURE_F16C                ( 4*32+29) /* "f16c" */
#define X86_FEATURE_RDRAND              ( 4*32+30) /* "rdrand" */
#define X86_FEATURE_HYPERVISOR          ( 4*32+31) /* "hypervisor" */

/* CPUID 0x80000001 ECX, word 6 */
#define X86_FEATURE_LAHF_LM             ( 6*32+ 0) /* "lahf_lm" */
#define X86_FEATURE_CMP_LEGACY          ( 6*32+ 1) /* "cmp_legacy" */
#define X86_FEATURE_SVM                 ( 6*32+ 2) /* "svm" */
#define X86_FEATURE_EXTAPIC             ( 6*32+ 3) /* "extapic" */
#define X86_FEATURE_CR8_LEGACY          ( 6*32+ 4) /* "cr8_legacy" */
#define X86_FEATURE_ABM                 ( 6*32+ 5) /* "abm" LZCNT (and POPCNT) */
#define X86_FEATURE_SSE4A               ( 6*32+ 6) /* "sse4a" */
#define X86_FEATURE_MISALIGNSSE         ( 6*32+ 7) /* "misalignsse" */
#define X86_FEATURE_3DNOWPREFETCH       ( 6*32+ 8) /* "3dnowprefetch" PREFETCHW */
#define X86_FEATURE_OSVW                ( 6*32+ 9) /* "osvw" */
#define X86_FEATURE_IBS                 ( 6*32+10) /* "ibs" */
#define X86_FEATURE_XOP                 ( 6*32+11) /* "xop" */
#define X86_FEATURE_SKINIT              ( 6*32+12) /* "skinit" */
#define X86_FEATURE_WDT                 ( 6*32+13) /* "wdt" */
#define X86_FEATURE_LWP                 ( 6*32+15) /* "lwp" */
#define X86_FEATURE_FMA4                ( 6*32+16) /* "fma4" */
#define X86_FEATURE_TCE                 ( 6*32+17) /* "tce" */
#define X86_FEATURE_TBM                 ( 6*32+21) /* "tbm" */
#define X86_FEATURE_TOPOEXT             ( 6*32+22) /* "topoext" */
#define X86_FEATURE_PERFCTR_CORE        ( 6*32+23) /* "perfctr_core" */
#define X86_FEATURE_PERFCTR_NB          ( 6*32+24) /* "perfctr_nb" */
#define X86_FEATURE_PERFCTR_LLC         ( 6*32+28) /* "perfctr_llc" */
#define X86_FEATURE_MWAITX              ( 6*32+29) /* "mwaitx" */

/* CPUID 0x00000007.0 EBX, word 9 */
#define X86_FEATURE_FSGSBASE            ( 9*32+ 0) /* "fsgsbase" RD/WR{FS,GS}BASE (needs AT_HWCAP2) */
#define X86_FEATURE_TSC_ADJUST          ( 9*32+ 1) /* "tsc_adjust" */
#define X86_FEATURE_SGX                 ( 9*32+ 2) /* "sgx" */
#define X86_FEATURE_BMI1                ( 9*32+ 3) /* "bmi1" */
#define X86_FEATURE_HLE                 ( 9*32+ 4) /* "hle" */
#define X86_FEATURE_AVX2                ( 9*32+ 5) /* "avx2" */
#define X86_FEATURE_SMEP                ( 9*32+ 7) /* "smep" */
#define X86_FEATURE_BMI2                ( 9*32+ 8) /* "bmi2" */
#define X86_FEATURE_ERMS                ( 9*32+ 9) /* "erms" enhanced REP MOVSB/STOSB */
#define X86_FEATURE_INVPCID             ( 9*32+10) /* "invpcid" */
#define X86_FEATURE_RTM                 ( 9*32+11) /* "rtm" */
#define X86_FEATURE_MPX                 ( 9*32+14) /* "mpx" */
#define X86_FEATURE_AVX512F             ( 9*32+16) /* "avx512f" */
#define X86_FEATURE_AVX512DQ            ( 9*32+17) /* "avx512dq" */
#define X86_FEATURE_RDSEED              ( 9*32+18) /* "rdseed" */
#define X86_FEATURE_ADX                 ( 9*32+19) /* "adx" */
#define X86_FEATURE_SMAP                ( 9*32+20) /* "smap" */
#define X86_FEATURE_AVX512IFMA          ( 9*32+21) /* "avx512ifma" */
#define X86_FEATURE_CLFLUSHOPT          ( 9*32+23) /* "clflushopt" */
#define X86_FEATURE_CLWB                ( 9*32+24) /* "clwb" */
#define X86_FEATURE_INTEL_PT            ( 9*32+25) /* "intel_pt" */
#define X86_FEATURE_AVX512PF            ( 9*32+26) /* "avx512pf" */
#define X86_FEATURE_AVX512ER            ( 9*32+27) /* "avx512er" */
#define X86_FEATURE_AVX512CD            ( 9*32+28) /* "avx512cd" */
#define X86_FEATURE_SHA_NI              ( 9*32+29) /* "sha_ni" */
#define X86_FEATURE_AVX512BW            ( 9*32+30) /* "avx512bw" */
#define X86_FEATURE_AVX512VL            ( 9*32+31) /* "avx512vl" */

/* CPUID 0x0000000d.1 EAX, word 10 */
#define X86_FEATURE_XSAVEOPT            (10*32+ 0) /* "xsaveopt" */
#define X86_FEATURE_XSAVEC              (10*32+ 1) /* "xsavec" */
#define X86_FEATURE_XGETBV1             (10*32+ 2) /* "xgetbv1" */
#define X86_FEATURE_XSAVES              (10*32+ 3) /* "xsaves" (a ring-0 instruction) */
#define X86_FEATURE_XFD                 (10*32+ 4) /* "xfd" (not in /proc/cpuinfo) */

/* Synthetic, word 11 */
#define X86_FEATURE_APIC_MSRS_FENCE     (11*32+27) /* "apic_msrs_fence" (not in /proc/cpuinfo): not on AMD and Hygon */

/* CPUID 0x00000007.1 EAX, word 12 (the kernel prints only avx_vnni and avx512_bf16) */
#define X86_FEATURE_SHA512              (12*32+ 0) /* "sha512" (not in /proc/cpuinfo) */
#define X86_FEATURE_SM3                 (12*32+ 1) /* "sm3" (not in /proc/cpuinfo) */
#define X86_FEATURE_SM4                 (12*32+ 2) /* "sm4" (not in /proc/cpuinfo) */
#define X86_FEATURE_AVX_VNNI            (12*32+ 4) /* "avx_vnni" */
#define X86_FEATURE_AVX512_BF16         (12*32+ 5) /* "avx512_bf16" */
#define X86_FEATURE_CMPCCXADD           (12*32+ 7) /* "cmpccxadd" (not in /proc/cpuinfo) */
#define X86_FEATURE_FZRM                (12*32+10) /* "fzrm" (not in /proc/cpuinfo) fast zero-length REP MOVSB */
#define X86_FEATURE_FSRS                (12*32+11) /* "fsrs" (not in /proc/cpuinfo) fast short REP STOSB */
#define X86_FEATURE_FSRC                (12*32+12) /* "fsrc" (not in /proc/cpuinfo) fast short REP CMPSB/SCASB */
#define X86_FEATURE_AMX_FP16            (12*32+21) /* "amx_fp16" (not in /proc/cpuinfo) */
#define X86_FEATURE_AVX_IFMA            (12*32+23) /* "avx_ifma" (not in /proc/cpuinfo) */

/* CPUID 0x80000008 EBX, word 13 */
#define X86_FEATURE_CLZERO              (13*32+ 0) /* "clzero" */
#define X86_FEATURE_IRPERF              (13*32+ 1) /* "irperf" */
#define X86_FEATURE_XSAVEERPTR          (13*32+ 2) /* "xsaveerptr" */
#define X86_FEATURE_RDPRU               (13*32+ 4) /* "rdpru" */
#define X86_FEATURE_WBNOINVD            (13*32+ 9) /* "wbnoinvd" */

/* CPUID 0x00000007.0 ECX, word 16 */
#define X86_FEATURE_AVX512VBMI          (16*32+ 1) /* "avx512vbmi" */
#define X86_FEATURE_UMIP                (16*32+ 2) /* "umip" */
#define X86_FEATURE_PKU                 (16*32+ 3) /* "pku" */
#define X86_FEATURE_OSPKE               (16*32+ 4) /* "ospke" */
#define X86_FEATURE_WAITPKG             (16*32+ 5) /* "waitpkg" UMONITOR/UMWAIT/TPAUSE */
#define X86_FEATURE_AVX512_VBMI2        (16*32+ 6) /* "avx512_vbmi2" */
#define X86_FEATURE_SHSTK               (16*32+ 7) /* "shstk" (not in /proc/cpuinfo) */
#define X86_FEATURE_GFNI                (16*32+ 8) /* "gfni" */
#define X86_FEATURE_VAES                (16*32+ 9) /* "vaes" */
#define X86_FEATURE_VPCLMULQDQ          (16*32+10) /* "vpclmulqdq" */
#define X86_FEATURE_AVX512_VNNI         (16*32+11) /* "avx512_vnni" */
#define X86_FEATURE_AVX512_BITALG       (16*32+12) /* "avx512_bitalg" */
#define X86_FEATURE_TME                 (16*32+13) /* "tme" */
#define X86_FEATURE_AVX512_VPOPCNTDQ    (16*32+14) /* "avx512_vpopcntdq" */
#define X86_FEATURE_LA57                (16*32+16) /* "la57" */
#define X86_FEATURE_RDPID               (16*32+22) /* "rdpid" */
#define X86_FEATURE_BUS_LOCK_DETECT     (16*32+24) /* "bus_lock_detect" */
#define X86_FEATURE_CLDEMOTE            (16*32+25) /* "cldemote" */
#define X86_FEATURE_MOVDIRI             (16*32+27) /* "movdiri" */
#define X86_FEATURE_MOVDIR64B           (16*32+28) /* "movdir64b" */
#define X86_FEATURE_ENQCMD              (16*32+29) /* "enqcmd" */

/* CPUID 0x80000007 EBX, word 17 */
#define X86_FEATURE_OVERFLOW_RECOV      (17*32+ 0) /* "overflow_recov" */
#define X86_FEATURE_SUCCOR              (17*32+ 1) /* "succor" */
#define X86_FEATURE_SMCA                (17*32+ 3) /* "smca" */

/* CPUID 0x00000007.0 EDX, word 18 */
#define X86_FEATURE_AVX512_4VNNIW       (18*32+ 2) /* "avx512_4vnniw" */
#define X86_FEATURE_AVX512_4FMAPS       (18*32+ 3) /* "avx512_4fmaps" */
#define X86_FEATURE_FSRM                (18*32+ 4) /* "fsrm" fast short REP MOVSB */
#define X86_FEATURE_AVX512_VP2INTERSECT (18*32+ 8) /* "avx512_vp2intersect" */
#define X86_FEATURE_MD_CLEAR            (18*32+10) /* "md_clear" */
#define X86_FEATURE_SERIALIZE           (18*32+14) /* "serialize" */
#define X86_FEATURE_HYBRID_CPU          (18*32+15) /* "hybrid_cpu" (not in /proc/cpuinfo) */
#define X86_FEATURE_TSXLDTRK            (18*32+16) /* "tsxldtrk" */
#define X86_FEATURE_PCONFIG             (18*32+18) /* "pconfig" */
#define X86_FEATURE_ARCH_LBR            (18*32+19) /* "arch_lbr" */
#define X86_FEATURE_IBT                 (18*32+20) /* "ibt" */
#define X86_FEATURE_AMX_BF16            (18*32+22) /* "amx_bf16" */
#define X86_FEATURE_AVX512_FP16         (18*32+23) /* "avx512_fp16" */
#define X86_FEATURE_AMX_TILE            (18*32+24) /* "amx_tile" */
#define X86_FEATURE_AMX_INT8            (18*32+25) /* "amx_int8" */

/* CPUID 0x80000021 EAX, word 20 (none printed by /proc/cpuinfo) */
#define X86_FEATURE_NO_NESTED_DATA_BP   (20*32+ 0) /* "no_nested_data_bp" (not in /proc/cpuinfo) */
#define X86_FEATURE_LFENCE_RDTSC        (20*32+ 2) /* "lfence_rdtsc" (not in /proc/cpuinfo): LFENCE serializes, orders RDTSC */
#define X86_FEATURE_NULL_SEL_CLR_BASE   (20*32+ 6) /* "null_sel_clr_base" (not in /proc/cpuinfo) */
#define X86_FEATURE_AUTOIBRS            (20*32+ 8) /* "autoibrs" (not in /proc/cpuinfo) */

#endif /* ALTPATCH_CPUFEATURES_H */
