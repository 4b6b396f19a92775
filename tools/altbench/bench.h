/* SPDX-License-Identifier: MIT */
/*
 * altbench: shared helpers (TSC reads, pinning, min/median, markdown output).
 *
 * Every measurement in altbench is "TSC ticks around a loop": the TSC runs at
 * the nominal frequency, so ticks are not core cycles when the core boosts or
 * throttles. Ratios measured in the same run are the numbers to trust.
 */
#ifndef ALTBENCH_BENCH_H
#define ALTBENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Maximum repetitions of one measurement. */
#define AB_MAX_REPS 256

/** TSC ticks one sample aims at (short samples dodge preemption on a shared host). */
#define AB_TARGET_TICKS 1000000

/** Options common to every mode. */
struct ab_opts {
    uint64_t iters; /* executions per repetition (of one instruction / one call) */
    unsigned reps;  /* repetitions, interleaved across the rows */
    int cpu;        /* CPU to pin to, -1 = the one we run on */
};

/** min and median of one row. */
struct ab_stat {
    double min, med;
};

/** TSC read ordered after every earlier instruction (start of a timed region). */
static inline uint64_t ab_tsc_begin(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("lfence\n\trdtsc\n\tlfence" : "=a"(lo), "=d"(hi) : : "memory");
    return ((uint64_t)hi << 32) | lo;
}

/** TSC read after every earlier instruction retired (end of a timed region). */
static inline uint64_t ab_tsc_end(void)
{
    uint32_t lo, hi, aux;
    __asm__ __volatile__("rdtscp\n\tlfence" : "=a"(lo), "=d"(hi), "=c"(aux) : : "memory");
    (void)aux;
    return ((uint64_t)hi << 32) | lo;
}

/** Pin the calling thread to @p cpu (-1: the CPU it runs on now). Returns the CPU or -errno. */
int ab_pin(int cpu);

/**
 * Loop iterations for one sample of @p fn (a loop function taking its
 * iteration count and returning TSC ticks): about AB_TARGET_TICKS, between
 * 16 and @p max_iters.
 */
uint64_t ab_calibrate(uint64_t (*fn)(uint64_t), uint64_t max_iters);

/** min and median of @p n samples (sorts a copy). */
struct ab_stat ab_stat_of(const double *v, unsigned n);

/** min and median of @p n samples, sorting @p v itself (any n). */
struct ab_stat ab_stat_sort(double *v, size_t n);

/** Monotonic nanoseconds. */
uint64_t ab_now_ns(void);

/** Sink for results the compiler must not drop. */
extern volatile uint64_t ab_sink;

/** True when the kernel lets this process use rdfsbase/rdgsbase (AT_HWCAP2 bit 1). */
bool ab_fsgsbase_usable(void);
/** CPUID.7.0:ECX.RDPID[bit 22]. */
bool ab_has_rdpid(void);

/** Parse the common options (--iters, --reps, --cpu) from argv[first..]; exits on error. */
void ab_parse_opts(int argc, char **argv, int first, struct ab_opts *o);

/* Modes (one file each). Every mode prints markdown to stdout; 0 on success. */
int ab_mode_info(void);
int ab_mode_insn(const struct ab_opts *o);
int ab_mode_sites(const struct ab_opts *o, bool table, bool select);
int ab_mode_size(int argc, char **argv);
int ab_mode_scaling(int argc, char **argv);
int ab_mode_startup(int argc, char **argv);

#endif /* ALTBENCH_BENCH_H */
