/* SPDX-License-Identifier: MIT */
/*
 * altbench startup PROG [RUNS]: the whole start-up of a small program that
 * applies once (startup_main.c), with and without ALTPATCH_OFF=1.
 *
 * Each run is fork() + execve() + waitpid(), timed with CLOCK_MONOTONIC from
 * before fork() to after waitpid(). The two variants alternate run by run
 * (interleaved: a noisy neighbour hits both alike); the first two runs of each
 * are warm-up and not counted. Prints min and median of each and the apply's
 * share of start-up: (on - off) / off, for min and for median.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define AB_SU_MAX 100000u
#define AB_SU_WARMUP 2u

extern char **environ;

static uint64_t ab_su_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/** Wall time of one run of @p prog with environment @p envp, or 0 on failure. */
static uint64_t ab_su_run(const char *prog, char *const *envp)
{
    uint64_t t0 = ab_su_now();
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        char *argv[] = {(char *)prog, NULL};
        execve(prog, argv, envp);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return 0;
    uint64_t t = ab_su_now() - t0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? t : 0;
}

static int ab_su_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/** Environment of this process without ALTPATCH_OFF, plus @p extra when non-NULL. */
static char **ab_su_env(char *extra)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **e = calloc(n + 2, sizeof(*e));
    if (!e)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "ALTPATCH_", 9) != 0)
            e[k++] = environ[i];
    if (extra)
        e[k++] = extra;
    return e;
}

int ab_mode_startup(int argc, char **argv)
{
    if (argc < 1 || argc > 2) {
        fputs("usage: altbench startup PROG [RUNS]\n", stderr);
        return 2;
    }
    const char *prog = argv[0];
    unsigned long runs = argc > 1 ? strtoul(argv[1], NULL, 10) : 201;
    if (runs < 1 || runs > AB_SU_MAX) {
        fprintf(stderr, "altbench startup: RUNS must be 1..%u\n", AB_SU_MAX);
        return 2;
    }
    char off_var[] = "ALTPATCH_OFF=1";
    char **env_on = ab_su_env(NULL), **env_off = ab_su_env(off_var);
    uint64_t *on = calloc(runs, sizeof(*on)), *off = calloc(runs, sizeof(*off));
    int rc = 1;
    if (!env_on || !env_off || !on || !off) {
        fputs("altbench startup: out of memory\n", stderr);
        goto out;
    }
    for (unsigned long i = 0; i < runs + AB_SU_WARMUP; i++) {
        /* alternate which variant goes first, so neither always follows the other */
        uint64_t a, b;
        if (i & 1) {
            b = ab_su_run(prog, env_off);
            a = ab_su_run(prog, env_on);
        } else {
            a = ab_su_run(prog, env_on);
            b = ab_su_run(prog, env_off);
        }
        if (!a || !b) {
            fprintf(stderr, "altbench startup: %s failed to run\n", prog);
            goto out;
        }
        if (i >= AB_SU_WARMUP) {
            on[i - AB_SU_WARMUP] = a;
            off[i - AB_SU_WARMUP] = b;
        }
    }
    qsort(on, runs, sizeof(*on), ab_su_cmp);
    qsort(off, runs, sizeof(*off), ab_su_cmp);
    double on_min = (double)on[0], on_med = (double)on[runs / 2];
    double off_min = (double)off[0], off_med = (double)off[runs / 2];
    printf("startup prog=%s runs=%lu on_min_us=%.1f on_med_us=%.1f off_min_us=%.1f "
           "off_med_us=%.1f share_min=%.2f%% share_med=%.2f%%\n",
           prog, runs, on_min / 1e3, on_med / 1e3, off_min / 1e3, off_med / 1e3,
           100.0 * (on_min - off_min) / off_min, 100.0 * (on_med - off_med) / off_med);
    rc = 0;
out:
    free(env_on);
    free(env_off);
    free(on);
    free(off);
    return rc;
}
