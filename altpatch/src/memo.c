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
 * Relative fields (a `call rel32`, a jcc, a RIP-relative operand), in the
 * original or in a replacement. Every ALTPATCH_ALT_CALL site is a different
 * `call oldfn` with a different `call newfn` replacement: same instructions,
 * other field values. So when an accepted plan has relative fields, it is
 * keyed WITHOUT their values (zeroed in the key, whose last byte names the
 * field layout, a "mask"; a lookup that misses as it is tries each known
 * mask of its key length). That is sound because a field's value changes
 * neither the length nor the validity of an instruction, and:
 *
 *   - the original is read only through its decoding, and as the final
 *     bytes when no entry is chosen (taken from the site itself on a hit);
 *   - each replacement field is recomputed on a hit from THIS site's value
 *     `old` and addresses, reloc.c's rule: for an instruction ending at
 *     offset `end` of a replacement of `repllen` bytes, kept when end + old
 *     (mod 2^64) lies in [0, repllen] (a target inside), else
 *     new = old + repl - site (the entry's replacement address and the
 *     site's), and one that does not fit, in ANY entry (the planner refuses
 *     RELOC_OVERFLOW for a non-chosen entry too), sends the site to the
 *     planner, which refuses it with its own detail. The chosen entry's
 *     values are written over the stored final bytes.
 *
 * NOP folding (plan.c fold_site) never folds across an offset of the site
 * that a relative field of the final bytes points to, and those targets now
 * depend on field values and addresses. A plan is stored only when none of
 * the chosen entry's fields points inside the site [0, len) (so a branch
 * within its replacement is never memoized) and none lies in a NOP
 * instruction (folding would rewrite its bytes), and a hit whose chosen
 * field points inside the site goes to the planner: folding then has no cut
 * at all, for the stored site as for this one, and NOP kinds and lengths
 * come from the instructions, which are the same.
 *
 * The table belongs to the caller (no globals, nothing shared between
 * threads); the planner itself stays pure. tests/test_memo.c compares memo
 * and planner on varied sites.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

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

/** A relative field of an entry's replacement (stored unaligned). */
struct ap_memo_field {
    uint16_t kpos;  /* offset of the field in the key (its value is read from there) */
    uint8_t entry;  /* index within the site */
    uint8_t end;    /* offset of the end of its instruction in the replacement */
    uint8_t pos;    /* offset of the field in the replacement (= in the site) */
    uint8_t size;   /* 1, 2 or 4 bytes */
    uint8_t repllen; /* of its replacement */
};

/* Most relative fields kept for one plan (replacements and original); more: not stored. */
#define AP_MEMO_MAX_FIELDS 8

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
    m->nslots = m->nplans = m->arena_len = m->arena_cap = m->nmasks = 0;
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

        const uint8_t *repl;

        if (!ap_entry_repl(v, e, &repl))
            return 0; /* the planner refuses it (REPL_BOUNDS) */
        if (!key_put(key, &len, hdr, sizeof(hdr)) ||
            (e->repllen && !key_put(key, &len, repl, e->repllen)))
            return 0;
    }
    return key_put(key, &len, "", 1) ? len : 0; /* mask 0: the original as it is */
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

/* The value (sign-extended) of the @size-byte field at @p. */
static int64_t field_read(const uint8_t *p, unsigned size)
{
    uint64_t u = 0;

    for (unsigned i = 0; i < size; i++)
        u |= (uint64_t)p[i] << (8 * i);
    if ((u >> (8 * size - 1)) & 1)
        u |= ~0ull << (8 * size - 1);
    return (int64_t)u;
}

/*
 * The value field @f takes at this site, reloc.c's rule: kept when end + old
 * (mod 2^64) lies in [0, repllen] (a target inside its replacement), else
 * old + repl - site. False when that does not fit the field (RELOC_OVERFLOW).
 */
static bool field_value(const struct ap_memo_field *f, int64_t old, uint64_t repl,
                        uint64_t site, int64_t *nv)
{
    if ((uint64_t)f->end + (uint64_t)old <= f->repllen) {
        *nv = old;
        return true;
    }
    *nv = (int64_t)((uint64_t)old + repl - site);
    return ap_rel_fits(*nv, f->size);
}

