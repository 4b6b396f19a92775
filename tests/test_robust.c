/* SPDX-License-Identifier: MIT */
/*
 * Re-patching must never kill, hang or disturb the program: fork() while
 * another thread applies, the entry points re-entered from a signal handler,
 * a policy that refuses RX after RW, a plugin rebuilt and reloaded at the same
 * address, and one WARN line per site and reason.
 *
 * Every body runs in a fork()ed child with a watchdog: a body that hangs is
 * killed after its time and fails the test instead of stalling the suite.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>
#include "ap_step.h"

#include "ap_copyfile.h"
#include "ap_isolate.h"
#include "ap_live_sites.h"
#include "ap_procmem.h"
#include "ap_seccomp.h"
#include "ap_warnlog.h"

/* ---- helpers ----------------------------------------------------------------- */

typedef void (*body_fn)(void *out);

/**
 * Run @p fn in a fork()ed child with a shared result block of @p size bytes;
 * kill it after @p limit_s seconds. Returns the block; *status gets the
 * wait status (or -1 when the child had to be killed: it hung).
 */
static void *run_child(size_t size, body_fn fn, int limit_s, int *status)
{
    void *out = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(out != MAP_FAILED);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        fn(out);
        fflush(NULL);
        _exit(0);
    }
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pid_t w = waitpid(pid, status, WNOHANG);
        if (w == pid)
            return out;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, status, 0);
            *status = -1;
            return out;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void assert_clean_exit(int status, const char *what)
{
    cr_assert_neq(status, -1, "%s: the child hung and was killed", what);
    cr_assert(WIFEXITED(status), "%s: the child died (signal %d)", what,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cr_assert_eq(WEXITSTATUS(status), 0, "%s: exit status %d", what, WEXITSTATUS(status));
}

static int apply_flags(unsigned flags)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = flags};
    return altpatch_apply_opts(&o);
}

