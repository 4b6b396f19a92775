/* SPDX-License-Identifier: MIT */
/*
 * altbench: what an altpatch site costs, against the instructions themselves
 * and against what a user would write instead. See docs/benchmarks.md.
 *
 *   altbench info                         machine, kernel, compiler
 *   altbench insn   [opts]                per-instruction cost table
 *   altbench sites  [opts]                site cost vs alternatives
 *   altbench select [opts]                measured selection: ALTPATCH_CLEARCPUID line
 *   altbench all    [opts]                info + insn + sites + select
 *   altbench size ALT PLAIN SITES         text-size overhead of a generated program
 *   altbench scaling FILE...              apply-scaling table from the harness outputs
 *   altbench startup [-n RUNS] PROG...    start-up wall time with and without ALTPATCH_OFF=1
 *   altbench startup --inside [-n RUNS] PROG...  the first apply, timed inside each process
 *
 *   opts: --iters N (executions per repetition), --reps R, --cpu C
 */
#include "bench.h"

#include <cpuid.h>
#include <errno.h>
#include <stdint.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <altpatch/altpatch.h>

volatile uint64_t ab_sink;

int ab_pin(int cpu)
{
    if (cpu < 0)
        cpu = sched_getcpu();
    if (cpu < 0)
        return -errno;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        return -errno;
    return cpu;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct ab_stat ab_stat_sort(double *v, size_t n)
{
    struct ab_stat r = {0, 0};
    if (n == 0)
        return r;
    qsort(v, n, sizeof(*v), cmp_double);
    r.min = v[0];
    r.med = (n % 2) ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return r;
}

struct ab_stat ab_stat_of(const double *v, unsigned n)
{
    double s[AB_MAX_REPS];
    if (n > AB_MAX_REPS)
        n = AB_MAX_REPS;
    memcpy(s, v, n * sizeof(*s));
    return ab_stat_sort(s, n);
}

uint64_t ab_calibrate(uint64_t (*fn)(uint64_t), uint64_t max_iters)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t t = fn(64);
        best = t < best ? t : best;
    }
    uint64_t n = best ? (uint64_t)AB_TARGET_TICKS * 64 / best : max_iters;
    if (n > max_iters)
        n = max_iters;
    return n < 16 ? 16 : n;
}

uint64_t ab_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

bool ab_fsgsbase_usable(void)
{
    return (getauxval(AT_HWCAP2) & 2) != 0; /* HWCAP2_FSGSBASE */
}

bool ab_has_rdpid(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return false;
    return (c >> 22) & 1;
}

static void usage(FILE *f)
{
    fputs("usage: altbench info\n"
          "       altbench insn|sites|select|all [--iters N] [--reps R] [--cpu C]\n"
          "       altbench size ALT_PROG PLAIN_PROG SITES\n"
          "       altbench scaling RESULT_FILE...\n"
          "       altbench startup [--inside] [-n RUNS] PROG...\n",
          f);
}

void ab_parse_opts(int argc, char **argv, int first, struct ab_opts *o)
{
    for (int i = first; i < argc; i += 2) {
        const char *a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "altbench: option %s needs a value\n", a);
            usage(stderr);
            exit(2);
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(argv[i + 1], &end, 0);
        if (errno || *end || end == argv[i + 1]) {
            fprintf(stderr, "altbench: bad number '%s' for %s\n", argv[i + 1], a);
            exit(2);
        }
        if (!strcmp(a, "--iters") && v >= 16)
            o->iters = v;
        else if (!strcmp(a, "--reps") && v >= 1 && v <= AB_MAX_REPS)
            o->reps = (unsigned)v;
        else if (!strcmp(a, "--cpu") && v < CPU_SETSIZE)
            o->cpu = (int)v;
        else {
            fprintf(stderr, "altbench: bad option or value: %s %s (iters >= 16, 1 <= reps <= %d)\n",
                    a, argv[i + 1], AB_MAX_REPS);
            exit(2);
        }
    }
}

/* CPUID brand string (leaves 0x80000002..4), trimmed. */
static void cpu_brand(char out[49])
{
    unsigned r[12] = {0};
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002 + i, &r[i * 4], &r[i * 4 + 1], &r[i * 4 + 2], &r[i * 4 + 3]);
    memcpy(out, r, 48);
    out[48] = 0;
    size_t n = strlen(out);
    while (n && out[n - 1] == ' ')
        out[--n] = 0;
}

