/* SPDX-License-Identifier: MIT */
/*
 * A fork() from a signal handler that interrupted another fork() of the same
 * thread between the library's fork handlers. The C library runs the fork
 * handlers again for the inner fork, with or without other threads. The
 * helper (fork_nested_helper.c) steps the outer fork with the trap flag and
 * forks at step K; each K is run in a fresh helper process, and every
 * process that results must go on working.
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/personality.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ap_isolate.h"
#include "ap_step.h"

/* In a child about to exec the helper: the same addresses in every run (no
 * address-space randomization), so that a stepped run takes the very steps
 * the list run took, down to paths that depend on an address's low bits.
 * Where personality() is refused (a container's seccomp policy) the runs
 * keep their random layout. */
static void helper_fixed_layout(void)
{
    int cur = personality(0xffffffff);
    if (cur != -1)
        (void)personality((unsigned long)cur | ADDR_NO_RANDOMIZE);
}

/* The helper run with @p arg in a process of its own: its exit code (killed
 * by a signal, its alarm's on a hang: the test fails). @p fixed: with
 * helper_fixed_layout(). */
static int helper_exit_as(const char *arg, bool fixed)
{
    pid_t p = fork();
    cr_assert_neq(p, -1);
    if (p == 0) {
        if (fixed)
            helper_fixed_layout();
        execl(FORK_NESTED_HELPER, FORK_NESTED_HELPER, arg, (char *)NULL);
        _exit(127);
    }
    int s = 0;
    cr_assert_eq(waitpid(p, &s, 0), p);
    cr_assert(WIFEXITED(s), "fork_nested_helper %s: killed by signal %d (hung or crashed)", arg,
              WIFSIGNALED(s) ? WTERMSIG(s) : 0);
    return WEXITSTATUS(s);
}

static int helper_exit(const char *arg)
{
    return helper_exit_as(arg, false);
}

/*
 * Each helper run steps the fork from its start up to its step, so forking
 * at every step costs steps^2 / 2 traps in all. The first STEP_FORK_ALL steps
 * each fork; after them, a step forks only at an instruction that has not
 * run at an earlier step (the helper's `list` run says which instruction
 * each step is), as test_robust's stepping does.
 */
#define STEP_FORK_ALL 256
#define STEP_SEEN_SLOTS 8192 /* a power of two, above the fork's distinct instructions */
enum { STEP_LIMIT = 4000 };

/* The table of instructions met holds more than STEP_LIMIT + 1 addresses:
 * it never fills. */
_Static_assert(STEP_SEEN_SLOTS > STEP_LIMIT + 1, "room for every step's address");

/* The instruction address of each step of the stepped fork (`list`), in
 * @p ip (up to STEP_LIMIT + 1): their number. */
static int helper_list(uintptr_t *ip)
{
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    pid_t p = fork();
    cr_assert_neq(p, -1);
    if (p == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        helper_fixed_layout();
        execl(FORK_NESTED_HELPER, FORK_NESTED_HELPER, "list", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    cr_assert(f);
    int n = 0;
    unsigned long a;
    while (fscanf(f, "%lx", &a) == 1)
        if (n <= STEP_LIMIT)
            ip[n++] = (uintptr_t)a;
    fclose(f);
    int s = 0;
    cr_assert_eq(waitpid(p, &s, 0), p);
    cr_assert(WIFEXITED(s) && WEXITSTATUS(s) == 0, "fork_nested_helper list: status %#x", s);
    return n;
}

Test(fork_nested, fork_from_a_handler_inside_fork, .timeout = 240)
{
    if (AP_SANITIZED)
        cr_skip_test("a fork per step is too slow with shadow memory");
    /* the steps where a signal can be delivered, from the prepare handler
     * that starts stepping to the parent handler that ends it: about a
     * thousand (the library's handlers are stepped but not counted while
     * they block every signal); a fork that never ends fails here */
    static uintptr_t ip[STEP_LIMIT + 1], seen[STEP_SEEN_SLOTS];
    int steps = helper_list(ip);
    /* a run whose fork ends sooner or later than the list's ends the loop
     * all the same: each step past the list's forks */
    int k, runs = 0, distinct = 0;
    for (k = 1;; k++) {
        cr_assert_leq(k, STEP_LIMIT, "the fork still runs after %d steps", STEP_LIMIT);
        if (k <= steps && ap_step_seen_before(seen, STEP_SEEN_SLOTS, ip[k - 1], &distinct) && k > STEP_FORK_ALL)
            continue;
        runs += k <= steps;
        char arg[16];
        snprintf(arg, sizeof(arg), "%d", k);
        int code = helper_exit_as(arg, true);
        if (code == 1)
            break;
        cr_assert_eq(code, 0, "step %d: code %d", k, code);
    }
    cr_assert_gt(k, 50, "the fork was stepped through %d instructions only", k);
    /* the steps skipped are known by the list's addresses: a run that took
     * other steps than the list would have left instructions untried */
    cr_assert_eq(k - 1, steps, "the fork ended after %d steps, the list run's after %d", k - 1,
                 steps);
    cr_assert_geq(runs, steps < STEP_FORK_ALL ? steps : STEP_FORK_ALL,
                  "a fork at each of its first steps");
    cr_log_info("the fork ended after %d steps (%d listed): %d distinct instructions, %d runs",
                k - 1, steps, distinct, runs);
}

/* The helper in @p mode: it exits 0 (a hang: its alarm kills it). */
static void helper_mode(const char *mode)
{
    int code = helper_exit(mode);
    cr_assert_eq(code, 0, "%s: code %d", mode, code);
}

/*
 * With a second thread: the main thread's fork waits in the library's
 * prepare handler for the lock the other thread holds when a signal handler
 * on the main thread forks; the C library runs the fork handlers for that
 * inner fork too. Its child must not wait for the thread it lacks.
 */
Test(fork_nested, fork_from_a_handler_while_the_fork_waits, .timeout = 60)
{
    helper_mode("mt");
}

/*
 * The other thread calls setresuid() while the main thread's fork waits for
 * it: the C library has every thread run a handler of its own for that and
 * waits for them all, the fork handler's blocked signals included.
 */
Test(fork_nested, setuid_on_the_thread_the_fork_waits_for, .timeout = 60)
{
    helper_mode("setxid");
}

/*
 * A fork inside altpatch_dlopen() while another thread holds the library's
 * lock, and a fork from a signal handler inside that fork: the inner child
 * gives up the other thread's lock (-EOWNERDEAD) instead of waiting for it.
 */
Test(fork_nested, inner_child_gives_up_another_threads_lock, .timeout = 60)
{
    helper_mode("orphan");
}

/*
 * A fork left with siglongjmp() from a signal handler between its prepare
 * handlers, after the library's (which took its locks for handlers that
 * never run): the locks stay taken. Right after the jump the thread's calls
 * answer -EDEADLK; its next fork is taken for one inside the left fork (the
 * child answers -EDEADLK and forks); another thread's apply waits.
 */
Test(fork_nested, fork_left_by_longjmp_keeps_its_locks, .timeout = 60)
{
    helper_mode("jump");
}

/*
 * A fork from a signal handler inside a thread's fork, the handler on an
 * alternate signal stack with SS_AUTODISARM above the thread's stack: the
 * outer fork keeps its locks through the inner one (the thread's calls
 * answer -EDEADLK, another thread's do not get in) and its child answers.
 */
Test(fork_nested, inner_fork_on_an_autodisarm_stack_keeps_the_outer_locks, .timeout = 60)
{
    helper_mode("altstack");
}
