/* SPDX-License-Identifier: MIT */
/*
 * sitecache.c - each site's plan, from its shape's template.
 *
 * The planner is pure and a site's plan depends only on its shape plus the
 * arithmetic of its relative fields (memo.c), so apply keeps one memo of
 * templates for as long as the feature set stays the same, and each module
 * remembers which template each of its sites used. A site is then decided
 * by instantiating that template (the chosen entry's bytes, relative fields
 * computed and range-checked for this site); a site seen for the first time
 * looks its shape up (a hash of its bytes, no decoder); only a new shape or
 * a refusal reaches the planner.
 */
#include "apply.h"

#include <stdlib.h>
#include <string.h>

/* The planner, through the memo: refusals, new shapes, relative fields that
 * do not fit at this site. */
static __attribute__((noinline)) int ap_plan_slow(struct ap_module *m, size_t i,
                                                  const uint8_t *orig, struct ap_memo *memo,
                                                  uint8_t *final, int *reason, char **detail)
{
    struct ap_plan plan;
    uint32_t id = ap_memo_plan(memo, &m->view, &m->sites[i], m->entries, orig, &memo->fs, &plan);

    if (plan.reason != ALTPATCH_REASON_NONE) {
        *reason = plan.reason;
        *detail = plan.detail[0] ? strndup(plan.detail, sizeof(plan.detail)) : NULL;
        return -2;
    }
    if (orig && id)
        m->shape[i] = id;
    if (plan.chosen >= 0)
        ap_copy_small(final, plan.final, m->sites[i].len);
    return plan.chosen;
}

int ap_plan_cached(struct ap_module *m, size_t i, const uint8_t *orig, struct ap_memo *memo,
                   uint64_t gen, uint8_t *final, int *reason, char **detail)
{
    const struct ap_site *s = &m->sites[i];
    uint32_t id;
    int chosen;

    *reason = ALTPATCH_REASON_NONE;
    *detail = NULL;
    if (!orig || m->shape_gen != gen)
        return ap_plan_slow(m, i, orig, memo, final, reason, detail);
    id = m->shape[i];
    if (!id) {
        /* the address checks, then the shape's hash: no decoder */
        id = ap_memo_find(memo, &m->view, s, m->entries, orig);
        if (!id)
            return ap_plan_slow(m, i, orig, memo, final, reason, detail);
    }
    chosen = ap_memo_inst(memo, id, &m->view, s, m->entries, final);
    if (chosen < -1) /* a relative field that does not fit here: the planner refuses it */
        return ap_plan_slow(m, i, orig, memo, final, reason, detail);
    m->shape[i] = id;
    memo->hits++;
    return chosen;
}

void ap_cache_check(struct ap_module *m, uint64_t gen)
{
    if (m->shape_gen == gen || !m->shape)
        return;
    memset(m->shape, 0, m->nsites * sizeof(*m->shape));
    m->shape_gen = gen;
}
