/* SPDX-License-Identifier: MIT */
/*
 * Part 1: per-instruction cost, the kernel thread's method: TSC around a loop
 * whose body is one `asm volatile` with the instruction unrolled 16 times,
 * the result kept live after the loop, the thread pinned to one CPU. Each row
 * is repeated (repetitions interleaved across rows to spread drift evenly);
 * min and median are reported, both raw and net of the empty loop.
 */
#include "bench.h"

#include <stdio.h>
#include <string.h>

#include <altpatch/primitives.h>

#define R4_(s) s s s s
#define R16_(s) R4_(R4_(s))

/* One timed loop: @p n iterations of 16 copies of @p insn. */
#define AB_INSN_LOOP(fname, insn, outs, ins, ...)                                     \
    static __attribute__((noinline)) uint64_t fname(uint64_t n)                            \
    {                                                                                      \
        uint64_t v = 0;                                                                    \
        uint64_t t0 = ab_tsc_begin();                                                      \
        for (uint64_t i = 0; i < n; i++)                                                   \
            __asm__ __volatile__(R16_(insn "\n\t") outs ins __VA_ARGS__);                     \
        uint64_t t1 = ab_tsc_end();                                                        \
        ab_sink = v;                                                                       \
        return t1 - t0;                                                                    \
    }

static uint64_t ab_mem = 42;

AB_INSN_LOOP(l_empty, "", : "+r"(v), :, )
AB_INSN_LOOP(l_nop, "nop", : "+r"(v), :, )
AB_INSN_LOOP(l_load, "movq (%1), %0", : "=&r"(v), : "r"(&ab_mem), : "memory")
AB_INSN_LOOP(l_movfs, "movq %%fs:0, %0", : "=r"(v), :, )
AB_INSN_LOOP(l_movgs, "movq %%gs:0, %0", : "=r"(v), :, )
AB_INSN_LOOP(l_rdfsbase, "rdfsbase %0", : "=r"(v), :, )
AB_INSN_LOOP(l_rdgsbase, "rdgsbase %0", : "=r"(v), :, )
AB_INSN_LOOP(l_mfence_lfence, "mfence; lfence", : "+r"(v), :, : "memory")
AB_INSN_LOOP(l_lfence, "lfence", : "+r"(v), :, : "memory")
AB_INSN_LOOP(l_mfence, "mfence", : "+r"(v), :, : "memory")
AB_INSN_LOOP(l_lockadd, "lock addl $0,-4(%%rsp)", : "+r"(v), :, : "memory", "cc")
AB_INSN_LOOP(l_rdtsc, "rdtsc", : "=a"(v), :, : "rdx")
AB_INSN_LOOP(l_rdtscp, "rdtscp", : "=a"(v), :, : "rdx", "rcx")
AB_INSN_LOOP(l_rdpid, "rdpid %0", : "=r"(v), :, )
AB_INSN_LOOP(l_lfence_rdtsc, "lfence; rdtsc", : "=a"(v), :, : "rdx", "memory")

enum { NEED_NONE, NEED_GS, NEED_FSGSBASE, NEED_FSGSBASE_GS, NEED_RDPID, NEED_RDTSCP };

struct insn_row {
    const char *name;
    uint64_t (*fn)(uint64_t);
    int need;
};

static const struct insn_row rows[] = {
    {"nop", l_nop, NEED_NONE},
    {"load from memory (movq (%reg), %reg)", l_load, NEED_NONE},
    {"movq %fs:0, %reg", l_movfs, NEED_NONE},
    {"movq %gs:0, %reg (GS block installed)", l_movgs, NEED_GS},
    {"rdfsbase", l_rdfsbase, NEED_FSGSBASE},
    {"rdgsbase", l_rdgsbase, NEED_FSGSBASE_GS},
    {"mfence; lfence", l_mfence_lfence, NEED_NONE},
    {"lfence", l_lfence, NEED_NONE},
    {"mfence", l_mfence, NEED_NONE},
    {"lock addl $0,-4(%rsp)", l_lockadd, NEED_NONE},
    {"rdtsc", l_rdtsc, NEED_NONE},
    {"rdtscp", l_rdtscp, NEED_RDTSCP},
    {"rdpid", l_rdpid, NEED_RDPID},
    {"lfence; rdtsc", l_lfence_rdtsc, NEED_NONE},
};
#define NROWS (sizeof(rows) / sizeof(rows[0]))

