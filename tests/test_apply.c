/* SPDX-License-Identifier: MIT */
/*
 * altpatch_apply_opts() on sites written in this file: bytes in memory under
 * explicit feature sets, idempotence, REVERT, DRY_RUN, stats, site_foreach,
 * the print callback, the environment (ALTPATCH_OFF, ALTPATCH_CLEARCPUID,
 * ALTPATCH_DEBUG), bad options and the threads policy.
 *
 * Applying needs a single-threaded process and Criterion's test process has
 * two threads: every test that writes runs its body in a fork()ed child
 * (ap_isolate.h) and asserts on what the child reports.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_copyfile.h"
#include "ap_exec_segs.h"
#include "ap_isolate.h"
#include "ap_mdwe.h"
#include "ap_procmem.h"
#include "apply.h"
#include "host.h"

/* ---- the sites ------------------------------------------------------------
 * Each function's body is its site, first thing after any prologue; the site
 * is found through altpatch_site_foreach() as the first one at or after the
 * function's address. Fixed registers make the bytes exact. */

#define F_A X86_FEATURE_POPCNT
#define F_B X86_FEATURE_AVX512F

/* 5-byte original and replacement, ALWAYS: patched under every set. */
__attribute__((noinline)) static long site_always(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", X86_FEATURE_ALWAYS)
                         : "=a"(v));
    return v;
}

/* site_always again: decided with its shape's template (no planner) in an
 * apply that met site_always first. */
__attribute__((noinline)) static long site_always_twin(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", X86_FEATURE_ALWAYS)
                         : "=a"(v));
    return v;
}

/* 2-byte original (padded to 3 with 0x90), 3-byte replacement. */
__attribute__((noinline)) static long site_two(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("xorl %%eax, %%eax", "orl $-1, %%eax", F_A) : "=a"(v));
    return v;
}

/* Replacement taken when F_A is absent. */
__attribute__((noinline)) static long site_not(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", ALT_NOT(F_A))
                         : "=a"(v));
    return v;
}

/* Nested: 2 under F_A, 3 under F_B (the later entry wins). */
__attribute__((noinline)) static long site_nest(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE_2("movl $1, %%eax", "movl $2, %%eax", F_A,
                                       "movl $3, %%eax", F_B)
                         : "=a"(v));
    return v;
}

enum { S_ALWAYS, S_TWO, S_NOT, S_NEST, S_TWIN, S_COUNT };
static long (*const site_fn[S_COUNT])(void) = {site_always, site_two, site_not, site_nest,
                                               site_always_twin};

static const uint8_t MOV1[5] = {0xb8, 1, 0, 0, 0};
static const uint8_t MOV2[5] = {0xb8, 2, 0, 0, 0};
static const uint8_t MOV3[5] = {0xb8, 3, 0, 0, 0};
static const uint8_t XOR_PAD[3] = {0x31, 0xc0, 0x90};
static const uint8_t OR_M1[3] = {0x83, 0xc8, 0xff};

/* ---- what a child reports ------------------------------------------------ */

struct site_view {
    bool found;
    uintptr_t addr;
    unsigned len, entries, feature, flags;
    int chosen, state, reason;
    uint8_t original[16], current[16];
    char module[64];
};

struct snapshot {
    struct site_view s[S_COUNT];
    long value[S_COUNT];   /* what calling each function returns */
    unsigned nsites;       /* sites listed by altpatch_site_foreach */
    unsigned npatched;     /* of them, state PATCHED */
    uint64_t changed_bytes; /* sum of len where current != original */
    int foreach_rc;
};

struct find_ctx {
    struct snapshot *snap;
};

static int collect_cb(const struct altpatch_site_info *si, void *ctx)
{
    struct snapshot *sn = ((struct find_ctx *)ctx)->snap;
    sn->nsites++;
    sn->npatched += si->state == ALTPATCH_SITE_PATCHED;
    if (si->original && si->current && memcmp(si->original, si->current, si->len) != 0)
        sn->changed_bytes += si->len;
    for (int k = 0; k < S_COUNT; k++) {
        uintptr_t fn = (uintptr_t)site_fn[k];
        struct site_view *v = &sn->s[k];
        if (si->addr < fn || si->addr >= fn + 32 || (v->found && si->addr > v->addr))
            continue;
        *v = (struct site_view){.found = true, .addr = si->addr, .len = si->len,
                                .entries = si->entries, .feature = si->feature,
                                .flags = si->flags, .chosen = si->chosen,
                                .state = si->state, .reason = si->reason};
        if (si->original)
            memcpy(v->original, si->original, si->len < 16 ? si->len : 16);
        if (si->current)
            memcpy(v->current, si->current, si->len < 16 ? si->len : 16);
        snprintf(v->module, sizeof(v->module), "%s", si->module);
    }
    return 0;
}

static void snap(struct snapshot *sn)
{
    memset(sn, 0, sizeof(*sn));
    struct find_ctx c = {sn};
    sn->foreach_rc = altpatch_site_foreach(collect_cb, &c);
    for (int k = 0; k < S_COUNT; k++)
        sn->value[k] = site_fn[k]();
}

/** A feature set holding ALWAYS (as any CPU's set) and the listed ids (ended by -1). */
static struct altpatch_features *fset(int first, ...)
{
    struct altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, X86_FEATURE_ALWAYS))
        abort();
    va_list ap;
    va_start(ap, first);
    for (int id = first; id >= 0; id = va_arg(ap, int))
        if (altpatch_features_set(f, (unsigned)id))
            abort();
    va_end(ap);
    return f;
}

static int apply_with(const struct altpatch_features *f, unsigned flags)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = f, .flags = flags};
    return altpatch_apply_opts(&o);
}

static void get_stats(struct altpatch_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->sz = sizeof(*st);
    if (altpatch_get_stats(st))
        abort();
}

static void assert_site(const struct site_view *v, const uint8_t *orig, const uint8_t *cur,
                        unsigned len, const char *what)
{
    cr_assert(v->found, "%s: site not listed by altpatch_site_foreach", what);
    cr_assert_eq(v->len, len, "%s: len %u", what, v->len);
    cr_assert_arr_eq(v->original, orig, len, "%s: original bytes", what);
    cr_assert_arr_eq(v->current, cur, len, "%s: bytes in memory", what);
}

/* ---- apply under explicit feature sets ------------------------------------ */

struct set_result {
    int rc;
    struct snapshot sn;
    struct altpatch_stats st;
};

struct set_ctx {
    int ids[4];
    unsigned flags;
};

static void set_body(void *out, void *ctx)
{
    struct set_result *r = out;
    struct set_ctx *c = ctx;
    struct altpatch_features *f = fset(c->ids[0], c->ids[1], c->ids[2], c->ids[3]);
    r->rc = apply_with(f, c->flags);
    altpatch_features_free(f);
    get_stats(&r->st);
    snap(&r->sn);
}

static struct set_result *apply_set(int a, int b)
{
    struct set_ctx c = {{a, b, -1, -1}, 0};
    struct set_result *r = ap_isolated(sizeof(*r), set_body, &c);
    cr_assert_eq(r->rc, 0, "apply: %d", r->rc);
    cr_assert_eq(r->sn.foreach_rc, 0);
    return r;
}

Test(apply, empty_set)
{
    struct set_result *r = apply_set(-1, -1);
    const struct snapshot *sn = &r->sn;
    assert_site(&sn->s[S_ALWAYS], MOV1, MOV2, 5, "ALWAYS");
    assert_site(&sn->s[S_TWO], XOR_PAD, XOR_PAD, 3, "2 vs 3 bytes, feature absent");
    assert_site(&sn->s[S_NOT], MOV1, MOV2, 5, "ALT_NOT, feature absent");
    assert_site(&sn->s[S_NEST], MOV1, MOV1, 5, "nested, none");
    cr_assert_eq(sn->value[S_ALWAYS], 2);
    cr_assert_eq(sn->value[S_TWO], 0);
    cr_assert_eq(sn->value[S_NOT], 2);
    cr_assert_eq(sn->value[S_NEST], 1);
}

Test(apply, feature_a)
{
    struct set_result *r = apply_set(F_A, -1);
    const struct snapshot *sn = &r->sn;
    assert_site(&sn->s[S_TWO], XOR_PAD, OR_M1, 3, "2 vs 3 bytes, feature present");
    assert_site(&sn->s[S_NOT], MOV1, MOV1, 5, "ALT_NOT, feature present");
    assert_site(&sn->s[S_NEST], MOV1, MOV2, 5, "nested, first");
    cr_assert_eq(sn->value[S_TWO], 0xffffffffL);
    cr_assert_eq(sn->value[S_NOT], 1);
    cr_assert_eq(sn->value[S_NEST], 2);
}

Test(apply, nested_last_eligible_wins)
{
    struct set_result *r = apply_set(F_B, -1);
    assert_site(&r->sn.s[S_NEST], MOV1, MOV3, 5, "nested, second only");
    cr_assert_eq(r->sn.value[S_NEST], 3);
    r = apply_set(F_A, F_B);
    assert_site(&r->sn.s[S_NEST], MOV1, MOV3, 5, "nested, both");
    cr_assert_eq(r->sn.value[S_NEST], 3);
    cr_assert_eq(r->sn.s[S_NEST].chosen, 1);
    cr_assert_eq(r->sn.s[S_NEST].feature, F_B);
}

Test(apply, site_foreach_contents)
{
    struct set_result *r = apply_set(F_A, F_B);
    const struct snapshot *sn = &r->sn;
    const struct site_view *n = &sn->s[S_NEST], *o = &sn->s[S_NOT], *t = &sn->s[S_TWO];
    cr_assert_str_eq(n->module, "", "sites of the executable: module \"\"");
    cr_assert_eq(n->entries, 2);
    cr_assert_eq(n->state, ALTPATCH_SITE_PATCHED);
    cr_assert_eq(n->reason, ALTPATCH_REASON_NONE);
    cr_assert_eq(o->entries, 1);
    cr_assert_eq(o->chosen, -1);
    cr_assert_eq(o->state, ALTPATCH_SITE_ORIGINAL);
    cr_assert_eq(o->feature, F_A);
    cr_assert(o->flags & ALT_FLAG_NOT, "flags of an ALT_NOT entry: 0x%x", o->flags);
    cr_assert_eq(t->chosen, 0);
    cr_assert_eq(t->feature, F_A);
    cr_assert_eq(t->flags, 0);
    cr_assert_eq(t->state, ALTPATCH_SITE_PATCHED);
    cr_assert_geq(sn->nsites, S_COUNT);
}

Test(apply, stats_of_first_apply)
{
    struct set_result *r = apply_set(F_A, -1);
    const struct altpatch_stats *st = &r->st;
    cr_assert_eq(st->sz, sizeof(*st));
    cr_assert_geq(st->modules, 1);
    cr_assert_eq(st->sites_seen, r->sn.nsites);
    cr_assert_eq(st->sites_patched, r->sn.npatched);
    cr_assert_eq(st->bytes_written, r->sn.changed_bytes, "bytes %lu vs changed %lu",
                 (unsigned long)st->bytes_written, (unsigned long)r->sn.changed_bytes);
    cr_assert_geq(st->bytes_written, 5 + 3 + 5, "at least ALWAYS, TWO and NEST changed");
    cr_assert_geq(st->pages_written, 1);
    cr_assert_geq(st->syscalls, 5, "maps open/read/close and two mprotect at least");
    cr_assert_gt(st->ns, 0);
    cr_assert_lt(st->sites_unchanged, st->sites_seen);
}

/* ---- idempotence, revert, dry run ----------------------------------------- */

struct seq_result {
    int rc[3];
    struct altpatch_stats st[3];
    struct snapshot sn[3];
};

struct seq_ctx {
    unsigned flags[3];
};

static void seq_body(void *out, void *ctx)
{
    struct seq_result *r = out;
    struct seq_ctx *c = ctx;
    struct altpatch_features *f = fset(F_A, -1);
    for (int i = 0; i < 3; i++) {
        r->rc[i] = apply_with(f, c->flags[i]);
        get_stats(&r->st[i]);
        snap(&r->sn[i]);
    }
    altpatch_features_free(f);
}

static struct seq_result *apply_seq(unsigned f0, unsigned f1, unsigned f2)
{
    struct seq_ctx c = {{f0, f1, f2}};
    struct seq_result *r = ap_isolated(sizeof(*r), seq_body, &c);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(r->rc[i], 0, "apply #%d: %d", i, r->rc[i]);
    return r;
}

