/* SPDX-License-Identifier: MIT */
/*
 * Helper of test_fork_nested (a program of its own: each step in a fresh
 * process, without the Criterion worker's threads). `fork_nested_helper K`:
 * an apply, then a fork() stepped with the trap flag from a prepare handler
 * that runs before the library's; at step K the SIGTRAP handler forks. Every
 * process that results checks that the library answers and that a plain
 * fork() returns. Exit 0: all worked; 1: the fork ended before step K; other
 * codes: what failed. A hang is ended by alarm() (SIGALRM).
 * `fork_nested_helper list`: the same outer fork stepped to its end without
 * a fork at any step; prints the address of the instruction at each step,
 * one a line in hexadecimal, and exits 0.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>
#include "ap_step.h"


static volatile sig_atomic_t armed, stepping, steps, target, nested, listing;
/* `list`: the instruction at each step (those past LIST_MAX only counted) */
enum { LIST_MAX = 16384 };
static uintptr_t list_ip[LIST_MAX];
static volatile pid_t stepper;
static volatile int nested_status = -1;

/*
 * Descriptors of this process that name a maps file (/proc/PID/maps), or -1
 * where /proc cannot say. System calls only: counted in a signal handler of
 * a child forked inside a fork (the C library may hold malloc's locks there).
 */
