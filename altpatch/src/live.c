/* SPDX-License-Identifier: MIT */
/*
 * Live re-patching: rewriting sites while other threads may execute them.
 *
 * This is the x86 side of the live writer: which sites can change in one
 * step, the entry barrier of the others (`jmp .`), and where the other
 * threads are. No byte is ever written into a page that a thread may be
 * executing: the new contents of the pages go into a staging copy that
 * replaces the live pages in one mremap() (flip.c), so every thread executes
 * each instruction either from the old page or from the new one. No trap, no
 * SIGTRAP: the threads' signal masks do not matter.
 *
 * One round per batch (every site an apply changes):
 *
 *   0. classify: a site whose bytes in memory are one instruction (or whose
 *      old and new bytes are only NOPs and fences, every old boundary a new
 *      one) is class A: nobody can be inside it in a way the new bytes would
 *      break. Others are class B (their first instruction must be at least
 *      two bytes long). A call that is not the last instruction is refused
 *      (its return address lies inside the site).
 *   1. stage (before the round, may allocate): staging copy 1 holds the live
 *      pages with the new bytes of A sites and `jmp .` (EB FE) on the first
 *      two bytes of B sites; copy 2 (only for runs with a B site) holds every
 *      new byte. Every site's old bytes are checked in the copies.
 *   2. flip 1; membarrier(SYNC_CORE). A sites are done. A thread that enters
 *      a B site now spins at its first byte; one already inside finishes the
 *      old bytes (interior boundaries are untouched).
 *   3. handshake (only with B sites): every other thread is located; a B site
 *      some thread stays strictly inside is refused (its old bytes go back
 *      into copy 2); a thread that does not answer refuses every B site.
 *   4. flip 2; membarrier. Spinning threads resume at the site start on the
 *      final bytes.
 *
 * Between flip 1 and flip 2 the applying thread runs nothing but raw system
 * calls: a B site it ran would spin forever.
 *
 * Nomenclature: "round" = steps 2-4 for one batch; "run" = pages flipped
 * together (flip.c).
 */
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

/** The entry barrier of a class B site: jmp . */
static const uint8_t ap_spin[2] = {0xeb, 0xfe};
/** Threads the handshake can track; more -> multi-instruction sites are refused. */
#define AP_HS_MAX 1024
/** How long the handshake may take in all, and how long one attempt waits for answers. */
#define AP_HS_BUDGET_NS (250 * 1000 * 1000)
#define AP_HS_WAIT_NS (25 * 1000 * 1000)
/** Pause between two attempts (threads inside a site get time to leave it). */
#define AP_HS_PAUSE_NS (1000 * 1000)
/** How long a running thread is read again through /proc before it is signalled. */
#define AP_HS_POLL_NS (400 * 1000)
/*
 * The handshake signal: SIGURG, whose default action is to ignore it. A
 * queued handshake can outlive its handler -- it reaches a thread that is in
 * execve() (the new image has every action reset) or a program that set the
 * action back to SIG_DFL meanwhile -- and must then do nothing; every
 * real-time signal's default would end the process. Sent to one thread
 * (rt_tgsigqueueinfo), it is merged only with a SIGURG sent to that same
 * thread while ours is pending (the process's own, from a socket's owner,
 * queue apart): ours, recognised by SI_QUEUE, our pid and the cookie, is
 * answered; any other is handed to the program's action (ap_chain()).
 */
#define AP_HS_SIG SIGURG
/** Attempts in a row that find a never-located thread blocking it before it is given up. */
#define AP_HS_BLOCKED 2

/* ------------------------------------------------------------------------- */
/* Raw system calls (no libc interposition: ASan, fork handlers)             */
/* ------------------------------------------------------------------------- */

static pid_t ap_gettid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

/*
 * Give the other threads a moment (to answer, or to reach the sleep they are
 * about to enter). A short sleep rather than sched_yield(): on a loaded
 * machine a yield can hand the CPU to another process for a whole time
 * slice, a 20 us sleep wakes up on time.
 */
static void ap_nap(void)
{
    struct timespec ts = {0, 20 * 1000};
    syscall(SYS_nanosleep, &ts, NULL);
}

/* ------------------------------------------------------------------------- */
/* Threads, read from /proc without allocating                               */
/* ------------------------------------------------------------------------- */

/*
 * Between the two flips the applying thread must not call anything that may
 * run a site of the round (a malloc or opendir wrapper of the program can
 * hold one): it would spin on the entry barrier forever. So the round reads
 * /proc with raw system calls into static buffers, on a /proc/self/task
 * descriptor opened before the round, reads the clock and writes
 * /proc/self/mem with raw system calls too (a program's clock_gettime() or
 * pwrite() wrapper is theirs), and searches and copies strings with its own
 * loops.
 */

