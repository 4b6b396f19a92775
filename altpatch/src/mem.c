/* SPDX-License-Identifier: MIT */
/*
 * mem.c - the library's small blocks: a bounded region of its own before
 * the C library's heap.
 *
 * A process's first malloc() sets the heap up (brk, the arena, the thread
 * cache: tens of microseconds in a fresh process on a KVM guest), and each of
 * malloc, calloc, realloc and free is one more symbol for the dynamic linker
 * to bind. A small program's first
 * apply needs a few blocks of a few KiB (the module, its path, its sites and
 * kept state, the shape memo, the run's arrays); they come from a static
 * region here instead, and a program that never used the heap does not set
 * it up for the library. A program of about a thousand sites still fits:
 * its per-site block and the run's queue are tens of KiB, and a fresh
 * process's first malloc() of such blocks (the arena, brk, the heap's
 * growth) cost its first apply more than the apply's own work there.
 *
 * The region is AP_MEM_REGION bytes of .bss (pages the kernel gives at their
 * first write, so its size costs address space, not memory): blocks one
 * after the other from its start, each after a
 * 16-byte header (capacity, size asked, state). A block is taken first-fit
 * among the freed ones (neighbours joined as the search meets them; at most
 * AP_MEM_SEARCH blocks looked at, none when the free bytes in all are too
 * few) or from the top; a freed block at the top lowers it. A request larger than
 * AP_MEM_BLOCK_MAX, one the region has no room for, or one made while
 * another thread (or a signal handler interrupting this one) holds the
 * region goes to malloc(): callers see one allocator.
 *
 * ap_mem_free() and ap_mem_realloc() take either kind and tell them apart by
 * address; every block from here is given back or resized through them (a
 * region block handed to free() would be a crash). Freeing marks the header
 * with one atomic store and takes no lock: it never waits, and never fails.
 * Taking a block needs the region (a try-lock, never a wait). A child forked
 * while another thread held it never gets it and uses the heap; its blocks
 * of the parent stay valid.
 *
 * Under AddressSanitizer the region is not used: every block comes from the
 * sanitizer's malloc(), which guards it with redzones, keeps it in quarantine
 * once freed and checks it for leaks -- a region of the library's own would
 * hide all three from the suite's sanitizer runs.
 *
 * Under memcheck, where the build found <valgrind/memcheck.h>, it is told
 * of the region's blocks with its client requests: a block is one of
 * its own from the take to the free (MALLOCLIKE, RESIZEINPLACE, FREELIKE),
 * and the rest of the region -- headers, the bytes after a block's size,
 * free blocks -- unaddressable, so it reports an overrun, a use after free
 * (until the block is taken again) and a leak as for malloc()'s blocks. The
 * allocator's own header accesses run with this thread's reports off. The
 * region is the same under every tool. The first take asks once (a request
 * only memcheck answers); elsewhere -- without valgrind, under callgrind --
 * a take or a free costs a load or two more, nothing else.
 */
#include "util.h"

#include <stdlib.h>

#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define AP_MEM_MEMCHECK 1
#endif
#endif

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AP_MEM_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define AP_MEM_ASAN 1
#endif

/* A block's header: its capacity (bytes after the header, a multiple of
 * 16), the size asked, and its state. */
struct ap_mem_head {
    uint32_t cap;
    uint32_t size;
    uint32_t used; /* AP_MEM_USED, or 0: free (stored atomically) */
    uint32_t pad;
};
#define AP_MEM_USED 0x55534544u
#define AP_MEM_HEAD ((uint32_t)sizeof(struct ap_mem_head))
/* Blocks a request looks at before it tries the top (a region filled with
 * small blocks by a large program is not searched from end to end each time). */
#define AP_MEM_SEARCH 128u

_Static_assert(sizeof(struct ap_mem_head) == 16, "a header keeps the blocks 16-byte aligned");
_Static_assert(AP_MEM_REGION % 16 == 0 && AP_MEM_BLOCK_MAX < AP_MEM_REGION, "region sizes");

