/* SPDX-License-Identifier: MIT */
/*
 * Live re-patching (altpatch/src/live.c, flip.c, docs/live.md): the page-flip
 * protocol, the handshake's refusals (thread inside a
 * multi-instruction site, thread not answering, call inside a site), signal masks
 * and the program's SIGTRAP handler,
 * chaining, fork and signals during apply, the flags and the stats.
 *
 * Every body runs in a fork()ed child (ap_isolate.h) that starts with one
 * thread and creates the threads it needs; the parent asserts.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <linux/io_uring.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"
#include "host.h"
#include "ap_live_sites.h"
#include "ap_procmem.h"
#include "ap_seccomp.h"
#include "ap_warnlog.h"

/* ---- sites ------------------------------------------------------------------ */

static volatile int spin_flag;
static volatile int spin_entered;

/* Spins inside its own (original) bytes while spin_flag is set: a thread
 * strictly inside a multi-instruction site. 0, or 2 once patched. */
__attribute__((noinline)) static long site_spin(void)
{
    long v = 0;
    spin_entered = 1;
    __asm__ __volatile__(ALTERNATIVE("xchg %%ax, %%ax\n.Lspin%=:\n\tcmpl $0, %[f]\n\tjne .Lspin%=",
                                     "movl $2, %%eax", X86_FEATURE_ALWAYS)
                         : "+a"(v)
                         : [f] "m"(spin_flag)
                         : "cc", "memory");
    return v;
}

enum { S_ONE, S_PAIR, S_SPIN, S_CALLIN, S_COUNT };
static void *const site_fn[S_COUNT] = {(void *)site_one, (void *)site_pair, (void *)site_spin,
                                       (void *)site_callin};

struct find {
    struct site_view *v;
};

/* The site of function f: the first one at or after its address (within 64 bytes). */
static int find_cb(const struct altpatch_site_info *s, void *p)
{
    struct find *f = p;
    for (int i = 0; i < S_COUNT; i++) {
        site_view_take(&f->v[i], s, (uintptr_t)site_fn[i]);
    }
    return 0;
}

static void snap(struct site_view *v)
{
    memset(v, 0, S_COUNT * sizeof(*v));
    struct find f = {v};
    altpatch_site_foreach(find_cb, &f);
}

static int apply_flags(unsigned flags, const struct altpatch_features *fs)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = fs, .flags = flags};
    return altpatch_apply_opts(&o);
}

static void stats(struct altpatch_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->sz = sizeof(*st);
    altpatch_get_stats(st);
}

/* Live patching fills the pages it flips in through /proc/self/mem: where the
 * kernel refuses writes to read-only mappings there, every live apply is
 * refused (-EBUSY, nothing written; the first tests check that) and the tests
 * of the protocol itself have nothing to run. */
static void need_live(void)
{
    if (!ap_procmem_can_write_text())
        cr_skip_test("live patching: " AP_PROCMEM_DENIED);
}

/* ---- the flag on a single thread ---------------------------------------------- */

struct basic_res {
    int rc, rc_revert, rc_again;
    long one, pair, one_rev, pair_rev;
    struct altpatch_stats st, st_again;
    struct site_view v[S_COUNT], vrev[S_COUNT];
};

static void basic_body(void *out, void *ctx)
{
    struct basic_res *r = out;
    (void)ctx;
    altpatch_set_print(NULL);
    r->rc = apply_flags(ALTPATCH_APPLY_LIVE, NULL);
    stats(&r->st);
    snap(r->v);
    r->one = site_one(), r->pair = site_pair();
    r->rc_again = apply_flags(ALTPATCH_APPLY_LIVE, NULL);
    stats(&r->st_again);
    r->rc_revert = apply_flags(ALTPATCH_APPLY_LIVE | ALTPATCH_APPLY_REVERT, NULL);
    snap(r->vrev);
    r->one_rev = site_one(), r->pair_rev = site_pair();
}

Test(live, flag_patches_and_reverts_single_threaded)
{
    struct basic_res *r = ap_isolated(sizeof(*r), basic_body, NULL);
    if (!ap_procmem_can_write_text()) {
        cr_assert_eq(r->rc, -EBUSY, "live patching is not possible");
        cr_assert_eq(r->rc_again, -EBUSY);
        cr_assert_eq(r->rc_revert, -EBUSY);
        cr_assert_eq(r->one, 1, "nothing written");
        cr_assert_eq(r->pair, 11, "nothing written");
        return;
    }
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->st.live, 1, "stats.live");
    cr_assert_eq(r->st.mprotect_windows, 0, "live never opens an mprotect window");
    cr_assert_gt(r->st.procmem_writes, 0);
    cr_assert_eq(r->one, 2);
    cr_assert_eq(r->pair, 22);
    cr_assert_eq(r->v[S_ONE].state, ALTPATCH_SITE_PATCHED);
    cr_assert_eq(r->v[S_PAIR].state, ALTPATCH_SITE_PATCHED);
    cr_assert_eq(r->v[S_SPIN].state, ALTPATCH_SITE_PATCHED, "nobody inside: multi-insn site patched");
    cr_assert_eq(r->v[S_CALLIN].state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(r->v[S_CALLIN].reason, ALTPATCH_REASON_LIVE_CALL_INSIDE);
    cr_assert_eq(memcmp(r->v[S_CALLIN].cur, r->v[S_CALLIN].orig, r->v[S_CALLIN].len), 0,
                 "refused call site keeps its bytes");
    cr_assert_eq(r->v[S_ONE].cur[0], 0xb8);
    cr_assert_eq(r->v[S_ONE].cur[1], 2, "nothing left behind");
    cr_assert_eq(r->rc_again, 0);
    cr_assert_eq(r->st_again.bytes_written, 0, "idempotent");
    cr_assert_eq(r->rc_revert, 0);
    cr_assert_eq(r->one_rev, 1);
    cr_assert_eq(r->pair_rev, 11);
    for (int i = 0; i < S_COUNT; i++)
        cr_assert_eq(memcmp(r->vrev[i].cur, r->vrev[i].orig, r->vrev[i].len), 0, "site %d", i);
}

/* The same call site is patched by the ordinary writer. */
static void callin_body(void *out, void *ctx)
{
    struct basic_res *r = out;
    (void)ctx;
    altpatch_set_print(NULL);
    r->rc = apply_flags(0, NULL);
    stats(&r->st);
    snap(r->v);
    r->one = site_callin();
}

Test(live, call_site_patched_when_not_live)
{
    struct basic_res *r = ap_isolated(sizeof(*r), callin_body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->st.live, 0);
    cr_assert_gt(r->st.mprotect_windows, 0);
    cr_assert_eq(r->v[S_CALLIN].state, ALTPATCH_SITE_PATCHED);
    cr_assert_eq(r->one, 7);
}

Test(live, bad_flag_combinations)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o)};
    o.flags = ALTPATCH_APPLY_LIVE | ALTPATCH_APPLY_NO_LIVE;
    cr_assert_eq(altpatch_apply_opts(&o), -EINVAL);
    o.flags = ALTPATCH_APPLY_LIVE | ALTPATCH_APPLY_NO_PROCMEM;
    cr_assert_eq(altpatch_apply_opts(&o), -EINVAL);
}

/* The flag on a single thread where live patching is impossible (a filter
 * answers ENOSYS to membarrier): refused before any write, and the warning
 * says why -- not that threads run. Without ALTPATCH_APPLY_FILTER_ALLOWS_LIVE
 * the filter alone refuses it (it might have killed for membarrier); with
 * it, membarrier's answer does. */
struct unready_res {
    int installed, rc, rc_allowed;
    long one;
    char log[1024], log_allowed[1024];
};

static void unready_body(void *out, void *ctx)
{
    struct unready_res *r = out;
    (void)ctx;
    int set = ap_seccomp_refuse(SYS_membarrier, ENOSYS);
    r->installed = set ? set : 1;
    if (r->installed < 0)
        return;
    ap_warn_log[0] = '\0';
    altpatch_set_print(ap_warn_capture);
    r->rc = apply_flags(ALTPATCH_APPLY_LIVE, NULL);
    snprintf(r->log, sizeof(r->log), "%.*s", (int)sizeof(r->log) - 1, ap_warn_log);
    ap_warn_log[0] = '\0';
    r->rc_allowed = apply_flags(ALTPATCH_APPLY_LIVE | ALTPATCH_APPLY_FILTER_ALLOWS_LIVE, NULL);
    snprintf(r->log_allowed, sizeof(r->log_allowed), "%.*s", (int)sizeof(r->log_allowed) - 1,
             ap_warn_log);
    altpatch_set_print(NULL);
    r->one = site_one();
}

