/* SPDX-License-Identifier: MIT */
/*
 * Sites in shared libraries: libapfix_linked.so (DT_NEEDED of this test),
 * libapfix_dl.so (dlopen'ed after the first apply, then dlclose'd) and
 * libapfix_big.so and libapfix_shapes.so (dlopen'ed). All are
 * testdata/apfix_mod.c. Bodies that
 * apply run in a fork()ed child.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <link.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_mseal
#define SYS_mseal 462 /* x86-64 */
#endif

#include "ap_expect.h"
#include "ap_isolate.h"
#include "ap_mdwe.h"
#include "ap_modwalk.h"

static void body_linked(void *out, void *ctx)
{
    struct mres *r = out;
    (void)ctx;
    r->val[0] = apfix_linked_call(1); /* run unpatched first */
    r->rc[0] = altpatch_apply();
    size_t n;
    const struct apx_call *c = apfix_linked_calls(&n);
    walk_module(r, 0, "libapfix_linked", c, n);
    r->val[1] = apfix_linked_call(1);
    r->val[2] = apfix_linked_call2(1);
    apfix_linked_fence();
    r->flag[0] = apfix_linked_fs() == (void *)pthread_self();
}

Test(modules, linked_library_patched)
{
    struct mres *r = ap_isolated(sizeof(*r), body_linked, NULL);
    assert_patched(r, 0, "libapfix_linked.so");
    cr_assert_eq(r->kinds_fs[0], 1);
    cr_assert_eq(r->val[0], 2, "unpatched call must reach old_impl");
    cr_assert_eq(r->val[1], 3, "patched call must reach new_impl");
    cr_assert_eq(r->val[2], 5, "patched call to hidden globals must reach apfix_linked_new2");
    cr_assert(r->flag[0], "fs_self in the library != pthread_self()");
}

/* dlopen'ed after the first apply: patched at the next apply (or at once
 * with altpatch_dlopen: ctx != NULL). */
static void body_dl(void *out, void *ctx)
{
    struct mres *r = out;
    r->rc[0] = altpatch_apply();
    void *h = ctx ? altpatch_dlopen(APFIX_DL_PATH, RTLD_NOW) : dlopen(APFIX_DL_PATH, RTLD_NOW);
    if (!h) {
        snprintf(r->msg, sizeof(r->msg), "dlopen: %s", dlerror());
        r->rc[1] = -1;
        return;
    }
    call_fn call = (call_fn)dlsym(h, "apfix_dl_call");
    calls_fn calls = (calls_fn)dlsym(h, "apfix_dl_calls");
    fs_fn fs = (fs_fn)dlsym(h, "apfix_dl_fs");
    size_t n;
    const struct apx_call *c = calls(&n);
    r->val[0] = call(1); /* before the second apply */
    r->rc[1] = altpatch_apply();
    walk_module(r, 1, "libapfix_dl", c, n);
    r->val[1] = call(1);
    r->flag[0] = fs() == (void *)pthread_self();
    walk_module(r, 0, "libapfix_linked", apfix_linked_calls(&n), n);
    r->rc[0] |= r->rc[1];

    /* dlclose: the module is gone, apply and the walk still work. */
    r->flag[1] = dlclose(h) == 0;
    r->rc[2] = altpatch_apply();
    struct mwalk gone = {"libapfix_dl", NULL, 0, 0, 0, 0, 0, r->msg, sizeof(r->msg)};
    r->flag[2] = altpatch_site_foreach(mod_one, &gone) == 0;
    r->sites[2] = gone.sites;
    r->patched[2] = 0;
    walk_module(r, 3, "libapfix_linked", apfix_linked_calls(&n), n);
    r->rc[3] = r->rc[2];

    /* Loaded again (maybe at the same address): patched again. */
    h = dlopen(APFIX_DL_PATH, RTLD_NOW);
    if (!h)
        return;
    call = (call_fn)dlsym(h, "apfix_dl_call");
    r->val[2] = call(1);
    r->flag[3] = altpatch_apply() == 0;
    r->val[3] = call(1);
    dlclose(h);
    r->flag[4] = altpatch_apply() == 0;
}

