/* SPDX-License-Identifier: MIT */
/*
 * memo.c - one address-free template per site shape.
 *
 * A program has thousands of sites but only a handful of distinct site
 * shapes: the same original bytes with the same replacements. For such a
 * site the planner's answer is a function of its content alone, so the memo
 * keys a template on that content:
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
 * Per site, a lookup is: the address checks, the key copied from the
 * site's bytes (no decoder), a 64-bit hash, one probe and a compare; the
 * template is then instantiated (ap_memo_inst: the chosen entry's final
 * bytes, each relative field's value range-checked and stored). Templates
 * keep a stable id, so a caller may remember a site's template across
 * applies under the same feature set and skip the lookup.
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
/** Most templates kept by one memo; past it, new shapes go to the planner. */
#define AP_MEMO_MAX_PLANS 65536u
#define AP_MEMO_MIN_SLOTS 64u

/** One hash slot: a template's key hash and id (0: empty). */
struct ap_memo_slot {
    uint64_t hash;
    uint32_t id;
};

/** A relative field of an entry's replacement (stored unaligned). */
struct ap_memo_field {
    uint16_t kpos;  /* offset of the field in the key */
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
    free(m->tmpl);
    free(m->arena);
    m->slots = NULL;
    m->tmpl = NULL;
    m->arena = NULL;
    m->nslots = m->nplans = m->tmpl_cap = m->arena_len = m->arena_cap = m->nmasks = 0;
}

/* The site's text region has bytes at [addr, addr+len)? (ap_site_check's rule) */
static inline bool site_in_text(const struct ap_view *v, const struct ap_site *s)
{
    size_t n = v->ntext < AP_MAX_TEXT ? v->ntext : AP_MAX_TEXT;

    for (size_t i = 0; i < n; i++)
        if (ap_region_holds(&v->text[i], s->addr, s->len))
            return true;
    return false;
}

/* The bytes of entry @e's replacement when it lies inside altinstr_replacement
 * (ap_entry_repl's rule); *ok false otherwise. */
static inline const uint8_t *repl_bytes(const struct ap_view *v, const struct ap_entry *e,
                                        bool *ok)
{
    *ok = ap_region_holds(&v->repl, e->repl, e->repllen) && (v->repl.data || !e->repllen);
    return *ok && e->repllen ? v->repl.data + (e->repl - v->repl.addr) : NULL;
}

/*
 * Build the content key of site @s (original @orig, length checked by the
 * caller): length, original, per entry a 5-byte header and the replacement,
 * a final mask byte (0). 0 when a replacement lies outside altinstr_replacement
 * (the planner refuses REPL_BOUNDS) or the key is too long.
 */
static size_t key_build(const struct ap_view *v, const struct ap_site *s,
                        const struct ap_entry *entries, const uint8_t *orig, uint8_t *key)
{
    size_t len = 1 + (size_t)s->len;

    key[0] = s->len;
    ap_copy_small(key + 1, orig, s->len);
    for (uint32_t k = 0; k < s->count; k++) {
        const struct ap_entry *e = &entries[s->first + k];
        bool ok;
        const uint8_t *repl = repl_bytes(v, e, &ok);

        if (!ok || len + 5 + e->repllen + 1 > AP_MEMO_KEY_MAX)
            return 0;
        key[len] = (uint8_t)e->feature;
        key[len + 1] = (uint8_t)(e->feature >> 8);
        key[len + 2] = (uint8_t)e->flags;
        key[len + 3] = (uint8_t)(e->flags >> 8);
        key[len + 4] = e->repllen;
        ap_copy_small(key + len + 5, repl, e->repllen);
        len += 5 + (size_t)e->repllen;
    }
    key[len] = 0; /* mask 0: the content as it is */
    return len + 1;
}

/* 64-bit hash of @n bytes, 8 at a time (multiply-xorshift). */
static inline uint64_t key_hash(const uint8_t *p, size_t n)
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

        if (sl->id == 0)
            return sl;
        if (sl->hash == h) {
            const struct ap_memo_tmpl *t = &m->tmpl[sl->id - 1];

            if (t->keylen == keylen && ap_equal_small(m->arena + t->off, key, keylen))
                return sl;
        }
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
    for (size_t i = 0; i < oldn; i++) {
        if (old[i].id) {
            const struct ap_memo_tmpl *t = &m->tmpl[old[i].id - 1];

            *slot_find(m, old[i].hash, m->arena + t->off, t->keylen) = old[i];
        }
    }
    free(old);
    return true;
}

