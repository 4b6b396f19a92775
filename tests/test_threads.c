/* SPDX-License-Identifier: MIT */
/*
 * Who else runs in this address space (writer.c): ap_mm_alone(), the
 * kernel's answer through unshare(CLONE_VM), against ap_count_threads()
 * (/proc/self/task) and against what each test started itself. A seccomp
 * filter makes ap_mm_alone() say "no proof" (false) without asking: the
 * expectations that need a yes hold only where no filter is active.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ap_isolate.h"
#include "host.h"

struct alone_result {
    int alone_first, threads_first;
    int alone_with, threads_with;
    int alone_after, threads_after;
    int filtered;
};

static int wait_pipe[2];

static void *sleeper(void *arg)
{
    (void)arg;
    char c;
    while (read(wait_pipe[0], &c, 1) < 0)
        ;
    return NULL;
}

static int vm_sharer(void *arg)
{
    (void)arg;
    char c;
    while (read(wait_pipe[0], &c, 1) < 0)
        ;
    return 0;
}

/*
 * A joined thread is gone from the kernel's thread group a moment after
 * pthread_join() returns (the join wakes when the thread's memory is
 * released, before the task is unhashed): wait until the kernel says so,
 * up to a second.
 */
static int alone_eventually(void)
{
    for (int i = 0; i < 1000; i++) {
        if (ap_mm_alone() && ap_count_threads() == 1)
            return 1;
        usleep(1000);
    }
    return 0;
}

Test(threads, one_more_thread_is_never_alone)
{
    /* whatever threads the test harness runs, one of ours is seen */
    if (pipe(wait_pipe))
        cr_assert_fail("pipe");
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, sleeper, NULL), 0);
    cr_expect_not(ap_mm_alone());
    cr_expect_geq(ap_count_threads(), 2);
    cr_assert_eq(write(wait_pipe[1], "x", 1), 1);
    cr_assert_eq(pthread_join(t, NULL), 0);
}

static void with_thread(void *out, void *ctx)
{
    (void)ctx;
    struct alone_result *r = out;
    r->filtered = prctl(PR_GET_SECCOMP, 0L, 0L, 0L, 0L) != 0;
    r->alone_first = ap_mm_alone();
    r->threads_first = (int)ap_count_threads();
    if (pipe(wait_pipe))
        _exit(2);
    pthread_t t;
    if (pthread_create(&t, NULL, sleeper, NULL))
        _exit(3);
    r->alone_with = ap_mm_alone();
    r->threads_with = (int)ap_count_threads();
    if (write(wait_pipe[1], "x", 1) != 1 || pthread_join(t, NULL))
        _exit(4);
    r->alone_after = r->filtered ? 0 : alone_eventually();
    r->threads_after = (int)ap_count_threads();
}

Test(threads, a_thread_is_seen)
{
    struct alone_result *r = ap_isolated(sizeof(*r), with_thread, NULL);
    cr_expect_eq(r->threads_first, 1);
    cr_expect_eq(r->threads_with, 2);
    cr_expect_not(r->alone_with, "another thread runs");
    if (!r->filtered) {
        cr_expect(r->alone_first, "a fork()ed child runs alone");
        cr_expect(r->alone_after, "alone again once the thread is joined");
    }
}

static void with_vm_sharer(void *out, void *ctx)
{
    (void)ctx;
    struct alone_result *r = out;
    r->filtered = prctl(PR_GET_SECCOMP, 0L, 0L, 0L, 0L) != 0;
    r->alone_first = ap_mm_alone();
    if (pipe(wait_pipe))
        _exit(2);
    size_t sz = 64 * 1024;
    char *stack = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack == MAP_FAILED)
        _exit(3);
    /* a process that shares the memory without being a thread of this one */
    pid_t pid = clone(vm_sharer, stack + sz, CLONE_VM | SIGCHLD, NULL);
    if (pid < 0)
        _exit(4);
    r->alone_with = ap_mm_alone();
    r->threads_with = (int)ap_count_threads();
    int st;
    if (write(wait_pipe[1], "x", 1) != 1 || waitpid(pid, &st, 0) != pid)
        _exit(5);
    r->alone_after = ap_mm_alone();
    r->threads_after = (int)ap_count_threads();
}

Test(threads, a_process_sharing_the_memory_is_seen)
{
    struct alone_result *r = ap_isolated(sizeof(*r), with_vm_sharer, NULL);
    cr_expect_eq(r->threads_with, 1, "/proc/self/task does not list it");
    cr_expect_not(r->alone_with, "the kernel does");
    cr_expect_eq(r->threads_after, 1);
    if (!r->filtered) {
        cr_expect(r->alone_first);
        cr_expect(r->alone_after);
    }
}

/* ---- fork while another thread passes the pins' gate ------------------------- */

static volatile int gate_stop;

static int gate_site_cb(const struct altpatch_site_info *site, void *ctx)
{
    (void)site;
    (void)ctx;
    return 0;
}

static void *gate_walker(void *arg)
{
    long *walks = arg;
    while (!gate_stop) { /* each walk takes and releases the pins: two passes of the gate */
        altpatch_site_foreach(gate_site_cb, NULL);
        (*walks)++;
    }
    return NULL;
}

/*
 * fork() waits in its prepare handler until no thread is between entering and
 * leaving the gate; the last thread to leave wakes it. Forks racing walks
 * that pass the gate all complete (a missed wake-up would hang a fork: the
 * test's timeout), and every child runs.
 */
Test(threads, fork_racing_the_gate_completes, .timeout = 60)
{
    long walks = 0;
    pthread_t t;
    int expect = altpatch_site_foreach(gate_site_cb, NULL); /* what a walk answers here */
    gate_stop = 0;
    cr_assert_eq(pthread_create(&t, NULL, gate_walker, &walks), 0);
    int children = 0;
    for (int i = 0; i < 300; i++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0)
            _exit(altpatch_site_foreach(gate_site_cb, NULL) == expect ? 0 : 1);
        int st = 0;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        children += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    gate_stop = 1;
    pthread_join(t, NULL);
    cr_assert_eq(children, 300);
    cr_assert_gt(walks, 0);
}