static void assert_dl(struct mres *r, bool at_once)
{
    cr_assert_eq(r->rc[1], 0, "%s", r->msg);
    if (at_once)
        cr_assert_eq(r->val[0], 3, "altpatch_dlopen must patch at once");
    else
        cr_assert_eq(r->val[0], 2, "plain dlopen: original until the next apply");
    assert_patched(r, 1, "libapfix_dl.so");
    assert_patched(r, 0, "libapfix_linked.so");
    cr_assert_eq(r->val[1], 3, "patched call must reach new_impl");
    cr_assert(r->flag[0], "fs_self in the library != pthread_self()");
    cr_assert(r->flag[1], "dlclose failed");
    cr_assert_eq(r->rc[2], 0, "apply after dlclose returned %d", r->rc[2]);
    cr_assert(r->flag[2], "site walk after dlclose failed");
    cr_assert_eq(r->sites[2], 0, "%u sites of the closed library still listed", r->sites[2]);
    assert_patched(r, 3, "libapfix_linked.so after dlclose of the other");
    cr_assert_eq(r->val[2], 2, "reloaded library runs its original first");
    cr_assert(r->flag[3] && r->flag[4]);
    cr_assert_eq(r->val[3], 3, "reloaded library patched at the next apply");
}

Test(modules, dlopen_then_apply)
{
    struct mres *r = ap_isolated(sizeof(*r), body_dl, NULL);
    assert_dl(r, false);
}

Test(modules, altpatch_dlopen_patches_at_once)
{
    struct mres *r = ap_isolated(sizeof(*r), body_dl, (void *)1);
    assert_dl(r, true);
}

Test(modules, altpatch_dlopen_missing_file)
{
    cr_assert_null(altpatch_dlopen("/nonexistent/libapfix_none.so", RTLD_NOW));
    cr_assert_not_null(dlerror());
}

/*
 * Two modules decided for the first time in one apply: libapfix_dl.so
 * dlopen'ed before it. Both are the same source, so one module's records are
 * fewer than the sites of both: every write of the apply still lands, each
 * site of each module holds what its plan says and runs it.
 */
static void body_two_first(void *out, void *ctx)
{
    struct mres *r = out;
    (void)ctx;
    void *h = mod_dlopen(APFIX_DL_PATH, r->msg, sizeof(r->msg));
    if (!h) {
        r->rc[0] = -1;
        return;
    }
    call_fn call = (call_fn)dlsym(h, "apfix_dl_call");
    calls_fn calls = (calls_fn)dlsym(h, "apfix_dl_calls");
    fs_fn fs = (fs_fn)dlsym(h, "apfix_dl_fs");
    r->val[0] = call(1) + 10 * apfix_linked_call(1); /* both unpatched first */
    r->rc[0] = r->rc[1] = altpatch_apply();
    struct altpatch_stats st = {.sz = sizeof(st)};
    altpatch_get_stats(&st);
    size_t n;
    const struct apx_call *c = calls(&n);
    walk_module(r, 1, "libapfix_dl", c, n);
    c = apfix_linked_calls(&n);
    walk_module(r, 0, "libapfix_linked", c, n);
    r->val[1] = call(1) + 10 * apfix_linked_call(1);
    r->flag[0] = fs() == (void *)pthread_self() && apfix_linked_fs() == (void *)pthread_self();
    r->val[2] = (long)st.sites_seen;
    r->val[3] = (long)st.sites_patched;
    r->val[4] = (long)st.modules;
    r->val[5] = (long)st.sites_refused;
}

Test(modules, two_modules_first_decided_in_one_apply)
{
    struct mres *r = ap_isolated(sizeof(*r), body_two_first, NULL);
    cr_assert_eq(r->val[0], 22, "both unpatched: old_impl (%s)", r->msg);
    assert_patched(r, 0, "libapfix_linked.so");
    assert_patched(r, 1, "libapfix_dl.so");
    cr_assert_eq(r->sites[0], r->sites[1], "the same module twice");
    cr_assert_eq(r->val[1], 33, "both patched: new_impl");
    cr_assert(r->flag[0], "fs_self != pthread_self()");
    cr_assert_eq(r->val[4], 2, "two modules");
    cr_assert_eq(r->val[2], (long)(r->sites[0] + r->sites[1]));
    cr_assert_eq(r->val[3], (long)(r->patched[0] + r->patched[1]));
    cr_assert_eq(r->val[5], 0);
}

/* Records of the module whose path contains @p p's name (sum of each site's). */
struct rcount {
    const char *module;
    unsigned sites, records;
};

static int count_one(const struct altpatch_site_info *s, void *p)
{
    struct rcount *c = p;
    if (strstr(s->module, c->module)) {
        c->sites++;
        c->records += s->entries;
    }
    return 0;
}