/** Monotonic nanoseconds by the system call itself, not the C library's wrapper. */
static uint64_t ap_round_now_ns(void)
{
    struct timespec ts = {0, 0};
    ap_sys(SYS_clock_gettime, CLOCK_MONOTONIC, (long)&ts, 0, 0, 0);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
struct ap_dirent64 {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
};

/** Decimal @p v at @p p; returns the end. */
static char *ap_put_dec(char *p, unsigned long v)
{
    char tmp[24];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while (v /= 10);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/** Read /proc/self/task/@p tid/@p file into @p buf (NUL-terminated). Bytes read or -errno. */
static long ap_task_read(pid_t tid, const char *file, char *buf, size_t size)
{
    char path[64] = "/proc/self/task/";
    char *p = ap_put_dec(path + sizeof("/proc/self/task/") - 1, (unsigned long)tid);
    *p++ = '/';
    while ((*p++ = *file++)) /* "status", "stat", "syscall" */
        ;
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    long n = syscall(SYS_read, (int)fd, buf, size - 1);
    int err = errno;
    syscall(SYS_close, (int)fd);
    if (n < 0)
        return -err;
    buf[n] = 0;
    return n;
}

/* PF_IO_WORKER (include/linux/sched.h): an io_uring worker. */
#define AP_PF_IO_WORKER 0x10u

/**
 * True when thread @p tid is an io_uring worker (iou-sqp-*, iou-wrk-*:
 * listed in /proc/self/task, sharing the memory, but kernel threads that
 * never run user code; /proc shows them with no user registers, every
 * signal blocked). The flags are the 9th field of its stat line.
 */
static bool ap_task_io_worker(pid_t tid)
{
    char st[512];
    long n = ap_task_read(tid, "stat", st, sizeof(st));
    const char *c = NULL;
    for (long k = 0; k < n; k++) /* the last ')': the name may hold spaces and parentheses */
        if (st[k] == ')')
            c = st + k;
    if (!c)
        return false;
    for (int field = 2; field < 9 && *c; c++)
        field += *c == ' ';
    unsigned long flags = 0;
    while (*c >= '0' && *c <= '9')
        flags = flags * 10 + (unsigned long)(*c++ - '0');
    return *c == ' ' && (flags & AP_PF_IO_WORKER);
}

/** True when thread @p tid blocks the handshake signal (SigBlk of its status). */
static bool ap_task_blocks_hs(pid_t tid)
{
    static char st[4096];
    if (ap_task_read(tid, "status", st, sizeof(st)) <= 0)
        return false;
    static const char key[] = "\nSigBlk:";
    const char *l = NULL;
    for (const char *c = st; *c && !l; c++) {
        size_t k = 0;
        while (key[k] && c[k] == key[k])
            k++;
        if (!key[k])
            l = c;
    }
    if (!l)
        return false;
    uint64_t v = 0;
    for (const char *c = l + 8; *c && *c != '\n'; c++) {
        int d = *c >= '0' && *c <= '9' ? *c - '0' : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10 : -1;
        if (d >= 0)
            v = v << 4 | (uint64_t)d;
    }
    return v >> (AP_HS_SIG - 1) & 1;
}

/**
 * Call @p fn(tid, ctx) for every thread of the process but the caller, from
 * the /proc/self/task descriptor @p dirfd (rewound). Stops when @p fn returns
 * non-zero and returns that; -errno when the directory cannot be read.
 */
static int ap_tasks_each(int dirfd, int (*fn)(pid_t tid, void *ctx), void *ctx)
{
    static _Alignas(8) char buf[4096];
    pid_t self = ap_gettid();
    if (syscall(SYS_lseek, dirfd, 0L, SEEK_SET) < 0)
        return -errno;
    for (;;) {
        long n = syscall(SYS_getdents64, dirfd, buf, sizeof(buf));
        if (n < 0)
            return -errno;
        if (n == 0)
            return 0;
        for (long off = 0; off < n;) {
            const struct ap_dirent64 *e = (const void *)(buf + off);
            off += e->reclen;
            pid_t tid = 0;
            for (const char *c = e->name; *c >= '0' && *c <= '9'; c++)
                tid = tid * 10 + (*c - '0');
            if (tid <= 0 || tid == self)
                continue;
            int r = fn(tid, ctx);
            if (r)
                return r;
        }
    }
}

static int ap_task_dir_open(void)
{
    long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return fd < 0 ? -errno : (int)fd;
}

/* ------------------------------------------------------------------------- */
/* The restorers of the process' signal handlers                             */
/* ------------------------------------------------------------------------- */

/** Remember the restorer of @p sa: a hint for the frame search (frames.c). */
static void ap_note_restorer(const struct sigaction *sa)
{
    ap_frames_hint_restorer((uintptr_t)sa->sa_restorer);
}

/** Note the restorer of every installed handler. Not during a round (sigaction is libc). */
static void ap_restorers_scan(void)
{
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa))
            continue;
        if (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN)
            ap_note_restorer(&sa);
    }
}

/* ------------------------------------------------------------------------- */
/* Handshake: where is every other thread?                                   */
/* ------------------------------------------------------------------------- */

struct ap_hs_slot {
    pid_t tid;
    unsigned seq;  /* the handshake attempt this answer belongs to */
    uintptr_t rip; /* where the thread was interrupted */
    bool stuck;    /* it spins on an entry barrier: it cannot move before the round ends */
};

static struct ap_hs_slot ap_hs[AP_HS_MAX];
static size_t ap_hs_n;
static unsigned ap_hs_seq; /* current attempt; 0 = no handshake running */
static unsigned ap_hs_last;
static const char ap_hs_cookie = 'L'; /* si_value of our handshake signals */

/*
 * Signal frames. A thread that runs a signal handler was interrupted
 * somewhere, maybe strictly inside a multi-instruction site; its RIP (in the
 * handler) does not tell. So every answer (the handshake handler, a sleeping
 * thread read through /proc) asks frames.c, which reads the thread's stacks
 * for the kernel's signal frames and answers with a saved RIP that lies
 * inside a multi-instruction site of the round, when one does (ap_in_round).
 */
struct ap_range {
    uintptr_t a, e; /* [a, e): a multi-instruction site of the running round */
};
static const struct ap_range *ap_hs_rng; /* sorted; published for the handshake */
/* Buffers ap_hs_rng pointed to before: they stay allocated (a late handler
 * may still read one) and reachable. Each new buffer at least doubles the
 * capacity, so 64 slots hold every buffer an address space can have. */
static struct ap_range *ap_hs_rng_retired[64];
static size_t ap_hs_nretired;
static size_t ap_hs_nrng;

/** True when @p rip is strictly inside a multi-instruction site of the round. */
static bool ap_in_round(uintptr_t rip)
{
    const struct ap_range *r = __atomic_load_n(&ap_hs_rng, __ATOMIC_ACQUIRE);
    size_t lo = 0, hi = __atomic_load_n(&ap_hs_nrng, __ATOMIC_ACQUIRE);
    if (!r)
        return false;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rip <= r[mid].a)
            hi = mid;
        else if (rip >= r[mid].e)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/**
 * The calling thread's answer, interrupted at @p rip with stack pointer
 * @p rsp (frames.c; a search that cannot tell makes it "not located").
 */
