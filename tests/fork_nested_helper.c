/* SPDX-License-Identifier: MIT */
/*
 * Helper of test_fork_nested (a program of its own: the C library takes its
 * own lock around fork handlers once a process has had a second thread, and
 * a Criterion worker has). `fork_nested_helper K`: an apply, then a fork()
 * stepped with the trap flag from a prepare handler that runs before the
 * library's; at step K the SIGTRAP handler forks. Every process that results
 * checks that the library answers and that a plain fork() returns. Exit 0:
 * all worked; 1: the fork ended before step K; other codes: what failed. A
 * hang is ended by alarm() (SIGALRM).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <altpatch/altpatch.h>

#define TF 0x100

static volatile sig_atomic_t armed, stepping, steps, target, nested;
static volatile pid_t stepper;
static volatile int nested_status = -1;

static void tf_on(void)
{
    __asm__ volatile("pushfq\n\torq $0x100, (%%rsp)\n\tpopfq" ::: "memory", "cc");
}

static void tf_off(void)
{
    __asm__ volatile("pushfq\n\tandq $~0x100, (%%rsp)\n\tpopfq" ::: "memory", "cc");
}

/* The library answers and a plain fork() returns: 0, else a code. */
static int still_works(int base)
{
    struct altpatch_stats st = {.sz = sizeof(st)};
    int r = altpatch_get_stats(&st);
    if (r != 0)
        return base + 1;
    pid_t c = fork();
    if (c < 0)
        return base + 2;
    if (c == 0)
        _exit(0);
    int s = 0;
    if (waitpid(c, &s, 0) != c || !WIFEXITED(s) || WEXITSTATUS(s) != 0)
        return base + 3;
    return 0;
}

static void on_trap(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    if (!stepping || getpid() != stepper) {
        uc->uc_mcontext.gregs[REG_EFL] &= ~(greg_t)TF;
        return;
    }
    if (++steps < target)
        return;
    uc->uc_mcontext.gregs[REG_EFL] &= ~(greg_t)TF;
    stepping = 0;
    nested = 1;
    pid_t g = fork();
    if (g == 0) {
        alarm(10); /* goes on with the interrupted fork, then its checks */
        return;
    }
    int s = -1;
    if (g > 0 && waitpid(g, &s, 0) != g)
        s = -1;
    nested_status = s;
}

static void prepare_first(void)
{
    if (!armed)
        return;
    armed = 0;
    steps = 0;
    stepping = 1;
    tf_on();
}

static void after_fork(void)
{
    stepping = 0;
    tf_off();
}

/* One process: an apply, then the outer fork stepped until step @p k. 0 when
 * every process worked, 1 when the fork ended before step k, else a code. */
static int one_step(int k)
{
    alarm(10);
    if (altpatch_apply() != 0)
        return 10;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTRAP, &sa, NULL) || pthread_atfork(prepare_first, after_fork, after_fork))
        return 11;
    stepper = getpid();
    target = k;
    armed = 1;
    pid_t c = fork();
    if (c < 0)
        return 12;
    if (c == 0) {
        alarm(10);
        _exit(still_works(20));
    }
    int s = 0;
    if (waitpid(c, &s, 0) != c) {
        /* the nested fork's child, made after the outer fork had made its
         * child: that child is not its own */
        if (getpid() == stepper || errno != ECHILD)
            return 30;
    } else if (!WIFEXITED(s) || WEXITSTATUS(s) != 0) {
        return 31;
    }
    int r = still_works(40);
    if (r)
        return r;
    if (getpid() != stepper)
        return 0; /* the nested fork's child: worked */
    if (!nested)
        return 1;
    if (nested_status == -1 || !WIFEXITED(nested_status) || WEXITSTATUS(nested_status) != 0)
        return 50 + (WIFEXITED(nested_status) ? WEXITSTATUS(nested_status) % 50 : 49);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    return one_step(atoi(argv[1]));
}
