/* SPDX-License-Identifier: MIT */
/*
 * Applies racing dlclose(): a thread loads and unloads libapfix_dl.so in a
 * loop while the main thread runs dry runs and live applies. Every module is
 * pinned (a dlopen reference) for the whole apply, so the site and
 * replacement bytes the apply reads and writes stay mapped; a module already
 * gone is skipped. Without the pin the apply reads unmapped memory (SIGSEGV).
 *
 * The body runs in a fork()ed child (ap_isolate.h); the parent asserts that
 * it exited normally and on the counts it reports.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>

#include <altpatch/altpatch.h>

#include "ap_isolate.h"

#define DRY_LOADS 4000 /* dry runs only until the churn thread loaded this often */
#define LIVE_ROUNDS 1000 /* then live applies and dry runs alternate */
#define MAX_DRY 2000000 /* bound on the first phase, whatever the churn rate */

struct race_result {
    unsigned long loads;     /* dlopen+dlclose pairs done by the churn thread */
    unsigned long dry_ok, dry_bad;
    unsigned long live_ok, live_busy, live_bad;
    int first_bad;
    int dlopen_failed;
};

static atomic_int race_stop;
static atomic_ulong race_loads;

static void *churn(void *arg)
{
    struct race_result *r = arg;
    while (!atomic_load(&race_stop)) {
        void *h = dlopen(APFIX_DL_PATH, RTLD_NOW);
        if (!h) {
            r->dlopen_failed = 1;
            break;
        }
        dlclose(h);
        r->loads = (unsigned long)atomic_fetch_add(&race_loads, 1) + 1;
    }
    return NULL;
}

static int quiet(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    (void)fmt;
    (void)ap;
    return 0;
}

static void count(struct race_result *r, int rc, bool live)
{
    if (!live) {
        r->dry_ok += rc == 0;
        r->dry_bad += rc != 0;
    } else if (rc == 0) {
        r->live_ok++;
    } else if (rc == -EBUSY) {
        r->live_busy++; /* the live protocol cannot run here: not this test's subject */
        return;
    } else {
        r->live_bad++;
    }
    if (rc && !r->first_bad)
        r->first_bad = rc;
}

static void race_body(void *out, void *ctx)
{
    struct race_result *r = out;
    (void)ctx;
    altpatch_set_print(quiet);
    pthread_t t;
    if (pthread_create(&t, NULL, churn, r) != 0)
        _exit(3);
    unsigned long dry = 0;
    while (atomic_load(&race_loads) < DRY_LOADS && dry < MAX_DRY && !r->dlopen_failed) {
        struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_DRY_RUN};
        count(r, altpatch_apply_opts(&o), false);
        dry++;
    }
    for (int i = 0; i < LIVE_ROUNDS; i++) {
        bool live = i % 2;
        struct altpatch_apply_opts o = {
            .sz = sizeof(o),
            .flags = live ? ALTPATCH_APPLY_LIVE | (i % 4 == 1 ? ALTPATCH_APPLY_REVERT : 0)
                          : ALTPATCH_APPLY_DRY_RUN};
        count(r, altpatch_apply_opts(&o), live);
    }
    atomic_store(&race_stop, 1);
    pthread_join(t, NULL);
}

Test(race, apply_while_dlclose)
{
    struct race_result *r = ap_isolated(sizeof(*r), race_body, NULL);
    cr_assert_eq(r->dlopen_failed, 0, "dlopen " APFIX_DL_PATH);
    cr_log_info("loads %lu, dry runs %lu, live applies %lu (+%lu -EBUSY)", r->loads, r->dry_ok,
                r->live_ok, r->live_busy);
    cr_assert_gt(r->loads, 0, "the churn thread ran");
    cr_assert_eq(r->dry_bad, 0, "dry runs: %lu ok, %lu failed (first error %d)",
                 r->dry_ok, r->dry_bad, r->first_bad);
    cr_assert_eq(r->live_bad, 0, "live applies: %lu failed (first error %d)", r->live_bad,
                 r->first_bad);
    cr_assert_eq(r->live_ok + r->live_busy, LIVE_ROUNDS / 2);
}
