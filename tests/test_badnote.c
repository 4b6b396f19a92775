/* SPDX-License-Identifier: MIT */
/*
 * A module whose PT_NOTE lies outside its loaded segments (libapfix_badnote.so:
 * libapfix_dl.so with the note's p_vaddr moved to 0x40000000 by
 * tests/move_note.c). The runtime reads a note only where a PT_LOAD of the
 * module maps it: such a module is ignored (no altpatch note found), the
 * apply succeeds, and nothing is read at the bogus address (which is unmapped:
 * reading it crashed). The unmodified library is found, for comparison.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <stdio.h>

#include <altpatch/altpatch.h>

#include "ap_isolate.h"

struct note_result {
    int loaded;
    int rc;
    unsigned long modules_before, modules_after;
    char err[200];
};

static void load_and_apply(void *out, void *ctx)
{
    struct note_result *r = out;
    const char *path = ctx;
    struct altpatch_stats st = {.sz = sizeof(st)};
    if (altpatch_apply() || altpatch_get_stats(&st)) {
        snprintf(r->err, sizeof(r->err), "first apply failed");
        return;
    }
    r->modules_before = (unsigned long)st.modules;
    void *h = dlopen(path, RTLD_NOW);
    if (!h) {
        snprintf(r->err, sizeof(r->err), "%s", dlerror());
        return;
    }
    r->loaded = 1;
    r->rc = altpatch_apply();
    altpatch_get_stats(&st);
    r->modules_after = (unsigned long)st.modules;
}

Test(badnote, note_outside_load_segments_ignored)
{
    struct note_result *r = ap_isolated(sizeof(*r), load_and_apply, APFIX_BADNOTE_PATH);
    cr_assert(r->loaded, "dlopen: %s", r->err);
    cr_assert_eq(r->rc, 0, "apply: %d", r->rc);
    cr_assert_eq(r->modules_after, r->modules_before, "the module is ignored (%lu -> %lu)",
                 r->modules_before, r->modules_after);
}

Test(badnote, unmodified_library_found)
{
    struct note_result *r = ap_isolated(sizeof(*r), load_and_apply, APFIX_DL_PATH);
    cr_assert(r->loaded, "dlopen: %s", r->err);
    cr_assert_eq(r->rc, 0, "apply: %d", r->rc);
    cr_assert_eq(r->modules_after, r->modules_before + 1);
}