Test(live, flag_where_live_is_impossible_says_why)
{
    struct unready_res *r = ap_isolated(sizeof(*r), unready_body, NULL);
    if (r->installed < 0)
        ap_seccomp_require(r->installed);
    cr_assert_eq(r->rc, -EBUSY);
    cr_assert_eq(r->rc_allowed, -EBUSY);
    cr_assert_eq(r->one, 1, "nothing written");
    cr_assert(strstr(r->log, "altpatch: ALTPATCH_APPLY_LIVE: live patching is not possible: "
                             "a seccomp filter is active and "
                             "ALTPATCH_APPLY_FILTER_ALLOWS_LIVE was not given\n"),
              "%s", r->log);
    cr_assert(strstr(r->log_allowed, "altpatch: ALTPATCH_APPLY_LIVE: live patching is not "
                                     "possible: membarrier(PRIVATE_EXPEDITED_SYNC_CORE) is not "
                                     "available\n"),
              "%s", r->log_allowed);
    cr_assert_null(strstr(r->log, "threads running"), "%s", r->log);
}

/* ---- other threads ------------------------------------------------------------ */

static int g_pipe[2];
static volatile int g_release;
static volatile pid_t g_sleeper_tid;

/* Wait (up to 5 s) until thread @p tid sleeps in the kernel: the oracle is
 * /proc/self/task/TID/syscall, which says "running" otherwise. */
static void wait_asleep(volatile pid_t *tid)
{
    for (int i = 0; i < 5000; i++) {
        char path[64], buf[32] = "";
        if (*tid) {
            snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)*tid);
            FILE *f = fopen(path, "r");
            if (f) {
                if (!fgets(buf, sizeof(buf), f))
                    buf[0] = 0;
                fclose(f);
            }
            if (buf[0] && strncmp(buf, "running", 7))
                return;
        }
        usleep(1000);
    }
}

/* ctx: 0 sleeps in read(); 1 blocks every signal but SIGTRAP and runs (the
 * handshake cannot reach it, /proc shows it "running"); 2 blocks the same
 * signals and sleeps in read() (/proc shows where). */
static void *sleeper(void *arg)
{
    g_sleeper_tid = (pid_t)syscall(SYS_gettid);
    if (arg) {
        sigset_t all;
        sigfillset(&all);
        sigdelset(&all, SIGTRAP);
        pthread_sigmask(SIG_SETMASK, &all, NULL);
    }
    if (arg == (void *)1) {
        while (!g_release)
            __asm__ __volatile__("pause");
        return NULL;
    }
    char c;
    while (read(g_pipe[0], &c, 1) < 0 && errno == EINTR)
        ;
    return NULL;
}

/* Wake the sleeper (a byte on g_pipe) and wait for it to end. */
static void release_sleeper(pthread_t t)
{
    if (write(g_pipe[1], "x", 1) != 1)
        _exit(4);
    pthread_join(t, NULL);
}

struct threads_res {
    int rc_default, rc_nolive, rc_after;
    long one, pair;
    struct altpatch_stats st;
    struct site_view v[S_COUNT];
    uint64_t ns;
};

static void threads_body(void *out, void *ctx)
{
    struct threads_res *r = out;
    pthread_t t;
    altpatch_set_print(NULL);
    if (pipe(g_pipe) || pthread_create(&t, NULL, sleeper, ctx))
        _exit(3);
    if (ctx == (void *)2)
        wait_asleep(&g_sleeper_tid);
    r->rc_nolive = apply_flags(ALTPATCH_APPLY_NO_LIVE, NULL);
    r->rc_default = altpatch_apply();
    stats(&r->st);
    snap(r->v);
    r->one = site_one(), r->pair = site_pair();
    g_release = 1;
    release_sleeper(t);
}

Test(live, other_threads_patch_live_by_default)
{
    struct threads_res *r = ap_isolated(sizeof(*r), threads_body, NULL);
    cr_assert_eq(r->rc_nolive, -EBUSY, "ALTPATCH_APPLY_NO_LIVE keeps the old policy");
    if (!ap_procmem_can_write_text()) {
        cr_assert_eq(r->rc_default, -EBUSY, "live patching is not possible");
        cr_assert_eq(r->one, 1, "nothing written");
        cr_assert_eq(r->pair, 11, "nothing written");
        return;
    }
    cr_assert_eq(r->rc_default, 0);
    cr_assert_eq(r->st.live, 1);
    cr_assert_eq(r->one, 2);
    cr_assert_eq(r->pair, 22);
    cr_assert_eq(r->v[S_PAIR].state, ALTPATCH_SITE_PATCHED);
}

/* ---- tasks the thread list does not show, threads that cannot be listed -------- */

static volatile int g_sibling_run;

static int sibling(void *arg)
{
    (void)arg;
    g_sibling_run = 1;
    while (g_sibling_run == 1)
        __asm__ __volatile__("pause");
    return 0;
}

struct shared_res {
    int started, rc, rc_live;
    long one, pair;
    char log[1024];
};

/* A process sharing this memory without being a thread (clone(CLONE_VM)
 * without CLONE_THREAD): /proc/self/task lists one thread, but the kernel
 * says another task uses the memory. Neither writer can see where it runs:
 * nothing is written, live or not, and the warning says why. */
static void shared_body(void *out, void *ctx)
{
    struct shared_res *r = out;
    (void)ctx;
    size_t sz = 256 * 1024;
    char *stack = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack == MAP_FAILED)
        return;
    pid_t pid = clone(sibling, stack + sz, CLONE_VM | SIGCHLD, NULL);
    if (pid < 0)
        return;
    while (!g_sibling_run)
        __asm__ __volatile__("pause");
    r->started = 1;
    ap_warn_log[0] = '\0';
    altpatch_set_print(ap_warn_capture);
    r->rc = altpatch_apply();
    r->rc_live = apply_flags(ALTPATCH_APPLY_LIVE, NULL);
    altpatch_set_print(NULL);
    r->one = site_one(), r->pair = site_pair();
    snprintf(r->log, sizeof(r->log), "%.*s", (int)sizeof(r->log) - 1, ap_warn_log);
    g_sibling_run = 2;
    waitpid(pid, NULL, 0);
}

Test(live, process_sharing_the_memory_stops_every_writer)
{
    struct shared_res *r = ap_isolated(sizeof(*r), shared_body, NULL);
    cr_assert(r->started, "clone(CLONE_VM) failed");
    cr_assert_eq(r->rc, -EBUSY);
    cr_assert_eq(r->rc_live, -EBUSY);
    cr_assert_eq(r->one, 1, "nothing written");
    cr_assert_eq(r->pair, 11, "nothing written");
    cr_assert(strstr(r->log, "another process shares this address space"), "%s", r->log);
}

struct nofd_res {
    int rc_first, rc;
    long one_first, one;
    char log[1024];
};

/* Another thread runs and /proc/self/task cannot be opened (every descriptor
 * in use): the kernel says the memory is shared, the list cannot say by whom.
 * An earlier apply kept its maps descriptor, so a writer could still work:
 * it must not be chosen. Nothing written; the warning says why. */
static void nofd_body(void *out, void *ctx)
{
    struct nofd_res *r = out;
    (void)ctx;
    altpatch_set_print(NULL);
    r->rc_first = altpatch_apply(); /* alone: written, the maps descriptor kept */
    r->one_first = site_one();
    pthread_t t;
    if (pipe(g_pipe) || pthread_create(&t, NULL, sleeper, NULL))
        _exit(3);
    wait_asleep(&g_sleeper_tid);
    struct rlimit rl = {64, 64};
    setrlimit(RLIMIT_NOFILE, &rl);
    int fds[64], nfd = 0;
    while (nfd < 64 && (fds[nfd] = dup(0)) >= 0)
        nfd++;
    ap_warn_log[0] = '\0';
    altpatch_set_print(ap_warn_capture);
    r->rc = apply_flags(ALTPATCH_APPLY_REVERT, NULL);
    altpatch_set_print(NULL);
    r->one = site_one();
    while (nfd > 0)
        close(fds[--nfd]);
    snprintf(r->log, sizeof(r->log), "%.*s", (int)sizeof(r->log) - 1, ap_warn_log);
    release_sleeper(t);
}

Test(live, threads_that_cannot_be_listed_stop_every_writer)
{
    struct nofd_res *r = ap_isolated(sizeof(*r), nofd_body, NULL);
    cr_assert_eq(r->rc_first, 0);
    cr_assert_eq(r->one_first, 2);
    cr_assert_eq(r->rc, -EBUSY);
    cr_assert_eq(r->one, 2, "the revert wrote nothing");
    cr_assert(strstr(r->log, "cannot list this process's threads"), "%s", r->log);
}

