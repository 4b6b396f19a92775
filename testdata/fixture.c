/* SPDX-License-Identifier: MIT */
/*
 * Fixture program, built in several variants (testdata/CMakeLists.txt:
 * -O0, -O2, -O3, -flto, gc-sections, non-PIE, -static, other compiler).
 *
 * It uses every primitive, runs them unpatched, calls altpatch_apply(), then
 * checks (1) every site of its own module holds the bytes expected for this
 * process's features (altpatch_cpu_has, so ALTPATCH_CLEARCPUID counts),
 * written out in hex in ap_expect.h, (2) the primitives' values.
 *
 * With APFIX_FEATURES=<profile> (baseline, intel-spr, amd-zen4, all, host) it
 * applies that feature set through altpatch_apply_opts() instead and checks the
 * bytes against that set; a set other than "host" may hold instructions this
 * CPU lacks, so those bytes are checked, never executed: the fixture reverts
 * the sites, checks that the originals are back and runs them again.
 *
 * When the apply used the live protocol (another thread exists: qemu-user's
 * own helper thread, for one), a site that would change may instead be
 * refused with a live reason and keep its original bytes (docs/live.md). It prints
 *   fixture <variant>: ok sites=N patched=P fence=a fs=b gs=c getcpu=d tsc=e call=f
 * and exits 0, or prints "fixture <variant>: FAIL ..." lines and exits 1.
 */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ap_expect.h"

#ifndef APFIX_VARIANT
#define APFIX_VARIANT "unknown"
#endif

#define AP_FIXTURE_NAME "fixture " APFIX_VARIANT
#include "ap_fixture_common.h"

static const struct apx_call *calls(size_t *n)
{
    static struct apx_call c[3];
    c[0] = (struct apx_call){(uintptr_t)twice, (uintptr_t)thrice, X86_FEATURE_ALWAYS};
    c[1] = (struct apx_call){(uintptr_t)plus10, (uintptr_t)plus20, ALT_NOT(X86_FEATURE_ALWAYS)};
    c[2] = (struct apx_call){(uintptr_t)minus1, (uintptr_t)minus2, X86_FEATURE_FSGSBASE};
    *n = 3;
    return c;
}

/* What run() expects of the ALTPATCH_ALT_CALL sites. */
enum calls_state { CALLS_ORIGINAL, CALLS_PATCHED, CALLS_EITHER /* live refusals possible */ };

/* Run every primitive and check its value. */
static __attribute__((noinline)) void run(void *gs_block, enum calls_state calls_st)
{
    altpatch_weak_fence();
    if (altpatch_fs_self() != (void *)pthread_self())
        fail("fs_self %p != pthread_self %p", altpatch_fs_self(), (void *)pthread_self());
    if (altpatch_gs_self() != gs_block)
        fail("gs_self %p != block %p", altpatch_gs_self(), gs_block);
    int cpu = sched_getcpu();
    unsigned got = altpatch_getcpu();
    if (cpu < 0 || got != (unsigned)cpu)
        fail("getcpu %u != sched_getcpu %d", got, cpu);
    uint64_t prev = altpatch_rdtsc_ordered();
    for (int i = 0; i < 100; i++) {
        uint64_t now = altpatch_rdtsc_ordered();
        if (now < prev)
            fail("rdtsc_ordered went backwards");
        prev = now;
    }
    long a = ALTPATCH_ALT_CALL(twice, thrice, X86_FEATURE_ALWAYS, 7);
    long b = ALTPATCH_ALT_CALL(plus10, plus20, ALT_NOT(X86_FEATURE_ALWAYS), 7);
    long c = ALTPATCH_ALT_CALL(minus1, minus2, X86_FEATURE_FSGSBASE, 7);
    bool patched = calls_st == CALLS_PATCHED;
    long want_a = patched ? 21 : 14;
    long want_c = patched && altpatch_cpu_has(X86_FEATURE_FSGSBASE) ? 5 : 6;
    if (calls_st == CALLS_EITHER) {
        want_a = a == 21 ? 21 : 14;
        want_c = c == 5 && altpatch_cpu_has(X86_FEATURE_FSGSBASE) ? 5 : 6;
    }
    if (a != want_a || b != 17 || c != want_c)
        fail("alt calls returned %ld %ld %ld, want %ld 17 %ld", a, b, c, want_a, want_c);
}

struct tally {
    unsigned sites, patched, kind[APX__COUNT];
    const struct altpatch_features *set; /* NULL: the host's (altpatch_cpu_has) */
    bool live;                           /* the apply used the live protocol */
    bool reverted;                       /* every site must hold its original */
    unsigned live_refused;               /* sites the live protocol left as they were */
};

