/* SPDX-License-Identifier: MIT */
/*
 * A first decision writes its queue in parts only while no write can change
 * what a later site of the same module reads: here one site lies in a
 * section the link puts after altinstr_replacement, so the range of the
 * program's sites covers its replacements, and every write waits for the
 * one batch at the end (a part of one write would otherwise open a window
 * per write). Every site is checked, and the sites written through
 * /proc/self/mem (or refused where the kernel refuses that) are exactly those
 * whose window, a run of adjacent pages with writes, meets a page of the
 * writer's own section.
 *
 * Applying needs a single-threaded process: each body runs in a fork()ed
 * child (ap_isolate.h).
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* the writer's own section (poke.c): a window over one of its pages is
 * never opened */
extern const char __start_altpatch_poke_text[], __stop_altpatch_poke_text[];

enum { MAX_WRITTEN = 256 };

struct run {
    int rc;
    struct altpatch_stats st;
    unsigned seen, patched, denied;
    uintptr_t last;     /* the text site that writes() runs last (highest address) */
    bool last_patched;  /* it holds its replacement */
    long value;
    /* every site of the process the apply queued a write for: its bytes
     * changed, or the write was denied; ours marked */
    unsigned nwritten;
    bool overflow;
    struct {
        uintptr_t addr;
        unsigned len;
        bool ours, denied;
    } written[MAX_WRITTEN];
};

static bool is_ours(uintptr_t a)
{
    uintptr_t fn = (uintptr_t)writes;
    return (a >= fn && a < fn + 16 + 5 * N_TEXT) || a == (uintptr_t)parts_after_repl;
}

static int seen_cb(const struct altpatch_site_info *si, void *p)
{
    struct run *r = p;
    bool denied = si->state == ALTPATCH_SITE_REFUSED && si->reason == ALTPATCH_REASON_WRITE_DENIED;
    bool changed = si->state == ALTPATCH_SITE_PATCHED && si->original && si->current &&
                   memcmp(si->original, si->current, si->len) != 0;
    if (denied || changed) {
        if (r->nwritten == MAX_WRITTEN) {
            r->overflow = true;
        } else {
            r->written[r->nwritten].addr = si->addr;
            r->written[r->nwritten].len = si->len;
            r->written[r->nwritten].ours = is_ours(si->addr);
            r->written[r->nwritten].denied = denied;
            r->nwritten++;
        }
    }
    uintptr_t after = (uintptr_t)parts_after_repl;
    if (!is_ours(si->addr))
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

static int by_addr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

/*
 * The writer's windows over the written sites of @p r, as docs/architecture
 * and poke.c give them: runs of adjacent pages holding writes, in address
 * order (the text here has one protection); a window that shares a page with
 * the writer's own section is written through /proc/self/mem. Marks
 * those sites in @p self (by index into r->written) and returns how many.
 */
static unsigned self_window_sites(const struct run *r, bool *self)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), m = pg - 1;
    uintptr_t ss = (uintptr_t)__start_altpatch_poke_text & ~m;
    uintptr_t se = ((uintptr_t)__stop_altpatch_poke_text + m) & ~m;
    uintptr_t key[MAX_WRITTEN][2]; /* address, index */
    unsigned n = r->nwritten, count = 0;
    for (unsigned i = 0; i < n; i++) {
        key[i][0] = r->written[i].addr;
        key[i][1] = i;
    }
    qsort(key, n, sizeof(key[0]), by_addr);
    for (unsigned i = 0; i < n;) {
        const unsigned k0 = (unsigned)key[i][1];
        uintptr_t start = key[i][0] & ~m, end = (key[i][0] + r->written[k0].len + m) & ~m;
        unsigned j = i + 1;
        for (; j < n && key[j][0] < end + pg; j++) {
            uintptr_t e = (key[j][0] + r->written[key[j][1]].len + m) & ~m;
            if (e > end)
                end = e;
        }
        bool s = start < se && ss < end;
        for (unsigned k = i; k < j; k++) {
            self[key[k][1]] = s;
            count += s;
        }
        i = j;
    }
    return count;
}

Test(parts_apart, no_part_while_the_sites_range_covers_the_replacements)
{
    if (!((uintptr_t)writes < (uintptr_t)parts_in_repl &&
          (uintptr_t)parts_in_repl < (uintptr_t)parts_after_repl))
        cr_skip_test("the link did not put the site after the replacements (GNU ld does)");
    struct run *r = ap_isolated(sizeof(*r), body, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->seen, N_WRITES);
    cr_assert(!r->overflow, "more than %d sites written", MAX_WRITTEN);
    /* a window over a page of the writer's own code is never opened:
     * /proc/self/mem writes its sites, and where the kernel refuses that,
     * they are refused and keep their originals; every other window is
     * opened (unless every window goes through /proc/self/mem: MDWE, a
     * security module that may refuse RX again -- then none is) */
    bool self[MAX_WRITTEN] = {0};
    unsigned nself = self_window_sites(r, self);
    if (!ap_procmem_can_write_text()) {
        cr_assert_eq(r->patched + r->denied, N_WRITES, "%u patched, %u denied", r->patched,
                     r->denied);
        cr_assert_eq(r->st.sites_refused, r->denied);
        for (unsigned i = 0; i < r->nwritten; i++)
            cr_assert(r->written[i].denied == (self[i] || !r->st.mprotect_windows),
                      "site %#lx: %s, its window %s the writer's pages",
                      (unsigned long)r->written[i].addr,
                      r->written[i].denied ? "denied" : "written", self[i] ? "meets" : "misses");
    } else {
        if (r->st.mprotect_windows)
            cr_assert_eq(r->st.procmem_writes, nself,
                         "%llu writes through /proc/self/mem, %u sites in windows over the "
                         "writer's pages",
                         (unsigned long long)r->st.procmem_writes, nself);
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
