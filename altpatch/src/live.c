/* SPDX-License-Identifier: MIT */
/*
 * Live re-patching: rewriting sites while other threads may execute them.
 *
 * This is the x86 side of the writer. poke.c knows nothing of x86; the int3
 * byte, the RIP fixup in the SIGTRAP handler and the instruction-level safety
 * rules live here. Bytes are written with poke's /proc/self/mem writer, which
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
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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

static void ap_block_all(uint64_t *saved)
{
    uint64_t all = ~0ull;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, saved, sizeof(all));
}

static void ap_restore_mask(const uint64_t *saved)
{
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, saved, NULL, sizeof(*saved));
}

static void ap_pause(void)
{
    __asm__ __volatile__("pause" ::: "memory");
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
};

static struct ap_hs_slot ap_hs[AP_HS_MAX];
static size_t ap_hs_n;
static unsigned ap_hs_seq; /* current attempt; 0 = no handshake running */
static unsigned ap_hs_last;
static const char ap_hs_cookie = 'L'; /* si_value of our handshake signals */

/** Answer the running handshake (if any) for thread @p tid, interrupted at @p rip. */
static void ap_hs_answer(pid_t tid, uintptr_t rip)
{
    unsigned seq = __atomic_load_n(&ap_hs_seq, __ATOMIC_ACQUIRE);
    if (!seq)
        return;
    size_t n = __atomic_load_n(&ap_hs_n, __ATOMIC_ACQUIRE);
    for (size_t i = 0; i < n; i++) {
        if (__atomic_load_n(&ap_hs[i].tid, __ATOMIC_RELAXED) != tid)
            continue;
        __atomic_store_n(&ap_hs[i].rip, rip, __ATOMIC_RELAXED);
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

/** Wait until the round is over; answer handshakes meanwhile (we sit at the site start). */
static void ap_park(uintptr_t at)
{
    pid_t tid = ap_gettid();
    for (unsigned spins = 1; __atomic_load_n(&ap_live_busy, __ATOMIC_ACQUIRE); spins++) {
        ap_hs_answer(tid, at);
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
        ap_park(rip - 1);
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
    if (ap_is_handshake(si))
        ap_hs_answer(ap_gettid(), (uintptr_t)uc->uc_mcontext.gregs[REG_RIP]);
    else
        ap_chain(&ap_prev_hs, sig, si, ucv);
    errno = saved;
}

/**
 * Install @p fn for @p sig unless it is already there, remembering the action
 * it replaces in @p prev (re-installed when someone replaced ours since).
 */
static int ap_install(int sig, void (*fn)(int, siginfo_t *, void *), struct sigaction *prev)
{
    struct sigaction cur, sa;
    if (sigaction(sig, NULL, &cur))
        return -errno;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == fn)
        return 0;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = fn;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
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
    err = ap_install(SIGTRAP, ap_trap_handler, &ap_prev_trap);
    if (!err)
        err = ap_install(AP_HS_SIG, ap_hs_handler, &ap_prev_hs);
    if (err)
        *why = msgs[2];
    return err;
}

/* ------------------------------------------------------------------------- */
/* Classifying sites                                                         */
/* ------------------------------------------------------------------------- */

/** Whether the decoded instruction at @p p is a call (Zydis' mnemonic). */
static bool ap_is_call(const uint8_t *p, size_t avail)
{
    char text[96];
    if (ap_insn_format(p, avail, 0, false, text, sizeof(text)) < 0)
        return false;
    /* AT&T text: optional prefixes ("bnd", "notrack"), then the mnemonic. */
    for (char *save = NULL, *tok = strtok_r(text, " ", &save); tok;
         tok = strtok_r(NULL, " ", &save))
        if (!strncmp(tok, "call", 4) || !strncmp(tok, "lcall", 5))
            return true;
    return false;
}

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
        if (off + in.len < len && ap_is_call(p + off, len - off))
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
    struct ap_poke_stats *st;
};

/** pwrite through poke's writer; counts it. */
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

/** The other threads of this process into ap_hs[]; false when there are too many. */
static bool ap_hs_collect(void)
{
    pid_t self = ap_gettid();
    size_t n = 0;
    bool fits = true;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return false;
    for (struct dirent *e; (e = readdir(d));) {
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid <= 0 || tid == self)
            continue;
        if (n == AP_HS_MAX) {
            fits = false;
            break;
        }
        __atomic_store_n(&ap_hs[n].tid, tid, __ATOMIC_RELAXED);
        __atomic_store_n(&ap_hs[n].seq, 0, __ATOMIC_RELAXED);
        n++;
    }
    closedir(d);
    __atomic_store_n(&ap_hs_n, n, __ATOMIC_RELEASE);
    return fits;
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
            missing += state[i] && __atomic_load_n(&ap_hs[i].seq, __ATOMIC_ACQUIRE) != seq;
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
 */
static void ap_hs_attempt(struct ap_round *r, int8_t *state, long *inside, size_t n)
{
    pid_t pid = (pid_t)syscall(SYS_getpid);
    unsigned seq = ++ap_hs_last ? ap_hs_last : ++ap_hs_last;
    __atomic_store_n(&ap_hs_seq, seq, __ATOMIC_RELEASE);
    for (size_t i = 0; i < n; i++) {
        if (!state[i])
            continue;
        r->st->syscalls++;
        if (ap_hs_send(pid, ap_hs[i].tid) == -ESRCH)
            state[i] = 0; /* exited */
    }
    ap_hs_wait(state, n, seq);
    for (size_t i = 0; i < n; i++) {
        if (!state[i] || __atomic_load_n(&ap_hs[i].seq, __ATOMIC_ACQUIRE) != seq)
            continue;
        long k = ap_inside(r, __atomic_load_n(&ap_hs[i].rip, __ATOMIC_RELAXED));
        state[i] = k < 0 ? 0 : 2;
        inside[i] = k;
    }
}

/** Step 2: refuse the multi-instruction sites a thread is (or may be) inside. */
static int ap_handshake(struct ap_round *r)
{
    bool fits = ap_hs_collect();
    size_t n = __atomic_load_n(&ap_hs_n, __ATOMIC_RELAXED);
    int8_t *state = calloc(n ? n : 1, 1);
    long *inside = calloc(n ? n : 1, sizeof(long));
    if (!state || !inside) {
        free(state);
        free(inside);
        return -ENOMEM;
    }
    memset(state, 1, n);
    uint64_t until = ap_now_ns() + AP_HS_BUDGET_NS;
    for (size_t left = n; left;) {
        ap_hs_attempt(r, state, inside, n);
        left = 0;
        for (size_t i = 0; i < n; i++)
            left += state[i] != 0;
        if (!left || ap_now_ns() > until)
            break;
        struct timespec ts = {0, AP_HS_PAUSE_NS};
        nanosleep(&ts, NULL);
    }
    __atomic_store_n(&ap_hs_seq, 0, __ATOMIC_RELEASE);
    bool silent = !fits;
    for (size_t i = 0; i < n; i++) {
        if (state[i] == 2 && !r->it[inside[i]].out)
            ap_item_refuse(r, &r->it[inside[i]], ALTPATCH_REASON_LIVE_THREAD_INSIDE);
        silent |= state[i] == 1;
    }
    for (size_t i = 0; silent && i < r->n; i++)
        if (!r->it[i].out && r->it[i].multi)
            ap_item_refuse(r, &r->it[i], ALTPATCH_REASON_LIVE_NO_ANSWER);
    free(state);
    free(inside);
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

/** Distinct pages touched by the writes that landed. */
static uint64_t ap_live_pages(const struct ap_write *w, size_t n)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), done = 0;
    uint64_t pages = 0;
    for (size_t i = 0; i < n; i++) {
        if (!w[i].wrote)
            continue;
        uintptr_t s = w[i].addr & ~(pg - 1), e = (w[i].addr + w[i].len + pg - 1) & ~(pg - 1);
        if (s < done)
            s = done;
        if (e > s)
            pages += (e - s) / pg;
        if (e > done)
            done = e;
    }
    return pages;
}

