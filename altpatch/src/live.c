/* SPDX-License-Identifier: MIT */
/*
 * Live re-patching: rewriting sites while other threads may execute them.
 *
 * This is the x86 side of the writer. poke.c knows nothing of x86; the int3
 * byte, the RIP fixup in the SIGTRAP handler and the instruction-level safety
 * rules live here. Bytes are written through /proc/self/mem (writer.c), which
 * never changes a page's protection (an RW window would make the page
 * non-executable for the threads running on it).
 *
 * One round per batch (every site an apply changes), the kernel's
 * cross-modifying-code protocol:
 *
 *   0. refuse sites that are not live-patchable (a call that is not the last
 *      instruction: its return address lies inside the site);
 *   1. busy := 1; write int3 (0xcc) on the first byte of every site;
 *      membarrier(PRIVATE_EXPEDITED_SYNC_CORE);
 *   2. handshake (only when a multi-instruction site is in the batch): signal
 *      every other thread, each reports the RIP it was interrupted at; a site
 *      some thread is strictly inside is retried for a bounded time, then
 *      refused (its first byte restored); a thread that does not answer makes
 *      every multi-instruction site of the round refused;
 *   3. write every byte but the first; membarrier;
 *   4. write the first bytes; membarrier; busy := 0.
 *
 * A thread that executes one of the int3s gets SIGTRAP; the handler sees
 * RIP-1 is a site of a live round, waits until the round is over (busy == 0),
 * sets RIP back to the site start and returns: the thread runs the final
 * bytes. SIGTRAPs that are not ours go to the handler installed before.
 *
 * Why the handshake is enough: once the int3s are in, a thread can enter a
 * site only through its first byte (it traps) or by returning into it (refused
 * in step 0); so when every thread has been seen outside every
 * multi-instruction site after step 1, none can be inside while its bytes
 * change. A single-instruction original has no interior boundary: nobody can
 * be strictly inside it, no handshake is needed. See docs/live.md for the
 * limits (blocked signals, nested signal handlers).
 *
 * Nomenclature: "round" = steps 1-4 for one batch; "busy" = the global flag
 * telling the trap handler that int3s of a round may be in memory; "live set"
 * = every address written live in a module still loaded (the handler's lookup
 * table, published as immutable snapshots).
 */
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <asm/prctl.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define AP_INT3 0xcc
/** Threads the handshake can track; more -> multi-instruction sites are refused. */
#define AP_HS_MAX 1024
/** How long the handshake may take in all, and how long one attempt waits for answers. */
#define AP_HS_BUDGET_NS (250 * 1000 * 1000)
#define AP_HS_WAIT_NS (25 * 1000 * 1000)
/** Pause between two attempts (threads inside a site get time to leave it). */
#define AP_HS_PAUSE_NS (1000 * 1000)
/** The handshake signal: a real-time one, so that it never merges with an int3's SIGTRAP. */
#define AP_HS_SIG (SIGRTMAX - 3)

/* ------------------------------------------------------------------------- */
/* Raw system calls (no libc interposition: ASan, fork handlers)             */
/* ------------------------------------------------------------------------- */

static pid_t ap_gettid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

static void ap_pause(void)
{
    __asm__ __volatile__("pause" ::: "memory");
}

/* ------------------------------------------------------------------------- */
/* Threads, read from /proc without allocating                               */
/* ------------------------------------------------------------------------- */

/*
 * Between the first int3 and the last write the applying thread must not call
 * anything that may run a site of the round (a malloc or opendir wrapper of
 * the program can hold one): it would trap with every signal blocked. So the
 * round reads /proc with raw system calls into static buffers, on a
 * /proc/self/task descriptor opened before the round.
 */

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
    char *p = ap_put_dec(path + strlen(path), (unsigned long)tid);
    *p++ = '/';
    size_t fl = strlen(file);
    memcpy(p, file, fl + 1);
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