static uintptr_t ap_hs_where_self(uintptr_t rip, uintptr_t rsp)
{
    uintptr_t where = ap_frames_where_self(rip, rsp, ap_in_round);
    return where == AP_WHERE_CUT ? AP_WHERE_UNKNOWN : where;
}

/** Answer the running handshake (if any) for thread @p tid, at @p rip (see ap_hs_where_self). */
static void ap_hs_answer(pid_t tid, uintptr_t rip, bool stuck)
{
    unsigned seq = __atomic_load_n(&ap_hs_seq, __ATOMIC_ACQUIRE);
    if (!seq)
        return;
    size_t n = __atomic_load_n(&ap_hs_n, __ATOMIC_ACQUIRE);
    for (size_t i = 0; i < n; i++) {
        if (__atomic_load_n(&ap_hs[i].tid, __ATOMIC_RELAXED) != tid)
            continue;
        __atomic_store_n(&ap_hs[i].rip, rip, __ATOMIC_RELAXED);
        __atomic_store_n(&ap_hs[i].stuck, stuck, __ATOMIC_RELAXED);
        __atomic_store_n(&ap_hs[i].seq, seq, __ATOMIC_RELEASE);
        return;
    }
}

static bool ap_is_handshake(const siginfo_t *si)
{
    return si->si_code == SI_QUEUE && si->si_pid == (pid_t)syscall(SYS_getpid) &&
           si->si_value.sival_ptr == (void *)&ap_hs_cookie;
}

/* ------------------------------------------------------------------------- */
/* Signal handlers                                                           */
/* ------------------------------------------------------------------------- */

static struct sigaction ap_prev_hs; /* the action installed before ours */

/** Hand a signal that is not ours to the action that was installed before. */
static void ap_chain(const struct sigaction *prev, int sig, siginfo_t *si, void *uc)
{
    if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        /* The mask the kernel would have set for that handler (sigreturn restores ours). */
        sigset_t m = prev->sa_mask;
        if (!(prev->sa_flags & SA_NODEFER))
            sigaddset(&m, sig);
        syscall(SYS_rt_sigprocmask, SIG_BLOCK, &m, NULL, sizeof(uint64_t));
    }
    if (prev->sa_flags & SA_SIGINFO) {
        if (prev->sa_sigaction)
            prev->sa_sigaction(sig, si, uc);
        return;
    }
    if (prev->sa_handler == SIG_IGN)
        return;
    if (prev->sa_handler != SIG_DFL) {
        prev->sa_handler(sig);
        return;
    }
    /* Default action: restore it and re-raise; the signal is blocked while
     * we run, so it is delivered (and acts) when we return. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    syscall(SYS_tgkill, syscall(SYS_getpid), ap_gettid(), sig);
}

/** True when @p rip is the first byte of a multi-instruction site of the round. */
static bool ap_at_entry(uintptr_t rip)
{
    const struct ap_range *r = __atomic_load_n(&ap_hs_rng, __ATOMIC_ACQUIRE);
    size_t lo = 0, hi = __atomic_load_n(&ap_hs_nrng, __ATOMIC_ACQUIRE);
    while (r && lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rip == r[mid].a)
            return true;
        if (rip < r[mid].a)
            hi = mid;
        else
            lo = mid + 1;
    }
    return false;
}

static void ap_hs_handler(int sig, siginfo_t *si, void *ucv)
{
    int saved = errno;
    ucontext_t *uc = ucv;
    if (ap_is_handshake(si)) {
        /* Our frame is not marked: its saved RIP is where the thread resumes,
         * and a search from another thread (/proc) that finds it must count it. */
        uintptr_t rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
        uintptr_t where = ap_hs_where_self(rip, (uintptr_t)uc->uc_mcontext.gregs[REG_RSP]);
        /* Spinning on an entry barrier (a handler that ran a site) over a
         * frame interrupted inside a site: neither moves before flip 2. */
        ap_hs_answer(ap_gettid(), where,
                     where != rip && where != AP_WHERE_UNKNOWN && ap_at_entry(rip));
    } else {
        ap_chain(&ap_prev_hs, sig, si, ucv);
    }
    errno = saved;
}


/**
 * Install @p fn for @p sig unless it is already there, remembering the action
 * it replaces in @p prev (re-installed when someone replaced ours since).
 */
static int ap_install(int sig, void (*fn)(int, siginfo_t *, void *), int flags,
                      struct sigaction *prev)
{
    struct sigaction cur, sa;
    flags |= SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    if (sigaction(sig, NULL, &cur))
        return -errno;
    if (cur.sa_sigaction == fn && (cur.sa_flags & flags) == flags)
        return 0;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (cur.sa_sigaction != fn)
        *prev = cur;
    return sigaction(sig, &sa, NULL) ? -errno : 0;
}

/* ------------------------------------------------------------------------- */
/* membarrier, fork                                                          */
/* ------------------------------------------------------------------------- */

static pid_t ap_mb_pid; /* the process that registered (fork: register again) */

static int ap_membarrier_register(void)
{
    pid_t pid = (pid_t)syscall(SYS_getpid);
    if (ap_mb_pid == pid)
        return 0;
    long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (q < 0 || !(q & MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE))
        return -ENOSYS;
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0))
        return -errno;
    ap_mb_pid = pid;
    return 0;
}

/** Every thread of the process executes a serializing instruction before it runs user code again. */
static void ap_sync_all(struct ap_poke_stats *st)
{
    syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0);
    st->syscalls++;
    ap_sync_core();
}

/*
 * fork() waits while a round runs: no child starts with an entry barrier in its text
 * (taken by apply.c's fork handlers, after its own lock). A plain mutex is enough:
 * - the round holds it with every signal blocked (ap_signals_block() before the
 *   lock, ap_signals_restore() after the unlock), so no handler of the round's
 *   thread runs meanwhile (a fault there is not handled: the kernel kills the
 *   process for a blocked synchronous signal) and that thread forks from none;
 * - a fork on another thread waits for the round, which needs nothing of that
 *   thread, and its child's copy of the forking thread unlocks what it took;
 * - a fork from a handler on a thread that is in its own fork comes, by apply.c's
 *   fork handlers (which take and release their locks with every signal
 *   blocked), either before this lock is taken or while it is held until the
 *   parent or child handler: the handlers count the forks under way on the
 *   thread (ap_fork_depth) and the inner one takes and releases nothing.
 */