/* A plain fork whose child exits at once: 0 when it returned and was reaped. */
static int plain_fork(void)
{
    pid_t c = fork();
    if (c == 0)
        _exit(0);
    int st;
    return c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

static int count_cb(const struct altpatch_site_info *s, void *p)
{
    (void)s;
    ++*(long *)p;
    return 0;
}

/* ---- fork while another thread applies ---------------------------------------- */

#define FORK_CHILDREN 20

struct fork_res {
    int forked, hung, died, bad, bad_steps;
    int applies;
    long child_status[FORK_CHILDREN];
};

static volatile int fork_stop;

static void *applier(void *p)
{
    int *n = p;
    for (unsigned i = 0; !__atomic_load_n(&fork_stop, __ATOMIC_ACQUIRE); i++) {
        apply_flags(i % 2 ? ALTPATCH_APPLY_REVERT : 0);
        __atomic_add_fetch(n, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* In the child: every entry point must return (the watchdog is SIGALRM). */
static void fork_child(void)
{
    alarm(3);
    struct altpatch_stats st = {.sz = sizeof(st)};
    long sites = 0;
    int bad = 0; /* one bit per failed step: the exit status says which */
    bad |= (altpatch_get_stats(&st) != 0) << 0;
    bad |= (altpatch_site_foreach(count_cb, &sites) != 0) << 1;
    bad |= (apply_flags(0) != 0) << 2;
    bad |= (site_one() != 2 || site_pair() != 22) << 3;
    bad |= (altpatch_dlopen(NULL, RTLD_NOW) == NULL) << 4;
    bad |= (apply_flags(ALTPATCH_APPLY_REVERT) != 0) << 5;
    bad |= (site_one() != 1 || site_pair() != 11) << 6;
    _exit(bad);
}

static void fork_body(void *out)
{
    struct fork_res *r = out;
    altpatch_set_print(NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, applier, &r->applies))
        _exit(2);
    while (__atomic_load_n(&r->applies, __ATOMIC_ACQUIRE) == 0) /* a site walk needs one apply */
        sched_yield();
    for (int i = 0; i < FORK_CHILDREN; i++) {
        struct timespec ts = {0, 300 * 1000}; /* let the applier get into a call */
        nanosleep(&ts, NULL);
        pid_t pid = fork();
        if (pid == 0)
            fork_child();
        if (pid < 0)
            continue;
        r->forked++;
        int st = 0;
        waitpid(pid, &st, 0);
        r->child_status[i] = st;
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
            r->hung++;
        else if (WIFSIGNALED(st))
            r->died++;
        else if (WEXITSTATUS(st))
            r->bad++, r->bad_steps |= WEXITSTATUS(st);
    }
    __atomic_store_n(&fork_stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
}

Test(robust, fork_while_another_thread_applies, .timeout = 120)
{
    int status;
    struct fork_res *r = run_child(sizeof(*r), fork_body, 100, &status);
    assert_clean_exit(status, "forking parent");
    cr_assert_eq(r->forked, FORK_CHILDREN);
    cr_assert_gt(r->applies, 0);
    cr_assert_eq(r->hung, 0, "%d of %d children hung in an entry point", r->hung, r->forked);
    cr_assert_eq(r->died, 0, "%d children died", r->died);
    cr_assert_eq(r->bad, 0, "%d children got wrong results (failed steps 0x%x)", r->bad,
                 r->bad_steps);
}

/* ---- fork from a signal handler on a thread inside the library ----------------- */

/*
 * A handler that forks while its thread is inside altpatch_dlopen() (run
 * by the loaded library's constructor), inside altpatch_apply() (raised from
 * the print callback, the library's lock held), or waiting for that lock
 * while another thread holds it. The fork returns in both processes; the
 * child's copy of the interrupted call returns, and its later calls work --
 * or, where the lock was another thread's (a thread the child lacks), fail
 * with -EOWNERDEAD instead of waiting forever.
 */
struct hfork_res {
    int forked, parent_loaded, parent_first, parent_apply, parent_one;
    int child_status;
    int child_first, child_loaded, child_apply, child_one, child_dl, child_rev, child_one_rev;
    int child_stats, child_walk, child_fork;
    int blocked_seen;
};
static struct hfork_res *hfork_r;
static volatile sig_atomic_t hfork_child;
static volatile pid_t hfork_pid;

static void on_usr1_fork(int sig)
{
    (void)sig;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0)
        hfork_child = 1;
    else if (pid > 0)
        hfork_pid = pid;
    errno = saved;
}

static void hfork_setup(void)
{
    hfork_child = 0;
    hfork_pid = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_usr1_fork;
    sigaction(SIGUSR1, &sa, NULL);
    fflush(NULL);
}

/* Wait for @p pid at most @p limit_s seconds: its status, or -1 (killed: it hung). */
static int wait_limited(pid_t pid, int limit_s)
{
    int st = 0;
    for (int i = 0; i < limit_s * 200; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return st;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* In the forked child, once the interrupted call returned: the later calls. */
static void hfork_child_steps(struct hfork_res *r)
{
    alarm(10);
    r->child_apply = apply_flags(0);
    r->child_one = (int)site_one();
    void *h = altpatch_dlopen(RELOAD_V1, RTLD_NOW);
    r->child_dl = h != NULL;
    r->child_rev = apply_flags(ALTPATCH_APPLY_REVERT);
    r->child_one_rev = (int)site_one();
    struct altpatch_stats st = {.sz = sizeof(st)};
    r->child_stats = altpatch_get_stats(&st);
    long n = 0;
    r->child_walk = altpatch_site_foreach(count_cb, &n);
    r->child_fork = plain_fork(); /* the gate is empty again: a fork returns (else SIGALRM) */
    fflush(NULL);
    _exit(0);
}

/* In the forking process, after the call: its own later apply, then the child's end. */
static void hfork_parent_steps(struct hfork_res *r)
{
    r->forked = hfork_pid > 0;
    r->parent_apply = apply_flags(0);
    r->parent_one = (int)site_one();
    r->child_status = hfork_pid > 0 ? wait_limited(hfork_pid, 20) : 0;
}

/* Run @p body in a child with a watchdog of @p limit_s seconds: the forking
 * process ends cleanly, forked, and applies after the fork. */
static struct hfork_res *hfork_run(body_fn body, int limit_s, const char *what)
{
    int status;
    struct hfork_res *r = run_child(sizeof(*r), body, limit_s, &status);
    assert_clean_exit(status, what);
    cr_assert(r->forked, "%s: the handler never forked", what);
    cr_assert_eq(r->parent_apply, 0, "%s: the apply after the fork", what);
    cr_assert_eq(r->parent_one, 2, "%s", what);
    return r;
}

static void hfork_assert_child(const struct hfork_res *r)
{
    assert_clean_exit(r->child_status, "the forked child");
    cr_assert_eq(r->child_apply, 0);
    cr_assert_eq(r->child_one, 2);
    cr_assert(r->child_dl, "altpatch_dlopen in the child");
    cr_assert_eq(r->child_rev, 0);
    cr_assert_eq(r->child_one_rev, 1);
    cr_assert_eq(r->child_stats, 0);
    cr_assert_eq(r->child_walk, 0);
    cr_assert_eq(r->child_fork, 0);
}

static void dlfork_body(void *out)
{
    struct hfork_res *r = hfork_r = out;
    altpatch_set_print(NULL);
    hfork_setup();
    void *h = altpatch_dlopen(ROBUST_FORKCTOR, RTLD_NOW);
    if (hfork_child) {
        r->child_loaded = h != NULL;
        hfork_child_steps(r);
    }
    r->parent_loaded = h != NULL;
    hfork_parent_steps(r);
}

Test(robust, fork_from_a_handler_inside_altpatch_dlopen, .timeout = 120)
{
    struct hfork_res *r = hfork_run(dlfork_body, 40, "the loading process");
    cr_assert(r->parent_loaded);
    cr_assert(r->child_loaded);
    hfork_assert_child(r);
}

static int raise_print(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    (void)fmt;
    (void)ap;
    if (!hfork_pid && !hfork_child)
        raise(SIGUSR1);
    return 0;
}

static void applyfork_body(void *out)
{
    struct hfork_res *r = hfork_r = out;
    hfork_setup();
    setenv("ALTPATCH_DEBUG", "1", 1);
    altpatch_set_print(raise_print);
    int rc = apply_flags(0);
    altpatch_set_print(NULL);
    unsetenv("ALTPATCH_DEBUG");
    if (hfork_child) {
        r->child_first = rc;
        hfork_child_steps(r);
    }
    r->parent_first = rc;
    hfork_parent_steps(r);
}

Test(robust, fork_from_a_handler_inside_altpatch_apply, .timeout = 120)
{
    struct hfork_res *r = hfork_run(applyfork_body, 40, "the applying process");
    cr_assert_eq(r->parent_first, 0, "the interrupted apply");
    cr_assert_eq(r->child_first, 0, "the interrupted apply in the child");
    hfork_assert_child(r);
}

/* The lock's holder: a second thread whose print callback waits until the
 * first thread waits for the lock, signals it, and returns once it forked. */
static volatile int orph_stage;
static pid_t orph_main_tid;
static pthread_t orph_main;

/* True when thread @p tid sleeps in futex() (its /proc syscall line; where
 * that is not readable, its state in /proc stat is "S", sleeping). */
static bool in_futex(pid_t tid)
{
    char path[64], line[512] = "";
    snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
    FILE *f = fopen(path, "r");
    if (f) {
        bool yes = fgets(line, sizeof(line), f) && strncmp(line, "202 ", 4) == 0;
        fclose(f);
        return yes;
    }
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
    if (!(f = fopen(path, "r")))
        return false;
    const char *close_paren = fgets(line, sizeof(line), f) ? strrchr(line, ')') : NULL;
    fclose(f);
    return close_paren && close_paren[1] == ' ' && close_paren[2] == 'S';
}

static int holder_print(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    (void)fmt;
    (void)ap;
    if ((pid_t)syscall(SYS_gettid) == orph_main_tid || orph_stage)
        return 0;
    orph_stage = 1;
    struct timespec ts = {0, 1000 * 1000};
    int i = 0;
    for (; i < 5000 && !in_futex(orph_main_tid); i++)
        nanosleep(&ts, NULL);
    hfork_r->blocked_seen = i < 5000;
    pthread_kill(orph_main, SIGUSR1);
    for (i = 0; i < 5000 && !hfork_pid; i++)
        nanosleep(&ts, NULL);
    orph_stage = 2;
    return 0;
}

static void *holder(void *p)
{
    (void)p;
    apply_flags(0);
    return NULL;
}

static void orphan_body(void *out)
{
    struct hfork_res *r = hfork_r = out;
    hfork_setup();
    orph_main = pthread_self();
    orph_main_tid = (pid_t)syscall(SYS_gettid);
    setenv("ALTPATCH_DEBUG", "1", 1);
    altpatch_set_print(holder_print);
    pthread_t t;
    if (pthread_create(&t, NULL, holder, NULL))
        _exit(2);
    while (!orph_stage)
        sched_yield();
    int rc = apply_flags(0); /* waits for the lock: the handler forks there */
    if (hfork_child) {
        altpatch_set_print(NULL);
        r->child_first = rc;
        hfork_child_steps(r);
    }
    pthread_join(t, NULL);
    altpatch_set_print(NULL);
    unsetenv("ALTPATCH_DEBUG");
    hfork_parent_steps(r);
}

Test(robust, fork_while_another_thread_holds_the_lock, .timeout = 120)
{
    struct hfork_res *r = hfork_run(orphan_body, 60, "the forking process");
    cr_assert(r->blocked_seen, "the first thread never waited for the lock");
    assert_clean_exit(r->child_status, "the forked child (it waited for a lock held by a "
                                       "thread it does not have)");
    cr_assert_eq(r->child_first, -EOWNERDEAD);
    cr_assert_eq(r->child_apply, -EOWNERDEAD);
    cr_assert(r->child_dl, "altpatch_dlopen loads (unpatched) in the child");
    cr_assert_eq(r->child_rev, -EOWNERDEAD);
    cr_assert_eq(r->child_stats, -EOWNERDEAD);
    cr_assert_eq(r->child_walk, -EOWNERDEAD);
    cr_assert_eq(r->child_fork, 0);
}

/* ---- a fork from a handler at every instruction of an entry point ------------- */

/*
 * The trap flag stops the thread after every instruction of a call; at each
 * one inside this executable (the library is linked in), the SIGTRAP handler
 * forks and waits for the child. The child's copy of the call returns, then
 * the child checks that the library is whole: get_stats answers (no false
 * -EOWNERDEAD), a plain fork returns (no gate count that never drops to zero),
 * altpatch_dlopen and a second fork work. The forking process ends cleanly
 * too (no fork that waits for its own thread).
 *
 * A fork and its child's checks cost a few milliseconds. The first STEP_FORK_ALL
 * steps each fork; after them, a step forks only at an instruction that has
 * not run before, so that a long loop (the site walk visits every site of
 * every module) forks once per instruction of its body instead of once per
 * iteration.
 */
#define STEP_FORK_ALL 2500
#define STEP_SEEN_SLOTS 16384 /* a power of two, above any entry point's distinct instructions */
struct step_res {
    int steps, inside, forks, distinct, bad, first_bad_step, first_bad_status;
    int parent_rc, parent_fork;
};
static uintptr_t step_seen[STEP_SEEN_SLOTS];

/* Remember @p ip; true if it had run before (or the table is full). */
static bool step_seen_before(uintptr_t ip, int *distinct)
{
    return ap_step_seen_before(step_seen, STEP_SEEN_SLOTS, ip, distinct);
}
enum step_op { STEP_DLOPEN, STEP_APPLY, STEP_STATS, STEP_WALK };
static struct step_res *step_r;
static volatile sig_atomic_t step_on, step_child, step_calls;
static volatile enum step_op step_which;
/* the entry point's first instruction and the address it returns to: the
 * steps between the two are the entry point's own (and its callees') */
static volatile uintptr_t step_entry, step_ret;
extern const char __executable_start[], etext[];


static void on_trap(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    uintptr_t ip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (!step_on) {
        ap_step_stop(uc);
        return;
    }
    if (ip < (uintptr_t)__executable_start || ip >= (uintptr_t)etext)
        return; /* libc, the loader: not the library's own instructions */
    int saved = errno;
    if (ip == step_entry && !step_ret)
        step_ret = *(const uintptr_t *)uc->uc_mcontext.gregs[REG_RSP];
    else if (step_ret && ip == step_ret)
        step_ret = 0;
    step_r->inside += step_ret != 0;
    int n = ++step_r->steps;
    if (step_calls) {
        /* the entry points from the handler: an answer, never a wait for
         * this thread (ALTPATCH_OFF: each call is its entry, lock and exit) */
        struct altpatch_stats hs = {.sz = sizeof(hs)};
        long cnt = 0;
        int a = altpatch_apply(), g = altpatch_get_stats(&hs);
        int w = altpatch_site_foreach(count_cb, &cnt);
        if ((a && a != -EDEADLK) || (g && g != -EDEADLK) ||
            (w && w != -EDEADLK && w != -ENODATA)) {
            step_r->bad++;
            step_r->first_bad_step = n;
            step_r->first_bad_status = a ? a : g ? g : w;
            step_on = 0;
        }
        errno = saved;
        return;
    }
    if (step_seen_before(ip, &step_r->distinct) && n > STEP_FORK_ALL) {
        errno = saved;
        return;
    }
    step_r->forks++;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5); /* a child that hangs is killed by SIGALRM */
        step_child = 1;
        step_on = 0;
        ap_step_stop(uc);
        errno = saved;
        return;
    }
    int st = -1;
    if (pid > 0 && waitpid(pid, &st, 0) != pid) /* the child has its alarm */
        st = -1;
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        step_r->bad++;
        step_r->first_bad_step = n;
        step_r->first_bad_status = st;
        step_on = 0; /* one is enough */
    }
    errno = saved;
}

static int step_call(void)
{
    struct altpatch_stats st = {.sz = sizeof(st)};
    long n = 0;
    switch (step_which) {
    case STEP_DLOPEN:
        return altpatch_dlopen(RELOAD_V1, RTLD_NOW) ? 0 : -1;
    case STEP_APPLY:
        return altpatch_apply();
    case STEP_STATS:
        return altpatch_get_stats(&st);
    case STEP_WALK: {
        int rc = altpatch_site_foreach(count_cb, &n);
        return rc == -ENODATA ? 0 : rc;
    }
    }
    return -1;
}

/* In a child forked at one instruction: exit status 0 when the library is whole. */
static int step_child_checks(int rc)
{
    if (rc != 0)
        return 10;
    struct altpatch_stats st = {.sz = sizeof(st)};
    if (altpatch_get_stats(&st) != 0)
        return 11;
    if (plain_fork())
        return 12;
    return 0;
}

static void step_body(void *out)
{
    step_r = out;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, NULL);
    setenv("ALTPATCH_OFF", "1", 1); /* the entry points' own steps, not a whole apply */
    altpatch_set_print(NULL);
    if (!dlopen(RELOAD_V1, RTLD_NOW)) /* loaded: altpatch_dlopen of it stays short */
        _exit(3);
    struct altpatch_stats st0 = {.sz = sizeof(st0)};
    altpatch_get_stats(&st0);
    fflush(NULL);
    step_on = 1;
    ap_step_on();
    int rc = step_call();
    step_on = 0; /* the next trap clears the flag */
    if (step_child)
        _exit(step_child_checks(rc));
    step_r->parent_rc = rc;
    step_r->parent_fork = plain_fork();
}

/* A sanitizer's shadow memory makes each fork() cost milliseconds: a fork at
 * every instruction of an entry point outlasts the run's limit there. The
 * plain and clang builds run these tests. */
static void step_run(enum step_op op, const char *what)
{
    if (AP_SANITIZED)
        cr_skip_test("a fork per instruction is too slow under a sanitizer");
    const uintptr_t entries[] = {
        [STEP_DLOPEN] = (uintptr_t)altpatch_dlopen,
        [STEP_APPLY] = (uintptr_t)altpatch_apply,
        [STEP_STATS] = (uintptr_t)altpatch_get_stats,
        [STEP_WALK] = (uintptr_t)altpatch_site_foreach,
    };
    step_which = op;
    step_entry = entries[op];
    int status;
    struct step_res *r = run_child(sizeof(*r), step_body, 100, &status);
    assert_clean_exit(status, what);
    cr_assert_gt(r->inside, 20, "%s: %d steps inside it (%d in all)", what, r->inside, r->steps);
    if (!step_calls) {
        cr_assert_lt(r->distinct, STEP_SEEN_SLOTS, "%s: the table of instructions seen filled up",
                     what);
        cr_assert_geq(r->forks, r->distinct, "%s: a fork at each of its %d instructions",
                      what, r->distinct);
        cr_assert_geq(r->forks, r->steps < STEP_FORK_ALL ? r->steps : STEP_FORK_ALL,
                      "%s: a fork at each of its first steps", what);
    }
    cr_assert_eq(r->parent_rc, 0, "%s", what);
    cr_assert_eq(r->parent_fork, 0, "%s: a fork after it", what);
    cr_assert_eq(r->bad, 0,
                 "%s: the child forked at step %d is broken (wait status %#x)",
                 what, r->first_bad_step, (unsigned)r->first_bad_status);
    cr_log_info("%s: %d steps, %d inside, %d distinct, %d forks", what, r->steps, r->inside,
                r->distinct, r->forks);
}

Test(robust, fork_at_every_instruction_of_altpatch_dlopen, .timeout = 200)
{
    step_run(STEP_DLOPEN, "altpatch_dlopen");
}

Test(robust, fork_at_every_instruction_of_altpatch_apply, .timeout = 200)
{
    step_run(STEP_APPLY, "altpatch_apply");
}

Test(robust, fork_at_every_instruction_of_altpatch_get_stats, .timeout = 200)
{
    step_run(STEP_STATS, "altpatch_get_stats");
}

Test(robust, fork_at_every_instruction_of_altpatch_site_foreach, .timeout = 200)
{
    step_run(STEP_WALK, "altpatch_site_foreach");
}

/* A handler that calls the library at every instruction of an entry point
 * that holds its lock without being "in" an apply (altpatch_get_stats()), or
 * of altpatch_apply(): each call answers (0, -EDEADLK), none waits forever. */
Test(robust, calls_from_a_handler_at_every_instruction_of_altpatch_get_stats, .timeout = 200)
{
    step_calls = 1;
    step_run(STEP_STATS, "altpatch_get_stats, calls from the handler");
}

Test(robust, calls_from_a_handler_at_every_instruction_of_altpatch_apply, .timeout = 200)
{
    step_calls = 1;
    step_run(STEP_APPLY, "altpatch_apply, calls from the handler");
}

/* ---- the entry points from a signal handler that interrupted one ---------------- */

struct sig_res {
    volatile long handled;
    long apply_ok, apply_deadlk, apply_other;
    long stats_ok, stats_deadlk, stats_other;
    long walk_ok, walk_deadlk, walk_other;
    long dl_null_deadlk, dl_other;
    int loops, one, pair, one_rev, pair_rev;
};

static struct sig_res *sig_r;

static void on_alarm(int sig)
{
    (void)sig;
    int saved = errno;
    struct sig_res *r = sig_r;
    r->handled++;
    int rc = apply_flags(r->handled % 2 ? ALTPATCH_APPLY_REVERT : 0);
    bool reentered = rc == -EDEADLK;
    r->apply_ok += rc == 0;
    r->apply_deadlk += rc == -EDEADLK;
    r->apply_other += rc != 0 && rc != -EDEADLK;
    struct altpatch_stats st = {.sz = sizeof(st)};
    rc = altpatch_get_stats(&st);
    r->stats_ok += rc == 0;
    r->stats_deadlk += rc == -EDEADLK;
    r->stats_other += rc != 0 && rc != -EDEADLK;
    long n = 0;
    rc = altpatch_site_foreach(count_cb, &n);
    r->walk_ok += rc == 0;
    r->walk_deadlk += rc == -EDEADLK;
    r->walk_other += rc != 0 && rc != -EDEADLK;
    if (reentered) {
        /* this handler interrupted an entry point: altpatch_dlopen refuses too */
        errno = 0;
        void *h = altpatch_dlopen(NULL, RTLD_NOW);
        r->dl_null_deadlk += !h && errno == EDEADLK;
        r->dl_other += h != NULL;
    }
    errno = saved;
}

static void sig_body(void *out)
{
    struct sig_res *r = sig_r = out;
    altpatch_set_print(NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    /* A handler that lands outside an apply runs a whole one: the period
     * leaves the loop time to progress. Until 200 signals or 3 s. */
    struct itimerval it = {{0, 300}, {0, 300}};
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    setitimer(ITIMER_REAL, &it, NULL);
    for (r->loops = 0; r->handled < 200; r->loops++) {
        apply_flags(r->loops % 2 ? ALTPATCH_APPLY_REVERT : 0);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec >= 3)
            break;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    /* the program and the library are still whole */
    apply_flags(0);
    r->one = (int)site_one();
    r->pair = (int)site_pair();
    apply_flags(ALTPATCH_APPLY_REVERT);
    r->one_rev = (int)site_one();
    r->pair_rev = (int)site_pair();
}

Test(robust, entry_points_from_a_handler_that_interrupted_one, .timeout = 120)
{
    int status;
    struct sig_res *r = run_child(sizeof(*r), sig_body, 100, &status);
    assert_clean_exit(status, "signal child");
    cr_assert_gt(r->loops, 0);
    cr_assert_gt(r->handled, 20, "%ld signals in %d applies", r->handled, r->loops);
    cr_assert_gt(r->apply_deadlk, 0, "no signal interrupted an apply (%ld handled)", r->handled);
    cr_assert_eq(r->apply_other, 0);
    cr_assert_eq(r->stats_other, 0);
    cr_assert_eq(r->walk_other, 0);
    cr_assert_eq(r->dl_other, 0, "altpatch_dlopen re-entered loaded anyway");
    cr_assert_eq(r->dl_null_deadlk, r->apply_deadlk);
    cr_assert_eq(r->one, 2);
    cr_assert_eq(r->pair, 22);
    cr_assert_eq(r->one_rev, 1);
    cr_assert_eq(r->pair_rev, 11);
}

/* altpatch_dlopen from a print callback: refused with EDEADLK, nothing loaded. */
struct cbdl_res {
    int calls, null_deadlk, loaded;
};
static struct cbdl_res *cbdl_r;

static int dl_print(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    (void)fmt;
    (void)ap;
    cbdl_r->calls++;
    errno = 0;
    void *h = altpatch_dlopen(NULL, RTLD_NOW);
    if (h) {
        cbdl_r->loaded++;
        dlclose(h);
    } else if (errno == EDEADLK) {
        cbdl_r->null_deadlk++;
    }
    return 0;
}

static void cbdl_body(void *out)
{
    cbdl_r = out;
    altpatch_set_print(dl_print);
    setenv("ALTPATCH_DEBUG", "1", 1);
    apply_flags(0);
    altpatch_set_print(NULL);
}

Test(robust, altpatch_dlopen_from_a_callback_is_refused)
{
    int status;
    struct cbdl_res *r = run_child(sizeof(*r), cbdl_body, 60, &status);
    assert_clean_exit(status, "callback child");
    cr_assert_gt(r->calls, 0);
    cr_assert_eq(r->loaded, 0);
    cr_assert_eq(r->null_deadlk, r->calls);
}

/* ---- RX refused after RW ----------------------------------------------------- */

/* seccomp: mprotect/pkey_mprotect asking for PROT_EXEC fail with EACCES (what an
 * SELinux execmod denial does to a modified text page); everything else passes. */
static int install_no_exec_gain_filter(void)
{
    struct sock_filter f[] = {
        AP_SECCOMP_PROLOGUE,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pkey_mprotect, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, AP_SECCOMP_ARG2_LO),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EACCES & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return AP_SECCOMP_INSTALL(f);
}

/* The protection /proc/self/maps shows for @p addr ("r-xp"), into @p out. */
static void maps_perms(uintptr_t addr, char out[5])
{
    strcpy(out, "????");
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        unsigned long s, e;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &s, &e, perms) == 3 && addr >= s && addr < e) {
            memcpy(out, perms, 5);
            break;
        }
    }
    fclose(f);
}