Test(apply, idempotent)
{
    struct seq_result *r = apply_seq(0, 0, 0);
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(r->st[i].bytes_written, 0, "apply #%d wrote", i);
        cr_assert_eq(r->st[i].pages_written, 0);
        cr_assert_eq(r->st[i].syscalls, 0, "nothing to write: no syscall");
        cr_assert_eq(r->st[i].sites_unchanged, r->st[i].sites_seen);
        cr_assert_eq(r->st[i].sites_patched, r->st[0].sites_patched);
    }
    assert_site(&r->sn[2].s[S_TWO], XOR_PAD, OR_M1, 3, "after three applies");
}

Test(apply, revert_restores_originals)
{
    struct seq_result *r = apply_seq(0, ALTPATCH_APPLY_REVERT, 0);
    const struct snapshot *sn = &r->sn[1];
    assert_site(&sn->s[S_ALWAYS], MOV1, MOV1, 5, "reverted ALWAYS");
    assert_site(&sn->s[S_TWO], XOR_PAD, XOR_PAD, 3, "reverted TWO");
    assert_site(&sn->s[S_NEST], MOV1, MOV1, 5, "reverted NEST");
    for (int k = 0; k < S_COUNT; k++) {
        cr_assert_eq(sn->s[k].state, ALTPATCH_SITE_ORIGINAL);
        cr_assert_eq(sn->s[k].chosen, -1);
    }
    cr_assert_eq(sn->value[S_ALWAYS], 1);
    cr_assert_eq(sn->value[S_TWO], 0);
    cr_assert_eq(r->st[1].sites_patched, 0);
    cr_assert_eq(r->st[1].bytes_written, r->st[0].bytes_written);
    /* and patched again afterwards */
    assert_site(&r->sn[2].s[S_TWO], XOR_PAD, OR_M1, 3, "re-applied TWO");
    cr_assert_eq(r->sn[2].value[S_ALWAYS], 2);
}

/*
 * A revert and the apply after it decide again what earlier applies decided:
 * their text was written before, and with no filter in the process (the
 * test's own answer) each writes its few nearby sites in pwrites through
 * /proc/self/mem, no mprotect window -- where the machine runs what such a
 * write puts into text it ran before (the oracle: that operation, done by
 * the test on a page of its own; an emulator that keeps its translations,
 * valgrind without --smc-check=all, says no); else in windows. Either way
 * the sites run their new bytes (the values of revert_restores_originals).
 */
Test(apply, later_applies_write_without_a_window)
{
    bool unfiltered = prctl(PR_GET_SECCOMP, 0, 0, 0, 0) == 0;
    struct seq_result *r = apply_seq(0, ALTPATCH_APPLY_REVERT, 0);
    assert_site(&r->sn[1].s[S_TWO], XOR_PAD, XOR_PAD, 3, "reverted TWO");
    cr_assert_eq(r->sn[1].value[S_ALWAYS], 1, "the reverted site runs its original");
    assert_site(&r->sn[2].s[S_TWO], XOR_PAD, OR_M1, 3, "re-applied TWO");
    cr_assert_eq(r->sn[2].value[S_ALWAYS], 2, "the re-applied site runs its replacement");
    bool spans = unfiltered && ap_procmem_written_text_runs();
    for (int i = 1; i < 3; i++) {
        cr_assert_gt(r->st[i].bytes_written, 0, "apply #%d", i);
        if (spans) {
            cr_assert_eq(r->st[i].mprotect_windows, 0, "apply #%d", i);
            cr_assert_gt(r->st[i].procmem_writes, 0, "apply #%d", i);
        } else {
            cr_assert_gt(r->st[i].mprotect_windows + r->st[i].procmem_writes, 0, "apply #%d", i);
        }
    }
    /* the second later apply asks nothing the first kept: fewer calls than the first apply */
    if (spans)
        cr_assert_lt(r->st[2].syscalls, r->st[0].syscalls, "%llu, first %llu",
                     (unsigned long long)r->st[2].syscalls,
                     (unsigned long long)r->st[0].syscalls);
}

struct switch_result {
    int rc[3];
    struct snapshot sn[3];
};

static void switch_body(void *out, void *ctx)
{
    (void)ctx;
    struct switch_result *r = out;
    struct altpatch_features *a = fset(F_A, -1), *none = fset(-1);
    const struct altpatch_features *order[3] = {a, none, a};
    for (int i = 0; i < 3; i++) {
        r->rc[i] = apply_with(order[i], 0);
        snap(&r->sn[i]);
    }
    altpatch_features_free(a);
    altpatch_features_free(none);
}

Test(apply, another_feature_set_replans)
{
    struct switch_result *r = ap_isolated(sizeof(*r), switch_body, NULL);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(r->rc[i], 0);
    assert_site(&r->sn[0].s[S_TWO], XOR_PAD, OR_M1, 3, "{A}");
    assert_site(&r->sn[0].s[S_NOT], MOV1, MOV1, 5, "{A}");
    assert_site(&r->sn[1].s[S_TWO], XOR_PAD, XOR_PAD, 3, "{} after {A}");
    assert_site(&r->sn[1].s[S_NOT], MOV1, MOV2, 5, "{} after {A}");
    assert_site(&r->sn[1].s[S_NEST], MOV1, MOV1, 5, "{} after {A}");
    cr_assert_eq(r->sn[1].s[S_TWO].state, ALTPATCH_SITE_ORIGINAL);
    assert_site(&r->sn[2].s[S_TWO], XOR_PAD, OR_M1, 3, "{A} again");
    assert_site(&r->sn[2].s[S_NOT], MOV1, MOV1, 5, "{A} again");
    cr_assert_eq(r->sn[2].value[S_NEST], 2);
}

Test(apply, dry_run_writes_nothing)
{
    struct seq_result *r = apply_seq(ALTPATCH_APPLY_DRY_RUN, ALTPATCH_APPLY_DRY_RUN, 0);
    const struct snapshot *sn = &r->sn[0];
    assert_site(&sn->s[S_TWO], XOR_PAD, XOR_PAD, 3, "dry run");
    cr_assert_eq(sn->s[S_TWO].state, ALTPATCH_SITE_PATCHED, "the plan is reported");
    cr_assert_eq(sn->s[S_TWO].chosen, 0);
    cr_assert_eq(r->st[0].bytes_written, 0);
    cr_assert_eq(r->st[0].syscalls, 0);
    cr_assert_gt(r->st[0].sites_patched, 0);
    cr_assert_eq(sn->value[S_TWO], 0);
    /* the real apply afterwards writes what the dry run planned */
    assert_site(&r->sn[2].s[S_TWO], XOR_PAD, OR_M1, 3, "apply after dry run");
    cr_assert_eq(r->st[2].sites_patched, r->st[0].sites_patched);
}

Test(apply, procmem_only)
{
    struct seq_result *r = apply_seq(ALTPATCH_APPLY_PROCMEM_ONLY, ALTPATCH_APPLY_REVERT | ALTPATCH_APPLY_PROCMEM_ONLY, 0);
    if (!ap_procmem_can_write_text()) {
        /* the kernel refuses the only writer allowed: refused, nothing written */
        assert_site(&r->sn[0].s[S_TWO], XOR_PAD, XOR_PAD, 3, "original kept");
        cr_assert_eq(r->sn[0].s[S_TWO].state, ALTPATCH_SITE_REFUSED);
        cr_assert_eq(r->sn[0].s[S_TWO].reason, ALTPATCH_REASON_WRITE_DENIED);
        cr_assert_eq(r->sn[0].value[S_TWO], 0);
        cr_assert_eq(r->st[0].bytes_written, 0);
        assert_site(&r->sn[1].s[S_TWO], XOR_PAD, XOR_PAD, 3, "still the original");
        return;
    }
    assert_site(&r->sn[0].s[S_TWO], XOR_PAD, OR_M1, 3, "through /proc/self/mem");
    cr_assert_eq(r->sn[0].value[S_TWO], 0xffffffffL);
    assert_site(&r->sn[1].s[S_TWO], XOR_PAD, XOR_PAD, 3, "reverted through /proc/self/mem");
}

/* ---- the writer's fallbacks, seen through apply ------------------------------ */

/* Sites listed in each state by altpatch_site_foreach(). */
struct state_count {
    unsigned long n[3];
};

static int count_cb(const struct altpatch_site_info *info, void *ctx)
{
    struct state_count *c = ctx;
    if (info->state >= 0 && info->state < 3)
        c->n[info->state]++;
    return 0;
}

static struct state_count count_states(void)
{
    struct state_count c = {{0}};
    altpatch_site_foreach(count_cb, &c);
    return c;
}

/* The stats of the last call agree with the states the walk lists. */
static void assert_counts(const struct altpatch_stats *st, const struct state_count *c,
                          const char *what)
{
    cr_assert_eq(st->sites_patched, c->n[ALTPATCH_SITE_PATCHED], "%s: patched", what);
    cr_assert_eq(st->sites_refused, c->n[ALTPATCH_SITE_REFUSED], "%s: refused", what);
    cr_assert_eq(st->sites_seen,
                 c->n[ALTPATCH_SITE_PATCHED] + c->n[ALTPATCH_SITE_REFUSED] +
                     c->n[ALTPATCH_SITE_ORIGINAL],
                 "%s: seen", what);
}

struct mdwe_apply_result {
    int set, rc;
    struct altpatch_stats st;
    struct snapshot sn;
    struct state_count states;
};

struct mdwe_apply_ctx {
    unsigned flags;
};

static void mdwe_apply_body(void *out, void *ctx)
{
    struct mdwe_apply_result *r = out;
    struct mdwe_apply_ctx *c = ctx;
    altpatch_set_print(NULL); /* the refusals are expected */
    r->set = ap_mdwe_set();
    struct altpatch_features *f = fset(F_A, -1);
    r->rc = apply_with(f, c->flags);
    altpatch_features_free(f);
    get_stats(&r->st);
    snap(&r->sn);
    r->states = count_states();
}

static struct mdwe_apply_result *apply_mdwe(unsigned flags)
{
    ap_mdwe_skip_under_valgrind();
    struct mdwe_apply_ctx c = {flags};
    struct mdwe_apply_result *r = ap_isolated(sizeof(*r), mdwe_apply_body, &c);
    ap_mdwe_require(r->set);
    cr_assert_eq(r->rc, 0);
    return r;
}

Test(apply, mdwe_patches_through_procmem)
{
    struct mdwe_apply_result *r = apply_mdwe(0);
    if (!ap_procmem_can_write_text()) {
        /* the kernel refuses the fallback too: every write refused, nothing written */
        assert_site(&r->sn.s[S_TWO], XOR_PAD, XOR_PAD, 3, "original kept");
        cr_assert_eq(r->sn.s[S_TWO].state, ALTPATCH_SITE_REFUSED);
        cr_assert_eq(r->sn.s[S_TWO].reason, ALTPATCH_REASON_WRITE_DENIED);
        cr_assert_eq(r->sn.value[S_TWO], 0);
        cr_assert_eq(r->st.bytes_written, 0);
        assert_counts(&r->st, &r->states, "writes denied");
        return;
    }
    assert_site(&r->sn.s[S_TWO], XOR_PAD, OR_M1, 3, "patched under MDWE");
    cr_assert_eq(r->sn.value[S_TWO], 0xffffffffL, "and still executable");
    cr_assert_eq(r->st.sites_refused, 0);
}

Test(apply, mdwe_without_procmem_refuses_write_denied)
{
    struct mdwe_apply_result *r = apply_mdwe(ALTPATCH_APPLY_NO_PROCMEM);
    const struct site_view *v = &r->sn.s[S_TWO];
    assert_site(v, XOR_PAD, XOR_PAD, 3, "original kept");
    cr_assert_eq(v->state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(v->reason, ALTPATCH_REASON_WRITE_DENIED);
    cr_assert_eq(r->sn.value[S_TWO], 0);
    cr_assert_eq(r->st.bytes_written, 0);
    cr_assert_geq(r->st.sites_refused, 3, "ALWAYS, TWO and NEST needed a write");
    assert_counts(&r->st, &r->states, "writes denied");
    cr_assert_eq(r->st.sites_refused + r->st.sites_unchanged, r->st.sites_seen);
}

/* ---- memory changed behind our back ---------------------------------------- */

/* Another writer's bytes are put through /proc/self/mem: the tests that need
 * them have nothing to show where the kernel refuses that. */
static void need_foreign_writes(void)
{
    if (!ap_procmem_can_write_text())
        cr_skip_test(AP_PROCMEM_DENIED);
}

struct mismatch_result {
    int rc, rc2;
    struct snapshot sn;
    struct altpatch_stats st;
    char log[4096];
};

static struct mismatch_result *g_mm_out;

static int capture_mm(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level != ALTPATCH_WARN)
        return 0;
    size_t n = strlen(g_mm_out->log);
    vsnprintf(g_mm_out->log + n, sizeof(g_mm_out->log) - n, fmt, ap);
    return 0;
}

