/* SPDX-License-Identifier: MIT */
/*
 * Live re-patching stress (issue 5, docs/live.md).
 *
 *   stress_live [--toggles N] [--threads T] [--quiet]
 *
 * T worker threads (default 4) run patched sites in tight loops and check
 * every result, while the main thread toggles the sites N times (default
 * 200) between two feature sets (the host's, and the empty set) and, every
 * third toggle, REVERT. Every apply runs live (other threads exist). Sites:
 *
 *   one    ALTERNATIVE "movl $1,%eax" / "movl $2,%eax"       (single insn)
 *   pair   ALTERNATIVE "movl $1,%eax; addl $10,%eax" /
 *                      "movl $2,%eax; addl $20,%eax"       (two insns: a
 *          thread executing half old, half new bytes returns 12 or 21)
 *   call   ALTPATCH_ALT_CALL(plus1, plus2, ALWAYS, x)         (call rel32)
 *   fs     altpatch_fs_self() == pthread_self()
 *   cpu    altpatch_getcpu() < CPU_SETSIZE
 *   fence  altpatch_weak_fence()
 *   tsc    altpatch_rdtsc_ordered() never goes backwards in a thread
 *
 * Prints one line of figures and exits 0 when every apply returned 0 and no
 * result was wrong; 1 otherwise. A crash (a thread executing a torn site)
 * kills the process: the caller sees a signal, not 0.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <altpatch/altpatch.h>
#include <altpatch/primitives.h>
#include "ap_live_sites.h"

static long plus1(long x)
{
    return x + 1;
}

static long plus2(long x)
{
    return x + 2;
}

struct worker {
    pthread_t t;
    uint64_t runs, wrong;
    char what[96];
};

static volatile int stop;

static void wrong(struct worker *w, const char *what, long v)
{
    if (!w->wrong++)
        snprintf(w->what, sizeof(w->what), "%s = %ld", what, v);
}

/** One pass over every site; counts wrong results. */
static void pass(struct worker *w, uint64_t *tsc)
{
    long one = site_one(), pair = site_pair();
    if (one != 1 && one != 2)
        wrong(w, "one", one);
    if (pair != 11 && pair != 22)
        wrong(w, "pair", pair);
    long c = ALTPATCH_ALT_CALL(plus1, plus2, X86_FEATURE_ALWAYS, (long)w->runs);
    if (c != (long)w->runs + 1 && c != (long)w->runs + 2)
        wrong(w, "call", c - (long)w->runs);
    if (altpatch_fs_self() != (void *)pthread_self())
        wrong(w, "fs_self", (long)(uintptr_t)altpatch_fs_self());
    unsigned cpu = altpatch_getcpu();
    if (cpu >= CPU_SETSIZE)
        wrong(w, "getcpu", (long)cpu);
    altpatch_weak_fence();
    uint64_t t = altpatch_rdtsc_ordered();
    if (t < *tsc)
        wrong(w, "tsc backwards by", (long)(*tsc - t));
    *tsc = t;
    w->runs++;
}

static void *work(void *p)
{
    struct worker *w = p;
    uint64_t tsc = 0;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED))
        pass(w, &tsc);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct tally {
    long toggles, apply_errors, refused, written;
    int first_err;
};

static void toggle(long i, struct altpatch_features *host, struct altpatch_features *none,
                   struct tally *t)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_LIVE};
    if (i % 3 == 2)
        o.flags |= ALTPATCH_APPLY_REVERT;
    else
        o.features = i % 3 == 0 ? host : none;
    int rc = altpatch_apply_opts(&o);
    struct altpatch_stats st = {.sz = sizeof(st)};
    altpatch_get_stats(&st);
    if (rc && !t->apply_errors++)
        t->first_err = rc;
    t->refused += (long)st.sites_refused;
    t->written += (long)st.bytes_written;
    t->toggles++;
}

int main(int argc, char **argv)
{
    long toggles = 200;
    int nthreads = 4, quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--toggles") && i + 1 < argc)
            toggles = atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            nthreads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quiet"))
            quiet = 1;
        else {
            fprintf(stderr, "usage: %s [--toggles N] [--threads T] [--quiet]\n", argv[0]);
            return 2;
        }
    }
    if (nthreads < 1 || nthreads > 64 || toggles < 1)
        return 2;
    altpatch_set_print(NULL);
    struct altpatch_features *host = altpatch_features_host(), *none = altpatch_features_new();
    struct worker *w = calloc((size_t)nthreads, sizeof(*w));
    if (!host || !none || !w)
        return 2;
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&w[i].t, NULL, work, &w[i]))
            return 2;
    double t0 = now_s();
    struct tally t = {0};
    for (long i = 0; i < toggles; i++) {
        toggle(i, host, none, &t);
        if (!quiet && toggles >= 10000 && i % (toggles / 10) == 0)
            fprintf(stderr, "stress_live: %ld toggles\n", i);
    }
    double dt = now_s() - t0;
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    uint64_t runs = 0, bad = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(w[i].t, NULL);
        runs += w[i].runs;
        bad += w[i].wrong;
        if (w[i].wrong)
            printf("stress_live: thread %d: %lu wrong, first: %s\n", i,
                   (unsigned long)w[i].wrong, w[i].what);
    }
    printf("stress_live: toggles=%ld threads=%d executions=%lu wrong=%lu apply_errors=%ld "
           "(first %d) sites_refused=%ld bytes_written=%ld seconds=%.2f crashes=0\n",
           t.toggles, nthreads, (unsigned long)runs, (unsigned long)bad, t.apply_errors,
           t.first_err, t.refused, t.written, dt);
    altpatch_features_free(host);
    altpatch_features_free(none);
    free(w);
    return bad || t.apply_errors || !runs ? 1 : 0;
}