static void *gs_block[8] __attribute__((aligned(64)));

/* Why a row cannot run here, or NULL. */
static const char *row_skip_reason(int need, bool gs_ok)
{
    bool fsgs = ab_fsgsbase_usable();
    switch (need) {
    case NEED_GS:
        return gs_ok ? NULL : "skipped: altpatch_gs_install() failed";
    case NEED_FSGSBASE:
        return fsgs ? NULL : "skipped: FSGSBASE not usable (AT_HWCAP2), would SIGILL";
    case NEED_FSGSBASE_GS:
        if (!fsgs)
            return "skipped: FSGSBASE not usable (AT_HWCAP2), would SIGILL";
        return gs_ok ? NULL : "skipped: altpatch_gs_install() failed";
    case NEED_RDPID:
        return ab_has_rdpid() ? NULL : "skipped: no RDPID in CPUID";
    case NEED_RDTSCP: /* the library's answer: CPUID's claim and the instruction run */
        return altpatch_cpu_has(X86_FEATURE_RDTSCP)
                   ? NULL
                   : "skipped: RDTSCP not usable (CPUID, or it does not execute)";
    default:
        return NULL;
    }
}

int ab_mode_insn(const struct ab_opts *o)
{
    static double raw[NROWS][AB_MAX_REPS], empty[AB_MAX_REPS];
    uint64_t n[NROWS], max = o->iters / 16;
    bool gs_ok = altpatch_gs_install(gs_block) == 0;
    const char *skip[NROWS];
    for (size_t i = 0; i < NROWS; i++) {
        skip[i] = row_skip_reason(rows[i].need, gs_ok);
        n[i] = skip[i] ? 0 : ab_calibrate(rows[i].fn, max); /* also warms up */
    }
    uint64_t ne = n[0]; /* the empty loop runs as many iterations as the nop row */
    for (unsigned r = 0; r < o->reps; r++) {
        empty[r] = (double)l_empty(ne) / (double)(ne * 16);
        for (size_t i = 0; i < NROWS; i++)
            if (!skip[i])
                raw[i][r] = (double)rows[i].fn(n[i]) / (double)(n[i] * 16);
    }
    struct ab_stat e = ab_stat_of(empty, o->reps);
    printf("### Per-instruction cost (TSC ticks per instruction)\n\n");
    printf("Method: a loop around one `asm volatile` holding the instruction 16 times "
           "(result kept live), timed with rdtsc; each sample sized to about %d ticks "
           "(at most %llu executions; the kernel thread used 100M: `--iters 100000000` "
           "reproduces that), %u samples per row interleaved across rows, pinned to CPU %d. "
           "*net* = raw minus the empty loop (same loop, empty asm), whose share per "
           "instruction slot is min %.3f / median %.3f ticks. Independent instructions: "
           "throughput, not latency.\n\n",
           AB_TARGET_TICKS, (unsigned long long)(max * 16), o->reps, o->cpu, e.min, e.med);
    printf("| instruction | net min | net median | raw min | raw median | executions/sample |\n");
    printf("|---|---:|---:|---:|---:|---:|\n");
    printf("| (empty loop, per slot) | - | - | %.3f | %.3f | %llu |\n", e.min, e.med,
           (unsigned long long)(ne * 16));
    for (size_t i = 0; i < NROWS; i++) {
        if (skip[i]) {
            printf("| %s (%s) | - | - | - | - | - |\n", rows[i].name, skip[i]);
            continue;
        }
        struct ab_stat s = ab_stat_of(raw[i], o->reps);
        double nmin = s.min - e.min, nmed = s.med - e.med;
        printf("| %s | %.3f | %.3f | %.3f | %.3f | %llu |\n", rows[i].name, nmin < 0 ? 0 : nmin,
               nmed < 0 ? 0 : nmed, s.min, s.med, (unsigned long long)(n[i] * 16));
    }
    printf("\n");
    return 0;
}
