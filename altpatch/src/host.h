/* SPDX-License-Identifier: MIT */
/*
 * host.h - floor 3 of libaltpatch: this process and this CPU (floors below:
 * plan.h, pure.h, util.h).
 *
 *   cpu.c            the host's feature set (CPUID, XGETBV, AT_HWCAP2, ...),
 *                    ALTPATCH_CLEARCPUID, the "host" profile
 *   module.c         loaded modules and their tables (dl_iterate_phdr)
 *   view.c           the one builder of a module's view, for live memory and
 *                    for ELF files
 *   prepatch_load.c  a pre-patched module's originals, read from its file
 *   writer.c         what both writers share: the pending-write check, page
 *                    counting, signal masking, /proc/self/mem
 *   poke.c           the writer: RW windows, /proc/self/mem (knows no x86)
 *   live.c           the writer while other threads run (page flips, entry
 *                    barriers, handshake, membarrier)
 *   flip.c           page flips: staging copies of text pages moved in with
 *                    mremap() (knows no x86)
 *   frames.c         where a thread in a signal handler was interrupted (the
 *                    kernel's signal frames on its stacks), for live.c
 */
#ifndef ALTPATCH_HOST_H
#define ALTPATCH_HOST_H

#include "plan.h"

#include <linux/futex.h>
#include <sys/syscall.h>

/* ------------------------------------------------------------------------- */
/* This CPU (cpu.c)                                                          */
/* ------------------------------------------------------------------------- */

/** This process's features, computed once (thread-safe). Never NULL. */
AP_HIDDEN const struct altpatch_features *ap_host_features(void);
/** The effective host set: ap_host_features() minus ALTPATCH_CLEARCPUID (unless AT_SECURE). */
AP_HIDDEN void ap_effective_features(struct altpatch_features *out);

/* Groups of CPUID leaves, read lazily (each CPUID may be a hypervisor exit). */
#define AP_LEAVES_BASE 0x01u  /* leaf 0 (vendor) and 1: words 0, 4 */
#define AP_LEAVES_STD7 0x02u  /* leaf 7.0: words 9, 16, 18 */
#define AP_LEAVES_STDD 0x04u  /* leaf 0xd.1: word 10 */
#define AP_LEAVES_EXT1 0x08u  /* leaf 0x80000001: words 1, 6 */
#define AP_LEAVES_EXT7 0x10u  /* leaf 0x80000007: word 17, CONSTANT_TSC, NONSTOP_TSC */
#define AP_LEAVES_EXT8 0x20u  /* leaf 0x80000008: word 13 */
#define AP_LEAVES_EXT21 0x40u /* leaf 0x80000021: word 20 */
#define AP_LEAVES_STD71 0x80u /* leaf 7.1: word 12 (needs STD7: 7.0 gives the highest subleaf) */
#define AP_LEAVES_CPUID 0xffu /* the groups above: CPUID leaves */
/* Not leaves: what else decides a bit, asked only for features that need it. */
#define AP_LEAVES_LFENCE 0x100u /* LFENCE_RDTSC: the vendor rule, else leaf 0x80000021 */
#define AP_LEAVES_XCOMP 0x200u  /* AMX: the process's XTILEDATA permission (arch_prctl) */
#define AP_LEAVES_SHSTK 0x400u  /* SHSTK: whether the shadow stack is on (arch_prctl) */
#define AP_LEAVES_PROBE 0x800u  /* RDTSCP, RDPID: executed once under a SIGILL guard */
#define AP_LEAVES_KFLAGS 0x1000u /* RDSEED on AMD family 0x1a: the kernel's flags (/proc/cpuinfo) */
#define AP_LEAVES_ALL 0x1fffu
/** The groups of leaves that decide feature @p id (any id; BASE when none). */
AP_HIDDEN unsigned ap_feature_leaves(unsigned id);
/**
 * Leaf @p leaf, subleaf @p sub (1, 7.0, 7.1, 0xd.1, 0x80000001, 0x80000007 or
 * 0x80000008) as the C library read it when the process started, without a
 * CPUID instruction; false when it cannot say (then cpu.c executes CPUID).
 */
AP_HIDDEN bool ap_libc_leaf(unsigned leaf, unsigned sub, struct ap_regs *r);
/**
 * This process's features with at least the leaves of @p groups read: every
 * bit those groups decide is what ap_host_features() holds; bits of groups
 * not read yet may be clear. Thread-safe. False (and @p out empty) on a
 * thread that holds the leaves' lock already: a signal handler that
 * interrupted this thread in here.
 */
AP_HIDDEN bool ap_host_leaves(unsigned groups, struct altpatch_features *out);
/** Tests: the RDTSCP probe executes HLT (SIGSEGV everywhere), whatever CPUID
 * claims (AP_PROBE_TEST_HLT); with AP_PROBE_TEST_FOREIGN a HLT outside the
 * probe faults first, while the guard holds, as another thread's fault would. */
enum { AP_PROBE_TEST_HLT = 1, AP_PROBE_TEST_FOREIGN = 2 };
AP_HIDDEN extern int ap_probe_hlt_test;
/** Whether this thread holds the leaves' lock (inside ap_host_leaves()). */
AP_HIDDEN bool ap_leaves_held_here(void);
/** fork: the leaves' lock taken unless this thread holds it (prepare), and
 * given back (parent and child). */
AP_HIDDEN void ap_leaves_fork_prepare(void);
AP_HIDDEN void ap_leaves_fork_release(void);
/** ap_effective_features() for at least the leaves of @p groups, with
 * ALTPATCH_CLEARCPUID's value @p list (NULL: unset) read by the caller. */
AP_HIDDEN void ap_effective_leaves_cleared(unsigned groups, const char *list,
                                           struct altpatch_features *out);
/**
 * Serialize this CPU after code was written (the kernel's sync_core()):
 * SERIALIZE where CPUID says so, else an IRET to self, else (a thread on a
 * shadow stack) CPUID. Decides by leaf 7 when it was read for the
 * features, else by the C library's copy of it, else by the leaf itself
 * (once, two CPUID exits for the process); async-signal-safe.
 */
AP_HIDDEN void ap_sync_core(void);
/** How ap_sync_core() serializes: 0 not known yet, then one of these. */
enum { AP_SYNC_UNKNOWN, AP_SYNC_SERIALIZE, AP_SYNC_IRET, AP_SYNC_IRET_UNLESS_SHSTK };
AP_HIDDEN int ap_sync_how(void);

/* ------------------------------------------------------------------------- */
/* The view builder (view.c)                                                 */
/* ------------------------------------------------------------------------- */

/** One loadable segment as the view builder needs it (a PT_LOAD header, resolved). */
struct ap_segment {
    uint64_t addr;       /* where the segment's first byte is (runtime or link-time) */
    uint64_t size;       /* bytes of it that @c data holds (live: p_memsz; file: p_filesz) */
    const uint8_t *data; /* those bytes */
    bool exec;           /* PF_X and PF_R */
};

/**
 * Fill @p v from the module's segments: the replacement range
 * [@p repl_addr, +@p repl_size) with its bytes (@p repl_data), and as text
 * every executable segment minus the replacement range (at most AP_MAX_TEXT
 * regions; further ones are left out and their sites refused as SITE_BOUNDS).
 */