/*
 * Does field @f of the chosen entry, of value @nv at the site, point inside
 * the site [0, len)? Then NOP folding is cut there: not memoized.
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

/*
 * The relative fields of one replacement (@n bytes at key offset @at, entry
 * @k) into @f[*nf..]. @p: the accepted plan when @k is its chosen entry
 * (checked: no field in a NOP, none pointing inside the site, each holding
 * its value in the final bytes), else NULL. False when the plan is not to
 * be stored.
 */
static bool fields_of(const uint8_t *key, size_t at, size_t n, uint32_t k,
                      const struct ap_entry *e, const struct ap_site *s,
                      const struct ap_plan *p, struct ap_memo_field *f, size_t *nf,
                      bool *relative)
{
    struct ap_insn in;

    for (size_t off = 0; off < n; off += in.len) {
        int64_t nv;

        if (ap_insn_decode(key + at + off, n - off, &in) < 0)
            return false; /* cannot happen: the planner decoded it */
        *relative |= in.has_rel;
        if (!in.has_rel)
            continue;
        if (*nf >= AP_MEMO_MAX_FIELDS || k > UINT8_MAX)
            return false;
        f[*nf] = (struct ap_memo_field){.kpos = (uint16_t)(at + off + in.rel_off),
                                        .entry = (uint8_t)k, .end = (uint8_t)(off + in.len),
                                        .pos = (uint8_t)(off + in.rel_off), .size = in.rel_size,
                                        .repllen = (uint8_t)n};
        if (p && (in.is_nop || !field_value(&f[*nf], in.rel_value, e->repl, s->addr, &nv) ||
                  field_cuts(&f[*nf], nv, s->len) ||
                  !field_holds(p->final + f[*nf].pos, nv, in.rel_size)))
            return false;
        (*nf)++;
    }
    return true;
}

/*
 * Collect every entry's relative fields from the key (length, original, then
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

        if (!fields_of(key, at + 5, n, k, e, s, (int)k == p->chosen ? p : NULL, f, &nf,
                       relative))
            return -1;
        at += 5 + n;
    }
    return (int)nf;
}

/* Zero the fields of mask @i in @key (built by key_build) and name the mask in its last byte. */
static void mask_apply(const struct ap_memo_mask *mk, size_t i, uint8_t *key, size_t keylen)
{
    for (unsigned j = 0; j < mk->n; j++)
        memset(key + mk->pos[j], 0, mk->size[j]);
    key[keylen - 1] = (uint8_t)(i + 1);
}

/* The index of mask @mk in @m, added if new; -1 when the list is full. */
static int mask_find(struct ap_memo *m, const struct ap_memo_mask *mk)
{
    for (size_t i = 0; i < m->nmasks; i++)
        if (memcmp(&m->masks[i], mk, sizeof(*mk)) == 0)
            return (int)i;
    if (m->nmasks >= AP_MEMO_MAX_MASKS)
        return -1;
    m->masks[m->nmasks] = *mk;
    return (int)m->nmasks++;
}

/*
 * Before storing: when the content has relative fields (the replacements'
 * @f[0..nf), and the original's, found here), key the plan without their
 * values: they are zeroed and the mask named in the key's last byte, *@h
 * recomputed. So every site of that content finds it whatever its fields
 * hold. Sound because a field's value changes neither the length nor the
 * validity of an instruction (x86 decodes prefixes, opcode, ModRM and SIB;
 * displacement and immediate bytes are data); the plan reads the original
 * only through its decoding and, when no entry is chosen, as the final
 * bytes, which memo_fill() takes from the site itself; and memo_fill() reads
 * each replacement field's value from the site's own key. False when the
 * plan is not to be stored.
 */
static bool key_mask(struct ap_memo *m, uint8_t *key, size_t keylen,
                     const struct ap_memo_field *f, int nf, uint64_t *h)
{
    struct ap_memo_mask mk;
    struct ap_insn in;
    int i;

    memset(&mk, 0, sizeof(mk)); /* compared with memcmp: no stray padding */
    mk.keylen = (uint16_t)keylen;
    for (size_t off = 0; off < key[0]; off += in.len) {
        if (ap_insn_decode(key + 1 + off, key[0] - off, &in) < 0)
            return false; /* cannot happen: the planner decoded it */
        if (!in.has_rel)
            continue;
        if (mk.n >= sizeof(mk.size))
            return false;
        mk.pos[mk.n] = (uint16_t)(1 + off + in.rel_off);
        mk.size[mk.n++] = in.rel_size;
    }
    for (int j = 0; j < nf; j++) {
        if (mk.n >= sizeof(mk.size))
            return false;
        mk.pos[mk.n] = f[j].kpos;
        mk.size[mk.n++] = f[j].size;
    }
    if (mk.n == 0)
        return true; /* keyed as it is */
    i = mask_find(m, &mk);
    if (i < 0)
        return false;
    mask_apply(&m->masks[i], (size_t)i, key, keylen);
    *h = key_hash(key, keylen);
    return true;
}