static pthread_mutex_t ap_fork_lock = PTHREAD_MUTEX_INITIALIZER;

void ap_live_fork_prepare(void)
{
    pthread_mutex_lock(&ap_fork_lock);
}

void ap_live_fork_release(void)
{
    pthread_mutex_unlock(&ap_fork_lock);
}

/* ------------------------------------------------------------------------- */
/* Readiness                                                                 */
/* ------------------------------------------------------------------------- */

/* ------------------------------------------------------------------------- */
/* Classifying sites                                                         */
/* ------------------------------------------------------------------------- */

/** Instruction boundaries of @p len bytes, as a bit set (bit k: an instruction starts at k). */
struct ap_shape {
    int count;          /* instructions; -1 when the bytes do not decode */
    int first;          /* length of the first one */
    bool call_inside;   /* a call that is not the last instruction */
    bool quiet;         /* every instruction is a NOP or a fence */
    uint64_t starts[4]; /* sites are at most 255 bytes long */
};

static void ap_shape_of(const uint8_t *p, size_t len, struct ap_shape *s)
{
    memset(s, 0, sizeof(*s));
    s->quiet = true;
    for (size_t off = 0; off < len; s->count++) {
        struct ap_insn in;
        if (off >= 256 || ap_insn_decode(p + off, len - off, &in) < 0) {
            s->count = -1;
            return;
        }
        if (!off)
            s->first = in.len;
        s->starts[off / 64] |= 1ull << (off % 64);
        s->call_inside |= off + in.len < len && in.is_call;
        s->quiet &= in.is_nop || in.is_fence;
        off += in.len;
    }
}

/**
 * Whether the change from @p old to @p new needs the entry barrier and the
 * handshake (*multi, class B) or is safe in one flip (class A): a thread
 * between two old instructions resumes on the new bytes at the same offset,
 * which is right when that offset starts a new instruction and no
 * instruction, old or new, does anything (NOPs and fences). 0, or the
 * reason the site cannot be written live.
 */
static int ap_live_class(const uint8_t *old, const uint8_t *new, size_t len, bool *multi)
{
    struct ap_shape o, n;
    ap_shape_of(old, len, &o);
    ap_shape_of(new, len, &n);
    *multi = false;
    if (o.count < 0 || n.count < 0 || o.call_inside || n.call_inside)
        return ALTPATCH_REASON_LIVE_CALL_INSIDE;
    if (o.count == 1)
        return 0;
    bool nested = true;
    for (int k = 0; k < 4; k++)
        nested &= (o.starts[k] & ~n.starts[k]) == 0;
    if (o.quiet && n.quiet && nested)
        return 0;
    *multi = true;
    return o.first >= (int)sizeof(ap_spin) ? 0 : ALTPATCH_REASON_LIVE_SHORT_ENTRY;
}

/* ------------------------------------------------------------------------- */
/* One round                                                                 */
/* ------------------------------------------------------------------------- */

struct ap_live_item {
    struct ap_write *w;
    bool multi;    /* class B: entry barrier, handshake, second flip */
    bool out;      /* refused or failed: no further step for this site */
    bool fallback; /* its pages cannot be flipped */
    long run;      /* its run (flip.c), or -1 */
};

struct ap_round {
    struct ap_live_item *it;
    size_t n;
    int taskfd; /* /proc/self/task, opened before the round */
    struct ap_flip f;
    uint8_t *rstate; /* per run: AP_RUN_* */
    struct ap_poke_stats *st;
};

enum {
    AP_RUN_DEAD = 1,   /* cannot be flipped (staging failed): its sites fall back */
    AP_RUN_TWO = 2,    /* holds a B site: staging copy 2 and a second flip */
    AP_RUN_FLIPPED = 4 /* flip 1 is in */
};

/**
 * Take B site @p it out of the round with @p reason, after flip 1: its old
 * bytes go back into staging copy 2, which will replace its entry barrier.
 */
static void ap_item_refuse(struct ap_round *r, struct ap_live_item *it, int reason)
{
    /* Staging pages are ours and already written (no allocation): retried
     * only against a transient failure. */
    for (int tries = 0; tries < 100; tries++)
        if (!ap_flip_put(&r->f, (size_t)it->run, 1, it->w->addr, it->w->old, it->w->len, r->st))
            break;
    it->w->result = reason;
    it->out = true;
}

/** Index of the multi-instruction item @p rip is strictly inside, or -1. */
static long ap_inside(const struct ap_round *r, uintptr_t rip)
{
    for (size_t i = 0; i < r->n; i++) {
        const struct ap_live_item *it = &r->it[i];
        if (!it->out && it->multi && rip > it->w->addr && rip < it->w->addr + it->w->len)
            return (long)i;
    }
    return -1;
}

static int ap_hs_collect_one(pid_t tid, void *ctx)
{
    size_t *n = ctx;
    if (*n == AP_HS_MAX)
        return 1;
    __atomic_store_n(&ap_hs[*n].tid, tid, __ATOMIC_RELAXED);
    __atomic_store_n(&ap_hs[*n].seq, 0, __ATOMIC_RELAXED);
    ++*n;
    return 0;
}

/** The other threads of this process into ap_hs[]; false when there are too many. */
static bool ap_hs_collect(int dirfd)
{
    size_t n = 0;
    int r = ap_tasks_each(dirfd, ap_hs_collect_one, &n);
    __atomic_store_n(&ap_hs_n, n, __ATOMIC_RELEASE);
    return r == 0;
}

/*
 * Where a sleeping thread is, without disturbing it: /proc/self/task/TID/syscall
 * holds "nr args... sp pc" (or "-1 sp pc") with the user RIP of a thread that
 * sleeps in the kernel, and "running" for one that runs. A thread seen asleep
 * at pc after flip 1 answers the handshake as well as a signal
 * would, and a signal would make its wait fail with EINTR (epoll_wait, ...).
 * Returns true and *pc for a sleeping thread.
 */
