/* SPDX-License-Identifier: MIT */
/*
 * A program outside the altpatch tree, built against an *installed* altpatch
 * (find_package or pkg-config; see tests/consumer/run.sh). Exit 0 when:
 *  - its own ALTERNATIVE site returns the original value before
 *    altpatch_apply() and the replacement's value after it, and memory at the
 *    site holds the replacement's bytes;
 *  - the primitives from <altpatch/primitives.h> compute the right values.
 */
#include <altpatch/altpatch.h>
#include <altpatch/alternative.h>
#include <altpatch/primitives.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const uint8_t orig_bytes[5] = {0xb8, 0x01, 0x00, 0x00, 0x00}; /* movl $1, %eax */
static const uint8_t repl_bytes[5] = {0xb8, 0x02, 0x00, 0x00, 0x00}; /* movl $2, %eax */

/* X86_FEATURE_ALWAYS is set on every CPU: apply always takes the replacement. */
__attribute__((noinline)) static int consumer_site(void)
{
    int v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %0", "movl $2, %0", X86_FEATURE_ALWAYS)
                         : "=a"(v));
    return v;
}

struct found {
    uintptr_t lo, hi;
    int hits;
    int state;
    int original_ok;
};

static int find_site(const struct altpatch_site_info *s, void *ctx)
{
    struct found *f = ctx;
    if (s->addr < f->lo || s->addr >= f->hi || s->len != sizeof orig_bytes)
        return 0;
    f->hits++;
    f->state = s->state;
    f->original_ok = memcmp(s->original, orig_bytes, sizeof orig_bytes) == 0;
    return 0;
}

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "consumer: check failed: %s (line %d)\n", #cond, __LINE__);    \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(void)
{
    CHECK(consumer_site() == 1);

    int rc = altpatch_apply();
    CHECK(rc == 0);
    CHECK(consumer_site() == 2);

    /* The site lies in consumer_site(); its first bytes are the site. */
    struct found f = {.lo = (uintptr_t)consumer_site, .hi = (uintptr_t)consumer_site + 64};
    CHECK(altpatch_site_foreach(find_site, &f) == 0);
    CHECK(f.hits == 1);
    CHECK(f.state == ALTPATCH_SITE_PATCHED);
    CHECK(f.original_ok);

    const uint8_t *p = (const uint8_t *)f.lo;
    int at = -1;
    for (int i = 0; i + (int)sizeof repl_bytes <= 64; i++)
        if (memcmp(p + i, repl_bytes, sizeof repl_bytes) == 0) {
            at = i;
            break;
        }
    CHECK(at >= 0);

    struct altpatch_stats st = {.sz = sizeof st};
    CHECK(altpatch_get_stats(&st) == 0);
    CHECK(st.sites_patched >= 1);
    CHECK(st.sites_refused == 0);

    /* Primitives still compute the right values after patching. */
    CHECK(altpatch_fs_self() == (void *)pthread_self());
    altpatch_weak_fence();

    /* A second apply is idempotent. */
    CHECK(altpatch_apply() == 0);
    CHECK(consumer_site() == 2);

    printf("consumer: altpatch %s, %llu site(s) patched, OK\n", altpatch_version(),
           (unsigned long long)st.sites_patched);
    return 0;
}