Test(live, silent_thread_refuses_multi_instruction_sites)
{
    need_live();
    struct threads_res *r = ap_isolated(sizeof(*r), threads_body, (void *)1);
    cr_assert_eq(r->rc_default, 0);
    cr_assert_eq(r->one, 2, "a single-instruction site needs no handshake");
    cr_assert_eq(r->v[S_ONE].state, ALTPATCH_SITE_PATCHED);
    cr_assert_eq(r->pair, 11, "multi-instruction site kept");
    cr_assert_eq(r->v[S_PAIR].state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(r->v[S_PAIR].reason, ALTPATCH_REASON_LIVE_NO_ANSWER);
    cr_assert_eq(memcmp(r->v[S_PAIR].cur, r->v[S_PAIR].orig, r->v[S_PAIR].len), 0,
                 "first byte restored");
    cr_assert_eq(r->v[S_SPIN].reason, ALTPATCH_REASON_LIVE_NO_ANSWER);
}

/* A sleeping thread is located through /proc/self/task/TID/syscall: no signal needed. */
Test(live, sleeping_thread_answers_without_a_signal)
{
    need_live();
    struct threads_res *r = ap_isolated(sizeof(*r), threads_body, (void *)2);
    cr_assert_eq(r->rc_default, 0);
    cr_assert_eq(r->st.live, 1);
    cr_assert_eq(r->pair, 22, "multi-instruction site patched: the sleeper was located");
    cr_assert_eq(r->v[S_PAIR].state, ALTPATCH_SITE_PATCHED);
}

static void *spinner(void *arg)
{
    (void)arg;
    return (void *)site_spin();
}

struct inside_res {
    int rc, rc2;
    long first_result;
    struct site_view v[S_COUNT], v2[S_COUNT];
    long spin_after;
};

static void inside_body(void *out, void *ctx)
{
    struct inside_res *r = out;
    (void)ctx;
    pthread_t t;
    altpatch_set_print(NULL);
    spin_flag = 1;
    if (pthread_create(&t, NULL, spinner, NULL))
        _exit(3);
    while (!spin_entered)
        sched_yield();
    usleep(10000); /* well inside the loop by now */
    r->rc = altpatch_apply();
    snap(r->v);
    spin_flag = 0;
    void *ret;
    pthread_join(t, &ret);
    r->first_result = (long)ret;
    r->rc2 = altpatch_apply();
    snap(r->v2);
    r->spin_after = site_spin();
}

Test(live, thread_inside_site_refuses_it)
{
    need_live();
    struct inside_res *r = ap_isolated(sizeof(*r), inside_body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->v[S_SPIN].state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(r->v[S_SPIN].reason, ALTPATCH_REASON_LIVE_THREAD_INSIDE);
    cr_assert_eq(memcmp(r->v[S_SPIN].cur, r->v[S_SPIN].orig, r->v[S_SPIN].len), 0,
                 "original kept, entry barrier removed");
    cr_assert_eq(r->v[S_PAIR].state, ALTPATCH_SITE_PATCHED, "the other sites are patched");
    cr_assert_eq(r->first_result, 0, "the spinning thread left through the original");
    cr_assert_eq(r->rc2, 0);
    cr_assert_eq(r->v2[S_SPIN].state, ALTPATCH_SITE_PATCHED, "patched once nobody is inside");
    cr_assert_eq(r->spin_after, 2);
}

/* ---- the program's signal handlers ----------------------------------------------- */

static volatile int app_traps, app_hs;

static void app_trap(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)si, (void)uc;
    app_traps++;
}

static void app_rt(int sig)
{
    (void)sig;
    app_hs++;
}

__attribute__((noinline)) static void plain_int3(void)
{
    __asm__ __volatile__("int3" ::: "memory");
}

static volatile int app_urgs;

static void app_urg(int sig)
{
    (void)sig;
    app_urgs++;
}

struct chain_res {
    int rc, rc2, traps_raise, traps_int3, traps_late, rt, trap_kept, trap_kept2, urg;
    long one;
};

static void chain_body(void *out, void *ctx)
{
    struct chain_res *r = out;
    pthread_t t;
    (void)ctx;
    struct sigaction sa, cur;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = app_trap;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, NULL);
    for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
        signal(s, app_rt);
    signal(SIGURG, app_urg); /* the handshake's signal: the program's go to its action */
    altpatch_set_print(NULL);
    if (pipe(g_pipe) || pthread_create(&t, NULL, sleeper, NULL))
        _exit(3);
    r->rc = altpatch_apply(); /* live: another thread runs */
    sigaction(SIGTRAP, NULL, &cur);
    r->trap_kept = cur.sa_sigaction == app_trap && (cur.sa_flags & SA_SIGINFO) &&
                   !(cur.sa_flags & (SA_NODEFER | SA_ONSTACK | SA_RESTART));
    raise(SIGTRAP);
    r->traps_raise = app_traps;
    plain_int3();
    r->traps_int3 = app_traps;
    for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
        raise(s);
    r->rt = app_hs;
    raise(SIGURG);
    r->urg = app_urgs;
    r->rc2 = apply_flags(ALTPATCH_APPLY_REVERT, NULL);
    sigaction(SIGTRAP, NULL, &cur);
    r->trap_kept2 = cur.sa_sigaction == app_trap;
    raise(SIGTRAP);
    r->traps_late = app_traps;
    r->one = site_one();
    g_release = 1;
    release_sleeper(t);
}

/* altpatch installs no SIGTRAP handler: the program's stays and gets every SIGTRAP. */
Test(live, program_sigtrap_handler_is_left_alone)
{
    need_live();
    struct chain_res *r = ap_isolated(sizeof(*r), chain_body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert(r->trap_kept, "the program's SIGTRAP action is unchanged after a live apply");
    cr_assert_eq(r->traps_raise, 1, "raise(SIGTRAP) reached the program's handler");
    cr_assert_eq(r->traps_int3, 2, "an int3 reached the program's handler");
    cr_assert_eq(r->rt, SIGRTMAX - SIGRTMIN + 1, "every real-time signal reached the application");
    cr_assert_eq(r->urg, 1, "the program's SIGURG reached its handler");
    cr_assert_eq(r->rc2, 0);
    cr_assert(r->trap_kept2);
    cr_assert_eq(r->traps_late, 3);
    cr_assert_eq(r->one, 1);
}

/* ---- fork while live rounds run ------------------------------------------------ */

/* ---- a thread that execs while another applies live ---------------------------- */

static volatile int exec_stop;

static void *exec_site_runner(void *a)
{
    (void)a;
    while (!exec_stop)
        (void)site_pair();
    return NULL;
}

static unsigned exec_delay_us;

static void *execer(void *a)
{
    (void)a;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 < exec_delay_us);
    execl("/bin/true", "true", (char *)NULL);
    _exit(9);
}

/*
 * A thread calls execve() while the applying thread toggles a
 * multi-instruction site live, another thread running it (each toggle
 * signals that thread). A handshake signal queued to a thread that is in
 * execve() reaches the new image, whose actions are all reset: its default
 * action must not end the process. 200 fresh processes, the exec at a
 * different moment in each; each must end as /bin/true does.
 */
Test(live, exec_during_live_rounds_ends_as_the_new_image)
{
    need_live();
    int killed = 0, other = 0, last_sig = 0;
    for (int it = 0; it < 200; it++) {
        fflush(NULL);
        pid_t c = fork();
        cr_assert(c >= 0);
        if (c == 0) {
            altpatch_set_print(NULL);
            exec_delay_us = 300 + (unsigned)(it * 37) % 900;
            pthread_t s, t;
            if (pthread_create(&s, NULL, exec_site_runner, NULL) ||
                pthread_create(&t, NULL, execer, NULL))
                _exit(3);
            for (int i = 0;; i++)
                apply_flags(i & 1 ? ALTPATCH_APPLY_REVERT : 0, NULL);
        }
        int st = 0;
        cr_assert_eq(waitpid(c, &st, 0), c);
        if (WIFSIGNALED(st)) {
            killed++;
            last_sig = WTERMSIG(st);
        } else if (WEXITSTATUS(st) != 0) {
            other++;
        }
    }
    cr_assert_eq(killed, 0, "%d of 200 processes killed (last by signal %d)", killed, last_sig);
    cr_assert_eq(other, 0, "%d of 200 processes exited with another status", other);
}

/*
 * The signal the live protocol installs its handler on (the one action a
 * live apply changes) does nothing by default: a handshake that outlives the
 * handler (a thread in execve(), a program that set SIG_DFL back) cannot end
 * the process. Checked by raising it under SIG_DFL in a child.
 */
struct hs_sig_res {
    int rc, changed, sig, status, sigs[8];
};

static void hs_sig_body(void *out, void *ctx)
{
    struct hs_sig_res *r = out;
    (void)ctx;
    /* the C library's own signals (32, 33) are not reported: left out */
    struct sigaction before[SIGRTMAX + 1], after;
    bool known[SIGRTMAX + 1];
    for (int s = 1; s <= SIGRTMAX; s++)
        known[s] = sigaction(s, NULL, &before[s]) == 0;
    altpatch_set_print(NULL);
    pthread_t t;
    if (pipe(g_pipe) || pthread_create(&t, NULL, sleeper, NULL))
        _exit(3);
    r->rc = altpatch_apply(); /* live: another thread */
    for (int s = 1; s <= SIGRTMAX; s++) {
        if (!known[s] || sigaction(s, NULL, &after) != 0)
            continue;
        if (after.sa_handler != before[s].sa_handler) {
            r->changed++;
            r->sig = s;
            r->sigs[r->changed < 8 ? r->changed - 1 : 7] = s;
        }
    }
    if (r->changed == 1) {
        fflush(NULL);
        pid_t c = fork();
        if (c == 0) {
            signal(r->sig, SIG_DFL);
            sigset_t m;
            sigemptyset(&m);
            sigaddset(&m, r->sig);
            sigprocmask(SIG_UNBLOCK, &m, NULL);
            raise(r->sig);
            _exit(0);
        }
        waitpid(c, &r->status, 0);
    }
    release_sleeper(t);
}