static bool ap_task_regs(pid_t tid, uintptr_t *sp, uintptr_t *pc)
{
    char buf[256];
    long n = ap_task_read(tid, "syscall", buf, sizeof(buf));
    if (n <= 0 || buf[0] < '-' || (buf[0] > '9' && buf[0] != '-'))
        return false; /* "running", gone, or not available */
    uintptr_t v[2] = {0, 0}; /* the last two hexadecimal fields: sp, pc */
    for (const char *c = buf; *c; c++) {
        if (c[0] != '0' || c[1] != 'x')
            continue;
        uintptr_t x = 0;
        for (c += 2; (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'); c++)
            x = x << 4 | (uintptr_t)(*c <= '9' ? *c - '0' : *c - 'a' + 10);
        v[0] = v[1], v[1] = x;
        c--;
    }
    if (!v[1])
        return false;
    *sp = v[0], *pc = v[1];
    return true;
}

/**
 * Where a sleeping thread is (a signal frame on its stacks may hold a RIP
 * inside a site: frames.c). Its stacks are read while it sleeps, so the
 * registers are read again after: a thread that moved meanwhile is not
 * located this way, nor one whose stacks this search cannot read to their
 * end (the handshake signal asks it: its handler knows its thread's control
 * block and sigaltstack).
 */
static bool ap_task_pc(pid_t tid, uintptr_t *where)
{
    uintptr_t sp, pc, sp2, pc2;
    if (!ap_task_regs(tid, &sp, &pc))
        return false;
    *where = ap_frames_where_task(pc, sp, ap_in_round);
    if (*where == AP_WHERE_CUT)
        return false;
    /* Asleep in a system call, pc is right after its two-byte syscall. A
     * signal may make the kernel restart the call: it moves RIP back to the
     * syscall, which is strictly inside a site when the call is the site's
     * last instruction and pc its end. There it counts as inside. */
    if (*where == pc && ap_in_round(pc - 2))
        *where = pc - 2;
    return ap_task_regs(tid, &sp2, &pc2) && sp2 == sp && pc2 == pc;
}

static int ap_hs_send(pid_t pid, pid_t tid)
{
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    si.si_signo = AP_HS_SIG;
    si.si_code = SI_QUEUE;
    si.si_pid = pid;
    si.si_uid = (uid_t)ap_sys(SYS_getuid, 0, 0, 0, 0, 0);
    si.si_value.sival_ptr = (void *)&ap_hs_cookie;
    return syscall(SYS_rt_tgsigqueueinfo, pid, tid, AP_HS_SIG, &si) ? -errno : 0;
}

/** Wait (bounded) until every pending thread answered attempt @p seq. */
static void ap_hs_wait(const int8_t *state, const uint8_t *blocked, size_t n, unsigned seq)
{
    uint64_t until = ap_round_now_ns() + AP_HS_WAIT_NS;
    for (;;) {
        size_t missing = 0;
        for (size_t i = 0; i < n; i++)
            missing += (state[i] == 1 || state[i] == 2) && !blocked[i] &&
                       __atomic_load_n(&ap_hs[i].seq, __ATOMIC_ACQUIRE) != seq;
        if (!missing || ap_round_now_ns() > until)
            return;
        ap_nap();
    }
}

/*
 * Per-thread state: 0 done (seen outside every multi-instruction site, or
 * gone), 1 never answered yet, 2 last seen strictly inside item inside[i].
 * Once flip 1 is done, a thread can enter a site only through its first
 * byte (where it spins), so a thread seen outside stays outside, and a thread
 * seen inside X can only be inside X later: an attempt it does not answer
 * keeps state 2. 3: inside item inside[i] through a signal frame below a
 * handler that spins on an entry barrier; it cannot leave before the round
 * ends, so it is not asked again.
 */
static void ap_hs_attempt(struct ap_round *r, int8_t *state, long *inside, uint8_t *blocked,
                          size_t n)
{
    pid_t pid = (pid_t)syscall(SYS_getpid);
    unsigned seq = ++ap_hs_last ? ap_hs_last : ++ap_hs_last;
    __atomic_store_n(&ap_hs_seq, seq, __ATOMIC_RELEASE);
    /* Sleeping threads are located through /proc; a thread that runs is read
     * again, a short nap apart, for AP_HS_POLL_NS (it may be about to sleep,
     * and a signal then would interrupt its wait: a thread that sleeps now
     * and then is caught asleep) and signalled only when it ran all along. */
    static bool need[AP_HS_MAX];
    uint64_t poll_until = ap_round_now_ns() + AP_HS_POLL_NS;
    for (int pass = 0; pass < 3; pass = pass ? pass + 1 : ap_round_now_ns() > poll_until) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++) {
            if (pass ? !need[i] : (need[i] = state[i] == 1 || state[i] == 2, !need[i]))
                continue;
            if (__atomic_load_n(&ap_hs[i].seq, __ATOMIC_ACQUIRE) == seq) {
                need[i] = false; /* answered already (a late handler) */
                continue;
            }
            uintptr_t pc;
            r->st->syscalls += 6;
            if (ap_task_pc(ap_hs[i].tid, &pc)) {
                __atomic_store_n(&ap_hs[i].rip, pc, __ATOMIC_RELAXED);
                __atomic_store_n(&ap_hs[i].stuck, false, __ATOMIC_RELAXED);
                __atomic_store_n(&ap_hs[i].seq, seq, __ATOMIC_RELEASE);
                need[i] = false;
                continue;
            }
            if (pass < 2) {
                left++;
                continue;
            }
            /* An io_uring worker never runs user code: outside every site. */
            r->st->syscalls += 3;
            if (ap_task_io_worker(ap_hs[i].tid)) {
                state[i] = 0;
                continue;
            }
            /* A thread that blocks the signal cannot answer it: not sent
             * (nothing left pending), not waited for. */
            r->st->syscalls += 4;
            if (ap_task_blocks_hs(ap_hs[i].tid)) {
                blocked[i] = blocked[i] < 255 ? blocked[i] + 1 : 255;
                continue;
            }
            blocked[i] = 0;
            r->st->syscalls++;
            if (ap_hs_send(pid, ap_hs[i].tid) == -ESRCH)
                state[i] = 0; /* exited */
        }
        if (pass < 2 && !left)
            break;
        if (pass < 2)
            ap_nap();
    }
    ap_hs_wait(state, blocked, n, seq);
    for (size_t i = 0; i < n; i++) {
        if ((state[i] != 1 && state[i] != 2) ||
            __atomic_load_n(&ap_hs[i].seq, __ATOMIC_ACQUIRE) != seq)
            continue;
        uintptr_t at = __atomic_load_n(&ap_hs[i].rip, __ATOMIC_RELAXED);
        if (at == AP_WHERE_UNKNOWN)
            continue; /* stays 1: as if it had not answered */
        long k = ap_inside(r, at);
        /* 3: inside, and waiting for this very round to end: asking again is useless. */
        state[i] = k < 0 ? 0 : __atomic_load_n(&ap_hs[i].stuck, __ATOMIC_RELAXED) ? 3 : 2;
        inside[i] = k;
    }
}

