/* SPDX-License-Identifier: MIT */
/*
 * Out of memory where a first apply's write queue grows: libapfix_linked.so
 * (DT_NEEDED of this test) and libapfix_dl.so (dlopen'ed). And a library the
 * apply cannot pin (its dlopen(RTLD_NOLOAD) failing, as when memory is
 * short) while the feature set changes. An executable of its own: it
 * interposes realloc() and dlopen() for the whole process (Criterion's
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
#include "util.h"


/*
 * The two first decisions with realloc() failing: the apply's write queue
 * lies over one module's records, grown to a slot per site of both before
 * anything is decided. Out of memory there, the apply returns -ENOMEM with
 * nothing written in either module, and the next apply patches both.
 */
#if !AP_SANITIZED
extern void *__libc_realloc(void *p, size_t size);
static volatile int realloc_fail; /* armed: the queue's growth fails */
static volatile int realloc_failed;

/* This executable's realloc: glibc's, but for the queue's growth when armed. */
void *realloc(void *p, size_t size)
{
    /* a block grown to 8 slots of 32 bytes: one per site of both modules
     * (4 + 4), over the records of one (4) */
    if (realloc_fail && p && size == 8 * 32) {
        realloc_failed++;
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(p, size);
}

#else
static volatile int realloc_fail, realloc_failed;
#endif

static void body_two_first_enomem(void *out, void *ctx)
{
    struct mres *r = out;
    (void)ctx;
    void *h = mod_dlopen(APFIX_DL_PATH, r->msg, sizeof(r->msg));
    if (!h) {
        r->rc[3] = -1;
        return;
    }
    call_fn call = (call_fn)dlsym(h, "apfix_dl_call");
    realloc_fail = 1;
    ap_mem_use_region(false); /* the queue grown by realloc() */
    r->rc[2] = altpatch_apply();
    ap_mem_use_region(true);
    realloc_fail = 0;
    r->flag[0] = realloc_failed;
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
        cr_skip_test("a sanitizer's realloc is not interposed here");
    struct mres *r = ap_isolated(sizeof(*r), body_two_first_enomem, NULL);
    cr_assert_eq(r->rc[3], 0, "%s", r->msg);
    const char *pre = getenv("LD_PRELOAD");
    if (!r->flag[0] && pre && strstr(pre, "vgpreload"))
        cr_skip_test("valgrind's realloc replaces this file's: no allocation failed");
    cr_assert_eq(r->flag[0], 1, "the queue's growth failed once");
    cr_assert_eq(r->rc[2], -ENOMEM, "%d", r->rc[2]);
    cr_assert_eq(r->val[0], 22, "nothing written by the failed apply");
    cr_assert_eq(r->rc[1], 0);
    cr_assert_eq(r->val[1], 33, "both patched by the next apply");
    assert_patched(r, 0, "libapfix_linked.so");
    assert_patched(r, 1, "libapfix_dl.so");
}

/* This executable's dlopen: the C library's, but a pin of libapfix_linked.so
 * (RTLD_NOLOAD) fails while armed. */
static volatile int pin_fail, pin_failed;

void *dlopen(const char *file, int mode)
{
    static void *(*next)(const char *, int);
    if (!next)
        next = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
    if (pin_fail && (mode & RTLD_NOLOAD) && file && strstr(file, "libapfix_linked")) {
        pin_failed++;
        return NULL;
    }
    return next(file, mode);
}

/* The library's sites refused (val[6]) and seen (val[7]). */
static int refused_cb(const struct altpatch_site_info *s, void *p)
{
    struct mres *r = p;
    if (strstr(s->module, "libapfix_linked")) {
        r->val[7]++;
        r->val[6] += s->state == ALTPATCH_SITE_REFUSED;
    }
    return 0;
}

static void body_unpinned_switch(void *out, void *ctx)
{
    struct mres *r = out;
    (void)ctx;
    struct altpatch_features *none = altpatch_features_new();
    if (!none)
        abort();
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = none};
    struct altpatch_apply_opts rev = {.sz = sizeof(rev), .flags = ALTPATCH_APPLY_REVERT};
    r->rc[0] = altpatch_apply(); /* the library's first decision: ALWAYS, its new calls */
    r->val[0] = apfix_linked_call(1);
    pin_fail = 1;
    r->rc[1] = altpatch_apply_opts(&o); /* another set: the library skipped, not pinned */
    pin_fail = 0;
    r->flag[0] = pin_failed;
    r->val[1] = apfix_linked_call(1);
    r->rc[2] = altpatch_apply_opts(&o); /* pinned again: decided under the set */
    r->val[2] = apfix_linked_call(1);
    altpatch_site_foreach(refused_cb, r);
    size_t n;
    const struct apx_call *c = apfix_linked_calls(&n);
    r->rc[3] = altpatch_apply();     /* back to the host's set */
    r->val[3] = apfix_linked_call(1);
    walk_module(r, 1, "libapfix_linked", c, n);
    r->val[4] = altpatch_apply_opts(&rev);
    r->val[5] = apfix_linked_call(1);
    altpatch_features_free(none);
}

/*
 * A library whose plan bytes its first decision left to the templates, not
 * pinned by the apply that changes the feature set (so that apply cannot read
 * it to write them), keeps those templates: the next apply that pins it
 * decides it from what it left, switching its calls back to their originals
 * instead of refusing them as foreign bytes; the applies after that switch
 * and revert as usual.
 */
Test(modules_oom, an_unpinned_library_keeps_its_templates)
{
    if (AP_SANITIZED)
        cr_skip_test("this file's interposers are not built under a sanitizer");
    struct mres *r = ap_isolated(sizeof(*r), body_unpinned_switch, NULL);
    cr_assert_eq(r->rc[0], 0);
    cr_assert_eq(r->val[0], 3, "the first apply took the new call");
    cr_assert_geq(r->flag[0], 1, "the pin failed");
    cr_assert_eq(r->rc[1], 0, "%d", r->rc[1]);
    cr_assert_eq(r->val[1], 3, "the library was skipped while not pinned");
    cr_assert_eq(r->rc[2], 0, "%d", r->rc[2]);
    cr_assert_eq(r->val[2], 2, "pinned again: switched to the old call, not refused");
    cr_assert_geq(r->val[7], 4, "%ld sites of the library", r->val[7]);
    cr_assert_eq(r->val[6], 0, "%ld sites of the library refused", r->val[6]);
    cr_assert_eq(r->rc[3], 0);
    cr_assert_eq(r->val[3], 3);
    assert_patched(r, 1, "libapfix_linked.so");
    cr_assert_eq(r->val[4], 0, "the revert");
    cr_assert_eq(r->val[5], 2);
}
