/* SPDX-License-Identifier: MIT */
/*
 * altpatch_gs_check(): a thread learns whether the block at its GS base is the
 * one it installed. Two threads: the creator installs its block; the new
 * thread, which starts with the creator's GS base (the kernel copies it),
 * gets -ENOENT until it installs its own block, then 0, and each thread's
 * altpatch_gs_self() returns its own block. A GS base changed behind the
 * library's back gives -ESTALE. The sites are never patched here (no apply):
 * altpatch_gs_self() runs its original, `movq %gs:0`.
 */
#include <criterion/criterion.h>
#include <asm/prctl.h>
#include <errno.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <altpatch/primitives.h>

#include "ap_isolate.h"

static void *get_gs_base(void)
{
    unsigned long base = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_GS, &base) != 0)
        return (void *)-1;
    return (void *)base;
}

struct res {
    int main_before, main_install, main_after, main_after_join;
    void *main_self;
    int thr_before, thr_install, thr_after;
    void *thr_inherited; /* the new thread's GS base before it installs */
    void *thr_self;
    int stale, stale_back;
};

static void *main_block[4];
static void *thr_block[4];

static void *second_thread(void *arg)
{
    struct res *r = arg;
    r->thr_inherited = get_gs_base();
    r->thr_before = altpatch_gs_check();
    r->thr_install = altpatch_gs_install(thr_block);
    r->thr_after = altpatch_gs_check();
    r->thr_self = altpatch_gs_self();
    return NULL;
}

static void body(void *out, void *ctx)
{
    struct res *r = out;
    (void)ctx;
    r->main_before = altpatch_gs_check();
    r->main_install = altpatch_gs_install(main_block);
    r->main_after = altpatch_gs_check();
    pthread_t t;
    if (pthread_create(&t, NULL, second_thread, r) != 0 || pthread_join(t, NULL) != 0) {
        r->thr_before = 1;
        return;
    }
    r->main_after_join = altpatch_gs_check();
    r->main_self = altpatch_gs_self();

    /* someone else moves the GS base: the block is no longer this thread's */
    static void *other[4];
    other[0] = other;
    syscall(SYS_arch_prctl, ARCH_SET_GS, (unsigned long)other);
    r->stale = altpatch_gs_check();
    syscall(SYS_arch_prctl, ARCH_SET_GS, (unsigned long)main_block);
    r->stale_back = altpatch_gs_check();
}

Test(gs, check_per_thread)
{
    struct res *r = ap_isolated(sizeof(*r), body, NULL);
    cr_assert_eq(r->main_before, -ENOENT, "before install: %d", r->main_before);
    cr_assert_eq(r->main_install, 0);
    cr_assert_eq(r->main_after, 0);

    /* the hazard the check exists for: the new thread sees the creator's block */
    cr_assert_eq(r->thr_inherited, (void *)main_block, "the new thread's GS base");
    cr_assert_eq(r->thr_before, -ENOENT, "inherited block reported as %d", r->thr_before);
    cr_assert_eq(r->thr_install, 0);
    cr_assert_eq(r->thr_after, 0);
    cr_assert_eq(r->thr_self, (void *)thr_block);

    cr_assert_eq(r->main_after_join, 0, "the creator's own block is untouched");
    cr_assert_eq(r->main_self, (void *)main_block);
    cr_assert_eq(r->stale, -ESTALE);
    cr_assert_eq(r->stale_back, 0);
}
