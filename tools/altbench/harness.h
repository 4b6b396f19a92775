/* SPDX-License-Identifier: MIT */
/*
 * Shared by the harnesses linked into the generated programs (apply_main.c,
 * xray_main.c): pinning, timing, cold runs in fork()ed children, and the
 * one-line `key=value` result format that `altbench scaling` reads.
 */
#ifndef ALTBENCH_HARNESS_H
#define ALTBENCH_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity, sched_getcpu */
#endif

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AB_H_MAX_REPS 64

/** What one timed call reports. */
struct ab_h_sample {
    uint64_t ns;
    int64_t rc;
    uint64_t c[8]; /* counters, meaning per caller */
};

static inline uint64_t ab_h_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline int ab_h_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/** Sort the ns of @p s[0..n) and give min and median. */
static inline void ab_h_minmed(const struct ab_h_sample *s, unsigned n, uint64_t *min,
                               uint64_t *med)
{
    uint64_t v[AB_H_MAX_REPS];
    for (unsigned i = 0; i < n; i++)
        v[i] = s[i].ns;
    qsort(v, n, sizeof(v[0]), ab_h_cmp);
    *min = v[0];
    *med = (n % 2) ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/** Parse "[REPS [CPU]]"; pin to CPU (default: where we run). Exits on bad input. */
static inline unsigned ab_h_setup(int argc, char **argv)
{
    unsigned reps = 7;
    int cpu = sched_getcpu();
    if (argc > 1)
        reps = (unsigned)strtoul(argv[1], NULL, 0);
    if (argc > 2)
        cpu = (int)strtol(argv[2], NULL, 0);
    if (reps < 1 || reps > AB_H_MAX_REPS || cpu < 0 || cpu >= CPU_SETSIZE) {
        fprintf(stderr, "usage: %s [REPS 1..%d [CPU]]\n", argv[0], AB_H_MAX_REPS);
        exit(2);
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
        fprintf(stderr, "%s: cannot pin to CPU %d: %s\n", argv[0], cpu, strerror(errno));
        exit(1);
    }
    return reps;
}

/**
 * Run @p fn once in each of @p reps fork()ed children (a fresh, never-patched
 * copy of this process each time) and collect what each reported.
 * Returns 0, or -1 when a child failed.
 */
static inline int ab_h_cold(unsigned reps, void (*fn)(struct ab_h_sample *), struct ab_h_sample *out)
{
    for (unsigned r = 0; r < reps; r++) {
        int fd[2];
        if (pipe(fd) != 0)
            return -1;
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            struct ab_h_sample s;
            memset(&s, 0, sizeof(s));
            fn(&s);
            ssize_t w = write(fd[1], &s, sizeof(s));
            _exit(w == (ssize_t)sizeof(s) ? 0 : 1);
        }
        close(fd[1]);
        ssize_t got = read(fd[0], &out[r], sizeof(out[r]));
        close(fd[0]);
        int st = 0;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
            got != (ssize_t)sizeof(out[r]))
            return -1;
    }
    return 0;
}

#endif /* ALTBENCH_HARNESS_H */
