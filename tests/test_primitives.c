/* SPDX-License-Identifier: MIT */
/*
 * The <altpatch/primitives.h> sites of this test program, patched for real:
 * after apply (host features, explicit sets, profiles, ALTPATCH_CLEARCPUID)
 * the bytes in memory at every site equal the encodings written out in
 * testdata/ap_expect.h, and the primitives return the right values.
 *
 * Every body that applies runs in a fork()ed single-threaded child
 * (ap_isolate.h); the child reports through a shared block.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "ap_expect.h"
#include "ap_isolate.h"

static long impl_a(long x) { return x + 100; }
static long impl_b(long x) { return x + 200; }
static long impl_c(long x) { return x + 300; }
static long impl_d(long x) { return x + 400; }
static long impl_e(long x) { return x + 500; }
static long impl_f(long x) { return x + 600; }

static const struct apx_call the_calls[] = {
    {(uintptr_t)impl_a, (uintptr_t)impl_b, X86_FEATURE_ALWAYS},
    {(uintptr_t)impl_c, (uintptr_t)impl_d, ALT_NOT(X86_FEATURE_ALWAYS)},
    {(uintptr_t)impl_e, (uintptr_t)impl_f, X86_FEATURE_FSGSBASE},
};
#define NCALLS (sizeof(the_calls) / sizeof(the_calls[0]))

/* What a child reports. */
struct res {
    int rc;
    unsigned kinds[APX__COUNT];
    unsigned bad;
    unsigned patched_state_bad;
    char msg[1024];
    long val[8];
    int flag[8];
};

static void note(struct res *r, const char *fmt, const char *a, const char *b, const char *c)
{
    size_t len = strlen(r->msg);
    if (len + 200 < sizeof(r->msg))
        snprintf(r->msg + len, sizeof(r->msg) - len, fmt, a, b, c);
}

/* Every primitive, executed once (noinline: one copy of each site). */
static __attribute__((noinline)) void run_all(long *out)
{
    altpatch_weak_fence();
    out[0] = (long)altpatch_fs_self();
    out[1] = (long)altpatch_getcpu();
    out[2] = (long)altpatch_rdtsc_ordered();
    out[3] = ALTPATCH_ALT_CALL(impl_a, impl_b, X86_FEATURE_ALWAYS, 1);
    out[4] = ALTPATCH_ALT_CALL(impl_c, impl_d, ALT_NOT(X86_FEATURE_ALWAYS), 1);
    out[5] = ALTPATCH_ALT_CALL(impl_e, impl_f, X86_FEATURE_FSGSBASE, 1);
}

/* Separate: only call after altpatch_gs_install(). */
static __attribute__((noinline)) void *run_gs(void) { return altpatch_gs_self(); }

struct walk {
    struct res *r;
    apx_has_fn has;
    void *ctx;
};

static int check_one(const struct altpatch_site_info *s, void *p)
{
    struct walk *w = p;
    if (s->module[0] != '\0')
        return 0;
    uint8_t want[AP_EXPECT_MAX];
    char h1[64], h2[64], where[96];
    enum apx_kind k = apx_expect(s, w->has, w->ctx, the_calls, NCALLS, want);
    w->r->kinds[k]++;
    snprintf(where, sizeof(where), "%s@%#lx", apx_kind_names[k], (unsigned long)s->addr);
    if (k == APX_UNKNOWN) {
        w->r->bad++;
        note(w->r, "[%s: unknown original %s%s] ", where,
             apx_hex(s->original, s->len, h1, sizeof(h1)), "");
        return 0;
    }
    if (memcmp((const void *)s->addr, want, s->len) != 0 || memcmp(s->current, want, s->len)) {
        w->r->bad++;
        note(w->r, "[%s holds %s, want %s] ", where,
             apx_hex((const uint8_t *)s->addr, s->len, h1, sizeof(h1)),
             apx_hex(want, s->len, h2, sizeof(h2)));
    }
    bool changed = memcmp(want, s->original, s->len) != 0;
    if (s->state != (changed ? ALTPATCH_SITE_PATCHED : ALTPATCH_SITE_ORIGINAL) || s->reason)
        w->r->patched_state_bad++;
    return 0;
}

