/* SPDX-License-Identifier: MIT */
/*
 * altpatch_apply(): orchestration and stats.
 *
 *   lock -> ALTPATCH_OFF? -> threads? -> modules (module.c) -> features
 *     -> per site: plan (plan.c) -> decide against memory -> one batch of
 *        writes for every module (poke.c) -> per-site results -> stats, log
 *
 * Per site, the bytes memory must hold ("target") are the plan's final bytes,
 * the original when the site is refused, or the original for REVERT. Memory
 * is then compared:
 *   equal to target                    -> unchanged, nothing written
 *   equal to original or to the bytes
 *   the last apply left there          -> written
 *   anything else                      -> MEM_MISMATCH: someone else changed
 *                                         it; refused, nothing written
 * One global mutex serializes apply, get_stats and site_foreach.
 */
#include "apply.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <time.h>

AP_STATE static struct ap_module *ap_mods;    /* modules with tables, load order */
AP_STATE static struct altpatch_stats ap_last; /* stats of the last apply */
AP_STATE static bool ap_applied;              /* an apply has planned at least once */
/*
 * Where this thread is in the entry points: AP_IN_NONE outside, AP_IN_ENTRY
 * inside one without ap_lock (pins being taken or released), AP_IN_LOCKED
 * holding ap_lock (callbacks run there). A second entry on the same thread --
 * from a print or foreach callback, or from a signal handler that interrupted
 * an entry point -- is refused with -EDEADLK before it takes a lock or
 * allocates: the interrupted call may hold ap_lock, the loader's lock or
 * malloc's.
 */
enum { AP_IN_NONE, AP_IN_ENTRY, AP_IN_LOCKED };
static __thread volatile sig_atomic_t ap_in;

/* The entry points' lock (host.h's ap_tlock: a futex word naming its owner). */
AP_STATE static struct ap_tlock ap_lock;

/* ------------------------------------------------------------------------- */
/* fork                                                                      */
/* ------------------------------------------------------------------------- */

/*
 * fork() in one thread while another runs an entry point would give a child
 * whose ap_lock is held by a thread that does not exist there: every later
 * call in the child would wait forever. So fork waits: the prepare handler
 * takes ap_lock (and then the live round's lock, in the order an apply takes
 * them) and both processes release them. A fork from inside an entry point
 * or altpatch_dlopen() on this very thread (a callback, a library's
 * constructor, a signal handler) must not wait for itself: it takes the lock
 * only if it is free, and the child, whose copy of this thread still runs
 * that call, releases it when the call returns. Where the lock's owner is
 * another thread, which the child lacks, the child's handler makes the lock
 * free again there and marks it orphaned (ap_lock_orphaned): what that thread
 * was changing is not known, so every later entry point in the child fails
 * with -EOWNERDEAD instead of waiting forever or using half-changed state.
 * The CPUID leaves' lock (cpu.c), taken by queries outside ap_lock, is kept
 * across the fork the same way, last (its holder waits for nothing).
 */
static __thread bool ap_fork_took, ap_fork_gated;
AP_STATE static bool ap_lock_orphaned;

/*
 * A fork() from a signal handler on the thread that is in its own fork():
 * the C library runs the fork handlers again for it, with or without a
 * second thread in the process (glibc gives its own fork lock back while the
 * handlers run). The handlers take and give back their locks with every
 * signal blocked, so such an inner fork comes either before the outer
 * prepare handler starts (a fork like any other) or while the outer fork
 * holds everything it took: between the end of the prepare handler and the
 * start of the parent or child handler. There the inner fork's handlers take
 * and release nothing (they would wait for this very thread, or release what
 * the outer fork took); in its child, where the outer fork goes on and gives
 * back what it took, the child handler repairs only what other threads held
 * (ap_atfork_child_repair()). ap_fork_depth: this thread's forks under way,
 * the outer one counted from inside the blocked part of its prepare handler
 * to inside the blocked part of its parent or child handler.
 *
 * A fork left by a longjmp between its handlers (a signal handler that
 * interrupted it jumps out, which fork() does not support) keeps what its
 * prepare handler took, and its count, for good: the thread's later forks
 * are taken for forks inside it, its calls answer -EDEADLK and other
 * threads' calls wait. A later fork of the thread cannot be told from one
 * inside that fork without guessing (a signal handler may run on any stack,
 * an alternate one with SS_AUTODISARM reports none), and a wrong guess gives
 * an outer fork's locks back while it runs; in a process that has had a
 * second thread the C library's own fork locks may stay held anyway.
 */
static __thread volatile sig_atomic_t ap_fork_depth;

/*
 * The pins are taken and released outside ap_lock (see ap_pins), inside the
 * loader (dl_iterate_phdr, dlopen, dlclose): a child forked meanwhile would
 * inherit the loader's locks held and hang in its first dlopen or
 * dl_iterate_phdr. Those phases pass a gate: any number of threads at once,
 * none while a fork holds it. The prepare handler waits until no thread is
 * in one (ap_gate_in, a futex word), then keeps the gate's lock across the
 * fork, so none can start. A fork on a thread that is in the gate or holds
 * its lock (from a constructor run by altpatch_dlopen(), or a signal handler)
 * cannot wait for the gate to empty; in its child only this thread's
 * passages are left: ap_gate_mine, which changes with ap_gate_in under the
 * gate's lock. Where the fork interrupted this thread inside that lock, the
 * count is set by the next holder of the lock (ap_gate_recount_apply()):
 * that thread's interrupted section as it ends, or -- where the fork came
 * after that section's count was set -- whichever thread takes the lock
 * first afterwards.
 */
AP_STATE static struct ap_tlock ap_gate_mx;
AP_STATE static uint32_t ap_gate_in;      /* passages of all threads; futex word */
AP_STATE static uint32_t ap_gate_waiting; /* fork handlers waiting for ap_gate_in == 0 */
/* child: the token of the thread whose section the fork interrupted inside
 * ap_gate_mx (0: none), and that thread's passages at the fork */
AP_STATE static volatile sig_atomic_t ap_gate_recount;
AP_STATE static uint32_t ap_gate_forked_mine;
static __thread volatile sig_atomic_t ap_gate_mine;   /* this thread's passages (nested) */

/*
 * Under ap_gate_mx, held by thread @p me, in a child whose fork interrupted
 * a section (ap_gate_recount): the count set to the passages of the threads
 * this process has. On the forking thread, its own (the interrupted section,
 * at its end, or a later call). On another, the interrupted section has
 * ended (its thread held the lock until then) and the forking thread has
 * taken the lock since (that would have set the count): its passages are
 * what they were at the fork; of the threads created in the child only this
 * one has taken the lock.
 */
static void ap_gate_recount_apply(uint32_t me)
{
    for (;;) {
        sig_atomic_t owner = __atomic_load_n(&ap_gate_recount, __ATOMIC_RELAXED);
        if (!owner)
            return;
        /* cleared first, from the value the count is computed from: a fork
         * from a signal handler between here and the store below sets it
         * again in its child (for that child's next holder), which a plain
         * store of 0 after the count would erase */
        if (!__atomic_compare_exchange_n(&ap_gate_recount, &owner, 0, false, __ATOMIC_RELAXED,
                                         __ATOMIC_RELAXED))
            continue;
        uint32_t n = (uint32_t)ap_gate_mine + ((uint32_t)owner == me ? 0 : ap_gate_forked_mine);
        __atomic_store_n(&ap_gate_in, n, __ATOMIC_RELAXED);
        ap_gate_waiting = 0;
        return;
    }
}

/* The end of a section under ap_gate_mx of thread @p me: the child's count,
 * waiters woken. */
static void ap_gate_settle(uint32_t me)
{
    ap_gate_recount_apply(me);
    if (!__atomic_load_n(&ap_gate_in, __ATOMIC_RELAXED) && ap_gate_waiting)
        ap_futex(&ap_gate_in, FUTEX_WAKE, INT32_MAX);
}

