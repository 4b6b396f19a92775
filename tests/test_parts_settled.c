/* SPDX-License-Identifier: MIT */
/*
 * A first apply keeps, for each site, the bytes it leaves there (a relocated
 * call instantiated per site: given again by its template, not stored),
 * also for a site whose memory already held them (another writer put them
 * there first: nothing written): the next apply finds every site as left
 * and settles the module without deciding. A call another writer puts at a
 * site after that is found: the module is decided again and that site
 * refused, left as found. The program has no refused site (a refusal keeps
 * a module from settling).
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
__attribute__((noinline, used)) long settled_three(void)
{
    return 3;
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
 * template known when it is decided); LATER_AT: the C site a call to
 * settled_three is put at after the second apply */
enum { N_CALLS = 9, FOREIGN_AT = 3, LATER_AT = 5 };
static const char CALLS[] = "CDCCDCCDC";

struct result {
    int rc[3];
    uint64_t written[3], refused, refused3, settled, settled3;
    uint8_t bytes[N_CALLS][5], bytes3[N_CALLS][5];
};

/* The sites' bytes, read through volatile: the compiler may take an object
 * it knows as const for unchanged across the apply's call. */
static void read_sites(uint8_t (*to)[5])
{
    for (size_t b = 0; b < (size_t)N_CALLS * 5; b++)
        to[b / 5][b % 5] = ((const volatile uint8_t *)settled_calls_begin)[b];
}

struct ctx {
    unsigned part;
    bool put_first; /* the plan's call at FOREIGN_AT before the first apply */
};

static void body(void *out, void *ctx)
{
    struct result *r = out;
    const struct ctx *c = ctx;
    ap_part_writes = c->part;
    if (c->put_first)
        ap_put_call((uintptr_t)settled_calls_begin + 5 * FOREIGN_AT, (void *)settled_two);
    struct altpatch_stats st;
    r->rc[0] = ap_apply_one(X86_FEATURE_ALWAYS, &st);
    r->written[0] = st.bytes_written;
    r->refused = st.sites_refused;
    uint64_t settled = ap_settled_found;
    r->rc[1] = ap_apply_one(X86_FEATURE_ALWAYS, &st);
    r->settled = ap_settled_found - settled;
    r->written[1] = st.bytes_written;
    read_sites(r->bytes);
    altpatch_set_print(NULL); /* the refusal is expected */
    ap_put_call((uintptr_t)settled_calls_begin + 5 * LATER_AT, (void *)settled_three);
    settled = ap_settled_found;
    r->rc[2] = ap_apply_one(X86_FEATURE_ALWAYS, &st);
    r->settled3 = ap_settled_found - settled;
    r->written[2] = st.bytes_written;
    r->refused3 = st.sites_refused;
    read_sites(r->bytes3);
}

Test(parts_settled, site_found_holding_its_plan_is_kept_as_left)
{
    if (!ap_procmem_can_write_text()) /* the calls are put there as another writer would */
        cr_skip_test(AP_PROCMEM_DENIED);
    static const unsigned parts[] = {1, 2, 4096};
    for (size_t q = 0; q < 2 * sizeof(parts) / sizeof(parts[0]); q++) {
        struct ctx c = {parts[q / 2], q % 2 == 0};
        struct result *r = ap_isolated(sizeof(*r), body, &c);
        unsigned part = c.part;
        const char *how = c.put_first ? "the plan put first" : "nothing put first";
        cr_assert_eq(r->rc[0], 0, "part of %u, %s", part, how);
        cr_assert_eq(r->rc[1], 0, "part of %u, %s", part, how);
        cr_assert_eq(r->refused, 0, "part of %u: the program has no refused site", part);
        cr_assert_geq(r->written[0], 5 * (c.put_first ? 5 : 6), "part of %u, %s", part, how);
        for (unsigned i = 0; i < N_CALLS; i++) {
            uintptr_t at = (uintptr_t)settled_calls_begin + 5 * i;
            uint8_t want[5];
            ap_call_bytes(want, at, CALLS[i] == 'C' ? (void *)settled_two : (void *)settled_one);
            cr_assert_arr_eq(r->bytes[i], want, 5, "part of %u, %s: site %u", part, how, i);
            if (i == LATER_AT)
                ap_call_bytes(want, at, (void *)settled_three);
            cr_assert_arr_eq(r->bytes3[i], want, 5, "part of %u, %s: site %u after the third",
                             part, how, i);
        }
        cr_assert_eq(r->settled, 1, "part of %u, %s: the next apply settled the module (%lu)",
                     part, how, (unsigned long)r->settled);
        cr_assert_eq(r->written[1], 0, "part of %u, %s", part, how);
        /* the third: not settled, the foreign call refused and left */
        cr_assert_eq(r->rc[2], 0, "part of %u, %s", part, how);
        cr_assert_eq(r->settled3, 0, "part of %u, %s: a foreign call taken as left", part, how);
        cr_assert_eq(r->refused3, 1, "part of %u, %s: %lu refused", part, how,
                     (unsigned long)r->refused3);
        cr_assert_eq(r->written[2], 0, "part of %u, %s", part, how);
    }
}