typedef uint64_t (*tsc_fn)(void);

/*
 * Three modules decided for the first time in one apply: libapfix_big.so
 * (more records than the others, three of its sites with two each) dlopen'ed
 * after libapfix_linked.so, then libapfix_dl.so. The write queue lies over
 * the records of the one with the most, decided before the others though
 * last but one in load order; it has fewer records than the three have
 * sites, so its block grows first. Every site of every module holds what its
 * plan says.
 */
static void body_three_first(void *out, void *ctx)
{
    struct mres *r = out;
    (void)ctx;
    void *big = mod_dlopen(APFIX_BIG_PATH, r->msg, sizeof(r->msg));
    void *dl = big ? mod_dlopen(APFIX_DL_PATH, r->msg, sizeof(r->msg)) : NULL;
    if (!dl) {
        r->rc[3] = -1;
        return;
    }
    call_fn bcall = (call_fn)dlsym(big, "apfix_big_call");
    call_fn dcall = (call_fn)dlsym(dl, "apfix_dl_call");
    tsc_fn tsc = (tsc_fn)dlsym(big, "apfix_big_tsc");
    r->val[0] = bcall(1) + 10 * dcall(1) + 100 * apfix_linked_call(1); /* unpatched */
    r->rc[0] = r->rc[1] = r->rc[2] = altpatch_apply();
    struct rcount c[3] = {{"libapfix_linked", 0, 0}, {"libapfix_big", 0, 0}, {"libapfix_dl", 0, 0}};
    for (int i = 0; i < 3; i++)
        if (altpatch_site_foreach(count_one, &c[i]))
            r->rc[3] = -1;
    struct altpatch_stats st = {.sz = sizeof(st)};
    altpatch_get_stats(&st);
    size_t n;
    const struct apx_call *calls = apfix_linked_calls(&n);
    walk_module(r, 0, "libapfix_linked", calls, n);
    calls = ((calls_fn)dlsym(big, "apfix_big_calls"))(&n);
    walk_module(r, 1, "libapfix_big", calls, n);
    calls = ((calls_fn)dlsym(dl, "apfix_dl_calls"))(&n);
    walk_module(r, 2, "libapfix_dl", calls, n);
    r->val[1] = bcall(1) + 10 * dcall(1) + 100 * apfix_linked_call(1);
    r->val[2] = tsc() != 0;
    r->val[3] = (long)st.sites_seen;
    r->val[4] = (long)st.modules;
    r->val[5] = (long)st.sites_refused;
    r->val[6] = (long)c[1].records;
    r->val[7] = (long)(c[0].sites + c[1].sites + c[2].sites);
    r->flag[0] = (int)c[0].records;
    r->flag[1] = (int)c[2].records;
    r->flag[2] = (int)(c[1].records - c[1].sites);
}

Test(modules, module_with_most_records_decided_first)
{
    struct mres *r = ap_isolated(sizeof(*r), body_three_first, NULL);
    cr_assert_eq(r->rc[3], 0, "%s", r->msg);
    /* the premise: libapfix_big.so has the most records, in sites of two
     * (three of them), and fewer than the three modules have sites */
    cr_assert_gt(r->val[6], r->flag[0], "libapfix_big: %ld records, libapfix_linked: %d",
                 r->val[6], r->flag[0]);
    cr_assert_gt(r->val[6], r->flag[1]);
    cr_assert_eq(r->flag[2], 3, "three sites of two records");
    cr_assert_gt(r->val[7], r->val[6], "%ld sites, %ld records in the queue's module", r->val[7],
                 r->val[6]);
    cr_assert_eq(r->val[0], 222, "all unpatched: old_impl (%s)", r->msg);
    assert_patched(r, 0, "libapfix_linked.so");
    assert_patched(r, 1, "libapfix_big.so");
    assert_patched(r, 2, "libapfix_dl.so");
    cr_assert_eq(r->sites[1], r->sites[0] + 3, "three more sites");
    cr_assert_eq(r->val[3], r->val[7], "every site seen");
    cr_assert_eq(r->val[4], 3, "three modules");
    cr_assert_eq(r->val[5], 0, "nothing refused");
    cr_assert_eq(r->val[1], 333, "all patched: new_impl");
    cr_assert_eq(r->val[2], 1, "the time stamp sites run");
}

/* Per module: sites whose write was denied, sites holding their original. */
struct dwalk {
    const char *module;
    unsigned sites, denied, original, patched;
};

