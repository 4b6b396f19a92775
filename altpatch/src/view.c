/* SPDX-License-Identifier: MIT */
/*
 * view.c - a module's view for the planner, built one way for live memory and
 * for ELF files: where sites may lie (executable segments, without the
 * replacement range, which is code that never runs in place, and without the
 * library's own data where a layout makes it executable) and where the
 * replacements are.
 */
#include <string.h>

#include "host.h"

/* Add [s, e) of segment @p g to the text regions (nothing if empty or full). */
static void text_add(struct ap_view *v, const struct ap_segment *g, uint64_t s, uint64_t e)
{
    if (e <= s || v->ntext >= AP_MAX_TEXT)
        return;
    v->text[v->ntext++] = (struct ap_region){s, e - s, g->data + (s - g->addr)};
}

AP_HOT void ap_view_build(struct ap_view *v, const struct ap_segment *seg, size_t nseg,
                   uint64_t repl_addr, uint64_t repl_size, const uint8_t *repl_data)
{
    uint64_t rs = repl_addr, re = repl_addr + repl_size;

    memset(v, 0, sizeof(*v));
    v->repl = (struct ap_region){repl_addr, repl_size, repl_data};
    for (size_t i = 0; i < nseg; i++) {
        const struct ap_segment *g = &seg[i];
        uint64_t s = g->addr, e = g->addr + g->size;

        if (!g->exec || !g->data || e < s)
            continue;
        if (re <= s || rs >= e || rs == re) {
            text_add(v, g, s, e);
            continue;
        }
        text_add(v, g, s, rs > s ? rs : s);
        text_add(v, g, re < e ? re : e, e);
    }
}

AP_HOT void ap_view_cut(struct ap_view *v, uint64_t start, uint64_t end)
{
    if (end <= start)
        return;
    struct ap_region keep[AP_MAX_TEXT];
    size_t n = 0;
    for (size_t i = 0; i < v->ntext; i++) {
        const struct ap_region *r = &v->text[i];
        uint64_t s = r->addr, e = r->addr + r->size;
        if (end <= s || start >= e) {
            if (n < AP_MAX_TEXT)
                keep[n++] = *r;
            continue;
        }
        if (start > s && n < AP_MAX_TEXT)
            keep[n++] = (struct ap_region){s, start - s, r->data};
        if (end < e && n < AP_MAX_TEXT)
            keep[n++] = (struct ap_region){end, e - end, r->data ? r->data + (end - s) : NULL};
    }
    /* no library call: a first apply binds no memcpy() for a few regions */
    ap_copy_small((uint8_t *)v->text, (const uint8_t *)keep, n * sizeof(keep[0]));
    v->ntext = n;
}
