/* SPDX-License-Identifier: MIT */
/* altbench: the dispatch mechanisms compared with altpatch sites (see dispatch.h). */
#include "dispatch.h"

#include <cpuid.h>
#include <string.h>
#include <sys/auxv.h>

#include <altpatch/altpatch.h>

#define AB_NOINLINE static __attribute__((noinline))

__attribute__((noinline)) long ab_call_old(long x)
{
    __asm__ __volatile__("" : "+r"(x));
    return x * 3 + 1;
}

__attribute__((noinline)) long ab_call_new(long x)
{
    __asm__ __volatile__("" : "+r"(x));
    return x * 3 + 2;
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
AB_NOINLINE uint64_t impl_cpu_rdtscp(void) { return ab_cpu_rdtscp(); }
AB_NOINLINE uint64_t impl_cpu_rdpid(void) { return ab_cpu_rdpid(); }
AB_NOINLINE uint64_t impl_tsc_rdtsc(void) { return ab_tsc_rdtsc(); }
AB_NOINLINE uint64_t impl_tsc_lfence(void) { return ab_tsc_lfence_rdtsc(); }
AB_NOINLINE uint64_t impl_tsc_rdtscp(void) { return ab_tsc_rdtscp(); }

struct ab_fp_table ab_fp;
volatile struct ab_flag_table ab_flags;

/* --- IFUNC resolvers: run by the loader, so raw CPUID and getauxval only. -- */

typedef uint64_t ab_u64_fn(void);
typedef long ab_call_fn(long);

static bool cpuid_bit(unsigned leaf, unsigned sub, int reg, unsigned bit)
{
    unsigned r[4] = {0};
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3]))
        return false;
    return (r[reg] >> bit) & 1;
}

static bool vendor_amd_like(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    char v[13];
    __get_cpuid(0, &a, &b, &c, &d);
    memcpy(v, &b, 4);
    memcpy(v + 4, &d, 4);
    memcpy(v + 8, &c, 4);
    v[12] = 0;
    return !strcmp(v, "AuthenticAMD") || !strcmp(v, "HygonGenuine");
}

static bool fsgs_usable(void) { return (getauxval(AT_HWCAP2) & 2) != 0; }

__attribute__((used)) static ab_u64_fn *resolve_fence(void)
{
    return vendor_amd_like() ? impl_fence_none : impl_fence_full;
}
__attribute__((used)) static ab_u64_fn *resolve_fs(void)
{
    return fsgs_usable() ? impl_fs_rd : impl_fs_mov;
}
__attribute__((used)) static ab_u64_fn *resolve_gs(void)
{
    return fsgs_usable() ? impl_gs_rd : impl_gs_mov;
}
__attribute__((used)) static ab_u64_fn *resolve_cpu(void)
{
    return cpuid_bit(7, 0, 2, 22) ? impl_cpu_rdpid : impl_cpu_rdtscp;
}
__attribute__((used)) static ab_u64_fn *resolve_tsc(void)
{
    if (cpuid_bit(0x80000001, 0, 3, 27))
        return impl_tsc_rdtscp;
    return impl_tsc_lfence; /* LFENCE_RDTSC: every x86-64 CPU with SSE2, as the kernel assumes */
}
__attribute__((used)) static ab_call_fn *resolve_call(void)
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
    return x * 3 + 2;
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
    ab_fp.cpu = rdpid ? impl_cpu_rdpid : impl_cpu_rdtscp;
    ab_fp.tsc = rdtscp ? impl_tsc_rdtscp : lfence ? impl_tsc_lfence : impl_tsc_rdtsc;
    ab_fp.call = call ? ab_call_new : ab_call_old;
    ab_flags.fence = fence;
    ab_flags.fsgsbase = fsgs;
    ab_flags.rdpid = rdpid;
    ab_flags.rdtscp = rdtscp;
    ab_flags.lfence_rdtsc = lfence;
    ab_flags.call = call;
}