static void mismatch_body(void *out, void *ctx)
{
    (void)ctx;
    struct mismatch_result *r = out;
    struct altpatch_features *f = fset(F_A, -1);
    struct snapshot sn;
    apply_with(f, 0);
    snap(&sn);
    /* someone else rewrites the ALWAYS site: movl $7, %eax */
    int fd = open("/proc/self/mem", O_RDWR);
    uint8_t seven = 7;
    if (fd < 0 || pwrite(fd, &seven, 1, (off_t)(sn.s[S_ALWAYS].addr + 1)) != 1)
        _exit(5);
    close(fd);
    g_mm_out = r;
    altpatch_set_print(capture_mm);
    r->rc = apply_with(f, ALTPATCH_APPLY_REVERT);
    get_stats(&r->st);
    snap(&r->sn);
    r->rc2 = apply_with(f, ALTPATCH_APPLY_REVERT); /* same refusal: no second WARN */
    altpatch_features_free(f);
}

Test(apply, memory_mismatch_is_refused)
{
    need_foreign_writes();
    struct mismatch_result *r = ap_isolated(sizeof(*r), mismatch_body, NULL);
    static const uint8_t MOV7[5] = {0xb8, 7, 0, 0, 0};
    cr_assert_eq(r->rc, 0);
    const struct site_view *v = &r->sn.s[S_ALWAYS];
    assert_site(v, MOV1, MOV7, 5, "foreign bytes stay");
    cr_assert_eq(v->state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(v->reason, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_eq(r->sn.value[S_ALWAYS], 7);
    assert_site(&r->sn.s[S_TWO], XOR_PAD, XOR_PAD, 3, "the others are reverted");
    cr_assert_geq(r->st.sites_refused, 1);
    cr_assert_eq(r->rc2, 0);
    char want[160];
    snprintf(want, sizeof(want), "(0x%lx) refused: %s\n", (unsigned long)v->addr,
             altpatch_strreason(ALTPATCH_REASON_MEM_MISMATCH));
    const char *hit = strstr(r->log, want);
    cr_assert(hit, "WARN for the refusal missing: %s", r->log);
    cr_assert_null(strstr(hit + 1, want), "the same refusal is warned once: %s", r->log);
}

/*
 * An apply that changes nothing decides a site by comparing memory with what
 * the last apply left there; a site someone else rewrote since is still
 * found and refused, and the counts stay exact.
 */
struct settled_result {
    int rc[4];
    struct altpatch_stats st[4];
    struct snapshot sn;
};

static void settled_body(void *out, void *ctx)
{
    (void)ctx;
    struct settled_result *r = out;
    struct altpatch_features *f = fset(F_A, -1);
    struct snapshot sn;
    altpatch_set_print(NULL);
    r->rc[0] = apply_with(f, 0);
    get_stats(&r->st[0]);
    r->rc[1] = apply_with(f, 0); /* nothing to do */
    get_stats(&r->st[1]);
    snap(&sn);
    int fd = open("/proc/self/mem", O_RDWR);
    uint8_t seven = 7;
    if (fd < 0 || pwrite(fd, &seven, 1, (off_t)(sn.s[S_ALWAYS].addr + 1)) != 1)
        _exit(5);
    close(fd);
    r->rc[2] = apply_with(f, 0);
    get_stats(&r->st[2]);
    r->rc[3] = apply_with(f, ALTPATCH_APPLY_DRY_RUN);
    get_stats(&r->st[3]);
    snap(&r->sn);
    altpatch_features_free(f);
}

Test(apply, no_change_apply_still_sees_foreign_bytes)
{
    need_foreign_writes();
    struct settled_result *r = ap_isolated(sizeof(*r), settled_body, NULL);
    static const uint8_t MOV7[5] = {0xb8, 7, 0, 0, 0};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(r->rc[i], 0, "apply %d: %d", i, r->rc[i]);
    /* the second apply: every site unchanged, the same results as the first */
    cr_assert_eq(r->st[1].sites_seen, r->st[0].sites_seen);
    cr_assert_eq(r->st[1].sites_patched, r->st[0].sites_patched);
    cr_assert_eq(r->st[1].sites_refused, r->st[0].sites_refused);
    cr_assert_eq(r->st[1].sites_unchanged, r->st[1].sites_seen - r->st[1].sites_refused);
    cr_assert_eq(r->st[1].bytes_written, 0);
    /* after the foreign write: that site refused, nothing else changes */
    const struct site_view *v = &r->sn.s[S_ALWAYS];
    assert_site(v, MOV1, MOV7, 5, "foreign bytes stay");
    cr_assert_eq(v->state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(v->reason, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_eq(r->sn.value[S_ALWAYS], 7);
    cr_assert_eq(r->st[2].sites_refused, r->st[0].sites_refused + 1);
    cr_assert_eq(r->st[2].sites_patched, r->st[0].sites_patched - 1);
    cr_assert_eq(r->st[2].bytes_written, 0);
    cr_assert_eq(r->st[3].sites_refused, r->st[2].sites_refused, "a dry run sees it too");
    cr_assert_eq(r->sn.s[S_TWO].state, ALTPATCH_SITE_PATCHED);
}

/*
 * A revert of a settled module keeps its plan, and the apply after it writes
 * that plan back without deciding again; a site someone else rewrote in
 * between is still found and refused, in either direction, and the other
 * sites switch as asked.
 */
struct toggle_result {
    int rc[5];
    struct altpatch_stats st[5];
    struct snapshot sn[5];
};

static void foreign_value(const struct snapshot *sn, uint8_t v)
{
    int fd = open("/proc/self/mem", O_RDWR);
    if (fd < 0 || pwrite(fd, &v, 1, (off_t)(sn->s[S_ALWAYS].addr + 1)) != 1)
        _exit(5);
    close(fd);
}

/*
 * A site refused, accepted again, then refused for the same reason is warned
 * about once; another site refused for it is warned about too.
 */
struct rewarn_result {
    int rc[4];
    int state[4], reason[4];
    uintptr_t addr[2];
    char log[4096];
};

static void rewarn_body(void *out, void *ctx)
{
    (void)ctx;
    struct rewarn_result *r = out;
    struct mismatch_result *buf = calloc(1, sizeof(*buf));
    if (!buf)
        _exit(4);
    struct altpatch_features *f = fset(F_A, -1);
    struct snapshot sn;
    apply_with(f, 0);
    snap(&sn);
    r->addr[0] = sn.s[S_ALWAYS].addr;
    r->addr[1] = sn.s[S_TWIN].addr;
    g_mm_out = buf;
    altpatch_set_print(capture_mm);
    /* foreign, back to the plan, foreign again; then the twin foreign too */
    static const uint8_t imm[4] = {7, 2, 7, 7};
    for (int i = 0; i < 4; i++) {
        foreign_value(&sn, imm[i]);
        if (i == 3) {
            int fd = open("/proc/self/mem", O_RDWR);
            uint8_t v = 7;
            if (fd < 0 || pwrite(fd, &v, 1, (off_t)(r->addr[1] + 1)) != 1)
                _exit(5);
            close(fd);
        }
        r->rc[i] = apply_with(f, 0);
        struct snapshot now;
        snap(&now);
        r->state[i] = now.s[S_ALWAYS].state;
        r->reason[i] = now.s[S_ALWAYS].reason;
    }
    altpatch_set_print(NULL);
    memcpy(r->log, buf->log, sizeof(r->log));
    altpatch_features_free(f);
}

Test(apply, a_refusal_is_warned_once_per_site_and_reason)
{
    need_foreign_writes();
    struct rewarn_result *r = ap_isolated(sizeof(*r), rewarn_body, NULL);
    static const int state[4] = {ALTPATCH_SITE_REFUSED, ALTPATCH_SITE_PATCHED,
                                 ALTPATCH_SITE_REFUSED, ALTPATCH_SITE_REFUSED};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(r->rc[i], 0, "apply %d", i);
        cr_assert_eq(r->state[i], state[i], "apply %d", i);
        cr_assert_eq(r->reason[i], i == 1 ? ALTPATCH_REASON_NONE : ALTPATCH_REASON_MEM_MISMATCH,
                     "apply %d", i);
    }
    for (int k = 0; k < 2; k++) {
        char want[160];
        snprintf(want, sizeof(want), "(0x%lx) refused: %s\n", (unsigned long)r->addr[k],
                 altpatch_strreason(ALTPATCH_REASON_MEM_MISMATCH));
        const char *hit = strstr(r->log, want);
        cr_assert(hit, "WARN for site %d missing: %s", k, r->log);
        cr_assert_null(strstr(hit + 1, want), "site %d warned twice: %s", k, r->log);
    }
}

static void toggle_body(void *out, void *ctx)
{
    struct toggle_result *r = out;
    int mode = *(const int *)ctx; /* 0: foreign bytes after the revert, 1: before, 2: as 0,
                                   * then the plan's own bytes before the second revert */
    struct altpatch_features *f = fset(F_A, -1);
    unsigned flags[5] = {0, ALTPATCH_APPLY_REVERT, 0, ALTPATCH_APPLY_REVERT, 0};
    altpatch_set_print(NULL);
    for (int i = 0; i < 5; i++) {
        if (i == (mode == 1 ? 1 : 2))
            foreign_value(&r->sn[0], 7);
        if (mode == 2 && i == 3)
            foreign_value(&r->sn[0], 2);
        r->rc[i] = apply_with(f, flags[i]);
        get_stats(&r->st[i]);
        snap(&r->sn[i]);
    }
    altpatch_features_free(f);
}

static struct toggle_result *toggle_run(int mode)
{
    need_foreign_writes();
    struct toggle_result *r = ap_isolated(sizeof(*r), toggle_body, &mode);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(r->rc[i], 0, "apply %d: %d", i, r->rc[i]);
    return r;
}

Test(apply, revert_and_apply_again_keep_the_plan)
{
    struct seq_result *r = apply_seq(ALTPATCH_APPLY_REVERT, 0, 0);
    struct seq_result *t = apply_seq(0, ALTPATCH_APPLY_REVERT, 0);
    /* the apply after a revert: the same results, bytes and counts as the first */
    cr_assert_eq(t->st[2].sites_patched, t->st[0].sites_patched);
    cr_assert_eq(t->st[2].sites_refused, t->st[0].sites_refused);
    cr_assert_eq(t->st[2].sites_unchanged, t->st[0].sites_unchanged);
    cr_assert_eq(t->st[2].bytes_written, t->st[0].bytes_written);
    for (int k = 0; k < S_COUNT; k++) {
        cr_assert_eq(t->sn[2].s[k].state, t->sn[0].s[k].state, "site %d", k);
        cr_assert_eq(t->sn[2].s[k].chosen, t->sn[0].s[k].chosen, "site %d", k);
        cr_assert_eq(t->sn[2].s[k].reason, t->sn[0].s[k].reason, "site %d", k);
        cr_assert_eq(t->sn[2].s[k].len, t->sn[0].s[k].len);
        cr_assert_arr_eq(t->sn[2].s[k].current, t->sn[0].s[k].current, t->sn[0].s[k].len, "site %d", k);
        cr_assert_arr_eq(t->sn[1].s[k].current, t->sn[1].s[k].original, t->sn[1].s[k].len, "site %d", k);
        /* a revert of nothing patched changes nothing either */
        cr_assert_arr_eq(r->sn[0].s[k].current, r->sn[0].s[k].original, r->sn[0].s[k].len, "site %d", k);
    }
    cr_assert_eq(t->st[1].sites_unchanged, t->st[0].sites_seen - t->st[0].sites_patched -
                                               t->st[0].sites_refused);
    cr_assert_eq(r->st[0].bytes_written, 0);
    cr_assert_eq(r->st[1].sites_patched, t->st[0].sites_patched);
}

Test(apply, foreign_bytes_after_a_revert_are_refused)
{
    struct toggle_result *r = toggle_run(0);
    static const uint8_t MOV7[5] = {0xb8, 7, 0, 0, 0};
    /* apply after the foreign write: that site refused, the others patched */
    assert_site(&r->sn[2].s[S_ALWAYS], MOV1, MOV7, 5, "foreign bytes stay");
    cr_assert_eq(r->sn[2].s[S_ALWAYS].state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(r->sn[2].s[S_ALWAYS].reason, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_eq(r->sn[2].value[S_ALWAYS], 7);
    assert_site(&r->sn[2].s[S_TWO], XOR_PAD, OR_M1, 3, "the others are patched");
    cr_assert_eq(r->st[2].sites_refused, r->st[0].sites_refused + 1);
    cr_assert_eq(r->st[2].sites_patched, r->st[0].sites_patched - 1);
    /* revert and apply again: the foreign site stays refused, the others switch */
    for (int i = 3; i < 5; i++) {
        assert_site(&r->sn[i].s[S_ALWAYS], MOV1, MOV7, 5, "foreign bytes stay");
        cr_assert_eq(r->sn[i].s[S_ALWAYS].reason, ALTPATCH_REASON_MEM_MISMATCH);
        cr_assert_eq(r->st[i].sites_refused, r->st[0].sites_refused + 1);
    }
    assert_site(&r->sn[3].s[S_TWO], XOR_PAD, XOR_PAD, 3, "reverted");
    cr_assert_eq(r->sn[3].s[S_TWO].chosen, -1);
    assert_site(&r->sn[4].s[S_TWO], XOR_PAD, OR_M1, 3, "patched again");
    cr_assert_eq(r->sn[4].s[S_TWO].chosen, r->sn[0].s[S_TWO].chosen);
    cr_assert_eq(r->st[4].sites_patched, r->st[0].sites_patched - 1);
}

Test(apply, foreign_bytes_before_a_revert_are_refused)
{
    struct toggle_result *r = toggle_run(1);
    static const uint8_t MOV7[5] = {0xb8, 7, 0, 0, 0};
    /* the revert: that site refused with the foreign bytes, the others reverted */
    assert_site(&r->sn[1].s[S_ALWAYS], MOV1, MOV7, 5, "foreign bytes stay");
    cr_assert_eq(r->sn[1].s[S_ALWAYS].reason, ALTPATCH_REASON_MEM_MISMATCH);
    assert_site(&r->sn[1].s[S_TWO], XOR_PAD, XOR_PAD, 3, "reverted");
    cr_assert_eq(r->st[1].sites_refused, r->st[0].sites_refused + 1);
    cr_assert_eq(r->st[1].sites_patched, 0);
    for (int i = 2; i < 5; i++) {
        assert_site(&r->sn[i].s[S_ALWAYS], MOV1, MOV7, 5, "foreign bytes stay");
        cr_assert_eq(r->sn[i].s[S_ALWAYS].state, ALTPATCH_SITE_REFUSED);
        cr_assert_eq(r->sn[i].value[S_ALWAYS], 7);
    }
    assert_site(&r->sn[2].s[S_TWO], XOR_PAD, OR_M1, 3, "patched again");
    assert_site(&r->sn[3].s[S_TWO], XOR_PAD, XOR_PAD, 3, "reverted again");
    assert_site(&r->sn[4].s[S_TWO], XOR_PAD, OR_M1, 3, "and patched");
    cr_assert_eq(r->st[4].sites_patched, r->st[0].sites_patched - 1);
}

/*
 * What the last apply left at a site refused by the apply after a revert is
 * the original: memory holding the plan's bytes there later is someone
 * else's write, refused by the next revert.
 */
Test(apply, a_refused_site_keeps_what_was_left)
{
    struct toggle_result *r = toggle_run(2);
    assert_site(&r->sn[2].s[S_ALWAYS], MOV1, ((const uint8_t[]){0xb8, 7, 0, 0, 0}), 5, "foreign bytes stay");
    cr_assert_eq(r->sn[2].s[S_ALWAYS].reason, ALTPATCH_REASON_MEM_MISMATCH);
    assert_site(&r->sn[3].s[S_ALWAYS], MOV1, ((const uint8_t[]){0xb8, 2, 0, 0, 0}), 5, "not reverted");
    cr_assert_eq(r->sn[3].s[S_ALWAYS].state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(r->sn[3].s[S_ALWAYS].reason, ALTPATCH_REASON_MEM_MISMATCH);
    assert_site(&r->sn[3].s[S_TWO], XOR_PAD, XOR_PAD, 3, "the others are reverted");
}

/*
 * The apply after a revert writes the kept plan; where the writer refuses,
 * what that apply left is still the original, so the plan's bytes written
 * there by someone else later are refused by the next revert.
 */
struct denied_toggle_result {
    int set, rc[3];
    struct altpatch_stats st[3];
    struct snapshot sn[3];
    struct state_count states[3];
};

static void denied_toggle_body(void *out, void *ctx)
{
    (void)ctx;
    struct denied_toggle_result *r = out;
    struct altpatch_features *f = fset(F_A, -1);
    altpatch_set_print(NULL);
    r->rc[0] = apply_with(f, 0);
    snap(&r->sn[0]);
    r->rc[0] |= apply_with(f, ALTPATCH_APPLY_REVERT);
    r->set = ap_mdwe_set();
    r->rc[1] = apply_with(f, ALTPATCH_APPLY_NO_PROCMEM);
    get_stats(&r->st[1]);
    snap(&r->sn[1]);
    r->states[1] = count_states();
    foreign_value(&r->sn[0], 2); /* S_ALWAYS's plan: mov $2 */
    r->rc[2] = apply_with(f, ALTPATCH_APPLY_REVERT);
    get_stats(&r->st[2]);
    snap(&r->sn[2]);
    r->states[2] = count_states();
    altpatch_features_free(f);
}

Test(apply, denied_writes_after_a_revert_leave_the_originals)
{
    need_foreign_writes();
    ap_mdwe_skip_under_valgrind();
    struct denied_toggle_result *r = ap_isolated(sizeof(*r), denied_toggle_body, NULL);
    ap_mdwe_require(r->set);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(r->rc[i], 0, "apply %d: %d", i, r->rc[i]);
    assert_site(&r->sn[1].s[S_TWO], XOR_PAD, XOR_PAD, 3, "original kept");
    cr_assert_eq(r->sn[1].s[S_TWO].reason, ALTPATCH_REASON_WRITE_DENIED);
    cr_assert_eq(r->sn[1].s[S_ALWAYS].reason, ALTPATCH_REASON_WRITE_DENIED);
    cr_assert_eq(r->st[1].bytes_written, 0);
    assert_site(&r->sn[2].s[S_ALWAYS], MOV1, ((const uint8_t[]){0xb8, 2, 0, 0, 0}), 5,
                "someone else's bytes stay");
    cr_assert_eq(r->sn[2].s[S_ALWAYS].reason, ALTPATCH_REASON_MEM_MISMATCH);
    assert_site(&r->sn[2].s[S_TWO], XOR_PAD, XOR_PAD, 3, "still the original");
    cr_assert_eq(r->sn[2].s[S_TWO].state, ALTPATCH_SITE_ORIGINAL);
    cr_assert_eq(r->st[2].bytes_written, 0);
    assert_counts(&r->st[1], &r->states[1], "writes denied after a revert");
    assert_counts(&r->st[2], &r->states[2], "the revert after");
}

#if defined(RELOAD_V1) && defined(RELOAD_V2) && defined(RELOAD_V3)
/*
 * Three libraries loaded after the program: the loader places each below the
 * one before (or anywhere), so the writes of one apply, queued module by
 * module, need sorting by address; every site still gets its own decision,
 * result and bytes, through apply, revert and the apply after it.
 */
struct order_result {
    int loaded, rc[3];
    uintptr_t fn[3];
    long value[3][3];
    int state[3][3], chosen[3][3];
    struct altpatch_stats st[3];
};

struct order_find {
    struct order_result *r;
    int phase;
};

static int order_cb(const struct altpatch_site_info *info, void *ctx)
{
    struct order_find *f = ctx;
    for (int k = 0; k < 3; k++) {
        /* the library's one site lies in its reload_value() */
        if (info->addr >= f->r->fn[k] && info->addr < f->r->fn[k] + 64) {
            f->r->state[f->phase][k] = info->state;
            f->r->chosen[f->phase][k] = info->chosen;
        }
    }
    return 0;
}

static void order_body(void *out, void *ctx)
{
    (void)ctx;
    struct order_result *r = out;
    const char *path[3] = {RELOAD_V1, RELOAD_V2, RELOAD_V3};
    long (*fn[3])(void);
    struct altpatch_features *f = fset(-1);
    altpatch_set_print(NULL);
    for (int k = 0; k < 3; k++) {
        void *h = dlopen(path[k], RTLD_NOW | RTLD_LOCAL);
        fn[k] = h ? (long (*)(void))dlsym(h, "reload_value") : NULL;
        if (!fn[k])
            return;
        r->fn[k] = (uintptr_t)fn[k];
    }
    r->loaded = 1;
    unsigned flags[3] = {0, ALTPATCH_APPLY_REVERT, 0};
    for (int i = 0; i < 3; i++) {
        r->rc[i] = apply_with(f, flags[i]);
        get_stats(&r->st[i]);
        for (int k = 0; k < 3; k++)
            r->value[i][k] = fn[k]();
        struct order_find c = {r, i};
        altpatch_site_foreach(order_cb, &c);
    }
    altpatch_features_free(f);
}

Test(apply, modules_out_of_address_order)
{
    struct order_result *r = ap_isolated(sizeof(*r), order_body, NULL);
    static const long orig[3] = {1, 1, 7}, repl[3] = {2, 3, 3};
    cr_assert(r->loaded, "the three libraries load");
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(r->rc[i], 0, "apply %d: %d", i, r->rc[i]);
        cr_assert_eq(r->st[i].sites_refused, 0, "apply %d", i);
        for (int k = 0; k < 3; k++) {
            bool patched = i != 1;
            cr_assert_eq(r->value[i][k], patched ? repl[k] : orig[k], "apply %d, library %d", i,
                         k);
            cr_assert_eq(r->state[i][k], patched ? ALTPATCH_SITE_PATCHED : ALTPATCH_SITE_ORIGINAL,
                         "apply %d, library %d", i, k);
            cr_assert_eq(r->chosen[i][k], patched ? 0 : -1, "apply %d, library %d", i, k);
        }
    }
    cr_assert_eq(r->st[2].sites_patched, r->st[0].sites_patched);
    cr_assert_eq(r->st[2].bytes_written, r->st[0].bytes_written);
    cr_assert_eq(r->st[1].bytes_written, r->st[0].bytes_written);
}
/*
 * A library loaded after an apply and walked before the next one: listed
 * with memory's bytes as its originals, every site ORIGINAL; the next apply
 * patches it from those.
 */
struct walk_first_result {
    int loaded, rc[2], found[2], state[2], chosen[2], reason[2], same[2];
    long value[2];
    uint8_t original[2][16];
    unsigned len;
};

struct walk_first_find {
    struct walk_first_result *r;
    uintptr_t fn;
    int phase;
};

static int walk_first_cb(const struct altpatch_site_info *info, void *ctx)
{
    struct walk_first_find *f = ctx;
    struct walk_first_result *r = f->r;
    int p = f->phase;
    if (info->addr < f->fn || info->addr >= f->fn + 64 || r->found[p] || info->len > 16)
        return 0;
    r->found[p] = 1;
    r->state[p] = info->state;
    r->chosen[p] = info->chosen;
    r->reason[p] = info->reason;
    r->len = info->len;
    memcpy(r->original[p], info->original, info->len);
    r->same[p] = !memcmp(info->original, info->current, info->len);
    return 0;
}

static void walk_first_body(void *out, void *ctx)
{
    (void)ctx;
    struct walk_first_result *r = out;
    struct altpatch_features *f = fset(-1);
    altpatch_set_print(NULL);
    r->rc[0] = apply_with(f, 0);
    void *h = dlopen(RELOAD_V1, RTLD_NOW | RTLD_LOCAL);
    long (*fn)(void) = h ? (long (*)(void))dlsym(h, "reload_value") : NULL;
    if (!fn)
        return;
    r->loaded = 1;
    for (int p = 0; p < 2; p++) {
        if (p)
            r->rc[1] = apply_with(f, 0);
        struct walk_first_find c = {r, (uintptr_t)fn, p};
        altpatch_site_foreach(walk_first_cb, &c);
        r->value[p] = fn();
    }
    altpatch_features_free(f);
}

Test(apply, a_module_walked_before_its_first_apply)
{
    struct walk_first_result *r = ap_isolated(sizeof(*r), walk_first_body, NULL);
    cr_assert(r->loaded, "the library loads");
    cr_assert_eq(r->rc[0], 0);
    cr_assert_eq(r->rc[1], 0);
    cr_assert(r->found[0] && r->found[1], "the library's site is listed");
    cr_assert_eq(r->value[0], 1, "not patched before the second apply");
    cr_assert_eq(r->state[0], ALTPATCH_SITE_ORIGINAL);
    cr_assert_eq(r->chosen[0], -1);
    cr_assert_eq(r->reason[0], ALTPATCH_REASON_NONE);
    cr_assert(r->same[0], "memory holds the original");
    cr_assert_eq(r->value[1], 2, "patched by the second apply");
    cr_assert_eq(r->state[1], ALTPATCH_SITE_PATCHED);
    cr_assert_eq(r->chosen[1], 0);
    cr_assert_not(r->same[1], "memory holds the replacement");
    cr_assert_arr_eq(r->original[1], r->original[0], r->len, "the same originals");
}

#endif

/*
 * Sites whose template is known (a second apply under the same feature set)
 * are recorded as they are decided, a write as if it lands; a write the OS
 * then denies makes the site refused and the counts exact again.
 */
struct denied_known_result {
    int set, rc[3];
    struct altpatch_stats st;
    struct snapshot sn;
    struct state_count states;
};

static void denied_known_body(void *out, void *ctx)
{
    (void)ctx;
    struct denied_known_result *r = out;
    struct altpatch_features *f = fset(F_A, -1);
    altpatch_set_print(NULL);
    r->rc[0] = apply_with(f, 0);
    snap(&r->sn);
    foreign_value(&r->sn, 7); /* the module is decided site by site from now on */
    r->rc[1] = apply_with(f, ALTPATCH_APPLY_REVERT);
    r->set = ap_mdwe_set();
    r->rc[2] = apply_with(f, ALTPATCH_APPLY_NO_PROCMEM);
    get_stats(&r->st);
    snap(&r->sn);
    r->states = count_states();
    altpatch_features_free(f);
}

Test(apply, denied_writes_of_known_shapes_are_refused)
{
    need_foreign_writes();
    ap_mdwe_skip_under_valgrind();
    struct denied_known_result *r = ap_isolated(sizeof(*r), denied_known_body, NULL);
    ap_mdwe_require(r->set);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(r->rc[i], 0, "apply %d: %d", i, r->rc[i]);
    assert_site(&r->sn.s[S_TWO], XOR_PAD, XOR_PAD, 3, "original kept");
    cr_assert_eq(r->sn.s[S_TWO].state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(r->sn.s[S_TWO].reason, ALTPATCH_REASON_WRITE_DENIED);
    cr_assert_eq(r->sn.s[S_ALWAYS].reason, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_eq(r->st.bytes_written, 0);
    assert_counts(&r->st, &r->states, "known shapes, writes denied");
    cr_assert_eq(r->st.sites_refused + r->st.sites_unchanged, r->st.sites_seen);
}

/*
 * A module's first apply records a patched site as it queues its write; a
 * write the OS denies leaves the site refused and what the apply left the
 * original, so bytes someone else writes there afterwards -- even the plan's
 * own -- are foreign to the next apply.
 */
struct denied_first_result {
    int set, rc[2];
    struct altpatch_stats st;
    struct snapshot sn[2];
};

static void denied_first_body(void *out, void *ctx)
{
    (void)ctx;
    struct denied_first_result *r = out;
    altpatch_set_print(NULL); /* the refusals are expected */
    r->set = ap_mdwe_set();
    if (r->set)
        return;
    struct altpatch_features *f = fset(F_A, -1);
    /* the first apply of the module, its writes denied */
    r->rc[0] = apply_with(f, ALTPATCH_APPLY_NO_PROCMEM);
    get_stats(&r->st);
    snap(&r->sn[0]);
    /* the plan's bytes at both sites, not written by an apply; then a revert */
    int fd = open("/proc/self/mem", O_RDWR);
    uint8_t two = 2;
    if (!r->sn[0].s[S_TWIN].found || fd < 0 ||
        pwrite(fd, &two, 1, (off_t)(r->sn[0].s[S_TWIN].addr + 1)) != 1)
        _exit(5);
    close(fd);
    foreign_value(&r->sn[0], 2);
    r->rc[1] = apply_with(f, ALTPATCH_APPLY_REVERT);
    snap(&r->sn[1]);
    altpatch_features_free(f);
}

Test(apply, denied_first_writes_leave_the_originals_as_what_was_left)
{
    need_foreign_writes();
    ap_mdwe_skip_under_valgrind();
    struct denied_first_result *r = ap_isolated(sizeof(*r), denied_first_body, NULL);
    ap_mdwe_require(r->set);
    cr_assert_eq(r->rc[0], 0);
    cr_assert_eq(r->rc[1], 0);
    cr_assert_eq(r->st.bytes_written, 0);
    cr_assert_eq(r->st.sites_patched, 0, "every write denied");
    for (int i = 0; i < 2; i++) {
        for (int k = S_ALWAYS; k <= S_TWIN; k += S_TWIN - S_ALWAYS) {
            const struct site_view *v = &r->sn[i].s[k];
            const char *what = k == S_TWIN ? "twin" : "site";
            assert_site(v, MOV1, i ? MOV2 : MOV1, 5, what);
            cr_assert_eq(v->state, ALTPATCH_SITE_REFUSED, "%s, apply %d", what, i);
            cr_assert_eq(v->reason,
                         i ? ALTPATCH_REASON_MEM_MISMATCH : ALTPATCH_REASON_WRITE_DENIED,
                         "%s, apply %d", what, i);
            cr_assert_eq(r->sn[i].value[k], i ? 2 : 1, "%s, apply %d", what, i);
        }
    }
}

/* ---- the environment ------------------------------------------------------- */

struct env_ctx {
    const char *name, *value;
    bool host;        /* plan for the host instead of {F_A} */
    bool capture_log; /* route messages to a buffer */
};

struct env_result {
    int rc;
    struct snapshot sn;
    struct altpatch_stats st;
    bool has_a;   /* altpatch_cpu_has(F_A) as the child saw it */
    char log[16384];
};

static struct env_result *g_env_out;

static int capture(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    size_t n = strlen(g_env_out->log);
    if (n + 1 < sizeof(g_env_out->log))
        vsnprintf(g_env_out->log + n, sizeof(g_env_out->log) - n, fmt, ap);
    return 0;
}

static void env_body(void *out, void *ctx)
{
    struct env_result *r = out;
    struct env_ctx *c = ctx;
    g_env_out = r;
    if (c->name)
        setenv(c->name, c->value, 1);
    if (c->capture_log)
        altpatch_set_print(capture);
    r->has_a = altpatch_cpu_has(F_A);
    struct altpatch_features *f = c->host ? NULL : fset(F_A, -1);
    r->rc = apply_with(f, 0);
    altpatch_features_free(f);
    get_stats(&r->st);
    snap(&r->sn);
}

static struct env_result *apply_env(const char *name, const char *value, bool host, bool log)
{
    struct env_ctx c = {name, value, host, log};
    struct env_result *r = ap_isolated(sizeof(*r), env_body, &c);
    cr_assert_eq(r->rc, 0, "apply: %d", r->rc);
    return r;
}

Test(apply, altpatch_off)
{
    struct env_result *r = apply_env("ALTPATCH_OFF", "1", false, true);
    cr_assert_eq(r->sn.value[S_ALWAYS], 1, "nothing patched");
    cr_assert_eq(r->sn.value[S_TWO], 0);
    cr_assert_eq(r->st.bytes_written, 0);
    cr_assert_eq(r->st.sites_seen, 0, "ALTPATCH_OFF: no module is even read");
    cr_assert_eq(r->sn.foreach_rc, -ENODATA, "no apply has run");
    r = apply_env("ALTPATCH_OFF", "0", false, true);
    cr_assert_eq(r->sn.value[S_ALWAYS], 2, "ALTPATCH_OFF=0 does not switch off");
}

Test(apply, clearcpuid)
{
    struct env_result *r = apply_env(NULL, NULL, true, false);
    if (!r->has_a)
        cr_skip_test("host without popcnt");
    assert_site(&r->sn.s[S_TWO], XOR_PAD, OR_M1, 3, "host set has popcnt");
    assert_site(&r->sn.s[S_NOT], MOV1, MOV1, 5, "host set has popcnt");
    r = apply_env("ALTPATCH_CLEARCPUID", "popcnt", true, false);
    cr_assert_not(r->has_a, "altpatch_cpu_has honours ALTPATCH_CLEARCPUID");
    assert_site(&r->sn.s[S_TWO], XOR_PAD, XOR_PAD, 3, "popcnt cleared");
    assert_site(&r->sn.s[S_NOT], MOV1, MOV2, 5, "popcnt cleared: ALT_NOT taken");
    /* an explicit set is not filtered by ALTPATCH_CLEARCPUID */
    r = apply_env("ALTPATCH_CLEARCPUID", "popcnt", false, false);
    assert_site(&r->sn.s[S_TWO], XOR_PAD, OR_M1, 3, "explicit set wins");
}

static bool all_lines_prefixed(const char *log)
{
    for (const char *l = log; *l;) {
        if (strncmp(l, "altpatch: ", 10) != 0)
            return false;
        const char *nl = strchr(l, '\n');
        if (!nl)
            return false;
        l = nl + 1;
    }
    return true;
}

Test(apply, debug_blocks)
{
    struct env_result *r = apply_env("ALTPATCH_DEBUG", "1", false, true);
    const char *log = r->log;
    char line[128];
    cr_assert(strstr(log, "feat: 4*32+23 (popcnt), old: ("), "%s", log);
    snprintf(line, sizeof(line), "0x%lx:   old_insn: 31 c0 90\n",
             (unsigned long)r->sn.s[S_TWO].addr);
    cr_assert(strstr(log, line), "missing '%s' in:\n%s", line, log);
    snprintf(line, sizeof(line), "0x%lx: final_insn: 83 c8 ff\n",
             (unsigned long)r->sn.s[S_TWO].addr);
    cr_assert(strstr(log, line), "missing '%s'", line);
    snprintf(line, sizeof(line), "(0x%lx) len: 3), repl: (0x",
             (unsigned long)r->sn.s[S_TWO].addr);
    cr_assert(strstr(log, line), "missing '%s'", line);
    cr_assert(strstr(log, "feat: !4*32+23 (popcnt)"), "ALT_NOT shown with '!'");
    cr_assert(strstr(log, "feat: 9*32+16 (avx512f)"), "each nested entry has its line");
    snprintf(line, sizeof(line), "0x%lx: chosen: entry 0 of 2\n",
             (unsigned long)r->sn.s[S_NEST].addr);
    cr_assert(strstr(log, line), "missing '%s'", line);
    cr_assert(all_lines_prefixed(log), "every line starts with 'altpatch: '");
}

Test(apply, no_debug_blocks_by_default)
{
    struct env_result *r = apply_env("ALTPATCH_DEBUG", "0", false, true);
    cr_assert_null(strstr(r->log, "old_insn"), "%s", r->log);
}

/* ---- print callback, options, stats ---------------------------------------- */

static int silent(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level, (void)fmt, (void)ap;
    return 0;
}

Test(apply, set_print_returns_previous)
{
    altpatch_print_fn def = altpatch_set_print(silent);
    cr_assert_not_null(def, "a default printer exists");
    cr_assert_eq(altpatch_set_print(NULL), silent);
    cr_assert_null(altpatch_set_print(def));
    cr_assert_eq(altpatch_set_print(def), def);
}

Test(apply, bad_opts)
{
    struct {
        struct altpatch_apply_opts o;
        uint64_t tail;
    } big = {{.sz = sizeof(big), .flags = ALTPATCH_APPLY_DRY_RUN}, 0};
    altpatch_set_print(silent);
    cr_assert_eq(altpatch_apply_opts(&(struct altpatch_apply_opts){.sz = 0}), -EINVAL);
    big.tail = 1;
    cr_assert_eq(altpatch_apply_opts(&big.o), -EINVAL, "non-zero unknown tail");
    big.tail = 0;
    cr_assert_eq(altpatch_apply_opts(&big.o), 0, "zero tail is fine (dry run)");
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = 1u << 20};
    cr_assert_eq(altpatch_apply_opts(&o), -EINVAL, "unknown flag");
    o.flags = ALTPATCH_APPLY_PROCMEM_ONLY | ALTPATCH_APPLY_NO_PROCMEM;
    cr_assert_eq(altpatch_apply_opts(&o), -EINVAL, "contradicting flags");
    /* a caller compiled against an older, shorter struct: only sz */
    struct altpatch_apply_opts small = {.sz = sizeof(size_t), .flags = 0xffff};
    cr_assert_neq(altpatch_apply_opts(&small), -EINVAL, "fields past sz are ignored");
    struct altpatch_stats st = {.sz = 0};
    cr_assert_eq(altpatch_get_stats(&st), -EINVAL);
    cr_assert_eq(altpatch_get_stats(NULL), -EINVAL);
    cr_assert_eq(altpatch_site_foreach(NULL, NULL), -EINVAL);
}

Test(apply, foreach_before_apply)
{
    cr_assert_eq(altpatch_site_foreach(collect_cb, NULL), -ENODATA);
}

static int stop_cb(const struct altpatch_site_info *si, void *ctx)
{
    (void)si;
    ++*(int *)ctx;
    return 7;
}

Test(apply, foreach_stops_on_nonzero)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_DRY_RUN};
    cr_assert_eq(altpatch_apply_opts(&o), 0, "dry run is allowed with threads");
    int calls = 0;
    cr_assert_eq(altpatch_site_foreach(stop_cb, &calls), 7);
    cr_assert_eq(calls, 1);
}

struct reentry {
    int apply_rc, foreach_rc, stats_rc;
    uint64_t seen;
};

static int reenter_cb(const struct altpatch_site_info *si, void *ctx)
{
    (void)si;
    struct reentry *r = ctx;
    struct altpatch_stats st = {.sz = sizeof(st)};
    r->apply_rc = altpatch_apply();
    r->foreach_rc = altpatch_site_foreach(reenter_cb, ctx);
    r->stats_rc = altpatch_get_stats(&st);
    r->seen = st.sites_seen;
    return 1;
}

Test(apply, callbacks_may_not_reenter)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_DRY_RUN};
    cr_assert_eq(altpatch_apply_opts(&o), 0);
    struct reentry r = {0};
    cr_assert_eq(altpatch_site_foreach(reenter_cb, &r), 1);
    cr_assert_eq(r.apply_rc, -EDEADLK);
    cr_assert_eq(r.foreach_rc, -EDEADLK);
    cr_assert_eq(r.stats_rc, 0, "stats may be read from a callback");
    cr_assert_geq(r.seen, S_COUNT);
}

Test(apply, version_and_reasons)
{
    cr_assert_str_eq(altpatch_version(), "0.1.0");
    cr_assert_str_eq(altpatch_strreason(-1), "unknown reason");
    cr_assert_str_eq(altpatch_strreason(ALTPATCH_REASON__COUNT), "unknown reason");
    for (int i = 0; i < ALTPATCH_REASON__COUNT; i++) {
        const char *s = altpatch_strreason(i);
        cr_assert(s && *s && strcmp(s, "unknown reason") != 0, "reason %d", i);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(s, altpatch_strreason(j), "reasons %d and %d share a text", i, j);
    }
}

/* ---- modules (white box) ---------------------------------------------------- */

Test(apply, modules_refresh_finds_this_program)
{
    struct ap_module *list = NULL;
    cr_assert_eq(ap_modules_refresh(&list), 0);
    struct ap_module *m = list;
    while (m && m->path[0])
        m = m->next;
    cr_assert_not_null(m, "the executable carries a note");
    cr_assert_eq(m->reason, ALTPATCH_REASON_NONE);
    cr_assert_eq(m->note.version, ALTPATCH_FORMAT_VERSION);
    cr_assert_geq(m->nsites, S_COUNT);
    cr_assert_geq(m->view.ntext, 1);
    cr_assert_gt(m->view.repl.size, 0);
    cr_assert(m->table_read);
    cr_assert_gt(m->note.record_size, 0);
    cr_assert_eq(m->table_size % m->note.record_size, 0);
    cr_assert_eq(m->nentries, m->table_size / m->note.record_size);
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < m->nsites; i++) {
        uintptr_t a = (uintptr_t)ap_site_addr(m, i), fn = (uintptr_t)site_two;
        if (a >= fn && a < fn + 32 && (best == SIZE_MAX || a < ap_site_addr(m, best)))
            best = i;
    }
    cr_assert_neq(best, SIZE_MAX, "site_two listed");
    /* the per-site arrays are filled when first needed (a decision, a site walk) */
    ap_module_save(m);
    cr_assert(m->saved);
    cr_assert_neq(ap_orig_off(m, best), AP_NO_ORIG);
    cr_assert_arr_eq(m->orig + ap_orig_off(m, best), XOR_PAD, 3);
    /* each site's bytes follow the last site's and hold what memory held
     * (test_parts: over several groups of AP_SITE_GROUP sites) */
    size_t off = 0;
    for (size_t i = 0; i < m->nsites; off += m->sites[i].len, i++) {
        cr_assert_not(ap_site_outside(m, i), "site %zu lies in the text", i);
        cr_assert_eq(ap_orig_off(m, i), off, "site %zu: offset %zu, not %zu", i,
                     ap_orig_off(m, i), off);
        cr_assert_arr_eq(m->orig + off, (const void *)(uintptr_t)ap_site_addr(m, i),
                         m->sites[i].len, "site %zu: its original saved", i);
    }
    cr_assert_eq(off, m->site_bytes);
    /* nothing loaded or unloaded: the same modules are kept */
    struct ap_module *first = list;
    cr_assert_eq(ap_modules_refresh(&list), 0);
    cr_assert_eq(list, first);
    ap_modules_free(list);
}

#ifdef APH_RECORDS
/* Sites outside a module's text (the hostile records' SITE_BOUNDS sites:
 * in the record table, and 2 GiB away) have no bytes saved; every other
 * site's bytes follow the sites' before it, the outside ones' lengths
 * counted too. Which sites lie in an executable segment comes from the
 * loader's program headers (none of this fixture's sites lies in its
 * replacement section, which the library's text leaves out). */
Test(apply, sites_outside_the_text_have_no_bytes)
{
    void *h = dlopen(APH_RECORDS, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "dlopen: %s", dlerror());
    struct ap_module *list = NULL;
    cr_assert_eq(ap_modules_refresh(&list), 0);
    struct ap_module *m = list;
    const char *name = strrchr(APH_RECORDS, '/') + 1;
    while (m && (!strrchr(m->path, '/') || strcmp(strrchr(m->path, '/') + 1, name)))
        m = m->next;
    cr_assert_not_null(m, "%s listed", name);
    cr_assert_eq(m->reason, ALTPATCH_REASON_NONE);
    struct ap_exec_segs segs;
    cr_assert_gt(ap_exec_segs_find(&segs, name), 0);
    ap_module_save(m);
    size_t off = 0, inside = 0, outside = 0;
    for (size_t i = 0; i < m->nsites; off += m->sites[i].len, i++) {
        uintptr_t a = (uintptr_t)ap_site_addr(m, i);
        size_t len = m->sites[i].len;
        bool in = ap_exec_segs_hold(&segs, a, len);
        cr_assert_eq(ap_site_outside(m, i), !in, "site %zu at %#lx", i, (unsigned long)a);
        if (!in) {
            cr_assert_eq(ap_orig_off(m, i), AP_NO_ORIG, "site %zu", i);
            outside++;
            continue;
        }
        cr_assert_eq(ap_orig_off(m, i), off, "site %zu: offset %zu, not %zu", i, ap_orig_off(m, i),
                     off);
        cr_assert_arr_eq(m->orig + off, (const void *)a, len, "site %zu: its original saved", i);
        inside++;
    }
    cr_assert_geq(outside, 3, "the three SITE_BOUNDS sites");
    cr_assert_geq(inside, 2);
    cr_assert_eq(off, m->site_bytes);
    ap_modules_free(list);
    dlclose(h);
}
#endif

struct seen_walk {
    struct ap_notes_seen seen;
    size_t main; /* the index of the object with the empty name */
};

static int seen_walk_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct seen_walk *w = data;
    if (!info->dlpi_name || !info->dlpi_name[0])
        w->main = w->seen.n;
    ap_module_note_seen(info, size, true, &w->seen);
    return 0;
}