static int maps_fds(void)
{
    int dir = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return -1;
    int n = 0;
    char buf[4096];
    long got;
    while ((got = syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0) {
        for (long off = 0; off < got;) {
            struct dirent64 *d = (struct dirent64 *)(void *)(buf + off);
            off += d->d_reclen;
            if (d->d_name[0] < '0' || d->d_name[0] > '9')
                continue;
            char link[256];
            long len = syscall(SYS_readlinkat, dir, d->d_name, link, sizeof(link) - 1);
            if (len < 11)
                continue;
            link[len] = '\0';
            if (!strncmp(link, "/proc/", 6) && !strcmp(link + len - 5, "/maps"))
                n++;
        }
    }
    syscall(SYS_close, dir);
    return got < 0 ? -1 : n;
}

/* In the child of a fork from a signal handler inside a fork: the maps
 * descriptors it holds right after that fork's handlers ran (-1: not such a
 * child). The library's kept descriptor, inherited from the parent, is
 * closed there where the outer fork's prepare handler held the library's
 * lock (no call of this thread could be reading it). */
static volatile int inner_maps = -1;

/* The library answers and a plain fork() returns: 0, else a code. */
static int answers_as(int base, bool owner_dead)
{
    struct altpatch_stats st = {.sz = sizeof(st)};
    int r = altpatch_get_stats(&st);
    if (r != 0 && !(owner_dead && r == -EOWNERDEAD))
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

/* The library answers and this process can fork. */
static int still_works(int base)
{
    return answers_as(base, false);
}

/* The same, where the library may report the lock of a thread this
 * process lacks (-EOWNERDEAD). */
static int answers(int base)
{
    return answers_as(base, true);
}

/* A fork whose child checks still_works(@p base): 0 in both processes
 * when the child exited 0, else (in the parent) @p base + 11. */
static int fork_child_works(int base)
{
    pid_t c = fork();
    if (c < 0)
        return base + 10;
    if (c == 0) {
        alarm(10);
        _exit(still_works(base));
    }
    int s = 0;
    if (waitpid(c, &s, 0) != c || !WIFEXITED(s) || WEXITSTATUS(s) != 0)
        return base + 11;
    return 0;
}

/*
 * The inner fork, from a signal handler that interrupted the outer one: the
 * inner child goes on with the interrupted fork (and whatever follows it)
 * under alarm(@p secs), then its checks; the parent records how the inner
 * child ended. @p nested is set before the fork when @p mark_before (the
 * inner child has it too), else once the inner child has ended.
 */
static void fork_nested(unsigned secs, bool mark_before)
{
    if (mark_before)
        nested = 1;
    pid_t g = fork();
    if (g == 0) {
        alarm(secs);
        inner_maps = maps_fds();
        return;
    }
    int s = -1;
    if (g > 0 && waitpid(g, &s, 0) != g)
        s = -1;
    nested_status = s;
    nested = 1;
}

/* fork_nested() as a signal handler. */
static void fork_from_handler(int sig)
{
    (void)sig;
    fork_nested(5, false);
}

/* sigaction(@p sig) with handler @p fn, no flags, nothing else blocked. */
static int on_signal(int sig, void (*fn)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

/*
 * The library's fork handlers block every signal (the C library's own
 * aside) while they take and give back their locks (a trap there would kill
 * the process): the system call
 * that blocks them is seen coming and SIGTRAP is left out of its set, so
 * that stepping goes on, and the instructions until the system call that
 * restores the mask are stepped but not counted (no signal can arrive there
 * in a real run).
 */
static volatile sig_atomic_t blocked, unblocking;

static bool at_sigprocmask(const ucontext_t *uc)
{
    const uint8_t *ip = (const uint8_t *)uc->uc_mcontext.gregs[REG_RIP];
    return ip[0] == 0x0f && ip[1] == 0x05 && uc->uc_mcontext.gregs[REG_RAX] == SYS_rt_sigprocmask;
}

/* Whether a signal can arrive at this instruction boundary; the state for
 * the next one updated. */
static bool deliverable(ucontext_t *uc)
{
    if (unblocking) {
        unblocking = 0;
        blocked = 0;
    }
    bool now = !blocked;
    if (at_sigprocmask(uc)) {
        uint64_t *set = (uint64_t *)uc->uc_mcontext.gregs[REG_RSI];
        if (blocked) {
            unblocking = 1;
        } else if (uc->uc_mcontext.gregs[REG_RDI] == SIG_SETMASK && set &&
                   (*set & 0x7fffffffull) == 0x7fffffffull) {
            *set &= ~(1ull << (SIGTRAP - 1));
            blocked = 1;
        }
    }
    return now;
}

static void on_trap(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    if (!stepping || getpid() != stepper) {
        ap_step_stop(uc);
        return;
    }
    if (!deliverable(uc))
        return;
    if (listing) {
        if (steps < LIST_MAX)
            list_ip[steps] = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
        steps++;
        return;
    }
    if (++steps < target)
        return;
    ap_step_stop(uc);
    stepping = 0;
    fork_nested(10, true);
}

static void prepare_first(void)
{
    if (!armed)
        return;
    armed = 0;
    steps = 0;
    stepping = 1;
    ap_step_on();
}

static void after_fork(void)
{
    stepping = 0;
    ap_step_off();
}

/* One process: an apply, then the outer fork stepped until step @p k. 0 when
 * every process worked, 1 when the fork ended before step k, else a code. */
static int one_step(int k)
{
    alarm(10);
    if (altpatch_apply() != 0)
        return 10;
    if (maps_fds() < 0)
        return 13;
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
    if (getpid() != stepper) /* the nested fork's child: worked, the kept maps descriptor closed */
        return inner_maps != 0 ? 60 + (inner_maps > 0) : 0;
    if (!nested)
        return 1;
    if (nested_status == -1 || !WIFEXITED(nested_status) || WEXITSTATUS(nested_status) != 0)
        return 50 + (WIFEXITED(nested_status) ? WEXITSTATUS(nested_status) % 50 : 49);
    return 0;
}

/* `fork_nested_helper list`: one_step() that never reaches its step. */
static int list_steps(void)
{
    listing = 1;
    int r = one_step(INT_MAX);
    if (r != 1)
        return r ? r : 3; /* 0: a fork at a step that cannot be reached */
    if (steps > LIST_MAX)
        return 4;
    for (int i = 0; i < steps; i++)
        printf("%lx\n", (unsigned long)list_ip[i]);
    return fflush(stdout) ? 5 : 0;
}

/*
 * `fork_nested_helper mt`: the same with a second thread, which holds the
 * library's lock in a site-walk callback while the main thread forks; once
 * that fork is in the fork handlers (a prepare handler that runs before the
 * library's says so), the second thread sends the main thread SIGUSR1,
 * whose handler forks. The C library runs the handlers again for that fork
 * (it gives its own fork lock back while they run). Every process that
 * results must go on working. `fork_nested_helper setxid`: the same, but
 * the second thread calls setresuid() instead (the C library has every
 * thread run a signal handler of its own and waits for them all), then
 * returns: the fork, waiting for it, must not keep that signal out.
 */
static pthread_t main_thread;
static volatile sig_atomic_t mt_in_fork, mt_walks, mt_setxid, mt_orphan;
static volatile pid_t mt_top;

static void sleep_ms(int n)
{
    struct timespec t = {n / 1000, (long)(n % 1000) * 1000000L};
    while (nanosleep(&t, &t) && errno == EINTR)
        ;
}

static int mt_slow_walk(const struct altpatch_site_info *site, void *ctx)
{
    (void)site;
    (void)ctx;
    if (mt_walks++)
        return 0;
    if (mt_orphan) {
        sleep_ms(1000); /* the main thread forks meanwhile */
        return 0;
    }
    for (int i = 0; i < 2000 && !mt_in_fork; i++)
        sleep_ms(1);
    sleep_ms(200); /* the main thread's fork waits for the lock this thread holds */
    if (mt_setxid) {
        /* glibc signals every thread and waits for each to answer */
        uid_t r, e, su;
        if (getresuid(&r, &e, &su) || setresuid(r, e, su))
            mt_setxid = 2;
        return 0;
    }
    pthread_kill(main_thread, SIGUSR1);
    sleep_ms(800);
    return 0;
}

static void *mt_thread(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)altpatch_site_foreach(mt_slow_walk, NULL);
}

static void mt_prepare_first(void)
{
    if (getpid() == mt_top && pthread_equal(pthread_self(), main_thread))
        mt_in_fork = 1;
}

static int site_value(void)
{
    int v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %0", "movl $2, %0", X86_FEATURE_ALWAYS)
                         : "=r"(v));
    return v;
}

static int multi_threaded(void)
{
    alarm(20);
    mt_top = getpid();
    main_thread = pthread_self();
    if (altpatch_apply() != 0 || site_value() != 2)
        return 10;
    if (on_signal(SIGUSR1, fork_from_handler) || pthread_atfork(mt_prepare_first, NULL, NULL))
        return 11;
    pthread_t t;
    if (pthread_create(&t, NULL, mt_thread, NULL))
        return 12;
    while (!mt_walks)
        sleep_ms(1);
    int r = fork_child_works(20);
    if (r)
        return r;
    r = still_works(40);
    if (r)
        return r;
    if (getpid() != mt_top) /* the nested fork's child: worked, the kept maps descriptor closed */
        return inner_maps != 0 ? 60 + (inner_maps > 0) : 0;
    void *walked = NULL;
    if (pthread_join(t, &walked) || walked != NULL)
        return 14;
    if (mt_setxid)
        return mt_setxid == 1 ? 0 : 16;
    if (!nested)
        return 15;
    if (nested_status == -1 || !WIFEXITED(nested_status) || WEXITSTATUS(nested_status) != 0)
        return 50 + (WIFEXITED(nested_status) ? WEXITSTATUS(nested_status) % 50 : 49);
    return 0;
}

/*
 * `fork_nested_helper orphan`: the repair an inner fork's child needs. A
 * second thread holds the library's lock in a site-walk callback; the main
 * thread, inside altpatch_dlopen() (in the gate), forks from a SIGUSR1
 * handler that the loaded library's constructor raises: the prepare handler
 * cannot take the lock, which stays the other thread's. A prepare handler
 * that runs after the library's raises SIGUSR2, whose handler forks again:
 * in that inner child the other thread does not exist, so its lock must be
 * given up (every later call: -EOWNERDEAD) instead of waited for.
 */
static volatile sig_atomic_t orphan_arm;
static volatile pid_t orphan_outer = -1;
static volatile int orphan_outer_status = -1;

/* `fork_nested_helper jump`: a signal handler leaves the fork with
 * siglongjmp() after the library's prepare handler ran (jump_arm). */
static volatile sig_atomic_t jump_arm;

/* `fork_nested_helper altstack`: the forking thread's checks after the
 * library's prepare handler ran (alt_arm; defined below). */
static volatile sig_atomic_t alt_arm;
static void alt_after_library(void);

static void orphan_after_library(void)
{
    if (orphan_arm && getpid() == mt_top) {
        orphan_arm = 0;
        raise(SIGUSR2);
    }
    if (jump_arm && getpid() == mt_top) {
        jump_arm = 0;
        raise(SIGUSR1);
    }
    if (alt_arm && getpid() == mt_top) {
        alt_arm = 0;
        alt_after_library();
    }
}

/* Registered before the library's handlers: its prepare handler runs after theirs. */
__attribute__((constructor(101))) static void orphan_register(void)
{
    pthread_atfork(orphan_after_library, NULL, NULL);
}

/* A child's checks: the library answers at once (0 or -EOWNERDEAD), a plain fork() returns. */
static void orphan_outer_fork(int sig)
{
    (void)sig;
    orphan_arm = 1;
    pid_t c = fork();
    if (c == 0) {
        alarm(5);
        _exit(answers(20));
    }
    int s = -1;
    if (c > 0 && waitpid(c, &s, 0) != c)
        s = -1;
    if (getpid() == mt_top) {
        orphan_outer = c;
        orphan_outer_status = s;
    }
}

static int orphaned_lock(void)
{
    alarm(20);
    mt_top = getpid();
    main_thread = pthread_self();
    if (altpatch_apply() != 0 || site_value() != 2)
        return 10;
    if (on_signal(SIGUSR1, orphan_outer_fork) || on_signal(SIGUSR2, fork_from_handler))
        return 11;
    pthread_t t;
    if (pthread_create(&t, NULL, mt_thread, NULL))
        return 12;
    while (!mt_walks)
        sleep_ms(1);
    void *h = altpatch_dlopen(FORKCTOR_LIB, RTLD_NOW);
    if (getpid() != mt_top) {
        /* the inner fork's child: the other thread's lock given up */
        struct altpatch_stats st = {.sz = sizeof(st)};
        if (altpatch_get_stats(&st) != -EOWNERDEAD)
            _exit(60);
        _exit(answers(40));
    }
    if (!h)
        return 13;
    void *walked = NULL;
    if (pthread_join(t, &walked) || walked != NULL)
        return 14;
    if (orphan_outer <= 0 || orphan_outer_status == -1 || !WIFEXITED(orphan_outer_status) ||
        WEXITSTATUS(orphan_outer_status) != 0)
        return 31;
    if (!nested)
        return 15;
    if (nested_status == -1 || !WIFEXITED(nested_status) || WEXITSTATUS(nested_status) != 0)
        return 50 + (WIFEXITED(nested_status) ? WEXITSTATUS(nested_status) % 50 : 49);
    return still_works(70);
}

/*
 * `fork_nested_helper jump`: a fork left with siglongjmp() from a signal
 * handler that interrupted it between its prepare handlers, after the
 * library's: that handler took the library's locks for a parent or child
 * handler that never runs, and they stay taken (fork() does not support
 * leaving it so; a later fork cannot be told from one inside the left one).
 * Never a hang for the thread, never a crash: its calls answer -EDEADLK,
 * its next fork is taken for one inside the left fork (its child, whose
 * thread holds the locks too, answers -EDEADLK and forks), and another
 * thread's call waits.
 */
static sigjmp_buf jump_buf;

static int walk_site(const struct altpatch_site_info *info, void *ctx)
{
    (void)info, (void)ctx;
    return 0;
}

static void jump_out(int sig)
{
    (void)sig;
    siglongjmp(jump_buf, 1);
}

static volatile sig_atomic_t waiter_done;

static void *apply_thread(void *arg)
{
    (void)arg;
    int r = altpatch_apply();
    waiter_done = 1;
    return (void *)(intptr_t)r;
}

static int jumped_out(void)
{
    alarm(10);
    mt_top = getpid();
    if (altpatch_apply() != 0 || site_value() != 2)
        return 10;
    if (on_signal(SIGUSR1, jump_out))
        return 11;
    if (sigsetjmp(jump_buf, 1) == 0) {
        jump_arm = 1;
        (void)fork_child_works(20);
        return 12; /* the fork returned: no jump */
    }
    if (getpid() != mt_top)
        _exit(13);
    /* the left fork's locks are held right after the jump */
    if (altpatch_apply() != -EDEADLK)
        return 14;
    if (altpatch_site_foreach(walk_site, NULL) != -EDEADLK)
        return 15;
    pid_t c = fork();
    if (c < 0)
        return 16;
    if (c == 0) {
        alarm(5);
        if (altpatch_apply() != -EDEADLK)
            _exit(21);
        pid_t g = fork();
        if (g == 0)
            _exit(0);
        int gs = 0;
        _exit(g > 0 && waitpid(g, &gs, 0) == g && WIFEXITED(gs) && WEXITSTATUS(gs) == 0 ? 0 : 22);
    }
    int s = 0;
    if (waitpid(c, &s, 0) != c || !WIFEXITED(s) || WEXITSTATUS(s) != 0)
        return 30 + (WIFEXITED(s) ? WEXITSTATUS(s) % 20 : 19);
    if (altpatch_apply() != -EDEADLK)
        return 17;
    pthread_t t;
    if (pthread_create(&t, NULL, apply_thread, NULL))
        return 18;
    sleep_ms(200);
    if (waiter_done)
        return 19; /* another thread's apply got in */
    return 0; /* that thread still waits: the process ends with it */
}

/*
 * `fork_nested_helper altstack`: a fork from a signal handler inside the
 * fork of a thread other than the main one, the handler on an alternate
 * signal stack set up with SS_AUTODISARM (sigaltstack() reports no
 * alternate stack while the handler runs) that lies above the thread's
 * stack. The inner fork takes and gives back nothing: after it the outer
 * fork still holds the library's locks -- the thread's own calls answer
 * -EDEADLK, another thread's calls do not get in -- and the outer child
 * answers.
 */
#ifndef SS_AUTODISARM
#define SS_AUTODISARM (1u << 31)
#endif
enum { ALT_SIZE = 1 << 20 };
static void *alt_stack;
static volatile sig_atomic_t alt_stop, alt_moved;
static volatile unsigned long alt_entered;
static volatile int alt_held = 1, alt_inner_status = -1;

static int alt_site(const struct altpatch_site_info *info, void *ctx)
{
    (void)info, (void)ctx;
    alt_entered = alt_entered + 1;
    return 1;
}

static void *alt_walker(void *arg)
{
    (void)arg;
    while (!alt_stop)
        (void)altpatch_site_foreach(alt_site, NULL);
    return NULL;
}

static void alt_inner_fork(int sig)
{
    (void)sig;
    pid_t c = fork();
    if (c == 0)
        _exit(0);
    int s = -1;
    if (c > 0 && waitpid(c, &s, 0) != c)
        s = -1;
    alt_inner_status = s;
}

static void alt_after_library(void)
{
    raise(SIGUSR1); /* its handler forks, on the alternate stack */
    alt_held = altpatch_site_foreach(walk_site, NULL);
    unsigned long e0 = alt_entered;
    sleep_ms(100); /* the other thread tries meanwhile */
    alt_moved = alt_entered != e0;
}

static void *alt_forker(void *arg)
{
    (void)arg;
    stack_t ss = {.ss_sp = alt_stack, .ss_size = ALT_SIZE, .ss_flags = (int)SS_AUTODISARM};
    if (sigaltstack(&ss, NULL) != 0)
        return (void *)(intptr_t)3; /* SS_AUTODISARM unknown (Linux 4.7) */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = alt_inner_fork;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL))
        return (void *)(intptr_t)11;
    alt_arm = 1;
    pid_t c = fork();
    if (c == 0) {
        alarm(5);
        _exit(still_works(20));
    }
    alt_arm = 0;
    int s = 0;
    if (c < 0 || waitpid(c, &s, 0) != c || !WIFEXITED(s) || WEXITSTATUS(s) != 0)
        return (void *)(intptr_t)(40 + (c > 0 && WIFEXITED(s) ? WEXITSTATUS(s) % 20 : 19));
    return NULL;
}