AP_HIDDEN void ap_view_build(struct ap_view *v, const struct ap_segment *seg, size_t nseg,
                             uint64_t repl_addr, uint64_t repl_size, const uint8_t *repl_data);

/**
 * Take [@p start, @p end) out of @p v's text: bytes the library reads as its
 * own data (the record table, the note, the plan note) where a layout puts
 * them in an executable segment (`ld -z noseparate-code`). A site there
 * would rewrite what says where the sites are; it is refused as SITE_BOUNDS.
 * A region split in two where AP_MAX_TEXT are in use loses its upper part
 * (its sites refused too).
 */
AP_HIDDEN void ap_view_cut(struct ap_view *v, uint64_t start, uint64_t end);

/* ------------------------------------------------------------------------- */
/* Writers (writer.c, poke.c, live.c) -- poke.c knows nothing of x86          */
/* ------------------------------------------------------------------------- */

/** One write: make [addr, addr+len) hold @c new where it holds @c old (32 bytes). */
struct ap_write {
    uintptr_t addr;
    const uint8_t *old;
    const uint8_t *new;
    uint32_t tag;  /* the caller's: the writers never read or change it */
    uint16_t len;  /* at most 65535 bytes (a site has at most 255) */
    int8_t result; /* out: ALTPATCH_REASON_NONE, MEM_MISMATCH (memory held neither), WRITE_DENIED */
    bool wrote;    /* out: bytes were written (false when memory already held new) */
};
_Static_assert(sizeof(struct ap_write) == 32, "struct ap_write: 32 bytes");
_Static_assert(ALTPATCH_REASON__COUNT <= INT8_MAX, "a reason fits in ap_write.result");

enum ap_poke_flags {
    AP_POKE_PROCMEM_ONLY = 1u << 0,
    AP_POKE_NO_PROCMEM = 1u << 1,
    /* learn protections by reading all of /proc/self/maps, not by PROCMAP_QUERY
     * (what a kernel before 6.11 gets; for tests) */
    AP_POKE_MAPS_FILE = 1u << 2,
    /* the caller proved itself alone with ap_mm_alone() in this call (which
     * read seccomp mode 0) and ran nothing since that could install a
     * filter: not asked again */
    AP_POKE_SECCOMP_OFF = 1u << 3,
    /* this batch continues, in address order, the one written last with the
     * same stats (st->pg_done): a page both touch is counted once */
    AP_POKE_CONTINUE = 1u << 4,
    /* remember the runs of pages counted (st->runs), for a later batch that
     * does not continue in address order (AP_POKE_NOT_RUNS) */
    AP_POKE_RUNS = 1u << 5,
    /* a page in st->runs was counted already: not counted again */
    AP_POKE_NOT_RUNS = 1u << 6,
    /* the text is likely never written before (a module's first decision):
     * a window of 4 pages or more breaks copy-on-write of all its pages
     * in one MADV_POPULATE_WRITE once it is writable, instead of a page
     * fault per page on the first store; only with AP_POKE_SECCOMP_OFF, and
     * only when PR_GET_SECCOMP, asked in the window itself right before,
     * still answers 0 (no filter can kill the process for the call: the
     * flag's proof may be older than a print callback that installed one) */
    AP_POKE_PREFAULT = 1u << 7,
    /* the text was likely written before (no module's first decision): with
     * AP_POKE_SECCOMP_OFF, a window's writes go through /proc/self/mem in
     * spans of nearby writes (a copy of memory with the new bytes in it),
     * where a window's writes need few spans, instead of an mprotect pair
     * (poke.c, ap_write_spans()) */
    AP_POKE_SPANS = 1u << 8,
    /* the caller compared each write with memory after the proof of
     * AP_POKE_SECCOMP_OFF (it held old, not new) and has written nothing and
     * run no user code since that proof: spans take the writes as pending
     * without comparing again; from a write that lies below the end of the
     * one before (out of order, or overlapping it: written since, maybe)
     * each later write of its window is compared, and each write of a
     * window whose first lies below the end of a window before; the window
     * and single writes still compare */
    AP_POKE_CHECKED = 1u << 9,
};

/** Pages [start, end) counted by earlier batches (AP_POKE_RUNS). */
struct ap_page_run {
    uintptr_t start, end;
};

struct ap_poke_stats {
    uint64_t bytes, pages, syscalls;
    unsigned mprotect_writes, procmem_writes; /* number of windows opened / pwrite calls that succeeded */
    /* the end of the last page counted in pages (AP_POKE_CONTINUE) */
    uintptr_t pg_done;
    /* AP_POKE_RUNS: the runs counted, in address order (malloc'ed; the
     * caller frees runs); a run that could not be kept (no memory) is not:
     * a page of it that AP_POKE_NOT_RUNS meets may be counted twice */
    struct ap_page_run *runs;
    size_t nruns, runs_cap;
};

/**
 * Write a batch. Groups writes by page, coalesces neighbouring pages into one
 * window, never maps a page writable and executable at once, restores the
 * original protections exactly, falls back to /proc/self/mem when mprotect is
 * denied, and serializes afterwards. Writes whose memory already equals @c new
 * are skipped. @p w must be sorted by address and not overlap. Returns 0 or a
 * negative errno for a failure that stopped the whole batch (per-write results
 * are in w[i].result either way).
 */
AP_HIDDEN int ap_poke(struct ap_write *w, size_t n, unsigned flags, struct ap_poke_stats *st);
/**
 * In a child of fork(), from the library's fork handler: close the /proc/self/maps
 * descriptor kept from the parent when @p close_kept (no batch was using it),
 * else forget it.
 */
AP_HIDDEN void ap_maps_after_fork(bool close_kept);

/**
 * Writes in one part of a first apply's queue (apply.c): a module's first
 * decision hands its queue to ap_poke() each time this many writes are
 * queued in address order, and uses their slots again. 4096 (128 KiB of
 * queue); tests set fewer to write many parts.
 */
AP_HIDDEN extern unsigned ap_part_writes;

/**
 * The largest block an apply's buffers share (apply.c): its write queue,
 * decisions and final bytes in one allocation up to this size, one mapping
 * made and unmade per apply; beyond it the queue has a block of its own.
 * glibc's largest dynamic mmap threshold, 32 MiB: a block up to it, once
 * freed, raises the threshold, and the next apply's comes from the heap's
 * pages (a warm apply finds them present), while a larger one is mapped
 * afresh every time. Tests set 0 to give every queue its own block.
 */
AP_HIDDEN extern size_t ap_run_block_max;

/**
 * The part an apply of @p sites sites uses: as many parts as parts of
 * ap_part_writes need, made equal (10,000 sites: 3 parts of 3334, not 4096,
 * 4096 and 1808), so that the queue's slots made present at once are no
 * more than a part needs. At least 1.
 */
static inline size_t ap_part_size(size_t sites)
{
    size_t most = ap_part_writes ? ap_part_writes : 1;
    if (sites <= most)
        return sites ? sites : 1;
    size_t parts = (sites + most - 1) / most;
    return (sites + parts - 1) / parts;
}