AP_HOT void ap_gate_enter(void)
{
    uint32_t me = ap_token();
    ap_tlock_lock(&ap_gate_mx, me);
    __atomic_store_n(&ap_gate_in, __atomic_load_n(&ap_gate_in, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
    ap_gate_mine = ap_gate_mine + 1;
    ap_gate_settle(me);
    ap_tlock_unlock(&ap_gate_mx);
}

AP_HOT void ap_gate_leave(void)
{
    uint32_t me = ap_token();
    ap_tlock_lock(&ap_gate_mx, me);
    if (ap_gate_mine > 0)
        ap_gate_mine = ap_gate_mine - 1;
    uint32_t n = __atomic_load_n(&ap_gate_in, __ATOMIC_RELAXED);
    if (n) /* never below zero, whatever a fork left */
        __atomic_store_n(&ap_gate_in, n - 1, __ATOMIC_RELAXED);
    ap_gate_settle(me);
    ap_tlock_unlock(&ap_gate_mx);
}

/*
 * The fork handlers' mask: every signal but the C library's own, those
 * below SIGRTMIN (glibc: SIGCANCEL and SIGSETXID; musl: its timer, cancel
 * and synccall signals). A thread in setuid() and its kin waits until every
 * other thread has run the setxid signal's handler, and the prepare handler
 * may be waiting for that very thread (in the gate or holding ap_lock); the
 * C library's handlers fork nothing.
 */
static uint64_t ap_fork_signals(void)
{
    uint64_t set = AP_SIGNALS_ALL;
    for (int s = 32; s < SIGRTMIN && s <= 64; s++)
        set &= ~(1ull << (s - 1));
    return set;
}

static void ap_atfork_prepare(void)
{
    if (ap_fork_depth) {
        /* inside this thread's own fork, which holds everything (above) */
        ap_fork_depth = ap_fork_depth + 1;
        return;
    }
    uint64_t mask;
    ap_signals_block(ap_fork_signals(), &mask);
    ap_fork_depth = 1;
    uint32_t me = ap_token();
    if (ap_in == AP_IN_NONE && !ap_gate_mine && ap_tlock_owner(&ap_gate_mx) != me &&
        ap_tlock_owner(&ap_lock) != me) {
        ap_tlock_lock(&ap_gate_mx, me);
        ap_gate_recount_apply(me); /* a child's count not set yet */
        uint32_t n;
        while ((n = __atomic_load_n(&ap_gate_in, __ATOMIC_RELAXED)) != 0) {
            ap_gate_waiting++;
            ap_tlock_unlock(&ap_gate_mx);
            ap_futex(&ap_gate_in, FUTEX_WAIT, n);
            ap_tlock_lock(&ap_gate_mx, me);
            ap_gate_waiting--;
        }
        ap_fork_gated = true;
        ap_tlock_lock(&ap_lock, me);
        ap_fork_took = true;
    } else {
        ap_fork_took = ap_tlock_owner(&ap_lock) != me && ap_tlock_try(&ap_lock, me);
    }
    ap_live_fork_prepare();
    ap_leaves_fork_prepare(); /* last: its holder waits for nothing */
    ap_signals_restore(&mask);
}

/* What the prepare handler took, given back. */
static void ap_atfork_release(void)
{
    ap_leaves_fork_release();
    ap_live_fork_release();
    if (ap_fork_took) {
        ap_fork_took = false;
        ap_tlock_unlock(&ap_lock);
    }
    if (ap_fork_gated) {
        ap_fork_gated = false;
        ap_tlock_unlock(&ap_gate_mx);
    }
}

static void ap_atfork_parent(void)
{
    if (ap_fork_depth > 1) {
        ap_fork_depth = ap_fork_depth - 1; /* an inner fork's: nothing taken */
        return;
    }
    uint64_t mask;
    ap_signals_block(ap_fork_signals(), &mask);
    ap_atfork_release();
    ap_fork_depth = 0;
    ap_signals_restore(&mask);
}

/*
 * In a child, what threads other than this one held (they are not in this
 * process): ap_lock made free and marked orphaned, the gate's count reduced
 * to this thread's passages. What this thread holds is its own to give back:
 * @p gated, whether the prepare handler of its outer fork holds the gate's
 * lock (it then set the count, zero: no passage under way).
 */
static void ap_atfork_child_repair(uint32_t me, bool gated)
{
    uint32_t owner = ap_tlock_owner(&ap_lock);
    if (owner && owner != me) {
        __atomic_store_n(&ap_lock.w, 0, __ATOMIC_RELAXED);
        ap_lock_orphaned = true;
    }
    if (!gated) {
        /* only this thread's passages are left */
        if (ap_tlock_owner(&ap_gate_mx) == me) {
            /* set by the next holder of the lock (ap_gate_recount_apply()) */
            ap_gate_forked_mine = (uint32_t)ap_gate_mine;
            ap_gate_recount = (sig_atomic_t)me;
        } else {
            __atomic_store_n(&ap_gate_mx.w, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&ap_gate_in, (uint32_t)ap_gate_mine, __ATOMIC_RELAXED);
            ap_gate_waiting = 0;
            ap_gate_recount = 0;
        }
    } else {
        /* the prepare handler set any count an earlier fork left to set */
        ap_gate_recount = 0;
    }
}

static void ap_atfork_child(void)
{
    uint32_t me = ap_token();
    if (ap_fork_depth > 1) {
        /* the outer fork, interrupted in this thread while it held what it
         * took, goes on here and gives that back (in its parent or child
         * handler); the other threads' part is repaired now. The kept maps
         * descriptor is closed where the outer fork's prepare handler holds
         * the lock (no batch can be using it: as in the child of a fork
         * that was not interrupted), else forgotten (a call of this thread
         * that the outer fork interrupted, or another thread's in the
         * parent, may have been reading it) */
        ap_maps_after_fork(ap_fork_took);
        ap_atfork_child_repair(me, ap_fork_gated);
        ap_fork_depth = ap_fork_depth - 1;
        return;
    }
    uint64_t mask;
    ap_signals_block(ap_fork_signals(), &mask);
    bool gated = ap_fork_gated, took = ap_fork_took;
    /* holding the lock, the prepare handler knew that no batch used the kept
     * maps descriptor: its number is the library's; else it is forgotten */
    ap_maps_after_fork(took);
    ap_atfork_release();
    ap_atfork_child_repair(me, gated);
    ap_fork_depth = 0;
    ap_signals_restore(&mask);
}

__attribute__((constructor)) static void ap_atfork_register(void)
{
    pthread_atfork(ap_atfork_prepare, ap_atfork_parent, ap_atfork_child);
}

/* ------------------------------------------------------------------------- */
/* Deciding one site                                                         */
/* ------------------------------------------------------------------------- */


/*
 * The templates of site shapes (memo.c), kept from apply to apply while the
 * feature set stays the same (each module remembers its sites' templates,
 * for generation ap_shapes_gen). Guarded by ap_lock.
 */
AP_STATE static struct ap_memo ap_shapes;
AP_STATE static uint64_t ap_shapes_gen;
/*
 * The templates of the generation before, kept while a module whose plan
 * bytes are still left to them (host.h: planned_memo) could not be read when
 * the generation changed: it was not pinned (gone: unloaded, or its pin not
 * taken). It is filled from them once pinned again; they are freed once no
 * module points at them. NULL: none kept.
 */
AP_STATE static struct ap_memo *ap_shapes_prev;

/* Every planned byte of the modules left to @p memo that are pinned
 * written; true when one that is not still points at it. */
static bool ap_shapes_fill(const struct ap_memo *memo)
{
    bool needed = false;
    for (struct ap_module *m = ap_mods; m; m = m->next) {
        if (m->planned_memo != memo)
            continue;
        if (m->gone)
            needed = true;
        else
            ap_module_planned(m);
    }
    return needed;
}

/* The modules left to @p memo, whose templates go for good (no room to keep
 * them): their plan bytes become their originals, so that the next apply
 * refuses a site memory holds neither of (MEM_MISMATCH) instead of taking
 * unknown bytes for its plan. */
static void ap_shapes_lose(const struct ap_memo *memo)
{
    for (struct ap_module *m = ap_mods; m; m = m->next)
        if (m->planned_memo == memo)
            ap_module_plan_originals(m);
}

/* The generation before, freed (its modules lost) */
static void ap_shapes_prev_free(void)
{
    ap_shapes_lose(ap_shapes_prev);
    ap_memo_free(ap_shapes_prev);
    ap_mem_free(ap_shapes_prev);
    ap_shapes_prev = NULL;
}

/** The memo for @p fs: the kept one, or a new generation when the set changed.
 * Its lookups by records are dropped: libraries may have come and gone. */
static struct ap_memo *ap_shapes_for(const struct altpatch_features *fs)
{
    /* the generation before: freed once no module needs it */
    if (ap_shapes_prev && !ap_shapes_fill(ap_shapes_prev))
        ap_shapes_prev_free();
    if (ap_shapes_gen && memcmp(&ap_shapes.fs, fs, sizeof(*fs)) == 0) {
        ap_memo_hints_drop(&ap_shapes);
        return &ap_shapes;
    }
    if (ap_shapes_gen) {
        /* the templates go: every planned byte left to them is written
         * first; a module not pinned now keeps them as the generation
         * before (one: the one before that is given up) */
        struct ap_memo *keep = NULL;
        if (ap_shapes_fill(&ap_shapes)) {
            if (ap_shapes_prev)
                ap_shapes_prev_free();
            keep = ap_mem_alloc(sizeof(*keep));
            if (!keep)
                ap_shapes_lose(&ap_shapes);
        }
        if (keep) {
            *keep = ap_shapes; /* its blocks move with it */
            keep->fs_at = &keep->fs;
            ap_shapes_prev = keep;
            for (struct ap_module *m = ap_mods; m; m = m->next)
                if (m->planned_memo == &ap_shapes)
                    m->planned_memo = keep;
        } else {
            ap_memo_free(&ap_shapes);
        }
        ap_memo_init(&ap_shapes, fs);
    } else {
        ap_memo_init_zeroed(&ap_shapes, fs); /* the static, never used yet */
    }
    ap_shapes.fs_at = &ap_shapes.fs;
    ap_shapes_gen++;
    return &ap_shapes;
}

/* ------------------------------------------------------------------------- */
/* One apply                                                                 */
/* ------------------------------------------------------------------------- */

/** One site's decision in one apply (sites in module order, then table order). */
struct ap_dec {
    const uint8_t *target; /* the bytes memory must hold; NULL when outside the text */
    int32_t chosen;        /* entry memory will hold; -1 = original */
    int16_t reason;        /* refusal, or NONE */
    uint8_t action;        /* enum ap_action */
};

/** A refusal's detail from the planner (few: refusals only). */
struct ap_detail {
    size_t idx; /* in ap_run.dec */
    char *text; /* malloc'ed */
};

/* How an apply decides a module (ap_mrun.path). */
enum {
    AP_PATH_DECIDE,  /* every site through ap_decide() */
    AP_PATH_SETTLED, /* memory still holds what the last apply left: nothing to do */
    AP_PATH_TOGGLE,  /* a settled module switched between its plan and its originals */
};

/** A module's part of one apply. */
struct ap_mrun {
    struct ap_module *m;
    size_t n0;      /* its first decision */
    size_t writes;  /* writes it queued */
    size_t patched; /* sites recorded patched */
    bool ok;        /* no site recorded refused */
    bool first;     /* its first decision (ap_decide_first()) */
    uint8_t path;   /* AP_PATH_* */
};

/* A queued write's tag (struct ap_write) is its decision number, and
 * AP_WDEC_DONE: the site was recorded when it was decided, as if the write
 * lands (what memory holds is kept after the writer); else recorded after.
 * AP_WDEC_KEPT: nothing to do after the writer when the write lands: a
 * quick switch's (ap_record() records the module), or one that was recorded
 * (DONE) where memory and m->planned held the original, m->planned given the
 * new bytes when the write was queued (put back if the write fails). */
#define AP_WDEC_DONE 0x80000000u
#define AP_WDEC_KEPT 0x40000000u
#define AP_WDEC_N 0x3fffffffu

/*
 * Queue write @p k (no result yet): every queued write goes through here, as
 * the queue may lie over a module's records (ap_run.wmod). Its four words
 * are stored through a may_alias word type (GNU C): each store may alias any
 * object, so no load of a record is moved past the store of a write into its
 * slot, and the writer's reads of struct ap_write's fields may read what
 * these stores wrote. (A memcpy from a uint64_t would give the bytes that effective type,
 * C11 6.5p6, not one the fields' reads may use.) Four word stores, no copy
 * through the stack.
 */
typedef uint64_t ap_qword __attribute__((may_alias));
_Static_assert(sizeof(struct ap_write) == sizeof(struct ap_entry),
               "a queued write takes the slot of one record");
_Static_assert(_Alignof(struct ap_write) >= _Alignof(uint64_t) &&
                   _Alignof(struct ap_entry) >= _Alignof(uint64_t),
               "a slot's words are aligned");
_Static_assert(offsetof(struct ap_write, old) == 8 && offsetof(struct ap_write, new) == 16 &&
                   offsetof(struct ap_write, tag) == 24 && offsetof(struct ap_write, len) == 28 &&
                   offsetof(struct ap_write, result) == 30 && offsetof(struct ap_write, wrote) == 31,
               "struct ap_write: tag, len, result, wrote in its last word");
static inline void ap_queue(struct ap_write *q, size_t k, uintptr_t addr, const uint8_t *old,
                            const uint8_t *new, uint32_t tag, size_t len)
{
    ap_qword *p = (ap_qword *)(void *)(q + k);
    p[0] = (uint64_t)addr;
    p[1] = (uint64_t)(uintptr_t)old;
    p[2] = (uint64_t)(uintptr_t)new;
    /* tag, len, result 0, wrote false: one word (little-endian x86-64) */
    p[3] = tag | (uint64_t)(uint16_t)len << 32;
}

struct ap_run {
    void *buf;          /* one block: the queue (unless r->wmod's), dec, arena */
    struct ap_dec *dec; /* written only where needed: slow sites, the log */
    size_t ndec;
    uint8_t *arena; /* final bytes of sites whose template has relative fields, or planned */
    struct ap_write *writes; /* in site order until sorted; tag: the decision */
    size_t nwrites;
    /* The module whose records hold the write queue (its first decision,
     * decided before every other module, from a table small enough to keep
     * its records: ap_records_keep_max), or NULL: writes is its own block.
     * Its m->entries is the same block until that decision is done. */
    struct ap_module *wmod;
    /* A run with a module's first decision (first_any) writes its queue in
     * parts while it decides (ap_part_write()): the queue's block has room
     * for a write per site, its first r->part slots' pages made
     * present (its own block), and each part written goes back to slot 0. */
    bool first_any;
    size_t part; /* writes in one part (ap_part_size() of the run's sites) */
    bool live;            /* written by the live writer (docs/live.md) */
    bool parts_off;       /* no part written: a quick switch queued writes, or the
                           * proof waits for the writer (ap_run_prove()) */
    int part_err;         /* the writer's first error over the parts */
    size_t nparted;       /* writes written in parts so far */
    uint64_t part_bytes;  /* pst.bytes after the last part */
    unsigned pf;          /* the writer's flags (ap_poke()) */
    /* Writes queued with AP_WDEC_KEPT by the loops, and the sum of their
     * lengths: when every write is one of them and the writer wrote that many
     * bytes, every write landed and nothing is left to do after the writer. */
    size_t nkept;
    uint64_t kept_bytes;
    /* Writes queued without AP_WDEC_KEPT by ap_decide() (a site planned
     * one by one): how many, their slots' range [unkept_lo, unkept_hi) and
     * their bytes; unkept_any: a loop queued some too (not tracked). When
     * none is untracked and the writer wrote the bytes of all, only that
     * range has anything left to do after the writer. */
    size_t nunkept, unkept_lo, unkept_hi;
    uint64_t unkept_bytes;
    bool unkept_any;
    uintptr_t wlast;         /* the address of the last write queued; 0 before
                              * the first (no site lies at 0) */
    bool unsorted;           /* some write was queued below one before it */
    /* Writes queued by quick switches (ap_toggle()), each compared with
     * memory there after the run's proof, and ap_user_calls when that proof
     * was taken: when they are the whole queue and no user code ran since
     * the proof, the writer need not compare them again (AP_POKE_CHECKED). */
    size_t nchecked;
    unsigned long checked_calls;
    struct ap_mrun *mods;
    size_t nmods;
    struct ap_detail *details;
    size_t ndetails, details_cap;
    struct ap_poke_stats pst;
    unsigned flags; /* the apply's (ALTPATCH_APPLY_*) */
    bool proved;    /* ap_run_prove() asked */
    unsigned long proof_calls; /* ap_user_calls when the proof was taken */
    bool keep;   /* not a dry run: remember what is left */
    bool revert; /* ALTPATCH_APPLY_REVERT */
    bool debug;  /* ALTPATCH_DEBUG: every site is logged, in order, when the writes are done */
    bool poked;  /* the writer ran: writes[].result holds its answers */
    bool undone; /* refused before any write: every write denied, the modules
                  * decided for the first time left undecided (ap_run_undo()) */
    bool wrote;  /* a part or the last queue was handed to a writer */
    uint64_t refused_n, patched_n, unchanged_n;
};

/** Keep a refusal's detail for site @p idx (best effort: dropped when memory is short). */
static void ap_keep_detail(struct ap_run *r, size_t idx, char *text)
{
    if (r->ndetails == r->details_cap) {
        size_t cap = r->details_cap ? 2 * r->details_cap : 16;
        struct ap_detail *d = ap_mem_realloc(r->details, cap * sizeof(*d));
        if (!d) {
            free(text);
            return;
        }
        r->details = d;
        r->details_cap = cap;
    }
    r->details[r->ndetails++] = (struct ap_detail){idx, text};
}

/** The detail kept for site @p idx, or NULL. */
static char *ap_detail_of(const struct ap_run *r, size_t idx)
{
    for (size_t i = 0; i < r->ndetails; i++)
        if (r->details[i].idx == idx)
            return r->details[i].text;
    return NULL;
}

/** The work item of decision @p n (site @p i of @p m), for the log. */
static struct ap_work ap_work_of(const struct ap_run *r, size_t n, struct ap_module *m, size_t i)
{
    const struct ap_dec *d = &r->dec[n];
    size_t off = ap_orig_off(m, i);
    /* the file's originals not read (prepatch_load.c): none shown */
    const uint8_t *orig = off != AP_NO_ORIG && !m->orig_in_file ? m->orig + off : NULL;
    return (struct ap_work){.m = m, .idx = i, .orig = orig,
                            .cur = orig ? (const uint8_t *)(uintptr_t)ap_site_addr(m, i) : NULL,
                            .target = d->target, .detail = ap_detail_of(r, n),
                            .chosen = d->chosen, .reason = d->reason,
                            .action = (enum ap_action)d->action};
}

/*
 * The reasons warned about at site @p i of @p m, with room for them made
 * when @p add (NULL when there is none, or no memory: a WARN may then be
 * printed again).
 */
static uint32_t *ap_warned_bits(struct ap_module *m, size_t i, bool add)
{
    size_t lo = 0, hi = m->nwarned; /* the first entry with site >= i */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->warned[mid].site < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < m->nwarned && m->warned[lo].site == i)
        return &m->warned[lo].bits;
    if (!add)
        return NULL;
    /* sites are refused in order: usually appended; room for 4, 8, 16, ... */
    size_t n = m->nwarned;
    if (n == 0 || (n >= 4 && !(n & (n - 1)))) {
        struct ap_warned *w = ap_mem_realloc(m->warned, (n ? 2 * n : 4) * sizeof(*w));
        if (!w)
            return NULL;
        m->warned = w;
    }
    memmove(&m->warned[lo + 1], &m->warned[lo], (n - lo) * sizeof(*m->warned));
    m->warned[lo] = (struct ap_warned){(uint32_t)i, 0};
    m->nwarned = n + 1;
    return &m->warned[lo].bits;
}

/* Record a refused decision @p n, site @p i of module @p mr. */
static void ap_site_refused(struct ap_run *r, struct ap_mrun *mr, size_t i, size_t n)
{
    struct ap_module *m = mr->m;
    const struct ap_dec *d = &r->dec[n];
    struct ap_site_result *res = &m->st[i].res;
    /* One WARN per site and reason: a site that toggles between refused and
     * unchanged (REVERT, another feature set) does not warn again. A write
     * not made after -EBUSY is not one: the refusal's one WARN said why. */
    uint32_t bit = d->reason > 0 && d->reason < 32 ? 1u << d->reason : 0;
    bool busy = d->reason == ALTPATCH_REASON_WRITE_DENIED && (r->undone || r->part_err == -EBUSY);
    if (ap_res_reason(res) != d->reason && !busy) {
        uint32_t *warned = ap_warned_bits(m, i, bit != 0);
        if (!warned || !(*warned & bit)) {
            struct ap_work wk = ap_work_of(r, n, m, i);
            ap_warn_refusal(&wk);
        }
        if (warned)
            *warned |= bit;
    }
    *res = ap_res_refused(d->reason);
    r->refused_n++;
    mr->ok = false;
}

/*
 * Record an accepted decision @p d into @p res: the stats, and what memory
 * now holds into @p planned (@p len bytes) unless a dry run.
 */
static inline void ap_site_ok(struct ap_run *r, struct ap_mrun *mr, struct ap_site_result *res,
                              const struct ap_dec *d, uint8_t *planned, size_t len)
{
    bool patched = d->chosen >= 0;
    *res = ap_res_ok(d->chosen);
    r->patched_n += patched;
    mr->patched += patched;
    r->unchanged_n += d->action == AP_ACT_UNCHANGED;
    if (r->keep)
        ap_copy_small(planned, d->target, len);
}

/*
 * Record decision @p n, site @p i of module @p mr (whose writes, if any, are
 * done): its result, the stats, and what memory now holds (m->planned)
 * unless a dry run; the log line under ALTPATCH_DEBUG.
 */
static void ap_site_done(struct ap_run *r, struct ap_mrun *mr, size_t i, size_t n)
{
    struct ap_module *m = mr->m;
    const struct ap_dec *d = &r->dec[n];
    if (d->action == AP_ACT_REFUSED || d->reason)
        ap_site_refused(r, mr, i, n);
    else
        ap_site_ok(r, mr, &m->st[i].res, d, m->planned + ap_orig_off(m, i), m->sites[i].len);
    if (r->debug) {
        struct ap_work wk = ap_work_of(r, n, m, i);
        ap_debug_site(&wk);
    }
}

/*
 * ap_equal_small() for a site's bytes, the common lengths first: 4 to 16
 * bytes are two overlapping words of each side.
 */
static inline bool ap_same_site(const uint8_t *a, const uint8_t *b, size_t n)
{
    if (n - 4 <= 12) {
        if (n >= 8) {
            uint64_t a0, a1, b0, b1;
            memcpy(&a0, a, 8);
            memcpy(&a1, a + n - 8, 8);
            memcpy(&b0, b, 8);
            memcpy(&b1, b + n - 8, 8);
            return ((a0 ^ b0) | (a1 ^ b1)) == 0;
        }
        uint32_t a0, a1, b0, b1;
        memcpy(&a0, a, 4);
        memcpy(&a1, a + n - 4, 4);
        memcpy(&b0, b, 4);
        memcpy(&b1, b + n - 4, 4);
        return ((a0 ^ b0) | (a1 ^ b1)) == 0;
    }
    return ap_equal_small(a, b, n);
}

/*
 * Site @p i of module @p mr, the run's decision n (final bytes, when they
 * are computed for this site, into @p slot): its plan, then memory. The
 * plan: the template the site used last time under this memo (its st[i].shape),
 * else the original when none of its entries applies under the memo's
 * feature set (after the record checks, plan.h: no template), else the
 * template of its shape (memo.c: a hash and a compare, no decoder),
 * instantiated at this site; the planner only for a new shape, a refusal,
 * or relative fields that do not fit here (sitecache.c). Then memory:
 *   equal to target                    -> unchanged, nothing written
 *   equal to original or to the bytes
 *   the last apply left there          -> a write is queued
 *   anything else                      -> MEM_MISMATCH, refused
 * A site that needs no write is recorded at once (unless ALTPATCH_DEBUG
 * logs every site in order afterwards).
 */
AP_PLAIN_PATH static __attribute__((noinline)) void ap_decide(struct ap_run *r, struct ap_mrun *mr, size_t i,
                                                uint8_t *slot, struct ap_memo *memo)
{
    struct ap_module *m = mr->m;
    size_t n = r->ndec++;
    struct ap_dec *d = &r->dec[n];
    const struct ap_site site = ap_site_get(m, i), *s = &site;
    size_t off = ap_orig_off(m, i);
    uint8_t len = s->len;
    uintptr_t addr = (uintptr_t)s->addr;
    int reason = ALTPATCH_REASON_NONE, chosen = -2;
    const uint8_t *final = NULL;
    /* saved only for a site inside the module's text: memory is then at its
     * address (a module's view of live memory maps every address to itself) */
    const uint8_t *orig = off != AP_NO_ORIG ? m->orig + off : NULL;
    if (orig && !m->reason) {
        /* the site's records only when needed: a first lookup, relative fields */
        struct ap_site_entries eb;
        const struct ap_site *es = s;
        const struct ap_entry *ents = NULL;
        uint32_t id = ap_shape_load(m->st[i].shape);
        if (!id) { /* orig saved: the site lies in the module's text (module.c) */
            ents = ap_module_site_entries(m, i, &eb, &es);
            /* no entry applies: the original, after the record checks alone */
            id = ap_memo_keeps_original(memo, &m->view, es, ents)
                     ? AP_SHAPE_ORIGINAL
                     : ap_memo_find_text(memo, &m->view, es, ents, orig);
        }
        if (id == AP_SHAPE_ORIGINAL) {
            chosen = -1;
        } else if (id) {
            if (memo->tmpl[id - 1].nfields && !ents)
                ents = ap_module_site_entries(m, i, &eb, &es);
            chosen = ap_memo_inst(memo, id, &m->view, es, ents, slot, &final);
        }
        if (chosen >= -1)
            m->st[i].shape = ap_shape_store(id);
    }
    if (chosen < -1) {
        char *detail = NULL;
        chosen = ap_plan_slow(m, i, orig, memo, slot, &reason, &detail);
        final = slot;
        if (detail)
            ap_keep_detail(r, n, detail);
    }
    if (m->reason)
        reason = m->reason;
    if (reason || r->revert)
        chosen = -1;
    if (!orig) {
        *d = (struct ap_dec){NULL, -1, (int16_t)(reason ? reason : ALTPATCH_REASON_SITE_BOUNDS),
                             AP_ACT_REFUSED};
    } else {
        const uint8_t *target = chosen >= 0 ? final : orig;
        const uint8_t *cur = (const uint8_t *)addr;
        const uint8_t *planned = m->planned + off;
        *d = (struct ap_dec){target, chosen, (int16_t)reason, AP_ACT_UNCHANGED};
        const uint8_t *old = NULL;
        if (ap_equal_small(cur, target, len)) {
            d->action = reason ? AP_ACT_REFUSED : AP_ACT_UNCHANGED;
        } else if (ap_equal_small(cur, orig, len)) {
            old = orig;
        } else if (ap_equal_small(cur, planned, len)) {
            old = planned;
        } else {
            d->reason = ALTPATCH_REASON_MEM_MISMATCH;
            d->chosen = -1;
            d->action = AP_ACT_REFUSED;
        }
        if (old) {
            d->action = AP_ACT_WRITE;
            r->unsorted |= addr <= r->wlast;
            r->wlast = addr;
            size_t k = r->nwrites++;
            ap_queue(r->writes, k, addr, old, target, (uint32_t)n, len);
            if (!r->nunkept++)
                r->unkept_lo = k;
            r->unkept_hi = k + 1;
            r->unkept_bytes += len;
            return;
        }
        if (!r->debug && d->action == AP_ACT_UNCHANGED) {
            ap_site_ok(r, mr, &m->st[i].res, d, m->planned + off, len);
            return;
        }
    }
    if (!r->debug)
        ap_site_refused(r, mr, i, n);
}

/* Bit b of @p x at bit 2 * b. */
static inline uint64_t ap_bits_spread(uint32_t x)
{
    uint64_t v = x;
    v = (v | v << 16) & 0x0000ffff0000ffffull;
    v = (v | v << 8) & 0x00ff00ff00ff00ffull;
    v = (v | v << 4) & 0x0f0f0f0f0f0f0f0full;
    v = (v | v << 2) & 0x3333333333333333ull;
    return (v | v << 1) & 0x5555555555555555ull;
}

/* Writes in a part of a first decision's queue (host.h): 128 KiB of them. */
unsigned ap_part_writes = 4096;
AP_STATE uint64_t ap_settled_found;

static void ap_write_done(struct ap_run *r, size_t k, size_t *hint);

/*
 * The writes of r->writes[0 .. r->nwrites) with anything left to do after
 * the writer (ap_write_done()): each not written (its result), each queued
 * without AP_WDEC_KEPT (@p poked false: each but one queued with
 * AP_WDEC_KEPT, the writer has not run). When the writer ran, every write
 * not kept is one ap_decide() queued and the writer wrote the bytes of
 * every write (each counted at most once), only those slots are looked at.
 */
AP_HOT static void ap_writes_fold(struct ap_run *r, bool poked)
{
    size_t hint = 0, lo = 0, hi = r->nwrites;
    const struct ap_write *w = r->writes;
    if (poked && !r->unkept_any && r->nkept + r->nunkept == hi &&
        r->pst.bytes - r->part_bytes == r->kept_bytes + r->unkept_bytes) {
        if (!r->nunkept)
            return;
        lo = r->unkept_lo;
        hi = r->unkept_hi;
    }
    /* a write that landed (result 0, or no writer: a dry run) with
     * AP_WDEC_KEPT has nothing left to do */
    uint32_t mask = poked ? 0xffu : 0;
    for (size_t k = lo; k < hi; k++)
        if (((uint32_t)(uint8_t)w[k].result & mask) | (~w[k].tag & AP_WDEC_KEPT))
            ap_write_done(r, k, &hint);
}

/* Every pending write of @p w[0..n) WRITE_DENIED: the writer stopped (-ENOMEM, -EBUSY). */
static void ap_writes_deny(struct ap_write *w, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (ap_write_pending(&w[k]))
            w[k].result = ALTPATCH_REASON_WRITE_DENIED;
}

static int ap_run_fresh(struct ap_run *r);

/*
 * Write the queue r->writes[0 .. r->nwrites) as one part (a first
 * decision's, in address order, ap_poke() with r->pf; a part after the first
 * continues its page count) and fold the answers in at once, exactly as
 * ap_writes_done() would after the last; then its slots are free again
 * (r->nwrites 0). The writer's first error is kept in r->part_err; after
 * -ENOMEM (the writer stopped) no part is handed to it any more: each of its
 * pending writes is WRITE_DENIED, as ap_poke() reports its own rest.
 */
static __attribute__((noinline)) void ap_part_write(struct ap_run *r)
{
    struct ap_write *w = r->writes;
    size_t nw = r->nwrites;
    if (r->part_err != -ENOMEM && r->part_err != -EBUSY) {
        /* the print callback ran since the proof: asked again (-EBUSY: this
         * part and every one after it not written) */
        int err = ap_run_fresh(r);
        if (err)
            r->part_err = err;
    }
    if (r->part_err == -ENOMEM || r->part_err == -EBUSY) {
        ap_writes_deny(w, nw);
    } else if (r->live) {
        /* threads started by the callback, the flags allow the live writer */
        r->wrote = true;
        int err = ap_live_poke(w, nw, &r->pst);
        if (err && !r->part_err)
            r->part_err = err;
    } else {
        /* the pages each part counts remembered: a last batch out of
         * address order does not count them again */
        r->wrote = true;
        int err = ap_poke(w, nw,
                          r->pf | AP_POKE_RUNS | AP_POKE_PREFAULT |
                              (r->poked ? AP_POKE_CONTINUE : 0),
                          &r->pst);
        if (err && !r->part_err)
            r->part_err = err;
    }
    r->poked = true;
    ap_writes_fold(r, true);
    r->nparted += nw;
    r->nwrites = 0;
    r->nkept = 0;
    r->kept_bytes = 0;
    r->nunkept = 0;
    r->unkept_bytes = 0;
    r->unkept_any = false;
    r->part_bytes = r->pst.bytes;
}

/* The decision loop's counters and queue position, kept in registers while
 * it runs, back into the run (before ap_decide() and at the end). */
static inline void ap_loop_flush(struct ap_run *r, struct ap_mrun *mr, size_t n, size_t nw,
                                 uintptr_t wlast, bool unsorted, uint64_t patched,
                                 uint64_t unchanged)
{
    r->ndec = n;
    r->nwrites = nw;
    r->wlast = wlast;
    r->unsorted = unsorted;
    r->patched_n += patched;
    r->unchanged_n += unchanged;
    mr->patched += patched;
}

/* A site the loop does not take inline: its counters flushed, ap_decide(),
 * the queue position read back. The next free bytes of the arena returned. */
static inline __attribute__((always_inline)) uint8_t *
ap_loop_slow(struct ap_run *r, struct ap_mrun *mr, size_t n, size_t i, size_t len, uint8_t *slot,
             struct ap_memo *memo, size_t *nw, uintptr_t *wlast, bool *unsorted,
             uint64_t *patched, uint64_t *unchanged)
{
    ap_loop_flush(r, mr, n, *nw, *wlast, *unsorted, *patched, *unchanged);
    *patched = *unchanged = 0;
    ap_decide(r, mr, i, slot, memo);
    *nw = r->nwrites;
    *wlast = r->wlast;
    *unsorted = r->unsorted;
    return r->dec[n].target == slot ? slot + len : slot;
}

/*
 * Every site of module @p mr through ap_decide()'s rules (final bytes
 * computed for a site go to @p slot, then the next bytes: only the sites
 * that need them touch the arena), the common case inline: a site inside the text of a module with a table, whose plan is
 * the original (no entry applies) or a template that fits here, and whose
 * memory holds the target, the original or what the last apply left. Any
 * other site goes through ap_decide() itself (the planner, refusals, the
 * log), as does every site under ALTPATCH_DEBUG.
 */
static __attribute__((noinline)) void ap_decide_module(struct ap_run *r, struct ap_mrun *mr,
                                                       uint8_t *slot, struct ap_memo *memo)
{
    struct ap_module *m = mr->m;
    /* copies: the stores below (bytes) could alias any field read through m or r */
    const struct ap_tsite *sites = m->sites;
    const struct ap_table_ref tab = ap_table_ref(m);
    struct ap_site_state *st = m->st;
    const uint8_t *morig = m->orig;
    uint8_t *mplanned = m->planned;
    const struct ap_entry *ments = m->entries;
    const struct ap_memo_tmpl *tmpl = memo->tmpl;
    const struct ap_region repl = m->view.repl; /* read once, not per site */
    struct ap_write *writes = r->writes;
    size_t nsites = m->nsites, n = r->ndec, nw = r->nwrites, nkept = 0;
    uint64_t patched = 0, unchanged = 0, kept_bytes = 0;
    uintptr_t wlast = r->wlast;
    bool revert = r->revert, keep = r->keep, unsorted = r->unsorted;
    const size_t nw0 = nw, nunkept0 = r->nunkept;
    size_t offrun = 0;     /* the next site's bytes (host.h: ap_orig_off()) */
    uint32_t firstrun = 0; /* its first record (host.h: ap_site_first()) */
    if (m->reason || r->debug) {
        for (size_t i = 0; i < nsites; i++) {
            ap_decide(r, mr, i, slot, memo);
            if (r->dec[r->ndec - 1].target == slot)
                slot += sites[i].len; /* used: the next one gets the next bytes */
        }
        return;
    }
    for (size_t i = 0; i < nsites; i++, n++) {
        /* the site, its address from its first record */
        const struct ap_site site = ap_tsite_site(tab.p, tab.addr, tab.rs, firstrun, &sites[i]),
                             *s = &site;
        uint32_t id = ap_shape_load(st[i].shape);
        size_t len = s->len, off = offrun;
        offrun += len;
        firstrun += sites[i].count;
        const uint8_t *cur = (const uint8_t *)(uintptr_t)s->addr;
        if (ap_site_outside(m, i))
            goto slow; /* outside the text: refused */
        const uint8_t *orig = morig + off, *planned = mplanned + off, *target = orig;
        int chosen = -1;
        if (!id) { /* orig saved: the site lies in the module's text (module.c) */
            struct ap_site_entries eb;
            const struct ap_site *es = s;
            const struct ap_entry *ents = ments; /* the first apply: every record */
            if (!ents)
                ents = ap_module_decode_entries(m, i, &eb, &es);
            /* no entry applies: the original, after the record checks alone
             * (one entry, the common site: the test without its loop) */
            uint32_t count = s->count;
            if (!s->reason && len &&
                (count == 1 ? ap_memo_keeps_original_entries(memo, &repl, (unsigned)len,
                                                             &ents[es->first], 1)
                            : count && ap_memo_keeps_original_entries(memo, &repl, (unsigned)len,
                                                                      &ents[es->first], count)))
                id = AP_SHAPE_ORIGINAL;
            else
                id = ap_memo_find_text(memo, &m->view, es, ents, orig);
            if (!id)
                goto slow; /* a new shape, or refused: the planner */
            /* a lookup stores nothing: tmpl is still memo->tmpl */
        }
        if (id != AP_SHAPE_ORIGINAL) {
            const struct ap_memo_tmpl *t = &tmpl[id - 1];
            if (t->nfields) {
                struct ap_site_entries eb;
                const struct ap_site *es;
                const struct ap_entry *ents = ap_module_site_entries(m, i, &eb, &es);
                chosen = ap_memo_inst_fields(memo, id, &m->view, es, ents, slot, &target);
                if (chosen < -1)
                    goto slow; /* a field does not fit here: the planner says why */
            } else {
                chosen = t->chosen;
                target = t->key + 2 * (size_t)t->keylen; /* the same bytes at every site */
            }
            if (chosen < 0 || revert) {
                chosen = -1;
                target = orig;
            }
        }
        st[i].shape = ap_shape_store(id);
        if (ap_same_site(cur, target, len)) {
            bool p = chosen >= 0;
            st[i].res = ap_res_ok(chosen);
            patched += p;
            unchanged++;
            if (keep)
                ap_copy_small(mplanned + off, target, len);
        } else {
            const uint8_t *old = ap_same_site(cur, orig, len)      ? orig
                                 : ap_same_site(cur, planned, len) ? planned
                                                                     : NULL;
            if (!old)
                goto slow; /* someone else's bytes: refused */
            unsorted |= (uintptr_t)cur <= wlast;
            wlast = (uintptr_t)cur;
            /* recorded now, as if the write lands (ap_writes_done() undoes
             * it when not); what memory holds is kept after the writer */
            bool p = chosen >= 0;
            st[i].res = ap_res_ok(chosen);
            patched += p;
            uint32_t tag = (uint32_t)n | AP_WDEC_DONE;
            if (keep && old == orig && ap_same_site(planned, orig, len)) {
                /* nothing to do after the writer when the write lands */
                ap_copy_small(mplanned + off, target, len);
                tag |= AP_WDEC_KEPT;
                nkept++;
                kept_bytes += len;
            }
            ap_queue(writes, nw++, (uintptr_t)cur, old, target, tag, len);
        }
        if (target == slot)
            slot += len; /* used: the next one gets the next bytes */
        continue;
    slow:
        slot = ap_loop_slow(r, mr, n, i, len, slot, memo, &nw, &wlast, &unsorted, &patched,
                            &unchanged);
        tmpl = memo->tmpl; /* the planner may have stored a template */
    }
    ap_loop_flush(r, mr, n, nw, wlast, unsorted, patched, unchanged);
    r->nkept += nkept;
    r->kept_bytes += kept_bytes;
    /* writes of the loop without AP_WDEC_KEPT: the queue's growth less
     * ap_decide()'s (tracked) and the kept ones */
    if (nw - nw0 - (r->nunkept - nunkept0) != nkept)
        r->unkept_any = true;
}

/*
 * ap_decide_module() for a module whose per-site arrays are not filled yet
 * (!m->saved: no apply and no site walk has read them), in an apply that
 * writes and does not revert: each site's original is saved from memory as
 * it is decided (ap_module_save_all()'s work, in the same pass), so memory
 * holds the original; a site whose plan is its original changes nothing and
 * costs the plan alone. A patched site is recorded when it is queued
 * (AP_WDEC_KEPT); its plan is not stored, its template gives it again
 * (host.h: m->planned_memo). Any other site goes through ap_decide() once
 * its arrays are filled.
 */
static inline __attribute__((always_inline)) void
ap_decide_first_loop(struct ap_run *r, struct ap_mrun *mr, uint8_t *slot, struct ap_memo *memo,
                     bool plain, bool decode, uint32_t rs)
{
    struct ap_module *m = mr->m;
    /* copies: the stores below (bytes) could alias any field read through m or r */
    const struct ap_tsite *sites = m->sites;
    struct ap_site_state *st = m->st;
    uint8_t *morig = m->orig;
    uint8_t *mplanned = m->planned;
    /* @p decode: each site's records decoded from the mapped table as it is
     * decided (ap_record_at(), records of @p rs bytes); else the table
     * pass's array (a small table, or one with a site of many records) */
    const struct ap_entry *ments = decode ? NULL : m->entries;
    const uint8_t *table = (const uint8_t *)(uintptr_t)m->note.table_start;
    const uint64_t table_addr = m->note.table_start;
    const struct ap_memo_tmpl *tmpl = memo->tmpl;
    const struct ap_region repl = m->view.repl; /* read once, not per site */
    /* the queue: written in parts of r->part writes (ap_part_size()) while every write so
     * far is in address order (ap_part_write()) */
    struct ap_write *writes = r->writes;
    /* (m->parts_apart: its sites lie apart from its records and
     * replacements, so no part changes what a later site of it reads) */
    const bool parts = !r->live && !r->parts_off && m->parts_apart;
    const size_t part = r->part;
    size_t nsites = m->nsites, n = r->ndec, nw = r->nwrites, nkept = 0;
    uint64_t patched = 0, unchanged = 0, kept_bytes = 0;
    uintptr_t wlast = r->wlast;
    bool unsorted = r->unsorted;
    /* the next site's bytes: its original at orig, its plan at orig + pdelta
     * (m->planned and m->orig: one block, module.c) */
    uint8_t *orig = morig;
    const size_t pdelta = (size_t)(mplanned - morig);
    struct ap_region_cursor rc = {0};
    /* plain: the module's facts hold (host.h): every site lies in one
     * region, none has a preset reason (so none is empty), every record
     * passes the checks ap_memo_keeps_original_plain() leaves out */
    const struct ap_region *text = m->text_all;
    const uint64_t tbase = plain ? (uint64_t)(uintptr_t)text->data - text->addr : 0;
    /* A decoded table's keep bits, the memo's keep[flag][w] bit b at
     * keep2[w] bit 2 * b + flag: a one-record site's test is then one word
     * at its feature times two plus its flag (plain: the feature below
     * AP_SCAN_FEATURES, the flag ALT_FLAG_NOT or none) */
    _Static_assert(ALT_FLAG_NOT == 1 && AP_SCAN_FEATURES == 32 * AP_NCAPWORDS,
                   "ALT_FLAG_NOT bit 0, features below 32 * AP_NCAPWORDS");
    uint64_t keep2[AP_NCAPWORDS];
    if (decode && plain)
        for (unsigned w = 0; w < AP_NCAPWORDS; w++)
            keep2[w] = ap_bits_spread(memo->keep[0][w]) | ap_bits_spread(memo->keep[1][w]) << 1;
    m->saved = true; /* every site's arrays are filled below */
    m->shape_gen = ap_shapes_gen;
    /* planned is written only where a site has no template to give it again
     * (host.h): its pages stay absent */
    m->planned_memo = memo;
    /* the sites and their states by pointer: the index (i, and n the
     * decision's) is computed where a write or the slow path needs it */
    const struct ap_tsite *s = sites, *const send = sites + nsites;
    struct ap_site_state *sp = st;
    const size_t n0 = n;
    bool hints = ap_memo_hints_in(memo, &repl);
    /* the site's first record: the records of the sites before it */
    size_t first = 0;
    for (; s != send; first += s->count, s++, sp++) {
        size_t len = s->len;
        /* the site's address: its first record's */
        uint64_t addr = decode ? ap_record_site(table, table_addr, rs, first) : ments[first].site;
        /* memory (a module's view of live memory maps every address to itself) */
        const uint8_t *cur = plain ? (const uint8_t *)(uintptr_t)(tbase + addr)
                                   : ap_region_at(&rc, &m->view, addr, (uint8_t)len);
        if (!plain && !cur) {
            /* outside the text (m->outside says so too): refused */
            ap_site_state_put(sp, ap_res_ok(-1), 0);
            orig += len; /* its bytes, never written */
            goto slow;
        }
        /* the plan from memory's bytes: the original, saved below (at orig,
         * planned; the next site's follow). The site's state is stored once,
         * whole, when it is decided (one store where it keeps its original) */
        const uint8_t *target;
        uint32_t count = s->count, id;
        int chosen;
        /* the site's records: decoded (at most AP_SITE_ENTRIES: module.c
         * keeps them all when a site has more), the site given first = 0 */
        struct ap_site_entries eb;
        const struct ap_site *es = &eb.site;
        const struct ap_entry *ents = ments;
        if (decode && plain && count == 1) {
            /* one record: the keep bit from its raw feature word and its
             * replacement length (the last byte), decoded only when it may
             * apply. Its feature times two plus its flags (plain: the
             * feature below AP_SCAN_FEATURES, no flag but ALT_FLAG_NOT):
             * its bit in keep2. */
            const uint8_t *p = table + first * rs;
            unsigned rw = ap_record_feature2(ap_record_tail(p, rs), rs);
            rw &= 64u * AP_NCAPWORDS - 1; /* plain: already below (a bound for the index) */
            uint64_t kw = keep2[rw >> 6] >> (rw & 63u);
            if ((kw & 1u) && p[rs - 1] <= len) {
                /* memory holds the original: saved from it, nothing else
                 * changes (as below, for the common site) */
                ap_site_state_put(sp, ap_res_ok(-1), AP_SHAPE_ORIGINAL16);
                ap_copy_small(orig, cur, len);
                orig += len;
                unchanged++;
                continue;
            }
        }
        /* the site as the memo takes it (first = 0 where its records are
         * decoded into eb.e), stored as the memo loads it: its bytes 12..15
         * (count, reason, len) in one word, which a load of them gets from
         * the store buffer (a copy field by field stalled that load) */
        _Static_assert(offsetof(struct ap_site, first) == 8 && offsetof(struct ap_site, count) == 12 &&
                           sizeof(struct ap_site) == 16 && offsetof(struct ap_tsite, count) == 0 &&
                           sizeof(struct ap_tsite) == 4,
                       "struct ap_site: addr, first, then bytes 12..15; ap_tsite's 0..3");
        eb.site.addr = addr;
        eb.site.first = decode ? 0 : (uint32_t)first;
        memcpy((uint8_t *)&eb.site + 12, s, 4);
        if (decode) {
            if (count == 1)
                ap_record_at(table, table_addr, rs, first, &eb.e[0]);
            else
                for (uint32_t k = 0; k < count && k < AP_SITE_ENTRIES; k++)
                    ap_record_at(table, table_addr, rs, first + k, &eb.e[k]);
            ents = eb.e;
        }
        const struct ap_entry *se = &ents[es->first];
        /* no entry applies: the original, after the record checks alone (one
         * entry, the common site: the test without its loop) */
        bool keeps;
        if (decode && plain && count == 1)
            keeps = false; /* its record's test above */
        else if (plain) /* no reason, a length; the scan gives every site an entry */
            keeps = count == 1 ? ap_memo_keeps_original_plain(memo, (unsigned)len, se, 1)
                               : ap_memo_keeps_original_plain(memo, (unsigned)len, se, count);
        else
            keeps = !s->reason && len &&
                    (count == 1 ? ap_memo_keeps_original_entries(memo, &repl, (unsigned)len, se, 1)
                                : count && ap_memo_keeps_original_entries(memo, &repl,
                                                                          (unsigned)len, se, count));
        if (keeps) {
            id = AP_SHAPE_ORIGINAL;
            chosen = -1;
        } else {
            /* a hint, where they hold for this module's replacements (a
             * full lookup or the planner may make them hold) */
            id = hints ? ap_memo_find_hint(memo, es, ents, cur) : 0;
            if (!id) {
                id = ap_memo_find_full(memo, &m->view, es, ents, cur);
                hints = ap_memo_hints_in(memo, &repl);
            }
            if (!id) {
                ap_copy2_small(orig, orig + pdelta, cur, len);
                orig += len;
                ap_site_state_put(sp, ap_res_ok(-1), 0);
                goto slow; /* a new shape, or refused: the planner */
            }
            /* a lookup stores nothing: tmpl is still memo->tmpl */
            const struct ap_memo_tmpl *t = &tmpl[id - 1];
            if (t->nfields) {
                /* instantiated in the run's arena: the write's new bytes
                 * (the next site's go after them, below) */
                chosen = ap_memo_inst_fields(memo, id, &m->view, es, ents, slot, &target);
                if (chosen < -1) {
                    ap_copy2_small(orig, orig + pdelta, cur, len);
                    orig += len;
                    ap_site_state_put(sp, ap_res_ok(-1), ap_shape_store(id));
                    goto slow; /* a field does not fit here: the planner says why */
                }
            } else {
                chosen = t->chosen;
                target = t->key + 2 * (size_t)t->keylen; /* the same bytes at every site */
            }
        }
        const uint16_t shape = ap_shape_store(id);
        ap_site_state_put(sp, ap_res_ok(chosen), shape);
        if (chosen < 0) {
            /* memory holds the original: saved from it, nothing else changes */
            ap_copy_small(orig, cur, len);
            orig += len;
            unchanged++;
            continue;
        }
        patched++;
        ap_copy_small(orig, cur, len);
        /* planned: the template gives it again, unless its id is too large
         * to be kept (then stored, as the planner's sites are) */
        if (__builtin_expect(!shape, 0))
            ap_copy_small(orig + pdelta, target, len);
        const uint8_t *saved = orig;
        orig += len;
        if (ap_same_site(cur, target, len)) {
            unchanged++;
        } else {
            /* memory holds the original; recorded now, as if the write lands
             * (ap_writes_done() puts the original back into planned when
             * not) */
            unsorted |= (uintptr_t)addr <= wlast;
            wlast = (uintptr_t)addr;
            ap_queue(writes, nw++, (uintptr_t)addr, saved, target,
                     (uint32_t)(n0 + (size_t)(s - sites)) | AP_WDEC_DONE | AP_WDEC_KEPT, len);
            nkept++;
            kept_bytes += len;
            if (__builtin_expect(nw >= part, 0) && parts && !unsorted) {
                /* a part in address order: written while its sites' bytes
                 * are in the caches, its slots used again */
                ap_loop_flush(r, mr, n0 + (size_t)(s - sites) + 1, nw, wlast, unsorted, patched,
                              unchanged);
                patched = unchanged = 0;
                r->nkept += nkept;
                r->kept_bytes += kept_bytes;
                nkept = 0;
                kept_bytes = 0;
                ap_part_write(r);
                nw = 0;
            }
        }
        if (target == slot)
            slot += len; /* used: the next one gets the next bytes */
        continue;
    slow:
        slot = ap_loop_slow(r, mr, n0 + (size_t)(s - sites), (size_t)(s - sites), len, slot, memo,
                            &nw, &wlast, &unsorted, &patched, &unchanged);
        tmpl = memo->tmpl; /* the planner may have stored a template */
        hints = ap_memo_hints_in(memo, &repl); /* or made or dropped hints */
    }
    n = n0 + nsites;
    ap_loop_flush(r, mr, n, nw, wlast, unsorted, patched, unchanged);
    r->nkept += nkept;
    r->kept_bytes += kept_bytes;
}

/* Each kind of module in a function of its own: the inline helpers the loop
 * calls (the memo's lookup, the copies) stay inline in each. */
#define AP_DECIDE_FIRST_KIND(attrs, name, plain, decode, rs)                                     \
    static attrs __attribute__((noinline)) void name(struct ap_run *r, struct ap_mrun *mr,             \
                                               uint8_t *slot, struct ap_memo *memo)              \
    {                                                                                            \
        ap_decide_first_loop(r, mr, slot, memo, plain, decode, rs);                              \
    }
/* a module whose facts do not hold: records kept or decoded, of its own size */
static __attribute__((noinline)) void ap_decide_first_any(struct ap_run *r, struct ap_mrun *mr,
                                                          uint8_t *slot, struct ap_memo *memo)
{
    ap_decide_first_loop(r, mr, slot, memo, false, !mr->m->entries, mr->m->note.record_size);
}
/* a small table: its records in the table pass's array */
AP_DECIDE_FIRST_KIND(AP_PLAIN_PATH, ap_decide_first_kept, true, false, ALTPATCH_RECORD_SIZE_KERNEL)
/* a large table: each site's records decoded, format 3 or format 1 */
AP_DECIDE_FIRST_KIND(, ap_decide_first_compact, true, true, ALTPATCH_RECORD_SIZE_COMPACT)
AP_DECIDE_FIRST_KIND(, ap_decide_first_kernel, true, true, ALTPATCH_RECORD_SIZE_KERNEL)
#undef AP_DECIDE_FIRST_KIND

AP_PLAIN_PATH static __attribute__((noinline)) void ap_decide_first(struct ap_run *r, struct ap_mrun *mr,
                                                      uint8_t *slot, struct ap_memo *memo)
{
    const struct ap_module *m = mr->m;
    if (!(m->records_plain && m->text_all))
        ap_decide_first_any(r, mr, slot, memo);
    else if (m->entries)
        ap_decide_first_kept(r, mr, slot, memo);
    else if (m->note.record_size == ALTPATCH_RECORD_SIZE_COMPACT)
        ap_decide_first_compact(r, mr, slot, memo);
    else
        ap_decide_first_kernel(r, mr, slot, memo);
}

/** What the last apply left at site @p i of a settled module @p m. */
static inline const uint8_t *ap_left(const struct ap_module *m, size_t i)
{
    return (m->left_orig ? m->orig : m->planned) + ap_orig_off(m, i);
}

/*
 * ap_still_settled() for a module whose first decision left planned to its
 * templates (host.h: planned_memo): each site's memory against what its
 * state gives (ap_module_plan_bytes(), instantiated in a buffer where it
 * has relative fields) -- nothing written, planned's pages stay absent.
 */
static __attribute__((noinline)) bool ap_still_settled_templates(const struct ap_module *m)
{
    const struct ap_tsite *sites = m->sites;
    const struct ap_table_ref tab = ap_table_ref(m);
    size_t off = 0;
    uint32_t first = 0;
    for (size_t i = 0, n = m->nsites; i < n; off += sites[i].len, first += sites[i].count, i++) {
        uint8_t buf[256];
        const uint8_t *left = ap_module_plan_bytes(m, m->planned_memo, i, first, off, buf);
        if (!left || !ap_same_site((const uint8_t *)(uintptr_t)ap_table_site_addr(&tab, first),
                                   left, sites[i].len))
            return false;
    }
    return true;
}

/*
 * A settled module (host.h) under the same memo generation: every site's
 * plan is the one the last apply made, and memory held then what that apply
 * left (the plan, or after a quick revert the originals), so a site whose
 * memory still holds it is decided -- unchanged -- by that one compare. True
 * when every site passes; any other site sends the whole module through
 * ap_decide().
 */
AP_HOT static __attribute__((noinline)) bool ap_still_settled(const struct ap_module *m)
{
    if (m->planned_memo)
        return ap_still_settled_templates(m);
    /* every site of a settled module lies in its text: each has its bytes,
     * after the last site's */
    const uint8_t *left = m->left_orig ? m->orig : m->planned;
    const struct ap_tsite *sites = m->sites;
    const struct ap_table_ref tab = ap_table_ref(m);
    uint32_t first = 0;
    for (size_t i = 0, n = m->nsites; i < n; i++) {
        uint64_t addr = ap_table_site_addr(&tab, first);
        if (!ap_same_site((const uint8_t *)(uintptr_t)addr, left, sites[i].len))
            return false;
        left += sites[i].len;
        first += sites[i].count;
    }
    return true;
}

/*
 * A settled module asked for the other side (a revert of its plan, or an
 * apply after such a revert): each site's target is known without deciding
 * -- its original, or its plan kept in m->planned (host.h) -- so a site
 * whose memory holds what the last apply left gets a write, one that holds
 * the target already is unchanged. False, with nothing queued, when some
 * site holds anything else: the module is then decided site by site.
 */
static __attribute__((noinline)) bool ap_toggle(struct ap_run *r, struct ap_mrun *mr)
{
    const struct ap_module *m = mr->m;
    /* copies (stores of bytes could alias them); every site of a settled
     * module lies in its text: each has its bytes, after the last site's */
    const struct ap_tsite *sites = m->sites;
    const struct ap_table_ref tab = ap_table_ref(m);
    struct ap_write *writes = r->writes;
    size_t n = r->ndec, nw = r->nwrites, w0 = nw;
    uint64_t kept_bytes = 0;
    uintptr_t wlast = r->wlast;
    bool revert = r->revert, unsorted = r->unsorted;
    /* the compares below count for the writer only after the run's proof
     * (asked before a switch: ap_collect_module()) and while no user code
     * has run since that proof: the first switch's (checked_calls) */
    const bool vouch = r->proved;
    if (!r->nchecked)
        r->checked_calls = r->proof_calls;
    const uint8_t *from = revert ? m->planned : m->orig;
    const uint8_t *to = revert ? m->orig : m->planned;
    size_t offrun = 0;
    uint32_t first = 0;
    for (size_t i = 0, ns = m->nsites; i < ns; i++, n++) {
        uintptr_t addr = (uintptr_t)ap_table_site_addr(&tab, first);
        size_t off = offrun, len = sites[i].len;
        offrun += len;
        first += sites[i].count;
        const uint8_t *cur = (const uint8_t *)addr;
        if (ap_same_site(cur, to + off, len))
            continue; /* also a plan that is the original */
        if (!ap_same_site(cur, from + off, len))
            return false; /* nothing kept: r is as it was */
        unsorted |= addr <= wlast;
        wlast = addr;
        /* the entry is read again only for a refused write (ap_toggle_decisions) */
        ap_queue(writes, nw++, addr, from + off, to + off, (uint32_t)n | AP_WDEC_KEPT, len);
        kept_bytes += len;
    }
    r->nkept += nw - w0;
    if (vouch)
        r->nchecked += nw - w0;
    r->kept_bytes += kept_bytes;
    r->ndec = n;
    r->nwrites = nw;
    r->wlast = wlast;
    r->unsorted = unsorted;
    mr->writes = nw - w0;
    return true;
}

/*
 * Whether module @p m's decision in run @p r is its first (the per-site
 * arrays not filled yet, its sites found by the table pass): each site's
 * original is then saved as it is decided (ap_decide_first()).
 */
static bool ap_first_decision(const struct ap_run *r, const struct ap_module *m)
{
    return !m->saved && m->block && r->keep && !r->revert && !r->debug && !m->reason;
}

/*
 * The module decided first: of the modules decided for the first time, the
 * one with the most records. Its writes, most of the run's, then go out in
 * parts in address order (ap_part_write()) whatever the other modules hold:
 * a module decided before it at a higher address would put every one of its
 * writes out of order, and the whole queue would wait for the sort.
 *
 * When its records are kept in an array for this apply only (a small table),
 * that array also holds the run's write queue (*wmod): it queues the write of
 * its site i (if any) into slot k <= i of its records, after it has read that
 * site's records from slot s->first >= i (each site has at least one record,
 * and none is read again: ap_module_site_entries() decodes from the table
 * once m->entries is NULL); a part written starts the queue at slot 0 again,
 * so k stays at or below i; the modules after it queue theirs behind. So a
 * first apply of a small program needs no fresh block for its writes. A
 * module whose records are decoded, or kept for good, holds no queue (*wmod
 * NULL: the queue is a block of its own).
 */
static struct ap_module *ap_first_module(const struct ap_run *r, struct ap_module **wmod)
{
    struct ap_module *best = NULL;
    for (struct ap_module *m = ap_mods; m; m = m->next)
        if (!m->gone && ap_first_decision(r, m) && (!best || m->nentries > best->nentries))
            best = m;
    *wmod = best && best->entries && !best->entries_keep ? best : NULL;
    return best;
}

/* The most bytes the run's buffers share (host.h). */
size_t ap_run_block_max = 32u << 20;

/*
 * The run's per-site buffers for @p n sites of @p bytes, once, when a module
 * needs them (an apply where every module is settled allocates none). malloc,
 * not calloc: an item is written whole when it is used, and only those pages
 * are touched (decisions and final bytes of slow sites, the sort's room when
 * needed). The write queue has a slot per site; in a run with a module's
 * first decision the pages of its first r->part slots are made present at
 * once where allowed (ap_malloc_filled()): that decision queues most sites
 * and writes them in parts of that many (ap_part_write()), the slots after
 * them touched only by writes queued outside its parts. A later apply finds
 * its queue in pages the heap has touched already. 0 or -ENOMEM, before any
 * decision: a failure leaves nothing half done.
 */
AP_PLAIN_PATH static int ap_run_buffers(struct ap_run *r, size_t n, size_t bytes)
{
    if (r->dec)
        return 0;
    struct ap_module *wm = r->wmod;
    if (wm && wm->nentries < n) {
        struct ap_entry *e = ap_mem_realloc(wm->entries, n * sizeof(*e));
        if (!e)
            return -ENOMEM;
        /* n slots now; m->nentries stays the record count (the slots
         * are the queue's from here, the records are read no more once
         * the module is decided) */
        wm->entries = e;
    }
    /* One block: the queue (unless the module's records hold it), the
     * decisions, the arena; a run of thousands of sites maps it apart from
     * the heap (malloc's threshold): one mapping made and unmade, not two.
     * The queue has a block of its own when the whole would pass
     * ap_run_block_max. */
    _Static_assert(sizeof(struct ap_write) % _Alignof(struct ap_dec) == 0,
                   "the queue, then the decisions, then bytes: each aligned in one block");
    size_t nn = n ? n : 1, qsize = wm ? 0 : nn * sizeof(*r->writes);
    size_t rest = nn * sizeof(*r->dec) + (bytes ? bytes : 1);
    bool apart = qsize && qsize + rest > ap_run_block_max;
    size_t size = (apart ? 0 : qsize) + rest;
    size_t head = r->first_any && qsize ? r->part * sizeof(*r->writes) : 0; /* made present */
    uint8_t *q, *b;
    if (!apart) {
        b = head ? ap_malloc_filled_head(size, head) : ap_mem_alloc(size);
        q = qsize ? b : NULL;
    } else {
        q = head ? ap_malloc_filled_head(qsize, head) : ap_mem_alloc(qsize);
        b = q ? ap_mem_alloc(size) : NULL;
    }
    if (!b || (qsize && !q)) {
        if (q != b)
            ap_mem_free(q);
        ap_mem_free(b);
        return -ENOMEM;
    }
    r->buf = b;
    r->writes = wm ? (struct ap_write *)(void *)wm->entries : (struct ap_write *)(void *)q;
    b += apart ? 0 : qsize;
    r->dec = (struct ap_dec *)(void *)b;
    r->arena = b + nn * sizeof(*r->dec);
    return 0;
}

static int ap_check_threads(unsigned flags, bool *live, bool *unfiltered);

/* The single-thread proof asked by the module walk's first large block
 * (ap_fill_ask()): 0 not asked, 1 alone and no seccomp filter, -1 not so. */
AP_STATE static int ap_alone_early;
/* ap_user_calls when it was asked: a later call into user code makes it old */
AP_STATE static unsigned long ap_alone_early_calls;

static bool ap_prove_alone(void)
{
    ap_alone_early_calls = ap_user_calls_now();
    bool alone = ap_mm_alone();
    ap_alone_early = alone ? 1 : -1;
    return alone;
}

/* A run of @p total sites written in one part at most (ap_part_size():
 * all its sites) and whose queue is not made present at once
 * (ap_malloc_filled_head(): 64 KiB and more): its first decisions may wait
 * for the proof until the writer, their writes then queued whole (no part:
 * ap_part_write()), as the one part of all its sites would have been. */
static bool ap_run_small(size_t total)
{
    return total <= (ap_part_writes ? ap_part_writes : 1) &&
           total * sizeof(struct ap_write) < AP_FILL_MIN;
}

/* A run refused before any write (ap_run_prove()): each module it decided for
 * the first time is one never decided again (memory holds its originals, the
 * next decision saves them afresh). */
static void ap_run_undecide(struct ap_run *r)
{
    for (size_t k = 0; k < r->nmods; k++)
        if (r->mods[k].first) {
            r->mods[k].m->saved = false;
            r->mods[k].m->planned_memo = NULL; /* nothing of it holds */
        }
}

/*
 * A run refused before any write after all its decisions (the proof asked
 * right before the writer, or asked again there: ap_run_fresh()). A module
 * decided again (a switch: another feature set, a revert) recorded its
 * sites as if their writes would land; each of its writes is denied and
 * folded in as after a writer that stopped (ap_part_write()'s -EBUSY), so
 * each such site is recorded as memory holds it (WRITE_DENIED, m->planned
 * what it held) and the module is no longer settled: the next apply decides
 * it again and writes. The modules decided for the first time are left
 * undecided (ap_run_undecide()).
 */
static void ap_run_undo(struct ap_run *r)
{
    ap_writes_deny(r->writes, r->nwrites);
    r->poked = true; /* each write's result: WRITE_DENIED */
    r->undone = true;
}

/*
 * What writing needs to know, asked once per run before its first write:
 * whether other threads run (the live protocol, or -EBUSY:
 * ap_check_threads()) and with it whether the writer may skip its seccomp
 * question (pf) and the queue's pages be made present at once
 * (ap_fill_allow()). Asked right before the run's first decision or quick
 * switch (ap_collect_module()), or -- where nothing can be written or made
 * present before the writer (ap_run_small()) and every module decided so far
 * is decided for the first time -- right before the writer (ap_run_locked()).
 * A run in which every module is settled on what it asks (no change, a
 * pre-patched file's plan for this set), or whose decisions queue no write,
 * asks nothing; a dry run never writes (ap_check_threads() answers at once).
 * ALTPATCH_APPLY_LIVE asks at the start. A yes of the module walk's first
 * large block (ap_prove_alone()) is taken as it is. -EBUSY before any
 * write: nothing written (ap_run_undo(), ap_run_undecide()).
 */
AP_PLAIN_PATH static int ap_run_prove(struct ap_run *r)
{
    if (r->proved)
        return 0;
    r->proved = true;
    bool live = false, unfiltered = false;
    int err = 0;
    if (ap_alone_early > 0 && ap_alone_early_calls == ap_user_calls_now()) {
        unfiltered = true; /* ap_check_threads()'s first answer, asked already */
        r->proof_calls = ap_alone_early_calls;
    } else {
        r->proof_calls = ap_user_calls_now();
        err = ap_check_threads(r->flags, &live, &unfiltered);
    }
    if (err)
        return err;
    r->live = live;
    if (unfiltered)
        r->pf |= AP_POKE_SECCOMP_OFF; /* alone, no filter: none can come before the call ends */
    else
        r->pf &= ~(unsigned)AP_POKE_SECCOMP_OFF;
    ap_fill_allow(unfiltered); /* ap_malloc_filled()'s madvise */
    return 0;
}

/*
 * The proof kept by the run, still true right before a write through a
 * non-live window: user code the library called since it was taken (the
 * print callback: ap_user_calls) may have started a thread or installed a
 * seccomp filter, so the proof is asked again then -- one unshare(), only
 * where such a call came -- and answers as a fresh one would: -EBUSY, or the
 * live writer where the flags allow it (r->live), the writer's seccomp
 * question and the queue's madvise as it says. A live run asks nothing again.
 */
static int ap_run_fresh(struct ap_run *r)
{
    if (!r->proved || r->live || r->proof_calls == ap_user_calls_now())
        return 0;
    r->proved = false;
    ap_alone_early = 0; /* old: asked before the call */
    return ap_run_prove(r);
}

/* Module @p m's part of the run: decided (or found settled, or switched)
 * with final bytes from arena + *@p bytes; @p total sites of @p total_bytes
 * in the run. 0, or -ENOMEM or ap_run_prove()'s -EBUSY (before the module's
 * first decision). */
AP_HOT static int ap_collect_module(struct ap_run *r, struct ap_module *m, struct ap_memo *memo,
                             size_t *bytes, size_t total, size_t total_bytes)
{
    struct ap_mrun *mr = &r->mods[r->nmods++];
    *mr = (struct ap_mrun){.m = m, .n0 = r->ndec, .ok = true, .path = AP_PATH_DECIDE};
    /* a module's first decision fills its per-site arrays as it goes */
    bool first = ap_first_decision(r, m);
    if (!first) {
        ap_module_save(m);
        /* the log shows what the last apply left; templates of another
         * generation are forgotten below, their plan bytes written first */
        if (r->debug || m->shape_gen != ap_shapes_gen)
            ap_module_planned(m);
    }
    ap_cache_check(m, ap_shapes_gen);
    /* a pre-patched module whose file chose what this feature set selects:
     * settled on memory's bytes, nothing planned (prepatch_load.c); a dry
     * run leaves the file's choices to the next apply */
    if (m->prepatch_choices &&
        (r->keep ? ap_prepatch_settle(m, &memo->fs) : ap_prepatch_look(m, &memo->fs))) {
        m->settled_gen = ap_shapes_gen;
        ap_log_env(r->debug, ALTPATCH_INFO,
                   "%s: pre-patched for this feature set: %zu sites as the file planned them\n",
                   m->path[0] ? m->path : "(main program)", m->nsites);
    }
    bool settled = m->settled_gen && m->settled_gen == ap_shapes_gen && !m->reason;
    bool stays = settled && r->revert == m->left_orig && ap_still_settled(m);
    /* every other path reads what the last apply left (a module that stays
     * was checked against its templates: planned's pages stay absent) */
    if (!stays && !first)
        ap_module_planned(m);
    /* settled from its plan note, not staying: its originals were read by
     * ap_needed_originals() (or could not be: refused), which decides as
     * above; never planned from memory's bytes taken for the originals */
    if (!stays && m->orig_in_file && !m->reason) {
        int err = ap_prepatch_need(m, true);
        if (err)
            return err;
        settled = settled && !m->reason && m->settled_gen;
    }
    if (stays) {
        mr->path = AP_PATH_SETTLED;
        ap_settled_found++;
    } else {
        /* before the first decision: a failure leaves nothing half done;
         * a small run's first decisions are asked for right before the
         * writer (ap_run_prove()): nothing written in a part before it */
        if (first && !r->proved && ap_run_small(total)) {
            r->parts_off = true;
        } else {
            int err = ap_run_prove(r);
            if (err)
                return err;
        }
        if (ap_run_buffers(r, total, total_bytes))
            return -ENOMEM;
        if (settled && r->revert != m->left_orig && r->keep && ap_toggle(r, mr)) {
            mr->path = AP_PATH_TOGGLE;
            /* its writes are read again by their place in the queue
             * (ap_toggle_decisions()): none written in a part */
            r->parts_off = true;
        }
    }
    if (mr->path == AP_PATH_SETTLED) {
        r->ndec += m->nsites; /* decided: what the last apply left (ap_record) */
    } else if (mr->path == AP_PATH_DECIDE) {
        if (m->left_orig) {
            /* what the last apply left is the originals (ap_decide's "planned") */
            ap_module_plan_originals(m);
            m->left_orig = false;
        }
        size_t w0 = r->nparted + r->nwrites;
        mr->first = first;
        if (first)
            ap_decide_first(r, mr, r->arena + *bytes, memo);
        else
            ap_decide_module(r, mr, r->arena + *bytes, memo);
        mr->writes = r->nparted + r->nwrites - w0;
        if (m == r->wmod)
            m->entries = NULL; /* its slots hold writes now */
    }
    *bytes += m->site_bytes;
    return 0;
}

/*
 * Read the file's originals of every module opened from its plan note that
 * this run needs them for -- anything but staying as it is, and every site's
 * original in a debug run -- before the first decision, in one pass: an
 * allocation failure then changes nothing. What ap_collect_module() decides
 * the same way (ap_prepatch_agrees() keeps its answer for the run). A file
 * that cannot be used refuses the module only where the run needs it.
 */
static int ap_needed_originals(struct ap_run *r, struct ap_memo *memo)
{
    for (struct ap_module *m = ap_mods; m; m = m->next) {
        if (m->gone || !m->orig_in_file || m->reason)
            continue;
        bool settled =
            (m->prepatch_choices && ap_prepatch_agrees(m, &memo->fs)) ||
            (m->settled_gen && m->settled_gen == ap_shapes_gen);
        bool stays = settled && r->revert == m->left_orig && ap_still_settled(m);
        if (stays && !r->debug)
            continue;
        int err = ap_prepatch_need(m, !stays);
        if (err)
            return err;
    }
    return 0;
}

static int ap_collect(struct ap_run *r, const struct altpatch_features *fs, unsigned flags)
{
    size_t n = 0, bytes = 0, nm = 0;
    for (struct ap_module *m = ap_mods; m; m = m->next) {
        if (m->gone)
            continue;
        n += m->nsites;
        bytes += m->site_bytes;
        nm++;
    }
    if (n > AP_WDEC_N)
        return -ENOMEM; /* decision numbers are 30-bit */
    r->part = ap_part_size(n);
    r->mods = ap_mem_alloc((nm ? nm : 1) * sizeof(*r->mods));
    if (!r->mods || (r->debug && ap_run_buffers(r, n, bytes)))
        return -ENOMEM;
    struct ap_memo *memo = ap_shapes_for(fs);
    r->keep = !(flags & ALTPATCH_APPLY_DRY_RUN);
    r->revert = flags & ALTPATCH_APPLY_REVERT;
    int err = ap_needed_originals(r, memo);
    if (err)
        return err;
    struct ap_module *first = ap_first_module(r, &r->wmod);
    r->first_any = first != NULL;
    size_t total = n, total_bytes = bytes;
    bytes = 0;
    /* that module first (r->mods stays in decision order) */
    err = first ? ap_collect_module(r, first, memo, &bytes, total, total_bytes) : 0;
    for (struct ap_module *m = ap_mods; m && !err; m = m->next)
        if (!m->gone && m != first)
            err = ap_collect_module(r, m, memo, &bytes, total, total_bytes);
    return err;
}

static int ap_cmp_write(const void *a, const void *b)
{
    const struct ap_write *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/*
 * Sort the batch by address (sites come per module, modules interleave).
 * Each write carries its decision's number (tag), so the writes alone move;
 * the decisions stay where they are: ap_write_done() reads a queued site's
 * chosen entry and reason there after the writer.
 */
static void ap_batch(struct ap_run *r)
{
    /* sites come in table order: usually sorted already (seen while queueing) */
    if (r->unsorted) {
        qsort(r->writes, r->nwrites, sizeof(*r->writes), ap_cmp_write);
        if (r->nunkept) /* the writes not kept moved: every slot is looked at */
            r->unkept_any = true;
    }
}

/** The module whose decisions hold decision @p n (@p hint: a guess). */
static struct ap_mrun *ap_mrun_of(struct ap_run *r, size_t n, size_t *hint)
{
    struct ap_mrun *mr = &r->mods[*hint];
    if (n >= mr->n0 && n - mr->n0 < mr->m->nsites)
        return mr;
    size_t lo = 0, hi = r->nmods; /* the last module with n0 <= n */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->mods[mid].n0 <= n)
            lo = mid;
        else
            hi = mid;
    }
    *hint = lo;
    return &r->mods[lo];
}

