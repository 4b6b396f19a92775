/* SPDX-License-Identifier: MIT */
/*
 * What one live toggle costs (docs/live.md, "Cost of a toggle").
 *
 *   live_toggle_bench [N] [running]
 *
 * One other thread, asleep in read() (default) or running site_one and
 * site_pair in a loop ("running"), so that every apply is live; the main
 * thread applies and reverts N times (default 1000) and prints the mean wall
 * time and the mean CPU time of the applying thread per toggle, and the
 * number of /proc/self/maps lines before, after 10 toggles and at the end.
 * Not a test: figures to compare builds, interleaved.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <altpatch/altpatch.h>
#include "ap_live_sites.h"

static int pfd[2];
static volatile int stop;
static volatile long bad;

static void *sleeper(void *a)
{
    char c;
    (void)a;
    while (read(pfd[0], &c, 1) < 0)
        ;
    return NULL;
}

static void *runner(void *a)
{
    (void)a;
    while (!stop) {
        long one = site_one(), pair = site_pair();
        bad += !((one == 1 || one == 2) && (pair == 11 || pair == 22));
    }
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_now(void)
{
    struct rusage r;
    getrusage(RUSAGE_THREAD, &r);
    return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static int maps_lines(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, c;
    while (f && (c = fgetc(f)) != EOF)
        n += c == '\n';
    if (f)
        fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int running = argc > 2 && !strcmp(argv[2], "running");
    if (n < 10)
        return 2;
    altpatch_set_print(NULL);
    pthread_t t;
    if (pipe(pfd) || pthread_create(&t, NULL, running ? runner : sleeper, NULL))
        return 2;
    usleep(20000);
    struct altpatch_apply_opts o = {.sz = sizeof(o)};
    int err = altpatch_apply_opts(&o) != 0; /* module discovery, first self-test */
    o.flags = ALTPATCH_APPLY_REVERT;
    err |= altpatch_apply_opts(&o) != 0;
    int m0 = maps_lines(), m1 = 0;
    double t0 = now(), c0 = cpu_now();
    for (int i = 0; i < n; i++) {
        o.flags = i % 2 ? ALTPATCH_APPLY_REVERT : 0;
        err |= altpatch_apply_opts(&o) != 0;
        if (i == 9)
            m1 = maps_lines();
    }
    double dt = now() - t0, dc = cpu_now() - c0;
    int m2 = maps_lines();
    stop = 1;
    if (write(pfd[1], "x", 1) != 1)
        return 2;
    pthread_join(t, NULL);
    printf("live_toggle_bench: %s toggles=%d wall_us=%.1f cpu_us=%.1f maps=%d/%d/%d errors=%d "
           "bad=%ld\n",
           running ? "running" : "sleeping", n, dt / n * 1e6, dc / n * 1e6, m0, m1, m2, err, bad);
    return err || bad;
}