/** Hexadecimal value after "@p key:" in @p text (a /proc status file); 0 when absent. */
static uint64_t ap_status_hex(const char *text, const char *key)
{
    size_t kl = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, key, kl) || l[kl] != ':')
            continue;
        uint64_t v = 0;
        for (const char *c = l + kl + 1; *c && *c != '\n'; c++) {
            int d = *c >= '0' && *c <= '9'   ? *c - '0'
                    : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10
                                             : -1;
            if (d >= 0)
                v = v << 4 | (uint64_t)d;
        }
        return v;
    }
    return 0;
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
/* Who cannot take SIGTRAP                                                   */
/* ------------------------------------------------------------------------- */

/*
 * The kernel forces the SIGTRAP of an int3 on the thread that executed it: when
 * that thread blocks or ignores SIGTRAP, the action is reset to the default and
 * the process dies. So no int3 goes into memory while some thread of the
 * process blocks, ignores or already has pending SIGTRAP, or while a signal
 * handler runs with SIGTRAP in its sa_mask (a site run by that handler would
 * trap with SIGTRAP blocked): the apply is refused with -EBUSY and the reason
 * names the thread or the signal.
 */

static char ap_trap_why[160];

/** The sa_restorer of the process' handlers: marks signal frames (see ap_frames_find). */
#define AP_RESTORERS 4
static uintptr_t ap_restorer[AP_RESTORERS];
static size_t ap_nrestorer;

#define AP_SIGTRAP_BIT (1ull << (SIGTRAP - 1))

static int ap_trap_check_task(pid_t tid, void *ctx)
{
    static char st[4096];
    (void)ctx;
    if (ap_task_read(tid, "status", st, sizeof(st)) <= 0)
        return 0; /* exited meanwhile */
    const char *what = NULL;
    if (ap_status_hex(st, "SigBlk") & AP_SIGTRAP_BIT)
        what = "blocks SIGTRAP";
    else if (ap_status_hex(st, "SigIgn") & AP_SIGTRAP_BIT)
        what = "ignores SIGTRAP";
    if (!what)
        return 0;
    char name[20] = "?";
    const char *n = strstr(st, "Name:\t");
    if (n) {
        n += 6;
        size_t k = 0;
        while (n[k] && n[k] != '\n' && k < sizeof(name) - 1) {
            name[k] = n[k];
            k++;
        }
        name[k] = 0;
    }
    char *p = ap_put_dec(memcpy(ap_trap_why, "thread ", 7) + 7, (unsigned long)tid);
    size_t left = sizeof(ap_trap_why) - (size_t)(p - ap_trap_why);
    snprintf(p, left, " (%s) %s: an int3 it runs would kill the process", name, what);
    return -EBUSY;
}

/** Signal handlers that run with SIGTRAP blocked. Not used during a round (sigaction is libc). */
static void ap_note_restorer(const struct sigaction *sa)
{
    uintptr_t r = (uintptr_t)sa->sa_restorer;
    for (size_t i = 0; i < ap_nrestorer; i++)
        if (ap_restorer[i] == r)
            return;
    if (r && ap_nrestorer < AP_RESTORERS) {
        ap_restorer[ap_nrestorer] = r;
        __atomic_store_n(&ap_nrestorer, ap_nrestorer + 1, __ATOMIC_RELEASE);
    }
}

static int ap_trap_check_handlers(void)
{
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa))
            continue;
        if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
            continue;
        ap_note_restorer(&sa);
        if (sig == SIGTRAP)
            continue;
        if (sigismember(&sa.sa_mask, SIGTRAP)) {
            snprintf(ap_trap_why, sizeof(ap_trap_why),
                     "the handler of signal %d blocks SIGTRAP (sa_mask): an int3 it runs would "
                     "kill the process",
                     sig);
            return -EBUSY;
        }
    }
    return 0;
}

static int ap_count_task(pid_t tid, void *ctx)
{
    (void)tid;
    ++*(size_t *)ctx;
    return 0;
}

/**
 * 0 when every other thread can take the SIGTRAP of an int3; -EBUSY with
 * ap_trap_why set otherwise (or when /proc/self/task cannot be read).
 */
