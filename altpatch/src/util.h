/* SPDX-License-Identifier: MIT */
/*
 * util.h - floor 0 of libaltpatch: what every other file may use.
 *
 * The library's files stand on five floors; a file includes the header of
 * its own floor (which includes the ones below) and calls only names of its
 * floor or below, never above (docs/architecture.md; tests/check_layers.sh
 * enforces the includes):
 *
 *   4  apply.h  apply.c pins.c sitecache.c debug.c (runtime API), image.c (offline API)
 *   3  host.h   cpu.c module.c view.c prepatch_load.c writer.c poke.c live.c
 *   2  plan.h   plan.c memo.c                                       (pure)
 *   1  pure.h   record.c prepatch.c elfsec.c features.c insn.c nop.c reloc.c
 *   0  util.h   util.c reason.c primitives.c
 *
 * Floor 0: log (through the callback set by altpatch_set_print()),
 * environment (ignored under AT_SECURE), clock, reason strings (reason.c),
 * and the x86 instructions the library executes itself (CPUID, XGETBV).
 * Everything declared in src/ has hidden visibility.
 */
#ifndef ALTPATCH_UTIL_H
#define ALTPATCH_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#define AP_HIDDEN __attribute__((visibility("hidden")))
/*
 * The library's small mutable state that an apply reads and writes: in the
 * data section (a page the loader has written already, with its relocated
 * pointers and lazily bound slots), not spread over the zero pages of .bss
 * between large buffers, where each page costs a first apply two faults
 * (the first read maps the zero page, the first write copies it).
 */
#define AP_STATE __attribute__((section(".data.altpatch_state")))
/*
 * A function a small program's first apply runs (the pre-patched or settled
 * path: module walk, notes, features, the region, pins, the sites' check
 * against the note): gcc places these
 * together (.text.hot), so that a fresh process's first apply touches a few
 * contiguous pages of the library's code instead of one or two in each of
 * its files -- each a page to map, and on some hypervisors a page-table
 * fill of their own.
 */
#define AP_HOT __attribute__((hot))
/*
 * A function the first apply of a program that is not pre-patched runs
 * besides those (the decision, the planner and its memo, the writer): a
 * section of its own, which the linker places after .text, beside the
 * writer's window routine (altpatch_poke_text). That path's code is then
 * contiguous, and the pre-patched path keeps its pages: marked hot
 * instead, these would join the hot group file by file, between its
 * functions (a pre-patched program's first apply took ~10 us more on the
 * guest of docs/benchmarks.md part 3b); grouped right after it
 * (.text.sorted.*), it took ~4 us more, cause not found.
 */
#define AP_PLAIN_PATH __attribute__((section("altpatch_plain_text")))

/** Calls into the user's print callback (altpatch_set_print()) so far: user
 * code that may have started a thread or installed a seccomp filter since
 * a proof that the process was alone (apply.c's ap_run_fresh()). */