/**
 * The most records of a table whose first apply reads them from an array the
 * table pass fills (module.c; dropped after that apply, its slots the write
 * queue's meanwhile: apply.c): 384 (12 KiB). A larger table's first
 * decision decodes each site's records from the mapped table as it goes:
 * below this size the decoding costs more than the array's fresh memory
 * (docs/benchmarks.md, part 3's later applies of 2026-12-03 16:36 UTC: the
 * 1k program's cold apply 7-10% faster and 11.8 instructions a site fewer
 * decoding than with 4096). Tests set 0 to decode every table.
 */
AP_HIDDEN extern unsigned ap_records_keep_max;

/**
 * The most bytes of sites one module may have, all sites' lengths added
 * (module.c): AP_SITE_BYTES_MAX, what the originals' 32-bit offsets reach.
 * Only a table whose sites overlap over and over reaches it (16 million
 * sites of 255 bytes); that module is refused (BAD_TABLE), the others are
 * applied. Tests set less.
 */
AP_HIDDEN extern uint64_t ap_site_bytes_max;

/**
 * Modules an apply found settled (memory holding every site's bytes as the
 * last apply left them: nothing decided), counted over the process's life
 * (apply.c). Read by tests to tell that path from a decision.
 */
AP_HIDDEN extern uint64_t ap_settled_found;

/*
 * Shared by both writers (writer.c; the pending check inline here).
 */

/* ------------------------------------------------------------------------- */
/* Locks that know their owner (apply.c's entry and gate locks, cpu.c's       */
/* leaves lock)                                                               */
/* ------------------------------------------------------------------------- */

/*
 * A fork from a signal handler must know whether its own thread holds a lock
 * at the very instruction the handler interrupted: a flag stored after
 * pthread_mutex_lock() returns (or before unlock) leaves windows where the
 * child would take its own thread's lock for another's. So the library's
 * locks are a futex word holding the owner's token: the compare-and-swap that
 * takes the lock is the step that names the owner, the exchange that frees
 * it the step that clears it. A token is per thread (not the TID: the forking
 * thread keeps its token in the child), taken from a counter on first use:
 * unique among the live threads unless 2^31 threads were created since. Not
 * a pthread mutex either for a second reason: its lock and unlock are two
 * more symbols for the dynamic linker to resolve on a process's first apply.
 */
#define AP_TLOCK_WAITERS 0x80000000u
struct ap_tlock {
    uint32_t w; /* 0 free; else owner token, AP_TLOCK_WAITERS when one may sleep */
};

/** This thread's lock token (cpu.c): never 0 nor with AP_TLOCK_WAITERS, kept
 * by the forking thread in a child. */
AP_HIDDEN uint32_t ap_token(void);

/** FUTEX_WAIT or FUTEX_WAKE (@p op) on the process-private word @p w. */
static inline void ap_futex(uint32_t *w, int op, uint32_t val)
{
    ap_sys(SYS_futex, (long)w, op | FUTEX_PRIVATE_FLAG, val, 0, 0);
}

