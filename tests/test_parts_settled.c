/* SPDX-License-Identifier: MIT */
/*
 * A first apply keeps, for each site, the bytes it leaves there (a relocated
 * call instantiated per site), also for a site whose memory already held
 * them (another writer put them there first: nothing written): the next
 * apply finds every site as left and settles the module without deciding.
 * The program has no refused site (a refusal keeps a module from settling).
 *
 * Applying needs a single-threaded process: the body runs in a fork()ed
 * child (ap_isolate.h).
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"
#include "host.h"

__attribute__((noinline, used)) long settled_one(void)
{
    return 1;
}
__attribute__((noinline, used)) long settled_two(void)
{
    return 2;
}
/* C written under {ALWAYS}, D kept. Never run: their bytes are checked. */
#define C ALTERNATIVE("call settled_one", "call settled_two", X86_FEATURE_ALWAYS) "\n\t"
#define D ALTERNATIVE("call settled_one", "call settled_two", ALT_NOT(X86_FEATURE_ALWAYS)) "\n\t"
extern const char settled_calls_begin[];
__attribute__((noinline, used)) static void calls(void)
{
    __asm__ __volatile__(".globl settled_calls_begin\nsettled_calls_begin:\n\t" C D C C D C C D C
                         ::: "memory");
}

/* N_CALLS sites of 5 bytes; FOREIGN_AT: a C site after the first (its
 * template known when it is decided) */
enum { N_CALLS = 9, FOREIGN_AT = 3 };
static const char CALLS[] = "CDCCDCCDC";

static void call_bytes(uint8_t out[5], uintptr_t at, void *fn)
{
    int32_t rel = (int32_t)((intptr_t)fn - (intptr_t)(at + 5));
    out[0] = 0xe8;
    memcpy(out + 1, &rel, 4);
}

struct result {
    int rc[2];
    uint64_t written[2], refused, settled;
    uint8_t bytes[N_CALLS][5];
};

static void get_stats(struct altpatch_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->sz = sizeof(*st);
    if (altpatch_get_stats(st))
        abort();
}

static void body(void *out, void *ctx)
{
    struct result *r = out;
    unsigned part = *(const unsigned *)ctx;
    ap_part_writes = part;
    uintptr_t at = (uintptr_t)settled_calls_begin + 5 * FOREIGN_AT;
    uint8_t two[5];
    call_bytes(two, at, (void *)settled_two);
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    if (fd < 0 || pwrite(fd, two, 5, (off_t)at) != 5)
        _exit(5);
    close(fd);
    struct altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, X86_FEATURE_ALWAYS))
        abort();
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = f};
    struct altpatch_stats st;
    r->rc[0] = altpatch_apply_opts(&o);
    get_stats(&st);
    r->written[0] = st.bytes_written;
    r->refused = st.sites_refused;
    uint64_t settled = ap_settled_found;
    r->rc[1] = altpatch_apply_opts(&o);
    r->settled = ap_settled_found - settled;
    get_stats(&st);
    r->written[1] = st.bytes_written;
    memcpy(r->bytes, settled_calls_begin, sizeof(r->bytes));
    altpatch_features_free(f);
}

Test(parts_settled, site_found_holding_its_plan_is_kept_as_left)
{
    static const unsigned parts[] = {1, 2, 4096};
    for (size_t q = 0; q < sizeof(parts) / sizeof(parts[0]); q++) {
        struct result *r = ap_isolated(sizeof(*r), body, (void *)&parts[q]);
        unsigned part = parts[q];
        cr_assert_eq(r->rc[0], 0, "part of %u", part);
        cr_assert_eq(r->rc[1], 0, "part of %u", part);
        cr_assert_eq(r->refused, 0, "part of %u: the program has no refused site", part);
        cr_assert_geq(r->written[0], 5 * 5, "part of %u", part);
        for (unsigned i = 0; i < N_CALLS; i++) {
            uintptr_t at = (uintptr_t)settled_calls_begin + 5 * i;
            uint8_t want[5];
            call_bytes(want, at, CALLS[i] == 'C' ? (void *)settled_two : (void *)settled_one);
            cr_assert_arr_eq(r->bytes[i], want, 5, "part of %u: site %u", part, i);
        }
        cr_assert_eq(r->settled, 1, "part of %u: the next apply settled the module (%lu)", part,
                     (unsigned long)r->settled);
        cr_assert_eq(r->written[1], 0, "part of %u", part);
    }
}