static unsigned char ap_mem_region[AP_MEM_REGION] __attribute__((aligned(4096)));
/* The state below is read and written by the holder of ap_mem_lock only. */
AP_STATE static uint32_t ap_mem_top;    /* bytes of the region in blocks */
AP_STATE static uint32_t ap_mem_high;   /* the highest top so far: zero bytes above it */
AP_STATE static int ap_mem_lock;        /* 1: held */
AP_STATE static bool ap_mem_off;       /* ap_mem_use_region(false): malloc() only */
AP_STATE static size_t ap_mem_taken; /* capacity of the blocks in use, headers included */
/* Under memcheck: 1; not: -1; not asked yet: 0 (asked by the first take,
 * the region held). */
AP_STATE static int ap_mem_vg;

static inline struct ap_mem_head *ap_mem_at(uint32_t off)
{
    return (struct ap_mem_head *)(void *)(ap_mem_region + off);
}

AP_HOT bool ap_mem_owns(const void *p)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)ap_mem_region;
    return a >= b + AP_MEM_HEAD && a < b + AP_MEM_REGION;
}

static struct ap_mem_head *ap_mem_head_of(void *p)
{
    return (struct ap_mem_head *)(void *)((unsigned char *)p - AP_MEM_HEAD);
}

/* ---- memcheck's view of the region (nothing without it) ---- */

/* Whether memcheck is told of the blocks (asked by the first take). */
static bool ap_mem_told(void)
{
    return __atomic_load_n(&ap_mem_vg, __ATOMIC_RELAXED) > 0;
}

/* The region held: under memcheck, the first take makes the whole region
 * unaddressable (no block is taken yet). memcheck answers the request -1;
 * another tool, or none, 0. */
static void ap_mem_ask_memcheck(void)
{
    if (ap_mem_vg)
        return;
    int vg = -1;
#ifdef AP_MEM_MEMCHECK
    if ((long)VALGRIND_MAKE_MEM_NOACCESS(ap_mem_region, AP_MEM_REGION) == -1)
        vg = 1;
#endif
    __atomic_store_n(&ap_mem_vg, vg, __ATOMIC_RELAXED);
}

/* Headers are unaddressable to memcheck: the allocator's own accesses to
 * them between ap_mem_quiet() and ap_mem_loud() are not reported (this
 * thread only; a load there reads as defined). */
static void ap_mem_quiet(bool vg)
{
#ifdef AP_MEM_MEMCHECK
    if (vg)
        VALGRIND_DISABLE_ERROR_REPORTING;
#else
    (void)vg;
#endif
}

static void ap_mem_loud(bool vg)
{
#ifdef AP_MEM_MEMCHECK
    if (vg)
        VALGRIND_ENABLE_ERROR_REPORTING;
#else
    (void)vg;
#endif
}

/* Block @p p taken with @p size bytes (undefined until written). */
static void ap_mem_tell_taken(void *p, size_t size)
{
#ifdef AP_MEM_MEMCHECK
    VALGRIND_MALLOCLIKE_BLOCK(p, size, 0, 0);
#else
    (void)p, (void)size;
#endif
}

/* Block @p p resized in place from @p old to @p size bytes. */
static void ap_mem_tell_resized(void *p, size_t old, size_t size)
{
#ifdef AP_MEM_MEMCHECK
    VALGRIND_RESIZEINPLACE_BLOCK(p, old, size, 0);
#else
    (void)p, (void)old, (void)size;
#endif
}

/* Block @p p given back: unaddressable again. */
static void ap_mem_tell_given_back(void *p)
{
#ifdef AP_MEM_MEMCHECK
    VALGRIND_FREELIKE_BLOCK(p, 0);
#else
    (void)p;
#endif
}

static bool ap_mem_is_free(const struct ap_mem_head *h)
{
    return __atomic_load_n(&h->used, __ATOMIC_ACQUIRE) != AP_MEM_USED;
}

/* A block of @p size bytes from the region, or NULL; *@p used: its first
 * bytes that may be other than zero (those below the highest top so far).
 * The region held. */
