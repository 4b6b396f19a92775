/* SPDX-License-Identifier: MIT */
/**
 * @file primitives.h
 * @brief Ready-made alternative sites: weak fence, FS/GS self pointers,
 *        getcpu, ordered TSC read, and a call switched between two functions.
 *
 * Every helper here is `static inline` and always inlined, so each call site
 * in your code becomes one altpatch site (one or more 12-byte records). Until
 * altpatch_apply() runs, every site executes its original bytes, which are
 * correct on every x86-64 Linux machine (see each helper). After apply, the
 * site holds the replacement chosen for this CPU.
 *
 * The bytes below are exact: the helpers use fixed registers so that tests
 * and tools (altdump) can check what memory holds. "NOPn" is the n-byte NOP of
 * the kernel's x86-64 table (NOP2 = 66 90, NOP3 = 0f 1f 00, NOP4 = 0f 1f 40 00,
 * NOP6 = 66 0f 1f 44 00 00).
 *
 * | helper                  | feature (flags)            | original bytes                         | replaced by                    |
 * |-------------------------|----------------------------|----------------------------------------|--------------------------------|
 * | altpatch_weak_fence     | ALT_NOT(APIC_MSRS_FENCE)   | 0f ae f0 0f ae e8 (mfence; lfence)     | NOP6                           |
 * | altpatch_fs_self        | FSGSBASE                   | 64 48 8b 04 25 00 00 00 00             | f3 48 0f ae c0 NOP4 (rdfsbase) |
 * | altpatch_gs_self        | FSGSBASE                   | 65 48 8b 04 25 00 00 00 00             | f3 48 0f ae c8 NOP4 (rdgsbase) |
 * | altpatch_getcpu         | RDPID                      | b9 ff ff ff ff (movl $-1, %ecx)        | f3 0f c7 f9 90 (rdpid %rcx)    |
 * | altpatch_rdtsc_ordered  | LFENCE_RDTSC, then RDTSCP  | 0f 31 90 90 90 (rdtsc; 3 x nop)        | 0f ae e8 0f 31 / 0f 01 f9 NOP2 |
 * | ALTPATCH_ALT_CALL       | any                        | e8 rel32 (call oldfn)                  | e8 rel32' (call newfn)         |
 */
#ifndef ALTPATCH_PRIMITIVES_H
#define ALTPATCH_PRIMITIVES_H

#include <stdint.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every instruction string below is written for both assembler dialects
 * ("{AT&T|Intel}"), so the same bytes come out under -masm=intel.
 */
/** Attributes of every site helper: one site per call site, never out of line. */
#define ALTPATCH_PRIMITIVE_ static inline __attribute__((always_inline))

/**
 * A full fence that CPUs without the kernel's APIC_MSRS_FENCE need and others
 * do not: `mfence; lfence` (0f ae f0 0f ae e8), replaced by a 6-byte NOP
 * (66 0f 1f 44 00 00) where X86_FEATURE_APIC_MSRS_FENCE is clear (AMD, Hygon:
 * the feature is synthetic, set on every other vendor). Also a compiler barrier.
 */
ALTPATCH_PRIMITIVE_ void altpatch_weak_fence(void)
{
    __asm__ __volatile__(ALTERNATIVE("mfence; lfence", "",
                                     ALT_NOT(X86_FEATURE_APIC_MSRS_FENCE))
                         : : : "memory");
}

/**
 * The thread's GS self pointer: the first word of the block at the GS base,
 * which altpatch_gs_install() makes point to the block itself. Original
 * `movq %gs:0, %rax` (65 48 8b 04 25 00 00 00 00); under X86_FEATURE_FSGSBASE
 * `rdgsbase %rax` (f3 48 0f ae c8) + NOP4. Only valid after
 * altpatch_gs_install() on this thread (glibc does not use GS on x86-64: a
 * GS base of 0 makes the original fault). A thread that never called
 * altpatch_gs_install() inherits its creator's GS base, so there this returns
 * the *creator's* block without any error: altpatch_gs_check() tells a thread
 * whether the block at its GS base is the one it installed.
 */