/** Step 2: refuse the multi-instruction sites a thread is (or may be) inside. */
static int ap_handshake(struct ap_round *r)
{
    static int8_t state[AP_HS_MAX];
    static long inside[AP_HS_MAX];
    static uint8_t blocked[AP_HS_MAX]; /* attempts in a row that found the signal blocked */
    bool fits = ap_hs_collect(r->taskfd);
    size_t n = __atomic_load_n(&ap_hs_n, __ATOMIC_RELAXED);
    /* volatile: stores the compiler cannot turn into a memset() call */
    for (size_t i = 0; i < n; i++) {
        ((volatile int8_t *)state)[i] = 1;
        ((volatile uint8_t *)blocked)[i] = 0;
    }
    uint64_t until = ap_round_now_ns() + AP_HS_BUDGET_NS;
    for (size_t left = n; left;) {
        ap_hs_attempt(r, state, inside, blocked, n);
        left = 0;
        /* A thread that never answered and kept the signal blocked for
         * AP_HS_BLOCKED attempts (milliseconds: longer than the moments
         * glibc blocks every signal) is given up: it stays silent. */
        for (size_t i = 0; i < n; i++)
            left += state[i] == 2 || (state[i] == 1 && blocked[i] < AP_HS_BLOCKED);
        if (!left || ap_round_now_ns() > until)
            break;
        struct timespec ts = {0, AP_HS_PAUSE_NS};
        syscall(SYS_nanosleep, &ts, NULL);
    }
    __atomic_store_n(&ap_hs_seq, 0, __ATOMIC_RELEASE);
    bool silent = !fits;
    for (size_t i = 0; i < n; i++) {
        if (state[i] >= 2 && !r->it[inside[i]].out)
            ap_item_refuse(r, &r->it[inside[i]], ALTPATCH_REASON_LIVE_THREAD_INSIDE);
        silent |= state[i] == 1;
    }
    for (size_t i = 0; silent && i < r->n; i++)
        if (!r->it[i].out && r->it[i].multi)
            ap_item_refuse(r, &r->it[i], ALTPATCH_REASON_LIVE_NO_ANSWER);
    return 0;
}

/** Which writes need a round: same rules as ap_poke() (skip unchanged, refuse mismatches). */
static size_t ap_live_pending(struct ap_write *w, size_t n, struct ap_live_item *it)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ap_write_pending(&w[i]))
            it[k++] = (struct ap_live_item){.w = &w[i]};
    return k;
}

/**
 * Publish the multi-instruction sites of the round for ap_in_round(). The
 * buffer only grows (a late handler may still read an old one) and is filled
 * before the round. 0 or -ENOMEM.
 */
static int ap_ranges_prepare(const struct ap_round *r)
{
    static struct ap_range *buf;
    static size_t cap;
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++)
        k += !r->it[i].out && r->it[i].multi;
    __atomic_store_n(&ap_hs_nrng, 0, __ATOMIC_RELEASE);
    if (k > cap) {
        struct ap_range *nb = malloc((k > 2 * cap ? k : 2 * cap) * sizeof(*nb));
        if (!nb)
            return -ENOMEM;
        cap = k > 2 * cap ? k : 2 * cap;
        if (buf)
            ap_hs_rng_retired[ap_hs_nretired++] = buf;
        buf = nb;
    }
    k = 0;
    for (size_t i = 0; i < r->n; i++)
        if (!r->it[i].out && r->it[i].multi)
            buf[k++] = (struct ap_range){r->it[i].w->addr, r->it[i].w->addr + r->it[i].w->len};
    __atomic_store_n(&ap_hs_rng, buf, __ATOMIC_RELEASE);
    __atomic_store_n(&ap_hs_nrng, k, __ATOMIC_RELEASE);
    return 0;
}

/**
 * Step 1 for run @p k: the staging copies, every site's old bytes checked in
 * them, then the bytes of each flip written. False when the run cannot be
 * flipped (its sites fall back).
 */
static bool ap_run_stage(struct ap_round *r, size_t k)
{
    bool two = r->rstate[k] & AP_RUN_TWO;
    if (ap_flip_stage(&r->f, k, 0, r->st) || (two && ap_flip_stage(&r->f, k, 1, r->st)))
        return false;
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (it->out || it->run != (long)k)
            continue;
        const struct ap_write *w = it->w;
        if (memcmp(ap_flip_view(&r->f, k, 0, w->addr), w->old, w->len) ||
            (two && memcmp(ap_flip_view(&r->f, k, 1, w->addr), w->old, w->len)))
            return false; /* the copy is not what runs */
        if (ap_flip_put(&r->f, k, 0, w->addr, it->multi ? ap_spin : w->new,
                        it->multi ? sizeof(ap_spin) : w->len, r->st) ||
            (two && ap_flip_put(&r->f, k, 1, w->addr, w->new, w->len, r->st)))
            return false;
    }
    return true;
}