/* Write @p k of the run, not one that landed with nothing left to do. */
AP_PLAIN_PATH static __attribute__((noinline)) void ap_write_done(struct ap_run *r, size_t k, size_t *hint)
{
    const struct ap_write *w = &r->writes[k];
    uint32_t tag = w->tag;
    int result = r->poked ? w->result : ALTPATCH_REASON_NONE;
    size_t n = tag & AP_WDEC_N;
    bool done = tag & AP_WDEC_DONE;
    struct ap_mrun *mr = ap_mrun_of(r, n, hint);
    if (r->undone && mr->first)
        return; /* never decided (ap_run_undecide()) */
    struct ap_module *m = mr->m;
    size_t i = n - mr->n0;
    if (done && result == ALTPATCH_REASON_NONE) {
        /* recorded when decided; memory holds the new bytes */
        if (r->keep)
            ap_copy_small(m->planned + ap_orig_off(m, i), w->new, w->len);
        return;
    }
    if ((tag & (AP_WDEC_DONE | AP_WDEC_KEPT)) == (AP_WDEC_DONE | AP_WDEC_KEPT)) {
        /* memory holds the original (or a mismatch): planned did */
        size_t off = ap_orig_off(m, i);
        ap_copy_small(m->planned + off, m->orig + off, w->len);
    }
    if (result != ALTPATCH_REASON_NONE)
        mr->ok = false;
    if (mr->path != AP_PATH_DECIDE)
        return; /* a quick switch: ap_record() */
    struct ap_dec *d = &r->dec[n];
    /* the entry: recorded already (done), else in the decision */
    int chosen = done ? ap_res_chosen(&m->st[i].res) : d->chosen;
    if (result != ALTPATCH_REASON_NONE)
        *d = (struct ap_dec){w->new, -1, (int16_t)result, AP_ACT_REFUSED};
    if (r->debug) /* d was written by ap_decide(); ap_record() logs it */
        return;
    if (result != ALTPATCH_REASON_NONE) {
        if (done) { /* recorded as it would be: not so */
            bool p = chosen >= 0;
            r->patched_n -= p;
            mr->patched -= p;
        }
        ap_site_refused(r, mr, i, n);
    } else if (d->reason) {
        /* a refused site whose original was written back: still refused */
        ap_site_refused(r, mr, i, n);
    } else {
        struct ap_dec ok = {w->new, chosen, ALTPATCH_REASON_NONE, AP_ACT_WRITE};
        ap_site_ok(r, mr, &m->st[i].res, &ok, m->planned + ap_orig_off(m, i), m->sites[i].len);
    }
}