ALTPATCH_PRIMITIVE_ void *altpatch_gs_self(void)
{
    void *p;
    __asm__ __volatile__(ALTERNATIVE("{movq %%gs:0, %0|mov %0, QWORD PTR gs:0}", "rdgsbase %0", X86_FEATURE_FSGSBASE)
                         : "=a"(p));
    return p;
}

/**
 * The thread pointer: glibc's TCB starts with a pointer to itself, so this is
 * pthread_self(). Original `movq %fs:0, %rax` (64 48 8b 04 25 00 00 00 00);
 * under X86_FEATURE_FSGSBASE `rdfsbase %rax` (f3 48 0f ae c0) + NOP4.
 * FSGSBASE counts only when the kernel enabled it (AT_HWCAP2): under valgrind
 * or `nofsgsbase` the original stays.
 */
ALTPATCH_PRIMITIVE_ void *altpatch_fs_self(void)
{
    void *p;
    __asm__ __volatile__(ALTERNATIVE("{movq %%fs:0, %0|mov %0, QWORD PTR fs:0}", "rdfsbase %0", X86_FEATURE_FSGSBASE)
                         : "=a"(p));
    return p;
}

/* The C library's sched_getcpu(), declared under a name of our own so that
 * this header needs neither _GNU_SOURCE nor <sched.h> (and cannot clash with
 * their declaration in C++). */
extern int altpatch_libc_sched_getcpu_(void) __asm__("sched_getcpu");

/**
 * Number of the CPU this thread runs on. Original `movl $-1, %ecx`
 * (b9 ff ff ff ff): the result 0xffffffff calls the C library's
 * sched_getcpu() instead (glibc reads the cpu_id of its rseq area, else asks
 * the vDSO or the getcpu system call), correct on every x86-64 Linux machine
 * and under valgrind; 0 if it fails. Under X86_FEATURE_RDPID `rdpid %rcx`
 * (f3 0f c7 f9) + NOP1 reads TSC_AUX, where Linux stores node << 12 | cpu (the
 * host set claims RDPID only where the instruction executes and TSC_AUX holds
 * this CPU's number).
 * Not `rdtscp`: Linux maintains TSC_AUX only where the CPU enumerates RDTSCP
 * or RDPID, and emulators may not run it. The thread may migrate right after:
 * pin it to rely on the value.
 */
ALTPATCH_PRIMITIVE_ unsigned altpatch_getcpu(void)
{
    unsigned long aux;
    __asm__ __volatile__(ALTERNATIVE("{movl $-1, %%ecx|mov ecx, -1}", "{rdpid %%rcx|rdpid rcx}",
                                     X86_FEATURE_RDPID)
                         : "=c"(aux));
    if (__builtin_expect(aux == 0xffffffffu, 0)) {
        int cpu = altpatch_libc_sched_getcpu_();
        return cpu < 0 ? 0u : (unsigned)cpu;
    }
    return (unsigned)(aux & 0xfff);
}

/**
 * The TSC, ordered after every earlier instruction (the kernel's
 * rdtsc_ordered()). ALTERNATIVE_2: `rdtsc` (0f 31 90 90 90; unordered, the
 * fallback), `lfence; rdtsc` (0f ae e8 0f 31) under X86_FEATURE_LFENCE_RDTSC,
 * `rdtscp` (0f 01 f9 + NOP2) under X86_FEATURE_RDTSCP (the last eligible
 * entry wins, so RDTSCP beats LFENCE_RDTSC). Clobbers ecx (rdtscp writes TSC_AUX there).
 */
ALTPATCH_PRIMITIVE_ uint64_t altpatch_rdtsc_ordered(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__(ALTERNATIVE_2("rdtsc", "lfence; rdtsc", X86_FEATURE_LFENCE_RDTSC,
                                       "rdtscp", X86_FEATURE_RDTSCP)
                         : "=a"(lo), "=d"(hi)
                         :
                         : "rcx", "memory");
    return ((uint64_t)hi << 32) | lo;
}

