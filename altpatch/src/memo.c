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
 * other field values. So when an accepted plan has relative fields, its
 * template is keyed WITHOUT their values: the key holds zeros there and a
 * byte mask beside the key leaves them out of the compare. That is sound
 * because a field's value changes neither the length nor the validity of
 * an instruction, and:
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
 * Lookup without a decoder: templates are hashed on a SIGNATURE that no
 * relative field can change -- the site length, the entry count, every
 * entry's feature, flags and replacement length, and the first byte of the
 * original and of every replacement (an opcode or prefix byte: a relative
 * field never starts an instruction). Templates of one signature share its
 * hash; each candidate is compared with the site's bytes under its mask.
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
 * Hints (plan.h, ap_memo_find_text): a site of one or two entries is looked
 * up by its records first. Identical replacements are emitted once, so the
 * sites of a shape share their replacements' addresses: the entries'
 * replacement addresses and headers, with the site's entry count and
 * length, name the template last found for them in one replacement region.
 * The same addresses and lengths in the same region are inside it, and until
 * the caller drops the hints (ap_memo_hints_drop(): whenever the bytes its
 * views show may have changed) they hold the bytes the template was matched
 * with; the site's original is compared with the template under its mask
 * each time. A miss, or a site whose bytes differ, takes the full lookup,
 * which leaves a hint where it finds a template.
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
/** The first table's slots (half used at most): a small program's shapes in 256 bytes. */
#define AP_MEMO_MIN_SLOTS 16u

/** One hash slot: a template's signature hash and id (0: empty). */
struct ap_memo_slot {
    uint64_t hash;
    uint32_t id;
};

/* Most relative fields kept for one plan (replacements and original); more: not stored. */
#define AP_MEMO_MAX_FIELDS 8

void ap_memo_init(struct ap_memo *m, const struct altpatch_features *fs)
{
    memset(m, 0, sizeof(*m));
    ap_memo_init_zeroed(m, fs);
}

AP_HOT void ap_memo_init_zeroed(struct ap_memo *m, const struct altpatch_features *fs)
{
    struct altpatch_features known;

    if (fs) {
        m->fs = *fs;
        m->fs_at = fs;
    }
    memset(known.word, 0xff, sizeof(known.word));
    ap_mask_known(&known);
    for (size_t w = 0; w < AP_NCAPWORDS; w++) {
        m->keep[0][w] = known.word[w] & ~m->fs.word[w];
        m->keep[1][w] = known.word[w] & m->fs.word[w];
    }
}

void ap_memo_free(struct ap_memo *m)
{
    ap_mem_free(m->slots);
    ap_mem_free(m->tmpl);
    while (m->arena) {
        uint8_t *prev;

        memcpy(&prev, m->arena, sizeof(prev));
        ap_mem_free(m->arena);
        m->arena = prev;
    }
    m->slots = NULL;
    m->tmpl = NULL;
    m->arena = NULL;
    m->nslots = m->nplans = m->tmpl_cap = m->arena_len = m->arena_cap = m->nmasks = 0;
    ap_memo_hints_drop(m);
}

/* ap_region_holds(), inline: it runs for every site and entry. */
static inline bool holds(const struct ap_region *r, uint64_t addr, uint64_t len)
{
    return addr >= r->addr && len <= r->size && addr - r->addr <= r->size - len;
}

/* The site's text region has bytes at [addr, addr+len)? (ap_site_check's rule) */
static inline bool site_in_text(const struct ap_view *v, const struct ap_site *s)
{
    size_t n = v->ntext < AP_MAX_TEXT ? v->ntext : AP_MAX_TEXT;

    for (size_t i = 0; i < n; i++)
        if (holds(&v->text[i], s->addr, s->len))
            return true;
    return false;
}

/* Entry @e's replacement lies inside altinstr_replacement (ap_entry_repl's rule)? */
static inline bool repl_ok(const struct ap_view *v, const struct ap_entry *e)
{
    return holds(&v->repl, e->repl, e->repllen) && (v->repl.data || !e->repllen);
}

/* Its bytes (only after repl_ok(); NULL for length 0). */
static inline const uint8_t *repl_at(const struct ap_view *v, const struct ap_entry *e)
{
    return e->repllen ? v->repl.data + (e->repl - v->repl.addr) : NULL;
}