/*
 * The writes are done (or were not made: a dry run): fold the writer's
 * answers into the decisions and record the sites that had a write (the
 * others were recorded when decided), unless ALTPATCH_DEBUG records every
 * site in order afterwards.
 */
static void ap_writes_done(struct ap_run *r)
{
    /* every write kept (AP_WDEC_KEPT) and written (the writer counts the
     * bytes of each write it wrote, and a write's at most once): every
     * result is ALTPATCH_REASON_NONE, the pass below would find nothing to
     * do. Both counts: the bytes alone match when writes not kept (a
     * module's first sites of their shapes, planned one by one) are denied
     * while the kept ones (later sites of those shapes, elsewhere) land. The
     * live writer counts its own way: not taken from it. */
    if (r->live)
        r->unkept_any = true; /* the live writer's byte count is its own */
    ap_writes_fold(r, r->poked);
}

/*
 * The decisions of a quick switch (AP_PATH_TOGGLE) of module @p mr, made
 * again for the log or a refused write: each site's target, and the
 * writer's answer where a write was queued.
 */
static void ap_toggle_decisions(struct ap_run *r, struct ap_mrun *mr)
{
    const struct ap_module *m = mr->m;
    const uint8_t *to = r->revert ? m->orig : m->planned;
    for (size_t i = 0; i < m->nsites; i++)
        r->dec[mr->n0 + i] = (struct ap_dec){to + ap_orig_off(m, i),
                                             r->revert ? -1 : ap_res_chosen(&m->st[i].res),
                                             ALTPATCH_REASON_NONE, AP_ACT_UNCHANGED};
    for (size_t k = 0; k < r->nwrites; k++) {
        size_t n = r->writes[k].tag & AP_WDEC_N;
        if (n < mr->n0 || n - mr->n0 >= m->nsites)
            continue;
        int result = r->poked ? r->writes[k].result : ALTPATCH_REASON_NONE;
        r->dec[n].action = AP_ACT_WRITE;
        if (result != ALTPATCH_REASON_NONE)
            r->dec[n] = (struct ap_dec){r->dec[n].target, -1, (int16_t)result, AP_ACT_REFUSED};
    }
}