/** Flip 2 of run @p k: it must happen (threads spin on its entry barriers). */
static void ap_run_flip2(struct ap_round *r, size_t k)
{
    for (int tries = 0; tries < 1000; tries++) {
        if (!ap_flip_swap(&r->f, k, 1, r->st))
            return;
        struct timespec ts = {0, 100 * 1000};
        syscall(SYS_nanosleep, &ts, NULL);
    }
    /* Flip 2 replaces exactly the mapping flip 1 made, so the kernel has no
     * reason to refuse it; should it still, the barriers must go: put each
     * one's two old bytes back in place (the other bytes never changed). */
    int fd = r->f.memfd;
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (it->run != (long)k || !it->multi)
            continue;
        ap_procmem_write(fd, it->w->addr, it->w->old, sizeof(ap_spin));
        if (!it->out)
            it->w->result = ALTPATCH_REASON_WRITE_DENIED;
        it->out = true;
    }
}

/** Steps 2-4 (signals blocked, fork lock held). */
static void ap_round_run(struct ap_round *r)
{
    bool any_multi = false, any = false;
    for (size_t k = 0; k < r->f.nrun; k++) {
        if (r->rstate[k] & AP_RUN_DEAD)
            continue;
        if (ap_flip_swap(&r->f, k, 0, r->st)) {
            r->rstate[k] |= AP_RUN_DEAD;
            continue;
        }
        r->rstate[k] |= AP_RUN_FLIPPED;
        any = true;
    }
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (it->out || it->fallback)
            continue;
        if (r->rstate[it->run] & AP_RUN_DEAD)
            it->fallback = true, it->multi = false;
        else
            any_multi |= it->multi;
    }
    if (!any)
        return;
    ap_sync_all(r->st);
    if (any_multi)
        ap_handshake(r);
    bool two = false;
    for (size_t k = 0; k < r->f.nrun; k++) {
        if ((r->rstate[k] & (AP_RUN_FLIPPED | AP_RUN_TWO)) == (AP_RUN_FLIPPED | AP_RUN_TWO)) {
            ap_run_flip2(r, k);
            two = true;
        }
    }
    if (two)
        ap_sync_all(r->st);
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (it->out || it->fallback)
            continue;
        it->w->wrote = true;
        r->st->bytes += it->w->len;
    }
}

/** Count the other threads (0 when alone). */
static int ap_count_task(pid_t tid, void *ctx)
{
    (void)tid;
    ++*(size_t *)ctx;
    return 0;
}

/**
 * The sites whose pages cannot be flipped: written by the single-threaded
 * writer when no other thread runs, refused otherwise.
 */
static void ap_fallback(struct ap_round *r)
{
    size_t k = 0, others = 1;
    for (size_t i = 0; i < r->n; i++)
        k += !r->it[i].out && r->it[i].fallback;
    if (!k)
        return;
    if (r->taskfd >= 0) {
        others = 0;
        if (ap_tasks_each(r->taskfd, ap_count_task, &others))
            others = 1;
    }
    struct ap_write *w = others ? NULL : calloc(k, sizeof(*w));
    k = 0;
    for (size_t i = 0; w && i < r->n; i++)
        if (!r->it[i].out && r->it[i].fallback)
            w[k++] = *r->it[i].w;
    if (w)
        ap_poke(w, k, 0, r->st);
    k = 0;
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (it->out || !it->fallback)
            continue;
        if (w) {
            it->w->result = w[k].result;
            it->w->wrote = w[k].wrote;
            k++;
        } else {
            it->w->result = ALTPATCH_REASON_LIVE_NO_FLIP;
        }
        it->out = true;
    }
    free(w);
}

/**
 * Step 0 and 1 (may allocate and open): classes, runs, staging copies.
 * 0 or -errno.
 */
/** ap_tasks_each() callback: 1 when @p tid runs under a real-time policy. */
static int ap_task_realtime(pid_t tid, void *ctx)
{
    (void)ctx;
    long pol = syscall(SYS_sched_getscheduler, tid);
    /* SCHED_FIFO 1, SCHED_RR 2, SCHED_DEADLINE 6 (with SCHED_RESET_ON_FORK masked off). */
    pol &= ~0x40000000L;
    return pol == 1 || pol == 2 || pol == 6;
}

static int ap_round_prepare(struct ap_round *r, struct ap_write *w, size_t n)
{
    bool *want = calloc(n ? n : 1, sizeof(*want));
    long *run_of = calloc(n ? n : 1, sizeof(*run_of));
    int err = want && run_of ? 0 : -ENOMEM;
    int realtime = -1; /* another thread under a real-time policy (-1: not asked yet) */
    for (size_t i = 0; !err && i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        int why = ap_live_class(it->w->old, it->w->new, it->w->len, &it->multi);
        /* A thread that enters a class B site spins on its entry barrier until
         * the second flip; a real-time one could keep the applying thread off
         * its CPU for good. Asked once, only when a class B site exists. */
        if (!why && it->multi) {
            if (realtime < 0)
                realtime = ap_tasks_each(r->taskfd, ap_task_realtime, NULL) != 0;
            if (realtime)
                why = ALTPATCH_REASON_LIVE_REALTIME;
        }
        if (why) {
            it->w->result = why;
            it->out = true;
        }
        want[it->w - w] = !it->out;
    }
    if (!err)
        err = ap_flip_plan(&r->f, w, want, n, run_of);
    if (!err && !(r->rstate = calloc(r->f.nrun ? r->f.nrun : 1, 1)))
        err = -ENOMEM;
    for (size_t i = 0; !err && i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        it->run = run_of[it->w - w];
        if (it->out)
            continue;
        if (it->run < 0)
            it->fallback = true;
        else if (it->multi)
            r->rstate[it->run] |= AP_RUN_TWO;
    }
    for (size_t k = 0; !err && k < r->f.nrun; k++)
        if (!ap_run_stage(r, k))
            r->rstate[k] |= AP_RUN_DEAD;
    for (size_t i = 0; !err && i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (!it->out && !it->fallback && (r->rstate[it->run] & AP_RUN_DEAD))
            it->fallback = true;
        if (it->fallback)
            it->multi = false; /* not in the handshake's ranges */
    }
    free(want);
    free(run_of);
    return err;
}