/* "model name" of /proc/cpuinfo (first CPU). */
static void proc_model_name(char *out, size_t sz)
{
    snprintf(out, sz, "(unreadable)");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10))
            continue;
        char *p = strchr(line, ':');
        if (p) {
            p += 1 + (p[1] == ' ');
            p[strcspn(p, "\n")] = 0;
            snprintf(out, sz, "%s", p);
        }
        break;
    }
    fclose(f);
}

/* Family / model / stepping as the kernel computes them from CPUID.1:EAX. */
static void cpu_fms(unsigned *fam, unsigned *model, unsigned *step)
{
    unsigned a = 0, b, c, d;
    __get_cpuid(1, &a, &b, &c, &d);
    *fam = (a >> 8) & 0xf;
    *model = (a >> 4) & 0xf;
    *step = a & 0xf;
    if (*fam == 0xf)
        *fam += (a >> 20) & 0xff;
    if (*fam >= 6)
        *model += ((a >> 16) & 0xf) << 4;
}

/* The compiler that built altbench (the sites' code is compiled by it too). */
static const char *ab_compiler(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown";
#endif
}

int ab_mode_info(void)
{
    char brand[49], model[256];
    unsigned fam, mod, step;
    struct utsname u;
    cpu_brand(brand);
    proc_model_name(model, sizeof(model));
    cpu_fms(&fam, &mod, &step);
    if (uname(&u) != 0)
        snprintf(u.release, sizeof(u.release), "(unknown)");
    struct altpatch_features *h = altpatch_features_host();
    printf("### Machine\n\n| item | value |\n|---|---|\n");
    printf("| CPU (CPUID brand string) | %s |\n", brand);
    printf("| CPU (/proc/cpuinfo model name) | %s |\n", model);
    printf("| vendor, family / model / stepping | %s, %u (0x%x) / %u (0x%x) / %u |\n",
           h ? altpatch_features_vendor(h) : "?", fam, fam, mod, mod, step);
    printf("| online CPUs | %ld |\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("| kernel (uname -r) | %s |\n", u.release);
    printf("| altbench compiler | %s |\n", ab_compiler());
    printf("| FSGSBASE usable (AT_HWCAP2) | %s |\n", ab_fsgsbase_usable() ? "yes" : "no");
    printf("| RDPID (CPUID) | %s |\n", ab_has_rdpid() ? "yes" : "no");
    printf("| RDTSCP usable (CPUID, executed) | %s |\n",
           altpatch_cpu_has(X86_FEATURE_RDTSCP) ? "yes" : "no");
    printf("| altpatch | %s |\n\n", altpatch_version());
    altpatch_features_free(h);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *mode = argv[1];
    struct ab_opts o = {.iters = 4000000, .reps = 31, .cpu = -1};
    if (!strcmp(mode, "info"))
        return ab_mode_info();
    if (!strcmp(mode, "size"))
        return ab_mode_size(argc - 2, argv + 2);
    if (!strcmp(mode, "scaling"))
        return ab_mode_scaling(argc - 2, argv + 2);
    if (!strcmp(mode, "startup"))
        return ab_mode_startup(argc - 2, argv + 2);
    if (strcmp(mode, "insn") && strcmp(mode, "sites") && strcmp(mode, "select") &&
        strcmp(mode, "all")) {
        fprintf(stderr, "altbench: unknown mode '%s'\n", mode);
        usage(stderr);
        return 2;
    }
    ab_parse_opts(argc, argv, 2, &o);
    int cpu = ab_pin(o.cpu);
    if (cpu < 0) {
        fprintf(stderr, "altbench: cannot pin to CPU %d: %s\n", o.cpu, strerror(-cpu));
        return 1;
    }
    o.cpu = cpu;
    printf("<!-- altbench %s: pinned to CPU %d, %u repetitions of %llu executions -->\n\n", mode,
           cpu, o.reps, (unsigned long long)o.iters);
    int rc = 0;
    if (!strcmp(mode, "all"))
        rc |= ab_mode_info();
    if (!strcmp(mode, "insn") || !strcmp(mode, "all"))
        rc |= ab_mode_insn(&o);
    if (!strcmp(mode, "sites") || !strcmp(mode, "select") || !strcmp(mode, "all"))
        rc |= ab_mode_sites(&o, strcmp(mode, "select") != 0, strcmp(mode, "sites") != 0);
    return rc ? 1 : 0;
}
