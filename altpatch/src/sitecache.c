/* SPDX-License-Identifier: MIT */
/*
 * sitecache.c - each module's plans from the last apply. The planner is
 * pure, so for the same feature set a site's plan does not change: a second
 * apply (a dlopen, say) takes every known site's plan from its module and
 * sends only new sites to the planner, through this apply's memo (memo.c:
 * identical sites planned once). Only accepted plans are kept.
 */
#include "apply.h"

#include <string.h>

/**
 * The plan of site @p i: from the module's cache when it holds one for this
 * feature set, else from the planner (and then cached if accepted). Fills
 * out->reason, chosen and detail; returns the final bytes (valid while @p out
 * and the module live).
 */
const uint8_t *ap_plan_cached(struct ap_module *m, size_t i,
                                     const struct altpatch_features *fs, struct ap_memo *memo,
                                     struct ap_plan *out)
{
    size_t off = m->orig_off[i];
    const uint8_t *orig = off != AP_NO_ORIG ? m->orig + off : NULL;
    if (orig && m->cache_chosen[i] != AP_NOT_CACHED) {
        out->reason = ALTPATCH_REASON_NONE;
        out->chosen = m->cache_chosen[i];
        out->detail[0] = '\0';
        return m->cache_final + off;
    }
    /* the planner through this apply's memo (memo.c): identical sites planned once */
    ap_memo_plan(memo, &m->view, &m->sites[i], m->entries, orig, fs, out);
    if (orig && out->reason == ALTPATCH_REASON_NONE) {
        m->cache_chosen[i] = (int32_t)out->chosen;
        memcpy(m->cache_final + off, out->final, m->sites[i].len);
    }
    return out->final;
}

/** Forget a module's cached plans unless they were made for @p fs. */
void ap_cache_check(struct ap_module *m, const struct altpatch_features *fs)
{
    if (m->cache_valid && memcmp(&m->cache_fs, fs, sizeof(*fs)) == 0)
        return;
    for (size_t i = 0; i < m->nsites; i++)
        m->cache_chosen[i] = AP_NOT_CACHED;
    m->cache_fs = *fs;
    m->cache_valid = true;
}

