/* SPDX-License-Identifier: MIT */
/*
 * A program outside the altpatch tree, built against an *installed* altpatch
 * (find_package or pkg-config; see tests/consumer/run.sh). Exit 0 when:
 *  - its own ALTERNATIVE site returns the original value before
 *    altpatch_apply() and the replacement's value after it, and memory at the
 *    site holds the replacement's bytes;
 *  - the primitives from <altpatch/primitives.h> compute the right values;
 *  - the image API (<altpatch/image.h>) finds the same site in the program's
 *    file and plans the replacement for it, and a pre-patched copy written to
 *    memory opens as format version 2.
 */
#include <altpatch/altpatch.h>
#include <altpatch/alternative.h>
#include <altpatch/image.h>
#include <altpatch/primitives.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

struct file_site {
    int hits;
    int final_ok;
};

static int find_file_site(const struct altpatch_image_site *s, void *ctx)
{
    struct file_site *f = ctx;
    if (s->len != sizeof orig_bytes || !s->original ||
        memcmp(s->original, orig_bytes, sizeof orig_bytes) != 0)
        return 0;
    f->hits++;
    f->final_ok = s->final && memcmp(s->final, repl_bytes, sizeof repl_bytes) == 0;
    return 0;
}

/* The image API on this program's own file. */
static int check_image(void)
{
    struct altpatch_image *img;
    CHECK(altpatch_image_open("/proc/self/exe", NULL, &img) == 0);
    struct altpatch_features *fs = altpatch_features_profile("baseline");
    CHECK(fs != NULL);
    CHECK(altpatch_image_plan(img, fs) == 0);
    struct file_site f = {0, 0};
    CHECK(altpatch_image_site_foreach(img, find_file_site, &f) == 0);
    CHECK(f.hits >= 1);
    CHECK(f.final_ok);
    struct altpatch_image_write_opts wo = {.sz = sizeof wo, .profile = "baseline"};
    void *buf;
    size_t len;
    CHECK(altpatch_image_write_mem(img, &wo, &buf, &len) == 0);
    altpatch_image_close(img);
    CHECK(altpatch_image_open_mem(buf, len, NULL, &img) == 0);
    struct altpatch_image_info info = {.sz = sizeof info};
    CHECK(altpatch_image_get_info(img, &info) == 0);
    /* this program's format (ALTPATCH_FORMAT_VERSION), pre-patched: 2 for 1, 4 for 3 */
    CHECK(info.format_version == (ALTPATCH_FORMAT_VERSION == ALTPATCH_FORMAT_COMPACT ? 4u : 2u));
    CHECK(info.prepatched_profile && strcmp(info.prepatched_profile, "baseline") == 0);
    altpatch_image_close(img);
    free(buf);
    altpatch_features_free(fs);
    return 0;
}

int main(void)
{
    CHECK(check_image() == 0);
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