static int ap_trap_check(int dirfd)
{
    size_t others = 0;
    int err = ap_tasks_each(dirfd, ap_count_task, &others);
    if (!err && !others) {
        ap_trap_check_handlers(); /* for the restorers only */
        return 0; /* the applying thread blocks every signal during the round */
    }
    /* glibc blocks every signal for a moment in pthread_kill(), pthread_create(),
     * fork(), ...: a block that goes away within a few milliseconds is no reason
     * to refuse. */
    for (int tries = 0; !err; tries++) {
        err = ap_tasks_each(dirfd, ap_trap_check_task, NULL);
        if (err != -EBUSY || tries == 20)
            break;
        struct timespec ts = {0, 100 * 1000};
        syscall(SYS_nanosleep, &ts, NULL);
        err = 0;
    }
    if (!err)
        err = ap_trap_check_handlers();
    if (err && err != -EBUSY) {
        snprintf(ap_trap_why, sizeof(ap_trap_why), "/proc/self/task cannot be read");
        err = -EBUSY;
    }
    return err;
}

/* ------------------------------------------------------------------------- */
/* The live set: addresses the trap handler recognizes                       */
/* ------------------------------------------------------------------------- */

struct ap_live_set {
    struct ap_live_set *retired; /* next older snapshot waiting to be freed */
    size_t n;
    uintptr_t a[]; /* sorted */
};

/*
 * Current snapshot. A trap handler reads it between an increment and a
 * decrement of ap_set_readers; the writer (under the apply lock) replaces it
 * and frees the snapshots it replaced once it sees no reader: a reader that
 * starts after that sees the new snapshot (sequentially consistent order).
 * The set holds the sites of loaded modules only (ap_live_forget() drops an
 * unloaded module's addresses), so its size follows what is loaded.
 */
static struct ap_live_set *ap_live_sites;
static int ap_set_readers;
static struct ap_live_set *ap_set_retired; /* replaced snapshots not freed yet */
/** 1 while int3s of a round may be in memory. */
static int ap_live_busy;

