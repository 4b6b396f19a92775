/* SPDX-License-Identifier: MIT */
/* altbench: the dispatch mechanisms compared with altpatch sites (see dispatch.h). */
#include "dispatch.h"

#include <cpuid.h>
#include <sys/auxv.h>

#include <altpatch/altpatch.h>

#define AB_NOINLINE static __attribute__((noinline))

__attribute__((noinline)) long ab_call_old(long x)
{
    __asm__ __volatile__("" : "+r"(x));
    return (long)((unsigned long)x * 3 + 1); /* wraps, no UB */
}

__attribute__((noinline)) long ab_call_new(long x)
{
    __asm__ __volatile__("" : "+r"(x));
    return (long)((unsigned long)x * 3 + 2); /* wraps, no UB */
}

AB_NOINLINE uint64_t impl_fence_full(void)
{
    __asm__ __volatile__("mfence; lfence" : : : "memory");
    return 0;
}
AB_NOINLINE uint64_t impl_fence_none(void)
{
    __asm__ __volatile__("" : : : "memory");
    return 0;
}
AB_NOINLINE uint64_t impl_fs_mov(void) { return ab_fs_mov(); }
AB_NOINLINE uint64_t impl_fs_rd(void) { return ab_fs_rd(); }
AB_NOINLINE uint64_t impl_gs_mov(void) { return ab_gs_mov(); }
AB_NOINLINE uint64_t impl_gs_rd(void) { return ab_gs_rd(); }
AB_NOINLINE uint64_t impl_cpu_libc(void) { return ab_cpu_libc(); }
AB_NOINLINE uint64_t impl_cpu_rdpid(void) { return ab_cpu_rdpid(); }
AB_NOINLINE uint64_t impl_tsc_rdtsc(void) { return ab_tsc_rdtsc(); }
AB_NOINLINE uint64_t impl_tsc_lfence(void) { return ab_tsc_lfence_rdtsc(); }
AB_NOINLINE uint64_t impl_tsc_rdtscp(void) { return ab_tsc_rdtscp(); }

struct ab_fp_table ab_fp;
volatile struct ab_flag_table ab_flags;

/* --- IFUNC resolvers ------------------------------------------------------
 * They run inside the dynamic loader's relocation pass, before sanitizer
 * runtimes are initialized: raw CPUID and getauxval only, no instrumentation,
 * no libc string functions (ASan intercepts them). */

typedef uint64_t ab_u64_fn(void);
typedef long ab_call_fn(long);

#define AB_RESOLVER __attribute__((used, no_sanitize("address", "undefined")))

AB_RESOLVER static bool cpuid_bit(unsigned leaf, unsigned sub, int reg, unsigned bit)
{
    unsigned r[4] = {0};
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3]))
        return false;
    return (r[reg] >> bit) & 1;
}

/* "AuthenticAMD" / "HygonGenuine" as CPUID.0 returns them in ebx, edx, ecx. */
AB_RESOLVER static bool vendor_amd_like(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    __get_cpuid(0, &a, &b, &c, &d);
    return (b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163) ||
           (b == 0x6f677948 && d == 0x6e65476e && c == 0x656e6975);
}

AB_RESOLVER static bool fsgs_usable(void) { return (getauxval(AT_HWCAP2) & 2) != 0; }

AB_RESOLVER static ab_u64_fn *resolve_fence(void)
{
    return vendor_amd_like() ? impl_fence_none : impl_fence_full;
}
AB_RESOLVER static ab_u64_fn *resolve_fs(void)
{
    return fsgs_usable() ? impl_fs_rd : impl_fs_mov;
}
AB_RESOLVER static ab_u64_fn *resolve_gs(void)
{
    return fsgs_usable() ? impl_gs_rd : impl_gs_mov;
}
AB_RESOLVER static ab_u64_fn *resolve_cpu(void)
{
    return cpuid_bit(7, 0, 2, 22) ? impl_cpu_rdpid : impl_cpu_libc;
}
AB_RESOLVER static ab_u64_fn *resolve_tsc(void)
{
    if (cpuid_bit(0x80000001, 0, 3, 27))
        return impl_tsc_rdtscp;
    return impl_tsc_lfence; /* LFENCE_RDTSC: every x86-64 CPU with SSE2, as the kernel assumes */
}
AB_RESOLVER static ab_call_fn *resolve_call(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? ab_call_new : ab_call_old;
}

uint64_t ab_ifunc_fence(void) __attribute__((ifunc("resolve_fence")));
uint64_t ab_ifunc_fs(void) __attribute__((ifunc("resolve_fs")));
uint64_t ab_ifunc_gs(void) __attribute__((ifunc("resolve_gs")));
uint64_t ab_ifunc_cpu(void) __attribute__((ifunc("resolve_cpu")));
uint64_t ab_ifunc_tsc(void) __attribute__((ifunc("resolve_tsc")));
long ab_ifunc_call(long x) __attribute__((ifunc("resolve_call")));

__attribute__((target_clones("avx2", "default"), noinline)) long ab_clones_call(long x)
{
    __asm__ __volatile__("" : "+r"(x));
    return (long)((unsigned long)x * 3 + 2); /* wraps, no UB */
}

void ab_dispatch_init(void)
{
    bool fence = altpatch_cpu_has(X86_FEATURE_APIC_MSRS_FENCE);
    bool fsgs = altpatch_cpu_has(X86_FEATURE_FSGSBASE);
    bool rdpid = altpatch_cpu_has(X86_FEATURE_RDPID);
    bool rdtscp = altpatch_cpu_has(X86_FEATURE_RDTSCP);
    bool lfence = altpatch_cpu_has(X86_FEATURE_LFENCE_RDTSC);
    bool call = altpatch_cpu_has(AB_CALL_FEATURE);
    ab_fp.fence = fence ? impl_fence_full : impl_fence_none;
    ab_fp.fs = fsgs ? impl_fs_rd : impl_fs_mov;
    ab_fp.gs = fsgs ? impl_gs_rd : impl_gs_mov;
    ab_fp.cpu = rdpid ? impl_cpu_rdpid : impl_cpu_libc;
    ab_fp.tsc = rdtscp ? impl_tsc_rdtscp : lfence ? impl_tsc_lfence : impl_tsc_rdtsc;
    ab_fp.call = call ? ab_call_new : ab_call_old;
    ab_flags.fence = fence;
    ab_flags.fsgsbase = fsgs;
    ab_flags.rdpid = rdpid;
    ab_flags.rdtscp = rdtscp;
    ab_flags.lfence_rdtsc = lfence;
    ab_flags.call = call;
}
