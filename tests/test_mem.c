/* SPDX-License-Identifier: MIT */
/* The library's blocks (mem.c): the region, the heap beyond it, one free. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

/* The region's cases need a build that uses it (not AddressSanitizer's). */
#define NEED_REGION()                                                                          \
    do {                                                                                       \
        if (!ap_mem_has_region())                                                              \
            cr_skip_test("no region in this build: AddressSanitizer's malloc takes every block"); \
    } while (0)

static void fill(uint8_t *p, size_t n, uint8_t v)
{
    memset(p, v, n);
}

static bool holds(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

Test(mem, small_blocks_from_the_region_large_from_the_heap)
{
    NEED_REGION();
    size_t u0 = ap_mem_in_use();
    uint8_t *a = ap_mem_alloc(100), *b = ap_mem_alloc(AP_MEM_BLOCK_MAX);
    uint8_t *big = ap_mem_alloc(AP_MEM_BLOCK_MAX + 1);
    cr_assert(a && b && big);
    cr_assert(ap_mem_owns(a) && ap_mem_owns(b), "small blocks lie in the region");
    cr_assert_not(ap_mem_owns(big), "a block above AP_MEM_BLOCK_MAX comes from malloc()");
    cr_assert_eq((uintptr_t)a % 16, 0, "16-byte aligned as malloc's");
    cr_assert_eq((uintptr_t)b % 16, 0);
    cr_assert(b >= a + 100 || b + AP_MEM_BLOCK_MAX <= a, "blocks do not overlap");
    cr_assert_geq(ap_mem_in_use(), u0 + 100 + AP_MEM_BLOCK_MAX);
    fill(a, 100, 0xa1);
    fill(b, AP_MEM_BLOCK_MAX, 0xb2);
    fill(big, AP_MEM_BLOCK_MAX + 1, 0xc3);
    cr_assert(holds(a, 100, 0xa1) && holds(b, AP_MEM_BLOCK_MAX, 0xb2));
    ap_mem_free(a);
    ap_mem_free(b);
    ap_mem_free(big); /* one call for either kind */
    ap_mem_free(NULL);
    cr_assert_eq(ap_mem_in_use(), u0, "every block given back");
    cr_assert_not(ap_mem_owns(&u0));
}

Test(mem, calloc_zeroes_a_reused_block)
{
    NEED_REGION();
    uint8_t *a = ap_mem_alloc(512);
    cr_assert(a && ap_mem_owns(a));
    fill(a, 512, 0xff);
    ap_mem_free(a);
    uint8_t *z = ap_mem_calloc(4, 128);
    cr_assert(z && ap_mem_owns(z));
    cr_assert_eq(z, a, "the freed block is taken again (first fit)");
    cr_assert(holds(z, 512, 0), "calloc's block is zero");
    ap_mem_free(z);
    cr_assert_null(ap_mem_calloc(SIZE_MAX / 2, 4), "an overflowing size is refused");
}

Test(mem, realloc_keeps_the_bytes_in_place_or_moved)
{
    NEED_REGION();
    uint8_t *a = ap_mem_realloc(NULL, 40);
    cr_assert(a && ap_mem_owns(a));
    fill(a, 40, 0x11);
    uint8_t *keep = ap_mem_alloc(16); /* a is no longer at the top */
    uint8_t *b = ap_mem_realloc(a, 48); /* the same 16-byte capacity */
    cr_assert_eq(b, a);
    cr_assert(holds(b, 40, 0x11));
    b[40] = 0x22;
    uint8_t *c = ap_mem_realloc(b, 1000); /* moved within the region */
    cr_assert(c && ap_mem_owns(c) && c != b);
    cr_assert(holds(c, 40, 0x11) && c[40] == 0x22);
    /* c is the top block now: it grows where it is */
    uint8_t *d = ap_mem_realloc(c, 3000);
    cr_assert_eq(d, c, "the top block grows in place");
    cr_assert(holds(d, 40, 0x11));
    uint8_t *e = ap_mem_realloc(d, 3 * AP_MEM_BLOCK_MAX); /* out to the heap */
    cr_assert(e && !ap_mem_owns(e));
    cr_assert(holds(e, 40, 0x11) && e[40] == 0x22);
    uint8_t *f = ap_mem_realloc(e, 4 * AP_MEM_BLOCK_MAX); /* a heap block stays one */
    cr_assert(f && !ap_mem_owns(f) && holds(f, 40, 0x11));
    ap_mem_free(f);
    ap_mem_free(keep);
}

Test(mem, a_full_region_falls_back_to_the_heap_and_is_reused_after)
{
    NEED_REGION();
    size_t u0 = ap_mem_in_use();
    enum { N = 2 * AP_MEM_REGION / 1024 };
    uint8_t *p[N];
    size_t in_region = 0;
    for (int i = 0; i < N; i++) {
        p[i] = ap_mem_alloc(1000);
        cr_assert_not_null(p[i]);
        fill(p[i], 1000, (uint8_t)i);
        in_region += ap_mem_owns(p[i]);
    }
    cr_assert_gt(in_region, 0);
    cr_assert_lt(in_region, N, "the region is bounded: the rest come from the heap");
    for (int i = 0; i < N; i++)
        cr_assert(holds(p[i], 1000, (uint8_t)i), "block %d overwritten", i);
    for (int i = 0; i < N; i++)
        ap_mem_free(p[i]);
    cr_assert_eq(ap_mem_in_use(), u0);
    /* given back, the region serves again, and joins freed neighbours */
    uint8_t *big = ap_mem_alloc(AP_MEM_BLOCK_MAX);
    cr_assert(big && ap_mem_owns(big));
    for (int round = 0; round < 10000; round++) {
        uint8_t *q = ap_mem_alloc(64 + (size_t)(round % 7) * 300);
        cr_assert(q && ap_mem_owns(q), "round %d: no block reused", round);
        ap_mem_free(q);
    }
    ap_mem_free(big);
    cr_assert_eq(ap_mem_in_use(), u0);
}

Test(mem, a_forked_child_uses_its_copy)
{
    NEED_REGION();
    uint8_t *a = ap_mem_alloc(256);
    cr_assert(a && ap_mem_owns(a));
    fill(a, 256, 0x5a);
    pid_t pid = fork();
    if (pid == 0) {
        bool ok = holds(a, 256, 0x5a);
        ap_mem_free(a);
        uint8_t *b = ap_mem_alloc(256);
        ok = ok && b == a && ap_mem_owns(b);
        ap_mem_free(b);
        _exit(ok ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's copy");
    cr_assert(holds(a, 256, 0x5a), "the parent's block untouched");
    ap_mem_free(a);
}

#define THREADS 4
#define ROUNDS 20000

static void *churn(void *arg)
{
    uint8_t tag = (uint8_t)(uintptr_t)arg;
    uint8_t *held[8] = {0};
    size_t len[8] = {0};
    unsigned seed = tag * 2654435761u;
    for (int i = 0; i < ROUNDS; i++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 16) & 7);
        size_t n = 16 + ((seed >> 8) & 1023);
        if (held[k] && !holds(held[k], len[k], tag))
            return (void *)1;
        if (!held[k]) {
            held[k] = (seed & 1) ? ap_mem_alloc(n) : ap_mem_calloc(1, n);
            if (held[k] && !(seed & 1) && !holds(held[k], n, 0))
                return (void *)3; /* calloc's block not zero */
        } else if (seed & 2) {
            uint8_t *r = ap_mem_realloc(held[k], n);
            if (r)
                held[k] = r;
            else
                n = len[k];
        } else {
            ap_mem_free(held[k]);
            held[k] = NULL;
            continue;
        }
        if (!held[k])
            return (void *)2;
        len[k] = n;
        fill(held[k], n, tag);
    }
    for (int k = 0; k < 8; k++) {
        if (held[k] && !holds(held[k], len[k], tag))
            return (void *)1;
        ap_mem_free(held[k]);
    }
    return NULL;
}

Test(mem, threads_take_and_give_back_at_once)
{
    NEED_REGION();
    size_t u0 = ap_mem_in_use();
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1)), 0);
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        cr_assert_null(r, "thread %d: a block changed under it (%p)", i, r);
    }
    cr_assert_eq(ap_mem_in_use(), u0);
}
