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
 *   - only plans that were accepted (reason NONE) are stored: a refusal's
 *     detail names addresses;
 *   - on a hit, the checks that depend on addresses are made again here
 *     (no preset refusal, the site inside one text region with bytes, every
 *     replacement inside altinstr_replacement with bytes); on any doubt, or
 *     when the key is too long or memory is short, the full planner decides.
 *
 * Relative replacements (a `call rel32`, a jcc, a RIP-relative operand).
 * Same content means the same instructions, so the same relative fields at
 * the same offsets with the same old values; only the addresses differ. For
 * a field of an instruction ending at offset `end` of its replacement, with
 * old value `old`, reloc.c keeps it when end + old (mod 2^64) lies in
 * [0, repllen] (a target inside the replacement: content alone decides),
 * else writes  new = old + repl - site  (the entry's replacement address and
 * the site's address), refused when it does not fit the field. So a stored
 * plan keeps the list of every entry's OUTSIDE fields (entry, end, position,
 * size, old value) and a hit recomputes each for this site's addresses: one
 * that does not fit, in any entry (the planner refuses RELOC_OVERFLOW for a
 * non-chosen entry too), sends the site to the planner, which refuses it with
 * its own detail; the chosen entry's new values are written over the stored
 * final bytes.
 *
 * NOP folding (plan.c fold_site) never folds across an offset of the site
 * that a relative field points to. Targets of kept fields are offsets fixed
 * by content; a relocated field points to end + new, which depends on the
 * addresses. A plan is stored only when none of the chosen entry's relocated
 * fields points inside the site [0, len) and none lies in a NOP instruction
 * (folding would rewrite its bytes), and a hit whose relocated field points
 * inside the site goes to the planner: then the cuts, hence the folding, are
 * those of the content alone, the same for every site of that content.
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
    uint16_t nfields; /* relocated fields, after the final bytes (struct ap_memo_field) */
    bool relative;    /* the planner's ap_plan.relative */
};

/** A relative field whose target lies outside its replacement (stored unaligned). */
struct ap_memo_field {
    int64_t old;   /* value in the replacement's bytes (sign-extended) */
    uint8_t entry; /* index within the site */
    uint8_t end;   /* offset of the end of its instruction in the replacement */
    uint8_t pos;   /* offset of the field in the replacement (= in the site) */
    uint8_t size;  /* 1, 2 or 4 bytes */
};

/* Most outside fields kept for one plan; more: not stored. */
#define AP_MEMO_MAX_FIELDS 64

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

/* Does @v fit a signed field of @size bytes? (reloc.c's rule) */
static bool field_fits(int64_t v, unsigned size)
{
    switch (size) {
    case 1:
        return v >= INT8_MIN && v <= INT8_MAX;
    case 2:
        return v >= INT16_MIN && v <= INT16_MAX;
    case 4:
        return v >= INT32_MIN && v <= INT32_MAX;
    default:
        return false;
    }
}

/* The value of field @f at this site: old + repl - site (mod 2^64, as reloc.c). */
static int64_t field_value(const struct ap_memo_field *f, uint64_t repl, uint64_t site)
{
    return (int64_t)((uint64_t)f->old + repl - site);
}

/*
 * Does the relocated field @f of the chosen entry point inside the site
 * [0, len)? Then NOP folding would depend on the address: not memoized.
 */
static bool field_cuts(const struct ap_memo_field *f, int64_t nv, unsigned len)
{
    return (uint64_t)f->end + (uint64_t)nv < len;
}

/* Do the @size bytes at @p hold @v (little-endian)? */
static bool field_holds(const uint8_t *p, int64_t v, unsigned size)
{
    for (unsigned i = 0; i < size; i++)
        if (p[i] != (uint8_t)((uint64_t)v >> (8 * i)))
            return false;
    return true;
}

/* Store the low @size bytes of @v at @p, little-endian. */
static void field_store(uint8_t *p, int64_t v, unsigned size)
{
    for (unsigned i = 0; i < size; i++)
        p[i] = (uint8_t)((uint64_t)v >> (8 * i));
}

/*
 * The outside fields of one replacement (@n bytes at @b, entry @k) into
 * @f[*nf..]. @p: the accepted plan when @k is its chosen entry (checked: no
 * field in a NOP, none pointing inside the site, each holding its relocated
 * value in the final bytes), else NULL. False when the plan is not to be
 * stored.
 */
static bool fields_of(const uint8_t *b, size_t n, uint32_t k, const struct ap_entry *e,
                      const struct ap_site *s, const struct ap_plan *p,
                      struct ap_memo_field *f, size_t *nf, bool *relative)
{
    struct ap_insn in;

