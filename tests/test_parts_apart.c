/* SPDX-License-Identifier: MIT */
/*
 * A first decision writes its queue in parts only while no write can change
 * what a later site of the same module reads: here one site lies in a
 * section the link puts after altinstr_replacement, so the range of the
 * program's sites covers its replacements, and every write waits for the
 * one batch at the end (a part of one write would otherwise open a window
 * per write). Every site is checked.
 *
 * Applying needs a single-threaded process: each body runs in a fork()ed
 * child (ap_isolate.h).
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <string.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_apply_one.h"
#include "ap_isolate.h"
#include "ap_procmem.h"
#include "host.h"

/* W: a write under the set below (ALWAYS). */
#define W ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", X86_FEATURE_ALWAYS) "\n\t"
#define W4 W W W W

enum { N_TEXT = 24, N_WRITES = N_TEXT + 1 };

extern const char parts_after_repl[], parts_in_repl[];

/* a label at the start of this file's replacements */
__asm__(".pushsection altinstr_replacement,\"axR\"\n" /* the flags the macro gives it */
        "parts_in_repl:\n\t"
        ".popsection\n\t");

__attribute__((noinline)) static long writes(void)
{
    long v;
    __asm__ __volatile__(W4 W4 W4 W4 W4 W4
                         /* a site in an executable section placed after it
                          * (GNU ld puts orphan sections in the order met);
                          * never run */
                         ".pushsection altpatch_test_after_repl, \"ax\", @progbits\n"
                         "parts_after_repl:\n\t" W ".popsection\n\t"
                         : "=a"(v));
    return v;
}

struct run {
    int rc;
    struct altpatch_stats st;
    unsigned seen, patched, denied;
    uintptr_t last;     /* the text site that writes() runs last (highest address) */
    bool last_patched;  /* it holds its replacement */
    long value;
};

static int seen_cb(const struct altpatch_site_info *si, void *p)
{
    struct run *r = p;
    uintptr_t fn = (uintptr_t)writes, after = (uintptr_t)parts_after_repl;
    if (!(si->addr >= fn && si->addr < fn + 16 + 5 * N_TEXT) && si->addr != after)
        return 0;
    r->seen++;
    if (si->state == ALTPATCH_SITE_PATCHED && si->len == 5 && si->current &&
        !memcmp(si->current, "\xb8\x02\x00\x00\x00", 5))
        r->patched++;
    if (si->state == ALTPATCH_SITE_REFUSED && si->reason == ALTPATCH_REASON_WRITE_DENIED &&
        si->current && !memcmp(si->current, "\xb8\x01\x00\x00\x00", 5))
        r->denied++;
    if (si->addr != after && si->addr >= r->last) {
        r->last = si->addr;
        r->last_patched = si->state == ALTPATCH_SITE_PATCHED;
    }
    return 0;
}

static void body(void *out, void *ctx)
{
    (void)ctx;
    struct run *r = out;
    ap_part_writes = 1;
    r->rc = ap_apply_one(X86_FEATURE_ALWAYS, &r->st);
    altpatch_site_foreach(seen_cb, r);
    r->value = writes();
}

Test(parts_apart, no_part_while_the_sites_range_covers_the_replacements)
{
    if (!((uintptr_t)writes < (uintptr_t)parts_in_repl &&
          (uintptr_t)parts_in_repl < (uintptr_t)parts_after_repl))
        cr_skip_test("the link did not put the site after the replacements (GNU ld does)");
    struct run *r = ap_isolated(sizeof(*r), body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->seen, N_WRITES);
    if (!ap_procmem_can_write_text()) {
        /* a window over a page of the writer's own code is never opened:
         * /proc/self/mem writes such a site, and where the kernel refuses
         * that, the site is refused and keeps its original */
        cr_assert_eq(r->patched + r->denied, N_WRITES, "%u patched, %u denied", r->patched,
                     r->denied);
        cr_assert_eq(r->st.sites_refused, r->denied);
    } else {
        cr_assert_eq(r->patched, N_WRITES, "every site holds its replacement");
        cr_assert_eq(r->st.sites_refused, 0);
    }
    /* what writes() returns is its last site's value: 2 where that holds
     * its replacement */
    cr_assert_eq(r->value, r->last_patched ? 2 : 1, "last site %s",
                 r->last_patched ? "patched" : "original");
    /* one batch: a window per run of pages (the text's one or two, the
     * section's), not one per write; a writer that goes through
     * /proc/self/mem for every write shows nothing of the parts */
    if (!r->st.mprotect_windows)
        cr_skip_test("every write went through /proc/self/mem (%llu)",
                     (unsigned long long)r->st.procmem_writes);
    cr_assert_leq(r->st.mprotect_windows + r->st.procmem_writes, 4,
                  "%llu windows, %llu /proc/self/mem writes: written in parts",
                  (unsigned long long)r->st.mprotect_windows,
                  (unsigned long long)r->st.procmem_writes);
}