/*
 * Look @key up as it is, then under each mask of its length (on a copy:
 * @key keeps the site's own values). Returns the slot found or NULL.
 */
static const struct ap_memo_slot *memo_find(const struct ap_memo *m, const uint8_t *key,
                                            size_t keylen, uint64_t h)
{
    const struct ap_memo_slot *sl;
    uint8_t mkey[AP_MEMO_KEY_MAX];

    if (!m->nslots)
        return NULL;
    sl = slot_find(m, h, key, keylen);
    if (sl->keylen)
        return sl;
    for (size_t i = 0; i < m->nmasks; i++) {
        if (m->masks[i].keylen != keylen)
            continue;
        memcpy(mkey, key, keylen);
        mask_apply(&m->masks[i], i, mkey, keylen);
        sl = slot_find(m, key_hash(mkey, keylen), mkey, keylen);
        if (sl->keylen)
            return sl;
    }
    return NULL;
}

/* Remember an accepted plan (best effort: skipped when memory is short). */
static void memo_store(struct ap_memo *m, uint64_t h, uint8_t *key, size_t keylen,
                       const struct ap_site *s, const struct ap_entry *entries,
                       const struct ap_plan *p)
{
    struct ap_memo_field f[AP_MEMO_MAX_FIELDS];
    struct ap_memo_slot *sl;
    size_t fsz;
    bool relative = false;
    int nf;

    if (m->nplans >= AP_MEMO_MAX_PLANS)
        return;
    nf = fields_collect(key, s, entries, p, f, &relative);
    if (nf < 0 || relative != p->relative || !key_mask(m, key, keylen, f, nf, &h))
        return;
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
 * with every relative field recomputed from this site's own values (@key)
 * and addresses. False (and @out unusable) when a field does not fit here or
 * one of the chosen entry's points inside the site: the planner decides.
 */
static bool memo_fill(const struct ap_memo *m, const struct ap_memo_slot *sl,
                      const struct ap_site *s, const struct ap_entry *entries,
                      const uint8_t *key, const uint8_t *orig, struct ap_plan *out)
{
    const uint8_t *fp = m->arena + sl->off + sl->keylen + s->len;

    /* none chosen: the original, this site's own (its relative fields may differ) */
    memcpy(out->final, sl->chosen < 0 ? orig : m->arena + sl->off + sl->keylen, s->len);
    for (unsigned i = 0; i < sl->nfields; i++) {
        struct ap_memo_field f;
        int64_t nv;

        memcpy(&f, fp + i * sizeof(f), sizeof(f));
        if (!field_value(&f, field_read(key + f.kpos, f.size), entries[s->first + f.entry].repl,
                         s->addr, &nv))
            return false; /* RELOC_OVERFLOW: the planner says where */
        if (f.entry == sl->chosen) {
            if (field_cuts(&f, nv, s->len))
                return false;
            ap_rel_store(out->final + f.pos, nv, f.size);
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
    if (ap_site_check(v, s, orig, &bytes) == ALTPATCH_REASON_NONE)
        keylen = key_build(v, s, entries, bytes, key);
    if (keylen) {
        const struct ap_memo_slot *sl;

        h = key_hash(key, keylen);
        sl = memo_find(m, key, keylen, h);
        if (sl) {
            if (memo_fill(m, sl, s, entries, key, bytes, out)) {
                m->hits++;
                return;
            }
            keylen = 0; /* stored, but not valid at this address: the planner alone */
        }
    }
    m->misses++;
    ap_plan_site(v, s, entries, orig, fs, out);
    if (keylen && out->reason == ALTPATCH_REASON_NONE)
        memo_store(m, h, key, keylen, s, entries, out);
}
