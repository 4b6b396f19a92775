/* SPDX-License-Identifier: MIT */
/*
 * altdump --pid fixture: a program with sites written through
 * <altpatch/alternative.h>. It applies, runs every site once, prints "ready"
 * and its pid on stdout, then waits until stdin reaches EOF, so a test can
 * read its memory with `altdump --pid` and compare every site with the plan.
 * An optional argument names a shared library to dlopen before applying
 * (the corrupt-record library: its refused sites must stay original).
 */
#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

__attribute__((noinline)) static void *fs_self(void)
{
    void *p;
    __asm__ volatile(ALTERNATIVE("movq %%fs:0, %0", "rdfsbase %0", X86_FEATURE_FSGSBASE) : "=r"(p));
    return p;
}

__attribute__((noinline)) static void weak_fence(void)
{
    alternative("mfence; lfence", "", ALT_NOT(X86_FEATURE_APIC_MSRS_FENCE));
}

__attribute__((noinline)) static uint64_t rdtsc_ordered(void)
{
    uint32_t lo, hi;
    __asm__ volatile(ALTERNATIVE_2("rdtsc", "lfence; rdtsc", X86_FEATURE_LFENCE_RDTSC, "rdtscp",
                                   X86_FEATURE_RDTSCP)
                     : "=a"(lo), "=d"(hi)
                     :
                     : "rcx", "memory");
    return (uint64_t)hi << 32 | lo;
}

__attribute__((noinline, used)) long live_impl_old(long x)
{
    return x + 1;
}

__attribute__((noinline, used)) long live_impl_new(long x)
{
    return x + 2;
}

__attribute__((noinline)) static long alt_call(long x)
{
    long r;
    __asm__ volatile(ALTERNATIVE("call live_impl_old", "call live_impl_new", X86_FEATURE_AVX2)
                     : "=a"(r), "+D"(x)
                     :
                     : "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "memory", "cc");
    return r;
}

__attribute__((noinline)) static int never(void)
{
    int v;
    __asm__ volatile(ALTERNATIVE("movl $3, %0", "movl $4, %0", ALT_NOT(X86_FEATURE_ALWAYS))
                     : "=r"(v));
    return v;
}

int main(int argc, char **argv)
{
    altpatch_set_print(NULL); /* refusals of the corrupt library are expected */
    if (argc > 1 && !dlopen(argv[1], RTLD_NOW)) {
        fprintf(stderr, "live: %s\n", dlerror());
        return 1;
    }
    /* Let a sibling process (altdump) read our memory under Yama ptrace_scope=1. */
    (void)prctl(PR_SET_PTRACER, (unsigned long)-1, 0, 0, 0);
    int rc = altpatch_apply();
    if (rc != 0) {
        fprintf(stderr, "live: altpatch_apply: %d\n", rc);
        return 1;
    }
    weak_fence();
    volatile uint64_t t = rdtsc_ordered();
    (void)t;
    if (fs_self() == NULL || alt_call(1) < 2 || never() != 3) {
        fprintf(stderr, "live: a site computed a wrong value\n");
        return 1;
    }
    printf("ready %ld\n", (long)getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0)
        ;
    return 0;
}
