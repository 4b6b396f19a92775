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

#include <string.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_apply_one.h"
#include "ap_call_site.h"
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

struct result {
    int rc[2];
    uint64_t written[2], refused, settled;
    uint8_t bytes[N_CALLS][5];
};

static void body(void *out, void *ctx)
{
    struct result *r = out;
    unsigned part = *(const unsigned *)ctx;
    ap_part_writes = part;
    ap_put_call((uintptr_t)settled_calls_begin + 5 * FOREIGN_AT, (void *)settled_two);
    struct altpatch_stats st;
    r->rc[0] = ap_apply_one(X86_FEATURE_ALWAYS, &st);
    r->written[0] = st.bytes_written;
    r->refused = st.sites_refused;
    uint64_t settled = ap_settled_found;
    r->rc[1] = ap_apply_one(X86_FEATURE_ALWAYS, &st);
    r->settled = ap_settled_found - settled;
    r->written[1] = st.bytes_written;
    memcpy(r->bytes, settled_calls_begin, sizeof(r->bytes));
}

Test(parts_settled, site_found_holding_its_plan_is_kept_as_left)
{
    if (!ap_procmem_can_write_text()) /* the plan's call is put there as another writer would */
        cr_skip_test(AP_PROCMEM_DENIED);
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
            ap_call_bytes(want, at, CALLS[i] == 'C' ? (void *)settled_two : (void *)settled_one);
            cr_assert_arr_eq(r->bytes[i], want, 5, "part of %u: site %u", part, i);
        }
        cr_assert_eq(r->settled, 1, "part of %u: the next apply settled the module (%lu)", part,
                     (unsigned long)r->settled);
        cr_assert_eq(r->written[1], 0, "part of %u", part);
    }
}
