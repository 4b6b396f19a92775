/* SPDX-License-Identifier: MIT */
/*
 * altbench startup [-n RUNS] PROG...: the whole start-up of small programs
 * that apply once (startup_main.c), each with and without ALTPATCH_OFF=1
 * (several programs: builds of the same program to compare, in one run).
 *
 * altbench startup --inside [-n RUNS] PROG...: the first altpatch_apply()
 * timed inside each fresh process instead (the programs print apply_ns=N
 * when ALTBENCH_STARTUP_NS is set), the programs interleaved the same way;
 * min, 10th percentile and median.
 *
 * Each run is fork() + execve() + waitpid(), timed with CLOCK_MONOTONIC from
 * before fork() to after waitpid(). Every variant runs once per round, the
 * first one rotating (interleaved: a noisy neighbour hits all alike); the
 * first two rounds are warm-up and not counted. Prints min and median of each and the apply's
 * share of start-up: (on - off) / off, for min and for median.
 */
#include <errno.h>
#include <stdbool.h>
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

/**
 * One run of @p prog that reports its apply time on stdout ("apply_ns=N"):
 * that time in ns, or 0 on failure.
 */
static uint64_t ab_su_run_inside(const char *prog, char *const *envp)
{
    int fd[2];
    if (pipe(fd) != 0)
        return 0;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return 0;
    }
    if (pid == 0) {
        close(fd[0]);
        if (dup2(fd[1], STDOUT_FILENO) < 0)
            _exit(127);
        char *argv[] = {(char *)prog, NULL};
        execve(prog, argv, envp);
        _exit(127);
    }
    close(fd[1]);
    char buf[256];
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd[0], buf + len, sizeof(buf) - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == sizeof(buf) - 1)
            break;
    }
    buf[len] = '\0';
    close(fd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return 0;
    unsigned long long ns = 0;
    const char *p = strstr(buf, "apply_ns=");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !p || sscanf(p, "apply_ns=%llu", &ns) != 1)
        return 0;
    return ns ? (uint64_t)ns : 1;
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

#define AB_SU_MAXPROG 8

static char ab_su_ns_var[] = "ALTBENCH_STARTUP_NS=1";

/** --inside: each program's own apply time, interleaved rounds, 2 warm-up rounds. */
static int ab_su_inside(unsigned long runs, unsigned np, char **progs)
{
    char **env = ab_su_env(ab_su_ns_var);
    uint64_t *t[AB_SU_MAXPROG] = {0};
    int rc = 1;
    bool ok = env != NULL;
    for (unsigned p = 0; p < np && ok; p++)
        ok = (t[p] = calloc(runs, sizeof(uint64_t))) != NULL;
    if (!ok) {
        fputs("altbench startup: out of memory\n", stderr);
        goto out;
    }
    for (unsigned long i = 0; i < runs + AB_SU_WARMUP; i++) {
        for (unsigned k = 0; k < np; k++) {
            unsigned p = (unsigned)((i + k) % np);
            uint64_t ns = ab_su_run_inside(progs[p], env);
            if (!ns) {
                fprintf(stderr, "altbench startup: %s failed to run or to report apply_ns\n",
                        progs[p]);
                goto out;
            }
            if (i >= AB_SU_WARMUP)
                t[p][i - AB_SU_WARMUP] = ns;
        }
    }
    for (unsigned p = 0; p < np; p++) {
        qsort(t[p], runs, sizeof(uint64_t), ab_su_cmp);
        printf("startup_inside prog=%s runs=%lu apply_min_us=%.1f apply_p10_us=%.1f "
               "apply_med_us=%.1f\n",
               progs[p], runs, (double)t[p][0] / 1e3, (double)t[p][runs / 10] / 1e3,
               (double)t[p][runs / 2] / 1e3);
    }
    rc = 0;
out:
    free(env);
    for (unsigned p = 0; p < np; p++)
        free(t[p]);
    return rc;
}

int ab_mode_startup(int argc, char **argv)
{
    unsigned long runs = 201;
    bool inside = false;
    if (argc >= 1 && !strcmp(argv[0], "--inside")) {
        inside = true;
        argc--;
        argv++;
    }
    if (argc >= 2 && !strcmp(argv[0], "-n")) {
        runs = strtoul(argv[1], NULL, 10);
        argc -= 2;
        argv += 2;
    }
    if (argc < 1 || argc > AB_SU_MAXPROG || runs < 1 || runs > AB_SU_MAX) {
        fprintf(stderr,
                "usage: altbench startup [--inside] [-n RUNS] PROG... (1..%u programs, RUNS "
                "1..%u)\n",
                AB_SU_MAXPROG, AB_SU_MAX);
        return 2;
    }
    if (inside)
        return ab_su_inside(runs, (unsigned)argc, argv);
    unsigned np = (unsigned)argc, nv = 2 * np; /* variant 2p: PROG p on, 2p+1: off */
    char off_var[] = "ALTPATCH_OFF=1";
    char **env_on = ab_su_env(NULL), **env_off = ab_su_env(off_var);
    uint64_t *t[2 * AB_SU_MAXPROG] = {0};
    int rc = 1;
    bool ok = env_on && env_off;
    for (unsigned v = 0; v < nv && ok; v++)
        ok = (t[v] = calloc(runs, sizeof(uint64_t))) != NULL;
    if (!ok) {
        fputs("altbench startup: out of memory\n", stderr);
        goto out;
    }
    for (unsigned long i = 0; i < runs + AB_SU_WARMUP; i++) {
        /* every variant once per round, starting one further each round */
        for (unsigned k = 0; k < nv; k++) {
            unsigned v = (unsigned)((i + k) % nv);
            uint64_t ns = ab_su_run(argv[v / 2], v & 1 ? env_off : env_on);
            if (!ns) {
                fprintf(stderr, "altbench startup: %s failed to run\n", argv[v / 2]);
                goto out;
            }
            if (i >= AB_SU_WARMUP)
                t[v][i - AB_SU_WARMUP] = ns;
        }
    }
    for (unsigned v = 0; v < nv; v++)
        qsort(t[v], runs, sizeof(uint64_t), ab_su_cmp);
    for (unsigned p = 0; p < np; p++) {
        double on_min = (double)t[2 * p][0], on_med = (double)t[2 * p][runs / 2];
        double off_min = (double)t[2 * p + 1][0], off_med = (double)t[2 * p + 1][runs / 2];
        printf("startup prog=%s runs=%lu on_min_us=%.1f on_med_us=%.1f off_min_us=%.1f "
               "off_med_us=%.1f share_min=%.2f%% share_med=%.2f%%\n",
               argv[p], runs, on_min / 1e3, on_med / 1e3, off_min / 1e3, off_med / 1e3,
               100.0 * (on_min - off_min) / off_min, 100.0 * (on_med - off_med) / off_med);
    }
    rc = 0;
out:
    free(env_on);
    free(env_off);
    for (unsigned v = 0; v < nv; v++)
        free(t[v]);
    return rc;
}