int ap_live_poke(struct ap_write *w, size_t n, struct ap_poke_stats *st)
{
    struct ap_poke_stats dummy = {0};
    struct ap_round r = {.st = st ? st : &dummy, .taskfd = -1};
    r.f.memfd = -1;
    r.it = calloc(n ? n : 1, sizeof(*r.it));
    if (!r.it) {
        /* every write gets its result, as on the round's own errors: one
         * that memory does not already hold is refused, nothing written */
        for (size_t i = 0; i < n; i++)
            if (ap_write_pending(&w[i]))
                w[i].result = ALTPATCH_REASON_WRITE_DENIED;
        return -ENOMEM;
    }
    r.n = ap_live_pending(w, n, r.it);
    int err = 0;
    if (r.n) {
        /* Everything the round needs is allocated, mapped and opened here. */
        r.taskfd = ap_task_dir_open();
        r.st->syscalls++;
        err = r.taskfd < 0 ? r.taskfd : ap_round_prepare(&r, w, n);
        if (!err)
            err = ap_ranges_prepare(&r);
        if (!err) {
            bool any_multi = false;
            for (size_t i = 0; i < r.n; i++)
                any_multi |= !r.it[i].out && r.it[i].multi;
            if (any_multi)
                ap_restorers_scan(); /* for the handshake's frame search */
            uint64_t mask;
            ap_signals_block(AP_SIGNALS_ALL, &mask);
            pthread_mutex_lock(&ap_fork_lock);
            ap_round_run(&r);
            pthread_mutex_unlock(&ap_fork_lock);
            ap_signals_restore(&mask);
        }
        ap_flip_release(&r.f);
        if (!err)
            ap_fallback(&r);
        if (r.taskfd >= 0)
            close(r.taskfd);
        r.st->syscalls++;
    }
    for (size_t i = 0; err && i < r.n; i++)
        if (!r.it[i].w->result)
            r.it[i].w->result = ALTPATCH_REASON_WRITE_DENIED;
    r.st->pages += ap_pages_written(w, n, (uintptr_t)sysconf(_SC_PAGESIZE));
    free(r.rstate);
    free(r.it);
    return err;
}

/* ------------------------------------------------------------------------- */
/* Readiness                                                                 */
/* ------------------------------------------------------------------------- */

/**
 * The oracle, once per process: does this machine execute what a flip moves
 * in? An emulator that translates code once (qemu-user) may keep running the
 * old bytes. A scratch copy of a page of our own text gets a function
 * returning 1, is called, is replaced by a flip with one returning 2, and is
 * called again. 0 when it returned 2.
 */
static int ap_flip_selftest(void)
{
    uint8_t one[AP_SELFTEST_FN_LEN], two[AP_SELFTEST_FN_LEN];
    ap_selftest_fn(one, 1);
    ap_selftest_fn(two, 2);
    struct ap_poke_stats st = {0};
    struct ap_write self = {.addr = (uintptr_t)ap_flip_selftest, .len = 1};
    bool want = true;
    long run = -1;
    struct ap_flip f;
    /* A staging copy of our own page: file-backed, executable, not in use. */
    int err = ap_flip_plan(&f, &self, &want, 1, &run);
    if (!err && (run < 0 || (err = ap_flip_stage(&f, 0, 0, &st)) != 0))
        err = err ? err : -ENOENT;
    uint8_t *page = NULL;
    size_t len = 0;
    if (!err) {
        page = f.run[0].stage[0], len = f.run[0].len;
        f.run[0].stage[0] = NULL; /* ours now */
        err = ap_procmem_write(f.memfd, (uintptr_t)page, one, sizeof(one));
    }
    ap_flip_release(&f);
    long (*fn)(void) = (long (*)(void))(uintptr_t)page;
    if (!err && (memcmp(page, one, sizeof(one)) || fn() != 1))
        err = -ENOEXEC;
    if (!err) {
        struct ap_write w = {.addr = (uintptr_t)page, .old = one, .new = two, .len = sizeof(one)};
        err = ap_flip_plan(&f, &w, &want, 1, &run);
        if (!err && run < 0)
            err = -ENOENT;
        if (!err)
            err = ap_flip_stage(&f, (size_t)run, 0, &st);
        if (!err)
            err = ap_flip_put(&f, (size_t)run, 0, w.addr, two, sizeof(two), &st);
        if (!err)
            err = ap_flip_swap(&f, (size_t)run, 0, &st);
        ap_flip_release(&f);
        if (!err)
            ap_sync_all(&st);
        if (!err && (memcmp(page, two, sizeof(two)) || fn() != 2))
            err = -ENOEXEC;
    }
    if (page)
        munmap(page, len);
    return err;
}

int ap_live_ready(const char **why)
{
    static const char *const msgs[] = {
        "membarrier(PRIVATE_EXPEDITED_SYNC_CORE) is not available",
        "/proc/self/mem cannot be opened for writing",
        "the handshake signal handler cannot be installed",
        "text pages cannot be replaced, or flipped code is not executed (an emulator)",
    };
    static int flip_ok = 1; /* 1: not tried yet; then 0 or -errno */
    int err = ap_membarrier_register();
    if (err) {
        *why = msgs[0];
        return err;
    }
    int fd = ap_procmem_open();
    if (fd < 0) {
        *why = msgs[1];
        return fd;
    }
    close(fd);
    err = ap_install(AP_HS_SIG, ap_hs_handler, 0, &ap_prev_hs);
    if (err) {
        *why = msgs[2];
        return err;
    }
    ap_frames_init();
    if (flip_ok == 1)
        flip_ok = ap_flip_selftest();
    if (flip_ok)
        *why = msgs[3];
    return flip_ok;
}