Test(live, handshake_signal_does_nothing_by_default)
{
    need_live();
    struct hs_sig_res *r = ap_isolated(sizeof(*r), hs_sig_body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->changed, 1, "%d actions changed by a live apply (signals %d, %d)",
                 r->changed, r->sigs[0], r->sigs[1]);
    cr_assert(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0,
              "signal %d under SIG_DFL ended the process (status 0x%x)", r->sig, r->status);
}

/*
 * A thread asleep in read() whose syscall is the last instruction of a
 * multi-instruction site: /proc shows its pc at the site's end, outside. A
 * signal may make the kernel restart the call, moving RIP back two bytes, to
 * the syscall: inside the site. It counts as inside, so the site is refused
 * (LIVE_THREAD_INSIDE) while the thread sleeps there, and written once it
 * has left.
 */
__attribute__((noinline)) static long site_sysread(int fd, void *buf)
{
    long ret;
    __asm__ __volatile__(ALTERNATIVE("movl $0, %%eax\n\tsyscall",
                                     "movl $0, %%eax\n\txchg %%ax, %%ax", X86_FEATURE_ALWAYS)
                         : "=a"(ret)
                         : "D"((long)fd), "S"(buf), "d"(1L)
                         : "rcx", "r11", "memory");
    return ret;
}

static volatile pid_t g_reader_tid;

static void *reader(void *a)
{
    (void)a;
    char c;
    g_reader_tid = (pid_t)syscall(SYS_gettid);
    (void)site_sysread(g_pipe[0], &c);
    return NULL;
}

struct restart_res {
    int rc, rc_after;
    struct site_view asleep, after;
};

static int sysread_cb(const struct altpatch_site_info *s, void *p)
{
    site_view_take(p, s, (uintptr_t)site_sysread);
    return 0;
}

static void restart_body(void *out, void *ctx)
{
    struct restart_res *r = out;
    (void)ctx;
    altpatch_set_print(NULL);
    pthread_t t;
    if (pipe(g_pipe) || pthread_create(&t, NULL, reader, NULL))
        _exit(3);
    wait_asleep(&g_reader_tid);
    r->rc = altpatch_apply(); /* live: another thread */
    altpatch_site_foreach(sysread_cb, &r->asleep);
    release_sleeper(t);
    r->rc_after = altpatch_apply(); /* alone */
    altpatch_site_foreach(sysread_cb, &r->after);
}

Test(live, restartable_syscall_ending_a_site_counts_as_inside)
{
    need_live();
    struct restart_res *r = ap_isolated(sizeof(*r), restart_body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->asleep.len, 7, "the site was not found");
    cr_assert_eq(r->asleep.state, ALTPATCH_SITE_REFUSED, "state %d", r->asleep.state);
    cr_assert_eq(r->asleep.reason, ALTPATCH_REASON_LIVE_THREAD_INSIDE, "'%s'",
                 altpatch_strreason(r->asleep.reason));
    cr_assert_eq(memcmp(r->asleep.cur, r->asleep.orig, 7), 0, "the site keeps its bytes");
    cr_assert_eq(r->rc_after, 0);
    cr_assert_eq(r->after.state, ALTPATCH_SITE_PATCHED);
}

/*
 * An io_uring SQPOLL ring: its iou-sqp worker is listed in /proc/self/task
 * and shares the memory, but never runs user code (no user registers, every
 * signal blocked). It is no silent thread: a multi-instruction site is
 * written live, not refused for want of an answer.
 */
struct iou_res {
    int ring, rc;
    long pair;
    struct site_view v[S_COUNT];
};

static void iou_body(void *out, void *ctx)
{
    struct iou_res *r = out;
    (void)ctx;
    altpatch_set_print(NULL);
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_SQPOLL;
    p.sq_thread_idle = 10000; /* ms */
    long fd = syscall(SYS_io_uring_setup, 4, &p);
    r->ring = fd >= 0 ? 1 : -(int)errno;
    if (fd < 0)
        return;
    usleep(20000); /* the worker starts */
    r->rc = altpatch_apply();
    snap(r->v);
    r->pair = site_pair();
    close((int)fd);
}

Test(live, io_uring_worker_is_not_a_silent_thread)
{
    need_live();
    struct iou_res *r = ap_isolated(sizeof(*r), iou_body, NULL);
    if (r->ring < 0)
        cr_skip_test("io_uring_setup(SQPOLL) refused here: %s", strerror(-r->ring));
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->v[S_PAIR].state, ALTPATCH_SITE_PATCHED, "state %d, '%s'",
                 r->v[S_PAIR].state, altpatch_strreason(r->v[S_PAIR].reason));
    cr_assert_eq(r->pair, 22);
}

static volatile int fork_stop;

struct fork_res {
    int forks, bad_children, apply_errors, toggles;
};

static struct site_view fork_sites[S_COUNT];

/** No entry barrier (jmp ., EB FE) and no int3 at the first bytes of any site. */
static bool first_bytes_ok(void)
{
    for (int i = 0; i < S_COUNT; i++) {
        const volatile uint8_t *p = (const volatile uint8_t *)fork_sites[i].addr;
        if (p && (p[0] == 0xcc || (p[0] == 0xeb && p[1] == 0xfe)))
            return false;
    }
    return true;
}