/** Which writes need a round: same rules as ap_poke() (skip unchanged, refuse mismatches). */
static size_t ap_live_pending(struct ap_write *w, size_t n, struct ap_live_item *it)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        w[i].wrote = false;
        w[i].result = ALTPATCH_REASON_NONE;
        if (!w[i].len || !memcmp((const void *)w[i].addr, w[i].new, w[i].len))
            continue;
        if (memcmp((const void *)w[i].addr, w[i].old, w[i].len)) {
            w[i].result = ALTPATCH_REASON_MEM_MISMATCH;
            continue;
        }
        it[k++] = (struct ap_live_item){.w = &w[i]};
    }
    return k;
}

int ap_live_poke(struct ap_write *w, size_t n, struct ap_poke_stats *st)
{
    struct ap_poke_stats dummy = {0};
    struct ap_round r = {.st = st ? st : &dummy, .fd = -1};
    r.it = calloc(n ? n : 1, sizeof(*r.it));
    if (!r.it)
        return -ENOMEM;
    r.n = ap_live_pending(w, n, r.it);
    int err = 0;
    if (r.n && ap_classify(&r)) {
        r.fd = ap_procmem_open();
        r.st->syscalls++;
        err = r.fd < 0 ? r.fd : ap_set_add(w, n);
        if (!err) {
            uint64_t mask;
            ap_block_all(&mask);
            pthread_mutex_lock(&ap_fork_lock);
            ap_round_run(&r);
            pthread_mutex_unlock(&ap_fork_lock);
            ap_restore_mask(&mask);
        }
        if (r.fd >= 0) {
            close(r.fd);
            r.st->syscalls++;
        }
    }
    for (size_t i = 0; err && i < r.n; i++)
        r.it[i].w->result = r.it[i].w->result ? r.it[i].w->result : ALTPATCH_REASON_WRITE_DENIED;
    r.st->pages += ap_live_pages(w, n);
    free(r.it);
    return err;
}