static bool ap_set_has(const struct ap_live_set *s, uintptr_t a)
{
    size_t lo = 0, hi = s ? s->n : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->a[mid] == a)
            return true;
        if (s->a[mid] < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/** The handler's lookup (async-signal-safe). */
static bool ap_set_lookup(uintptr_t a)
{
    __atomic_add_fetch(&ap_set_readers, 1, __ATOMIC_SEQ_CST);
    bool has = ap_set_has(__atomic_load_n(&ap_live_sites, __ATOMIC_SEQ_CST), a);
    __atomic_sub_fetch(&ap_set_readers, 1, __ATOMIC_SEQ_CST);
    return has;
}

/** Make @p s current; free the replaced snapshots no handler can be reading. */
static void ap_set_publish(struct ap_live_set *s)
{
    struct ap_live_set *old = __atomic_exchange_n(&ap_live_sites, s, __ATOMIC_SEQ_CST);
    if (old) {
        old->retired = ap_set_retired;
        ap_set_retired = old;
    }
    if (__atomic_load_n(&ap_set_readers, __ATOMIC_SEQ_CST) != 0)
        return; /* a handler may hold one: the next publish tries again */
    while (ap_set_retired) {
        struct ap_live_set *next = ap_set_retired->retired;
        free(ap_set_retired);
        ap_set_retired = next;
    }
}

/** Publish old set + the addresses of @p w (sorted by address). 0 or -ENOMEM. */
static int ap_set_add(const struct ap_write *w, size_t n)
{
    struct ap_live_set *old = __atomic_load_n(&ap_live_sites, __ATOMIC_ACQUIRE);
    size_t fresh = 0;
    for (size_t i = 0; i < n; i++)
        fresh += !ap_set_has(old, w[i].addr);
    if (!fresh)
        return 0;
    size_t on = old ? old->n : 0, total = on + fresh;
    struct ap_live_set *s = malloc(sizeof(*s) + total * sizeof(uintptr_t));
    if (!s)
        return -ENOMEM;
    size_t i = 0, j = 0, k = 0;
    while (i < on || j < n) {
        if (j < n && ap_set_has(old, w[j].addr)) {
            j++;
            continue;
        }
        if (j >= n || (i < on && old->a[i] < w[j].addr))
            s->a[k++] = old->a[i++];
        else
            s->a[k++] = w[j++].addr;
    }
    s->n = k;
    s->retired = NULL;
    ap_set_publish(s);
    return 0;
}

void ap_live_forget(uintptr_t start, uintptr_t end)
{
    struct ap_live_set *old = __atomic_load_n(&ap_live_sites, __ATOMIC_ACQUIRE);
    size_t drop = 0;
    for (size_t i = 0; old && i < old->n; i++)
        drop += old->a[i] >= start && old->a[i] < end;
    if (!drop)
        return;
    struct ap_live_set *s = malloc(sizeof(*s) + (old->n - drop) * sizeof(uintptr_t));
    if (!s)
        return; /* keeps the addresses: a larger set, never a wrong one */
    size_t k = 0;
    for (size_t i = 0; i < old->n; i++)
        if (old->a[i] < start || old->a[i] >= end)
            s->a[k++] = old->a[i];
    s->n = k;
    s->retired = NULL;
    ap_set_publish(s);
}

/* ------------------------------------------------------------------------- */
/* Handshake: where is every other thread?                                   */
/* ------------------------------------------------------------------------- */

struct ap_hs_slot {
    pid_t tid;
    unsigned seq;  /* the handshake attempt this answer belongs to */
    uintptr_t rip; /* where the thread was interrupted */
    bool stuck;    /* it waits in the trap handler: it cannot move before the round ends */
};

static struct ap_hs_slot ap_hs[AP_HS_MAX];
static size_t ap_hs_n;
static unsigned ap_hs_seq; /* current attempt; 0 = no handshake running */
static unsigned ap_hs_last;
static const char ap_hs_cookie = 'L'; /* si_value of our handshake signals */

/*
 * Signal frames. A thread that runs a signal handler was interrupted
 * somewhere, maybe strictly inside a multi-instruction site; its RIP (in the
 * handler) does not tell. The interrupted context lies in the handler's
 * rt_sigframe, on the thread's stack above the handler's frames: the return
 * address of the handler (the sa_restorer of the process' handlers, glibc's
 * __restore_rt), then the ucontext. So a thread's answer also looks up its
 * stack (and the stacks the frames it finds were interrupted on) for such
 * frames, and answers with a saved RIP that lies inside a multi-instruction
 * site of the round, when one does. Memory is read with process_vm_readv()
 * on our own pid, which fails on unmapped or PROT_NONE memory (it cannot
 * fault); a word that merely looks like a frame can only make a site refused.
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
/*
 * Our own handlers mark their frames (uc_link, which sigreturn ignores): a
 * thread waiting in the trap handler is at the site start, not at the int3's
 * RIP, and the frames our handlers leave behind on the stack are not live.
 */
#define AP_OUR_FRAME ((struct ucontext_t *)1)
/** process_vm_readv() works on our own memory (a seccomp filter may deny it). */
static bool ap_peek_ok;
/** An answer that locates nothing: the stacks cannot be read (the thread counts as silent). */
#define AP_WHERE_UNKNOWN ((uintptr_t)1)
/** How far up one stack the frames are looked for. */
#define AP_SCAN_MAX (256 * 1024)

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

/** Copy @p len bytes at @p addr of our own memory; bytes copied, or -1 (cannot fault). */
static long ap_peek(uintptr_t addr, void *dst, size_t len)
{
    struct iovec l = {dst, len}, r = {(void *)addr, len};
    return syscall(SYS_process_vm_readv, syscall(SYS_getpid), &l, 1UL, &r, 1UL, 0UL);
}

static bool ap_is_restorer(uint64_t v)
{
    for (size_t i = 0; i < ap_nrestorer; i++)
        if (ap_restorer[i] == v)
            return true;
    return false;
}

/**
 * A RIP saved in a signal frame on the stack from @p sp up that lies inside a
 * multi-instruction site of the round, or 0. @p depth bounds the stacks followed.
 */
static uintptr_t ap_frames_find(uintptr_t sp, uintptr_t top, uint64_t *buf, size_t size,
                                int depth)
{
    enum { HDR = offsetof(ucontext_t, uc_mcontext) + sizeof(gregset_t) };
    uintptr_t base = sp & ~(uintptr_t)7, end = base + AP_SCAN_MAX;
    if (top > base && top < end)
        end = top;
    for (uintptr_t a = base; a < end; a += size) {
        long n = ap_peek(a, buf, a + size <= end ? size : end - a);
        if (n <= 0)
            return 0;
        for (long i = 0; i < n / 8; i++) {
            if (!ap_is_restorer(buf[i]))
                continue;
            union {
                ucontext_t uc;
                char b[HDR];
            } u;
            if (ap_peek(a + (uintptr_t)i * 8 + 8, u.b, HDR) != HDR || u.uc.uc_link ||
                (u.uc.uc_mcontext.gregs[REG_CSGSFS] & 0xffff) != 0x33)
                continue;
            uintptr_t rip = (uintptr_t)u.uc.uc_mcontext.gregs[REG_RIP];
            uintptr_t rsp = (uintptr_t)u.uc.uc_mcontext.gregs[REG_RSP];
            if (ap_in_round(rip))
                return rip;
            /* Interrupted on another stack (a sigaltstack handler): look there too. */
            if (depth > 0 && (rsp < base || rsp >= end)) {
                uintptr_t in = ap_frames_find(rsp, 0, buf, size, depth - 1);
                if (in)
                    return in;
            }
        }
        if (n < (long)size)
            return 0;
    }
    return 0;
}

/**
 * What a thread interrupted at @p rip with stack pointer @p rsp answers.
 * @p top: where its stack ends, when known (0: where the mapping ends).
 */
static uintptr_t ap_hs_where(uintptr_t rip, uintptr_t rsp, uintptr_t top, uint64_t *buf,
                             size_t size)
{
    if (ap_in_round(rip) || !ap_nrestorer)
        return rip;
    if (!ap_peek_ok)
        return AP_WHERE_UNKNOWN;
    uintptr_t in = ap_frames_find(rsp, top, buf, size, 3);
    return in ? in : rip;
}

/**
 * The calling thread's answer: glibc puts a thread's control block (its
 * %fs base) right above the stack it allocated, which bounds the search;
 * otherwise (the main thread, a stack of the program's) the mapping's end does.
 */
static uintptr_t ap_hs_where_self(uintptr_t rip, uintptr_t rsp)
{
    uint64_t buf[64];
    unsigned long tcb = 0; /* asked, not read through %fs: a thread may have none */
    if (syscall(SYS_arch_prctl, ARCH_GET_FS, &tcb))
        tcb = 0;
    return ap_hs_where(rip, rsp, (uintptr_t)tcb, buf, sizeof(buf));
}

/** Answer the running handshake (if any) for thread @p tid, at @p rip (see ap_hs_where). */
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

static struct sigaction ap_prev_trap, ap_prev_hs; /* actions installed before ours */

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

/** True when the int3 at @p at belongs to a live round (current or past). */
static bool ap_is_our_int3(uintptr_t at)
{
    if (!ap_set_lookup(at))
        return false;
    return __atomic_load_n(&ap_live_busy, __ATOMIC_ACQUIRE) ||
           *(const volatile uint8_t *)at != AP_INT3;
}

/**
 * Wait until the round is over; answer handshakes meanwhile: we sit at the
 * site start @p at, unless a signal frame below us was interrupted inside a
 * site (a handler that runs sites; @p sp is our interrupted stack pointer).
 */
static void ap_park(uintptr_t at, uintptr_t sp)
{
    pid_t tid = ap_gettid();
    unsigned seen = 0;
    uintptr_t where = at;
    for (unsigned spins = 1; __atomic_load_n(&ap_live_busy, __ATOMIC_ACQUIRE); spins++) {
        unsigned seq = __atomic_load_n(&ap_hs_seq, __ATOMIC_ACQUIRE);
        if (seq && seq != seen) {
            where = ap_hs_where_self(at, sp);
            seen = seq;
        }
        ap_hs_answer(tid, where, where != at);
        if (spins % 64 == 0)
            syscall(SYS_sched_yield);
        else
            ap_pause();
    }
    ap_sync_core();
}

static void ap_trap_handler(int sig, siginfo_t *si, void *ucv)
{
    int saved = errno;
    ucontext_t *uc = ucv;
    uintptr_t rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (si->si_code == SI_KERNEL && ap_is_our_int3(rip - 1)) {
        uc->uc_link = AP_OUR_FRAME;
        /* SA_NODEFER: SIGTRAP stays open while we wait, so a signal handler
         * that runs here (even before our first instruction) and executes a
         * site of the round traps again instead of being killed. */
        ap_park(rip - 1, (uintptr_t)uc->uc_mcontext.gregs[REG_RSP]);
        uc->uc_mcontext.gregs[REG_RIP] = (greg_t)(rip - 1);
    } else {
        ap_chain(&ap_prev_trap, sig, si, ucv);
    }
    errno = saved;
}

static void ap_hs_handler(int sig, siginfo_t *si, void *ucv)
{
    int saved = errno;
    ucontext_t *uc = ucv;
    if (ap_is_handshake(si)) {
        uc->uc_link = AP_OUR_FRAME;
        ap_hs_answer(ap_gettid(), ap_hs_where_self((uintptr_t)uc->uc_mcontext.gregs[REG_RIP],
                                                   (uintptr_t)uc->uc_mcontext.gregs[REG_RSP]),
                     false);
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

/* fork() waits while a round runs: no child starts with int3s in its text
 * (registered by apply.c, after its own lock). */
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

int ap_live_ready(const char **why)
{
    static const char *const msgs[] = {
        "membarrier(PRIVATE_EXPEDITED_SYNC_CORE) is not available",
        "/proc/self/mem cannot be opened for writing",
        "the SIGTRAP or handshake signal handler cannot be installed",
    };
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
    err = ap_install(SIGTRAP, ap_trap_handler, SA_NODEFER, &ap_prev_trap);
    if (!err)
        err = ap_install(AP_HS_SIG, ap_hs_handler, 0, &ap_prev_hs);
    if (err) {
        *why = msgs[2];
        return err;
    }
    uint64_t probe = 0x5a, got = 0;
    ap_peek_ok = ap_peek((uintptr_t)&probe, &got, sizeof(got)) == sizeof(got) && got == probe;
    int dirfd = ap_task_dir_open();
    err = dirfd < 0 ? dirfd : ap_trap_check(dirfd);
    if (dirfd >= 0)
        close(dirfd);
    if (err)
        *why = dirfd < 0 ? "/proc/self/task cannot be opened" : ap_trap_why;
    return err;
}

/* ------------------------------------------------------------------------- */
/* Classifying sites                                                         */
/* ------------------------------------------------------------------------- */

/**
 * Count the instructions of @p len bytes; *call_inside := a call that is not
 * the last instruction. Returns -1 when the bytes do not decode.
 */
static int ap_count_insns(const uint8_t *p, size_t len, bool *call_inside)
{
    int n = 0;
    *call_inside = false;
    for (size_t off = 0; off < len; n++) {
        struct ap_insn in;
        if (ap_insn_decode(p + off, len - off, &in) < 0)
            return -1;
        if (off + in.len < len && in.is_call)
            *call_inside = true;
        off += in.len;
    }
    return n;
}

/* ------------------------------------------------------------------------- */
/* One round                                                                 */
/* ------------------------------------------------------------------------- */

struct ap_live_item {
    struct ap_write *w;
    bool multi; /* the bytes in memory hold more than one instruction */
    bool out;   /* refused or failed: no further step for this site */
};

struct ap_round {
    struct ap_live_item *it;
    size_t n;
    int fd;
    int taskfd; /* /proc/self/task, opened before the round */
    struct ap_poke_stats *st;
};

/** pwrite through /proc/self/mem (writer.c); counts it. */
static int ap_rw(struct ap_round *r, uintptr_t addr, const uint8_t *src, size_t len)
{
    r->st->syscalls++;
    int err = ap_procmem_write(r->fd, addr, src, len);
    if (!err)
        r->st->procmem_writes++;
    return err;
}

/** Take @p it out of the round with @p reason; its first byte back to the original. */
static void ap_item_refuse(struct ap_round *r, struct ap_live_item *it, int reason)
{
    ap_rw(r, it->w->addr, it->w->old, 1);
    it->w->result = reason;
    it->out = true;
}

/** Step 0: decide which pending writes may go live. Returns how many may. */
static size_t ap_classify(struct ap_round *r)
{
    size_t ok = 0;
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        bool call_old, call_new;
        int nold = ap_count_insns(it->w->old, it->w->len, &call_old);
        int nnew = ap_count_insns(it->w->new, it->w->len, &call_new);
        it->multi = nold != 1;
        if (nold < 0 || nnew < 0 || call_old || call_new) {
            it->w->result = ALTPATCH_REASON_LIVE_CALL_INSIDE;
            it->out = true;
            continue;
        }
        ok++;
    }
    return ok;
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
 * at pc after the int3s went in answers the handshake as well as a signal
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
 * Where a sleeping thread is (see ap_hs_where: a signal frame on its stack
 * may hold a RIP inside a site). Its stack is read while it sleeps, so the
 * registers are read again after: a thread that moved meanwhile is not
 * located this way.
 */
static bool ap_task_pc(pid_t tid, uintptr_t *where)
{
    uintptr_t sp, pc, sp2, pc2;
    if (!ap_task_regs(tid, &sp, &pc))
        return false;
    static uint64_t buf[2048];
    *where = ap_hs_where(pc, sp, 0, buf, sizeof(buf));
    return ap_task_regs(tid, &sp2, &pc2) && sp2 == sp && pc2 == pc;
}

static int ap_hs_send(pid_t pid, pid_t tid)
{
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    si.si_signo = AP_HS_SIG;
    si.si_code = SI_QUEUE;
    si.si_pid = pid;
    si.si_uid = getuid();
    si.si_value.sival_ptr = (void *)&ap_hs_cookie;
    return syscall(SYS_rt_tgsigqueueinfo, pid, tid, AP_HS_SIG, &si) ? -errno : 0;
}

/** Wait (bounded) until every pending thread answered attempt @p seq. */
static void ap_hs_wait(const int8_t *state, size_t n, unsigned seq)
{
    uint64_t until = ap_now_ns() + AP_HS_WAIT_NS;
    for (;;) {
        size_t missing = 0;
        for (size_t i = 0; i < n; i++)
            missing += (state[i] == 1 || state[i] == 2) &&
                       __atomic_load_n(&ap_hs[i].seq, __ATOMIC_ACQUIRE) != seq;
        if (!missing || ap_now_ns() > until)
            return;
        syscall(SYS_sched_yield);
    }
}

/*
 * Per-thread state: 0 done (seen outside every multi-instruction site, or
 * gone), 1 never answered yet, 2 last seen strictly inside item inside[i].
 * Once the int3s are in, a thread can enter a site only through its first
 * byte, so a thread seen outside stays outside, and a thread seen inside X
 * can only be inside X later: an attempt it does not answer keeps state 2.
 * 3: inside item inside[i] through a signal frame below the trap handler it
 * waits in; it cannot leave before the round ends, so it is not asked again.
 */
static void ap_hs_attempt(struct ap_round *r, int8_t *state, long *inside, size_t n)
{
    pid_t pid = (pid_t)syscall(SYS_getpid);
    unsigned seq = ++ap_hs_last ? ap_hs_last : ++ap_hs_last;
    __atomic_store_n(&ap_hs_seq, seq, __ATOMIC_RELEASE);
    /* Sleeping threads are located through /proc; a thread that runs is read
     * again after a yield (it may be about to sleep: a signal then would
     * interrupt its wait) and signalled only when it still runs. */
    static bool need[AP_HS_MAX];
    for (int pass = 0; pass < 3; pass++) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++) {
            if (pass ? !need[i] : (need[i] = state[i] == 1 || state[i] == 2, !need[i]))
                continue;
            if (__atomic_load_n(&ap_hs[i].seq, __ATOMIC_ACQUIRE) == seq) {
                need[i] = false; /* answered from the trap handler */
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
            r->st->syscalls++;
            if (ap_hs_send(pid, ap_hs[i].tid) == -ESRCH)
                state[i] = 0; /* exited */
        }
        if (pass < 2 && !left)
            break;
        if (pass < 2)
            syscall(SYS_sched_yield);
    }
    ap_hs_wait(state, n, seq);
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
    bool fits = ap_hs_collect(r->taskfd);
    size_t n = __atomic_load_n(&ap_hs_n, __ATOMIC_RELAXED);
    memset(state, 1, n);
    uint64_t until = ap_now_ns() + AP_HS_BUDGET_NS;
    for (size_t left = n; left;) {
        ap_hs_attempt(r, state, inside, n);
        left = 0;
        for (size_t i = 0; i < n; i++)
            left += state[i] == 1 || state[i] == 2;
        if (!left || ap_now_ns() > until)
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

/** Steps 1-4 for the items not yet out. */
static void ap_round_run(struct ap_round *r)
{
    static const uint8_t int3 = AP_INT3;
    bool any_multi = false;
    __atomic_store_n(&ap_live_busy, 1, __ATOMIC_SEQ_CST);
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (it->out)
            continue;
        if (ap_rw(r, it->w->addr, &int3, 1)) {
            it->w->result = ALTPATCH_REASON_WRITE_DENIED;
            it->out = true;
        }
        any_multi |= !it->out && it->multi;
    }
    ap_sync_all(r->st);
    if (any_multi && ap_handshake(r) < 0)
        for (size_t i = 0; i < r->n; i++)
            if (!r->it[i].out && r->it[i].multi)
                ap_item_refuse(r, &r->it[i], ALTPATCH_REASON_LIVE_NO_ANSWER);
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (!it->out && it->w->len > 1 &&
            ap_rw(r, it->w->addr + 1, it->w->new + 1, it->w->len - 1)) {
            /* Part of the tail may have landed: put the original back. */
            ap_rw(r, it->w->addr + 1, it->w->old + 1, it->w->len - 1);
            ap_item_refuse(r, it, ALTPATCH_REASON_WRITE_DENIED);
        }
    }
    ap_sync_all(r->st);
    for (size_t i = 0; i < r->n; i++) {
        struct ap_live_item *it = &r->it[i];
        if (it->out)
            continue;
        if (ap_rw(r, it->w->addr, it->w->new, 1)) {
            /* The int3 stays a trap: put the original back, byte by byte. */
            ap_rw(r, it->w->addr + 1, it->w->old + 1, it->w->len - 1);
            ap_item_refuse(r, it, ALTPATCH_REASON_WRITE_DENIED);
            continue;
        }
        it->w->wrote = true;
        r->st->bytes += it->w->len;
    }
    ap_sync_all(r->st);
    __atomic_store_n(&ap_live_busy, 0, __ATOMIC_SEQ_CST);
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

int ap_live_poke(struct ap_write *w, size_t n, struct ap_poke_stats *st)
{
    struct ap_poke_stats dummy = {0};
    struct ap_round r = {.st = st ? st : &dummy, .fd = -1, .taskfd = -1};
    r.it = calloc(n ? n : 1, sizeof(*r.it));
    if (!r.it)
        return -ENOMEM;
    r.n = ap_live_pending(w, n, r.it);
    int err = 0;
    if (r.n && ap_classify(&r)) {
        /* Everything the round needs is allocated and opened here (see ap_tasks_each). */
        r.fd = ap_procmem_open();
        r.taskfd = ap_task_dir_open();
        r.st->syscalls += 2;
        err = r.fd < 0 ? r.fd : r.taskfd < 0 ? r.taskfd : ap_set_add(w, n);
        if (!err)
            err = ap_ranges_prepare(&r);
        if (!err) {
            uint64_t mask;
            ap_signals_block(&mask);
            pthread_mutex_lock(&ap_fork_lock);
            /* Again, right before the first int3: threads change their masks. */
            err = ap_trap_check(r.taskfd);
            if (!err)
                ap_round_run(&r);
            pthread_mutex_unlock(&ap_fork_lock);
            ap_signals_restore(&mask);
            if (err)
                ap_log(ALTPATCH_WARN, "live patching refused: %s\n", ap_trap_why);
        }
        if (r.fd >= 0)
            close(r.fd);
        if (r.taskfd >= 0)
            close(r.taskfd);
        r.st->syscalls += 2;
    }
    for (size_t i = 0; err && i < r.n; i++)
        r.it[i].w->result = r.it[i].w->result ? r.it[i].w->result
                            : err == -EBUSY   ? ALTPATCH_REASON_LIVE_NO_ANSWER
                                              : ALTPATCH_REASON_WRITE_DENIED;
    r.st->pages += ap_pages_written(w, n, (uintptr_t)sysconf(_SC_PAGESIZE));
    free(r.it);
    return err;
}