static void *forker(void *p)
{
    struct fork_res *r = p;
    while (!fork_stop) {
        pid_t pid = fork();
        if (pid == 0) {
            /* No barrier may be left in the child's text: nobody would remove it. */
            if (!first_bytes_ok())
                _exit(2);
            long pair = site_pair(), one = site_one();
            _exit((pair == 11 || pair == 22) && (one == 1 || one == 2) ? 0 : 1);
        }
        if (pid < 0)
            break;
        int st = 0;
        waitpid(pid, &st, 0);
        r->forks++;
        r->bad_children += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    return NULL;
}

static void fork_body(void *out, void *ctx)
{
    struct fork_res *r = out;
    (void)ctx;
    pthread_t t;
    altpatch_set_print(NULL);
    struct altpatch_features *none = altpatch_features_new();
    altpatch_apply_opts(&(struct altpatch_apply_opts){.sz = sizeof(struct altpatch_apply_opts),
                                                      .flags = ALTPATCH_APPLY_DRY_RUN});
    snap(fork_sites);
    if (pthread_create(&t, NULL, forker, r))
        _exit(3);
    for (int i = 0; i < 300; i++) {
        r->apply_errors += apply_flags(i % 2 ? ALTPATCH_APPLY_REVERT : 0, NULL) != 0;
        r->toggles++;
        if (!first_bytes_ok())
            r->bad_children += 1000;
    }
    fork_stop = 1;
    pthread_join(t, NULL);
    altpatch_features_free(none);
}

Test(live, fork_during_live_rounds_gets_clean_children)
{
    need_live();
    struct fork_res *r = ap_isolated(sizeof(*r), fork_body, NULL);
    cr_assert_eq(r->apply_errors, 0);
    cr_assert_eq(r->toggles, 300);
    cr_assert_gt(r->forks, 0);
    cr_assert_eq(r->bad_children, 0, "%d of %d children saw a torn site", r->bad_children,
                 r->forks);
}

/* ---- signals during a single-threaded apply ------------------------------------- */

static volatile long sig_runs, sig_bad;

static void on_alarm(int sig)
{
    (void)sig;
    long one = site_one(), pair = site_pair();
    sig_runs++;
    /* Each site whole (the two may lie on pages written by different windows). */
    sig_bad += !((one == 1 || one == 2) && (pair == 11 || pair == 22));
}

struct sig_res {
    int apply_errors;
    long runs, bad, windows;
};

static void sig_body(void *out, void *ctx)
{
    struct sig_res *r = out;
    unsigned flags = (unsigned)(uintptr_t)ctx;
    signal(SIGALRM, on_alarm);
    struct itimerval it = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &it, NULL);
    altpatch_set_print(NULL);
    for (int i = 0; i < 400; i++) {
        r->apply_errors += apply_flags(flags | (i % 2 ? ALTPATCH_APPLY_REVERT : 0), NULL) != 0;
        struct altpatch_stats st;
        stats(&st);
        r->windows += (long)st.mprotect_windows;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    r->runs = sig_runs;
    r->bad = sig_bad;
}

Test(live, signal_handlers_run_sites_while_windows_open)
{
    struct sig_res *r = ap_isolated(sizeof(*r), sig_body, NULL);
    cr_assert_eq(r->apply_errors, 0);
    cr_assert_gt(r->windows, 0, "the mprotect path was exercised");
    cr_assert_gt(r->runs, 0, "the timer fired");
    cr_assert_eq(r->bad, 0);
}

Test(live, signal_handlers_run_sites_during_live_rounds)
{
    need_live();
    struct sig_res *r =
        ap_isolated(sizeof(*r), sig_body, (void *)(uintptr_t)ALTPATCH_APPLY_LIVE);
    cr_assert_eq(r->apply_errors, 0);
    cr_assert_eq(r->windows, 0);
    cr_assert_gt(r->runs, 0, "the timer fired");
    cr_assert_eq(r->bad, 0);
}

Test(live, reasons_have_texts)
{
    cr_assert_str_eq(altpatch_strreason(ALTPATCH_REASON_LIVE_CALL_INSIDE),
                     "not live-patchable: a call inside the site");
    cr_assert(strstr(altpatch_strreason(ALTPATCH_REASON_LIVE_THREAD_INSIDE), "inside"));
    cr_assert(strstr(altpatch_strreason(ALTPATCH_REASON_LIVE_NO_ANSWER), "answer"));
}

/* ---- signal masks do not matter ----------------------------------------------------- */

static volatile int nt_stop;
static volatile long nt_runs, nt_bad;
static volatile long nt_sigs;

/* A sigwait()-style worker: every signal blocked (unless @p arg), runs the sites all the time. */
static void *blocked_worker(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    if (!arg)
        pthread_sigmask(SIG_SETMASK, &all, NULL);
    while (!nt_stop) {
        long one = site_one(), pair = site_pair();
        nt_bad += !((one == 1 || one == 2) && (pair == 11 || pair == 22));
        nt_runs++;
    }
    return NULL;
}

/* A thread that blocks and unblocks SIGTRAP in a tight loop while it runs the sites. */
static void *mask_flipper(void *arg)
{
    (void)arg;
    sigset_t trap;
    sigemptyset(&trap);
    sigaddset(&trap, SIGTRAP);
    for (unsigned k = 0; !nt_stop; k++) {
        pthread_sigmask(k & 1 ? SIG_UNBLOCK : SIG_BLOCK, &trap, NULL);
        long one = site_one(), pair = site_pair();
        nt_bad += !((one == 1 || one == 2) && (pair == 11 || pair == 22));
        nt_runs++;
    }
    return NULL;
}

/* Runs the sites with every signal blocked (sa_mask full). */
static void on_usr1_sites(int sig)
{
    (void)sig;
    long one = site_one(), pair = site_pair();
    nt_bad += !((one == 1 || one == 2) && (pair == 11 || pair == 22));
    nt_sigs++;
}

static volatile int nt_kick_stop;

static void *nt_kicker(void *arg)
{
    pthread_t worker = *(pthread_t *)arg;
    while (!nt_kick_stop) {
        pthread_kill(worker, SIGUSR1);
        usleep(200);
    }
    return NULL;
}

/* Bytes of the sites in memory: each must be exactly the original or the replacement. */
struct bytes_ref {
    uintptr_t addr[S_COUNT];
    unsigned len[S_COUNT];
    uint8_t orig[S_COUNT][16], repl[S_COUNT][16];
};

/* The site bytes, original and patched, as a single-threaded apply leaves them. */
static void bytes_ref_take(struct bytes_ref *b)
{
    struct site_view v[S_COUNT];
    if (apply_flags(0, NULL))
        _exit(5);
    snap(v);
    for (int i = 0; i < S_COUNT; i++) {
        b->addr[i] = v[i].addr, b->len[i] = v[i].len;
        memcpy(b->orig[i], v[i].orig, 16);
        memcpy(b->repl[i], (const void *)v[i].addr, v[i].len);
    }
    if (apply_flags(ALTPATCH_APPLY_REVERT, NULL))
        _exit(5);
}

/* 0 when site i holds the bytes an apply (patched) or a revert (!patched) leaves. */
static int bytes_check(const struct bytes_ref *b, int i, bool patched)
{
    return memcmp((const void *)b->addr[i], patched ? b->repl[i] : b->orig[i], b->len[i]);
}

struct notrap_res {
    int toggles, errors, wrong_bytes, wrong_one;
    long runs, sigs, bad;
    struct site_view v[S_COUNT];
    int sigtrap_untouched;
};

/* ctx: 0 the sigwait-style worker; 1 the SIGTRAP mask flipper; 2 a worker whose
 * SIGUSR1 handler (every signal blocked) runs the sites, kicked every 200 us. */
static void notrap_body(void *out, void *ctx)
{
    struct notrap_res *r = out;
    pthread_t t, k;
    altpatch_set_print(NULL);
    struct bytes_ref b;
    bytes_ref_take(&b);
    struct sigaction before, after;
    sigaction(SIGTRAP, NULL, &before);
    int toggles = 20; /* every apply waits for the silent thread's answer */
    if (ctx == (void *)2) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_usr1_sites;
        sigfillset(&sa.sa_mask);
        sigaction(SIGUSR1, &sa, NULL);
    }
    if (pthread_create(&t, NULL, ctx == (void *)1 ? mask_flipper : blocked_worker, ctx))
        _exit(3);
    if (ctx == (void *)2 && pthread_create(&k, NULL, nt_kicker, &t))
        _exit(3);
    if (ctx == (void *)1)
        toggles = 2000;
    while (!nt_runs)
        sched_yield();
    for (int i = 0; i < toggles; i++) {
        bool patch = !(i % 2);
        r->errors += apply_flags(patch ? 0 : ALTPATCH_APPLY_REVERT, NULL) != 0;
        long one = site_one();
        r->wrong_one += one != (patch ? 2 : 1);
        r->wrong_bytes += bytes_check(&b, S_ONE, patch) != 0;
        /* Multi-instruction sites: the new bytes, or the old ones when refused. */
        r->wrong_bytes += bytes_check(&b, S_PAIR, patch) && bytes_check(&b, S_PAIR, !patch);
        r->toggles++;
    }
    snap(r->v);
    sigaction(SIGTRAP, NULL, &after);
    r->sigtrap_untouched = after.sa_handler == before.sa_handler;
    nt_kick_stop = 1;
    if (ctx == (void *)2)
        pthread_join(k, NULL);
    nt_stop = 1;
    pthread_join(t, NULL);
    r->runs = nt_runs, r->sigs = nt_sigs, r->bad = nt_bad;
}

/* Every signal blocked (sigwait() design): nothing to refuse, nothing to kill. */
Test(live, thread_blocking_every_signal_is_patched_and_survives)
{
    need_live();
    struct notrap_res *r = ap_isolated(sizeof(*r), notrap_body, NULL);
    cr_assert_eq(r->toggles, 20);
    cr_assert_eq(r->errors, 0, "every apply succeeds");
    cr_assert_eq(r->wrong_one, 0, "the single-instruction site changes at every apply");
    cr_assert_eq(r->wrong_bytes, 0);
    cr_assert_gt(r->runs, 0);
    cr_assert_eq(r->bad, 0, "no torn value in the blocking thread");
    cr_assert_eq(r->v[S_ONE].state, ALTPATCH_SITE_ORIGINAL, "last toggle: revert");
    cr_assert(r->sigtrap_untouched);
}

Test(live, thread_flipping_its_sigtrap_mask_during_2000_toggles)
{
    need_live();
    struct notrap_res *r = ap_isolated(sizeof(*r), notrap_body, (void *)1);
    cr_assert_eq(r->toggles, 2000);
    cr_assert_eq(r->errors, 0, "every apply succeeds");
    cr_assert_eq(r->wrong_one, 0);
    cr_assert_eq(r->wrong_bytes, 0, "memory holds the original or the replacement, nothing else");
    cr_assert_gt(r->runs, 0);
    cr_assert_eq(r->bad, 0, "no torn value");
    cr_assert(r->sigtrap_untouched);
}

Test(live, handler_blocking_every_signal_runs_sites_during_toggles)
{
    need_live();
    struct notrap_res *r = ap_isolated(sizeof(*r), notrap_body, (void *)2);
    cr_assert_eq(r->errors, 0, "every apply succeeds");
    cr_assert_eq(r->wrong_one, 0);
    cr_assert_eq(r->wrong_bytes, 0);
    cr_assert_gt(r->sigs, 0, "the kicks arrived");
    cr_assert_eq(r->bad, 0, "no torn value in the thread or its handler");
}

/* ---- the pages stay the file's; the mappings stay few ------------------------------- */

struct maps_res {
    int errors, lines_before, lines_first, lines_after, blocks;
    int named, same_file_bytes;
    char line[256];
};

/* Lines of /proc/self/maps that map the executable (other mappings come and
 * go with the allocator, a sanitizer's in particular). */
