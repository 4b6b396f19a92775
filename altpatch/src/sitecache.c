/* SPDX-License-Identifier: MIT */
/*
 * sitecache.c - each site's template, and the planner for what no template
 * answers.
 *
 * The planner is pure and a site's plan depends only on its shape plus the
 * arithmetic of its relative fields (memo.c), so apply keeps one memo of
 * templates for as long as the feature set stays the same, and each module
 * remembers which template each of its sites used. A site is then decided
 * by instantiating that template (the chosen entry's bytes, relative fields
 * computed and range-checked for this site); a site seen for the first time
 * looks its shape up (a hash of its bytes, no decoder); only a new shape or
 * a refusal reaches the planner (here). The per-site fast path is apply.c's
 * ap_decide_module() and ap_decide().
 */
#include "apply.h"

#include <stdlib.h>
#include <string.h>

AP_PLAIN_PATH int ap_plan_slow(struct ap_module *m, size_t i, const uint8_t *orig, struct ap_memo *memo,
                 uint8_t *final, int *reason, char **detail)
{
    struct ap_plan plan;
    struct ap_site_entries eb;
    const struct ap_site *s;
    const struct ap_entry *e = ap_module_site_entries(m, i, &eb, &s);
    uint32_t id = ap_memo_plan(memo, &m->view, s, e, orig, &memo->fs, &plan);

    if (plan.reason != ALTPATCH_REASON_NONE) {
        *reason = plan.reason;
        *detail = plan.detail[0] ? strndup(plan.detail, sizeof(plan.detail)) : NULL;
        return -2;
    }
    /* the template the planner stored, or none (0): a template the site
     * carried from a lookup whose field did not fit here is dropped, so that
     * nothing takes this site's plan from it (host.h: planned_memo) */
    if (orig)
        m->st[i].shape = ap_shape_store(id);
    if (plan.chosen >= 0)
        ap_copy_small(final, plan.final, m->sites[i].len);
    return plan.chosen;
}

AP_HOT void ap_cache_check(struct ap_module *m, uint64_t gen)
{
    if (m->shape_gen == gen || !m->st)
        return;
    if (m->shape_gen != AP_SHAPE_GEN_ANY) /* else no site has a template yet */
        for (size_t i = 0, n = m->nsites; i < n; i++)
            m->st[i].shape = 0;
    m->shape_gen = gen;
}
