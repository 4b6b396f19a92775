/* SPDX-License-Identifier: MIT */
/*
 * Apply under a feature set of one feature and read the stats of that apply
 * (a test body's common steps; it aborts where the library cannot even be
 * asked, which the parent of an isolated body sees as a failed child).
 */
#ifndef AP_TEST_APPLY_ONE_H
#define AP_TEST_APPLY_ONE_H

#include <stdlib.h>
#include <string.h>

#include <altpatch/altpatch.h>

/** altpatch_apply_opts() under {@p feature}; its stats in @p st. Returns its result. */
static inline int ap_apply_one(unsigned feature, struct altpatch_stats *st)
{
    struct altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, feature))
        abort();
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = f};
    int rc = altpatch_apply_opts(&o);
    altpatch_features_free(f);
    memset(st, 0, sizeof(*st));
    st->sz = sizeof(*st);
    if (altpatch_get_stats(st))
        abort();
    return rc;
}

#endif
