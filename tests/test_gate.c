/* SPDX-License-Identifier: MIT */
/*
 * The gate the loader phases pass (apply.c: ap_gate_enter/ap_gate_leave): a
 * fork waits until no thread is inside one, and a child must not inherit
 * the passages of threads it does not have. Here a thread forks from a
 * SIGTRAP handler at every instruction of one of its own passages (the trap
 * flag) while another thread of the forking process is parked inside the
 * gate: the child has only the forking thread, so once that thread has left
 * the gate a fork in the child returns; and where a thread created in the
 * child is inside the gate, a fork there waits until it leaves.
 *
 * White-box (the gate's internal calls); every body runs in a fork()ed child
 * with a watchdog, each forked child with an alarm: a fork that waits for a
 * thread that does not exist ends in SIGALRM.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <altpatch/altpatch.h>
#include "ap_step.h"

#include "ap_isolate.h"
#include "apply.h"

struct gate_res {
    int steps, bad, first_bad_step, first_bad_status;
    int parent_fork;
    int held_seen; /* mode 2: some step found the gate's lock held */
};

static struct gate_res *gate_r;
static volatile sig_atomic_t step_on, step_child;
static int gate_mode; /* 0: the child forks; 1: with a thread of its own inside the gate;
                       * 2: the stepped call is the passage's leave, the child forks next */
static int leave_held_seen; /* mode 2: a step found the gate's lock held by this thread */

static int no_site(const struct altpatch_site_info *s, void *ctx)
{
    (void)s;
    (void)ctx;
    return 0;
}

/* Mode 2: whether a fork at this step cannot wait for the thread parked
 * inside the gate: this thread is still in its passage (before the leave's
 * lock, or holding it: a public call answers -EDEADLK then), not after the
 * leave's unlock (its fork would wait for the parked thread to leave). */
static bool leave_step_forks(void)
{
    bool held = altpatch_site_foreach(no_site, NULL) == -EDEADLK;
    if (held) {
        leave_held_seen = 1;
        gate_r->held_seen = 1;
    }
    return held || !leave_held_seen;
}
extern const char __executable_start[], etext[];

/* A plain fork whose child exits at once: 0 when it returned and was reaped. */
static int plain_fork(void)
{
    pid_t c = fork();
    if (c == 0)
        _exit(0);
    int st;
    return c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}


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
        return; /* libc: not the gate's own instructions */
    int saved = errno;
    if (gate_mode == 2 && !leave_step_forks()) {
        errno = saved;
        return;
    }
    int n = ++gate_r->steps;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5); /* a child whose fork waits forever is killed by SIGALRM */
        step_child = 1;
        step_on = 0;
        ap_step_stop(uc);
        errno = saved;
        return;
    }
    int st = -1;
    if (pid > 0 && waitpid(pid, &st, 0) != pid)
        st = -1;
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (!gate_r->bad++) {
            gate_r->first_bad_step = n;
            gate_r->first_bad_status = st;
        }
    }
    errno = saved;
}

/* ---- the thread of the forking process that stays inside the gate ---------- */

static int park_pipe[2], ready_pipe[2];

static void *inside(void *arg)
{
    (void)arg;
    char c = 1;
    ap_gate_enter();
    if (write(ready_pipe[1], &c, 1) != 1)
        _exit(20);
    while (read(park_pipe[0], &c, 1) < 0)
        ;
    ap_gate_leave();
    return NULL;
}

/* ---- in the child: a thread created there, inside the gate for a while ------ */

static int in_pipe[2];
static volatile int child_leaving; /* set right before it leaves the gate */

static void *child_inside(void *arg)
{
    (void)arg;
    char c = 1;
    ap_gate_enter();
    if (write(in_pipe[1], &c, 1) != 1)
        _exit(21);
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    __atomic_store_n(&child_leaving, 1, __ATOMIC_SEQ_CST);
    ap_gate_leave();
    return NULL;
}

/* In a child forked at one instruction, once that passage returned: exit
 * status 0 when the gate counts this process's passages only. */