static size_t list_count(const struct ap_module *m, const struct ap_module **main_mod)
{
    size_t n = 0;
    *main_mod = NULL;
    for (; m; m = m->next, n++)
        if (!m->path[0])
            *main_mod = m;
    return n;
}

/* The module walk takes each object's note from the walk just before it
 * (the pins' walk) when the loader's counters are the same, and searches the
 * program headers itself when they differ. */
Test(apply, modules_refresh_takes_the_notes_of_the_walk_before)
{
    struct seen_walk w = {.main = SIZE_MAX};
    ap_notes_seen_init(&w.seen);
    w.seen.complete = dl_iterate_phdr(seen_walk_cb, &w) == 0;
    if (w.seen.idle)
        cr_skip_test("a module walk ran before in this process");
    cr_assert(w.seen.complete && w.seen.counted);
    cr_assert_gt(w.seen.n, 0);
    cr_assert_lt(w.main, w.seen.n);
    cr_assert_lt(w.main, AP_NOTES_SEEN);
    cr_assert_not_null(w.seen.obj[w.main].desc, "the executable carries a note");

    struct ap_module *plain = NULL, *taken = NULL, *lost = NULL, *stale = NULL;
    const struct ap_module *mp, *mt, *ml, *ms;
    cr_assert_eq(ap_modules_refresh(&plain), 0);
    cr_assert_eq(ap_modules_refresh_seen(&taken, &w.seen), 0);
    size_t np = list_count(plain, &mp), nt = list_count(taken, &mt);
    cr_assert_eq(nt, np, "the same modules");
    cr_assert_not_null(mt);
    cr_assert_eq(mt->nsites, mp->nsites);
    cr_assert_eq(mt->note.table_start, mp->note.table_start);

    /* the walk before "found no note" on the executable: believed under the
     * same counters (so it is what the module walk used)... */
    w.seen.obj[w.main].desc = NULL;
    cr_assert_eq(ap_modules_refresh_seen(&lost, &w.seen), 0);
    cr_assert_eq(list_count(lost, &ml), np - 1);
    cr_assert_null(ml);
    /* ...and not when the counters differ: searched again */
    w.seen.adds++;
    cr_assert_eq(ap_modules_refresh_seen(&stale, &w.seen), 0);
    cr_assert_eq(list_count(stale, &ms), np);
    cr_assert_not_null(ms);
    cr_assert_eq(ms->nsites, mp->nsites);
    ap_modules_free(plain);
    ap_modules_free(taken);
    ap_modules_free(lost);
    ap_modules_free(stale);
}