struct rx_res {
    int set, control;
    int rc, one, pair;
    struct altpatch_stats st;
    char perms[5], perms_nomem[5];
    int rc_revert, one_rev;
    int rc_nomem, one_nomem;
    struct altpatch_stats st_nomem;
};

static void rx_body(void *out)
{
    struct rx_res *r = out;
    altpatch_set_print(NULL);
    r->set = install_no_exec_gain_filter();
    if (r->set)
        return;
    /* the filter does what it says */
    void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r->control = mprotect(p, 4096, PROT_READ | PROT_EXEC) == -1 && errno == EACCES &&
                 mprotect(p, 4096, PROT_READ | PROT_WRITE) == 0;
    munmap(p, 4096);
    r->rc = apply_flags(0);
    r->st.sz = sizeof(r->st);
    altpatch_get_stats(&r->st);
    maps_perms((uintptr_t)site_one, r->perms);
    r->one = (int)site_one(); /* a stranded page: SIGSEGV here */
    r->pair = (int)site_pair();
    r->rc_revert = apply_flags(ALTPATCH_APPLY_REVERT);
    r->one_rev = (int)site_one();
    /* /proc/self/mem forbidden: nothing may be written, the text stays executable */
    r->rc_nomem = apply_flags(ALTPATCH_APPLY_NO_PROCMEM);
    r->st_nomem.sz = sizeof(r->st_nomem);
    altpatch_get_stats(&r->st_nomem);
    maps_perms((uintptr_t)site_one, r->perms_nomem);
    r->one_nomem = (int)site_one();
}