static void check_sites(struct res *r, apx_has_fn has, void *ctx)
{
    memset(r->kinds, 0, sizeof(r->kinds));
    struct walk w = {r, has, ctx};
    int rc = altpatch_site_foreach(check_one, &w);
    if (rc != 0) {
        r->bad++;
        note(r, "[site_foreach failed%s%s%s] ", "", "", "");
    }
}

struct changed {
    unsigned kinds[APX__COUNT]; /* sites per kind whose memory differs from the original */
};

static int changed_one(const struct altpatch_site_info *s, void *p)
{
    struct changed *c = p;
    uint8_t want[AP_EXPECT_MAX];
    if (s->module[0] != '\0')
        return 0;
    enum apx_kind k = apx_expect(s, apx_has_host, NULL, the_calls, NCALLS, want);
    if (memcmp((const void *)s->addr, s->original, s->len) != 0)
        c->kinds[k]++;
    return 0;
}

/* Sites of this program whose memory differs from their original, per kind. */
static struct changed count_changed(void)
{
    struct changed c = {{0}};
    altpatch_site_foreach(changed_one, &c);
    return c;
}

static unsigned changed_total(const struct changed *c)
{
    unsigned n = 0;
    for (int k = 0; k < APX__COUNT; k++)
        n += c->kinds[k];
    return n;
}

static void assert_sites(const struct res *r)
{
    cr_assert_eq(r->rc, 0, "apply returned %d", r->rc);
    cr_assert_eq(r->bad, 0, "%u site(s) wrong: %s", r->bad, r->msg);
    cr_assert_eq(r->patched_state_bad, 0, "site state/reason inconsistent with the bytes");
    cr_assert_eq(r->kinds[APX_UNKNOWN], 0);
    for (int k = APX_FENCE; k < APX__COUNT; k++)
        cr_assert_geq(r->kinds[k], k == APX_CALL ? NCALLS : 1, "%s sites: %u",
                      apx_kind_names[k], r->kinds[k]);
}