/* A walk like the pins' one: libraries searched for a note, the executable not. */
static int pins_like_walk_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct seen_walk *w = data;
    bool lib = info->dlpi_name && info->dlpi_name[0];
    if (!lib)
        w->main = w->seen.n;
    ap_module_note_seen(info, size, lib, &w->seen);
    return 0;
}

static void pins_like_walk(struct seen_walk *w)
{
    w->main = SIZE_MAX;
    ap_notes_seen_init(&w->seen);
    w->seen.complete = dl_iterate_phdr(pins_like_walk_cb, w) == 0;
}

/* Where the walk before saw every object, the executable first and no
 * library with a note, the module walk of an empty list lists the executable
 * as that walk found it, without walking again: the same module as a walk
 * of its own. A library with a note loaded after the walk before is not
 * listed by it (it has no pin: skipped this time) but by the next walk; a
 * walk before that saw a library with a note, or did not finish, is not
 * taken for the module walk. */
Test(apply, modules_refresh_of_the_executable_alone)
{
    struct seen_walk w;
    pins_like_walk(&w);
    if (w.seen.idle)
        cr_skip_test("a module walk ran before in this process");
    cr_assert(w.seen.complete && w.seen.counted);
    cr_assert_eq(w.main, 0, "the executable comes first");
    cr_assert(w.seen.first_main);
    cr_assert_eq(w.seen.lib_notes, 0, "no library of this test carries a note");

    struct ap_module *plain = NULL, *alone = NULL;
    const struct ap_module *mp, *ma;
    cr_assert_eq(ap_modules_refresh(&plain), 0);
    cr_assert_eq(ap_modules_refresh_seen(&alone, &w.seen), 0);
    cr_assert_eq(list_count(plain, &mp), 1, "the executable only");
    cr_assert_eq(list_count(alone, &ma), 1);
    cr_assert_not_null(mp);
    cr_assert_not_null(ma);
    cr_assert_eq(ma->base, mp->base);
    cr_assert_eq(ma->nsites, mp->nsites);
    cr_assert_eq(ma->note.table_start, mp->note.table_start);
    cr_assert_eq(ma->plan_note, mp->plan_note);

    /* a library with a note loaded after the walk before */
    void *h = dlopen(RELOAD_V1, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "%s", dlerror());
    struct ap_module *late = NULL, *noted = NULL, *unfinished = NULL;
    const struct ap_module *m;
    cr_assert_eq(ap_modules_refresh_seen(&late, &w.seen), 0);
    cr_assert_eq(list_count(late, &m), 1, "not listed by the walk before's module walk");
    cr_assert_eq(ap_modules_refresh(&late), 0);
    cr_assert_eq(list_count(late, &m), 2, "listed by the next walk");
    struct seen_walk w2 = w;
    w2.seen.lib_notes = 1; /* a library with a note seen: every object walked */
    cr_assert_eq(ap_modules_refresh_seen(&noted, &w2.seen), 0);
    cr_assert_eq(list_count(noted, &m), 2);
    w2 = w;
    w2.seen.complete = false;
    cr_assert_eq(ap_modules_refresh_seen(&unfinished, &w2.seen), 0);
    cr_assert_eq(list_count(unfinished, &m), 2);
    ap_modules_free(plain);
    ap_modules_free(alone);
    ap_modules_free(late);
    ap_modules_free(noted);
    ap_modules_free(unfinished);
    dlclose(h);
}

