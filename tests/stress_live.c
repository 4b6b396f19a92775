/* SPDX-License-Identifier: MIT */
/*
 * Live re-patching stress (docs/live.md).
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
 * Around them, threads written the ordinary ways:
 *
 *   worker 0 also runs one and pair from a SIGUSR1 handler (a kicker thread
 *            signals it every 200 us), often while it spins on an entry
 *            barrier or while it is inside a multi-instruction site;
 *   worker 1 runs with every signal blocked but SIGTRAP (the handshake
 *            signal too: it cannot answer, multi-instruction sites are
 *            refused while it runs);
 *   sigwait  a thread with every signal blocked but SIGTRAP, waiting in
 *            sigwait() for the SIGUSR2 the kicker sends every 5 ms;
 *   epoll    a thread blocked in epoll_wait() (1 s timeout);
 *
 * sigwait, epoll and the kicker run no site: each EINTR they see is counted
 * (an apply must not disturb them). With --sigtrap-blocked, worker 1 and the
 * sigwait thread block SIGTRAP too and worker 2 blocks and unblocks SIGTRAP
 * on every pass: signal masks must not matter (every apply returns 0 and
 * writes).
 *
 * Prints one line of figures and exits 0 when every apply returned 0, no
 * result was wrong and no thread that runs no site saw EINTR (and, with
 * --sigtrap-blocked, bytes were written); 1 otherwise. A crash kills the
 * process: the caller sees a signal, not 0. Exits 77 (skipped) where the
 * kernel refuses writes through /proc/self/mem to read-only mappings: live
 * patching writes through it, so every apply would be refused.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/epoll.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <altpatch/altpatch.h>
#include <altpatch/primitives.h>
#include "ap_live_sites.h"
#include "ap_procmem.h"

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
    unsigned tsc_cpu; /* the CPU of the last TSC read, UINT_MAX: unknown */
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
    /* TSCs of different CPUs need not agree (a guest's vCPUs may drift):
     * compared only between two reads on one CPU, known by a CPU number
     * read before and after each */
    uint64_t t = altpatch_rdtsc_ordered();
    unsigned after = altpatch_getcpu();
    bool same = cpu == after;
    if (same && cpu == w->tsc_cpu && t < *tsc)
        wrong(w, "tsc backwards by", (long)(*tsc - t));
    *tsc = t;
    w->tsc_cpu = same ? cpu : UINT_MAX;
    w->runs++;
}

static struct worker *w0; /* worker 0: the one whose handler runs sites */
static volatile uint64_t handler_runs, handler_wrong;

static void on_usr1(int sig)
{
    (void)sig;
    long one = site_one(), pair = site_pair();
    handler_wrong += (one != 1 && one != 2) + (pair != 11 && pair != 22);
    handler_runs++;
}

static void block_all_but_trap(int trap_too)
{
    sigset_t m;
    sigfillset(&m);
    if (!trap_too)
        sigdelset(&m, SIGTRAP);
    pthread_sigmask(SIG_SETMASK, &m, NULL);
}

/* Threads that run no site: what they saw. */
static volatile long sigwait_eintr, sigwait_got, epoll_eintr, epoll_waits, kick_eintr;
static int sigtrap_blocked, epfd, eppipe[2];

static void *sigwaiter(void *p)
{
    (void)p;
    block_all_but_trap(sigtrap_blocked);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR2);
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        int sig = 0;
        int rc = sigwait(&s, &sig);
        sigwait_eintr += rc == EINTR;
        sigwait_got += rc == 0;
    }
    return NULL;
}

static void *epoller(void *p)
{
    (void)p;
    struct epoll_event ev;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        int n = epoll_wait(epfd, &ev, 1, 1000);
        epoll_waits++;
        epoll_eintr += n < 0 && errno == EINTR;
    }
    return NULL;
}

static void *kicker(void *p)
{
    pthread_t t0 = *(pthread_t *)p;
    for (long i = 0; !__atomic_load_n(&stop, __ATOMIC_RELAXED); i++) {
        pthread_kill(t0, SIGUSR1);
        if (i % 25 == 0)
            kill(getpid(), SIGUSR2); /* blocked everywhere but in sigwait() */
        struct timespec ts = {0, 200 * 1000};
        kick_eintr += nanosleep(&ts, NULL) < 0 && errno == EINTR;
    }
    return NULL;
}

