/* SPDX-License-Identifier: MIT */
/*
 * Out of memory where a first apply's write queue is made:
 * libapfix_linked.so (DT_NEEDED of this test) and libapfix_dl.so
 * (dlopen'ed). An executable of its own: it interposes malloc() for the whole process (Criterion's
 * set-up included), which no other test must see, and which a sanitizer's
 * allocator does not allow (not built with ALTPATCH_SANITIZE; a sanitized
 * build of this file skips).
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ap_expect.h"
#include "ap_isolate.h"
#include "ap_modwalk.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define AP_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                      \
    __has_feature(memory_sanitizer)
#define AP_SANITIZED 1
#endif
#endif
#ifndef AP_SANITIZED
#define AP_SANITIZED 0
#endif

/*
 * The two first decisions with malloc() failing for the apply's write queue
 * (a slot per site of both), made before anything is decided.
 * Out of memory there, the apply returns -ENOMEM with nothing written in
 * either module, and the next apply patches both.
 */
#if !AP_SANITIZED
extern void *__libc_malloc(size_t size);
static volatile int alloc_fail; /* armed: the queue's block fails */
static volatile int alloc_failed;

/* This executable's malloc: glibc's, but for the queue when armed. */
void *malloc(size_t size)
{
    /* a slot of 32 bytes per site of both modules (4 + 4) */
    if (alloc_fail && size == 8 * 32) {
        alloc_failed++;
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(size);
}

#else
static volatile int alloc_fail, alloc_failed;
#endif

static void body_two_first_enomem(void *out, void *ctx)
{
    struct mres *r = out;
    (void)ctx;
    void *h = dlopen(APFIX_DL_PATH, RTLD_NOW);
    if (!h) {
        snprintf(r->msg, sizeof(r->msg), "dlopen: %s", dlerror());
        r->rc[3] = -1;
        return;
    }
    call_fn call = (call_fn)dlsym(h, "apfix_dl_call");
    alloc_fail = 1;
    r->rc[2] = altpatch_apply();
    alloc_fail = 0;
    r->flag[0] = alloc_failed;
    r->val[0] = call(1) + 10 * apfix_linked_call(1);
    r->rc[0] = r->rc[1] = altpatch_apply();
    r->val[1] = call(1) + 10 * apfix_linked_call(1);
    size_t n;
    const struct apx_call *c = apfix_linked_calls(&n);
    walk_module(r, 0, "libapfix_linked", c, n);
    c = ((calls_fn)dlsym(h, "apfix_dl_calls"))(&n);
    walk_module(r, 1, "libapfix_dl", c, n);
}

Test(modules_oom, two_first_decisions_out_of_memory_write_nothing)
{
    if (AP_SANITIZED)
        cr_skip_test("a sanitizer's malloc is not interposed here");
    struct mres *r = ap_isolated(sizeof(*r), body_two_first_enomem, NULL);
    cr_assert_eq(r->rc[3], 0, "%s", r->msg);
    const char *pre = getenv("LD_PRELOAD");
    if (!r->flag[0] && pre && strstr(pre, "vgpreload"))
        cr_skip_test("valgrind's malloc replaces this file's: no allocation failed");
    cr_assert_eq(r->flag[0], 1, "the queue's block failed once");
    cr_assert_eq(r->rc[2], -ENOMEM, "%d", r->rc[2]);
    cr_assert_eq(r->val[0], 22, "nothing written by the failed apply");
    cr_assert_eq(r->rc[1], 0);
    cr_assert_eq(r->val[1], 33, "both patched by the next apply");
    assert_patched(r, 0, "libapfix_linked.so");
    assert_patched(r, 1, "libapfix_dl.so");
}