static inline bool ap_tlock_cas(struct ap_tlock *l, uint32_t *seen, uint32_t v)
{
    return __atomic_compare_exchange_n(&l->w, seen, v, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/** Take @p l for thread @p me (ap_token()); sleeps while another holds it. */
static inline void ap_tlock_lock(struct ap_tlock *l, uint32_t me)
{
    uint32_t v = 0;
    if (ap_tlock_cas(l, &v, me))
        return;
    for (;;) { /* v: the word last seen */
        if (!v) {
            if (ap_tlock_cas(l, &v, me | AP_TLOCK_WAITERS)) /* others may sleep */
                return;
            continue;
        }
        if (!(v & AP_TLOCK_WAITERS)) {
            if (!ap_tlock_cas(l, &v, v | AP_TLOCK_WAITERS))
                continue;
            v |= AP_TLOCK_WAITERS;
        }
        ap_futex(&l->w, FUTEX_WAIT, v);
        v = __atomic_load_n(&l->w, __ATOMIC_RELAXED);
    }
}

/** Take @p l for @p me only if it is free. */
static inline bool ap_tlock_try(struct ap_tlock *l, uint32_t me)
{
    uint32_t v = 0;
    return ap_tlock_cas(l, &v, me);
}

static inline void ap_tlock_unlock(struct ap_tlock *l)
{
    if (__atomic_exchange_n(&l->w, 0, __ATOMIC_RELEASE) & AP_TLOCK_WAITERS)
        ap_futex(&l->w, FUTEX_WAKE, 1);
}

/** The lock's owner token (0: free). */
static inline uint32_t ap_tlock_owner(const struct ap_tlock *l)
{
    return __atomic_load_n(&l->w, __ATOMIC_RELAXED) & ~AP_TLOCK_WAITERS;
}

/**
 * The check every writer makes: clears @p w's result and wrote; true when
 * memory holds @c old and not @c new (a write is pending); false when it
 * holds @c new already (or len is 0), or neither
 * (result := MEM_MISMATCH). Inline: a site's few bytes, word compares.
 */
static inline bool ap_write_pending(struct ap_write *w)
{
    const uint8_t *mem = (const uint8_t *)w->addr, *o = w->old, *nw = w->new;
    size_t n = w->len;
    uint64_t dnew, dold; /* nonzero: memory differs from new, from old */
    if (n - 8 <= 8) { /* 8..16: memory's two words loaded once for both compares */
        uint64_t m0, m1, a0, a1, b0, b1;
        memcpy(&m0, mem, 8);
        memcpy(&m1, mem + n - 8, 8);
        memcpy(&a0, nw, 8);
        memcpy(&a1, nw + n - 8, 8);
        memcpy(&b0, o, 8);
        memcpy(&b1, o + n - 8, 8);
        dnew = (m0 ^ a0) | (m1 ^ a1);
        dold = (m0 ^ b0) | (m1 ^ b1);
    } else if (n - 4 <= 3) { /* 4..7 */
        uint32_t m0, m1, a0, a1, b0, b1;
        memcpy(&m0, mem, 4);
        memcpy(&m1, mem + n - 4, 4);
        memcpy(&a0, nw, 4);
        memcpy(&a1, nw + n - 4, 4);
        memcpy(&b0, o, 4);
        memcpy(&b1, o + n - 4, 4);
        dnew = (m0 ^ a0) | (m1 ^ a1);
        dold = (m0 ^ b0) | (m1 ^ b1);
    } else {
        dnew = !ap_equal_small(mem, nw, n); /* n == 0: equal */
        dold = dnew && !ap_equal_small(mem, o, n);
    }
    w->result = dnew && dold ? ALTPATCH_REASON_MEM_MISMATCH : ALTPATCH_REASON_NONE;
    w->wrote = false;
    return dnew && !dold;
}

/** Distinct pages of size @p pgsz touched by the writes of w[0..n) that landed (@c wrote). */
AP_HIDDEN uint64_t ap_pages_written(const struct ap_write *w, size_t n, uintptr_t pgsz);
/** Every signal (ap_signals_block()'s @p set): the writers' mask. */
#define AP_SIGNALS_ALL (~0ull)
/**
 * Block the signals of @p set (bit s-1: signal s; AP_SIGNALS_ALL or apply.c's
 * fork handlers' set) and unblock the others, with the raw system call, the
 * old mask in *@p saved (glibc's pthread_sigmask keeps its internal
 * SIGCANCEL/SIGSETXID deliverable; sanitizers intercept it).
 */
AP_HIDDEN void ap_signals_block(uint64_t set, uint64_t *saved);
/** Restore the mask ap_signals_block() saved. */
AP_HIDDEN void ap_signals_restore(const uint64_t *saved);
/**
 * True when the kernel proves that this thread is the only task using this
 * address space (unshare(CLONE_VM) succeeds: no other thread, whoever created
 * it, and no process sharing the memory). False when another task shares it,
 * when a seccomp filter is active (the call is then not made: a filter may
 * kill), or when the kernel does not answer: ap_count_threads() decides then.
 * True therefore also proves seccomp mode 0 at that moment.
 */
AP_HIDDEN bool ap_mm_alone(void);
/** What ap_mm_alone() learnt: */
enum {
    AP_MM_ALONE = 1,   /* the kernel proves this thread the only task using the memory */
    AP_MM_SHARED = 0,  /* the kernel says another task uses it (a thread, or a process
                        * sharing the memory: clone(CLONE_VM) without CLONE_THREAD, which
                        * /proc/self/task does not list) */
    AP_MM_UNKNOWN = -1 /* not asked (a seccomp filter) or not answered */
};
AP_HIDDEN int ap_mm_state(void);
/**
 * prctl(PR_GET_SECCOMP): 0 (no filter), the mode (> 0: kept for the process,
 * a mode is never cleared), or -errno (unknown). *@p syscalls (may be NULL)
 * counts the call when it is made.
 */
AP_HIDDEN long ap_seccomp_mode(uint64_t *syscalls);
/** Threads of this process (/proc/self/task entries), or -1 when unknown. */
AP_HIDDEN long ap_count_threads(void);
/** Bytes of ap_selftest_fn(). */
#define AP_SELFTEST_FN_LEN 10
/**
 * The writers' self-tests' function, returning @p v: `endbr64; mov $v, %eax;
 * ret` into @p out. Written into a page, run, replaced by the one returning
 * another value, run again: does this machine run what was written?
 */
AP_HIDDEN void ap_selftest_fn(uint8_t out[AP_SELFTEST_FN_LEN], uint8_t v);
/** open("/proc/self/mem", O_RDWR | O_CLOEXEC): a descriptor or -errno. */
AP_HIDDEN int ap_procmem_open(void);
/**
 * pwrite() @p len bytes at @p addr through @p fd, EINTR retried: the bytes
 * written (the kernel copies page by page: fewer than @p len when a later
 * page could not be written, the first ones written) or -errno.
 */
AP_HIDDEN long ap_procmem_pwrite(int fd, uintptr_t addr, const uint8_t *src, size_t len);
/** ap_procmem_pwrite(): 0 or -errno (-EIO if short). */
AP_HIDDEN int ap_procmem_write(int fd, uintptr_t addr, const uint8_t *src, size_t len);

/*
 * Page flips (flip.c): new contents of text pages are built in a staging
 * mapping of the same file at the same offset and moved over the live pages
 * in one mremap(). Knows nothing of x86.
 */
struct ap_flip_run {
    uintptr_t start, len; /* page-aligned target range, inside one mapping */
    size_t vma;           /* its mapping (flip.c's table) */
    uint8_t *stage[2];    /* staging copies (first and second flip); NULL: none or moved in */
};
struct ap_flip_vma;
struct ap_flip {
    struct ap_flip_run *run;
    size_t nrun;
    struct ap_flip_vma *vma;
    size_t nvma;
    int memfd; /* /proc/self/mem */
    uintptr_t pgsz;
};
/**
 * Group the writes w[i] with @p want[i] (sorted by address) into runs:
 * run_of[i] := the run that holds w[i], or -1 when its pages cannot be
 * flipped (anonymous or shared text, file not openable or not the mapped one,
 * a write across two mappings). Reads /proc/self/maps and opens the files.
 * 0 or -errno (then nothing can flip); ap_flip_release() in every case.
 */
AP_HIDDEN int ap_flip_plan(struct ap_flip *f, const struct ap_write *w, const bool *want, size_t n,
                           long *run_of);
/** Map staging copy @p which (0, 1) of @p run and fill it with the live pages. 0 or -errno. */
AP_HIDDEN int ap_flip_stage(struct ap_flip *f, size_t run, int which, struct ap_poke_stats *st);
/** Write @p len bytes for live address @p addr into staging copy @p which. 0 or -errno. */
AP_HIDDEN int ap_flip_put(struct ap_flip *f, size_t run, int which, uintptr_t addr,
                          const uint8_t *src, size_t len, struct ap_poke_stats *st);
/** Where live address @p addr lies in staging copy @p which (readable). */
AP_HIDDEN const uint8_t *ap_flip_view(const struct ap_flip *f, size_t run, int which,
                                      uintptr_t addr);
/** Move staging copy @p which over the live pages (raw mremap). 0 or -errno. */
AP_HIDDEN int ap_flip_swap(struct ap_flip *f, size_t run, int which, struct ap_poke_stats *st);
/** Unmap the staging copies not moved in, close the files, free. */
AP_HIDDEN void ap_flip_release(struct ap_flip *f);

/**
 * Whether the live protocol can run: membarrier SYNC_CORE registered,
 * /proc/self/mem writable, handshake handler installed, and (once per
 * process) a page flip seen executed (live.c).
 * 0, or -errno with *why set to a sentence for the log.
 */
AP_HIDDEN int ap_live_ready(const char **why);
/**
 * Write a batch while other threads may run it (live.c, the x86 side of the
 * writer): page flips (flip.c), an entry barrier and a handshake for
 * multi-instruction sites. Same contract as ap_poke() (flags: none); results
 * may also be the ALTPATCH_REASON_LIVE_* reasons.
 */
AP_HIDDEN int ap_live_poke(struct ap_write *w, size_t n, struct ap_poke_stats *st);
/**
 * fork() waits while a round runs (no child starts with entry barriers in
 * its text):
 * apply.c's pthread_atfork handlers call these after taking its own lock,
 * the order an apply takes both.
 */
AP_HIDDEN void ap_live_fork_prepare(void);
AP_HIDDEN void ap_live_fork_release(void);

/* ------------------------------------------------------------------------- */
/* Signal frames on thread stacks (frames.c)                                 */
/* ------------------------------------------------------------------------- */

/** A frame search's answer when the stacks cannot be read at all (process_vm_readv denied). */
#define AP_WHERE_UNKNOWN ((uintptr_t)1)
/** A frame search's answer when a stack could not be read to its end (too long, too many). */
#define AP_WHERE_CUT ((uintptr_t)2)

/** Probe what the search can use (process_vm_readv, PROCMAP_QUERY). Not in a handler. */
AP_HIDDEN void ap_frames_init(void);
/** An sa_restorer of the process: frames returning to it need no further shape check. */
AP_HIDDEN void ap_frames_hint_restorer(uintptr_t restorer);
/**
 * Where the calling thread, interrupted at @p rip with stack pointer @p sp,
 * really is: a RIP saved in a signal frame on its stacks (from @p sp up, and
 * on each stack a frame interrupted) for which @p inside is true, else @p rip;
 * AP_WHERE_UNKNOWN or AP_WHERE_CUT when that cannot be told. Bounded by the
 * thread's control block and its sigaltstack. Async-signal-safe.
 */
AP_HIDDEN uintptr_t ap_frames_where_self(uintptr_t rip, uintptr_t sp, bool (*inside)(uintptr_t));
/**
 * The same for another thread stopped at @p rip / @p sp (read from /proc), its
 * stacks bounded by their mappings. One caller at a time (a static buffer).
 */
AP_HIDDEN uintptr_t ap_frames_where_task(uintptr_t rip, uintptr_t sp, bool (*inside)(uintptr_t));

/* ------------------------------------------------------------------------- */
/* Modules (module.c, prepatch_load.c)                                       */
/* ------------------------------------------------------------------------- */

/**
 * Per-site outcome of the last apply (after a quick revert, of the one
 * before: left_orig), in two bytes: below AP_RES_REFUSED the entry memory
 * holds + 1 (0: the original, also a site no apply decided yet), else
 * AP_RES_REFUSED | the reason. Which reasons were warned about lives apart
 * (struct ap_warned): refusals are few.
 */
struct ap_site_result {
    uint16_t v;
};
#define AP_RES_REFUSED 0x8000u
_Static_assert(AP_SITE_MAX_RECORDS < AP_RES_REFUSED,
               "an accepted result holds the entry + 1, below the refused bit");
_Static_assert(ALTPATCH_REASON__COUNT < AP_RES_REFUSED, "a refusal's reason fits below the refused bit");

/** An accepted site's result: entry @p chosen (-1: the original). */
static inline struct ap_site_result ap_res_ok(int chosen)
{
    return (struct ap_site_result){(uint16_t)(chosen + 1)};
}
/** A refused site's result (the original kept). */
static inline struct ap_site_result ap_res_refused(int reason)
{
    return (struct ap_site_result){(uint16_t)(AP_RES_REFUSED | (unsigned)reason)};
}
/** The entry a result holds: its index within the site, -1 for the original. */
static inline int ap_res_chosen(const struct ap_site_result *res)
{
    return res->v & AP_RES_REFUSED ? -1 : (int)res->v - 1;
}
static inline int ap_res_reason(const struct ap_site_result *res)
{
    return res->v & AP_RES_REFUSED ? (int)(res->v & ~AP_RES_REFUSED) : ALTPATCH_REASON_NONE;
}
static inline enum altpatch_site_state ap_res_state(const struct ap_site_result *res)
{
    return res->v & AP_RES_REFUSED ? ALTPATCH_SITE_REFUSED
           : res->v                ? ALTPATCH_SITE_PATCHED
                                   : ALTPATCH_SITE_ORIGINAL;
}

/** A site a WARN line was printed for: bit r for reason r (once per site and reason). */
struct ap_warned {
    uint32_t site;
    uint32_t bits;
};

/**
 * What a module keeps per site, in one 4-byte record: a decision writes all
 * of it at once. Where its bytes are (ap_orig_off()) is not kept per site.
 */
struct ap_site_state {
    struct ap_site_result res;
    /* The site's template (sitecache.c): the planner is pure, so under the
     * same feature set a site's plan does not change. Id of the template in
     * apply's memo (memo.c) of generation m->shape_gen, 0: none (planned, or
     * refused, every time), AP_SHAPE_ORIGINAL16 (ap_shape_store()). */
    uint16_t shape;
};
_Static_assert(sizeof(struct ap_site_state) == 4 && offsetof(struct ap_site_state, res) == 0 &&
                   offsetof(struct ap_site_state, shape) == 2 &&
                   __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "a site's state: 4 bytes, one store (ap_site_state_put())");

/** Site state @p p set to result @p res, template @p shape: one store. */
static inline void ap_site_state_put(struct ap_site_state *p, struct ap_site_result res,
                                     uint16_t shape)
{
    uint32_t v = (uint32_t)res.v | (uint32_t)shape << 16;
    memcpy(p, &v, sizeof(v));
}

struct ap_module {
    struct ap_module *next;
    char *path;                 /* dlpi_name, "" for the main program */
    uintptr_t base;             /* dlpi_addr */
    const void *phdr;           /* dlpi_phdr: identity together with base and path */
    struct ap_view view;        /* live memory */
    struct ap_note note;
    int reason;                 /* module-wide refusal (BAD_TABLE, BAD_VERSION), else 0 */
    bool table_read;            /* the table was read (not refused before) */
    size_t table_size;
    uint64_t table_hash;        /* of the table as first seen: identity check after dlclose
                                 * (0 for the main program: never unloaded) */
    uint64_t repl_hash;         /* of the replacement bytes as first seen: identity too */
    struct ap_entry *entries;   /* every record: until the first apply is done for
                                 * a table of at most ap_records_keep_max, for good
                                 * when a site has more than AP_SITE_ENTRIES; else
                                 * NULL: a site's records are decoded from the
                                 * mapped table when needed, by its first decision
                                 * too (ap_module_site_entries) */
    size_t nentries;            /* the table's records, kept or not */
    bool entries_keep;          /* a site has more than AP_SITE_ENTRIES records */
    /* What the table pass proved for every record and site (module.c), so
     * that the first decision (apply.c) skips the checks per site: every
     * record has known flags, a feature below the feature words and a
     * replacement inside view.repl; every site lies in text_all, the
     * region ap_region_at() finds for each of them, and none has a preset
     * reason (NULL: not proved). */
    bool records_plain;
    const struct ap_region *text_all;
    /* The sites' range [lowest site, highest site end) meets neither the
     * record table nor altinstr_replacement: a write to a site changes no
     * record and no replacement, so a first decision may write its queue in
     * parts while later sites of it are still to be read (module.c) */
    bool parts_apart;
    unsigned leaves;            /* CPUID leaf groups its entries' features need (AP_LEAVES_*) */
    /* the sites, each without its address: its first record's in the
     * mapped table (ap_site_addr(), ap_site_get()), whose index is the sum of
     * the counts before it: at holds it for every AP_SITE_GROUP-th site
     * (ap_site_first()), with the offset of its bytes (ap_orig_off()); the
     * loops over every site keep their own */
    struct ap_tsite *sites;
    struct ap_site_at *at;
    size_t nsites;
    uint8_t *orig;              /* original bytes of all sites, concatenated */
    size_t site_bytes;          /* the sum of all sites' lengths */
    struct ap_site_state *st;   /* per site: its result, its template */
    /* The sites outside the module's text, one bit each (nothing saved for
     * them: the planner refuses them, SITE_BOUNDS); NULL when none is. */
    uint64_t *outside;
    struct ap_warned *warned;   /* sorted by site; malloc'ed, or NULL */
    size_t nwarned;
    void *block;                /* one allocation: st, orig, planned */
    bool present;               /* scratch for refresh */
    /* Pin (pins.c): a dlopen() reference held for the length of one apply or
     * site walk, so that a concurrent dlclose() cannot unmap bytes being read
     * or written. gone: the module could not be pinned (unloaded since the
     * refresh): it is skipped until the next refresh drops it. */
    void *pin;
    bool gone;
    uint8_t *planned;           /* per site (at orig_off): the bytes the last apply left */
    /* Planned left unwritten (apply.c's first decision): where this is not
     * NULL, a site's bytes in planned are not stored but given by the memo
     * it points to, of generation shape_gen -- the original where the
     * site's result chooses none, else its template (st[i].shape)
     * instantiated for the site -- except at sites without a template
     * (shape 0), whose planned bytes were stored when decided. Nothing
     * reads planned before ap_module_planned() has written them all (a
     * settled check compares memory with the templates instead: apply.c);
     * the memo is not freed before (apply.c). Planned's pages stay absent
     * until then: most programs apply once and never need them. */
    const struct ap_memo *planned_memo;
    /* The memo generation whose template ids the sites' st[i].shape hold
     * (sitecache.c), or AP_SHAPE_GEN_ANY */
    uint64_t shape_gen;
    /* Settled (apply.c): the last apply under memo generation settled_gen
     * left every site non-refused with memory holding what it planned
     * (planned; the originals when left_orig); settled_patched of them hold
     * a replacement in that plan. While that holds, an apply under the same
     * generation decides each site by one compare of memory with what was
     * left, or switches the module between plan and originals. 0: not
     * settled. */
    uint64_t settled_gen;
    size_t settled_patched;
    /* Settled on the originals (apply.c): the last apply was a revert that
     * put every original back by the quick path, and planned still holds
     * the plan of generation settled_gen (what memory held before it), so
     * the next apply writes it back without deciding again. Memory then
     * holds m->orig at every site, not planned, and every site is ORIGINAL
     * (st[i].res keeps the plan's results for the apply that writes it back). */
    bool left_orig;
    /* The per-site arrays hold the originals (ap_module_save()); until then
     * nothing in them is set but the pointers. */
    bool saved;
    /* A pre-patched module not decided since it was read: st[i].res holds the
     * file's choices and planned what memory held then, which the file says
     * it wrote (prepatch_load.c); an apply whose feature set selects the same
     * entries takes them as its plan (ap_prepatch_settle()). */
    bool prepatch_choices;
    bool prepatch_agreed; /* ap_prepatch_agrees() said so in this apply */
    /* the file records this library's planner (AP_PREPATCH_PLANNER): its
     * written bytes are what this planner writes for its choices */
    bool prepatch_planner;
    /* The file's choices, moved out of st[i].res by a dry run that decided
     * the module under another set (st[i].res then holds that run's plan, as a dry
     * run reports it): what ap_prepatch_agrees() compares with while
     * prepatch_choices holds. NULL: st[i].res holds them. */
    struct ap_site_result *prepatch_res;
    /* A pre-patched main program opened from its filled plan note (loaded,
     * in the module: plan_note): orig holds memory's bytes, not the
     * originals, until ap_prepatch_need() reads them from the file; never
     * listed or logged as originals meanwhile. */
    bool orig_in_file;
    const uint8_t *plan_note;
};

/** The template id of a site none of whose entries applies: its plan is its original. */
#define AP_SHAPE_ORIGINAL UINT32_MAX
/** AP_SHAPE_ORIGINAL as m->st[i].shape holds it. */
#define AP_SHAPE_ORIGINAL16 UINT16_MAX

/** Template id @p id as m->st[i].shape holds it: an id that does not fit in two
 * bytes is not remembered (0: the site's template is looked up again). */
static inline uint16_t ap_shape_store(uint32_t id)
{
    /* AP_SHAPE_ORIGINAL + 1 wraps to 0: it is kept, as 0xffff */
    return (uint16_t)(id + 1u <= AP_SHAPE_ORIGINAL16 ? id : 0);
}

/** The template id m->st[i].shape (@p v) holds. */
static inline uint32_t ap_shape_load(uint16_t v)
{
    return v == AP_SHAPE_ORIGINAL16 ? AP_SHAPE_ORIGINAL : v;
}
/** m->shape_gen while no site has a template: valid for every generation. */
#define AP_SHAPE_GEN_ANY UINT64_MAX

/** ap_orig_off() of a site outside the module's text: no bytes saved (refused by the planner). */
#define AP_NO_ORIG ((size_t)-1)
/** A module's site bytes stay below this (32-bit offsets: struct ap_site_at). */
#define AP_SITE_BYTES_MAX UINT32_MAX

/**
 * Fill @p m's per-site arrays from memory: each site's original (none
 * outside the text), planned the same, every result zero (original), no
 * template. Once: see ap_module_save().
 */
AP_HIDDEN void ap_module_save_all(struct ap_module *m);

/** ap_module_save_all() unless done: before anything reads the per-site arrays. */
static inline void ap_module_save(struct ap_module *m)
{
    if (!m->saved && m->block)
        ap_module_save_all(m);
}

/**
 * Write every site's bytes into @p m's planned where its first decision left
 * them to its templates (m->planned_memo: see there), and clear
 * planned_memo. A site whose template no longer gives the result it chose
 * (it cannot happen: records and replacements lie in read-only memory, and a
 * site the planner decided carries only a template the planner stored for
 * it: sitecache.c) is given its original: memory then matches neither, and
 * the next apply refuses the site instead of writing over bytes it cannot
 * name.
 */
AP_HIDDEN void ap_module_fill_planned(struct ap_module *m);

/** ap_module_fill_planned() unless planned holds every site's bytes: before
 * anything reads m->planned. */
static inline void ap_module_planned(struct ap_module *m)
{
    if (m->planned_memo)
        ap_module_fill_planned(m);
}

/**
 * The plan bytes of site @p i of @p m (inside the text; its first record
 * @p first, its bytes at offset @p off) as its state gives them while they
 * are left to @p memo: its original where it chose none, the bytes stored
 * when it was decided where it has no template, else its template's bytes,
 * instantiated in @p buf (its length) where they have relative fields. NULL
 * where the template does not give the result the site chose.
 */
static inline const uint8_t *ap_module_plan_bytes(const struct ap_module *m,
                                                   const struct ap_memo *memo, size_t i,
                                                   uint32_t first, size_t off, uint8_t *buf);

/** Planned made the originals at every site inside the text (and nothing
 * left to templates): what memory holds after a revert, or all that is
 * known of a plan whose templates are gone. */
AP_HIDDEN void ap_module_plan_originals(struct ap_module *m);

/** ap_copy_small() of @p n bytes at @p src to both @p a and @p b (a site's bytes). */
static inline void ap_copy2_small(uint8_t *a, uint8_t *b, const uint8_t *src, size_t n)
{
    if (n > 16 || n < 4) {
        ap_copy_small(a, src, n);
        ap_copy_small(b, a, n);
    } else if (n >= 8) {
        uint64_t x, y;
        memcpy(&x, src, 8);
        memcpy(&y, src + n - 8, 8);
        memcpy(a, &x, 8);
        memcpy(a + n - 8, &y, 8);
        memcpy(b, &x, 8);
        memcpy(b + n - 8, &y, 8);
    } else {
        uint32_t x, y;
        memcpy(&x, src, 4);
        memcpy(&y, src + n - 4, 4);
        memcpy(a, &x, 4);
        memcpy(a + n - 4, &y, 4);
        memcpy(b, &x, 4);
        memcpy(b + n - 4, &y, 4);
    }
}

/**
 * Where sites that come in address order are looked up in a module's view:
 * the last site's region, tried first (all zero: none).
 */
struct ap_region_cursor {
    const struct ap_region *r;
    uint64_t addr, size;
    const uint8_t *data;
};

/**
 * The bytes of [@p addr, +@p len) in @p v's text (live memory: the address
 * itself), or NULL when they do not lie inside one region with bytes (or
 * @p len is 0 and the last region does not hold @p addr).
 */
static inline const uint8_t *ap_region_at(struct ap_region_cursor *c, const struct ap_view *v,
                                          uint64_t addr, uint8_t len)
{
    /* no region yet (all zero): only [0, +0) would pass, giving NULL */
    uint64_t at = addr - c->addr;
    if (at > c->size || len > c->size - at) {
        const struct ap_region *r = len ? ap_view_find(v, addr, len) : NULL;
        if (!r || !r->data) {
            *c = (struct ap_region_cursor){0};
            return NULL;
        }
        *c = (struct ap_region_cursor){r, r->addr, r->size, r->data};
        at = addr - c->addr;
    }
    /* as integers: the empty cursor passes [0, +0) with data NULL, and
     * NULL + 0 is not defined for pointers (the answer is NULL all the same) */
    return (const uint8_t *)((uintptr_t)c->data + at);
}

/** True when site @p i of @p m lies outside its text (no bytes saved). */
static inline bool ap_site_outside(const struct ap_module *m, size_t i)
{
    return __builtin_expect(m->outside != NULL, 0) && (m->outside[i / 64] >> (i % 64) & 1u);
}

/** Offset of site @p i's bytes in m->orig and m->planned, or AP_NO_ORIG
 * (outside the text). Every site has its length's bytes there, in site
 * order (one outside the text too, never written), so the offset is the sum
 * of the lengths before it: m->at holds it for every AP_SITE_GROUP-th site.
 * A loop over the sites in order keeps its own. */
static inline size_t ap_orig_off(const struct ap_module *m, size_t i)
{
    if (ap_site_outside(m, i))
        return AP_NO_ORIG;
    size_t j = i & ~(size_t)(AP_SITE_GROUP - 1), off = m->at[i / AP_SITE_GROUP].off;
    for (; j < i; j++)
        off += m->sites[j].len;
    return off;
}

/** Most records of one site decoded on demand (ap_module_site_entries). */
#define AP_SITE_ENTRIES 8

/** A site and its records, decoded for the planner and the memo. */
struct ap_site_entries {
    struct ap_site site; /* the module's site: first 0 where its records are decoded into e */
    struct ap_entry e[AP_SITE_ENTRIES];
};

/** A module's mapped record table, copied out of the module (a loop that
 * stores bytes keeps it in registers: its stores could alias the module). */
struct ap_table_ref {
    const uint8_t *p;
    uint64_t addr;
    uint32_t rs;
};

static inline struct ap_table_ref ap_table_ref(const struct ap_module *m)
{
    return (struct ap_table_ref){(const uint8_t *)(uintptr_t)m->note.table_start,
                                 m->note.table_start, m->note.record_size};
}

/** The address of the site of table @p t whose first record is record
 * @p first: that record's. */
static inline uint64_t ap_table_site_addr(const struct ap_table_ref *t, uint32_t first)
{
    return ap_record_site(t->p, t->addr, t->rs, first);
}

/** The index of site @p i of @p m's first record. */
static inline uint32_t ap_site_first(const struct ap_module *m, size_t i)
{
    return ap_tsite_first(m->sites, m->at, i);
}

/** The address of site @p i of @p m: its first record's, read from the
 * module's mapped table (which cannot change: module.c). */
static inline uint64_t ap_site_addr(const struct ap_module *m, size_t i)
{
    struct ap_table_ref t = ap_table_ref(m);
    return ap_table_site_addr(&t, ap_site_first(m, i));
}

/** Site @p i of @p m as the planner and the memo take it (struct ap_site). */
static inline struct ap_site ap_site_get(const struct ap_module *m, size_t i)
{
    struct ap_table_ref t = ap_table_ref(m);
    return ap_tsite_site(t.p, t.addr, t.rs, ap_site_first(m, i), &m->sites[i]);
}

/**
 * Site @p i's records as the planner and the memo take them, with the site
 * to pass along (*@p sp, in @p buf): m->entries when the module keeps its
 * records, else decoded from the module's mapped table into @p buf.
 */
static inline const struct ap_entry *ap_module_site_entries(const struct ap_module *m, size_t i,
                                                            struct ap_site_entries *buf,
                                                            const struct ap_site **sp);
/** ap_module_site_entries() for a module that does not keep its records:
 * at most AP_SITE_ENTRIES of site @p i's (module.c keeps them all when a
 * site has more). */
static inline const struct ap_entry *ap_module_decode_entries_at(const struct ap_module *m,
                                                                 size_t i, uint32_t first,
                                                                 struct ap_site_entries *buf,
                                                                 const struct ap_site **sp);
static inline const struct ap_entry *ap_module_decode_entries(const struct ap_module *m, size_t i,
                                                              struct ap_site_entries *buf,
                                                              const struct ap_site **sp)
{
    return ap_module_decode_entries_at(m, i, ap_site_first(m, i), buf, sp);
}

/** ap_module_decode_entries() for site @p i whose first record is record
 * @p first (a loop over the sites keeps it). */
static inline const struct ap_entry *ap_module_decode_entries_at(const struct ap_module *m,
                                                                 size_t i, uint32_t first,
                                                                 struct ap_site_entries *buf,
                                                                 const struct ap_site **sp)
{
    const struct ap_tsite *s = &m->sites[i];
    const struct ap_table_ref t = ap_table_ref(m);
    for (uint32_t k = 0; k < s->count && k < AP_SITE_ENTRIES; k++)
        ap_record_at(t.p, t.addr, t.rs, (size_t)first + k, &buf->e[k]);
    buf->site = ap_tsite_site(t.p, t.addr, t.rs, first, s);
    buf->site.first = 0; /* its records in buf->e */
    *sp = &buf->site;
    return buf->e;
}

/** ap_module_site_entries() for site @p i whose first record is record
 * @p first (a loop over the sites keeps it). */
static inline const struct ap_entry *ap_module_site_entries_at(const struct ap_module *m,
                                                               size_t i, uint32_t first,
                                                               struct ap_site_entries *buf,
                                                               const struct ap_site **sp)
{
    if (!m->entries)
        return ap_module_decode_entries_at(m, i, first, buf, sp);
    struct ap_table_ref t = ap_table_ref(m);
    buf->site = ap_tsite_site(t.p, t.addr, t.rs, first, &m->sites[i]);
    *sp = &buf->site;
    return m->entries;
}

static inline const struct ap_entry *ap_module_site_entries(const struct ap_module *m, size_t i,
                                                            struct ap_site_entries *buf,
                                                            const struct ap_site **sp)
{
    return ap_module_site_entries_at(m, i, ap_site_first(m, i), buf, sp);
}

static inline const uint8_t *ap_module_plan_bytes(const struct ap_module *m,
                                                   const struct ap_memo *memo, size_t i,
                                                   uint32_t first, size_t off, uint8_t *buf)
{
    int chosen = ap_res_chosen(&m->st[i].res);
    uint32_t id = ap_shape_load(m->st[i].shape);
    if (chosen < 0 || id == AP_SHAPE_ORIGINAL)
        return m->orig + off;
    if (!id)
        return m->planned + off; /* stored when decided */
    const struct ap_memo_tmpl *t = &memo->tmpl[id - 1];
    if (!t->nfields) /* the same bytes at every site: no record read */
        return t->chosen == chosen ? t->key + 2 * (size_t)t->keylen : NULL;
    struct ap_site_entries eb;
    const struct ap_site *s;
    const struct ap_entry *e = ap_module_site_entries_at(m, i, first, &eb, &s);
    const uint8_t *final;
    return ap_memo_inst_fields(memo, id, &m->view, s, e, buf, &final) == chosen ? final : NULL;
}

/** Free m->entries (the first apply is done with them) unless the module must keep them. */
AP_HIDDEN void ap_module_drop_entries(struct ap_module *m);

/**
 * Bring @p *list up to date with the loaded modules (dl_iterate_phdr): add
 * modules carrying an altpatch note (saving their original site bytes), drop
 * modules no longer loaded, and re-read a module whose table changed (a new
 * library at the same address). Returns 0 or -ENOMEM.
 */
AP_HIDDEN int ap_modules_refresh(struct ap_module **list);
AP_HIDDEN void ap_modules_free(struct ap_module *list);
struct dl_phdr_info;

/**
 * The altpatch notes one walk of the loaded objects found (the pins' walk,
 * before apply's lock), for the walk of ap_modules_refresh_seen() right
 * after it: when that walk sees the same loader counters, nothing was loaded
 * or unloaded in between, so the same objects come in the same order with
 * the same notes, and each object's program headers need not be searched
 * again. Objects past AP_NOTES_SEEN are searched as before.
 */
#define AP_NOTES_SEEN 16
struct ap_notes_seen {
    bool started;  /* the walk's first object was seen */
    bool counted;  /* the loader's counters were given to it */
    bool complete; /* the walk saw every object (set by its caller) */
    bool idle;     /* nothing remembered: the module walk will not need it */
    /* idle, and the libraries with a note known from the last complete
     * module walk under these counters (noted[0 .. noted_n)): no header is
     * searched (module.c, ap_noted_read()) */
    bool noted_known;
    unsigned long long adds, subs;
    size_t noted_n;
    struct {
        uintptr_t base;
        const void *phdr;
    } noted[AP_NOTES_SEEN];
    size_t n;      /* objects seen */
    struct {
        uintptr_t base;
        const void *phdr;
        const uint8_t *desc; /* the note's descriptor, or NULL: no note */
        uint32_t descsz;
        bool searched;       /* false: desc not known (not looked for) */
    } obj[AP_NOTES_SEEN];
    size_t lib_notes; /* libraries seen with a note */
    /* The walk's first object, when it is the main program, not searched
     * (first_main): its base, program headers and name stay where they are
     * for the life of the process (ap_modules_refresh_seen() may read them
     * again and search its note itself). */
    bool first_main;
    uintptr_t main_base;
    const void *main_phdr;
    const char *main_name;
    uint16_t main_phnum;
};
/** Empty @p s (no object seen yet). */
static inline void ap_notes_seen_init(struct ap_notes_seen *s)
{
    s->started = s->counted = s->complete = s->idle = s->noted_known = s->first_main = false;
    s->n = s->lib_notes = 0;
}
/** Whether the next object of a walk (@p size: the callback's) carries an
 * altpatch note (a module of the list), remembered in @p s; @p search false: not looked for (false
 * returned), only the object and the walk's counters remembered. */
AP_HIDDEN bool ap_module_note_seen(const struct dl_phdr_info *info, size_t size, bool search,
                                   struct ap_notes_seen *s);
/** ap_modules_refresh(), taking the notes from @p seen (NULL: none) where
 * they still hold; where @p seen saw no library with a note and @p list is
 * empty, the main program alone, as @p seen found it (no walk). */
AP_HIDDEN int ap_modules_refresh_seen(struct ap_module **list, const struct ap_notes_seen *seen);

/**
 * Module @p m's note says version 2 (prepatch_load.c), so its sites hold a
 * profile's bytes. Read the originals from the module's file, check that they
 * belong to these bytes (same table, same sites, memory holding exactly what
 * the file says was written) and put them in m->orig. Any mismatch refuses
 * the module (m->reason, one WARN line). 0 or -ENOMEM.
 */
AP_HIDDEN int ap_prepatch_originals(struct ap_module *m);

/**
 * Open pre-patched module @p m (its per-site arrays hold memory's bytes).
 * The main program with a filled plan note @p plan of @p plansz bytes that
 * holds against memory: the choices and planner version from the note, the
 * file not read (m->orig_in_file). Anything else -- a library (its path may
 * not reach its file later), no note, an empty one, one that does not hold
 * (stale or forged: one INFO line) -- ap_prepatch_originals(). 0 or -ENOMEM.
 */
AP_HIDDEN int ap_prepatch_open(struct ap_module *m, const uint8_t *plan, uint32_t plansz);

/**
 * The originals of @p m, opened from its plan note, read from its file now
 * with ap_prepatch_originals()'s checks: before anything plans, reverts or
 * lists original bytes. Nothing to do when they are in memory already. A
 * file whose choices or planner version are not the note's is believed (its
 * choices taken, the module no longer settled: planned as without a note).
 * A file that cannot be read or used leaves m->orig_in_file set and, only
 * when @p refuse (the apply cannot go on without the originals), refuses the
 * module (BAD_TABLE, one warning: its sites keep the bytes they hold); a
 * site list or a debug run asks with !@p refuse and changes nothing then.
 * 0 or -ENOMEM (nothing changed; asked again next time).
 */
AP_HIDDEN int ap_prepatch_need(struct ap_module *m, bool refuse);

/**
 * A pre-patched module @p m whose results still hold the file's choices
 * (m->prepatch_choices), written by this library's planner
 * (m->prepatch_planner): true when at every site the entry the file wrote
 * is the one @p fs selects (ap_plan_pick(), -1 for the original, which the
 * file must then have kept), so the plan for @p fs is what memory held when
 * the module was read: the results in m->st hold it, m->planned those bytes;
 * m->settled_patched is then set, and m->prepatch_agreed, which answers the
 * same question again in this apply (the set does not change within one).
 */
AP_HIDDEN bool ap_prepatch_agrees(struct ap_module *m, const struct altpatch_features *fs);

/**
 * ap_prepatch_agrees() for the module's decision: true when it is settled
 * on the file's choices. Either way they are used once (m->prepatch_choices
 * and m->prepatch_agreed cleared): false, the module is decided site by site.
 */
AP_HIDDEN bool ap_prepatch_settle(struct ap_module *m, const struct altpatch_features *fs);

/**
 * ap_prepatch_agrees() for a dry run's decision: the file's choices are not
 * used up (the next apply that writes still settles on them). Where they do
 * not agree, the dry run decides the module and its plan goes to res: the
 * choices are first copied to m->prepatch_res (none copied, and the choices
 * dropped, when that allocation fails).
 */
AP_HIDDEN bool ap_prepatch_look(struct ap_module *m, const struct altpatch_features *fs);

#endif /* ALTPATCH_HOST_H */