/* ---- threads ---------------------------------------------------------------- */

struct thread_result {
    int busy_rc, dry_rc, after_rc;
    long busy_value, after_value;
    /* with a thread again, after the apply above: the same apply (no
     * change), the other set's apply (a switch), a revert */
    int same_rc, other_rc, revert_rc;
    long same_value, other_value, revert_value;
    struct altpatch_stats same_st, busy_st;
    char log[4096];
};

static int g_pipe[2];
static struct thread_result *g_thr_out;

static int capture_thr(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level != ALTPATCH_WARN)
        return 0;
    size_t n = strlen(g_thr_out->log);
    vsnprintf(g_thr_out->log + n, sizeof(g_thr_out->log) - n, fmt, ap);
    return 0;
}

static void *waiter(void *arg)
{
    (void)arg;
    char c;
    while (read(g_pipe[0], &c, 1) < 0 && errno == EINTR)
        ;
    return NULL;
}

static void thread_body(void *out, void *ctx)
{
    (void)ctx;
    struct thread_result *r = out;
    g_thr_out = r;
    altpatch_set_print(capture_thr);
    struct altpatch_features *f = fset(F_A, -1);
    pthread_t t;
    if (pipe(g_pipe) || pthread_create(&t, NULL, waiter, NULL))
        _exit(3);
    r->busy_rc = apply_with(f, ALTPATCH_APPLY_NO_LIVE); /* the -EBUSY policy */
    r->busy_value = site_always();
    r->dry_rc = apply_with(f, ALTPATCH_APPLY_DRY_RUN);
    if (write(g_pipe[1], "x", 1) != 1)
        _exit(4);
    pthread_join(t, NULL);
    r->after_rc = apply_with(f, 0);
    r->after_value = site_always();
    /* another thread again: an apply with nothing to write asks nothing;
     * one with something to write is refused before any write */
    if (pthread_create(&t, NULL, waiter, NULL))
        _exit(5);
    r->log[0] = '\0';
    r->same_rc = apply_with(f, ALTPATCH_APPLY_NO_LIVE);
    r->same_value = site_always();
    get_stats(&r->same_st);
    struct altpatch_features *g = fset(F_B, -1); /* without F_A: ALT_NOT(F_A) sites switch */
    r->other_rc = apply_with(g, ALTPATCH_APPLY_NO_LIVE);
    r->other_value = site_not();
    r->revert_rc = apply_with(f, ALTPATCH_APPLY_NO_LIVE | ALTPATCH_APPLY_REVERT);
    r->revert_value = site_always();
    get_stats(&r->busy_st);
    if (write(g_pipe[1], "x", 1) != 1)
        _exit(6);
    pthread_join(t, NULL);
    altpatch_features_free(g);
    altpatch_features_free(f);
}

