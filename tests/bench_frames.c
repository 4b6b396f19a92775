/* SPDX-License-Identifier: MIT */
/*
 * What a signal-frame search costs (altpatch/src/frames.c): a full read of a
 * stack with no frame in it, the worst case of a search that finds nothing.
 *
 *   bench_frames [--mib N] [--reps R]
 *
 * task:  ap_frames_where_task() on an N MiB anonymous mapping (a sleeping
 *        thread read through /proc: bounded by the mapping, 16 KiB reads);
 * self:  ap_frames_where_self() on a thread that has N MiB of its own stack in
 *        use (what the handshake handler does: bounded by the thread's control
 *        block, 64 KiB reads into a mapped buffer).
 * Prints the median, minimum and maximum of R runs, and MiB/s of the median.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "host.h"

static size_t mib = 8;
static int reps = 21;

static bool never_inside(uintptr_t rip)
{
    (void)rip;
    return false;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *ms, int n)
{
    qsort(ms, (size_t)n, sizeof(*ms), cmp_double);
    double med = ms[n / 2];
    printf("%-5s %3zu MiB: median %.3f ms  min %.3f ms  max %.3f ms  (%.0f MiB/s, %d runs)\n", what,
           mib, med, ms[0], ms[n - 1], (double)mib / (med / 1e3), n);
}

static int bench_task(void)
{
    size_t size = mib << 20;
    uint8_t *p = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p + size, 4096, PROT_NONE))
        return 1;
    memset(p, 0x11, size); /* resident, like a stack in use */
    double *ms = calloc((size_t)reps, sizeof(*ms));
    for (int i = 0; i < reps; i++) {
        double t0 = now_ms();
        uintptr_t w = ap_frames_where_task(0x1000, (uintptr_t)p, never_inside);
        ms[i] = now_ms() - t0;
        if (w != 0x1000) {
            fprintf(stderr, "bench_frames: task search answered %#lx\n", (unsigned long)w);
            return 1;
        }
    }
    report("task", ms, reps);
    free(ms);
    munmap(p, size + 4096);
    return 0;
}

/* Runs on a thread whose stack holds mib MiB below this frame. */
__attribute__((noinline)) static int bench_self_deep(void)
{
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    double *ms = calloc((size_t)reps, sizeof(*ms));
    for (int i = 0; i < reps; i++) {
        double t0 = now_ms();
        uintptr_t w = ap_frames_where_self(0x1000, sp, never_inside);
        ms[i] = now_ms() - t0;
        if (w != 0x1000) {
            fprintf(stderr, "bench_frames: self search answered %#lx\n", (unsigned long)w);
            return 1;
        }
    }
    report("self", ms, reps);
    free(ms);
    return 0;
}

/* Uses (mib MiB - 64 KiB) of stack, touched, then searches from there. */
__attribute__((noinline)) static int bench_self_use(size_t left)
{
    volatile char block[60 * 1024];
    for (size_t i = 0; i < sizeof(block); i += 4096)
        block[i] = 1;
    int r = left > sizeof(block) ? bench_self_use(left - sizeof(block)) : bench_self_deep();
    block[0]++;
    return r;
}

static void *bench_self_thread(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)bench_self_use((mib << 20) - (64 << 10));
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib"))
            mib = strtoul(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    if (!mib || mib > 60 || reps < 1) {
        fprintf(stderr, "usage: bench_frames [--mib 1..60] [--reps N]\n");
        return 2;
    }
    ap_frames_init();
    if (bench_task())
        return 1;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, (mib + 2) << 20);
    pthread_t t;
    void *ret;
    if (pthread_create(&t, &a, bench_self_thread, NULL) || pthread_join(t, &ret) || ret)
        return 1;
    return 0;
}