static void pin(void)
{
    int cpu = sched_getcpu();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu < 0 ? 0 : cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

/* --- host features ------------------------------------------------------- */

static void body_host(void *out, void *ctx)
{
    struct res *r = out;
    (void)ctx;
    long v[8];
    run_all(v); /* executed unpatched first */
    r->rc = altpatch_apply();
    check_sites(r, apx_has_host, NULL);
}

Test(primitives, host_bytes)
{
    struct res *r = ap_isolated(sizeof(*r), body_host, NULL);
    assert_sites(r);
}

static void body_values(void *out, void *ctx)
{
    struct res *r = out;
    static void *block[4];
    (void)ctx;
    pin();
    long before[8], after[8];
    int gsrc = altpatch_gs_install(block);
    r->flag[0] = gsrc == 0;
    r->flag[1] = gsrc == 0 && run_gs() == (void *)block && block[0] == (void *)block;
    run_all(before);
    r->rc = altpatch_apply();
    run_all(after);
    r->flag[2] = gsrc == 0 && run_gs() == (void *)block;
    r->flag[3] = before[0] == (long)pthread_self() && after[0] == (long)pthread_self();
    int cpu = sched_getcpu();
    r->flag[4] = before[1] == cpu && after[1] == cpu;
    uint64_t prev = altpatch_rdtsc_ordered();
    bool mono = (uint64_t)after[2] >= (uint64_t)before[2];
    for (int i = 0; i < 1000; i++) {
        uint64_t now = altpatch_rdtsc_ordered();
        mono = mono && now >= prev;
        prev = now;
    }
    r->flag[5] = mono;
    r->val[0] = before[3], r->val[1] = after[3];
    r->val[2] = before[4], r->val[3] = after[4];
    r->val[4] = before[5], r->val[5] = after[5];
    r->flag[6] = altpatch_cpu_has(X86_FEATURE_FSGSBASE);
}

Test(primitives, values)
{
    struct res *r = ap_isolated(sizeof(*r), body_values, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert(r->flag[0], "altpatch_gs_install failed");
    cr_assert(r->flag[1], "gs_self != installed block before apply");
    cr_assert(r->flag[2], "gs_self != installed block after apply");
    cr_assert(r->flag[3], "fs_self != pthread_self()");
    cr_assert(r->flag[4], "getcpu != sched_getcpu() on a pinned thread");
    cr_assert(r->flag[5], "rdtsc_ordered went backwards");
    cr_assert_eq(r->val[0], 101, "ALWAYS call before apply");
    cr_assert_eq(r->val[1], 201, "ALWAYS call after apply must reach impl_b");
    cr_assert_eq(r->val[2], 301);
    cr_assert_eq(r->val[3], 301, "ALT_NOT(ALWAYS) call must never switch");
    cr_assert_eq(r->val[4], 501);
    cr_assert_eq(r->val[5], r->flag[6] ? 601 : 501, "FSGSBASE call");
}

/*
 * altpatch_getcpu() == sched_getcpu() pinned to each CPU this process may run
 * on, with the original (sched_getcpu() itself) and after apply (rdpid where
 * the host set claims RDPID). val[0]: CPUs visited; val[1]/val[2]: mismatches
 * before/after; val[3]: the first wrong value seen.
 */
static int getcpu_round(void)
{
    int wrong = 0;
    for (int i = 0; i < 8; i++) {
        int want = sched_getcpu();
        unsigned got = altpatch_getcpu();
        if (want < 0 || got != (unsigned)want)
            wrong++;
    }
    return wrong;
}

static void body_getcpu_every_cpu(void *out, void *ctx)
{
    struct res *r = out;
    (void)ctx;
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof(all), &all) != 0) {
        r->rc = -1;
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            r->rc = altpatch_apply();
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
            if (!CPU_ISSET(cpu, &all))
                continue;
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            if (sched_setaffinity(0, sizeof(one), &one) != 0)
                continue; /* offline meanwhile */
            r->val[0] += pass == 0;
            int wrong = getcpu_round();
            r->val[1 + pass] += wrong;
            if (wrong && !r->flag[0]) {
                r->flag[0] = 1;
                r->val[3] = (long)altpatch_getcpu();
                r->val[4] = cpu;
            }
        }
    }
    sched_setaffinity(0, sizeof(all), &all);
}

