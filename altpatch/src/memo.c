/* SPDX-License-Identifier: MIT */
/*
 * memo.c - plan identical sites once per apply.
 *
 * A program has thousands of sites but only a handful of distinct site
 * shapes: the same original bytes with the same replacements. For such a
 * site the planner's answer is a function of its content alone, so the memo
 * keys a plan on that content:
 *
 *   site length, original bytes, and for every entry in order: feature,
 *   flags, replacement length and replacement bytes
 *
 * (the feature set is fixed for the life of a memo, so the same key selects
 * the same entry). Two rules keep a memoized answer exactly the planner's:
 *
 *   - only plans that were accepted (reason NONE) and whose replacements have
 *     no relative field (ap_plan.relative false) are stored: a refusal's
 *     detail names addresses, and a relative replacement's final bytes and
 *     its relocation check depend on where the site and replacement lie;
 *   - on a hit, the checks that depend on addresses are made again here
 *     (no preset refusal, the site inside one text region with bytes, every
 *     replacement inside altinstr_replacement with bytes); on any doubt, or
 *     when the key is too long or memory is short, the full planner decides.
 *
 * The table belongs to the caller (no globals, nothing shared between
 * threads); the planner itself stays pure. tests/test_memo.c compares memo
 * and planner on varied sites.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/** Longest key memoized (bytes); longer sites always go to the planner. */
#define AP_MEMO_KEY_MAX 512
/** Most plans kept by one memo; past it, new shapes go to the planner. */
#define AP_MEMO_MAX_PLANS 65536u
#define AP_MEMO_MIN_SLOTS 64u

/** One stored plan: key bytes then final bytes, in the memo's arena. */
struct ap_memo_slot {
    uint64_t hash;
    size_t off;      /* of the key in the arena; the final bytes follow it */
    uint32_t keylen; /* 0: empty slot */
    int32_t chosen;
};

void ap_memo_init(struct ap_memo *m, const struct altpatch_features *fs)
{
    memset(m, 0, sizeof(*m));
    if (fs) {
        m->fs = *fs;
        m->fs_at = fs;
    }
}

void ap_memo_free(struct ap_memo *m)
{
    free(m->slots);
    free(m->arena);
    m->slots = NULL;
    m->arena = NULL;
    m->nslots = m->nplans = m->arena_len = m->arena_cap = 0;
}

/* [addr, addr+len) within @r? (no wrap-around; the planner's region_holds) */
static bool holds(const struct ap_region *r, uint64_t addr, uint64_t len)
{
    return addr >= r->addr && len <= r->size && addr - r->addr <= r->size - len;
}

/* The site's original bytes if the cheap, address-dependent checks pass, else NULL. */
static const uint8_t *site_bytes(const struct ap_view *v, const struct ap_site *s,
                                 const uint8_t *orig)
{
    size_t n = v->ntext < AP_MAX_TEXT ? v->ntext : AP_MAX_TEXT;

    if (s->reason || s->len == 0 || s->count == 0)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const struct ap_region *r = &v->text[i];

        if (holds(r, s->addr, s->len)) /* the planner takes the first region that holds it */
            return orig ? orig : r->data ? r->data + (s->addr - r->addr) : NULL;
    }
    return NULL;
}

/* Append @n bytes at @p to the key; false when it would exceed the maximum. */
static bool key_put(uint8_t *key, size_t *len, const void *p, size_t n)
{
    if (*len + n > AP_MEMO_KEY_MAX)
        return false;
    memcpy(key + *len, p, n);
    *len += n;
    return true;
}

/* Build the content key of site @s; 0 when a check fails or it is too long. */
static size_t key_build(const struct ap_view *v, const struct ap_site *s,
                        const struct ap_entry *entries, const uint8_t *orig, uint8_t *key)
{
    size_t len = 0;

    if (!key_put(key, &len, &s->len, 1) || !key_put(key, &len, orig, s->len))
        return 0;
    for (uint32_t k = 0; k < s->count; k++) {
        const struct ap_entry *e = &entries[s->first + k];
        uint8_t hdr[5] = {(uint8_t)e->feature, (uint8_t)(e->feature >> 8), (uint8_t)e->flags,
                          (uint8_t)(e->flags >> 8), e->repllen};

        if (!holds(&v->repl, e->repl, e->repllen) || (e->repllen && !v->repl.data))
            return 0; /* the planner refuses it (REPL_BOUNDS) */
        if (!key_put(key, &len, hdr, sizeof(hdr)) ||
            (e->repllen &&
             !key_put(key, &len, v->repl.data + (e->repl - v->repl.addr), e->repllen)))
            return 0;
    }
    return len;
}

