/* SPDX-License-Identifier: MIT */
/*
 * Unwinding through an ALTPATCH_ALT_CALL site, before and after apply:
 * backtrace(3) and _Unwind_Backtrace() called in the callee see the frames
 * above the function that holds the site, and pthread_cancel() of a thread
 * blocked in the callee runs the cleanup handler pushed by the site's caller
 * (this file is built with -fexceptions, so that handler is an unwinding
 * cleanup) and ends the thread with PTHREAD_CANCELED.
 *
 * The site is ALTPATCH_ALT_CALL(cb_old, cb_new, ALWAYS): "after apply" means
 * apply for a set that holds ALWAYS, whatever the host, so the replacement is
 * the one that runs (checked by the value the site returns). Every scenario
 * runs in a fork()ed child (ap_isolate.h) that reports through a shared block.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <unwind.h>

#include <altpatch/primitives.h>

#include "ap_isolate.h"

enum mode { M_VALUE, M_BACKTRACE, M_UNWIND, M_BLOCK };

#define MAXFRAMES 64

/* What the callee saw; written by the callee, read by the child's checks. */
static struct {
    enum mode mode;
    void *frames[MAXFRAMES];
    int nframes;
    sem_t entered;
} cb;

static _Unwind_Reason_Code collect(struct _Unwind_Context *ctx, void *arg)
{
    (void)arg;
    if (cb.nframes >= MAXFRAMES)
        return _URC_END_OF_STACK;
    cb.frames[cb.nframes++] = (void *)_Unwind_GetIP(ctx);
    return _URC_NO_REASON;
}

/* The action common to both targets of the site. */
static __attribute__((noinline)) long cb_act(long x)
{
    switch (cb.mode) {
    case M_VALUE:
        break;
    case M_BACKTRACE:
        cb.nframes = backtrace(cb.frames, MAXFRAMES);
        break;
    case M_UNWIND:
        cb.nframes = 0;
        _Unwind_Backtrace(collect, NULL);
        break;
    case M_BLOCK:
        sem_post(&cb.entered);
        for (;;)
            pause(); /* a cancellation point */
    }
    return x;
}

static long cb_old(long x) { return cb_act(x) + 1000; }
static long cb_new(long x) { return cb_act(x) + 2000; }

/* Return addresses that a walk through the site's frame must report. */
static void *ra_holder; /* in the caller of site_holder() */
static void *ra_driver; /* in the caller of driver() */

/* The function that holds the site (noinline: its own frame, one copy). */
static __attribute__((noinline)) long site_holder(long x)
{
    ra_holder = __builtin_return_address(0);
    long r = ALTPATCH_ALT_CALL(cb_old, cb_new, X86_FEATURE_ALWAYS, x);
    __asm__ __volatile__("" ::: "memory"); /* no tail position for the site */
    return r;
}

static __attribute__((noinline)) long driver(long x)
{
    ra_driver = __builtin_return_address(0);
    long r = site_holder(x);
    __asm__ __volatile__("" ::: "memory");
    return r;
}

struct res {
    int apply_rc;
    long value;
    int nframes;
    int saw_holder, saw_driver;
    int join_rc, canceled, cleanup_ran;
};

static int apply_always(void)
{
    struct altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, X86_FEATURE_ALWAYS) != 0)
        return -ENOMEM;
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = f};
    int rc = altpatch_apply_opts(&o);
    altpatch_features_free(f);
    return rc;
}

static void seen(struct res *r)
{
    r->nframes = cb.nframes;
    for (int i = 0; i < cb.nframes; i++) {
        r->saw_holder |= cb.frames[i] == ra_holder;
        r->saw_driver |= cb.frames[i] == ra_driver;
    }
}

static void on_cleanup(void *arg)
{
    atomic_store((atomic_int *)arg, 1);
}

static atomic_int cleanup_flag;

static void *blocked_thread(void *arg)
{
    (void)arg;
    long v;
    pthread_cleanup_push(on_cleanup, &cleanup_flag);
    v = driver(1);
    pthread_cleanup_pop(0);
    return (void *)(intptr_t)v;
}

struct scenario {
    int apply;
    enum mode mode;
};

static void body(void *out, void *ctx)
{
    struct res *r = out;
    const struct scenario *sc = ctx;
    if (sc->apply)
        r->apply_rc = apply_always();
    cb.mode = sc->mode;
    if (sc->mode != M_BLOCK) {
        r->value = driver(1);
        seen(r);
        return;
    }
    sem_init(&cb.entered, 0, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, blocked_thread, NULL) != 0) {
        r->join_rc = -1;
        return;
    }
    sem_wait(&cb.entered);
    pthread_cancel(t);
    void *ret = NULL;
    r->join_rc = pthread_join(t, &ret);
    r->canceled = ret == PTHREAD_CANCELED;
    r->cleanup_ran = atomic_load(&cleanup_flag);
}

static struct res *run(int apply, enum mode mode)
{
    struct scenario sc = {apply, mode};
    struct res *r = ap_isolated(sizeof(struct res), body, &sc);
    cr_assert_eq(r->apply_rc, 0, "apply: %d", r->apply_rc);
    return r;
}

static void check_value(int apply)
{
    struct res *r = run(apply, M_VALUE);
    cr_assert_eq(r->value, apply ? 2001 : 1001, "site called the %s target",
                 r->value == 2001 ? "new" : "old");
}

static void check_walk(int apply, enum mode mode)
{
    struct res *r = run(apply, mode);
    cr_assert_eq(r->value, apply ? 2001 : 1001);
    cr_assert_gt(r->nframes, 3, "only %d frames", r->nframes);
    cr_assert(r->saw_holder, "the walk stopped in the site's frame (%d frames)", r->nframes);
    cr_assert(r->saw_driver, "the walk did not reach the test body (%d frames)", r->nframes);
}

static void check_cancel(int apply)
{
    struct res *r = run(apply, M_BLOCK);
    cr_assert_eq(r->join_rc, 0);
    cr_assert(r->canceled, "the thread did not end with PTHREAD_CANCELED");
    cr_assert(r->cleanup_ran, "the cleanup handler above the site did not run");
}

Test(altcall, value_before_apply) { check_value(0); }
Test(altcall, value_after_apply) { check_value(1); }
Test(altcall, backtrace_before_apply) { check_walk(0, M_BACKTRACE); }
Test(altcall, backtrace_after_apply) { check_walk(1, M_BACKTRACE); }
Test(altcall, unwind_backtrace_before_apply) { check_walk(0, M_UNWIND); }
Test(altcall, unwind_backtrace_after_apply) { check_walk(1, M_UNWIND); }
Test(altcall, cancel_before_apply) { check_cancel(0); }
Test(altcall, cancel_after_apply) { check_cancel(1); }