AP_HIDDEN extern unsigned long ap_user_calls;
static inline unsigned long ap_user_calls_now(void)
{
    return __atomic_load_n(&ap_user_calls, __ATOMIC_RELAXED);
}
/** Log through the callback set by altpatch_set_print(). */
AP_HIDDEN void ap_log(enum altpatch_print_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/** getenv(), or NULL when AT_SECURE is set. */
AP_HIDDEN const char *ap_getenv(const char *name);
/** An environment switch: set (ap_getenv()), non-empty and not "0". */
AP_HIDDEN bool ap_env_on(const char *name);
/** The variables an apply reads, in one pass over the environment (each
 * ap_getenv()'s answer: NULL when unset, or when AT_SECURE is set). */
struct ap_env {
    const char *off, *debug, *clearcpuid;
};
AP_HIDDEN void ap_env_read(struct ap_env *e);
/** A switch's value @p v (from ap_env_read()) is on: ap_env_on()'s rule. */
static inline bool ap_env_value_on(const char *v)
{
    return v && *v && !(v[0] == '0' && v[1] == '\0');
}
/** ap_log() by a caller that has just read ALTPATCH_DEBUG (@p debug: the
 * switch is on): the environment is not read again to decide whether the
 * message is dropped (the library's default printer still asks it). */
AP_HIDDEN void ap_log_env(bool debug, enum altpatch_print_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/** Monotonic nanoseconds. */
AP_HIDDEN uint64_t ap_now_ns(void);
/** madvise() advice that makes a range present, writable (Linux 5.14). */
#define AP_MADV_POPULATE_WRITE 23
/*
 * The library's blocks (mem.c): a small block comes from a bounded static
 * region of the library's own while it has room (a small program's first
 * apply then never sets up the C library's heap), any other from malloc().
 * A block of ap_mem_alloc(), ap_mem_calloc(), ap_malloc_filled() or
 * ap_malloc_filled_head() is resized by ap_mem_realloc() and given back by
 * ap_mem_free() only (never realloc() or free()); these two take a block of
 * malloc() too. Thread-safe, never waits: a request made while the region
 * is held elsewhere goes to malloc().
 */
/** Bytes of the region: a program of about 1,000 sites applies from it alone. */
#define AP_MEM_REGION (128u * 1024)
/** The largest block taken from the region (the run's queue of 1,000 sites
 * is ~54 KiB); larger ones come from malloc(). */
#define AP_MEM_BLOCK_MAX (64u * 1024)
/** malloc(), from the region where it can. NULL when memory is short. */
AP_HIDDEN void *ap_mem_alloc(size_t size);
/** calloc(), from the region where it can. NULL when memory is short. */
AP_HIDDEN void *ap_mem_calloc(size_t n, size_t size);
/** realloc() of a block of this allocator or of malloc(). */
AP_HIDDEN void *ap_mem_realloc(void *p, size_t size);
/** free() of a block of this allocator or of malloc(); NULL does nothing. */
AP_HIDDEN void ap_mem_free(void *p);
/** @p p lies in the region. */
AP_HIDDEN bool ap_mem_owns(const void *p);
/** Bytes of the region in blocks in use, headers included. */
AP_HIDDEN size_t ap_mem_in_use(void);
/** Whether this build takes blocks from the region at all: not under
 * AddressSanitizer, whose own malloc() then sees every block (quarantine,
 * redzones, leak check). */
AP_HIDDEN bool ap_mem_has_region(void);
/** Take new blocks from the region (@p on, the default) or from malloc()
 * only (for tests that make the C library's allocator fail); blocks taken
 * before are given back as before either way. */
AP_HIDDEN void ap_mem_use_region(bool on);
/** The smallest block ap_malloc_filled() makes present in one advice. */
#define AP_FILL_MIN (64u * 1024)
/**
 * malloc(@p size) for an array about to be written from end to end: where
 * the caller allowed it (ap_fill_allow()) and the block is large, its pages
 * are made present in one madvise(MADV_POPULATE_WRITE) instead of one page
 * fault each as the writes reach them. A small block comes from
 * ap_mem_alloc(). NULL when memory is short.
 */
AP_HIDDEN void *ap_malloc_filled(size_t size);
/**
 * ap_malloc_filled() for a block of @p size whose first @p head bytes are
 * about to be written (and written again: a queue whose slots are used over):
 * only their pages are made present; the rest get theirs when touched.
 */
AP_HIDDEN void *ap_malloc_filled_head(size_t size, size_t head);
/**
 * Allow ap_malloc_filled() its madvise() (@p on: the caller knows, from a
 * proof taken since its last call into the application's code, that no
 * seccomp filter runs in this single-threaded call, so an advice an older
 * kernel does not know cannot be fatal), or forbid it again. Once the print
 * callback has been called since the proof (ap_user_calls; it may have
 * installed a filter, or started a thread that installs one later), no
 * advice is given until the next proof.
 */
AP_HIDDEN void ap_fill_allow(bool on);
/**
 * Allow ap_malloc_filled() its madvise() once @p prove says so: asked at the
 * first block large enough to be filled (never for small ones), its answer
 * kept until ap_fill_allow() or this is called again. For a caller that
 * proves the single thread and the absence of a seccomp filter only when it
 * needs the proof.
 */
AP_HIDDEN void ap_fill_ask(bool (*prove)(void));

/* ------------------------------------------------------------------------- */
/* x86 instructions the library runs itself                                  */
/* ------------------------------------------------------------------------- */

/**
 * A system call made directly (the system call ABI, no C library wrapper):
 * -errno on failure, errno untouched. The writer's path, the host
 * detection and the block prefault use it so that a process's first apply does not bind a wrapper
 * lazily (the dynamic linker's symbol lookup, each time several hundred
 * instructions and cold pages). Unused arguments: 0.
 */
static inline long ap_sys(long nr, long a, long b, long c, long d, long e)
{
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}

struct ap_regs {
    uint32_t a, b, c, d;
};

/** CPUID leaf @p leaf, subleaf @p sub. */
static inline struct ap_regs ap_cpuid(uint32_t leaf, uint32_t sub)
{
    struct ap_regs r;
    __asm__ volatile("cpuid" : "=a"(r.a), "=b"(r.b), "=c"(r.c), "=d"(r.d) : "a"(leaf), "c"(sub));
    return r;
}

/** XCR0 (only when CPUID says OSXSAVE: XGETBV raises #UD otherwise). */
static inline uint64_t ap_xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/*
 * Serializing instructions. After code was written, the CPU that runs it
 * next must not execute what it fetched or decoded before the write (Intel
 * SDM vol. 3A, "Handling Self- and Cross-Modifying Code": a serializing
 * instruction resynchronizes the prefetch queue; a write through another
 * linear address, such as /proc/self/mem, is not caught by the processor's
 * self-modifying-code check). Which one to run is cpu.c's ap_sync_core().
 */

/** CPUID leaf 0: serializing everywhere, and an exit to the hypervisor in a guest. */
static inline void ap_serialize_cpuid(void)
{
    uint32_t a = 0, b, c = 0, d;
    __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d) : : "memory");
}

/** SERIALIZE (0f 01 e8): only where CPUID.(EAX=7,ECX=0):EDX[14] says so, else #UD. */
static inline void ap_serialize_insn(void)
{
    __asm__ volatile(".byte 0x0f, 0x01, 0xe8" : : : "memory");
}