/* 64-bit hash of @n bytes, 8 at a time (multiply-xorshift). */
static uint64_t key_hash(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;

    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;

        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    if (n) {
        uint64_t w = 0;

        for (size_t i = 0; i < n; i++) /* not memcpy: a library call for a few bytes */
            w |= (uint64_t)p[i] << (8 * i);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    }
    return h ^ (h >> 29);
}

/* The slot holding @key, or the empty slot where it would go. */
static struct ap_memo_slot *slot_find(const struct ap_memo *m, uint64_t h, const uint8_t *key,
                                      size_t keylen)
{
    size_t mask = m->nslots - 1;

    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        struct ap_memo_slot *sl = &m->slots[i];

        if (sl->keylen == 0)
            return sl;
        if (sl->hash == h && sl->keylen == keylen && memcmp(m->arena + sl->off, key, keylen) == 0)
            return sl;
    }
}

/* Double the table (or create it); false when memory is short. */
static bool slots_grow(struct ap_memo *m)
{
    size_t n = m->nslots ? m->nslots * 2 : AP_MEMO_MIN_SLOTS;
    struct ap_memo_slot *old = m->slots, *nw = calloc(n, sizeof(*nw));
    size_t oldn = m->nslots;

    if (!nw)
        return false;
    m->slots = nw;
    m->nslots = n;
    for (size_t i = 0; i < oldn; i++)
        if (old[i].keylen)
            *slot_find(m, old[i].hash, m->arena + old[i].off, old[i].keylen) = old[i];
    free(old);
    return true;
}

/* Room for @n more bytes in the arena; false when memory is short. */
static bool arena_reserve(struct ap_memo *m, size_t n)
{
    size_t cap = m->arena_cap ? m->arena_cap : 4096;
    uint8_t *p;

    if (m->arena_len + n <= m->arena_cap)
        return true;
    while (cap < m->arena_len + n)
        cap *= 2;
    p = realloc(m->arena, cap);
    if (!p)
        return false;
    m->arena = p;
    m->arena_cap = cap;
    return true;
}

/* Remember an accepted, address-independent plan (best effort: skipped when memory is short). */
static void memo_store(struct ap_memo *m, uint64_t h, const uint8_t *key, size_t keylen,
                       const struct ap_plan *p)
{
    struct ap_memo_slot *sl;

    if (m->nplans >= AP_MEMO_MAX_PLANS)
        return;
    if ((m->nplans + 1) * 2 > m->nslots && !slots_grow(m))
        return;
    if (!arena_reserve(m, keylen + p->len))
        return;
    sl = slot_find(m, h, key, keylen);
    if (sl->keylen)
        return; /* already there (cannot happen: the caller missed) */
    memcpy(m->arena + m->arena_len, key, keylen);
    memcpy(m->arena + m->arena_len + keylen, p->final, p->len);
    *sl = (struct ap_memo_slot){.hash = h, .off = m->arena_len, .keylen = (uint32_t)keylen,
                                .chosen = p->chosen};
    m->arena_len += keylen + p->len;
    m->nplans++;
}

/* A hit: the stored plan, as the planner writes it for an accepted site. */
static void memo_fill(const struct ap_memo *m, const struct ap_memo_slot *sl,
                      const struct ap_site *s, const uint8_t *orig, struct ap_plan *out)
{
    out->reason = ALTPATCH_REASON_NONE;
    out->bad_entry = -1;
    out->chosen = sl->chosen;
    out->len = s->len;
    out->relative = false;
    out->detail[0] = '\0';
    memcpy(out->orig, orig, s->len);
    memcpy(out->final, m->arena + sl->off + sl->keylen, s->len);
}

void ap_memo_plan(struct ap_memo *m, const struct ap_view *v, const struct ap_site *s,
                  const struct ap_entry *entries, const uint8_t *orig,
                  const struct altpatch_features *fs, struct ap_plan *out)
{
    uint8_t key[AP_MEMO_KEY_MAX];
    const uint8_t *bytes;
    size_t keylen = 0;
    uint64_t h = 0;

    if (!m || !fs || (fs != m->fs_at && memcmp(fs, &m->fs, sizeof(*fs)) != 0)) {
        ap_plan_site(v, s, entries, orig, fs, out); /* not this memo's feature set */
        return;
    }
    bytes = site_bytes(v, s, orig);
    if (bytes)
        keylen = key_build(v, s, entries, bytes, key);
    if (keylen) {
        h = key_hash(key, keylen);
        if (m->nslots) {
            const struct ap_memo_slot *sl = slot_find(m, h, key, keylen);

            if (sl->keylen) {
                m->hits++;
                memo_fill(m, sl, s, bytes, out);
                return;
            }
        }
    }
    m->misses++;
    ap_plan_site(v, s, entries, orig, fs, out);
    if (keylen && out->reason == ALTPATCH_REASON_NONE && !out->relative)
        memo_store(m, h, key, keylen, out);
}