/*
 * A quick switch (AP_PATH_TOGGLE) where some write was refused: each site's
 * result as memory now holds it, and m->planned holding again what this
 * apply left at every site -- the target where it was reached, the bytes
 * before where not; the module is no longer settled.
 */
static void ap_toggle_failed(struct ap_run *r, struct ap_mrun *mr)
{
    struct ap_module *m = mr->m;
    bool keep = r->keep;
    ap_toggle_decisions(r, mr);
    r->keep = false; /* planned holds the plan: fixed below */
    for (size_t i = 0; i < m->nsites; i++) {
        const struct ap_dec *d = &r->dec[mr->n0 + i];
        bool reached = d->action != AP_ACT_REFUSED && !d->reason;
        size_t off = ap_orig_off(m, i);
        ap_site_done(r, mr, i, mr->n0 + i);
        /* a revert left the original where it wrote, an apply where it did not */
        if (reached == r->revert)
            ap_copy_small(m->planned + off, m->orig + off, m->sites[i].len);
    }
    r->keep = keep;
    m->left_orig = false;
    m->settled_gen = 0;
}

/** Record per-module results and the stats (after ap_writes_done()). */
static void ap_record(struct ap_run *r, struct altpatch_stats *st)
{
    for (size_t k = 0; k < r->nmods; k++) {
        struct ap_mrun *mr = &r->mods[k];
        struct ap_module *m = mr->m;
        st->modules++;
        if (r->undone && mr->first)
            continue; /* never decided (ap_run_undecide()) */
        if (mr->path == AP_PATH_DECIDE) {
            if (r->debug) /* every site, in order */
                for (size_t i = 0; i < m->nsites; i++)
                    ap_site_done(r, mr, i, mr->n0 + i);
            /* settled when memory now holds every site's plan: not after a
             * dry run (nothing written), a revert (not the plan), a refusal */
            m->settled_gen = mr->ok && r->keep && !r->revert ? ap_shapes_gen : 0;
            m->settled_patched = mr->patched;
            continue;
        }
        if (mr->path == AP_PATH_TOGGLE && !mr->ok) {
            ap_toggle_failed(r, mr);
            continue;
        }
        /* every site holds what was asked: the plan (res, settled_patched)
         * or, after a revert, the originals (left_orig: res keeps the plan's) */
        if (mr->path == AP_PATH_TOGGLE)
            m->left_orig = r->revert;
        r->patched_n += m->left_orig ? 0 : m->settled_patched;
        r->unchanged_n += m->nsites - mr->writes;
        if (r->debug && mr->path == AP_PATH_TOGGLE)
            ap_toggle_decisions(r, mr);
        for (size_t i = 0; r->debug && i < m->nsites; i++) {
            size_t n = mr->n0 + i;
            int chosen = m->left_orig ? -1 : ap_res_chosen(&m->st[i].res);
            if (mr->path == AP_PATH_SETTLED)
                r->dec[n] = (struct ap_dec){ap_left(m, i), chosen, ALTPATCH_REASON_NONE,
                                            AP_ACT_UNCHANGED};
            struct ap_work wk = ap_work_of(r, n, m, i);
            ap_debug_site(&wk);
        }
    }
    st->sites_seen += r->ndec;
    st->sites_refused += r->refused_n;
    st->sites_patched += r->patched_n;
    st->sites_unchanged += r->unchanged_n;
    st->bytes_written = r->pst.bytes;
    st->pages_written = r->pst.pages;
    st->syscalls = r->pst.syscalls;
    st->mprotect_windows = r->pst.mprotect_writes;
    st->procmem_writes = r->pst.procmem_writes;
}