static void *ap_mem_take_locked(size_t size, size_t *used)
{
    uint32_t need = (uint32_t)((size + 15) & ~(size_t)15);
    if (!need)
        need = 16;
    /* not enough free bytes in all (a region filled by a large program's
     * small blocks): no search */
    if (AP_MEM_REGION - __atomic_load_n(&ap_mem_taken, __ATOMIC_RELAXED) < AP_MEM_HEAD + need)
        return NULL;
    struct ap_mem_head *h = NULL;
    /* at most AP_MEM_SEARCH blocks looked at: then the top, or malloc() */
    unsigned left = AP_MEM_SEARCH;
    for (uint32_t off = 0; off < ap_mem_top && left; left--) {
        struct ap_mem_head *c = ap_mem_at(off);
        uint32_t next = off + AP_MEM_HEAD + c->cap;
        if (!ap_mem_is_free(c)) {
            off = next;
            continue;
        }
        /* join the free blocks after it */
        while (next < ap_mem_top && ap_mem_is_free(ap_mem_at(next))) {
            c->cap += AP_MEM_HEAD + ap_mem_at(next)->cap;
            next = off + AP_MEM_HEAD + c->cap;
        }
        if (next >= ap_mem_top) {
            ap_mem_top = off; /* a free block at the top: the top comes down */
            break;
        }
        if (c->cap >= need) {
            if (c->cap - need >= AP_MEM_HEAD + 16) { /* the rest a free block of its own */
                struct ap_mem_head *rest = ap_mem_at(off + AP_MEM_HEAD + need);
                rest->cap = c->cap - need - AP_MEM_HEAD;
                rest->size = 0;
                __atomic_store_n(&rest->used, 0, __ATOMIC_RELAXED);
                c->cap = need;
            }
            h = c;
            break;
        }
        off = next;
    }
    if (!h) {
        if (AP_MEM_REGION - ap_mem_top < AP_MEM_HEAD + need)
            return NULL;
        h = ap_mem_at(ap_mem_top);
        h->cap = need;
        ap_mem_top += AP_MEM_HEAD + need;
    }
    uint32_t start = (uint32_t)((unsigned char *)(h + 1) - ap_mem_region);
    *used = ap_mem_high > start ? ap_mem_high - start : 0;
    if (ap_mem_top > ap_mem_high)
        ap_mem_high = ap_mem_top;
    h->size = (uint32_t)size;
    __atomic_fetch_add(&ap_mem_taken, AP_MEM_HEAD + h->cap, __ATOMIC_RELAXED);
    __atomic_store_n(&h->used, AP_MEM_USED, __ATOMIC_RELAXED);
    return h + 1;
}

bool ap_mem_has_region(void)
{
#ifdef AP_MEM_ASAN
    return false;
#else
    return true;
#endif
}

static bool ap_mem_try_hold(void)
{
    return !__atomic_exchange_n(&ap_mem_lock, 1, __ATOMIC_ACQUIRE);
}

static void ap_mem_let_go(void)
{
    __atomic_store_n(&ap_mem_lock, 0, __ATOMIC_RELEASE);
}

/* A region block of @p size bytes, or NULL (too large, no room, held);
 * *@p used as ap_mem_take_locked() says. */
AP_HOT static void *ap_mem_take(size_t size, size_t *used)
{
    if (!ap_mem_has_region() || size > AP_MEM_BLOCK_MAX ||
        __atomic_load_n(&ap_mem_off, __ATOMIC_RELAXED) ||
        !ap_mem_try_hold())
        return NULL;
    ap_mem_ask_memcheck();
    bool vg = ap_mem_told();
    ap_mem_quiet(vg);
    void *p = ap_mem_take_locked(size, used);
    ap_mem_loud(vg);
    if (p && vg)
        ap_mem_tell_taken(p, size);
    ap_mem_let_go();
    return p;
}