Test(robust, rx_refused_after_rw_never_strands_text, .timeout = 120)
{
    int status;
    struct rx_res *r = run_child(sizeof(*r), rx_body, 60, &status);
    assert_clean_exit(status, "RX-refusing child");
    ap_seccomp_require(r->set);
    cr_assert(r->control, "the filter must refuse PROT_EXEC and allow RW");
    cr_assert_eq(r->rc, 0);
    cr_assert_str_eq(r->perms, "r-xp", "text left %s", r->perms);
    cr_assert_eq(r->st.mprotect_windows, 0, "no window may open when RX may be refused");
    if (!ap_procmem_can_write_text()) {
        /* the kernel refuses /proc/self/mem writes to text: refused, nothing written */
        cr_assert_eq(r->one, 1);
        cr_assert_eq(r->pair, 11);
        cr_assert_eq(r->st.procmem_writes, 0);
        cr_assert_gt(r->st.sites_refused, 0);
        cr_assert_eq(r->st.bytes_written, 0);
    } else {
        cr_assert_eq(r->one, 2);
        cr_assert_eq(r->pair, 22);
        cr_assert_gt(r->st.procmem_writes, 0);
    }
    cr_assert_eq(r->rc_revert, 0);
    cr_assert_eq(r->one_rev, 1);
    cr_assert_eq(r->rc_nomem, 0);
    cr_assert_str_eq(r->perms_nomem, "r-xp", "text left %s", r->perms_nomem);
    cr_assert_eq(r->one_nomem, 1, "nothing written without /proc/self/mem");
    cr_assert_gt(r->st_nomem.sites_refused, 0);
    cr_assert_eq(r->st_nomem.bytes_written, 0);
    cr_assert_eq(r->st_nomem.mprotect_windows, 0);
}