Test(primitives, getcpu_on_every_cpu)
{
    struct res *r = ap_isolated(sizeof(*r), body_getcpu_every_cpu, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_gt(r->val[0], 0, "no CPU visited");
    cr_assert_eq(r->val[1], 0, "original: %ld wrong (getcpu %ld pinned to CPU %ld)", r->val[1],
                 r->val[3], r->val[4]);
    cr_assert_eq(r->val[2], 0, "after apply: %ld wrong (getcpu %ld pinned to CPU %ld)", r->val[2],
                 r->val[3], r->val[4]);
}

/* GS is per thread: a second thread's block does not change ours. */
static void *gs_thread(void *arg)
{
    void **block = arg;
    if (altpatch_gs_install(block) != 0)
        return NULL;
    return run_gs();
}

static void body_gs_threads(void *out, void *ctx)
{
    struct res *r = out;
    static void *mine[4], *theirs[4];
    (void)ctx;
    r->rc = altpatch_apply(); /* single-threaded here; threads come after */
    r->flag[0] = altpatch_gs_install(mine) == 0;
    pthread_t t;
    void *seen = NULL;
    r->flag[1] = pthread_create(&t, NULL, gs_thread, theirs) == 0 && pthread_join(t, &seen) == 0;
    r->flag[2] = seen == (void *)theirs;
    r->flag[3] = run_gs() == (void *)mine;
}

Test(primitives, gs_block_per_thread)
{
    struct res *r = ap_isolated(sizeof(*r), body_gs_threads, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert(r->flag[0] && r->flag[1]);
    cr_assert(r->flag[2], "the thread's gs_self is not its own block");
    cr_assert(r->flag[3], "our gs_self changed when another thread installed its block");
}

Test(primitives, gs_install_null)
{
    cr_assert_eq(altpatch_gs_install(NULL), -EINVAL);
}

/* --- explicit feature sets ---------------------------------------------- */

struct setspec {
    const char *profile; /* NULL: build from ids */
    unsigned ids[8];
    unsigned nids;
};

static struct altpatch_features *make_set(const struct setspec *sp)
{
    if (sp->profile)
        return altpatch_features_profile(sp->profile);
    struct altpatch_features *f = altpatch_features_new();
    for (unsigned i = 0; f && i < sp->nids; i++)
        if (altpatch_features_set(f, sp->ids[i]) != 0)
            return NULL;
    return f;
}

static void body_set(void *out, void *ctx)
{
    struct res *r = out;
    struct altpatch_features *f = make_set(ctx);
    if (!f) {
        r->rc = -999;
        return;
    }
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = f};
    r->rc = altpatch_apply_opts(&o);
    check_sites(r, apx_has_set, f);
    /* The set decides, not the host: remember a few decisions to assert. */
    r->flag[0] = altpatch_features_has(f, X86_FEATURE_FSGSBASE);
    r->flag[1] = altpatch_features_has(f, X86_FEATURE_APIC_MSRS_FENCE);
    altpatch_features_free(f);
}

Test(primitives, empty_set)
{
    struct setspec sp = {0};
    struct res *r = ap_isolated(sizeof(*r), body_set, &sp);
    assert_sites(r);
    cr_assert(!r->flag[0] && !r->flag[1]);
}

Test(primitives, fsgsbase_lfence_fence_set)
{
    struct setspec sp = {NULL,
                         {X86_FEATURE_FSGSBASE, X86_FEATURE_LFENCE_RDTSC,
                          X86_FEATURE_APIC_MSRS_FENCE, X86_FEATURE_ALWAYS},
                         4};
    struct res *r = ap_isolated(sizeof(*r), body_set, &sp);
    assert_sites(r);
    cr_assert(r->flag[0] && r->flag[1]);
}

Test(primitives, rdpid_rdtscp_set)
{
    struct setspec sp = {NULL, {X86_FEATURE_RDPID, X86_FEATURE_RDTSCP, X86_FEATURE_LFENCE_RDTSC}, 3};
    struct res *r = ap_isolated(sizeof(*r), body_set, &sp);
    assert_sites(r);
}

/* Every profile in turn in one process (re-planning from patched bytes), then revert. */
static void body_profiles(void *out, void *ctx)
{
    struct res *r = out;
    (void)ctx;
    const char *const *names = altpatch_features_profiles();
    unsigned n = 0;
    for (; names && names[n]; n++) {
        struct altpatch_features *f = altpatch_features_profile(names[n]);
        if (!f) {
            r->bad++;
            note(r, "[profile %s missing%s%s] ", names[n], "", "");
            continue;
        }
        struct altpatch_apply_opts o = {.sz = sizeof(o), .features = f};
        int rc = altpatch_apply_opts(&o);
        if (rc)
            r->rc = rc;
        check_sites(r, apx_has_set, f);
        if (r->bad)
            note(r, "(after profile %s%s%s) ", names[n], "", "");
        altpatch_features_free(f);
    }
    r->val[0] = n;
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_REVERT};
    r->val[1] = altpatch_apply_opts(&o);
    struct changed c = count_changed();
    r->val[2] = changed_total(&c);
}

Test(primitives, every_profile_then_revert)
{
    struct res *r = ap_isolated(sizeof(*r), body_profiles, NULL);
    assert_sites(r);
    cr_assert_geq(r->val[0], 5, "profiles: host baseline amd-zen4 intel-spr all");
    cr_assert_eq(r->val[1], 0, "revert returned %ld", r->val[1]);
    cr_assert_eq(r->val[2], 0, "after revert, %ld site(s) differ from their original", r->val[2]);
}