/* Room for @n more bytes in the arena and one more template; false when memory is short. */
static bool room_reserve(struct ap_memo *m, size_t n)
{
    size_t cap = m->arena_cap ? m->arena_cap : 4096;

    if (m->arena_len + n > UINT32_MAX)
        return false;
    if (m->arena_len + n > m->arena_cap) {
        uint8_t *p;

        while (cap < m->arena_len + n)
            cap *= 2;
        p = realloc(m->arena, cap);
        if (!p)
            return false;
        m->arena = p;
        m->arena_cap = cap;
    }
    if (m->nplans >= m->tmpl_cap) {
        size_t tc = m->tmpl_cap ? m->tmpl_cap * 2 : 16;
        struct ap_memo_tmpl *t = realloc(m->tmpl, tc * sizeof(*t));

        if (!t)
            return false;
        m->tmpl = t;
        m->tmpl_cap = tc;
    }
    return true;
}

/* The value (sign-extended) of the @size-byte field at @p. */
static inline int64_t field_read(const uint8_t *p, unsigned size)
{
    if (size == 4) {
        int32_t v;

        memcpy(&v, p, 4);
        return v;
    }
    if (size == 1)
        return (int8_t)p[0];
    return (int16_t)(uint16_t)(p[0] | (unsigned)p[1] << 8);
}

/*
 * The value field @f takes at this site, reloc.c's rule: kept when end + old
 * (mod 2^64) lies in [0, repllen] (a target inside its replacement), else
 * old + repl - site. False when that does not fit the field (RELOC_OVERFLOW).
 */
