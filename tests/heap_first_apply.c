/* SPDX-License-Identifier: MIT */
/*
 * A small program's first apply takes no block of the C library's heap, and
 * the library's own region does not grow with altpatch_dlopen()/dlclose()
 * cycles.
 *
 * Linked with -Wl,--wrap for malloc, calloc, realloc, free, posix_memalign
 * and aligned_alloc: every call of the library (linked statically) and of
 * this program goes through the counters below. Without a sanitizer or
 * valgrind, the C library's own answer is checked too: a main arena that
 * never grew (mallinfo2().arena == 0) means no heap call from anywhere.
 *
 *   1. the first altpatch_apply() of the process: no heap call (free(NULL)
 *      counts: it would bind free()), the region holds its blocks, the
 *      sites run their replacements (built with HEAP_FIRST_MANY=N: the
 *      program has N more sites, whose first apply needs blocks of tens of
 *      KiB, every one of them written);
 *   2. a fork: the child frees and takes blocks of its copy, applies again;
 *   3. altpatch_dlopen()/dlclose() of libapfix_dl.so, CYCLES times: the
 *      region in use and the heap in use are the same after the last cycle
 *      as after the warm-up ones (within the loader's own growth), and no
 *      later cycle makes more heap calls than the first after the warm-up
 *      (a region that kept its freed blocks would fill up and send the
 *      module's blocks to the heap).
 *
 * Prints "heap_first_apply: ok" when every check held.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <altpatch/altpatch.h>

#include "ap_live_sites.h"
#include "util.h"

#ifdef HEAP_FIRST_MANY
#include "ap_mov_sites.h"

/* HEAP_FIRST_MANY sites of five bytes, from the label on */
__attribute__((noinline, used)) static long many_sites(void)
{
    long r;
    __asm__ __volatile__("heap_many_lo:\n\t" AP_MOV_SITES(AP_MOV_STR(HEAP_FIRST_MANY)) : "=a"(r));
    return r;
}
extern const uint8_t heap_many_lo[] __asm__("heap_many_lo");

/* how many of the sites hold @p want */
static unsigned many_holding(const unsigned char *want)
{
    unsigned k = 0;
    for (unsigned i = 0; i < HEAP_FIRST_MANY; i++)
        k += memcmp(heap_many_lo + 5 * i, want, 5) == 0;
    return k;
}
#endif

#define WARMUP 20
#define CYCLES 300
/* what the loader itself may keep over the cycles (its link maps' scope
 * arrays and the like); the library's blocks are given back or reused */
#define MAX_HEAP_GROWTH (64u * 1024)

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t s);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);

static volatile int counting;
static volatile unsigned long heap_calls;

static void count(void)
{
    if (counting)
        heap_calls++;
}

void *__wrap_malloc(size_t n)
{
    count();
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t s)
{
    count();
    return __real_calloc(n, s);
}
void *__wrap_realloc(void *p, size_t n)
{
    count();
    return __real_realloc(p, n);
}
void __wrap_free(void *p)
{
    count(); /* free(NULL) too: a call the loader would bind */
    __real_free(p);
}
int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    count();
    return __real_posix_memalign(p, a, n);
}
void *__wrap_aligned_alloc(size_t a, size_t n)
{
    count();
    return __real_aligned_alloc(a, n);
}

static int failed;

static void check(int ok, const char *what)
{
    if (!ok) {
        printf("heap_first_apply: FAILED: %s\n", what);
        failed = 1;
    }
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* one altpatch_dlopen() of the fixture, its call checked, dlclose() */
static int dl_cycle(void)
{
    void *h = altpatch_dlopen(APFIX_DL_PATH, RTLD_NOW);
    if (!h)
        return 0;
    long (*call)(long) = (long (*)(long))dlsym(h, "apfix_dl_call");
    int ok = call && call(1) == 3;
    dlclose(h);
    return ok;
}

/*
 * Whether the kernel answers PROCMAP_QUERY (Linux 6.11) on /proc/self/maps,
 * asked here with system calls only: without it the writer reads the whole
 * maps file into a buffer of the heap, so a first apply that writes makes
 * heap calls there. The layout is the kernel's ABI (104 bytes).
 */
struct procmap_query_abi {
    uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size;
    uint64_t vma_offset, inode;
    uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
    uint64_t vma_name_addr, build_id_addr;
};

static int maps_query_answered(void)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct procmap_query_abi q = {.size = sizeof(q), .query_addr = (uint64_t)(uintptr_t)&maps_query_answered};
    int ok = ioctl(fd, _IOWR('f', 17, struct procmap_query_abi), &q) == 0;
    close(fd);
    return ok;
}