    for (size_t off = 0; off < n; off += in.len) {
        if (ap_insn_decode(b + off, n - off, &in) < 0)
            return false; /* cannot happen: the planner decoded it */
        *relative |= in.has_rel;
        if (!in.has_rel || (uint64_t)(off + in.len) + (uint64_t)in.rel_value <= n)
            continue; /* no field, or a target inside: kept as is */
        if (*nf >= AP_MEMO_MAX_FIELDS || k > UINT8_MAX)
            return false;
        f[*nf] = (struct ap_memo_field){.old = in.rel_value, .entry = (uint8_t)k,
                                        .end = (uint8_t)(off + in.len),
                                        .pos = (uint8_t)(off + in.rel_off), .size = in.rel_size};
        if (p) {
            int64_t nv = field_value(&f[*nf], e->repl, s->addr);

            if (in.is_nop || field_cuts(&f[*nf], nv, s->len) ||
                !field_holds(p->final + f[*nf].pos, nv, in.rel_size))
                return false;
        }
        (*nf)++;
    }
    return true;
}

/*
 * Collect every entry's outside fields from the key (length, original, then
 * per entry a 5-byte header and the replacement bytes). Returns the count,
 * or -1 when the plan is not to be stored.
 */
static int fields_collect(const uint8_t *key, const struct ap_site *s,
                          const struct ap_entry *entries, const struct ap_plan *p,
                          struct ap_memo_field *f, bool *relative)
{
    size_t at = 1 + (size_t)key[0], nf = 0;

    *relative = false;
    for (uint32_t k = 0; k < s->count; k++) {
        const struct ap_entry *e = &entries[s->first + k];
        size_t n = key[at + 4];

        if (!fields_of(key + at + 5, n, k, e, s, (int)k == p->chosen ? p : NULL, f, &nf,
                       relative))
            return -1;
        at += 5 + n;
    }
    return (int)nf;
}

/* Remember an accepted plan (best effort: skipped when memory is short). */
static void memo_store(struct ap_memo *m, uint64_t h, const uint8_t *key, size_t keylen,
                       const struct ap_site *s, const struct ap_entry *entries,
                       const struct ap_plan *p)
{
    struct ap_memo_field f[AP_MEMO_MAX_FIELDS];
    struct ap_memo_slot *sl;
    size_t fsz;
    bool relative = false;
    int nf = 0;

    if (m->nplans >= AP_MEMO_MAX_PLANS)
        return;
    if (p->relative) {
        nf = fields_collect(key, s, entries, p, f, &relative);
        if (nf < 0 || !relative)
            return;
    }
    fsz = (size_t)nf * sizeof(f[0]);
    if ((m->nplans + 1) * 2 > m->nslots && !slots_grow(m))
        return;
    if (!arena_reserve(m, keylen + p->len + fsz))
        return;
    sl = slot_find(m, h, key, keylen);
    if (sl->keylen)
        return; /* already there (cannot happen: the caller missed) */
    memcpy(m->arena + m->arena_len, key, keylen);
    memcpy(m->arena + m->arena_len + keylen, p->final, p->len);
    if (fsz)
        memcpy(m->arena + m->arena_len + keylen + p->len, f, fsz);
    *sl = (struct ap_memo_slot){.hash = h, .off = m->arena_len, .keylen = (uint32_t)keylen,
                                .chosen = p->chosen, .nfields = (uint16_t)nf,
                                .relative = p->relative};
    m->arena_len += keylen + p->len + fsz;
    m->nplans++;
}

/*
 * A hit: the stored plan, as the planner writes it for an accepted site,
 * with the relocated fields recomputed for this site. False (and @out
 * unusable) when a field does not fit here or the chosen entry's points
 * inside the site: the planner decides.
 */
static bool memo_fill(const struct ap_memo *m, const struct ap_memo_slot *sl,
                      const struct ap_site *s, const struct ap_entry *entries,
                      const uint8_t *orig, struct ap_plan *out)
{
    const uint8_t *fp = m->arena + sl->off + sl->keylen + s->len;

    memcpy(out->final, m->arena + sl->off + sl->keylen, s->len);
    for (unsigned i = 0; i < sl->nfields; i++) {
        struct ap_memo_field f;
        int64_t nv;

        memcpy(&f, fp + i * sizeof(f), sizeof(f));
        nv = field_value(&f, entries[s->first + f.entry].repl, s->addr);
        if (!field_fits(nv, f.size))
            return false; /* RELOC_OVERFLOW: the planner says where */
        if (f.entry == sl->chosen) {
            if (field_cuts(&f, nv, s->len))
                return false;
            field_store(out->final + f.pos, nv, f.size);
        }
    }
    out->reason = ALTPATCH_REASON_NONE;
    out->bad_entry = -1;
    out->chosen = sl->chosen;
    out->len = s->len;
    out->relative = sl->relative;
    out->detail[0] = '\0';
    memcpy(out->orig, orig, s->len);
    return true;
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
                if (memo_fill(m, sl, s, entries, bytes, out)) {
                    m->hits++;
                    return;
                }
                keylen = 0; /* stored, but not valid at this address: the planner alone */
            }
        }
    }
    m->misses++;
    ap_plan_site(v, s, entries, orig, fs, out);
    if (keylen && out->reason == ALTPATCH_REASON_NONE)
        memo_store(m, h, key, keylen, s, entries, out);
}