Test(apply, busy_with_a_second_thread)
{
    struct thread_result *r = ap_isolated(sizeof(*r), thread_body, NULL);
    cr_assert_eq(r->busy_rc, -EBUSY);
    cr_assert_eq(r->busy_value, 1, "nothing written while another thread runs");
    cr_assert(strstr(r->log, "2 threads running: call altpatch_apply() before starting threads"),
              "%s", r->log);
    cr_assert_eq(r->dry_rc, 0);
    cr_assert_eq(r->after_rc, 0);
    cr_assert_eq(r->after_value, 2);
    /* every site holds its final bytes: nothing to write, nothing to refuse */
    cr_assert_eq(r->same_rc, 0, "a no-change apply with another thread: %s", r->log);
    cr_assert_eq(r->same_value, 2);
    cr_assert_eq(r->same_st.bytes_written, 0);
    cr_assert_eq(r->same_st.syscalls, 0);
    cr_assert_gt(r->same_st.sites_unchanged, 0);
    /* a write is needed: refused, nothing written, the stats kept */
    cr_assert_eq(r->other_rc, -EBUSY);
    cr_assert_eq(r->other_value, 1, "ALT_NOT(F_A)'s site still holds its original");
    cr_assert_eq(r->revert_rc, -EBUSY);
    cr_assert_eq(r->revert_value, 2, "nothing reverted while another thread runs");
    cr_assert_eq(memcmp(&r->busy_st, &r->same_st, sizeof(r->same_st)), 0);
}

#if defined(RELOAD_V1) && defined(RELOAD_V4)
/* A library loaded while another thread runs: its first decision asks about
 * the threads only when it queues a write (libreload_v4's one site never
 * applies: nothing to write; libreload_v1's always does). */
struct loaded_busy_result {
    int first_rc, never_rc, always_rc, after_rc;
    long never_value, always_value, after_value;
    uint64_t never_bytes;
};

static void loaded_busy_body(void *out, void *ctx)
{
    (void)ctx;
    struct loaded_busy_result *r = out;
    altpatch_set_print(silent);
    struct altpatch_features *f = fset(F_A, -1);
    r->first_rc = apply_with(f, 0); /* alone: the program's modules settled */
    pthread_t t;
    if (pipe(g_pipe) || pthread_create(&t, NULL, waiter, NULL))
        _exit(3);
    void *hn = dlopen(RELOAD_V4, RTLD_NOW | RTLD_LOCAL);
    long (*never)(void) = hn ? (long (*)(void))dlsym(hn, "reload_value") : NULL;
    if (!never)
        _exit(4);
    r->never_rc = apply_with(f, ALTPATCH_APPLY_NO_LIVE);
    r->never_value = never();
    struct altpatch_stats st;
    get_stats(&st);
    r->never_bytes = st.bytes_written;
    void *ha = dlopen(RELOAD_V1, RTLD_NOW | RTLD_LOCAL);
    long (*always)(void) = ha ? (long (*)(void))dlsym(ha, "reload_value") : NULL;
    if (!always)
        _exit(5);
    r->always_rc = apply_with(f, ALTPATCH_APPLY_NO_LIVE);
    r->always_value = always();
    if (write(g_pipe[1], "x", 1) != 1)
        _exit(6);
    pthread_join(t, NULL);
    r->after_rc = apply_with(f, 0);
    r->after_value = always();
    altpatch_features_free(f);
}

Test(apply, busy_only_when_a_loaded_library_needs_a_write)
{
    struct loaded_busy_result *r = ap_isolated(sizeof(*r), loaded_busy_body, NULL);
    cr_assert_eq(r->first_rc, 0);
    cr_assert_eq(r->never_rc, 0, "nothing to write: the threads are not asked");
    cr_assert_eq(r->never_value, 7);
    cr_assert_eq(r->never_bytes, 0);
    cr_assert_eq(r->always_rc, -EBUSY);
    cr_assert_eq(r->always_value, 1, "nothing written while another thread runs");
    cr_assert_eq(r->after_rc, 0);
    cr_assert_eq(r->after_value, 2, "decided again and written once alone");
}
#endif

#if defined(RELOAD_V1) && defined(RELOAD_V2)
/* Later applies pin the libraries with a note from what the last complete
 * module walk found, without searching any header, as long as nothing was
 * loaded or unloaded: each library is still pinned and patched, reverted,
 * patched again; a load or an unload in between makes the walk search. */
struct pins_kept_result {
    int rc[8];
    long v1[8], v2[8];
    int known[8];
    size_t pinned[8];
};

static void pins_kept_note(struct pins_kept_result *r, int k)
{
    struct ap_pins p;
    ap_pins_take(&p);
    r->known[k] = p.seen.counted ? p.seen.noted_known : -1;
    r->pinned[k] = 0;
    for (size_t i = 0; i < p.n; i++)
        r->pinned[k] += p.h && p.h[i] != NULL;
    ap_pins_release(&p);
}

static void pins_kept_body(void *out, void *ctx)
{
    (void)ctx;
    struct pins_kept_result *r = out;
    altpatch_set_print(silent);
    struct altpatch_features *f = fset(-1);
    void *h1 = dlopen(RELOAD_V1, RTLD_NOW | RTLD_LOCAL);
    long (*v1)(void) = h1 ? (long (*)(void))dlsym(h1, "reload_value") : NULL;
    if (!v1)
        _exit(3);
    long (*v2)(void) = NULL;
    void *h2 = NULL;
    static const unsigned flags[8] = {0, ALTPATCH_APPLY_REVERT, 0, 0, ALTPATCH_APPLY_REVERT, 0,
                                      0, ALTPATCH_APPLY_REVERT};
    for (int k = 0; k < 8; k++) {
        if (k == 3) { /* a load: searched again */
            h2 = dlopen(RELOAD_V2, RTLD_NOW | RTLD_LOCAL);
            v2 = h2 ? (long (*)(void))dlsym(h2, "reload_value") : NULL;
            if (!v2)
                _exit(4);
        }
        if (k == 6) { /* an unload: searched again */
            dlclose(h2);
            v2 = NULL;
        }
        pins_kept_note(r, k);
        r->rc[k] = apply_with(f, flags[k]);
        r->v1[k] = v1();
        r->v2[k] = v2 ? v2() : 0;
    }
    altpatch_features_free(f);
}

/* Whether this C library's dl_iterate_phdr() reports the loader's counters
 * (dlpi_adds, dlpi_subs): asked here, not of the library. */
static int loader_counters_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)info;
    *(bool *)data = size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs);
    return 1;
}

Test(apply, later_applies_pin_the_libraries_the_last_walk_found)
{
    struct pins_kept_result *r = ap_isolated(sizeof(*r), pins_kept_body, NULL);
    static const long v1[8] = {2, 1, 2, 2, 1, 2, 2, 1};
    static const long v2[8] = {0, 0, 0, 3, 1, 3, 0, 0};
    static const size_t pinned[8] = {1, 1, 1, 2, 2, 2, 1, 1};
    for (int k = 0; k < 8; k++) {
        cr_assert_eq(r->rc[k], 0, "apply %d", k);
        cr_assert_eq(r->v1[k], v1[k], "apply %d: libreload_v1", k);
        cr_assert_eq(r->v2[k], v2[k], "apply %d: libreload_v2", k);
        cr_assert_eq(r->pinned[k], pinned[k], "apply %d: libraries pinned", k);
    }
    bool counters = false;
    dl_iterate_phdr(loader_counters_cb, &counters);
    if (!counters) {
        for (int k = 0; k < 8; k++)
            cr_assert_lt(r->known[k], 0, "apply %d: a kept list without the loader's counters", k);
        cr_skip_test("the C library reports no loader counters: every walk searches, nothing "
                     "kept to check");
    }
    /* the first walk of the library, a load, an unload: searched; else kept */
    static const int known[8] = {0, 1, 1, 0, 1, 1, 0, 1};
    for (int k = 0; k < 8; k++)
        cr_assert_eq(r->known[k], known[k], "apply %d: the kept libraries used", k);
}
#endif

Test(apply, busy_in_criterion_process)
{
    /* The test process itself has Criterion's second thread. */
    altpatch_set_print(silent);
    cr_assert_eq(apply_with(NULL, ALTPATCH_APPLY_NO_LIVE), -EBUSY); /* else patched live */
    cr_assert_eq(site_always(), 1);
}

#if !defined(__SANITIZE_ADDRESS__) /* the sanitizer owns calloc */
/* ---- the live writer out of memory before it looked at any write ---------- */

extern void *__libc_calloc(size_t n, size_t size);
static volatile int calloc_fail; /* armed: callocs of live items fail */
static volatile int calloc_failed;

static volatile int calloc_fail_module; /* armed: the callocs of new modules fail */

void *calloc(size_t n, size_t size)
{
    if ((calloc_fail && size == 24) || /* sizeof(struct ap_live_item), live.c */
        (calloc_fail_module && n == 1 && size == sizeof(struct ap_module))) {
        calloc_failed++;
        errno = ENOMEM;
        return NULL;
    }
    return __libc_calloc(n, size);
}

struct enomem_result {
    int rc_apply, rc_revert, rc_revert2, failed;
    struct snapshot after_revert, after_revert2;
};

static void enomem_body(void *out, void *ctx)
{
    (void)ctx;
    struct enomem_result *r = out;
    struct altpatch_features *f = fset(F_A, -1);
    r->rc_apply = apply_with(f, 0);             /* settled on the plan */
    calloc_fail = 1;
    r->rc_revert = apply_with(f, ALTPATCH_APPLY_REVERT | ALTPATCH_APPLY_LIVE);
    calloc_fail = 0;
    r->failed = calloc_failed;
    snap(&r->after_revert);
    r->rc_revert2 = apply_with(f, ALTPATCH_APPLY_REVERT); /* try again */
    snap(&r->after_revert2);
    altpatch_features_free(f);
}