/* Dry run: every decision is made, nothing is written. */
static void body_dry(void *out, void *ctx)
{
    struct res *r = out;
    (void)ctx;
    struct altpatch_features *all = altpatch_features_profile("all");
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = all,
                                    .flags = ALTPATCH_APPLY_DRY_RUN};
    r->rc = altpatch_apply_opts(&o);
    struct changed c = count_changed();
    r->val[0] = changed_total(&c);
    struct altpatch_stats st = {.sz = sizeof(st)};
    r->val[1] = altpatch_get_stats(&st);
    r->val[2] = (long)st.bytes_written;
    r->val[3] = (long)st.sites_seen;
    altpatch_features_free(all);
}

Test(primitives, dry_run_writes_nothing)
{
    struct res *r = ap_isolated(sizeof(*r), body_dry, NULL);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->val[0], 0, "%ld site(s) changed by a dry run", r->val[0]);
    cr_assert_eq(r->val[1], 0);
    cr_assert_eq(r->val[2], 0, "dry run reports %ld bytes written", r->val[2]);
    cr_assert_geq(r->val[3], (long)(5 + NCALLS), "dry run saw %ld sites", r->val[3]);
}

/* --- ALTPATCH_CLEARCPUID ---------------------------------------------------- */

static void body_clear(void *out, void *ctx)
{
    struct res *r = out;
    (void)ctx;
    setenv("ALTPATCH_CLEARCPUID", "fsgsbase,rdpid,rdtscp", 1);
    r->flag[0] = altpatch_cpu_has(X86_FEATURE_FSGSBASE);
    r->flag[1] = altpatch_cpu_has(X86_FEATURE_RDPID);
    r->flag[2] = altpatch_cpu_has(X86_FEATURE_RDTSCP);
    long v[8];
    r->rc = altpatch_apply();
    run_all(v);
    r->flag[3] = v[0] == (long)pthread_self();
    r->val[0] = v[5];
    check_sites(r, apx_has_host, NULL);
    /* Independently of altpatch_cpu_has: these must be original. */
    struct changed c = count_changed();
    r->val[1] = c.kinds[APX_FS] + c.kinds[APX_GS] + c.kinds[APX_GETCPU];
}

Test(primitives, clearcpuid_env)
{
    struct res *r = ap_isolated(sizeof(*r), body_clear, NULL);
    cr_assert(!r->flag[0] && !r->flag[1] && !r->flag[2],
              "ALTPATCH_CLEARCPUID did not clear fsgsbase/rdpid/rdtscp");
    assert_sites(r);
    cr_assert(r->flag[3], "fs_self != pthread_self()");
    cr_assert_eq(r->val[0], 501, "FSGSBASE call must stay original");
    cr_assert_eq(r->val[1], 0, "%ld fs/gs/getcpu site(s) patched despite ALTPATCH_CLEARCPUID",
                 r->val[1]);
}

/* --- valgrind --------------------------------------------------------------- */

static void body_valgrind(void *out, void *ctx)
{
    struct res *r = out;
    (void)ctx;
    r->flag[0] = altpatch_cpu_has(X86_FEATURE_FSGSBASE);
    r->rc = altpatch_apply();
    long v[8];
    run_all(v);
    r->flag[1] = v[0] == (long)pthread_self();
    struct changed c = count_changed();
    r->val[0] = c.kinds[APX_FS] + c.kinds[APX_GS];
    check_sites(r, apx_has_host, NULL);
}

/* Under valgrind (ALTPATCH_TEST_VALGRIND=1, set by the valgrind ctest entry)
 * FSGSBASE is hidden: rdfsbase/rdgsbase must not be chosen. */
Test(primitives, valgrind_hides_fsgsbase)
{
    if (!getenv("ALTPATCH_TEST_VALGRIND"))
        cr_skip_test("not running under valgrind (ctest valgrind_test_primitives runs it)");
    struct res *r = ap_isolated(sizeof(*r), body_valgrind, NULL);
    cr_assert(!r->flag[0], "valgrind hides FSGSBASE, but altpatch_cpu_has says it is usable");
    assert_sites(r); /* host plan: fs/gs originals */
    cr_assert(r->flag[1], "fs_self != pthread_self()");
    cr_assert_eq(r->val[0], 0, "%ld fs/gs site(s) hold rdfsbase/rdgsbase under valgrind", r->val[0]);
}