int main(void)
{
    altpatch_set_print(NULL);
    int queried = maps_query_answered();
    int region = ap_mem_has_region();
    /* 1. the process's first apply */
#ifdef HEAP_FIRST_MANY
    check(many_holding(ap_mov_orig) == HEAP_FIRST_MANY, "the many sites start original");
#endif
    size_t arena0 = mallinfo2().arena;
    counting = 1;
    int r = altpatch_apply();
    counting = 0;
    unsigned long first_calls = heap_calls;
    size_t arena1 = mallinfo2().arena;
    size_t region1 = ap_mem_in_use();
    printf("heap_first_apply: first apply %d, %lu heap calls, main arena %zu -> %zu bytes, "
           "region in use %zu bytes\n",
           r, first_calls, arena0, arena1, region1);
    check(r == 0, "the first apply returns 0");
    check(site_one() == 2 && site_pair() == 22, "the sites run their replacements");
#ifdef HEAP_FIRST_MANY
    unsigned many = many_holding(ap_mov_repl);
    printf("heap_first_apply: %u of %u more sites written\n", many, (unsigned)HEAP_FIRST_MANY);
    check(many == HEAP_FIRST_MANY && many_sites() == 2, "every one of the many sites written");
#endif
    if (queried && region) {
        check(first_calls == 0, "the first apply called malloc/calloc/realloc/free");
        check(arena1 == arena0, "the C library's main arena grew during the first apply");
    } else if (!queried) {
        printf("heap_first_apply: the kernel does not answer PROCMAP_QUERY: the writer reads "
               "/proc/self/maps into a heap buffer, heap calls not checked\n");
    }
    if (region)
        check(region1 > 0, "the first apply's blocks are in the library's region");
#ifdef HEAP_FIRST_MANY
    /* on any kernel: the per-site block (~17 KiB) and more are the region's */
    if (region)
        check(region1 >= 16 * 1024, "the many sites' blocks are in the library's region");
#endif
    else
        printf("heap_first_apply: no region in this build (AddressSanitizer's malloc takes "
               "every block): only the cycles' heap and values checked\n");

    /* 2. a fork: the child's copy of the region */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int ok = dl_cycle() && dl_cycle() && altpatch_apply() == 0 && site_one() == 2;
        _exit(ok && ap_mem_in_use() >= region1 ? 0 : 1);
    }
    int st = 0;
    check(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "a forked child's dlopen/dlclose cycles and apply");

    /* 3. dlopen/dlclose cycles */
    size_t region0 = 0, h0 = 0, peak = 0;
    unsigned long calls_warm = 0, calls_late = 0; /* heap calls of the library in a cycle */
    long bad = 0;
    for (int c = 0; c < CYCLES; c++) {
        if (c == WARMUP) {
            region0 = ap_mem_in_use();
            h0 = heap_in_use();
        }
        unsigned long k0 = heap_calls;
        counting = 1;
        bad += !dl_cycle();
        counting = 0;
        unsigned long k = heap_calls - k0;
        if (c == WARMUP)
            calls_warm = k;
        else if (c > WARMUP && k > calls_late)
            calls_late = k;
        size_t u = ap_mem_in_use();
        peak = u > peak ? u : peak;
    }
    /* the last module closed is dropped by the next walk */
    check(altpatch_apply() == 0, "the apply after the cycles");
    size_t region2 = ap_mem_in_use(), h2 = heap_in_use();
    printf("heap_first_apply: %d dlopen/dlclose cycles, %ld bad calls, region in use %zu -> %zu "
           "bytes (peak %zu), heap in use %zu -> %zu bytes, heap calls in a cycle %lu after the "
           "warm-up, at most %lu after\n",
           CYCLES, bad, region0, region2, peak, h0, h2, calls_warm, calls_late);
    check(bad == 0, "a cycle's call gave a wrong value");
    if (region) {
        check(peak > region1, "a loaded module's blocks are in the region too");
        check(region2 <= region0, "the region in use grew with the cycles");
    }
    check(h2 <= h0 + MAX_HEAP_GROWTH, "the heap in use grew with the cycles");
    check(calls_late <= calls_warm, "later cycles took blocks from the heap the region gave before");
    printf("heap_first_apply: %s\n", failed ? "FAILED" : "ok");
    return failed;
}
