/*
 * pthread_cancel() of a thread inside the library: the entry points are not
 * cancellation points, so a thread cancelled while it loops on them leaves
 * no lock behind, and later calls and fork() go on. The loops leave to
 * chance where a cancellation lands; the "pending" cases make it land inside
 * the library: a callback cancels its own thread and then reaches a
 * cancellation point, and the call must return normally, the cancellation
 * acting at the thread's next cancellation point after it.
 *
 * Each scenario runs in a child process under a watchdog (alarm): a lock
 * left held would hang it, and SIGALRM ends it with a status the test reads.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <altpatch/altpatch.h>
#include <altpatch/primitives.h>

static int devnull = -1;
static volatile long printed;

/* Every line the library prints (ALTPATCH_DEBUG: one per apply at least)
 * reaches write(), a cancellation point, while the library holds its lock. */
static int print_to_null(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    char line[256];
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    if (n > 0 && write(devnull, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1) > 0)
        printed = printed + 1;
    return 0;
}

enum { WHAT_APPLY, WHAT_FOREACH, WHAT_DLOPEN };

static volatile long listed;

/* The program's sites (altpatch_fs_self() below gives it some) are listed
 * under the library's lock; write() is a cancellation point. */
static int count_site(const struct altpatch_site_info *info, void *ctx)
{
    (void)info;
    (void)ctx;
    if (write(devnull, "s", 1) == 1)
        listed = listed + 1;
    return 0;
}

static void *loop(void *arg)
{
    int what = (int)(long)arg;
    for (;;) {
        if (what == WHAT_APPLY)
            (void)altpatch_apply();
        else if (what == WHAT_FOREACH)
            (void)altpatch_site_foreach(count_site, NULL);
        else {
            void *h = altpatch_dlopen(NULL, RTLD_NOW);
            if (h)
                dlclose(h);
        }
        pthread_testcancel(); /* where the cancellation is taken */
    }
    return NULL;
}

/* A scenario's start in its child: the watchdog, a debug line per apply,
 * a first apply. 0, else a step's code. */
static int scenario_start(void)
{
    alarm(10);
    devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (devnull < 0)
        return 10;
    setenv("ALTPATCH_DEBUG", "1", 1);
    altpatch_set_print(print_to_null);
    if (altpatch_apply() != 0 || !altpatch_fs_self())
        return 11;
    return 0;
}

/* After a cancelled thread: this thread applies, and forks a child that
 * applies. 0 when all of it returns (a lock left held: the watchdog). */
static int apply_and_fork(void)
{
    if (altpatch_apply() != 0)
        return 14;
    pid_t c = fork();
    if (c < 0)
        return 15;
    if (c == 0)
        _exit(altpatch_apply() == 0 ? 0 : 1);
    int st = 0;
    if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return 16;
    return 0;
}

/* In a child: a thread loops on @what, is cancelled and joined; then this
 * thread applies and forks. 0 when all of it returns. */
static int scenario(int what)
{
    int r = scenario_start();
    if (r)
        return r;
    for (int round = 0; round < 20; round++) {
        pthread_t t;
        if (pthread_create(&t, NULL, loop, (void *)(long)what))
            return 12;
        struct timespec d = {0, (1 + round % 5) * 1000000L};
        nanosleep(&d, NULL);
        if (pthread_cancel(t) || pthread_join(t, NULL))
            return 13;
        if ((r = apply_and_fork()) != 0)
            return r;
    }
    if (what == WHAT_FOREACH && !listed)
        return 18; /* no site listed: nothing was tested */
    return printed > 0 ? 0 : 17;
}

/* A cancellation made pending inside the library, by the callback itself,
 * which then reaches cancellation points (write(), pthread_testcancel()). */
static volatile int pend_passed, pend_returned, pend_after;
static volatile int pend_rc = -1;

static void cancel_self_then_points(void)
{
    if (pend_passed)
        return;
    pthread_cancel(pthread_self());
    if (write(devnull, "c", 1) != 1)
        pend_passed = -1;
    pthread_testcancel();
    if (!pend_passed)
        pend_passed = 1; /* both points passed: cancellation is off here */
}

static int pend_site(const struct altpatch_site_info *info, void *ctx)
{
    (void)info;
    (void)ctx;
    cancel_self_then_points();
    return 0;
}

static int pend_print(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level, (void)fmt, (void)ap;
    cancel_self_then_points();
    return 0;
}

static void *pend_thread(void *arg)
{
    if ((int)(long)arg == WHAT_FOREACH) {
        pend_rc = altpatch_site_foreach(pend_site, NULL);
    } else {
        altpatch_set_print(pend_print); /* ALTPATCH_DEBUG: apply prints under its lock */
        pend_rc = altpatch_apply();
        altpatch_set_print(print_to_null);
    }
    pend_returned = 1;
    pthread_testcancel(); /* the pending cancellation acts here */
    pend_after = 1;
    return NULL;
}

/* In a child: a thread whose callback cancels it inside @what; joined, then
 * this thread applies and forks. 0 when all of it returns as it should. */
static int pending_scenario(int what)
{
    int r = scenario_start();
    if (r)
        return r;
    pthread_t t;
    void *res = NULL;
    if (pthread_create(&t, NULL, pend_thread, (void *)(long)what))
        return 12;
    if (pthread_join(t, &res))
        return 13;
    if (pend_passed != 1)
        return 20; /* the callback never ran, or was cancelled inside */
    if (!pend_returned)
        return 21; /* cancelled inside the library */
    if (pend_rc != 0)
        return 22;
    if (res != PTHREAD_CANCELED || pend_after)
        return 23; /* the cancellation was lost */
    return apply_and_fork();
}

static void run_body(int (*body)(int), int what)
{
    pid_t c = fork();
    cr_assert(c >= 0);
    if (c == 0)
        _exit(body(what));
    int st = 0;
    cr_assert_eq(waitpid(c, &st, 0), c);
    cr_assert(!WIFSIGNALED(st), "the child was killed by signal %d (SIGALRM: a lock left held "
                                "by a cancelled thread)", WTERMSIG(st));
    cr_assert_eq(WEXITSTATUS(st), 0, "the child's step %d failed", WEXITSTATUS(st));
}

static void run(int what)
{
    run_body(scenario, what);
}

Test(cancel, thread_cancelled_in_apply_leaves_no_lock, .timeout = 60)
{
    run(WHAT_APPLY);
}

Test(cancel, thread_cancelled_in_site_foreach_leaves_no_lock, .timeout = 60)
{
    run(WHAT_FOREACH);
}

Test(cancel, thread_cancelled_in_dlopen_leaves_no_gate, .timeout = 60)
{
    run(WHAT_DLOPEN);
}

Test(cancel, cancel_pending_in_a_site_callback_acts_after_the_call, .timeout = 30)
{
    run_body(pending_scenario, WHAT_FOREACH);
}

Test(cancel, cancel_pending_in_a_print_callback_acts_after_the_apply, .timeout = 30)
{
    run_body(pending_scenario, WHAT_APPLY);
}