/* Every register the SysV ABI lets a callee change, except rax and rdi
 * (the asm's operands) and rsp (saved by hand around the call). */
#define ALTPATCH_CALL_CLOBBERS_BASE_                                                       \
    "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", \
        "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",        \
        "xmm14", "xmm15", "st", "st(1)", "st(2)", "st(3)", "st(4)", "st(5)", "st(6)",      \
        "st(7)", "mm0", "mm1", "mm2", "mm3", "mm4", "mm5", "mm6", "mm7", "memory", "cc"
#ifdef __AVX512F__
#define ALTPATCH_CALL_CLOBBERS_                                                            \
    ALTPATCH_CALL_CLOBBERS_BASE_, "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21",    \
        "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30",   \
        "xmm31", "k1", "k2", "k3", "k4", "k5", "k6", "k7"
#else
#define ALTPATCH_CALL_CLOBBERS_ ALTPATCH_CALL_CLOBBERS_BASE_
#endif

/* Compile-time check that @p fn is a `long (long)` function. */
#ifdef __cplusplus
#define ALTPATCH_CALL_CHECK_(fn)                                                           \
    static_assert(__is_same(__typeof__(&(fn)), long (*)(long)),                            \
                  "ALTPATCH_ALT_CALL: " #fn " must be long (long)")
#else
#define ALTPATCH_CALL_CHECK_(fn)                                                           \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&(fn)), long (*)(long)),        \
                   "ALTPATCH_ALT_CALL: " #fn " must be long (long)")
#endif

/**
 * Expression of type long: `oldfn(arg)`, or `newfn(arg)` once altpatch_apply()
 * found @p ft_flags (a feature id, or ALT_NOT(id)) true. Both functions must
 * have the type `long (long)` and be *local to the module*: `static`, or
 * `__attribute__((visibility("hidden")))` (the asm refers to them with an "i"
 * constraint, which position-independent code allows only for symbols that
 * cannot be interposed; a PIE's own functions also qualify).
 *
 * The site is exactly one `call rel32` (e8 + 4 bytes) to @p oldfn; the
 * replacement is `call newfn`, whose rel32 the planner relocates from the
 * replacement's address to the site's (new_disp = disp + repl - site). Around
 * the site the asm keeps the caller's rsp in rax, steps over the 128-byte red
 * zone, aligns rsp to 16 (the ABI's alignment at a call), pushes the old rsp
 * twice (alignment stays 16) and reloads it after the call; every
 * caller-saved register is clobbered.
 *
 * Unwinding: the macro takes `__builtin_frame_address(0)` (operand ap_frame,
 * which the template never reads), which makes gcc and clang give the
 * enclosing function a frame pointer and describe its frame
 * (CFA) from rbp for the whole body; the asm never writes rbp, so the
 * compiler's own CFI stays true while rsp moves, before and after apply (the
 * site stays a call at the same address). Exceptions thrown by the callee,
 * thread cancellation (forced unwinding) and backtrace(3) /
 * _Unwind_Backtrace() pass through the site. An empty `asm goto` (no
 * instruction) that the compiler must assume may jump to a call through an
 * unknown pointer (never executed) keeps it from deciding that the function
 * holding the site cannot throw, so the callers of that function keep their
 * exception regions and cleanups; the site needs no symbol of the library.
 * The compiler itself sees an asm
 * statement that cannot throw: a C++ `catch`, a destructor or a
 * `pthread_cleanup_push()` handler that must see an exception or cancellation
 * coming out of the callee belongs in a function that *calls* the one holding
 * the site (in the same function, C++ calls std::terminate() and C skips the
 * handler, as for any asm).
 *
 * Not available under `-mcmodel=large` (a function's address is no 32-bit
 * immediate there, and a `call rel32` may not reach): using the macro stops
 * the compilation with a message saying so. `-mcmodel=small` (the default)
 * and `medium` are supported.
 */
#if defined(__code_model_large__)
#define ALTPATCH_ALT_CALL(oldfn, newfn, ft_flags, arg)                                     \
    __extension__({                                                                        \
        ALTPATCH_CALL_LARGE_MODEL_();                                                      \
        (void)(arg);                                                                       \
        0L;                                                                                \
    })
#ifdef __cplusplus
#define ALTPATCH_CALL_LARGE_MODEL_()                                                       \
    static_assert(0, "ALTPATCH_ALT_CALL is not available under -mcmodel=large: "           \
                     "the site is a call rel32 to a 32-bit immediate address")
#else
#define ALTPATCH_CALL_LARGE_MODEL_()                                                       \
    _Static_assert(0, "ALTPATCH_ALT_CALL is not available under -mcmodel=large: "          \
                      "the site is a call rel32 to a 32-bit immediate address")
#endif
#else
#define ALTPATCH_ALT_CALL(oldfn, newfn, ft_flags, arg)                                     \
    __extension__({                                                                        \
        __label__ altpatch_unwinds_;                                                       \
        ALTPATCH_CALL_CHECK_(oldfn);                                                       \
        ALTPATCH_CALL_CHECK_(newfn);                                                       \
        long altpatch_ret_;                                                                \
        long altpatch_arg_ = (long)(arg);                                                  \
        __asm__ __volatile__("{mov %%rsp, %%rax|mov rax, rsp}\n\t"                        \
                             "{lea -128(%%rsp), %%rsp|lea rsp, [rsp-128]}\n\t"            \
                             "{and $-16, %%rsp|and rsp, -16}\n\t"                         \
                             "{push %%rax|push rax}\n\t"                                  \
                             "{push %%rax|push rax}\n\t"                                  \
                             ALTERNATIVE("call %P[ap_oldfn]", "call %P[ap_newfn]",         \
                                         ft_flags)                                         \
                             "\n\t{mov 8(%%rsp), %%rsp|mov rsp, [rsp+8]}"                 \
                             : "=a"(altpatch_ret_), "+D"(altpatch_arg_)                    \
                             : [ap_oldfn] "i"(oldfn), [ap_newfn] "i"(newfn),               \
                               [ap_frame] "r"(__builtin_frame_address(0))                  \
                             : ALTPATCH_CALL_CLOBBERS_);                                   \
        __asm__ goto("" : : : : altpatch_unwinds_);                                        \
        if (0) {                                                                           \
        altpatch_unwinds_: {                                                               \
            void (*altpatch_any_)(void);                                                   \
            __asm__("" : "=r"(altpatch_any_));                                             \
            altpatch_any_();                                                               \
        }                                                                                  \
        }                                                                                  \
        altpatch_ret_;                                                                     \
    })
#endif

/**
 * Make @p block this thread's GS base and store @p block in its first word, so
 * that altpatch_gs_self() returns @p block. Uses arch_prctl(ARCH_SET_GS)
 * (glibc does not use GS on x86-64, so the register is free). @p block must
 * stay valid while the thread uses altpatch_gs_self(). Returns 0, -EINVAL for
 * a NULL block, or the negative errno of arch_prctl.
 */
ALTPATCH_API int altpatch_gs_install(void *block);

/**
 * Whether altpatch_gs_self() returns this thread's own block: 0 when this
 * thread called altpatch_gs_install() and its GS base is still that block;
 * -ENOENT when this thread never installed one (a new thread starts with its
 * creator's GS base, so altpatch_gs_self() would return the creator's block;
 * a GS base of 0 would make it fault); -ESTALE when the GS base was changed
 * since by other means (arch_prctl, wrgsbase); or the negative errno of
 * arch_prctl(ARCH_GET_GS). Never faults; a system call, not for hot paths:
 * check once per thread, e.g. at its start.
 */
ALTPATCH_API int altpatch_gs_check(void);

#ifdef __cplusplus
}
#endif

#endif /* ALTPATCH_PRIMITIVES_H */