/* ---- a plugin rebuilt and reloaded at the same address ---------------------------- */

struct reload_res {
    char msg[256];
    long v[4];
    uintptr_t base[4];
    int state[4], reason[4];
};

struct site_find {
    uintptr_t lo, hi;
    int state, reason, found;
};

static int find_in(const struct altpatch_site_info *s, void *p)
{
    struct site_find *f = p;
    if (s->addr >= f->lo && s->addr < f->hi) {
        f->state = s->state;
        f->reason = s->reason;
        f->found++;
    }
    return 0;
}

static void reload_body(void *out)
{
    struct reload_res *r = out;
    altpatch_set_print(NULL);
    char dir[] = "/tmp/altpatch-reload-XXXXXX";
    if (!mkdtemp(dir)) {
        snprintf(r->msg, sizeof(r->msg), "mkdtemp failed");
        return;
    }
    char path[512];
    snprintf(path, sizeof(path), "%s/libplugin.so", dir);
    static const char *const versions[4] = {RELOAD_V1, RELOAD_V2, RELOAD_V3, RELOAD_V4};
    apply_flags(0);
    for (int i = 0; i < 4; i++) {
        if (ap_copy_file(versions[i], path)) {
            snprintf(r->msg, sizeof(r->msg), "copy %s failed", versions[i]);
            break;
        }
        void *h = altpatch_dlopen(path, RTLD_NOW);
        if (!h) {
            snprintf(r->msg, sizeof(r->msg), "dlopen: %s", dlerror());
            break;
        }
        long (*fn)(void) = (long (*)(void))dlsym(h, "reload_value");
        Dl_info di;
        if (!fn || !dladdr((void *)fn, &di)) {
            snprintf(r->msg, sizeof(r->msg), "dlsym failed");
            break;
        }
        r->base[i] = (uintptr_t)di.dli_fbase;
        r->v[i] = fn();
        struct site_find f = {(uintptr_t)fn, (uintptr_t)fn + 64, -1, -1, 0};
        altpatch_site_foreach(find_in, &f);
        r->state[i] = f.state;
        r->reason[i] = f.reason;
        dlclose(h);
    }
    unlink(path);
    rmdir(dir);
}