/** The CPUID leaves that decide the features the records of @p mods reference. */
static unsigned ap_needed_leaves(const struct ap_module *mods)
{
    unsigned groups = AP_LEAVES_BASE;
    for (const struct ap_module *m = mods; m; m = m->next)
        groups |= m->leaves; /* module.c, when it read the records */
    return groups;
}

/* @p fs: the caller's set, or NULL for this host's effective set (read for
 * the features the records reference, once the modules are known).
 * -EBUSY when other threads run and they cannot be patched live
 * (ap_check_threads()), nothing done. */
static int ap_run_locked(const struct altpatch_features *fs, unsigned flags,
                         const struct ap_pins *pins, const struct ap_env *env,
                         struct altpatch_stats *st)
{
    struct ap_run r = {0};
    struct altpatch_features host;
    /* The module walk's large blocks (a table of thousands of records: its
     * sites, a module's per-site arrays) are made present at once when the
     * proof allows it, asked by the first of them only: an apply of small
     * tables (a program pre-patched at start-up) asks nothing before it
     * knows whether it writes. A dry run or the live protocol fills
     * nothing (ap_check_threads() proves nothing for them). */
    ap_alone_early = 0;
    if (!(flags & (ALTPATCH_APPLY_DRY_RUN | ALTPATCH_APPLY_LIVE)))
        ap_fill_ask(ap_prove_alone);
    int err = ap_modules_refresh_seen(&ap_mods, &pins->seen);
    if (!err)
        ap_pin(ap_mods, pins);
    if (!err && !fs) {
        ap_effective_leaves_cleared(ap_needed_leaves(ap_mods), env->clearcpuid, &host);
        fs = &host;
    }
    r.debug = ap_env_value_on(env->debug);
    r.flags = flags;
    r.pf = ((flags & ALTPATCH_APPLY_PROCMEM_ONLY) ? AP_POKE_PROCMEM_ONLY : 0) |
           ((flags & ALTPATCH_APPLY_NO_PROCMEM) ? AP_POKE_NO_PROCMEM : 0);
    /* the threads asked when the first decision comes (ap_run_prove()):
     * an apply that decides nothing writes nothing; one that asks for
     * the live protocol is answered at once */
    if (!err && (flags & ALTPATCH_APPLY_LIVE))
        err = ap_run_prove(&r);
    if (!err)
        err = ap_collect(&r, fs, flags);
    /* every module decided (an error of ap_collect() comes before the
     * decisions of a module decided again: its proof is asked before them) */
    bool collected = !err;
    if (!err)
        ap_batch(&r);
    if (!err && !(flags & ALTPATCH_APPLY_DRY_RUN) && r.nwrites) {
        err = ap_run_prove(&r); /* asked already, or deferred to here */
        /* asked again where the print callback ran since: nothing written
         * yet is -EBUSY with nothing done, after parts the rest is not
         * written */
        int e = err || r.part_err == -EBUSY || r.part_err == -ENOMEM ? 0 : ap_run_fresh(&r);
        if (e && !r.poked)
            err = e;
        else if (e)
            r.part_err = e;
    }
    if (err && !r.poked && collected && r.nwrites)
        ap_run_undo(&r);
    if (!err && !(flags & ALTPATCH_APPLY_DRY_RUN) && r.nwrites) {
        /* other threads may run the sites (docs/live.md); after parts
         * (ap_part_write()), the rest: the page count continues when every
         * write came in address order */
        if (r.live) {
            r.wrote = true;
            err = ap_live_poke(r.writes, r.nwrites, &r.pst);
        } else if (r.part_err == -ENOMEM || r.part_err == -EBUSY) {
            ap_writes_deny(r.writes, r.nwrites);
        } else {
            r.wrote = true;
            /* every write compared by a quick switch after the proof, no
             * user code run since the proof */
            bool checked = r.nchecked == r.nwrites && r.checked_calls == ap_user_calls_now();
            err = ap_poke(r.writes, r.nwrites,
                          r.pf | (r.first_any ? AP_POKE_PREFAULT : AP_POKE_SPANS) |
                              (checked ? AP_POKE_CHECKED : 0) |
                              (!r.poked     ? 0
                               : r.unsorted ? AP_POKE_NOT_RUNS
                                            : AP_POKE_CONTINUE),
                          &r.pst);
        }
        st->live = r.live;
        r.poked = true;
    }
    if (!err)
        err = r.part_err;
    /* refused at the first part, before any write (its proof asked again
     * there): nothing written, as ap_run_undo() after the decisions -- each
     * write was denied and folded in already, the modules decided for the
     * first time are left undecided, no writer to report */
    if (err == -EBUSY && r.poked && !r.undone && !r.wrote && collected)
        r.undone = true;
    if (err && r.poked && !r.undone)
        ap_log(ALTPATCH_WARN, "writer stopped: %s\n", strerror(-err));
    /* recorded when the writes were made, or none was needed (the sites
     * without one were recorded as they were decided), or every write was
     * denied before the writer (ap_run_undo(): the same stats as an -EBUSY
     * after parts, none kept by altpatch_apply_opts()) */
    if (r.mods && (!err || r.poked)) {
        ap_writes_done(&r);
        ap_record(&r, st);
        ap_applied |= !r.undone;
    }
    if (err && (!r.poked || r.undone))
        ap_run_undecide(&r);
    /* the queue's module not decided (a failure before): its records and
     * the queue are one block, freed below */
    if (r.wmod && r.wmod->entries == (struct ap_entry *)(void *)r.writes)
        r.wmod->entries = NULL;
    /* records parsed for this apply: from now on decoded when needed; a
     * pre-patched module's agreement holds for this apply's set only */
    for (struct ap_module *m = ap_mods; m; m = m->next) {
        m->prepatch_agreed = false;
        if (m->entries && !m->gone)
            ap_module_drop_entries(m);
    }
    ap_fill_allow(false);
    ap_unpin(ap_mods);
    for (size_t i = 0; i < r.ndetails; i++)
        free(r.details[i].text);
    ap_mem_free(r.details);
    if (r.writes != (struct ap_write *)r.buf)
        ap_mem_free(r.writes); /* a block of its own, or the records of r.wmod */
    ap_mem_free(r.buf);
    ap_mem_free(r.mods);
    if (r.pst.runs) /* free(NULL) would bind free() for nothing */
        free(r.pst.runs);
    return err;
}