static void *work(void *p)
{
    struct worker *w = p;
    uint64_t tsc = 0;
    if (w == w0 + 1)
        block_all_but_trap(sigtrap_blocked);
    sigset_t trap;
    sigemptyset(&trap);
    sigaddset(&trap, SIGTRAP);
    bool flip = sigtrap_blocked && w == w0 + 2;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        if (flip)
            pthread_sigmask(w->runs & 1 ? SIG_UNBLOCK : SIG_BLOCK, &trap, NULL);
        pass(w, &tsc);
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct tally {
    long toggles, apply_errors, busy, refused, written;
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
    t->busy += rc == -EBUSY;
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
        else if (!strcmp(argv[i], "--sigtrap-blocked"))
            sigtrap_blocked = 1;
        else {
            fprintf(stderr, "usage: %s [--toggles N] [--threads T] [--quiet] [--sigtrap-blocked]\n",
                    argv[0]);
            return 2;
        }
    }
    if (nthreads < 2 || nthreads > 64 || toggles < 1)
        return 2;
    if (!ap_procmem_can_write_text()) {
        printf("stress_live: skipped: live patching: " AP_PROCMEM_DENIED "\n");
        return 77;
    }
    if (!getenv("STRESS_LIVE_WARN"))
        altpatch_set_print(NULL);
    struct altpatch_features *host = altpatch_features_host(), *none = altpatch_features_new();
    struct worker *w = calloc((size_t)nthreads, sizeof(*w));
    if (!host || !none || !w)
        return 2;
    w0 = w;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    /* SIGUSR2 goes to the sigwait() thread only: blocked here, so in every thread created. */
    sigset_t u2;
    sigemptyset(&u2);
    sigaddset(&u2, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &u2, NULL);
    struct epoll_event ev = {.events = EPOLLIN};
    epfd = epoll_create1(0);
    if (epfd < 0 || pipe(eppipe) || epoll_ctl(epfd, EPOLL_CTL_ADD, eppipe[0], &ev))
        return 2;
    pthread_t sw, ep, kk;
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&w[i].t, NULL, work, &w[i]))
            return 2;
    if (pthread_create(&sw, NULL, sigwaiter, NULL) || pthread_create(&ep, NULL, epoller, NULL) ||
        pthread_create(&kk, NULL, kicker, &w[0].t))
        return 2;
    while (!__atomic_load_n(&handler_runs, __ATOMIC_RELAXED))
        sched_yield();
    double t0 = now_s();
    struct tally t = {0};
    for (long i = 0; i < toggles; i++) {
        toggle(i, host, none, &t);
        if (!quiet && toggles >= 10000 && i % (toggles / 10) == 0)
            fprintf(stderr, "stress_live: %ld toggles\n", i);
    }
    double dt = now_s() - t0;
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    pthread_join(kk, NULL);
    kill(getpid(), SIGUSR2);
    if (write(eppipe[1], "x", 1) != 1)
        return 2;
    pthread_join(sw, NULL);
    pthread_join(ep, NULL);
    uint64_t runs = handler_runs, bad = handler_wrong;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(w[i].t, NULL);
        runs += w[i].runs;
        bad += w[i].wrong;
        if (w[i].wrong)
            printf("stress_live: thread %d: %lu wrong, first: %s\n", i,
                   (unsigned long)w[i].wrong, w[i].what);
    }
    long eintr = sigwait_eintr + epoll_eintr; /* the kicker wakes every 200 us: see docs/live.md */
    printf("stress_live: toggles=%ld threads=%d executions=%lu (%lu in handlers) wrong=%lu "
           "apply_errors=%ld (first %d) ebusy=%ld sites_refused=%ld bytes_written=%ld "
           "seconds=%.2f eintr=%ld (sigwait %ld, epoll %ld of %ld waits, kicker %ld) "
           "sigwait_signals=%ld crashes=0\n",
           t.toggles, nthreads, (unsigned long)runs, (unsigned long)handler_runs,
           (unsigned long)bad, t.apply_errors, t.first_err, t.busy, t.refused, t.written, dt,
           eintr, sigwait_eintr, epoll_eintr, epoll_waits, kick_eintr, sigwait_got);
    altpatch_features_free(host);
    altpatch_features_free(none);
    free(w);
    if (sigtrap_blocked && !t.written)
        return 1; /* masks must not stop the writes */
    return bad || t.apply_errors || eintr || !runs ? 1 : 0;
}