Test(robust, reloaded_plugin_is_planned_from_its_own_bytes, .timeout = 60)
{
    int status;
    struct reload_res *r = run_child(sizeof(*r), reload_body, 50, &status);
    assert_clean_exit(status, "reload child");
    cr_assert_eq(r->msg[0], '\0', "%s", r->msg);
    cr_assert_eq(r->base[1], r->base[0], "the loader did not reuse the address: nothing tested");
    cr_assert_eq(r->base[2], r->base[0], "the loader did not reuse the address: nothing tested");
    cr_assert_eq(r->base[3], r->base[0], "the loader did not reuse the address: nothing tested");
    cr_assert_eq(r->v[0], 2, "v1 patched");
    cr_assert_eq(r->v[1], 3, "v2 (new replacement) must run its own replacement, got %ld",
                 r->v[1]);
    cr_assert_eq(r->v[2], 3, "v3 (new original) must be patched, got %ld", r->v[2]);
    cr_assert_eq(r->v[3], 7, "v4 (only its table differs: never applies) must keep its original, "
                 "got %ld", r->v[3]);
    cr_assert_eq(r->state[3], ALTPATCH_SITE_ORIGINAL, "v4: state %d, %s", r->state[3],
                 altpatch_strreason(r->reason[3]));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(r->state[i], ALTPATCH_SITE_PATCHED, "version %d: state %d, %s", i + 1,
                     r->state[i], altpatch_strreason(r->reason[i]));
    }
}