/* ------------------------------------------------------------------------- */
/* Public entry points                                                       */
/* ------------------------------------------------------------------------- */

#define AP_APPLY_FLAGS                                                                     \
    (ALTPATCH_APPLY_DRY_RUN | ALTPATCH_APPLY_REVERT | ALTPATCH_APPLY_PROCMEM_ONLY |        \
     ALTPATCH_APPLY_NO_PROCMEM | ALTPATCH_APPLY_LIVE | ALTPATCH_APPLY_NO_LIVE |            \
     ALTPATCH_APPLY_FILTER_ALLOWS_LIVE)

/** libbpf-style check: sz covers at least the sz field; unknown tail bytes are zero. */
static bool ap_opts_valid(const void *opts, size_t sz, size_t known)
{
    if (sz < sizeof(size_t))
        return false;
    for (size_t i = known; i < sz; i++)
        if (((const uint8_t *)opts)[i])
            return false;
    return true;
}

/**
 * Copy the fields the caller's struct has; the rest stay defaults (zero).
 * The struct has no padding (`reserved` fills what was its tail padding), so
 * every byte past the known fields, `reserved` included, must be zero.
 */
static int ap_read_opts(const struct altpatch_apply_opts *in, struct altpatch_apply_opts *out)
{
    memset(out, 0, sizeof(*out));
    if (!in)
        return 0;
    if (!ap_opts_valid(in, in->sz, sizeof(*in)))
        return -EINVAL;
    memcpy(out, in, in->sz < sizeof(*out) ? in->sz : sizeof(*out));
    if (out->reserved || (out->flags & ~(unsigned)AP_APPLY_FLAGS))
        return -EINVAL;
    if ((out->flags & ALTPATCH_APPLY_PROCMEM_ONLY) && (out->flags & ALTPATCH_APPLY_NO_PROCMEM))
        return -EINVAL;
    /* the live protocol writes through /proc/self/mem only */
    if ((out->flags & ALTPATCH_APPLY_LIVE) &&
        (out->flags & (ALTPATCH_APPLY_NO_LIVE | ALTPATCH_APPLY_NO_PROCMEM)))
        return -EINVAL;
    return 0;
}

