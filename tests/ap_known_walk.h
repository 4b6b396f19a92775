/* SPDX-License-Identifier: MIT */
/*
 * For tests/known_plans_gen.c and tests/test_known.c: the sites of this
 * program's own table, and for each, a feature set per answer the planner
 * can give there (the original, each entry), as ap_plan_pick() selects it.
 */
#ifndef AP_KNOWN_WALK_H
#define AP_KNOWN_WALK_H

#include "host.h"
#include "plan.h"

#include <string.h>

/* Said where the table may not match this build's bytes. */
#if defined(__clang__) || !defined(__GNUC__)
#define AP_KNOWN_OTHER_CC " (this build is not gcc's: its primitives' bytes may differ)"
#else
#define AP_KNOWN_OTHER_CC ""
#endif

/* This program's module (the main program: an empty path), or NULL. */
static inline struct ap_module *apk_main_module(struct ap_module *list)
{
    struct ap_module *m = list;
    while (m && m->path[0])
        m = m->next;
    return m;
}

/*
 * A feature set under which @p c is the entry selected at site @p s (-1:
 * none), in *@p fs: the entries after it not eligible, it eligible. False
 * when the site's features make that impossible (the same feature wanted
 * both ways), or ap_plan_pick() selects another.
 */
static inline bool apk_set_for(const struct ap_view *v, const struct ap_site *s,
                               const struct ap_entry *ents, int c, struct altpatch_features *fs)
{
    memset(fs, 0, sizeof(*fs));
    for (int j = (int)s->count - 1; j >= (c < 0 ? 0 : c); j--) {
        const struct ap_entry *e = &ents[s->first + (uint32_t)j];
        bool not = e->flags & ALT_FLAG_NOT;
        bool want = j == c ? !not : not; /* the bit that makes it (not) eligible */
        if (want)
            fs->word[e->feature / 32] |= 1u << (e->feature % 32);
    }
    for (int j = (int)s->count - 1; j >= (c < 0 ? 0 : c); j--) {
        const struct ap_entry *e = &ents[s->first + (uint32_t)j];
        if (ap_entry_eligible(e, fs) != (j == c))
            return false;
    }
    return ap_plan_pick(v, s, ents, fs) == c;
}

/* A template as known_plans.c keeps it (plan.h, struct ap_known_plan). */
struct apk_plan {
    uint8_t bytes[2 * 512 + 256]; /* key, mask, final bytes */
    struct ap_memo_field f[8];
    size_t keylen, count, len, nfields;
    int chosen;
    bool relative;
};

/* Memo template @p t as known_plans.c keeps it: every entry's feature and
 * flags zero in the key, the final bytes with the chosen entry's fields zero
 * (ap_memo_inst() writes them for each site), all zero for the original
 * (never read: the site's own bytes are its answer). */
static inline void apk_normal(const struct ap_memo_tmpl *t, struct apk_plan *k)
{
    memset(k, 0, sizeof(*k));
    k->keylen = t->keylen;
    k->count = t->count;
    k->len = t->len;
    k->nfields = t->nfields;
    k->chosen = t->chosen;
    k->relative = t->relative;
    size_t n = 2 * k->keylen + k->len;
    memcpy(k->bytes, t->key, n);
    memcpy(k->f, t->key + n, k->nfields * sizeof(k->f[0]));
    for (size_t j = 0, at = 1 + k->len; j < k->count; j++) {
        memset(k->bytes + at, 0, 4);
        at += 5 + k->bytes[at + 4];
    }
    for (size_t j = 0; j < k->nfields; j++)
        if (k->f[j].entry == k->chosen)
            memset(k->bytes + 2 * k->keylen + k->f[j].pos, 0, k->f[j].size);
    if (k->chosen < 0)
        memset(k->bytes + 2 * k->keylen, 0, k->len);
}

/* Is @p k the table's entry @p e: the same bytes, the same fields (member
 * by member: a field's padding byte is whatever the memo's stack held)? */
static inline bool apk_same(const struct apk_plan *k, const struct ap_known_plan *e)
{
    if (e->keylen != k->keylen || e->count != k->count || e->len != k->len ||
        e->nfields != k->nfields || e->chosen != k->chosen || e->relative != k->relative ||
        memcmp(ap_known_bytes + e->at, k->bytes, 2 * k->keylen + k->len))
        return false;
    for (size_t j = 0; j < k->nfields; j++) {
        const struct ap_memo_field *a = &ap_known_fields[e->fields_at + j], *b = &k->f[j];
        if (a->kpos != b->kpos || a->entry != b->entry || a->end != b->end ||
            a->pos != b->pos || a->size != b->size || a->repllen != b->repllen)
            return false;
    }
    return true;
}

#endif