static inline bool field_value(const struct ap_memo_field *f, int64_t old, uint64_t repl,
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
static inline bool field_cuts(const struct ap_memo_field *f, int64_t nv, unsigned len)
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
 * @f[0..nf), and the original's, found here), key the template without their
 * values: they are zeroed and the mask named in the key's last byte, *@h
 * recomputed. So every site of that shape finds it whatever its fields
 * hold. Sound because a field's value changes neither the length nor the
 * validity of an instruction (x86 decodes prefixes, opcode, ModRM and SIB;
 * displacement and immediate bytes are data); the plan reads the original
 * only through its decoding and, when no entry is chosen, as the final
 * bytes, which are then the site's own; and ap_memo_inst() reads each
 * replacement field's value from the site's own replacement. False when the
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
 * @key keeps the site's own values). Returns the template id, or 0.
 */
static uint32_t memo_lookup(const struct ap_memo *m, const uint8_t *key, size_t keylen)
{
    const struct ap_memo_slot *sl;
    uint8_t mkey[AP_MEMO_KEY_MAX];

    if (!m->nslots || keylen < 2 || keylen > AP_MEMO_KEY_MAX)
        return 0;
    sl = slot_find(m, key_hash(key, keylen), key, keylen);
    if (sl->id)
        return sl->id;
    for (size_t i = 0; i < m->nmasks; i++) {
        if (m->masks[i].keylen != keylen)
            continue;
        ap_copy_small(mkey, key, keylen);
        mask_apply(&m->masks[i], i, mkey, keylen);
        sl = slot_find(m, key_hash(mkey, keylen), mkey, keylen);
        if (sl->id)
            return sl->id;
    }
    return 0;
}

/* Remember an accepted plan as a template (best effort: skipped when memory
 * is short). Returns its id, or 0. */
static uint32_t memo_store(struct ap_memo *m, uint8_t *key, size_t keylen,
                           const struct ap_site *s, const struct ap_entry *entries,
                           const struct ap_plan *p)
{
    struct ap_memo_field f[AP_MEMO_MAX_FIELDS];
    struct ap_memo_slot *sl;
    uint64_t h = key_hash(key, keylen);
    size_t fsz;
    bool relative = false;
    int nf;

    if (m->nplans >= AP_MEMO_MAX_PLANS || p->chosen > INT16_MAX)
        return 0;
    nf = fields_collect(key, s, entries, p, f, &relative);
    if (nf < 0 || relative != p->relative || !key_mask(m, key, keylen, f, nf, &h))
        return 0;
    fsz = (size_t)nf * sizeof(f[0]);
    if ((m->nplans + 1) * 2 > m->nslots && !slots_grow(m))
        return 0;
    if (!room_reserve(m, keylen + p->len + fsz))
        return 0;
    sl = slot_find(m, h, key, keylen);
    if (sl->id)
        return 0; /* already there (cannot happen: the caller missed) */
    memcpy(m->arena + m->arena_len, key, keylen);
    memcpy(m->arena + m->arena_len + keylen, p->final, p->len);
    if (fsz)
        memcpy(m->arena + m->arena_len + keylen + p->len, f, fsz);
    m->tmpl[m->nplans] = (struct ap_memo_tmpl){.off = (uint32_t)m->arena_len,
                                               .keylen = (uint16_t)keylen, .len = p->len,
                                               .nfields = (uint8_t)nf,
                                               .chosen = (int16_t)p->chosen,
                                               .relative = p->relative};
    m->arena_len += keylen + p->len + fsz;
    *sl = (struct ap_memo_slot){.hash = h, .id = (uint32_t)++m->nplans};
    return sl->id;
}

uint32_t ap_memo_find(struct ap_memo *m, const struct ap_view *v, const struct ap_site *s,
                      const struct ap_entry *entries, const uint8_t *orig)
{
    uint8_t key[AP_MEMO_KEY_MAX];
    size_t keylen;

    if (!m->nplans || s->reason || !s->len || !s->count || !site_in_text(v, s))
        return 0;
    keylen = key_build(v, s, entries, orig, key);
    return keylen ? memo_lookup(m, key, keylen) : 0;
}

int ap_memo_inst(const struct ap_memo *m, uint32_t id, const struct ap_view *v,
                 const struct ap_site *s, const struct ap_entry *entries, uint8_t *final)
{
    const struct ap_memo_tmpl *t = &m->tmpl[id - 1];
    const uint8_t *fp = m->arena + t->off + t->keylen + t->len;

    if (t->chosen >= 0)
        ap_copy_small(final, m->arena + t->off + t->keylen, t->len);
    for (unsigned i = 0; i < t->nfields; i++) {
        struct ap_memo_field f;
        const struct ap_entry *e;
        int64_t nv;

        memcpy(&f, fp + i * sizeof(f), sizeof(f));
        e = &entries[s->first + f.entry];
        /* inside altinstr_replacement: ap_memo_find() checked it */
        if (!field_value(&f, field_read(v->repl.data + (e->repl - v->repl.addr) + f.pos, f.size),
                         e->repl, s->addr, &nv))
            return -2; /* RELOC_OVERFLOW: the planner says where */
        if (f.entry == t->chosen) {
            if (field_cuts(&f, nv, s->len))
                return -2;
            ap_rel_store(final + f.pos, nv, f.size);
        }
    }
    return t->chosen;
}

uint32_t ap_memo_plan(struct ap_memo *m, const struct ap_view *v, const struct ap_site *s,
                      const struct ap_entry *entries, const uint8_t *orig,
                      const struct altpatch_features *fs, struct ap_plan *out)
{
    uint8_t key[AP_MEMO_KEY_MAX];
    const uint8_t *bytes;
    size_t keylen = 0;

    if (!m || !fs || (fs != m->fs_at && memcmp(fs, &m->fs, sizeof(*fs)) != 0)) {
        ap_plan_site(v, s, entries, orig, fs, out); /* not this memo's feature set */
        return 0;
    }
    if (ap_site_check(v, s, orig, &bytes) == ALTPATCH_REASON_NONE)
        keylen = key_build(v, s, entries, bytes, key);
    if (keylen) {
        uint32_t id = memo_lookup(m, key, keylen);

        if (id) {
            int chosen = ap_memo_inst(m, id, v, s, entries, out->final);

            if (chosen >= -1) {
                if (chosen < 0)
                    memcpy(out->final, bytes, s->len); /* the site's own original */
                out->reason = ALTPATCH_REASON_NONE;
                out->bad_entry = -1;
                out->chosen = chosen;
                out->len = s->len;
                out->relative = m->tmpl[id - 1].relative;
                out->detail[0] = '\0';
                memcpy(out->orig, bytes, s->len);
                m->hits++;
                return id;
            }
            keylen = 0; /* stored, but not valid at this address: the planner alone */
        }
    }
    m->misses++;
    ap_plan_site(v, s, entries, orig, fs, out);
    if (keylen && out->reason == ALTPATCH_REASON_NONE)
        return memo_store(m, key, keylen, s, entries, out);
    return 0;
}