static int check_site(const struct altpatch_site_info *s, void *ctx)
{
    struct tally *t = ctx;
    if (s->module[0] != '\0')
        return 0; /* another module: not ours */
    size_t n;
    const struct apx_call *c = calls(&n);
    uint8_t want[AP_EXPECT_MAX];
    char h1[64], h2[64];
    enum apx_kind k = t->set ? apx_expect(s, apx_has_set, (void *)t->set, c, n, want)
                             : apx_expect(s, apx_has_host, NULL, c, n, want);
    t->sites++;
    t->kind[k]++;
    if (k == APX_UNKNOWN) {
        fail("unknown site at %#lx: %s", (unsigned long)s->addr,
             apx_hex(s->original, s->len, h1, sizeof(h1)));
        return 0;
    }
    bool changes = memcmp(want, s->original, s->len) != 0;
    bool live_refused = t->live && changes && s->state == ALTPATCH_SITE_REFUSED &&
                        (s->reason == ALTPATCH_REASON_LIVE_THREAD_INSIDE ||
                         s->reason == ALTPATCH_REASON_LIVE_NO_ANSWER ||
                         s->reason == ALTPATCH_REASON_LIVE_SHORT_ENTRY ||
                         s->reason == ALTPATCH_REASON_LIVE_NO_FLIP);
    t->live_refused += live_refused;
    if (t->reverted && live_refused)
        return 0; /* revert refused: the set's bytes stay, checked before */
    if (t->reverted || live_refused)
        memcpy(want, s->original, s->len);
    else
        t->patched += changes;
    if (memcmp((const void *)s->addr, want, s->len) != 0)
        fail("%s site %#lx holds %s, want %s", apx_kind_names[k], (unsigned long)s->addr,
             apx_hex((const uint8_t *)s->addr, s->len, h1, sizeof(h1)),
             apx_hex(want, s->len, h2, sizeof(h2)));
    if (t->reverted || live_refused)
        return 0;
    if (memcmp(s->current, want, s->len) != 0)
        fail("%s site %#lx reported as %s, want %s", apx_kind_names[k], (unsigned long)s->addr,
             apx_hex(s->current, s->len, h1, sizeof(h1)), apx_hex(want, s->len, h2, sizeof(h2)));
    enum altpatch_site_state st = changes ? ALTPATCH_SITE_PATCHED : ALTPATCH_SITE_ORIGINAL;
    if (s->state != st || s->reason != 0)
        fail("%s site %#lx state %d reason %d, want state %d", apx_kind_names[k],
             (unsigned long)s->addr, s->state, s->reason, st);
    return 0;
}

static void check_sites(struct tally *t)
{
    struct altpatch_stats st = {.sz = sizeof(st)};
    if (altpatch_get_stats(&st) != 0)
        fail("altpatch_get_stats");
    t->live = st.live != 0;
    int rc = altpatch_site_foreach(check_site, t);
    if (rc != 0)
        fail("altpatch_site_foreach -> %d", rc);
}

int main(void)
{
    static void *gs_block[8];
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        fail("sched_setaffinity");
    if (altpatch_gs_install(gs_block) != 0)
        fail("altpatch_gs_install");
    const char *profile = getenv("APFIX_FEATURES");
    struct altpatch_features *fs = NULL;
    if (profile && *profile && strcmp(profile, "host") != 0) {
        fs = altpatch_features_profile(profile);
        if (!fs) {
            fail("no feature set '%s'", profile);
            return 1;
        }
    }
    run(gs_block, CALLS_ORIGINAL);
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = fs};
    int rc = fs ? altpatch_apply_opts(&o) : altpatch_apply();
    if (rc != 0) {
        fail("altpatch_apply -> %d", rc);
        return 1;
    }
    struct tally t = {.set = fs};
    check_sites(&t);
    if (!fs) /* this CPU's choice: runs here */
        run(gs_block, t.live_refused ? CALLS_EITHER : CALLS_PATCHED);
    for (int k = APX_FENCE; k < APX__COUNT; k++)
        if (t.kind[k] < (k == APX_CALL ? 3u : 1u))
            fail("only %u %s site(s) found", t.kind[k], apx_kind_names[k]);
    if (fs) {
        /* bytes for another CPU were checked above, not run: put the originals back */
        o.flags = ALTPATCH_APPLY_REVERT;
        if ((rc = altpatch_apply_opts(&o)) != 0)
            fail("revert -> %d", rc);
        struct tally back = {.set = fs, .reverted = true};
        check_sites(&back);
        if (back.live_refused) /* never run bytes chosen for another CPU */
            printf("fixture %s: %u site(s) not reverted by the live protocol: not run again\n",
                   APFIX_VARIANT, back.live_refused);
        else
            run(gs_block, CALLS_ORIGINAL);
        altpatch_features_free(fs);
    }
    printf("fixture %s: %s sites=%u patched=%u fence=%u fs=%u gs=%u getcpu=%u tsc=%u call=%u\n",
           APFIX_VARIANT, failures ? "FAIL" : "ok", t.sites, t.patched, t.kind[APX_FENCE],
           t.kind[APX_FS], t.kind[APX_GS], t.kind[APX_GETCPU], t.kind[APX_TSC], t.kind[APX_CALL]);
    return failures ? 1 : 0;
}