static inline uint64_t mix(uint64_t h, uint64_t w)
{
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

/* The last step: every bit of @x reaches the low bits (the slot index). */
static inline uint64_t fin(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The signature's first word: length, the original's first byte, entry count. */
static inline uint64_t sig_start(const struct ap_site *s, const uint8_t *orig, uint32_t count)
{
    return mix(0x9e3779b97f4a7c15ull,
               (uint64_t)s->len | (uint64_t)orig[0] << 8 | (uint64_t)count << 16);
}

/* An entry's signature word (@rb: its replacement bytes, NULL for none). */
static inline uint64_t sig_entry(const struct ap_entry *e, const uint8_t *rb)
{
    return (uint64_t)e->feature | (uint64_t)e->flags << 16 | (uint64_t)e->repllen << 32 |
           (uint64_t)(e->repllen ? rb[0] : 0) << 40;
}

/*
 * The signature hash of site @s (original @orig): length, entry count, per
 * entry feature, flags, replacement length and first replacement byte, the
 * original's first byte. Nothing a relative field's value changes. False
 * when a replacement lies outside altinstr_replacement (REPL_BOUNDS: the
 * planner decides).
 */
static inline bool sig_hash(const struct ap_view *v, const struct ap_site *s,
                            const struct ap_entry *entries, const uint8_t *orig, uint64_t *h)
{
    uint64_t x = sig_start(s, orig, s->count);

    for (uint32_t k = 0; k < s->count; k++) {
        const struct ap_entry *e = &entries[s->first + k];

        if (!repl_ok(v, e))
            return false;
        x = mix(x, sig_entry(e, repl_at(v, e)));
    }
    *h = fin(x);
    return true;
}

/* Are the @n bytes at @a equal to those at @b where @mk has bits set? */
static inline bool masked_equal(const uint8_t *a, const uint8_t *b, const uint8_t *mk, size_t n)
{
    uint64_t x, y, z, d = 0;

    if (n < 8) {
        uint32_t p, q, r;

        if (n < 4) {
            for (size_t i = 0; i < n; i++)
                d |= (uint64_t)((a[i] ^ b[i]) & mk[i]);
            return d == 0;
        }
        memcpy(&p, a, 4);
        memcpy(&q, b, 4);
        memcpy(&r, mk, 4);
        d = (p ^ q) & r;
        memcpy(&p, a + n - 4, 4);
        memcpy(&q, b + n - 4, 4);
        memcpy(&r, mk + n - 4, 4);
        return (d | ((p ^ q) & r)) == 0;
    }
    if (n > 16) {
        for (size_t i = 0; i < n; i++)
            d |= (uint64_t)((a[i] ^ b[i]) & mk[i]);
        return d == 0;
    }
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    memcpy(&z, mk, 8);
    d = (x ^ y) & z;
    memcpy(&x, a + n - 8, 8);
    memcpy(&y, b + n - 8, 8);
    memcpy(&z, mk + n - 8, 8);
    return (d | ((x ^ y) & z)) == 0;
}

/* The header word of a one-entry site: everything but the bytes. */
static inline uint64_t one_header(const struct ap_site *s, const struct ap_entry *e)
{
    return (uint64_t)e->feature | (uint64_t)e->flags << 16 | (uint64_t)e->repllen << 32 |
           (uint64_t)s->len << 40 | 1ull << 48;
}

/* The header word of a second entry. */
static inline uint64_t two_header(const struct ap_entry *e)
{
    return (uint64_t)e->feature | (uint64_t)e->flags << 16 | (uint64_t)e->repllen << 32;
}

/* Can site @s be kept as words (a template's one)? 1 or 2 entries, or 0. */
static inline uint8_t words_entries(const struct ap_site *s, const struct ap_entry *entries)
{
    if (s->len > 16 || s->count == 0 || s->count > 2)
        return 0;
    for (uint32_t k = 0; k < s->count; k++)
        if (entries[s->first + k].repllen > 16)
            return 0;
    return (uint8_t)s->count;
}

/* A site of one or two entries against a template of the same count kept as
 * words: five or eight words, no loop. */
static inline bool words_match(const struct ap_memo_tmpl *t, const struct ap_view *v,
                               const struct ap_site *s, const struct ap_entry *entries,
                               const uint8_t *orig)
{
    const struct ap_entry *e = &entries[s->first];
    uint64_t o1, o2, r1, r2, d;

    if (t->one != words_entries(s, entries) || one_header(s, e) != t->w[0])
        return false;
    ap_memo_words(orig, s->len, &o1, &o2);
    ap_memo_words(repl_at(v, e), e->repllen, &r1, &r2);
    d = ((o1 ^ t->w[1]) & t->wm[0]) | ((o2 ^ t->w[2]) & t->wm[1]) |
        ((r1 ^ t->w[3]) & t->wm[2]) | ((r2 ^ t->w[4]) & t->wm[3]);
    if (t->one == 2) {
        e++;
        if (two_header(e) != t->w[5])
            return false;
        ap_memo_words(repl_at(v, e), e->repllen, &r1, &r2);
        d |= ((r1 ^ t->w[6]) & t->wm[4]) | ((r2 ^ t->w[7]) & t->wm[5]);
    }
    return d == 0;
}

/*
 * Is site @s (original @orig; every replacement checked by sig_hash()) of
 * the shape of template @t? Its bytes against the template's key under the
 * key's mask: length, original, per entry the 5-byte header and the
 * replacement.
 */
AP_PLAIN_PATH static bool tmpl_match(const struct ap_memo_tmpl *t, const struct ap_view *v,
                       const struct ap_site *s, const struct ap_entry *entries,
                       const uint8_t *orig)
{
    const uint8_t *key = t->key, *mk = key + t->keylen;
    size_t at = 1 + (size_t)s->len;

    if (t->one)
        return words_match(t, v, s, entries, orig);
    if (t->len != s->len || t->count != s->count || !masked_equal(orig, key + 1, mk + 1, s->len))
        return false;
    for (uint32_t k = 0; k < s->count; k++) {
        const struct ap_entry *e = &entries[s->first + k];
        const uint8_t *h = key + at;

        if (at + 5 + e->repllen > t->keylen ||
            (h[0] | h[1] << 8) != e->feature || (h[2] | h[3] << 8) != e->flags ||
            h[4] != e->repllen || !masked_equal(repl_at(v, e), h + 5, mk + at + 5, e->repllen))
            return false;
        at += 5 + (size_t)e->repllen;
    }
    return at == t->keylen;
}

/* The template of site @s among those of signature hash @h, or 0. */
static uint32_t memo_lookup(const struct ap_memo *m, uint64_t h, const struct ap_view *v,
                            const struct ap_site *s, const struct ap_entry *entries,
                            const uint8_t *orig)
{
    size_t mask = m->nslots - 1;

    if (!m->nslots)
        return 0;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        const struct ap_memo_slot *sl = &m->slots[i];

        if (sl->id == 0)
            return 0;
        if (sl->hash == h && tmpl_match(&m->tmpl[sl->id - 1], v, s, entries, orig))
            return sl->id;
    }
}

/* The first empty slot from @h's place on. */
static struct ap_memo_slot *slot_free(const struct ap_memo *m, uint64_t h)
{
    size_t mask = m->nslots - 1;
    size_t i = (size_t)h & mask;

    while (m->slots[i].id)
        i = (i + 1) & mask;
    return &m->slots[i];
}

/* Double the table (or create it); false when memory is short. */
static bool slots_grow(struct ap_memo *m)
{
    size_t n = m->nslots ? m->nslots * 2 : AP_MEMO_MIN_SLOTS;
    struct ap_memo_slot *old = m->slots, *nw = ap_mem_calloc(n, sizeof(*nw));
    size_t oldn = m->nslots;

    if (!nw)
        return false;
    m->slots = nw;
    m->nslots = n;
    for (size_t i = 0; i < oldn; i++)
        if (old[i].id)
            *slot_free(m, old[i].hash) = old[i];
    ap_mem_free(old);
    return true;
}

/** Bytes of one arena block (a template takes at most ~1.4 KB; a longer one gets its own). */
#define AP_MEMO_BLOCK 4096u
/** The first block: a small program's few templates (8 sites: about 240 bytes), so
 * that its first apply's blocks stay within a page or two (mem.c's region). */
#define AP_MEMO_FIRST_BLOCK 512u
/** The first template array's entries. */
#define AP_MEMO_FIRST_TMPL 8u

/* Room for @n more bytes in the arena and one more template; false when memory is short. */
static bool room_reserve(struct ap_memo *m, size_t n)
{
    if (!m->arena || m->arena_len + n > m->arena_cap) {
        size_t block = m->arena ? AP_MEMO_BLOCK : AP_MEMO_FIRST_BLOCK;
        size_t cap = n + sizeof(uint8_t *) > block ? n + sizeof(uint8_t *) : block;
        uint8_t *b = ap_mem_alloc(cap);

        if (!b)
            return false;
        memcpy(b, &m->arena, sizeof(m->arena)); /* the previous block */
        m->arena = b;
        m->arena_len = sizeof(uint8_t *);
        m->arena_cap = cap;
    }
    if (m->nplans >= m->tmpl_cap) {
        size_t tc = m->tmpl_cap ? m->tmpl_cap * 2 : AP_MEMO_FIRST_TMPL;
        struct ap_memo_tmpl *t = ap_mem_realloc(m->tmpl, tc * sizeof(*t));

        if (!t)
            return false;
        m->tmpl = t;
        m->tmpl_cap = tc;
    }
    return true;
}

/* An entry's feature and flags, the first 4 bytes of its header in a key. */
static inline void key_head(uint8_t *h, const struct ap_entry *e)
{
    h[0] = (uint8_t)e->feature;
    h[1] = (uint8_t)(e->feature >> 8);
    h[2] = (uint8_t)e->flags;
    h[3] = (uint8_t)(e->flags >> 8);
}

/*
 * The content key of site @s (original @orig; replacements checked by
 * sig_hash()): length, original, per entry a 5-byte header and the
 * replacement. 0 when it is too long.
 */
static size_t key_build(const struct ap_view *v, const struct ap_site *s,
                        const struct ap_entry *entries, const uint8_t *orig, uint8_t *key)
{
    size_t len = 1 + (size_t)s->len;

    key[0] = s->len;
    ap_copy_small(key + 1, orig, s->len);
    for (uint32_t k = 0; k < s->count; k++) {
        const struct ap_entry *e = &entries[s->first + k];

        if (len + 5 + e->repllen > AP_MEMO_KEY_MAX)
            return 0;
        key_head(key + len, e);
        key[len + 4] = e->repllen;
        if (e->repllen)
            ap_copy_small(key + len + 5, repl_at(v, e), e->repllen);
        len += 5 + (size_t)e->repllen;
    }
    return len;
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

/* ap_rel_fits() and ap_rel_store() inline, for the 1-, 2- and 4-byte fields
 * the decoder reports: they run for every relative field of every site. */
static inline bool field_fits(int64_t v, unsigned size)
{
    int64_t lim;

    if (size != 1 && size != 2 && size != 4)
        return false;
    lim = (int64_t)1 << (8 * size - 1);
    return v >= -lim && v < lim;
}

static inline void field_store(uint8_t *p, int64_t v, unsigned size)
{
    uint32_t u = (uint32_t)(uint64_t)v;

    if (size == 4) {
        memcpy(p, &u, 4);
    } else {
        p[0] = (uint8_t)u;
        if (size == 2)
            p[1] = (uint8_t)(u >> 8);
    }
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
    return field_fits(*nv, f->size);
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
 * One relative field of a replacement (@n bytes at key offset @at, entry
 * @k; its instruction @in at offset @off) into @f[*nf]. @p: the accepted
 * plan when @k is its chosen entry (checked: no field in a NOP, none
 * pointing inside the site, each holding its value in the final bytes),
 * else NULL. False when the plan is not to be stored.
 */
static bool field_add(size_t at, size_t n, uint32_t k, const struct ap_entry *e,
                      const struct ap_site *s, const struct ap_plan *p, size_t off,
                      const struct ap_insn *in, struct ap_memo_field *f, size_t *nf)
{
    int64_t nv;

    if (*nf >= AP_MEMO_MAX_FIELDS || k > UINT8_MAX)
        return false;
    f[*nf] = (struct ap_memo_field){.kpos = (uint16_t)(at + off + in->rel_off),
                                    .entry = (uint8_t)k, .end = (uint8_t)(off + in->len),
                                    .pos = (uint8_t)(off + in->rel_off), .size = in->rel_size,
                                    .repllen = (uint8_t)n};
    if (p && (in->is_nop || !field_value(&f[*nf], in->rel_value, e->repl, s->addr, &nv) ||
              field_cuts(&f[*nf], nv, s->len) ||
              !field_holds(p->final + f[*nf].pos, nv, in->rel_size)))
        return false;
    (*nf)++;
    return true;
}

/*
 * Entry @k's relative fields (its replacement: @n bytes at key + @at), from
 * the list the planner made while it decoded them (@all), or, where that
 * list overflowed, by decoding the replacement again. @p: the plan when @k
 * is its chosen entry, else NULL.
 */
static bool fields_of(const uint8_t *key, size_t at, size_t n, uint32_t k,
                      const struct ap_entry *e, const struct ap_site *s,
                      const struct ap_plan *p, const struct ap_plan *all,
                      struct ap_memo_field *f, size_t *nf, bool *relative)
{
    struct ap_insn in;

    if (!all->fields_over) {
        for (size_t j = 0; j < all->nfields; j++) {
            const struct ap_plan_field *pf = &all->fields[j];

            if (pf->entry != (int)k)
                continue;
            in = (struct ap_insn){.len = pf->len, .is_nop = pf->is_nop, .has_rel = true,
                                  .rel_is_branch = pf->branch, .rel_off = pf->rel_off,
                                  .rel_size = pf->rel_size, .rel_value = pf->value};
            *relative = true;
            if (!field_add(at, n, k, e, s, p, pf->off, &in, f, nf))
                return false;
        }
        return true;
    }
    for (size_t off = 0; off < n; off += in.len) {
        if (ap_insn_decode(key + at + off, n - off, &in) < 0)
            return false; /* cannot happen: the planner decoded it */
        *relative |= in.has_rel;
        if (in.has_rel && !field_add(at, n, k, e, s, p, off, &in, f, nf))
            return false;
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

        if (!fields_of(key, at + 5, n, k, e, s, (int)k == p->chosen ? p : NULL, p, f, &nf,
                       relative))
            return -1;
        at += 5 + n;
    }
    return (int)nf;
}

/*
 * Before storing: the key's byte mask (0xff: compared), with the relative
 * fields of the replacements (@f[0..nf)) and of the original (from the
 * plan's list, or decoded here where that list overflowed) left out and zeroed in @key, so that every site of that shape matches
 * whatever its fields hold. Sound because a field's value changes neither
 * the length nor the validity of an instruction (x86 decodes prefixes,
 * opcode, ModRM and SIB; displacement and immediate bytes are data); the
 * plan reads the original only through its decoding and, when no entry is
 * chosen, as the final bytes, which are then the site's own; and
 * ap_memo_inst() reads each replacement field's value from the site's own
 * replacement. False when the plan is not to be stored.
 */
static bool key_mask(uint8_t *key, uint8_t *mk, size_t keylen, const struct ap_memo_field *f,
                     int nf, const struct ap_plan *p)
{
    struct ap_insn in;

    ap_fill_small(mk, 0xff, keylen); /* no call into the C library */
    if (!p->fields_over) {
        /* the original's fields as the planner listed them */
        for (size_t j = 0; j < p->nfields; j++) {
            if (p->fields[j].entry >= 0)
                continue;
            ap_fill_small(mk + 1 + p->fields[j].off + p->fields[j].rel_off, 0,
                          p->fields[j].rel_size);
        }
    } else {
        for (size_t off = 0; off < key[0]; off += in.len) {
            if (ap_insn_decode(key + 1 + off, key[0] - off, &in) < 0)
                return false; /* cannot happen: the planner decoded it */
            if (!in.has_rel)
                continue;
            ap_fill_small(mk + 1 + off + in.rel_off, 0, in.rel_size);
        }
    }
    for (int j = 0; j < nf; j++)
        ap_fill_small(mk + f[j].kpos, 0, f[j].size);
    for (size_t i = 0; i < keylen; i++)
        key[i] &= mk[i];
    return true;
}

/* Room for one more template of @n bytes (its slot, its bytes, its entry):
 * where its bytes go (the arena's next), or NULL when the memo is full or
 * memory is short. */
AP_PLAIN_PATH static uint8_t *tmpl_room(struct ap_memo *m, size_t n)
{
    if (m->nplans >= AP_MEMO_MAX_PLANS)
        return NULL;
    if ((m->nplans + 1) * 2 > m->nslots && !slots_grow(m))
        return NULL;
    if (!room_reserve(m, n))
        return NULL;
    return m->arena + m->arena_len;
}

/*
 * Template number m->nplans + 1 from its bytes at @at (tmpl_room()'s: key,
 * mask, final bytes, @nf fields), for site @s of signature hash @h: its
 * words, its slot. Returns its id.
 */
AP_PLAIN_PATH static uint32_t tmpl_add(struct ap_memo *m, uint64_t h, const struct ap_site *s,
                         const struct ap_entry *entries, const uint8_t *at, size_t keylen,
                         unsigned len, unsigned nf, int chosen, bool relative)
{
    struct ap_memo_tmpl *t = &m->tmpl[m->nplans];
    size_t fsz = (size_t)nf * sizeof(struct ap_memo_field);
    bool masked = false; /* some field left out of the key */

    for (size_t j = 0; j < keylen; j++)
        masked |= at[keylen + j] != 0xff;

    *t = (struct ap_memo_tmpl){.key = at,
                               .keylen = (uint16_t)keylen,
                               .count = (uint16_t)s->count, .len = (uint8_t)len,
                               .nfields = (uint8_t)nf,
                               .chosen = (int16_t)chosen,
                               .relative = relative};
    if (nf) {
        ap_copy_small((uint8_t *)&t->f0, at + 2 * keylen + len, sizeof(t->f0));
        t->rel32 = nf == 1 && t->f0.entry == chosen && t->f0.size == 4;
    }
    if (words_entries(s, entries)) {
        const uint8_t *mkey = at + keylen;
        const struct ap_entry *e = &entries[s->first];
        size_t r0 = 1 + (size_t)s->len + 5; /* the first replacement in the key */

        t->one = words_entries(s, entries);
        t->w[0] = one_header(s, e);
        ap_memo_words(at + 1, s->len, &t->w[1], &t->w[2]);
        ap_memo_words(mkey + 1, s->len, &t->wm[0], &t->wm[1]);
        ap_memo_words(at + r0, e->repllen, &t->w[3], &t->w[4]);
        ap_memo_words(mkey + r0, e->repllen, &t->wm[2], &t->wm[3]);
        if (t->one == 2) {
            size_t r1 = r0 + e->repllen + 5;

            t->w[5] = two_header(&e[1]);
            ap_memo_words(at + r1, e[1].repllen, &t->w[6], &t->w[7]);
            ap_memo_words(mkey + r1, e[1].repllen, &t->wm[4], &t->wm[5]);
        }
    }
    m->arena_len += 2 * keylen + len + fsz;
    m->nmasks += masked;
    *slot_free(m, h) = (struct ap_memo_slot){.hash = h, .id = (uint32_t)++m->nplans};
    return (uint32_t)m->nplans;
}

/* Remember an accepted plan as a template of signature hash @h (best effort:
 * skipped when memory is short). Returns its id, or 0. */
static uint32_t memo_store(struct ap_memo *m, uint64_t h, const struct ap_view *v,
                           const struct ap_site *s, const struct ap_entry *entries,
                           const uint8_t *orig, const struct ap_plan *p)
{
    struct ap_memo_field f[AP_MEMO_MAX_FIELDS];
    uint8_t key[AP_MEMO_KEY_MAX], *at;
    size_t keylen, fsz;
    bool relative = false;
    int nf;

    if (p->chosen > INT16_MAX)
        return 0;
    keylen = key_build(v, s, entries, orig, key);
    if (!keylen)
        return 0;
    nf = fields_collect(key, s, entries, p, f, &relative);
    if (nf < 0 || relative != p->relative)
        return 0;
    fsz = (size_t)nf * sizeof(f[0]);
    at = tmpl_room(m, 2 * keylen + p->len + fsz);
    if (!at || !key_mask(key, at + keylen, keylen, f, nf, p))
        return 0;
    ap_copy_small(at, key, keylen); /* no call into the C library: see util.h */
    ap_copy_small(at + 2 * keylen, p->final, p->len);
    if (fsz)
        ap_copy_small(at + 2 * keylen + p->len, (const uint8_t *)f, fsz);
    return tmpl_add(m, h, s, entries, at, keylen, p->len, (unsigned)nf, p->chosen, p->relative);
}

uint32_t ap_memo_find_hint2(const struct ap_memo *m, const struct ap_site *s,
                            const struct ap_entry *e, const uint8_t *orig)
{
    const struct ap_memo_hint *h = &m->hint[ap_memo_hint_at2(m, ap_memo_hint_key(e))];
    return ap_memo_hint_holds(h, ap_memo_hint_site(s), e, s, orig) ? h->id : 0;
}

/*
 * Which of key @p key's two slots a hint for it goes to: an empty one the
 * key was found at without a hint last time (the fill's second time), else
 * an empty one no other key waits at, else one holding a hint of this key
 * (another shape's with the same first record), else an empty one another
 * key waits at, else the first (both hold other keys' hints). So two keys
 * that share a slot and are met in turn wait at two slots and get a hint
 * each, and two shapes of one key keep one each, instead of taking each
 * other's turn forever.
 */
static struct ap_memo_hint *hint_slot(struct ap_memo *m, uint64_t key)
{
    struct ap_memo_hint *c[2] = {&m->hint[ap_memo_hint_at(m, key)],
                                 &m->hint[ap_memo_hint_at2(m, key)]};

    for (int k = 0; k < 2; k++)
        if (!c[k]->id && c[k]->seen == key)
            return c[k];
    for (int k = 0; k < 2; k++)
        if (!c[k]->id && !c[k]->seen)
            return c[k];
    for (int k = 0; k < 2; k++)
        if (c[k]->id && ap_memo_hint_key_of(c[k]->repl[0], c[k]->hdr[0]) == key)
            return c[k];
    for (int k = 0; k < 2; k++)
        if (!c[k]->id)
            return c[k];
    return c[0];
}

_Static_assert(AP_MEMO_HINTS == 32, "a slot is five bits of the product, a mask bit each");

/*
 * Another multiplier for the hint slots under which key @p key and the key
 * of every hint held now have first slots of their own (a few odd
 * constants tried in turn): the hints move there, the keys waiting for a
 * second sighting are forgotten. False, nothing changed, when none does.
 */
static bool hint_rehash(struct ap_memo *m, uint64_t key)
{
    static const uint64_t muls[] = {
        0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull,
        0xd6e8feb86659fd93ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull,
        0xff51afd7ed558ccdull, 0xc4ceb9fe1a85ec53ull, 0x2545f4914f6cdd1dull,
    };
    uint64_t keys[AP_MEMO_HINTS + 1];
    size_t n = 0;
    for (size_t i = 0; i < AP_MEMO_HINTS; i++)
        if (m->hint[i].id)
            keys[n++] = ap_memo_hint_key_of(m->hint[i].repl[0], m->hint[i].hdr[0]);
    keys[n++] = key;
    uint64_t now = m->hint_mul ? m->hint_mul : AP_MEMO_HINT_MUL;
    for (size_t t = 0; t < sizeof(muls) / sizeof(muls[0]); t++) {
        if (muls[t] == now)
            continue;
        uint32_t used = 0;
        size_t k = 0;
        for (; k < n; k++) {
            uint32_t bit = 1u << ap_memo_hint_slot(keys[k] * muls[t]);
            if (used & bit)
                break;
            used |= bit;
        }
        if (k < n)
            continue;
        struct ap_memo_hint old[AP_MEMO_HINTS];
        memcpy(old, m->hint, sizeof(old));
        memset(m->hint, 0, sizeof(m->hint));
        m->hint_mul = muls[t];
        for (size_t i = 0; i < AP_MEMO_HINTS; i++)
            if (old[i].id) {
                struct ap_memo_hint *h = &m->hint[ap_memo_hint_at(
                    m, ap_memo_hint_key_of(old[i].repl[0], old[i].hdr[0]))];
                *h = old[i];
                h->seen = 0;
            }
        return true;
    }
    return false;
}

/*
 * Template @id (kept as words, of @s->count entries) answered site @s in
 * view @v: remember it for the site's replacement addresses and headers
 * (ap_memo_find_text(), plan.h), the second time in a row that a site whose
 * first entry has its key (ap_memo_hint_key(): replacement address and
 * header) is found without a hint (a replacement used
 * by one site only, as in a table built without shared replacements, costs
 * a compare and a store, not a hint). The hints were proven in one
 * replacement region; another one drops them.
 */
static void hint_fill(struct ap_memo *m, const struct ap_view *v, const struct ap_site *s,
                      const struct ap_entry *e, uint32_t id)
{
    uint64_t key = ap_memo_hint_key(e);
    struct ap_memo_hint *h = hint_slot(m, key);
    const struct ap_memo_tmpl *t = &m->tmpl[id - 1];

    if (h->seen != key) {
        h->seen = key;
        return;
    }
    struct ap_memo_hint *first = &m->hint[ap_memo_hint_at(m, key)];
    if (!ap_memo_hints_in(m, &v->repl)) {
        memset(m->hint, 0, sizeof(m->hint));
        m->hint_repl = v->repl;
        h = first; /* every slot empty now */
    }
    /* another key holds the first slot (or both): first slots for all, if
     * a multiplier gives them; else the second slot, looked up out of line,
     * or another key's hint taken */
    if ((h != first || (h->id && ap_memo_hint_key_of(h->repl[0], h->hdr[0]) != key)) &&
        hint_rehash(m, key))
        h = &m->hint[ap_memo_hint_at(m, key)];
    *h = (struct ap_memo_hint){
        .site = ap_memo_hint_site(s),
        .repl = {e->repl, s->count == 2 ? e[1].repl : 0},
        .hdr = {ap_memo_hint_hdr(e), s->count == 2 ? ap_memo_hint_hdr(&e[1]) : 0},
        .w = {t->w[1], t->w[2]},
        .wm = {t->wm[0], t->wm[1]},
        .seen = key,
        .id = id};
}

/*
 * ap_memo_find() for a site of one or two entries, the site and every
 * replacement at most 16 bytes (most sites): sig_hash() and words_match()
 * with the site's words read once, in one loop over the slots. Same answer
 * as memo_lookup().
 */
static uint32_t find_words(struct ap_memo *m, const struct ap_view *v,
                           const struct ap_site *s, const struct ap_entry *entries,
                           const uint8_t *orig)
{
    const struct ap_entry *e = &entries[s->first];
    const uint8_t *rb, *rb2 = NULL;
    uint64_t x, h, hdr, hdr2 = 0, o1, o2, r1, r2, q1 = 0, q2 = 0;
    size_t mask = m->nslots - 1;
    uint8_t one = (uint8_t)s->count; /* 1 or 2 */

    if (!repl_ok(v, e))
        return 0;
    rb = repl_at(v, e);
    x = mix(sig_start(s, orig, one), sig_entry(e, rb));
    if (one == 2) {
        if (!repl_ok(v, &e[1]))
            return 0;
        rb2 = repl_at(v, &e[1]);
        hdr2 = two_header(&e[1]);
        x = mix(x, sig_entry(&e[1], rb2));
        ap_memo_words(rb2, e[1].repllen, &q1, &q2);
    }
    h = fin(x);
    hdr = one_header(s, e);
    ap_memo_words(orig, s->len, &o1, &o2);
    ap_memo_words(rb, e->repllen, &r1, &r2);
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        const struct ap_memo_slot *sl = &m->slots[i];
        const struct ap_memo_tmpl *t;
        uint64_t d;

        if (sl->id == 0)
            return 0;
        if (sl->hash != h)
            continue;
        t = &m->tmpl[sl->id - 1];
        if (t->one != one) {
            if (tmpl_match(t, v, s, entries, orig))
                return sl->id;
            continue;
        }
        if (hdr != t->w[0])
            continue;
        d = ((o1 ^ t->w[1]) & t->wm[0]) | ((o2 ^ t->w[2]) & t->wm[1]) |
            ((r1 ^ t->w[3]) & t->wm[2]) | ((r2 ^ t->w[4]) & t->wm[3]);
        if (one == 2)
            d |= (hdr2 ^ t->w[5]) | ((q1 ^ t->w[6]) & t->wm[4]) | ((q2 ^ t->w[7]) & t->wm[5]);
        if (d == 0) {
            hint_fill(m, v, s, e, sl->id);
            return sl->id;
        }
    }
}

uint32_t ap_memo_find(struct ap_memo *m, const struct ap_view *v, const struct ap_site *s,
                      const struct ap_entry *entries, const uint8_t *orig)
{
    if (!site_in_text(v, s))
        return 0;
    return ap_memo_find_text(m, v, s, entries, orig);
}

/* ap_memo_find_text() for a site of more entries or bytes than words hold:
 * apart, so that the common sites' lookup keeps a small frame. */
static __attribute__((noinline)) uint32_t find_long(const struct ap_memo *m,
                                                    const struct ap_view *v,
                                                    const struct ap_site *s,
                                                    const struct ap_entry *entries,
                                                    const uint8_t *orig)
{
    uint64_t h;

    if (!sig_hash(v, s, entries, orig, &h))
        return 0;
    return memo_lookup(m, h, v, s, entries, orig);
}

/* ap_memo_find_text() without the hints: the signature hash and the slots. */
AP_PLAIN_PATH uint32_t ap_memo_find_full(struct ap_memo *m, const struct ap_view *v, const struct ap_site *s,
                           const struct ap_entry *entries, const uint8_t *orig)
{
    if (!m->nplans || s->reason || !s->len || !s->count)
        return 0;
    if (words_entries(s, entries))
        return find_words(m, v, s, entries, orig);
    return find_long(m, v, s, entries, orig);
}


int ap_memo_inst_general(const struct ap_memo *m, uint32_t id, const struct ap_view *v,
                         const struct ap_site *s, const struct ap_entry *entries, uint8_t *buf,
                         const uint8_t **final)
{
    const struct ap_memo_tmpl *t = &m->tmpl[id - 1];
    const uint8_t *fin = t->key + 2 * (size_t)t->keylen;
    const uint8_t *fp = fin + t->len;

    *final = fin;
    if (t->chosen >= 0) {
        ap_copy_small(buf, fin, t->len);
        *final = buf;
    }
    for (unsigned i = 0; i < t->nfields; i++) {
        struct ap_memo_field f;
        const struct ap_entry *e;
        int64_t nv;

        memcpy(&f, fp + i * sizeof(f), sizeof(f));
        e = &entries[s->first + f.entry];
        /* inside altinstr_replacement: ap_memo_find() checked it */
        if (!field_value(&f, field_read(repl_at(v, e) + f.pos, f.size), e->repl, s->addr, &nv))
            return -2; /* RELOC_OVERFLOW: the planner says where */
        if (f.entry == t->chosen) {
            if (field_cuts(&f, nv, s->len))
                return -2;
            field_store(buf + f.pos, nv, f.size);
        }
    }
    return t->chosen;
}

AP_STATE bool ap_known_plans_off;

/*
 * A template of this library's own build for site @s (signature hash @h,
 * original @orig, every replacement checked by sig_hash()), taken into
 * @m: one of ap_known_plans[] whose key matches the site's bytes under its
 * mask (the entries' features and flags taken from the site) and whose
 * entry is the one @fs selects here (ap_plan_pick()). Returns its id, or 0
 * (none, or memory short): the planner decides.
 */
static uint32_t known_take(struct ap_memo *m, uint64_t h, const struct ap_view *v,
                           const struct ap_site *s, const struct ap_entry *entries,
                           const uint8_t *orig, const struct altpatch_features *fs)
{
    int pick = AP_PICK_REFUSED - 1; /* asked at the first candidate */

    if (ap_known_plans_off)
        return 0;
    for (size_t i = 0; i < ap_known_nplans; i++) {
        const struct ap_known_plan *k = &ap_known_plans[i];
        size_t fsz = (size_t)k->nfields * sizeof(struct ap_memo_field);
        size_t n = 2 * (size_t)k->keylen + k->len, at = 1 + (size_t)s->len;
        struct ap_memo_tmpl t;
        uint8_t *key;

        if (k->len != s->len || k->count != s->count)
            continue;
        if (pick == AP_PICK_REFUSED - 1)
            pick = ap_plan_pick(v, s, entries, fs);
        if (k->chosen != pick)
            continue;
        /* into the arena's next bytes, kept only if the site matches */
        key = tmpl_room(m, n + fsz);
        if (!key)
            return 0;
        ap_copy_small(key, ap_known_bytes + k->at, n);
        if (fsz)
            ap_copy_small(key + n, (const uint8_t *)&ap_known_fields[k->fields_at], fsz);
        for (uint32_t j = 0; j < s->count && at + 5 <= k->keylen; j++) {
            key_head(key + at, &entries[s->first + j]);
            at += 5 + (size_t)key[at + 4];
        }
        t = (struct ap_memo_tmpl){.key = key, .keylen = k->keylen, .count = k->count,
                                  .len = k->len};
        if (!tmpl_match(&t, v, s, entries, orig))
            continue;
        m->known++;
        return tmpl_add(m, h, s, entries, key, k->keylen, k->len, k->nfields, k->chosen,
                        k->relative);
    }
    return 0;
}

AP_PLAIN_PATH uint32_t ap_memo_plan(struct ap_memo *m, const struct ap_view *v, const struct ap_site *s,
                      const struct ap_entry *entries, const uint8_t *orig,
                      const struct altpatch_features *fs, struct ap_plan *out)
{
    const uint8_t *bytes;
    bool keyed = false;
    uint64_t h = 0;

    if (!m || !fs || (fs != m->fs_at && memcmp(fs, &m->fs, sizeof(*fs)) != 0)) {
        ap_plan_site(v, s, entries, orig, fs, out); /* not this memo's feature set */
        return 0;
    }
    if (ap_site_check(v, s, orig, &bytes) == ALTPATCH_REASON_NONE)
        keyed = sig_hash(v, s, entries, bytes, &h);
    if (keyed) {
        uint32_t id = memo_lookup(m, h, v, s, entries, bytes);
        bool known = false;

        if (!id)
            known = (id = known_take(m, h, v, s, entries, bytes, fs)) != 0;
        if (id) {
            const uint8_t *fin;
            int chosen = ap_memo_inst(m, id, v, s, entries, out->final, &fin);

            if (chosen >= -1) {
                /* none chosen: the site's own original */
                /* fin is out->final or a template's bytes, never part of
                 * it; copies without a library call (nothing to bind) */
                const uint8_t *src = chosen < 0 ? bytes : fin;
                if (src != out->final)
                    ap_copy_small(out->final, src, s->len);
                out->reason = ALTPATCH_REASON_NONE;
                out->bad_entry = -1;
                out->chosen = chosen;
                out->len = s->len;
                out->relative = m->tmpl[id - 1].relative;
                out->detail[0] = '\0';
                ap_copy_small(out->orig, bytes, s->len);
                m->hits += !known;
                return id;
            }
            keyed = false; /* stored, but not valid at this address: the planner alone */
        }
    }
    m->misses++;
    ap_plan_site(v, s, entries, orig, fs, out);
    if (keyed && out->reason == ALTPATCH_REASON_NONE)
        return memo_store(m, h, v, s, entries, bytes, out);
    return 0;
}