/**
 * IRETQ to the next instruction, at the same privilege level: serializing,
 * and no hypervisor exit. The frame (SS, RSP, RFLAGS, CS, RIP) is built below
 * the 128-byte red zone, which the compiler may be using. Not where a shadow
 * stack is enabled: IRET then expects a matching shadow-stack frame (#CP).
 */
static inline void ap_serialize_iret(void)
{
    uint64_t tmp;
    __asm__ volatile("subq $128, %%rsp\n\t"
                     "movq %%ss, %0\n\t"
                     "pushq %0\n\t"
                     "leaq 8(%%rsp), %0\n\t"
                     "pushq %0\n\t"
                     "pushfq\n\t"
                     "movq %%cs, %0\n\t"
                     "pushq %0\n\t"
                     "leaq 1f(%%rip), %0\n\t"
                     "pushq %0\n\t"
                     "iretq\n"
                     "1:\n\t"
                     "addq $128, %%rsp"
                     : "=&r"(tmp)
                     :
                     : "cc", "memory");
}

/* ------------------------------------------------------------------------- */
/* Small copies and compares (site bytes: a few at a time)                   */
/* ------------------------------------------------------------------------- */

/**
 * Copy @p n bytes (a site, a replacement, a key: usually a few, at most a
 * few hundred) without a library call: overlapping word moves for 4..16,
 * single bytes below, a word loop above (the empty asm keeps the compiler
 * from turning it back into a memcpy() call, which a process's first apply
 * would then have the dynamic linker resolve). No overlap of @p dst and
 * @p src.
 */
static inline void ap_copy_small(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (n > 16) {
        uint64_t a;
        size_t i = 0;

        for (; i + 8 <= n; i += 8) {
            memcpy(&a, src + i, 8);
            memcpy(dst + i, &a, 8);
            __asm__("" : "+r"(i));
        }
        if (i < n) {
            memcpy(&a, src + n - 8, 8);
            memcpy(dst + n - 8, &a, 8);
        }
    } else if (n >= 8) {
        uint64_t a, b;

        memcpy(&a, src, 8);
        memcpy(&b, src + n - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + n - 8, &b, 8);
    } else if (n >= 4) {
        uint32_t a, b;

        memcpy(&a, src, 4);
        memcpy(&b, src + n - 4, 4);
        memcpy(dst, &a, 4);
        memcpy(dst + n - 4, &b, 4);
    } else if (n) {
        dst[0] = src[0];
        if (n > 1) {
            dst[1] = src[1];
            if (n > 2)
                dst[2] = src[2];
        }
    }
}

/**
 * Set @p n bytes to @p c without a library call (a key's mask: tens of bytes):
 * word stores, the last one overlapping. The empty asm keeps the compiler
 * from turning the loop back into a memset() call.
 */
static inline void ap_fill_small(uint8_t *dst, uint8_t c, size_t n)
{
    uint64_t w = 0x0101010101010101ull * c;

    if (n >= 8) {
        size_t i = 0;

        for (; i + 8 <= n; i += 8) {
            memcpy(dst + i, &w, 8);
            __asm__("" : "+r"(i));
        }
        if (i < n)
            memcpy(dst + n - 8, &w, 8);
    } else if (n >= 4) {
        uint32_t v = (uint32_t)w;

        memcpy(dst, &v, 4);
        memcpy(dst + n - 4, &v, 4);
    } else {
        for (size_t i = 0; i < n; i++) {
            dst[i] = c;
            __asm__("" : "+r"(i));
        }
    }
}

/*
 * The length of the string at @p s, or @p max when its first @p max bytes
 * hold no NUL: strnlen() without a call into the C library, which a
 * process's first apply would have the dynamic linker bind (one symbol
 * lookup) for a few bytes.
 */
static inline size_t ap_strnlen(const char *s, size_t max)
{
    size_t n = 0;
    while (n < max && s[n]) {
        n++;
        __asm__("" : "+r"(n)); /* not a strlen() call */
    }
    return n;
}

/** Are the @p n bytes at @p a and @p b equal? (a site, a key: a few words) */
static inline bool ap_equal_small(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint64_t x, y, d = 0;

    if (n > 32)
        return memcmp(a, b, n) == 0;
    if (n < 8) {
        uint32_t p, q, r, t;

        if (n < 4) {
            for (size_t i = 0; i < n; i++)
                d |= (uint64_t)(a[i] ^ b[i]);
            return d == 0;
        }
        memcpy(&p, a, 4);
        memcpy(&q, b, 4);
        memcpy(&r, a + n - 4, 4);
        memcpy(&t, b + n - 4, 4);
        return ((p ^ q) | (r ^ t)) == 0;
    }
    for (size_t i = 0; i + 8 <= n; i += 8) {
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        d |= x ^ y;
    }
    memcpy(&x, a + n - 8, 8);
    memcpy(&y, b + n - 8, 8);
    return (d | (x ^ y)) == 0;
}

#endif /* ALTPATCH_UTIL_H */