/**
 * Whether the writes must use the live protocol (*live): asked for, or other
 * threads run (docs/live.md); *unfiltered: the kernel proved this thread alone
 * and no seccomp filter on it (ap_mm_alone()). 0, or -EBUSY when other threads run and
 * live patching is refused (ALTPATCH_APPLY_NO_LIVE) or not possible.
 */
static int ap_check_threads(unsigned flags, bool *live, bool *unfiltered)
{
    *live = false;
    *unfiltered = false;
    if (flags & ALTPATCH_APPLY_DRY_RUN)
        return 0;
    int mm = ap_mm_state();
    if (!(flags & ALTPATCH_APPLY_LIVE) && mm == AP_MM_ALONE) {
        *unfiltered = true; /* and no seccomp filter: none can come before the call ends */
        return 0; /* the kernel says so: no /proc read */
    }
    long n = ap_count_threads();
    if (n == 1 && mm == AP_MM_UNKNOWN && !(flags & ALTPATCH_APPLY_LIVE))
        return 0; /* under a seccomp filter the task list is the only answer */
    if (n < 1) {
        /* no list (no /proc, no descriptor left): other threads may run, and
         * neither writer may guess */
        ap_log(ALTPATCH_WARN, "cannot list this process's threads (/proc/self/task): "
                              "nothing written\n");
        return -EBUSY;
    }
    if (n == 1 && mm == AP_MM_SHARED) {
        /* the kernel says another task uses this memory, and it is no
         * thread of this process: neither writer can see where it runs */
        ap_log(ALTPATCH_WARN, "another process shares this address space "
                              "(clone(CLONE_VM) without CLONE_THREAD): nothing written\n");
        return -EBUSY;
    }
    const char *why = "ALTPATCH_APPLY_NO_LIVE";
    bool may_live = !(flags & (ALTPATCH_APPLY_NO_LIVE | ALTPATCH_APPLY_NO_PROCMEM));
    /* mode 0 is known where the kernel answered unshare() */
    if (may_live && !(flags & ALTPATCH_APPLY_FILTER_ALLOWS_LIVE) && mm == AP_MM_UNKNOWN &&
        ap_seccomp_mode(NULL) != 0) {
        /* the protocol's calls (membarrier, mremap, process_vm_readv,
         * rt_tgsigqueueinfo, ...) are ones a filter may answer with a kill */
        why = "a seccomp filter is active and ALTPATCH_APPLY_FILTER_ALLOWS_LIVE was not given";
        may_live = false;
    }
    if (may_live && !ap_live_ready(&why)) {
        *live = true;
        return 0;
    }
    if (flags & ALTPATCH_APPLY_NO_PROCMEM)
        why = "ALTPATCH_APPLY_NO_PROCMEM (live patching writes through /proc/self/mem)";
    if (n > 1)
        ap_log(ALTPATCH_WARN,
               "%ld threads running: call altpatch_apply() before starting threads "
               "(live patching: %s)\n",
               n, why);
    else /* ALTPATCH_APPLY_LIVE on this thread alone (or no /proc): only live is refused */
        ap_log(ALTPATCH_WARN, "ALTPATCH_APPLY_LIVE: live patching is not possible: %s\n", why);
    return -EBUSY;
}

/*
 * The entry points that hold ap_lock or a gate passage are not cancellation
 * points: a thread cancelled at one of the C library's cancellation points
 * inside them (a log line's write, the maps file's read, a constructor run by
 * dlopen()) would leave the lock held for good, and every later call and
 * every fork() would wait for it. Cancellation is disabled for the call and
 * the thread's state given back at its end; a request made meanwhile acts at
 * the thread's next cancellation point after the call.
 */
static int ap_cancel_off(void)
{
    int old = PTHREAD_CANCEL_ENABLE;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    return old;
}

static void ap_cancel_restore(int old)
{
    if (old != PTHREAD_CANCEL_DISABLE)
        pthread_setcancelstate(old, NULL);
}

/*
 * A call on a thread that is already inside the library: from a callback, or
 * from a signal handler that interrupted one of its calls -- also where that
 * call holds the library's lock or the gate's without marking ap_in
 * (altpatch_get_stats(), the gate's own few instructions), or the CPUID
 * leaves' lock (altpatch_cpu_has(), altpatch_features_host()). Taking either lock
 * again would wait for this thread forever.
 */
static bool ap_reentered(void)
{
    uint32_t me = ap_token();
    return ap_in != AP_IN_NONE || ap_tlock_owner(&ap_lock) == me ||
           ap_tlock_owner(&ap_gate_mx) == me || ap_leaves_held_here();
}

AP_HOT int altpatch_apply_opts(const struct altpatch_apply_opts *opts)
{
    struct altpatch_apply_opts o;
    int err = ap_read_opts(opts, &o);
    if (err)
        return err;
    if (ap_reentered())
        return -EDEADLK; /* from a callback, or a signal handler that interrupted a call */
    ap_in = AP_IN_ENTRY;
    int cancel = ap_cancel_off();
    struct ap_pins pins;
    ap_pins_empty(&pins);
    struct ap_env env; /* ALTPATCH_OFF, _DEBUG, _CLEARCPUID: one pass */
    ap_env_read(&env);
    bool off = ap_env_value_on(env.off); /* nothing at all: not even the pins */
    if (!off)
        ap_pins_take(&pins); /* before ap_lock: see ap_pins */
    ap_tlock_lock(&ap_lock, ap_token());
    ap_in = AP_IN_LOCKED;
    uint64_t t0 = ap_now_ns();
    struct altpatch_stats st = {.sz = sizeof(st)};
    if (ap_lock_orphaned) {
        err = -EOWNERDEAD;
        ap_log(ALTPATCH_WARN, "forked while another thread was in altpatch: "
                              "nothing patched in this process\n");
    } else if (off) {
        ap_log_env(ap_env_value_on(env.debug), ALTPATCH_INFO,
                   "ALTPATCH_OFF is set: nothing patched\n");
    } else {
        err = ap_run_locked(o.features, o.flags, &pins, &env, &st);
    }
    if (err != -EBUSY && err != -EOWNERDEAD) {
        st.ns = ap_now_ns() - t0;
        ap_last = st;
        ap_log_env(ap_env_value_on(env.debug), ALTPATCH_INFO,
               "%lu modules, %lu sites: %lu patched, %lu unchanged, %lu refused; %lu bytes in "
               "%lu pages, %lu syscalls, %lu ns%s\n",
               (unsigned long)st.modules, (unsigned long)st.sites_seen,
               (unsigned long)st.sites_patched, (unsigned long)st.sites_unchanged,
               (unsigned long)st.sites_refused, (unsigned long)st.bytes_written,
               (unsigned long)st.pages_written, (unsigned long)st.syscalls,
               (unsigned long)st.ns, (o.flags & ALTPATCH_APPLY_DRY_RUN) ? " (dry run)" : "");
    }
    ap_in = AP_IN_ENTRY;
    ap_tlock_unlock(&ap_lock);
    ap_pins_release(&pins);
    ap_in = AP_IN_NONE;
    ap_cancel_restore(cancel);
    return err;
}

AP_HOT int altpatch_apply(void)
{
    return altpatch_apply_opts(NULL);
}

void *altpatch_dlopen(const char *path, int flags)
{
    if (ap_reentered()) {
        /* From a callback or a signal handler that interrupted a call: the
         * interrupted code may hold the loader's lock or malloc's. */
        errno = EDEADLK;
        return NULL;
    }
    int cancel = ap_cancel_off();
    ap_gate_enter(); /* a fork waits: no child with the loader's locks held */
    void *h = dlopen(path, flags);
    ap_gate_leave();
    ap_cancel_restore(cancel);
    if (!h)
        return NULL;
    int err = altpatch_apply();
    if (err)
        ap_log(ALTPATCH_WARN, "%s: loaded, not patched: %s\n", path ? path : "(main)",
               strerror(-err));
    return h;
}

int altpatch_get_stats(struct altpatch_stats *st)
{
    if (!st || st->sz < sizeof(size_t))
        return -EINVAL;
    size_t sz = st->sz;
    /* From a callback (or a handler that interrupted one of our calls while
     * it held ap_lock): the lock is already ours. From a handler that
     * interrupted a call around its lock: take it only if it is free. */
    uint32_t me = ap_token();
    bool lock = ap_tlock_owner(&ap_lock) != me;
    if (lock && ap_in != AP_IN_NONE) {
        if (!ap_tlock_try(&ap_lock, me))
            return -EDEADLK;
    } else if (lock) {
        ap_tlock_lock(&ap_lock, me);
    }
    struct altpatch_stats cp = ap_last;
    bool orphaned = ap_lock_orphaned;
    if (lock)
        ap_tlock_unlock(&ap_lock);
    if (orphaned)
        return -EOWNERDEAD;
    cp.sz = sz;
    memcpy(st, &cp, sz < sizeof(cp) ? sz : sizeof(cp));
    if (sz > sizeof(cp))
        memset((uint8_t *)st + sizeof(cp), 0, sz - sizeof(cp));
    return 0;
}

/** Fill @p info for site @p i of @p m. */
static void ap_site_info(const struct ap_module *m, size_t i, struct altpatch_site_info *info)
{
    const struct ap_site site = ap_site_get(m, i), *s = &site;
    const struct ap_site_result *res = &m->st[i].res;
    struct ap_site_entries eb;
    const struct ap_site *es;
    const struct ap_entry *ents = ap_module_site_entries(m, i, &eb, &es);
    /* after a quick revert res keeps the plan's result; memory holds the original */
    int chosen = m->left_orig ? -1 : ap_res_chosen(res);
    const struct ap_entry *e = &ents[es->first + (chosen >= 0 ? (uint32_t)chosen : 0)];
    size_t off = ap_orig_off(m, i);
    *info = (struct altpatch_site_info){
        .module = m->path,
        .addr = (uintptr_t)s->addr,
        .len = s->len,
        .entries = s->count,
        .chosen = chosen,
        .feature = e->feature,
        .flags = e->flags,
        .state = m->left_orig ? ALTPATCH_SITE_ORIGINAL : ap_res_state(res),
        .reason = m->left_orig ? ALTPATCH_REASON_NONE : ap_res_reason(res),
        /* never memory's bytes for the compiler's: absent while the file's
         * originals could not be read (prepatch_load.c) */
        .original = off != AP_NO_ORIG && !m->orig_in_file ? m->orig + off : NULL,
        .current = off != AP_NO_ORIG ? (const uint8_t *)(uintptr_t)s->addr : NULL,
    };
}

int altpatch_site_foreach(altpatch_site_fn fn, void *ctx)
{
    if (!fn)
        return -EINVAL;
    if (ap_reentered())
        return -EDEADLK;
    ap_in = AP_IN_ENTRY;
    int cancel = ap_cancel_off();
    struct ap_pins pins;
    ap_pins_take(&pins); /* before ap_lock: see ap_pins */
    ap_tlock_lock(&ap_lock, ap_token());
    ap_in = AP_IN_LOCKED;
    /* Drop modules dlclose'd since the last apply (their memory is gone); a
     * module loaded since is listed with its original bytes, as memory holds. */
    int ret = ap_lock_orphaned ? -EOWNERDEAD
              : ap_applied     ? ap_modules_refresh_seen(&ap_mods, &pins.seen)
                               : -ENODATA;
    if (!ret)
        ap_pin(ap_mods, &pins); /* the callback may read info.current */
    for (struct ap_module *m = ap_mods; m && !ret; m = m->next) {
        if (!m->gone)
            ap_module_save(m); /* not decided yet: memory holds the originals */
        if (!m->gone && m->orig_in_file)
            ret = ap_prepatch_need(m, false); /* listed with the file's originals */
        for (size_t i = 0; i < m->nsites && !ret && !m->gone; i++) {
            struct altpatch_site_info info;
            ap_site_info(m, i, &info);
            ret = fn(&info, ctx);
        }
    }
    if (!ap_lock_orphaned)
        ap_unpin(ap_mods);
    ap_in = AP_IN_ENTRY;
    ap_tlock_unlock(&ap_lock);
    ap_pins_release(&pins);
    ap_in = AP_IN_NONE;
    ap_cancel_restore(cancel);
    return ret;
}