static int denied_one(const struct altpatch_site_info *s, void *p)
{
    struct dwalk *w = p;
    if (!strstr(s->module, w->module))
        return 0;
    w->sites++;
    w->denied += s->state == ALTPATCH_SITE_REFUSED && s->reason == ALTPATCH_REASON_WRITE_DENIED;
    w->original += s->original && memcmp(s->current, s->original, s->len) == 0;
    w->patched += s->state == ALTPATCH_SITE_PATCHED;
    return 0;
}

struct denied2_result {
    int set, rc;
    long val[2];
    struct altpatch_stats st;
    struct dwalk w[2];
    char msg[256];
};

/*
 * The same two first decisions with every write denied (PR_SET_MDWE: no
 * mprotect window; /proc/self/mem not allowed): each module reports its own
 * sites refused, memory and the next plan's view of it hold the originals.
 */
static void body_two_first_denied(void *out, void *ctx)
{
    struct denied2_result *r = out;
    (void)ctx;
    void *h = mod_dlopen(APFIX_DL_PATH, r->msg, sizeof(r->msg));
    if (!h) {
        r->rc = -1;
        return;
    }
    call_fn call = (call_fn)dlsym(h, "apfix_dl_call");
    altpatch_set_print(NULL); /* the refusals are expected */
    r->set = ap_mdwe_set();
    if (r->set)
        return;
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_NO_PROCMEM};
    r->rc = altpatch_apply_opts(&o);
    r->st.sz = sizeof(r->st);
    altpatch_get_stats(&r->st);
    r->w[0] = (struct dwalk){.module = "libapfix_linked"};
    r->w[1] = (struct dwalk){.module = "libapfix_dl"};
    for (int i = 0; i < 2; i++)
        if (altpatch_site_foreach(denied_one, &r->w[i]))
            r->rc = -1;
    r->val[0] = call(1);
    r->val[1] = apfix_linked_call(1);
}

Test(modules, two_first_decisions_with_writes_denied)
{
    ap_mdwe_skip_under_valgrind();
    struct denied2_result *r = ap_isolated(sizeof(*r), body_two_first_denied, NULL);
    ap_mdwe_require(r->set);
    cr_assert_eq(r->rc, 0, "%s", r->msg);
    cr_assert_eq(r->st.bytes_written, 0);
    cr_assert_eq(r->st.sites_patched, 0, "every write denied");
    for (int i = 0; i < 2; i++) {
        cr_assert_geq(r->w[i].sites, 4, "%s", r->w[i].module);
        cr_assert_eq(r->w[i].original, r->w[i].sites, "%s: originals kept", r->w[i].module);
        cr_assert_eq(r->w[i].patched, 0, "%s", r->w[i].module);
        /* the call sites (ALWAYS) need a write under any feature set */
        cr_assert_geq(r->w[i].denied, 1, "%s: a denied write reported", r->w[i].module);
    }
    cr_assert_eq(r->w[0].denied, r->w[1].denied, "the same module twice");
    cr_assert_eq(r->st.sites_refused, r->w[0].denied + r->w[1].denied);
    cr_assert_eq(r->val[0], 2, "original call kept");
    cr_assert_eq(r->val[1], 2, "original call kept");
}

/* The executable segment of the loaded module whose path contains data's name. */
struct seg_find {
    const char *name;
    uintptr_t start, end;
};

static int seg_one(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct seg_find *f = data;
    if (!info->dlpi_name || !strstr(info->dlpi_name, f->name))
        return 0;
    for (size_t i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
            f->start = (info->dlpi_addr + ph->p_vaddr) & ~(pg - 1);
            f->end = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz + pg - 1) & ~(pg - 1);
            return 1;
        }
    }
    return 0;
}

struct partial_result {
    int seal, rc;
    long val[2];
    struct altpatch_stats st;
    struct dwalk w[2];
    struct mres m;
};

/* Which module is sealed: the dlopen'ed one (at @c path, its symbols
 * apfix_<name>_*) or libapfix_linked.so. */
struct partial_case {
    const char *path, *name;
    bool seal_linked;
};

/*
 * Two first decisions, one module's text sealed (mseal(2): mprotect refused)
 * and /proc/self/mem not allowed: one apply's queue holds writes that land
 * and writes the OS denies. Each module's sites report what memory holds;
 * w[0], m and val[1] are the writable module's, w[1] and val[0] the sealed
 * one's.
 */
