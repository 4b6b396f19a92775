/* SPDX-License-Identifier: MIT */
/*
 * The library's small blocks under valgrind: memcheck sees the region's
 * blocks (mem.c tells it of each with its client requests).
 *
 *   mem_memcheck overrun   a block of the region's size written one byte
 *                          past its end: memcheck reports the invalid write
 *   mem_memcheck leak      such a block never given back: memcheck reports
 *                          it definitely lost
 *   mem_memcheck freed     such a block read after it was given back:
 *                          memcheck reports the invalid read
 *   mem_memcheck place     such a block taken and given back (where it lies
 *                          checked, as in the modes above)
 *
 * Fails ("FAILED") where the block is not the region's (in a build that
 * uses the region): under valgrind as without it.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <valgrind/memcheck.h>

#include "util.h"

enum { SIZE = 100 };
_Static_assert(SIZE <= AP_MEM_BLOCK_MAX, "a block the region takes");

static int failed;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "mem_memcheck: FAILED: %s\n", what);
        failed = 1;
    }
}

/* A block of SIZE bytes, where it lies checked. */
static uint8_t *block(void)
{
    uint8_t *p = ap_mem_alloc(SIZE);
    check(p != NULL, "ap_mem_alloc");
    if (ap_mem_has_region())
        check(ap_mem_owns(p), "the block is not the region's");
    return p;
}

/* Nothing keeps the block's address once this returns. */
static __attribute__((noinline)) void leak(void)
{
    uint8_t *volatile p = block();
    if (p)
        memset(p, 1, SIZE);
    p = NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    fprintf(stderr, "mem_memcheck: %s, region %s\n",
            RUNNING_ON_VALGRIND ? "under valgrind" : "without valgrind",
            ap_mem_has_region() ? "on" : "off (AddressSanitizer)");
    if (strcmp(mode, "overrun") == 0) {
        uint8_t *volatile p = block();
        if (p) {
            p[SIZE] = 1; /* one byte past the end */
            ap_mem_free(p);
        }
    } else if (strcmp(mode, "leak") == 0) {
        leak();
    } else if (strcmp(mode, "freed") == 0) {
        uint8_t *volatile p = block();
        if (p) {
            p[0] = 1;
            ap_mem_free(p);
            fprintf(stderr, "mem_memcheck: read %u\n", p[0]); /* after the free */
        }
    } else if (strcmp(mode, "place") == 0) {
        ap_mem_free(block());
    } else {
        check(0, "usage: mem_memcheck overrun|leak|freed|place");
    }
    if (!failed)
        fprintf(stderr, "mem_memcheck: %s done\n", mode);
    return failed;
}