static int maps_lines(void)
{
    char exe[256] = "";
    ssize_t l = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[l > 0 ? l : 0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0;
    char buf[512];
    while (f && fgets(buf, sizeof(buf), f)) {
        char *nl = strchr(buf, '\n');
        if (nl)
            *nl = 0;
        size_t bl = strlen(buf), el = strlen(exe);
        n += el && bl > el && !strcmp(buf + bl - el, exe);
    }
    if (f)
        fclose(f);
    return n;
}

/* Distinct 64 KiB blocks holding a site (a flip replaces whole blocks). */
struct blocks {
    uintptr_t b[256];
    int n;
};

static int block_cb(const struct altpatch_site_info *s, void *p)
{
    struct blocks *bl = p;
    for (uintptr_t a = s->addr >> 16; a <= (s->addr + s->len - 1) >> 16; a++) {
        int k = 0;
        while (k < bl->n && bl->b[k] != a)
            k++;
        if (k == bl->n && bl->n < 256)
            bl->b[bl->n++] = a;
    }
    return 0;
}

static void maps_body(void *out, void *ctx)
{
    struct maps_res *r = out;
    pthread_t t;
    (void)ctx;
    altpatch_set_print(NULL);
    if (pipe(g_pipe) || pthread_create(&t, NULL, sleeper, NULL))
        _exit(3);
    wait_asleep(&g_sleeper_tid);
    struct site_view v[S_COUNT];
    r->lines_before = maps_lines();
    for (int i = 0; i < 1000; i++) {
        r->errors += apply_flags(i % 2 ? ALTPATCH_APPLY_REVERT : 0, NULL) != 0;
        if (i == 9)
            r->lines_first = maps_lines();
    }
    r->errors += apply_flags(0, NULL) != 0;
    r->lines_after = maps_lines();
    snap(v);
    struct blocks bl = {.n = 0};
    altpatch_site_foreach(block_cb, &bl);
    r->blocks = bl.n;
    /* The mapping that holds site_one now: still the executable, at the right
     * offset (the file holds the original bytes there). */
    char exe[256] = "";
    ssize_t l = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[l > 0 ? l : 0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    char buf[512];
    while (f && fgets(buf, sizeof(buf), f)) {
        unsigned long s, e, off;
        char perms[8];
        int pos = 0;
        if (sscanf(buf, "%lx-%lx %7s %lx %*s %*s %n", &s, &e, perms, &off, &pos) < 4 ||
            v[S_ONE].addr < s || v[S_ONE].addr >= e)
            continue;
        snprintf(r->line, sizeof(r->line), "%.200s", buf);
        r->named = strstr(buf + pos, exe) == buf + pos && !strcmp(perms, "r-xp");
        FILE *x = fopen(exe, "rb");
        uint8_t file[16];
        r->same_file_bytes = x && !fseek(x, (long)(off + (v[S_ONE].addr - s)), SEEK_SET) &&
                             fread(file, 1, v[S_ONE].len, x) == v[S_ONE].len &&
                             !memcmp(file, v[S_ONE].orig, v[S_ONE].len) &&
                             memcmp(file, (const void *)v[S_ONE].addr, v[S_ONE].len);
        if (x)
            fclose(x);
    }
    if (f)
        fclose(f);
    g_release = 1;
    release_sleeper(t);
}

Test(live, flipped_pages_stay_the_files_and_mappings_stay_bounded)
{
    need_live();
    struct maps_res *r = ap_isolated(sizeof(*r), maps_body, NULL);
    cr_assert_eq(r->errors, 0);
    cr_assert(r->named, "the flipped text is still the executable's r-xp mapping: %s", r->line);
    cr_assert(r->same_file_bytes,
              "at the same file offset (original bytes in the file, patched in memory): %s",
              r->line);
    cr_assert_gt(r->blocks, 0);
    cr_assert_leq(r->lines_first - r->lines_before, 2 * r->blocks,
                  "at most two new mappings per 64 KiB block holding sites (%d -> %d, %d blocks)",
                  r->lines_before, r->lines_first, r->blocks);
    cr_assert_eq(r->lines_after, r->lines_first, "no growth over 990 more toggles (%d -> %d)",
                 r->lines_first, r->lines_after);
}

/* ---- a signal handler runs a site while its thread spins on an entry barrier -------- */

static volatile long nest_runs, nest_bad, nest_sigs;
static volatile int nest_stop;

static void on_nest(int sig)
{
    (void)sig;
    long one = site_one(), pair = site_pair();
    nest_bad += !((one == 1 || one == 2) && (pair == 11 || pair == 22));
    nest_sigs++;
}

static void *nest_worker(void *arg)
{
    (void)arg;
    while (!nest_stop) {
        long one = site_one(), pair = site_pair();
        nest_bad += !((one == 1 || one == 2) && (pair == 11 || pair == 22));
        nest_runs++;
    }
    return NULL;
}

struct nest_res {
    int apply_errors;
    long runs, sigs, bad;
};

static volatile int kick_stop;

static void *kicker(void *arg)
{
    pthread_t worker = *(pthread_t *)arg;
    while (!kick_stop) {
        pthread_kill(worker, SIGUSR1);
        usleep(500);
    }
    return NULL;
}

static void nest_body(void *out, void *ctx)
{
    struct nest_res *r = out;
    (void)ctx;
    pthread_t t, k, sp;
    altpatch_set_print(NULL);
    signal(SIGUSR1, on_nest);
    /* A thread stays inside site_spin: the handshake retries for its whole
     * budget, so the round lasts long and the worker, which reaches
     * site_pair's entry barrier, spins there meanwhile; the kicker's
     * SIGUSR1 handler runs sites on top of that spin. */
    spin_flag = 1;
    if (pthread_create(&sp, NULL, spinner, NULL))
        _exit(3);
    while (!spin_entered)
        sched_yield();
    if (pthread_create(&t, NULL, nest_worker, NULL) || pthread_create(&k, NULL, kicker, &t))
        _exit(3);
    while (!nest_runs || !nest_sigs)
        sched_yield();
    /* Every other apply tries site_spin again (refused: a thread is inside). */
    for (int i = 0; i < 6; i++)
        r->apply_errors += apply_flags(i % 2 ? ALTPATCH_APPLY_REVERT : 0, NULL) != 0;
    kick_stop = 1;
    pthread_join(k, NULL);
    spin_flag = 0;
    pthread_join(sp, NULL);
    nest_stop = 1;
    pthread_join(t, NULL);
    r->runs = nest_runs, r->sigs = nest_sigs, r->bad = nest_bad;
}

Test(live, handler_runs_site_while_thread_spins_on_a_barrier)
{
    need_live();
    struct nest_res *r = ap_isolated(sizeof(*r), nest_body, NULL);
    cr_assert_eq(r->apply_errors, 0);
    cr_assert_gt(r->sigs, 0, "the kicks arrived");
    cr_assert_gt(r->runs, 0);
    cr_assert_eq(r->bad, 0);
}

/* ---- a site in a function the apply itself calls ------------------------------------ */

/* The program's calloc holds a multi-instruction site: the round must not call
 * it between the two flips (it would spin on the entry barrier forever). */
static volatile int calloc_hook;
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_LIVE_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(TEST_LIVE_ASAN)
/* Under AddressSanitizer every allocation must come from its allocator (its
 * free() rejects glibc's blocks): call its calloc, which it exports under
 * this name beside "calloc". */
extern void *__interceptor_calloc(size_t n, size_t size);
#define TEST_LIVE_REAL_CALLOC __interceptor_calloc
#else
extern void *__libc_calloc(size_t n, size_t size);
#define TEST_LIVE_REAL_CALLOC __libc_calloc
#endif

void *calloc(size_t n, size_t size)
{
    if (calloc_hook)
        (void)site_pair();
    return TEST_LIVE_REAL_CALLOC(n, size);
}

struct selfcall_res {
    int apply_errors;
    long pair;
    struct site_view v[S_COUNT];
};

static void selfcall_body(void *out, void *ctx)
{
    struct selfcall_res *r = out;
    (void)ctx;
    pthread_t t;
    altpatch_set_print(NULL);
    if (pipe(g_pipe) || pthread_create(&t, NULL, sleeper, NULL))
        _exit(3);
    calloc_hook = 1;
    for (int i = 0; i < 20; i++)
        r->apply_errors += apply_flags(i % 2 ? ALTPATCH_APPLY_REVERT : 0, NULL) != 0;
    r->apply_errors += apply_flags(0, NULL) != 0;
    calloc_hook = 0;
    snap(r->v);
    r->pair = site_pair();
    release_sleeper(t);
}

Test(live, site_in_a_function_the_round_calls)
{
    need_live();
    struct selfcall_res *r = ap_isolated(sizeof(*r), selfcall_body, NULL);
    cr_assert_eq(r->apply_errors, 0);
    cr_assert_eq(r->v[S_PAIR].state, ALTPATCH_SITE_PATCHED);
    cr_assert_eq(r->pair, 22);
}

/* ---- threads that run no site are not disturbed -------------------------------------- */

static volatile long ep_waits, ep_eintr;
static int ep_fd;

static volatile pid_t ep_tid;

static void *epoll_waiter(void *arg)
{
    (void)arg;
    ep_tid = (pid_t)syscall(SYS_gettid);
    struct epoll_event ev;
    for (;;) {
        int n = epoll_wait(ep_fd, &ev, 1, 10000);
        ep_waits++;
        if (n < 0 && errno == EINTR)
            ep_eintr++;
        else if (n != 0)
            return NULL; /* released */
    }
}

struct ep_res {
    int apply_errors;
    long eintr, waits, pair;
};

static void ep_body(void *out, void *ctx)
{
    struct ep_res *r = out;
    (void)ctx;
    pthread_t t;
    altpatch_set_print(NULL);
    ep_fd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    if (ep_fd < 0 || pipe(g_pipe) || epoll_ctl(ep_fd, EPOLL_CTL_ADD, g_pipe[0], &ev) ||
        pthread_create(&t, NULL, epoll_waiter, NULL))
        _exit(3);
    wait_asleep(&ep_tid);
    for (int i = 0; i < 200; i++) /* site_pair: a multi-instruction site in every round */
        r->apply_errors += apply_flags(i % 2 ? ALTPATCH_APPLY_REVERT : 0, NULL) != 0;
    r->pair = site_pair();
    release_sleeper(t);
    r->eintr = ep_eintr, r->waits = ep_waits;
}

Test(live, blocked_epoll_wait_sees_no_eintr)
{
    need_live();
    struct ep_res *r = ap_isolated(sizeof(*r), ep_body, NULL);
    cr_assert_eq(r->apply_errors, 0);
    cr_assert_eq(r->pair, 11, "200 toggles end reverted");
    cr_assert_eq(r->eintr, 0, "epoll_wait failed with EINTR %ld times", r->eintr);
}

/* ---- a handler that interrupted a multi-instruction site ----------------------------- */

static volatile int hide_in_handler, hide_release;

static void on_hide(int sig)
{
    (void)sig;
    hide_in_handler = 1;
    while (!hide_release)
        usleep(1000); /* asleep in the handler: located through /proc */
}

struct hide_res {
    int rc, rc2;
    long spin_result, spin_after;
    struct site_view v[S_COUNT], v2[S_COUNT];
};

static void hide_body(void *out, void *ctx)
{
    struct hide_res *r = out;
    (void)ctx;
    pthread_t t;
    altpatch_set_print(NULL);
    signal(SIGUSR2, on_hide);
    spin_flag = 1;
    if (pthread_create(&t, NULL, spinner, NULL))
        _exit(3);
    while (!spin_entered)
        sched_yield();
    usleep(10000); /* well inside site_spin's loop */
    pthread_kill(t, SIGUSR2);
    while (!hide_in_handler)
        sched_yield();
    /* The thread's RIP is in the handler; the RIP it resumes at is inside site_spin. */
    r->rc = altpatch_apply();
    snap(r->v);
    spin_flag = 0;
    hide_release = 1;
    void *ret;
    pthread_join(t, &ret);
    r->spin_result = (long)ret;
    r->rc2 = altpatch_apply();
    snap(r->v2);
    r->spin_after = site_spin();
}

Test(live, handler_over_a_site_keeps_the_site)
{
    need_live();
    struct hide_res *r = ap_isolated(sizeof(*r), hide_body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->v[S_SPIN].state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(r->v[S_SPIN].reason, ALTPATCH_REASON_LIVE_THREAD_INSIDE);
    cr_assert_eq(memcmp(r->v[S_SPIN].cur, r->v[S_SPIN].orig, r->v[S_SPIN].len), 0);
    cr_assert_eq(r->v[S_PAIR].state, ALTPATCH_SITE_PATCHED, "the other sites are patched");
    cr_assert_eq(r->spin_result, 0, "the interrupted thread left through the original");
    cr_assert_eq(r->v2[S_SPIN].state, ALTPATCH_SITE_PATCHED);
    cr_assert_eq(r->spin_after, 2);
}

/* ---- text whose pages cannot be flipped ---------------------------------------------- */

#ifndef SYS_mseal
#define SYS_mseal 462 /* x86-64 */
#endif

/* One instruction each: movl $1, %eax / movl $2, %eax; then ret. */
static const uint8_t fl_old[] = {0xb8, 1, 0, 0, 0}, fl_new[] = {0xb8, 2, 0, 0, 0};
/* What the page starts with, and what the write changes (fl_old/fl_new by default). */
static const uint8_t *fl_from = fl_old, *fl_to = fl_new;
static size_t fl_len = sizeof(fl_old);

enum { FL_ANON, FL_FILE, FL_SEALED, FL_THREADS = 16, FL_REALTIME = 32 };

static char fl_path[64];

/* An RX page starting with fl_old; ret: anonymous, or a private mapping of a file. */
static uint8_t *fl_text(int kind)
{
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *code = calloc(1, (size_t)pg);
    cr_assert(code);
    memset(code, 0x90, (size_t)pg);
    memcpy(code, fl_from, fl_len);
    code[fl_len] = 0xc3;
    uint8_t *p;
    if (kind == FL_ANON) {
        p = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        cr_assert(p != MAP_FAILED);
        memcpy(p, code, (size_t)pg);
        cr_assert_eq(mprotect(p, (size_t)pg, PROT_READ | PROT_EXEC), 0);
    } else {
        snprintf(fl_path, sizeof(fl_path), "ap_flip_text_XXXXXX"); /* the test's directory */
        int fd = mkstemp(fl_path);
        cr_assert(fd >= 0, "mkstemp");
        cr_assert_eq(write(fd, code, (size_t)pg), pg);
        p = mmap(NULL, (size_t)pg, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            unlink(fl_path);
            cr_skip_test("the test directory is mounted noexec");
        }
        if (kind == FL_SEALED && syscall(SYS_mseal, p, (size_t)pg, 0) != 0) {
            int e = errno;
            unlink(fl_path);
            cr_skip_test("mseal not available: %s", strerror(e));
        }
    }
    free(code);
    return p;
}

struct fl_res {
    int ready, rc, result, wrote, value, named, no_rt;
    uint8_t mem[16];
};

static uint8_t *fl_page;

static void fl_body(void *out, void *ctx)
{
    struct fl_res *r = out;
    int kind = (int)(intptr_t)ctx;
    pthread_t t;
    altpatch_set_print(NULL);
    /* The thread blocks every signal but SIGTRAP and runs: it cannot answer a handshake. */
    if ((kind & FL_THREADS) && (pipe(g_pipe) || pthread_create(&t, NULL, sleeper, (void *)1)))
        _exit(3);
    if (kind & FL_REALTIME) {
        /* A SCHED_FIFO thread asleep in read(): it runs nothing of ours. */
        pthread_attr_t a;
        struct sched_param sp = {.sched_priority = 1};
        if (pipe(g_pipe) || pthread_attr_init(&a) ||
            pthread_attr_setinheritsched(&a, PTHREAD_EXPLICIT_SCHED) ||
            pthread_attr_setschedpolicy(&a, SCHED_FIFO) || pthread_attr_setschedparam(&a, &sp))
            _exit(3);
        int e = pthread_create(&t, &a, sleeper, NULL);
        if (e == EPERM) {
            r->no_rt = 1;
            return;
        }
        if (e)
            _exit(3);
    }
    const char *why;
    r->ready = ap_live_ready(&why);
    struct ap_write w = {.addr = (uintptr_t)fl_page, .old = fl_from, .new = fl_to, .len = fl_len};
    struct ap_poke_stats st = {0};
    r->rc = ap_live_poke(&w, 1, &st);
    r->result = w.result, r->wrote = w.wrote;
    memcpy(r->mem, fl_page, fl_len);
    r->value = ((int (*)(void))(uintptr_t)fl_page)();
    FILE *f = fopen("/proc/self/maps", "r");
    char buf[512];
    while (f && fgets(buf, sizeof(buf), f))
        if (strtoul(buf, NULL, 16) == (uintptr_t)fl_page && fl_path[0])
            r->named = strstr(buf, fl_path) != NULL && !strstr(buf, "(deleted)");
    if (f)
        fclose(f);
    if (kind & (FL_THREADS | FL_REALTIME)) {
        g_release = 1;
        if (write(g_pipe[1], "x", 1) != 1)
            _exit(4);
        pthread_join(t, NULL);
    }
}

static struct fl_res *fl_run(int kind)
{
    need_live();
    fl_path[0] = 0;
    fl_page = fl_text(kind & ~(FL_THREADS | FL_REALTIME));
    struct fl_res *r = ap_isolated(sizeof(*r), fl_body, (void *)(intptr_t)kind);
    if (fl_path[0])
        unlink(fl_path);
    if (r->no_rt)
        cr_skip_test("no permission for SCHED_FIFO (RLIMIT_RTPRIO 0, no CAP_SYS_NICE)");
    cr_assert_eq(r->ready, 0, "live patching available");
    cr_assert_eq(r->rc, 0);
    return r;
}

Test(live, file_text_is_flipped_and_keeps_its_name)
{
    struct fl_res *r = fl_run(FL_FILE | FL_THREADS);
    cr_assert_eq(r->result, ALTPATCH_REASON_NONE);
    cr_assert(r->wrote);
    cr_assert_eq(memcmp(r->mem, fl_new, sizeof(fl_new)), 0);
    cr_assert_eq(r->value, 2);
    cr_assert(r->named, "/proc/self/maps still names the file");
}

Test(live, anonymous_text_alone_goes_to_the_ordinary_writer)
{
    struct fl_res *r = fl_run(FL_ANON);
    cr_assert_eq(r->result, ALTPATCH_REASON_NONE);
    cr_assert(r->wrote);
    cr_assert_eq(r->value, 2);
}

Test(live, anonymous_text_with_threads_is_refused)
{
    struct fl_res *r = fl_run(FL_ANON | FL_THREADS);
    cr_assert_eq(r->result, ALTPATCH_REASON_LIVE_NO_FLIP);
    cr_assert(!r->wrote);
    cr_assert_eq(memcmp(r->mem, fl_old, sizeof(fl_old)), 0, "nothing written");
    cr_assert_eq(r->value, 1);
}

Test(live, sealed_text_alone_goes_to_the_ordinary_writer)
{
    struct fl_res *r = fl_run(FL_SEALED);
    cr_assert_eq(r->result, ALTPATCH_REASON_NONE);
    cr_assert(r->wrote);
    cr_assert_eq(r->value, 2);
}

Test(live, sealed_text_with_threads_is_refused)
{
    struct fl_res *r = fl_run(FL_SEALED | FL_THREADS);
    cr_assert_eq(r->result, ALTPATCH_REASON_LIVE_NO_FLIP);
    cr_assert(!r->wrote);
    cr_assert_eq(memcmp(r->mem, fl_old, sizeof(fl_old)), 0, "nothing written");
    cr_assert_eq(r->value, 1);
    cr_assert(r->named, "the sealed mapping is untouched");
}

/* mfence; lfence -> two 3-byte NOPs: every instruction does nothing and every old
 * boundary is a new one, so one flip suffices and no thread needs to answer. */
Test(live, fences_to_nops_need_no_handshake)
{
    static const uint8_t fences[] = {0x0f, 0xae, 0xf0, 0x0f, 0xae, 0xe8};
    static const uint8_t nops[] = {0x0f, 0x1f, 0x00, 0x0f, 0x1f, 0x00};
    fl_from = fences, fl_to = nops, fl_len = sizeof(fences);
    struct fl_res *r = fl_run(FL_FILE | FL_THREADS);
    cr_assert_eq(r->result, ALTPATCH_REASON_NONE, "patched although a thread cannot answer");
    cr_assert_eq(memcmp(r->mem, nops, sizeof(nops)), 0);
}

/* The same fences to one 6-byte NOP: a thread between the fences would resume
 * inside the NOP, so the site needs the handshake, which the silent thread fails. */
Test(live, fences_to_one_nop_need_the_handshake)
{
    static const uint8_t fences[] = {0x0f, 0xae, 0xf0, 0x0f, 0xae, 0xe8};
    static const uint8_t nop6[] = {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00};
    fl_from = fences, fl_to = nop6, fl_len = sizeof(fences);
    struct fl_res *r = fl_run(FL_FILE | FL_THREADS);
    cr_assert_eq(r->result, ALTPATCH_REASON_LIVE_NO_ANSWER);
    cr_assert_eq(memcmp(r->mem, fences, sizeof(fences)), 0, "nothing left behind");
}

/* A thread entering a class B site spins on its entry barrier until the second
 * flip; under a real-time policy it could keep the applying thread off its CPU,
 * so no barrier is written while such a thread exists. One-instruction sites
 * need no barrier and are still written. */
Test(live, realtime_thread_keeps_multi_instruction_sites)
{
    static const uint8_t pair_old[] = {0xb8, 1, 0, 0, 0, 0x83, 0xc0, 10};
    static const uint8_t pair_new[] = {0xb8, 2, 0, 0, 0, 0x83, 0xc0, 20};
    fl_from = pair_old, fl_to = pair_new, fl_len = sizeof(pair_old);
    struct fl_res *r = fl_run(FL_FILE | FL_REALTIME);
    cr_assert_eq(r->result, ALTPATCH_REASON_LIVE_REALTIME);
    cr_assert(!r->wrote);
    cr_assert_eq(memcmp(r->mem, pair_old, sizeof(pair_old)), 0, "no barrier left behind");
    cr_assert_eq(r->value, 11);
    fl_from = fl_old, fl_to = fl_new, fl_len = sizeof(fl_old);
    r = fl_run(FL_FILE | FL_REALTIME);
    cr_assert_eq(r->result, ALTPATCH_REASON_NONE, "a one-instruction site needs no barrier");
    cr_assert_eq(memcmp(r->mem, fl_new, sizeof(fl_new)), 0);
    cr_assert_eq(r->value, 2);
}

/* A multi-instruction site whose first instruction is one byte: no room for jmp . */
Test(live, one_byte_first_instruction_is_refused_live)
{
    static const uint8_t from[] = {0x90, 0xb8, 1, 0, 0, 0}, to[] = {0xb8, 2, 0, 0, 0, 0x90};
    fl_from = from, fl_to = to, fl_len = sizeof(from);
    struct fl_res *r = fl_run(FL_FILE | FL_THREADS);
    cr_assert_eq(r->result, ALTPATCH_REASON_LIVE_SHORT_ENTRY);
    cr_assert_eq(memcmp(r->mem, from, sizeof(from)), 0);
    cr_assert_eq(r->value, 1);
}

/* A site across the boundary an earlier flip left between two mappings of the
 * same file: both sides flip together (and become one mapping again). */
struct straddle_res {
    int ready, r1, r2, w1, w2, lines_mid, lines_end;
    uint8_t mem[8];
};

static uint8_t *st_page;
static size_t st_len;

static int st_lines_in(uintptr_t s, uintptr_t e)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char buf[512];
    int n = 0;
    while (f && fgets(buf, sizeof(buf), f)) {
        unsigned long a = strtoul(buf, NULL, 16);
        n += a >= s && a < e;
    }
    if (f)
        fclose(f);
    return n;
}

static void straddle_body(void *out, void *ctx)
{
    struct straddle_res *r = out;
    pthread_t t;
    (void)ctx;
    altpatch_set_print(NULL);
    if (pipe(g_pipe) || pthread_create(&t, NULL, sleeper, NULL))
        _exit(3);
    const char *why;
    r->ready = ap_live_ready(&why);
    static const uint8_t nop2[] = {0x66, 0x90}, mov2[] = {0x89, 0xc0}; /* one insn each */
    struct ap_poke_stats st = {0};
    /* Block 0 alone: the mapping is split at 64 KiB. */
    struct ap_write w1 = {.addr = (uintptr_t)st_page, .old = nop2, .new = mov2, .len = 2};
    ap_live_poke(&w1, 1, &st);
    r->r1 = w1.result, r->w1 = w1.wrote;
    r->lines_mid = st_lines_in((uintptr_t)st_page, (uintptr_t)st_page + st_len);
    /* A 2-byte instruction across the split. */
    struct ap_write w2 = {.addr = (uintptr_t)st_page + 65535, .old = nop2, .new = mov2, .len = 2};
    ap_live_poke(&w2, 1, &st);
    r->r2 = w2.result, r->w2 = w2.wrote;
    memcpy(r->mem, st_page + 65535, 2);
    r->lines_end = st_lines_in((uintptr_t)st_page, (uintptr_t)st_page + st_len);
    g_release = 1;
    release_sleeper(t);
}

Test(live, site_across_an_earlier_split_is_flipped)
{
    need_live();
    st_len = 128 * 1024;
    uint8_t *code = malloc(st_len);
    cr_assert(code);
    memset(code, 0x90, st_len);
    memcpy(code, "\x66\x90", 2);
    memcpy(code + 65535, "\x66\x90", 2);
    snprintf(fl_path, sizeof(fl_path), "ap_flip_text_XXXXXX");
    int fd = mkstemp(fl_path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, code, st_len), (ssize_t)st_len);
    free(code);
    /* Reserve 192 KiB and map at a 64 KiB-aligned address inside: the blocks
     * are the file's two halves. */
    uint8_t *res = mmap(NULL, st_len + 65536, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(res != MAP_FAILED);
    uintptr_t at = ((uintptr_t)res + 65535) & ~(uintptr_t)65535;
    st_page = mmap((void *)at, st_len, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, 0);
    close(fd);
    if (st_page == MAP_FAILED) {
        unlink(fl_path);
        cr_skip_test("the test directory is mounted noexec");
    }
    struct straddle_res *r = ap_isolated(sizeof(*r), straddle_body, NULL);
    unlink(fl_path);
    cr_assert_eq(r->ready, 0);
    cr_assert_eq(r->r1, ALTPATCH_REASON_NONE);
    cr_assert(r->w1);
    cr_assert_eq(r->lines_mid, 2, "the first flip split the mapping at 64 KiB");
    cr_assert_eq(r->r2, ALTPATCH_REASON_NONE, "reason %d", r->r2);
    cr_assert(r->w2);
    cr_assert_eq(memcmp(r->mem, "\x89\xc0", 2), 0);
    cr_assert_eq(r->lines_end, 1, "one mapping again");
}
