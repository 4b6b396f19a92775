/* SPDX-License-Identifier: MIT */
/*
 * altbench: hand-written sequences and the dispatch mechanisms a user would
 * write instead of an altpatch site (function pointer, GNU IFUNC,
 * target_clones, a branch on a global flag). Definitions in dispatch.c.
 */
#ifndef ALTBENCH_DISPATCH_H
#define ALTBENCH_DISPATCH_H

#include <sched.h> /* sched_getcpu (the sources define _GNU_SOURCE) */
#include <stdbool.h>
#include <stdint.h>

#include <altpatch/cpufeatures.h>
#include <altpatch/primitives.h> /* ALTPATCH_CALL_CLOBBERS_ */

#define AB_INLINE static inline __attribute__((always_inline))
#define AB_LOCAL __attribute__((visibility("hidden")))

/** Feature keying the ALTPATCH_ALT_CALL site of the benchmark. */
#define AB_CALL_FEATURE X86_FEATURE_AVX2

AB_INLINE uint64_t ab_fs_mov(void)
{
    uint64_t p;
    __asm__ __volatile__("movq %%fs:0, %0" : "=r"(p));
    return p;
}
AB_INLINE uint64_t ab_fs_rd(void)
{
    uint64_t p;
    __asm__ __volatile__("rdfsbase %0" : "=r"(p));
    return p;
}
AB_INLINE uint64_t ab_gs_mov(void)
{
    uint64_t p;
    __asm__ __volatile__("movq %%gs:0, %0" : "=r"(p));
    return p;
}
AB_INLINE uint64_t ab_gs_rd(void)
{
    uint64_t p;
    __asm__ __volatile__("rdgsbase %0" : "=r"(p));
    return p;
}
/* altpatch_getcpu()'s original: what glibc answers (rseq cpu_id, else vDSO/syscall). */
AB_INLINE uint64_t ab_cpu_libc(void)
{
    return (unsigned)sched_getcpu();
}
AB_INLINE uint64_t ab_cpu_rdpid(void)
{
    uint64_t aux;
    __asm__ __volatile__("rdpid %0" : "=r"(aux));
    return aux & 0xfff;
}
AB_INLINE uint64_t ab_tsc_rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
AB_INLINE uint64_t ab_tsc_lfence_rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("lfence; rdtsc" : "=a"(lo), "=d"(hi) : : "memory");
    return ((uint64_t)hi << 32) | lo;
}
AB_INLINE uint64_t ab_tsc_rdtscp(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdtscp" : "=a"(lo), "=d"(hi) : : "rcx", "memory");
    return ((uint64_t)hi << 32) | lo;
}

/*
 * The replacement each primitive's site holds after patching, with the
 * site's own register constraints and clobbers (primitives.h uses fixed
 * registers) but no padding and no records: patched site vs these isolates
 * what patching itself costs.
 */
AB_INLINE uint64_t ab_same_fs_rd(void)
{
    uint64_t p;
    __asm__ __volatile__("rdfsbase %0" : "=a"(p));
    return p;
}
AB_INLINE uint64_t ab_same_gs_rd(void)
{
    uint64_t p;
    __asm__ __volatile__("rdgsbase %0" : "=a"(p));
    return p;
}
AB_INLINE uint64_t ab_same_cpu_rdpid(void)
{
    unsigned long aux;
    __asm__ __volatile__("rdpid %%rcx" : "=c"(aux) : : "rax", "rdx");
    return aux & 0xfff;
}
AB_INLINE uint64_t ab_same_tsc_rdtscp(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdtscp" : "=a"(lo), "=d"(hi) : : "rcx", "memory");
    return ((uint64_t)hi << 32) | lo;
}

/** The two targets of the ALTPATCH_ALT_CALL site (noinline, module-local). */
AB_LOCAL long ab_call_old(long x);
AB_LOCAL long ab_call_new(long x);

/** ALTPATCH_ALT_CALL's sequence around a plain `call newfn` (no site). */
#define AB_SAME_CALL(fn, arg)                                                              \
    __extension__({                                                                        \
        long ret_, arg_ = (long)(arg);                                                     \
        __asm__ __volatile__("lea -128(%%rsp), %%rsp\n\tpush %%rbp\n\tmov %%rsp, %%rbp\n\t"  \
                             "and $-16, %%rsp\n\tcall %P[f]\n\tmov %%rbp, %%rsp\n\t"         \
                             "pop %%rbp\n\tlea 128(%%rsp), %%rsp"                             \
                             : "=a"(ret_), "+D"(arg_)                                      \
                             : [f] "i"(fn)                                                 \
                             : ALTPATCH_CALL_CLOBBERS_);                                   \
        ret_;                                                                              \
    })

/** Function pointers, set by ab_dispatch_init() for this CPU. */
struct ab_fp_table {
    uint64_t (*fence)(void);
    uint64_t (*fs)(void);
    uint64_t (*gs)(void);
    uint64_t (*cpu)(void);
    uint64_t (*tsc)(void);
    long (*call)(long);
};
extern AB_LOCAL struct ab_fp_table ab_fp;

/** Global flags, read on every call (volatile), set by ab_dispatch_init(). */
struct ab_flag_table {
    bool fence, fsgsbase, rdpid, rdtscp, lfence_rdtsc, call;
};
extern AB_LOCAL volatile struct ab_flag_table ab_flags;

/** GNU IFUNCs: resolved by the dynamic loader from CPUID / AT_HWCAP2. */
AB_LOCAL uint64_t ab_ifunc_fence(void);
AB_LOCAL uint64_t ab_ifunc_fs(void);
AB_LOCAL uint64_t ab_ifunc_gs(void);
AB_LOCAL uint64_t ab_ifunc_cpu(void);
AB_LOCAL uint64_t ab_ifunc_tsc(void);
AB_LOCAL long ab_ifunc_call(long x);

/**
 * target_clones("avx2", "default") version of ab_call_new (same body). clang 14
 * needs the attribute on the declaration its callers see; gcc 12 must not see
 * it there (it would emit a second resolver in every caller's object).
 */
#ifdef __clang__
__attribute__((target_clones("avx2", "default")))
#endif
long ab_clones_call(long x);

/** Fill ab_fp and ab_flags from altpatch_cpu_has(). */
AB_LOCAL void ab_dispatch_init(void);

#endif /* ALTBENCH_DISPATCH_H */