Test(apply, live_writer_out_of_memory_leaves_states_as_memory)
{
    struct enomem_result *r = ap_isolated(sizeof(*r), enomem_body, NULL);
    cr_assert_eq(r->rc_apply, 0);
    cr_log_info("revert rc %d, callocs failed %d", r->rc_revert, r->failed);
    /* whatever the failed revert returned: a site listed ORIGINAL holds its original */
    for (int k = 0; k < S_COUNT; k++) {
        const struct site_view *v = &r->after_revert.s[k];
        if (v->state == ALTPATCH_SITE_ORIGINAL)
            cr_expect_arr_eq(v->current, v->original, v->len,
                             "site %d listed ORIGINAL after the failed revert, memory patched", k);
    }
    /* and the library can still revert its own bytes */
    cr_expect_eq(r->rc_revert2, 0);
    for (int k = 0; k < S_COUNT; k++) {
        const struct site_view *v = &r->after_revert2.s[k];
        cr_expect_eq(v->reason, ALTPATCH_REASON_NONE, "site %d refused (reason %d) on revert", k,
                     v->reason);
        cr_expect_arr_eq(v->current, v->original, v->len, "site %d not reverted", k);
    }
}


#if defined(RELOAD_V2) && defined(RELOAD_V3)
/* ---- a module walk out of memory after an unload ---------------------------
 * A plugin is unloaded and a build of it with other original bytes loaded at
 * the same path and address; the walk that meets it runs out of memory. The
 * next walk must still know that a library was unloaded since the last walk
 * that completed, check the sites, and plan the plugin from its own bytes. */

struct walk_enomem_result {
    char msg[160];
    uintptr_t base[2];
    int rc[3], failed;
    long value[3];
    int state, reason, found;
};

struct walk_find {
    uintptr_t lo;
    int state, reason, found;
};

static int walk_find_cb(const struct altpatch_site_info *info, void *ctx)
{
    struct walk_find *f = ctx;
    if (info->addr >= f->lo && info->addr < f->lo + 64) {
        f->state = info->state;
        f->reason = info->reason;
        f->found++;
    }
    return 0;
}

static void walk_enomem_body(void *out, void *ctx)
{
    (void)ctx;
    struct walk_enomem_result *r = out;
    struct altpatch_features *f = fset(-1);
    altpatch_set_print(NULL);
    char dir[] = "/tmp/altpatch-walk-XXXXXX", path[512];
    if (!mkdtemp(dir)) {
        snprintf(r->msg, sizeof(r->msg), "mkdtemp failed");
        return;
    }
    snprintf(path, sizeof(path), "%s/libplugin.so", dir);
    static const char *const versions[2] = {RELOAD_V2, RELOAD_V3};
    void *h = NULL;
    long (*fn)(void) = NULL;
    for (int i = 0; i < 2; i++) {
        if (h)
            dlclose(h);
        h = ap_copy_file(versions[i], path) ? NULL : dlopen(path, RTLD_NOW | RTLD_LOCAL);
        fn = h ? (long (*)(void))dlsym(h, "reload_value") : NULL;
        Dl_info di;
        if (!fn || !dladdr((void *)fn, &di)) {
            snprintf(r->msg, sizeof(r->msg), "loading %s failed", versions[i]);
            goto out;
        }
        r->base[i] = (uintptr_t)di.dli_fbase;
        if (i == 0) {
            r->rc[0] = apply_with(f, 0); /* the walk records the loader's counters */
            r->value[0] = fn();
        }
    }
    calloc_fail_module = 1;
    ap_mem_use_region(false); /* the module's block from calloc() */
    r->rc[1] = apply_with(f, 0); /* the new plugin's module cannot be built */
    ap_mem_use_region(true);
    calloc_fail_module = 0;
    r->failed = calloc_failed;
    r->value[1] = fn();
    r->rc[2] = apply_with(f, 0);
    r->value[2] = fn();
    struct walk_find wf = {(uintptr_t)fn, -1, -1, 0};
    altpatch_site_foreach(walk_find_cb, &wf);
    r->state = wf.state;
    r->reason = wf.reason;
    r->found = wf.found;
out:
    if (h)
        dlclose(h);
    unlink(path);
    rmdir(dir);
    altpatch_features_free(f);
}

Test(apply, failed_module_walk_keeps_the_unload_for_the_next)
{
    struct walk_enomem_result *r = ap_isolated(sizeof(*r), walk_enomem_body, NULL);
    cr_assert_eq(r->msg[0], '\0', "%s", r->msg);
    cr_assert_eq(r->base[1], r->base[0], "the loader did not reuse the address: nothing tested");
    cr_assert_eq(r->rc[0], 0);
    cr_assert_eq(r->value[0], 3, "the first build patched");
    if (!r->failed && ap_under_valgrind())
        cr_skip_test("valgrind's calloc replaces this file's: no allocation failed");
    cr_assert_eq(r->rc[1], -ENOMEM, "the walk out of memory: %d", r->rc[1]);
    cr_assert_gt(r->failed, 0);
    cr_assert_eq(r->value[1], 7, "nothing written by the failed apply");
    cr_assert_eq(r->rc[2], 0, "apply after: %d", r->rc[2]);
    cr_assert_eq(r->found, 1);
    cr_assert_eq(r->value[2], 3, "the second build planned from its own original");
    cr_assert_eq(r->state, ALTPATCH_SITE_PATCHED, "state %d, %s", r->state,
                 altpatch_strreason(r->reason));
}
#endif

#endif

/* ---- random sequences: states agree with memory after every step ---------- */

struct rseq_result {
    int denied;
    int foreign; /* foreign bytes put in place or taken back */
    int bad;         /* first failing step + 1, or 0 */
    char why[256];
};

static long rseq_expect(int k, int set, bool revert)
{
    /* set: 0 none, 1 F_A, 2 F_B, 3 F_A+F_B */
    bool a = set & 1, b = set & 2;
    if (revert)
        return k == S_TWO ? 0 : 1;
    switch (k) {
    case S_ALWAYS:
    case S_TWIN: return 2;
    case S_TWO: return a ? 0xffffffffL : 0;
    case S_NOT: return a ? 1 : 2;
    default: return b ? 3 : a ? 2 : 1;
    }
}

static void rseq_body(void *out, void *ctx)
{
    struct rseq_result *r = out;
    unsigned seed = *(unsigned *)ctx;
    struct altpatch_features *sets[4] = {fset(-1), fset(F_A, -1), fset(F_B, -1),
                                         fset(F_A, F_B, -1)};
    altpatch_set_print(NULL);
    int fd = open("/proc/self/mem", O_RDWR);
    struct snapshot sn;
    /* one sequence in four starts with the module undecided (its first apply
     * is the sequence's); the others with a dry run that lists the sites */
    memset(&sn, 0, sizeof(sn));
    if (seed % 4 != 3) {
        if (apply_with(sets[0], ALTPATCH_APPLY_DRY_RUN))
            _exit(6);
        snap(&sn);
    }
    bool foreign[S_COUNT] = {0};
    uint8_t saved[S_COUNT];
    if (seed % 3 == 0)
        setenv("ALTPATCH_DEBUG", "1", 1);
    /* denied writes by MDWE, except under valgrind (it would stop valgrind's own
     * code generation) */
    bool mdwe = (seed & 1) && !ap_under_valgrind() && ap_mdwe_set() == 0;
    /* where the kernel refuses /proc/self/mem writes to text: no foreign
     * bytes, and under MDWE every write is denied (the fallback is refused) */
    bool procmem = ap_procmem_can_write_text();
    for (int step = 0; step < 60 && !r->bad; step++) {
        unsigned op = (unsigned)rand_r(&seed) % 8;
        int set = rand_r(&seed) % 4;
        int k = rand_r(&seed) % S_COUNT;
        if (op == 6 && k != S_TWO) { /* someone else's immediate byte at a mov site (or taken back) */
            if (!sn.s[k].found || !procmem)
                continue; /* no apply yet (the sites are not listed), or no way to write */
            uint8_t b = 0x42;
            off_t at = (off_t)(sn.s[k].addr + 1);
            if (!foreign[k]) {
                if (pread(fd, &saved[k], 1, at) != 1 || pwrite(fd, &b, 1, at) != 1)
                    _exit(5);
            } else if (pwrite(fd, &saved[k], 1, at) != 1) {
                _exit(5);
            }
            foreign[k] = !foreign[k];
            r->foreign++;
            continue;
        }
        unsigned flags = op == 1 || op == 2 ? ALTPATCH_APPLY_REVERT : 0;
        if (op == 3 || op == 4)
            flags |= ALTPATCH_APPLY_DRY_RUN;
        if (mdwe && (op == 5 || op == 2))
            flags |= ALTPATCH_APPLY_NO_PROCMEM; /* its writes are denied */
        if (op == 4)
            flags |= ALTPATCH_APPLY_REVERT;
        int rc = apply_with(sets[set], flags);
        struct altpatch_stats st;
        get_stats(&st);
        snap(&sn);
        if (rc) {
            r->bad = step + 1;
            snprintf(r->why, sizeof(r->why), "step %d op %u: rc %d", step, op, rc);
            break;
        }
        unsigned patched = 0, refused = 0;
        for (int j = 0; j < S_COUNT; j++) {
            refused += sn.s[j].state == ALTPATCH_SITE_REFUSED;
            const struct site_view *v = &sn.s[j];
            bool cur_orig = !memcmp(v->current, v->original, v->len);
            patched += v->state == ALTPATCH_SITE_PATCHED;
            r->denied += v->reason == ALTPATCH_REASON_WRITE_DENIED;
            if (flags & ALTPATCH_APPLY_DRY_RUN)
                continue;
            const char *err = NULL;
            if (foreign[j] && v->state != ALTPATCH_SITE_REFUSED)
                err = "foreign bytes not refused";
            else if (!foreign[j] && v->state == ALTPATCH_SITE_REFUSED &&
                     !(((flags & ALTPATCH_APPLY_NO_PROCMEM) || (mdwe && !procmem)) &&
                       v->reason == ALTPATCH_REASON_WRITE_DENIED))
                err = "refused without a foreign change";
            else if (v->state == ALTPATCH_SITE_ORIGINAL && !cur_orig)
                err = "ORIGINAL but memory is not";
            else if (v->state == ALTPATCH_SITE_PATCHED && cur_orig)
                err = "PATCHED but memory holds the original";
            else if (!foreign[j] && v->state != ALTPATCH_SITE_REFUSED && sn.value[j] != rseq_expect(j, set, flags & ALTPATCH_APPLY_REVERT))
                err = "wrong value";
            if (err) {
                r->bad = step + 1;
                snprintf(r->why, sizeof(r->why), "step %d op %u set %d site %d: %s (state %d value %ld)",
                         step, op, set, j, err, v->state, sn.value[j]);
                break;
            }
        }
        (void)patched;
        if (!r->bad && (st.sites_refused != refused ||
                        st.sites_patched != sn.npatched || st.sites_seen != sn.nsites)) {
            r->bad = step + 1;
            snprintf(r->why, sizeof(r->why), "step %d op %u set %d: stats patched %llu seen %llu, listed %u of %u",
                     step, op, set, (unsigned long long)st.sites_patched,
                     (unsigned long long)st.sites_seen, sn.npatched, sn.nsites);
        }
    }
    close(fd);
    for (int i = 0; i < 4; i++)
        altpatch_features_free(sets[i]);
}

Test(apply, random_sequences_states_agree_with_memory)
{
    /* 300 sequences; 60 under valgrind (a fork there costs ~0.3 s) */
    unsigned nseeds = ap_under_valgrind() ? 60 : 300;
    /* asked once, here: the children inherit the answer */
    bool procmem = ap_procmem_can_write_text();
    unsigned foreign = 0;
    for (unsigned seed = 1; seed <= nseeds; seed++) {
        struct rseq_result *r = ap_isolated(sizeof(*r), rseq_body, &seed);
        cr_expect_eq(r->bad, 0, "seed %u: %s", seed, r->why);
        foreign += (unsigned)r->foreign;
        if (seed < 4)
            cr_log_info("seed %u: denied %d, foreign %d", seed, r->denied, r->foreign);
    }
    /* foreign bytes are put through /proc/self/mem: the sequences had some
     * wherever the kernel lets that write text, none elsewhere */
    if (procmem)
        cr_expect_gt(foreign, nseeds, "%u foreign changes in %u sequences", foreign, nseeds);
    else
        cr_expect_eq(foreign, 0);
}