AP_HOT void *ap_mem_alloc(size_t size)
{
    size_t used;
    void *p = ap_mem_take(size, &used);
    return p ? p : malloc(size ? size : 1);
}

AP_HOT void *ap_mem_calloc(size_t n, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total))
        return NULL;
    size_t used = 0;
    void *p = ap_mem_take(total, &used);
    if (!p)
        return calloc(n ? n : 1, size ? size : 1);
    /* bytes never in a block are zero still (.bss): a small program's first
     * apply zeroes nothing, and binds no memset() */
    if (used)
        memset(p, 0, used < total ? used : total);
#ifdef AP_MEM_MEMCHECK
    if (ap_mem_told()) /* every byte zero now */
        (void)VALGRIND_MAKE_MEM_DEFINED(p, total);
#endif
    return p;
}

AP_HOT void ap_mem_free(void *p)
{
    if (!p)
        return; /* free(NULL) would bind free() for nothing */
    if (!ap_mem_owns(p)) {
        free(p);
        return;
    }
    struct ap_mem_head *h = ap_mem_head_of(p);
    bool vg = ap_mem_told();
    ap_mem_quiet(vg);
    bool live = __atomic_load_n(&h->used, __ATOMIC_RELAXED) == AP_MEM_USED;
    ap_mem_loud(vg);
    if (!live) {
        ap_log(ALTPATCH_WARN, "internal: a block of the library's region freed twice (%p)\n", p);
        return;
    }
    if (vg) /* before the store: the block is not taken again before memcheck forgets it */
        ap_mem_tell_given_back(p);
    ap_mem_quiet(vg);
    __atomic_fetch_sub(&ap_mem_taken, AP_MEM_HEAD + h->cap, __ATOMIC_RELAXED);
    __atomic_store_n(&h->used, 0, __ATOMIC_RELEASE);
    ap_mem_loud(vg);
}

AP_PLAIN_PATH void *ap_mem_realloc(void *p, size_t size)
{
    if (!p)
        return ap_mem_alloc(size);
    if (!ap_mem_owns(p))
        return realloc(p, size ? size : 1);
    struct ap_mem_head *h = ap_mem_head_of(p);
    bool vg = ap_mem_told();
    ap_mem_quiet(vg);
    uint32_t old = h->size;
    bool room = size <= h->cap;
    if (room) /* room in the block: the size asked only */
        h->size = (uint32_t)size;
    ap_mem_loud(vg);
    if (room) {
        if (vg)
            ap_mem_tell_resized(p, old, size);
        return p;
    }
    /* the top block grows in place where the region has room */
    if (size <= AP_MEM_BLOCK_MAX && ap_mem_try_hold()) {
        uint32_t off = (uint32_t)((unsigned char *)h - ap_mem_region);
        uint32_t need = (uint32_t)((size + 15) & ~(size_t)15);
        ap_mem_quiet(vg);
        bool grown = off + AP_MEM_HEAD + h->cap == ap_mem_top &&
                     AP_MEM_REGION - off - AP_MEM_HEAD >= need;
        if (grown) {
            __atomic_fetch_add(&ap_mem_taken, need - h->cap, __ATOMIC_RELAXED);
            h->cap = need;
            ap_mem_top = off + AP_MEM_HEAD + need;
            if (ap_mem_top > ap_mem_high)
                ap_mem_high = ap_mem_top;
            h->size = (uint32_t)size;
        }
        ap_mem_loud(vg);
        if (grown && vg)
            ap_mem_tell_resized(p, old, size);
        ap_mem_let_go();
        if (grown)
            return p;
    }
    void *q = ap_mem_alloc(size);
    if (!q)
        return NULL; /* p untouched, as realloc() leaves it */
    memcpy(q, p, old);
    ap_mem_free(p);
    return q;
}

void ap_mem_use_region(bool on)
{
    __atomic_store_n(&ap_mem_off, !on, __ATOMIC_RELAXED);
}

size_t ap_mem_in_use(void)
{
    return __atomic_load_n(&ap_mem_taken, __ATOMIC_RELAXED);
}
