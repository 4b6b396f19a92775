/* SPDX-License-Identifier: MIT */
/*
 * A library constructor calling altpatch_apply() while another thread is
 * inside altpatch_apply(): the constructor runs under the loader's lock, so
 * apply must not wait for the loader while it holds its own lock (it pins
 * libraries before taking it). A deadlock shows as SIGALRM in the child.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "ap_isolate.h"
#include <altpatch/altpatch.h>

struct ctor_out {
    int loads, ok_ctor, ok_site, applies, apply_err;
};

static atomic_int loader_done;

static void *loader(void *arg)
{
    struct ctor_out *o = arg;

    for (int i = 0; i < 100; i++) {
        void *h = dlopen(CTOR_APPLY_LIB_PATH, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            break;
        int *res = dlsym(h, "ctor_apply_result");
        int (*site)(void) = (int (*)(void))dlsym(h, "ctor_apply_site");
        o->loads++;
        o->ok_ctor += res && *res == 0;
        o->ok_site += site && site() == 2;
        dlclose(h);
    }
    atomic_store(&loader_done, 1);
    return NULL;
}

static void body(void *out, void *ctx)
{
    struct ctor_out *o = out;
    pthread_t t;
    (void)ctx;
    alarm(20);
    if (pthread_create(&t, NULL, loader, o) != 0)
        return;
    while (!atomic_load(&loader_done)) {
        int err = altpatch_apply();
        o->applies++;
        if (err)
            o->apply_err = err;
    }
    pthread_join(t, NULL);
}

Test(ctor, constructor_applies_while_another_thread_applies)
{
    struct ctor_out *o = ap_isolated(sizeof(*o), body, NULL);

    cr_assert_eq(o->loads, 100, "every dlopen succeeded");
    cr_assert_eq(o->ok_ctor, 100, "the constructor's apply returned 0 each time");
    cr_assert_eq(o->ok_site, 100, "the plugin's site was patched by its own constructor");
    cr_assert_gt(o->applies, 0);
    cr_assert_eq(o->apply_err, 0, "concurrent applies returned %d", o->apply_err);
}