static int altstack_fork(void)
{
    alarm(20);
    mt_top = getpid();
    if (altpatch_apply() != 0 || site_value() != 2)
        return 10;
    /* the alternate stack above the thread's */
    uint8_t *m1 = mmap(NULL, ALT_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *m2 = mmap(NULL, ALT_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m1 == MAP_FAILED || m2 == MAP_FAILED)
        return 12;
    void *stack = m1 < m2 ? m1 : m2;
    alt_stack = m1 < m2 ? m2 : m1;
    pthread_t w, f;
    if (pthread_create(&w, NULL, alt_walker, NULL))
        return 13;
    while (!alt_entered)
        sleep_ms(1);
    pthread_attr_t at;
    if (pthread_attr_init(&at) || pthread_attr_setstack(&at, stack, ALT_SIZE) ||
        pthread_create(&f, &at, alt_forker, NULL))
        return 14;
    void *code = NULL;
    if (pthread_join(f, &code))
        return 15;
    alt_stop = 1;
    if (pthread_join(w, NULL))
        return 16;
    if (code)
        return (int)(intptr_t)code;
    if (alt_inner_status == -1 || !WIFEXITED(alt_inner_status) || WEXITSTATUS(alt_inner_status))
        return 30;
    if (alt_held != -EDEADLK)
        return 31; /* the outer fork's lock was given back */
    if (alt_moved)
        return 32; /* another thread got in during the fork */
    return still_works(60);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    if (!strcmp(argv[1], "mt"))
        return multi_threaded();
    if (!strcmp(argv[1], "orphan")) {
        mt_orphan = 1;
        return orphaned_lock();
    }
    if (!strcmp(argv[1], "list"))
        return list_steps();
    if (!strcmp(argv[1], "jump"))
        return jumped_out();
    if (!strcmp(argv[1], "altstack"))
        return altstack_fork();
    if (!strcmp(argv[1], "setxid")) {
        mt_setxid = 1;
        return multi_threaded();
    }
    return one_step(atoi(argv[1]));
}