static int gate_child_checks(void)
{
    if (gate_mode == 0) {
        ap_gate_leave(); /* the stepped passage */
        ap_gate_leave(); /* the one around it */
        return plain_fork() ? 12 : 0;
    }
    pthread_t t;
    char c;
    if (pipe(in_pipe) || pthread_create(&t, NULL, child_inside, NULL))
        return 13;
    while (read(in_pipe[0], &c, 1) < 0)
        ;
    ap_gate_leave();
    ap_gate_leave();
    /* that thread is inside: the fork waits until it has left */
    pid_t c2 = fork();
    if (c2 == 0)
        _exit(0);
    int leaving = __atomic_load_n(&child_leaving, __ATOMIC_SEQ_CST);
    int st;
    if (c2 < 0 || waitpid(c2, &st, 0) != c2)
        return 14;
    pthread_join(t, NULL);
    if (!leaving)
        return 15; /* forked while a thread of this process was inside */
    return plain_fork() ? 12 : 0;
}

static void gate_body(void *out, void *ctx)
{
    gate_r = out;
    gate_mode = *(const int *)ctx;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, NULL);
    pthread_t p;
    char c = 1;
    if (pipe(park_pipe) || pipe(ready_pipe) || pthread_create(&p, NULL, inside, NULL))
        _exit(3);
    while (read(ready_pipe[0], &c, 1) < 0)
        ;
    if (gate_mode == 2) {
        /* the leave stepped; in a child the next holder of the gate's lock
         * is the fork's prepare handler */
        ap_gate_enter();
        fflush(NULL);
        step_on = 1;
        ap_step_on();
        ap_gate_leave();
        step_on = 0;
        if (step_child)
            _exit(plain_fork() ? 12 : 0);
        if (write(park_pipe[1], &c, 1) != 1)
            _exit(4);
        pthread_join(p, NULL);
        gate_r->parent_fork = plain_fork();
        return;
    }
    /* inside already: this thread's fork never waits for the other one */
    ap_gate_enter();
    fflush(NULL);
    step_on = 1;
    ap_step_on();
    ap_gate_enter();
    step_on = 0; /* the next trap clears the flag */
    if (step_child)
        _exit(gate_child_checks());
    ap_gate_leave();
    ap_gate_leave();
    if (write(park_pipe[1], &c, 1) != 1)
        _exit(4);
    pthread_join(p, NULL);
    gate_r->parent_fork = plain_fork();
}

static void gate_run(int mode, const char *what)
{
    if (AP_SANITIZED)
        cr_skip_test("a fork per instruction is too slow under a sanitizer");
    struct gate_res *r = ap_isolated(sizeof(*r), gate_body, &mode);
    cr_assert_gt(r->steps, 10, "%s: %d steps", what, r->steps);
    cr_assert_eq(r->parent_fork, 0, "%s: a fork after it", what);
    if (mode == 2)
        cr_assert(r->held_seen, "%s: no step with the gate's lock held (the window the test is for)",
                  what);
    cr_assert_eq(r->bad, 0, "%s: %d children broken, the first forked at step %d (wait status %#x)",
                 what, r->bad, r->first_bad_step, (unsigned)r->first_bad_status);
}

/* The forking thread's own passages are what the child counts, whatever
 * instruction of its passage the fork interrupted (inside the gate's lock,
 * the count is set when that thread's section ends). */
Test(gate, fork_at_every_instruction_of_a_passage, .timeout = 120)
{
    gate_run(0, "a passage");
}

/* A fork at every instruction of a leave until its unlock (its own gate
 * passages then end; the parked thread's are not the child's): the child's
 * next fork passes, also where the fork came after the leave's count was
 * settled and before its unlock (the prepare handler, first to take the
 * lock there, sets the count). */
Test(gate, fork_at_every_instruction_of_a_leave, .timeout = 120)
{
    gate_run(2, "a leave");
}

/* A thread created in the child enters the gate before the forking thread
 * has set the count (a fork between the count and the lock's release): its
 * passage counts, and a fork waits for it. */
Test(gate, thread_created_in_the_child_is_counted, .timeout = 120)
{
    gate_run(1, "a passage, then a thread of the child's own");
}