/* ---- one WARN line per site and reason ------------------------------------------ */

struct warn_res {
    int rc_bad;
    long v;
    int lines, sites, max_per_site;
    int callin_lines;
};

static void warn_body(void *out)
{
    struct warn_res *r = out;
    ap_warn_log[0] = '\0';
    altpatch_set_print(ap_warn_capture);
    for (int i = 0; i < 100; i++)
        r->rc_bad += apply_flags(ALTPATCH_APPLY_LIVE | (i % 2 ? ALTPATCH_APPLY_REVERT : 0)) != 0;
    altpatch_set_print(NULL);
    r->v = site_callin();
    /* count lines per site address "(0x...)" for the call-inside reason */
    const char *why = altpatch_strreason(ALTPATCH_REASON_LIVE_CALL_INSIDE);
    unsigned long addrs[64];
    int counts[64] = {0};
    int n = 0;
    for (const char *line = ap_warn_log; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char one[512];
        snprintf(one, sizeof(one), "%.*s", (int)len, line);
        line = end ? end + 1 : NULL;
        if (!strstr(one, why))
            continue;
        r->lines++;
        const char *p = strstr(one, "(0x");
        unsigned long a = p ? strtoul(p + 1, NULL, 16) : 0;
        if (a >= (uintptr_t)site_callin && a < (uintptr_t)site_callin + 64)
            r->callin_lines++;
        int k = 0;
        while (k < n && addrs[k] != a)
            k++;
        if (k == n && n < 64)
            addrs[n++] = a;
        if (k < 64 && ++counts[k] > r->max_per_site)
            r->max_per_site = counts[k];
    }
    r->sites = n;
}

Test(robust, a_refused_site_warns_once_per_reason)
{
    if (!ap_procmem_can_write_text()) /* the applies are live */
        cr_skip_test("live patching: " AP_PROCMEM_DENIED);
    int status;
    struct warn_res *r = run_child(sizeof(*r), warn_body, 60, &status);
    assert_clean_exit(status, "warn child");
    cr_assert_eq(r->rc_bad, 0);
    cr_assert_eq(r->v, 5, "the call-inside site stays original under live applies");
    cr_assert_eq(r->callin_lines, 1, "%d WARN lines for one site and one reason",
                 r->callin_lines);
    cr_assert_eq(r->max_per_site, 1, "%d lines for %d sites", r->lines, r->sites);
}