static void body_partial(void *out, void *ctx)
{
    struct partial_result *r = out;
    const struct partial_case *pc = ctx;
    void *h = dlopen(pc->path, RTLD_NOW);
    char dlname[64], sym[96];
    snprintf(dlname, sizeof(dlname), "libapfix_%s", pc->name);
    const char *sealed = pc->seal_linked ? "libapfix_linked" : dlname;
    const char *open = pc->seal_linked ? dlname : "libapfix_linked";
    struct seg_find f = {sealed, 0, 0};
    if (!h || !dl_iterate_phdr(seg_one, &f)) {
        r->rc = -1;
        return;
    }
    snprintf(sym, sizeof(sym), "apfix_%s_call", pc->name);
    call_fn call = (call_fn)dlsym(h, sym);
    snprintf(sym, sizeof(sym), "apfix_%s_calls", pc->name);
    calls_fn calls = (calls_fn)dlsym(h, sym);
    altpatch_set_print(NULL); /* the refusals are expected */
    r->seal = syscall(SYS_mseal, f.start, f.end - f.start, 0) ? -errno : 0;
    if (r->seal)
        return;
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_NO_PROCMEM};
    r->rc = altpatch_apply_opts(&o);
    r->st.sz = sizeof(r->st);
    altpatch_get_stats(&r->st);
    r->w[0] = (struct dwalk){.module = open};
    r->w[1] = (struct dwalk){.module = sealed};
    for (int i = 0; i < 2; i++)
        if (altpatch_site_foreach(denied_one, &r->w[i]))
            r->rc = -1;
    size_t n;
    const struct apx_call *c = pc->seal_linked ? calls(&n) : apfix_linked_calls(&n);
    walk_module(&r->m, 0, open, c, n);
    long dl = call(1), linked = apfix_linked_call(1);
    r->val[0] = pc->seal_linked ? linked : dl;
    r->val[1] = pc->seal_linked ? dl : linked;
}

static void assert_partial(const struct partial_case *pc)
{
    struct partial_result *r = ap_isolated(sizeof(*r), body_partial, (void *)pc);
    if (r->seal == -ENOSYS || r->seal == -EPERM || r->seal == -EINVAL)
        cr_skip_test("no mseal(2) here (%d)", r->seal);
    cr_assert_eq(r->seal, 0);
    cr_assert_eq(r->rc, 0);
    /* the writable module: every site as its plan says, nothing refused */
    cr_assert_eq(r->m.bad[0], 0, "%s", r->m.msg);
    cr_assert_geq(r->m.sites[0], 4);
    cr_assert_eq(r->w[0].denied, 0);
    cr_assert_geq(r->w[0].patched, 1);
    cr_assert_eq(r->val[1], 3, "patched call in the writable module");
    /* the sealed module: the writes denied, the originals kept */
    cr_assert_geq(r->w[1].denied, 1);
    cr_assert_eq(r->w[1].patched, 0);
    cr_assert_eq(r->w[1].original, r->w[1].sites);
    cr_assert_eq(r->val[0], 2, "original call in the sealed module");
    cr_assert_eq(r->st.sites_refused, r->w[1].denied);
    cr_assert_eq(r->st.sites_patched, r->w[0].patched);
    cr_assert_gt(r->st.bytes_written, 0);
}

/* Sealed: libapfix_dl.so, decided second (its sites follow the plans made
 * for libapfix_linked.so's of the same shapes). */
Test(modules, first_decisions_with_some_writes_denied)
{
    static const struct partial_case pc = {APFIX_DL_PATH, "dl", false};
    assert_partial(&pc);
}

/* Sealed: libapfix_linked.so, decided first (the same records as the other
 * module, loaded before it): writes planned one by one and writes that
 * follow a plan denied in the module whose records hold the queue. */
Test(modules, first_decided_module_with_writes_denied)
{
    static const struct partial_case pc = {APFIX_DL_PATH, "dl", true};
    assert_partial(&pc);
}

/*
 * Sealed: libapfix_shapes.so, decided first (more records), each of its
 * sites the first of its shape: every write it needs is planned one by one
 * and denied. libapfix_linked.so's sites follow those plans and their writes
 * land: the writer wrote as many bytes as the writes that need no look after
 * it, yet the denied ones must still report.
 */
Test(modules, planned_writes_denied_where_the_others_land)
{
    static const struct partial_case pc = {APFIX_SHAPES_PATH, "shapes", false};
    assert_partial(&pc);
}
