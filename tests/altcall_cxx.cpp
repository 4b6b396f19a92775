// SPDX-License-Identifier: MIT
/*
 * C++ through an ALTPATCH_ALT_CALL site, before and after apply: an exception
 * thrown by the callee reaches a catch two frames up, running the destructor
 * of the frame between; pthread_cancel() of a thread blocked in the callee
 * unwinds it the same way (abi::__forced_unwind), ending it with
 * PTHREAD_CANCELED instead of std::terminate(). "After apply" applies a set
 * holding ALWAYS, so the site calls the replacement on any host (checked by
 * the value). Each scenario runs in a fork()ed child (ap_isolate.h).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <semaphore.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <stdexcept>

#include <altpatch/primitives.h>

#include "ap_isolate.h"

namespace {

enum mode { M_VALUE, M_THROW, M_BLOCK };

mode cb_mode;
sem_t cb_entered;

__attribute__((noinline)) long cb_act(long x)
{
    switch (cb_mode) {
    case M_VALUE:
        break;
    case M_THROW:
        throw std::runtime_error("thrown by the callee");
    case M_BLOCK:
        sem_post(&cb_entered);
        for (;;)
            pause(); // a cancellation point
    }
    return x;
}

long cb_old(long x) { return cb_act(x) + 1000; }
long cb_new(long x) { return cb_act(x) + 2000; }

__attribute__((noinline)) long site_holder(long x)
{
    long r = ALTPATCH_ALT_CALL(cb_old, cb_new, X86_FEATURE_ALWAYS, x);
    __asm__ __volatile__("" ::: "memory");
    return r;
}

std::atomic<int> dtor_runs;

struct guard {
    ~guard() { dtor_runs++; }
};

__attribute__((noinline)) long driver(long x)
{
    guard g;
    long r = site_holder(x);
    __asm__ __volatile__("" ::: "memory");
    return r;
}

struct res {
    int apply_rc;
    long value;
    int caught, caught_other, dtor_runs;
    int join_rc, canceled, forced_unwind_seen;
};

int apply_always()
{
    altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, X86_FEATURE_ALWAYS) != 0)
        return -ENOMEM;
    struct altpatch_apply_opts o {};
    o.sz = sizeof(o);
    o.features = f;
    int rc = altpatch_apply_opts(&o);
    altpatch_features_free(f);
    return rc;
}

std::atomic<int> forced_unwind_seen;

void *blocked_thread(void *)
{
    long v = 0;
    try {
        v = driver(1);
    } catch (...) {
        /* Cancellation unwinds as glibc's forced-unwind exception; it must be
         * rethrown. Caught with (...) rather than abi::__forced_unwind &:
         * that object is not a C++ object, and binding a reference to it is
         * undefined behaviour that UBSan reports. */
        forced_unwind_seen = 1;
        throw;
    }
    return reinterpret_cast<void *>(static_cast<intptr_t>(v));
}

struct scenario {
    int apply;
    mode m;
};

void body(void *out, void *ctx)
{
    res *r = static_cast<res *>(out);
    const scenario *sc = static_cast<const scenario *>(ctx);
    if (sc->apply)
        r->apply_rc = apply_always();
    cb_mode = sc->m;
    switch (sc->m) {
    case M_VALUE:
        r->value = driver(1);
        break;
    case M_THROW:
        try {
            r->value = driver(1);
        } catch (const std::runtime_error &) {
            r->caught = 1;
        } catch (...) {
            r->caught_other = 1;
        }
        break;
    case M_BLOCK: {
        sem_init(&cb_entered, 0, 0);
        pthread_t t;
        if (pthread_create(&t, nullptr, blocked_thread, nullptr) != 0) {
            r->join_rc = -1;
            break;
        }
        sem_wait(&cb_entered);
        pthread_cancel(t);
        void *ret = nullptr;
        r->join_rc = pthread_join(t, &ret);
        r->canceled = ret == PTHREAD_CANCELED;
        r->forced_unwind_seen = forced_unwind_seen;
        break;
    }
    }
    r->dtor_runs = dtor_runs;
}

res *run(int apply, mode m)
{
    scenario sc = {apply, m};
    res *r = static_cast<res *>(ap_isolated(sizeof(res), body, &sc));
    cr_assert_eq(r->apply_rc, 0, "apply: %d", r->apply_rc);
    return r;
}

void check_value(int apply)
{
    res *r = run(apply, M_VALUE);
    cr_assert_eq(r->value, apply ? 2001 : 1001);
    cr_assert_eq(r->dtor_runs, 1);
}

void check_throw(int apply)
{
    res *r = run(apply, M_THROW);
    cr_assert(r->caught, "the exception did not reach the catch (other: %d)", r->caught_other);
    cr_assert_eq(r->value, 0);
    cr_assert_eq(r->dtor_runs, 1, "the destructor between ran %d times", r->dtor_runs);
}

void check_cancel(int apply)
{
    res *r = run(apply, M_BLOCK);
    cr_assert_eq(r->join_rc, 0);
    cr_assert(r->canceled, "the thread did not end with PTHREAD_CANCELED");
    cr_assert(r->forced_unwind_seen, "no forced unwind came through the site");
    cr_assert_eq(r->dtor_runs, 1, "the destructor between ran %d times", r->dtor_runs);
}

} // namespace

Test(altcall_cxx, value_before_apply) { check_value(0); }
Test(altcall_cxx, value_after_apply) { check_value(1); }
Test(altcall_cxx, exception_before_apply) { check_throw(0); }
Test(altcall_cxx, exception_after_apply) { check_throw(1); }
Test(altcall_cxx, cancel_before_apply) { check_cancel(0); }
Test(altcall_cxx, cancel_after_apply) { check_cancel(1); }
