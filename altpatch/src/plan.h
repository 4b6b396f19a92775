/* SPDX-License-Identifier: MIT */
/*
 * plan.h - floor 2 of libaltpatch: the planner (floors: pure.h, util.h).
 *
 *   plan.c   decide one site's final bytes: PURE (no system calls, no
 *            globals, no allocation); the same code serves live memory and
 *            ELF files
 *   memo.c   one address-free template per site shape (a table the caller owns)
 */
#ifndef ALTPATCH_PLAN_H
#define ALTPATCH_PLAN_H

#include "pure.h"


/** An address range and its bytes (data may be NULL for "no bytes available"). */
struct ap_region {
    uint64_t addr;
    uint64_t size;
    const uint8_t *data;
};

#define AP_MAX_TEXT 16

/** A module as the planner sees it. */
struct ap_view {
    struct ap_region text[AP_MAX_TEXT]; /* where sites may lie (executable, minus repl) */
    size_t ntext;
    struct ap_region repl;              /* altinstr_replacement */
};

/**
 * One relative field met while the planner decoded a site: in the original
 * (entry -1) or in entry @c entry's replacement. Address-free: offsets within
 * the block, the value as encoded there (before relocation).
 */
struct ap_plan_field {
    int16_t entry;    /* -1: the original; else the entry's index within the site */
    uint8_t off;      /* the instruction's offset within its block */
    uint8_t len;      /* its length */
    uint8_t rel_off;  /* the field's offset within the instruction */
    uint8_t rel_size; /* 1, 2 or 4 */
    bool branch;      /* a branch immediate; else a RIP-relative displacement */
    bool is_nop;      /* the instruction is a NOP (0f 1f 05 disp32) */
    int32_t value;    /* sign-extended, as decoded */
};

#define AP_PLAN_MAX_FIELDS 8

struct ap_plan {
    int reason;       /* ALTPATCH_REASON_*; NONE when final is valid */
    int bad_entry;    /* index (within the site) of the entry that caused a refusal, or -1 */
    int chosen;       /* index (within the site) of the selected entry; -1 = original */
    uint8_t len;      /* site length */
    uint8_t orig[AP_MAX_SITE];
    uint8_t final[AP_MAX_SITE]; /* == orig when chosen == -1 or refused */
    char detail[160]; /* human-readable detail of a refusal */
    /* Some entry's replacement has a relative field, so the plan depends on
     * the site's and the replacements' addresses, not on bytes alone (memo.c
     * relocates such a stored plan again for each site). Valid when reason
     * is NONE. */
    bool relative;
    /* Every relative field of the original and of each replacement, in
     * decoding order (original first, then entries in order), so that a
     * caller needs no decoder to find them. Valid when reason is NONE;
     * complete only when !fields_over (more than AP_PLAN_MAX_FIELDS met). */
    uint8_t nfields;
    bool fields_over;
    struct ap_plan_field fields[AP_PLAN_MAX_FIELDS];
};

/** Whether entry @p e applies under @p fs (feature present, or absent with ALT_FLAG_NOT). */
AP_HIDDEN bool ap_entry_eligible(const struct ap_entry *e, const struct altpatch_features *fs);

/** ap_plan_pick(): a record of the site is refused by the planner whatever the CPU. */
#define AP_PICK_REFUSED (-2)

/**
 * The entry the planner selects at site @p s under @p fs -- the last eligible
 * one, -1 for none -- as far as the records and the view tell without
 * decoding: AP_PICK_REFUSED when the site or one of its records is refused
 * before any decoding (a preset reason, an empty site, the site outside the
 * text, an unknown feature, a flag but ALT_FLAG_NOT, a replacement longer
 * than the site or outside altinstr_replacement). The planner's own
 * selection is this rule (ap_entry_eligible()); the decoding checks are not
 * made here (a caller that holds a plan made with them, a pre-patched
 * file's, compares its choice with this one).
 */
AP_HIDDEN int ap_plan_pick(const struct ap_view *v, const struct ap_site *s,
                           const struct ap_entry *entries, const struct altpatch_features *fs);

/**
 * Decide one site. Validates the site and *every* entry of it (so a refusal does
 * not depend on the CPU), then picks the last eligible entry, copies its
 * replacement, relocates it from the replacement's address to the site's,
 * pads to the site length and folds NOP runs. @p orig: the site's original
 * bytes if the caller keeps them (memory may already be patched), else NULL to
 * read them from @p v. Never fails outright: refusals are in out->reason, and
 * then out->final == out->orig.
 */
AP_HIDDEN void ap_plan_site(const struct ap_view *v, const struct ap_site *s,
                            const struct ap_entry *entries, const uint8_t *orig,
                            const struct altpatch_features *fs, struct ap_plan *out);

/**
 * What a caller with its own record dialect (a Linux kernel image, read by
 * altdump) tells the planner instead of this library's tables: the feature
 * ids that exist (bit id of @c known, word*32+bit as in a feature set), and
 * the flags besides ALT_FLAG_NOT that it resolves itself. An entry with such
 * a flag is validated and planned like any other; the caller then adjusts the
 * final bytes it stands for (the kernel's ALT_FLAG_DIRECT_CALL).
 */
struct ap_plan_rules {
    uint32_t known[AP_NCAPWORDS];
    unsigned flags;
};

/** ap_plan_site() under @p rules (NULL: this library's features and flags). */
AP_HIDDEN void ap_plan_site_rules(const struct ap_view *v, const struct ap_site *s,
                                  const struct ap_entry *entries, const uint8_t *orig,
                                  const struct altpatch_features *fs,
                                  const struct ap_plan_rules *rules, struct ap_plan *out);

/** [addr, addr+len) within @p r? (no wrap-around) */
AP_HIDDEN bool ap_region_holds(const struct ap_region *r, uint64_t addr, uint64_t len);
/** The first region of @p v->text holding [addr, addr+len), or NULL. */
AP_HIDDEN const struct ap_region *ap_view_find(const struct ap_view *v, uint64_t addr,
                                               uint64_t len);
/** Find [addr, addr+len) inside one region of @p v->text; returns its bytes or NULL. */
AP_HIDDEN const uint8_t *ap_view_text(const struct ap_view *v, uint64_t addr, uint64_t len);

/*
 * The checks of a site and of an entry that depend on addresses, made by the
 * planner and again by the memo for a site it answers (the same rules once).
 */

/**
 * A site's refusal known before its bytes are decoded: @p s->reason, else
 * EMPTY_SITE (no length or no entry), else SITE_BOUNDS (not inside one text
 * region, or no bytes there and none in @p orig), else NONE with *@p bytes
 * the original bytes (@p orig when given, else the view's).
 */
AP_HIDDEN int ap_site_check(const struct ap_view *v, const struct ap_site *s,
                            const uint8_t *orig, const uint8_t **bytes);
/**
 * Whether entry @p e's replacement lies inside @p v->repl with bytes there
 * (false: REPL_BOUNDS); *@p bytes is its first byte (NULL for length 0).
 */
AP_HIDDEN bool ap_entry_repl(const struct ap_view *v, const struct ap_entry *e,
                             const uint8_t **bytes);

/* ------------------------------------------------------------------------- */
/* Shape templates (memo.c): one plan per site shape                         */
/* ------------------------------------------------------------------------- */

/**
 * A site's plan depends on its SHAPE -- length, original bytes, every
 * entry's feature, flags and replacement bytes -- and, for relative fields,
 * on arithmetic over its addresses. The memo keeps one address-free template
 * per shape under one feature set: the key (the shape, relative field values
 * zeroed), the chosen entry, the final bytes with holes for the chosen
 * entry's relative fields, and where every replacement's relative fields lie
 * (each one is range-checked per site, chosen or not: the planner refuses
 * RELOC_OVERFLOW for any entry). Zydis runs per shape, never per site.
 * Owned by the caller; ap_memo_init() allocates nothing.
 */
/** A relative field of an entry's replacement (stored unaligned after a
 * template's final bytes; the first one also in the template). */
struct ap_memo_field {
    uint16_t kpos;   /* offset of the field in the key */
    uint8_t entry;   /* index within the site */
    uint8_t end;     /* offset of the end of its instruction in the replacement */
    uint8_t pos;     /* offset of the field in the replacement (= in the site) */
    uint8_t size;    /* 1, 2 or 4 bytes */
    uint8_t repllen; /* of its replacement */
};

/** One template (stable index: a site may keep it as "id" = index + 1). */
struct ap_memo_tmpl {
    const uint8_t *key; /* in the arena (never moves): the key, its byte mask, the
                         * final bytes, the fields */
    uint16_t keylen;
    uint16_t count;   /* entries */
    uint8_t len;      /* site length */
    uint8_t nfields;  /* relative fields of the replacements (struct ap_memo_field) */
    int16_t chosen;   /* entry selected; -1 = the original */
    bool relative;    /* the planner's ap_plan.relative */
    /* One entry (most sites) or two, site and replacements of at most 16
     * bytes: the key as words -- header, original, replacement, and for a
     * second entry its header and replacement -- and the masks of the bytes,
     * for a compare without loops (memo.c, ap_memo_words). 0: not kept so. */
    uint8_t one;
    /* Its only relative field is the chosen entry's rel32 (f0): instantiated
     * inline (ap_memo_inst_fields()). */
    bool rel32;
    struct ap_memo_field f0; /* the first relative field (nfields > 0) */
    uint64_t w[8], wm[6];
};

/**
 * A lookup by the records alone: the template last found for a site of one
 * or two entries with these replacement addresses and headers (feature,
 * flags, replacement length; the site's length and entry count) inside the
 * memo's hint region. Identical replacements are emitted once, so most
 * sites of one shape share it. A hint stands for the replacements it was
 * made from: the same addresses and lengths in the same region lie inside
 * altinstr_replacement and, while that region's bytes stay as they were
 * (the caller drops the hints whenever they may have changed:
 * ap_memo_hints_drop()), hold the same bytes. The site's own bytes are
 * compared with the template's under its mask every time.
 */
struct ap_memo_hint {
    uint64_t site;    /* ap_memo_hint_site(): entry count and length, no preset reason */
    uint64_t repl[2]; /* the entries' replacement addresses (second: 0 for one entry) */
    uint64_t hdr[2];  /* ap_memo_hint_hdr() of each (second: 0 for one entry) */
    uint64_t w[2], wm[2]; /* the template's words of the original and their masks */
    uint64_t seen;        /* the key (ap_memo_hint_key()) last found here without a hint */
    uint32_t id;          /* 0: empty */
};

/** Hints kept by one memo: a key (the first entry's ap_memo_hint_key()) has
 * two slots (ap_memo_hint_at(), ap_memo_hint_at2()); a slot is the top five
 * bits of a product (memo.c's hint_rehash() keeps a 32-bit mask of them). */
#define AP_MEMO_HINTS 32u

struct ap_memo {
    struct altpatch_features fs; /* the set every plan was made for */
    const struct altpatch_features *fs_at; /* where the caller keeps it (unchanged while in use) */
    struct ap_memo_slot *slots;  /* open addressing, power-of-two size */
    size_t nslots, nplans;
    struct ap_memo_tmpl *tmpl;   /* nplans templates */
    size_t tmpl_cap;
    uint8_t *arena;              /* the current block of templates' bytes (blocks are
                                  * chained through their first word, never moved) */
    size_t arena_len, arena_cap;
    uint64_t hits, misses;       /* sites answered from the memo / by the planner */
    uint64_t known;              /* sites answered by a template taken from ap_known_plans[] */
    size_t nmasks;               /* templates keyed without relative field values */
    /* Bit id of keep[f]: an entry of feature id and flags f (0, or
     * ALT_FLAG_NOT) does not apply under fs, and the feature is known. */
    uint32_t keep[2][AP_NCAPWORDS];
    /* The replacement region every hint was proven in (another one: the
     * hints are dropped), and the hints. */
    struct ap_region hint_repl;
    struct ap_memo_hint hint[AP_MEMO_HINTS];
    uint64_t hint_mul; /* the slots' multiplier (odd; 0: AP_MEMO_HINT_MUL) */
};

/**
 * A template this library's planner made when the library was written, for
 * a shape its own primitives emit (primitives.h, alternative.h): the memo's
 * bytes of it (key, key mask, final bytes) and its fields, for the entry
 * @c chosen, each entry's feature and flags zero in the key.
 * known_plans.c holds them, printed by tests/known_plans_gen.c (which plans
 * every primitive's sites, tests/ap_every_primitive.h, under a feature set
 * per entry); tests/test_known.c plans them again and compares. A memo that
 * misses takes one whose key matches the site's bytes under its mask, the
 * entries' features and flags aside, and whose entry is the one its set
 * selects at the site (ap_plan_pick()), instead of planning the site: no
 * Zydis for the primitives' shapes, whatever feature an ALT_CALL names. The
 * planner's answer depends on the features only through that selection
 * (and the refusals ap_plan_pick() makes itself). Everything that depends
 * on addresses is checked as for any stored template.
 */
struct ap_known_plan {
    uint16_t at;        /* its key, mask (keylen bytes each) and final bytes (len):
                         * ap_known_bytes[at..] */
    uint16_t fields_at; /* its fields: ap_known_fields[fields_at..] */
    uint16_t keylen, count;
    uint8_t len, nfields;
    int8_t chosen;
    bool relative;
};
AP_HIDDEN extern const struct ap_known_plan ap_known_plans[];
AP_HIDDEN extern const size_t ap_known_nplans;
/* Offsets, not pointers: the table needs no relocation when it is loaded. */
AP_HIDDEN extern const uint8_t ap_known_bytes[];
AP_HIDDEN extern const struct ap_memo_field ap_known_fields[];
/** Tests: plan every shape (the known plans not looked at). */
AP_HIDDEN extern bool ap_known_plans_off;

/**
 * Forget the lookups by records (ap_memo_hint): for a caller whose views'
 * replacement bytes may have changed since it last looked up a site (each
 * apply: a library may have been unloaded and another mapped at its place).
 */
static inline void ap_memo_hints_drop(struct ap_memo *m)
{
    memset(&m->hint_repl, 0, sizeof(m->hint_repl));
    memset(m->hint, 0, sizeof(m->hint)); /* the multiplier stays: the same keys come again */
}

/** An empty memo for plans made under @p fs. */
AP_HIDDEN void ap_memo_init(struct ap_memo *m, const struct altpatch_features *fs);
/** ap_memo_init() of a memo whose bytes are all zero already (a static one
 * never used): its 3 KiB are not written again, nor its pages touched. */
AP_HIDDEN void ap_memo_init_zeroed(struct ap_memo *m, const struct altpatch_features *fs);
/** Free what @p m holds; it is then empty (and may be used again). */
AP_HIDDEN void ap_memo_free(struct ap_memo *m);
/**
 * ap_plan_site() with the same arguments and the same result, answered from
 * @p m when a site of the same shape was planned before (the address checks
 * are made again, relative fields computed for this site's addresses).
 * Accepted plans are stored. Returns the id of the template that answered
 * or was stored (0: none).
 * @p m NULL, or @p fs other than the memo's set: the planner alone. The set
 * given to ap_memo_init() is recognised by its address, so the caller must
 * not change it while it uses the memo; any other pointer is compared by
 * content.
 */
AP_HIDDEN uint32_t ap_memo_plan(struct ap_memo *m, const struct ap_view *v,
                                const struct ap_site *s, const struct ap_entry *entries,
                                const uint8_t *orig, const struct altpatch_features *fs,
                                struct ap_plan *out);
/**
 * The template of site @p s (original bytes @p orig, non-NULL), or 0: the
 * site's address checks pass (no preset reason, inside one text region,
 * every replacement inside altinstr_replacement) and a site of its shape was
 * planned and accepted under the memo's set. No planner, no Zydis.
 */
AP_HIDDEN uint32_t ap_memo_find(struct ap_memo *m, const struct ap_view *v,
                                const struct ap_site *s, const struct ap_entry *entries,
                                const uint8_t *orig);
/**
 * ap_memo_find() for a caller that knows the site lies inside one text
 * region of @p v with bytes there (it read @p orig from it, and the view has
 * not changed since): every other check is made. Both find a site of one or
 * two entries by its records first (ap_memo_hint): the caller calls
 * ap_memo_hints_drop() when the replacement bytes its views show may have
 * changed since its last lookup.
 */
static inline uint32_t ap_memo_find_text(struct ap_memo *m, const struct ap_view *v,
                                         const struct ap_site *s,
                                         const struct ap_entry *entries, const uint8_t *orig);
/** ap_memo_find_text() without the hints: the signature hash and the slots. */
AP_HIDDEN uint32_t ap_memo_find_full(struct ap_memo *m, const struct ap_view *v,
                                     const struct ap_site *s, const struct ap_entry *entries,
                                     const uint8_t *orig);

/* @n (<= 16) bytes at @p p as two words (overlapping loads; the same
 * positions for the same @n, so a site's words and a template's line up). */
static inline void ap_memo_words(const uint8_t *p, size_t n, uint64_t *a, uint64_t *b)
{
    if (n >= 8) {
        memcpy(a, p, 8);
        memcpy(b, p + n - 8, 8);
    } else if (n >= 4) {
        uint32_t x, y;

        memcpy(&x, p, 4);
        memcpy(&y, p + n - 4, 4);
        *a = x;
        *b = y;
    } else {
        *a = n ? (uint64_t)p[0] | (uint64_t)p[n / 2] << 8 | (uint64_t)p[n - 1] << 16 : 0;
        *b = 0;
    }
}

_Static_assert(offsetof(struct ap_entry, flags) == offsetof(struct ap_entry, feature) + 2 &&
                   offsetof(struct ap_entry, repllen) == offsetof(struct ap_entry, feature) + 5 &&
                   sizeof(struct ap_entry) >= offsetof(struct ap_entry, feature) + 8,
               "struct ap_entry: feature, flags, instrlen, repllen in one word");

/* A hint's header of entry @p e: its feature, flags and replacement length
 * (one load; instrlen and padding left out). */
static inline uint64_t ap_memo_hint_hdr(const struct ap_entry *e)
{
    uint64_t x;

    memcpy(&x, &e->feature, sizeof(x));
    return x & 0x0000ff00ffffffffull;
}

_Static_assert(offsetof(struct ap_site, reason) == offsetof(struct ap_site, count) + 2 &&
                   offsetof(struct ap_site, len) == offsetof(struct ap_site, count) + 3 &&
                   sizeof(struct ap_site) == offsetof(struct ap_site, count) + 4,
               "struct ap_site: count, reason and len in its last 4 bytes");

/* A hint's site word of @p s: its entry count (bits 0..15), preset reason
 * and length (one load). */
static inline uint64_t ap_memo_hint_site(const struct ap_site *s)
{
    uint32_t x;

    memcpy(&x, (const uint8_t *)s + offsetof(struct ap_site, count), sizeof(x));
    return x;
}

/*
 * A hint's key for a site whose first entry is @p e: its replacement's
 * address mixed with the entry's header (ap_memo_hint_hdr()). An empty
 * replacement lies at the address of the next one, so two shapes (an
 * ALTERNATIVE("mfence", "", ...) and the next site's nonempty one) share that
 * address: by the address alone they took one slot and, met in turn, each
 * evicted the other's hint on every site.
 */
static inline uint64_t ap_memo_hint_key_of(uint64_t repl, uint64_t hdr)
{
    return repl ^ hdr * 0xff51afd7ed558ccdull;
}

static inline uint64_t ap_memo_hint_key(const struct ap_entry *e)
{
    return ap_memo_hint_key_of(e->repl, ap_memo_hint_hdr(e));
}

/* The hint slots' multiplier of a memo that has not chosen another. */
#define AP_MEMO_HINT_MUL 0x9e3779b97f4a7c15ull

/* The product of key @p key (ap_memo_hint_key()) whose top bits name its slots. */
static inline uint64_t ap_memo_hint_x(const struct ap_memo *m, uint64_t key)
{
    return key * (m->hint_mul ? m->hint_mul : AP_MEMO_HINT_MUL);
}

/* The first slot a product names: its top five bits. */
static inline size_t ap_memo_hint_slot(uint64_t x)
{
    return (size_t)(x >> 59) & (AP_MEMO_HINTS - 1);
}

/*
 * The first hint slot of key @p key. The keys are replacement addresses
 * (plus a header), so whether two of a program's few keys share a first
 * slot depends on where its replacements were linked and loaded; a key
 * whose first slot another one holds is looked up out of line
 * (ap_memo_find_hint2()), some 50 instructions a site. The fill therefore
 * chooses another multiplier where that would happen and the keys hinted
 * so far, with the new one, all get first slots of their own under it
 * (memo.c, hint_fill()).
 */
static inline size_t ap_memo_hint_at(const struct ap_memo *m, uint64_t key)
{
    return ap_memo_hint_slot(ap_memo_hint_x(m, key));
}

/*
 * The second hint slot of key @p key: other bits of the same product, never
 * the first slot. A program's few distinct replacements (keys) would, with one
 * slot each, share a slot about every other time (7 keys in 32 slots); two
 * keys on one slot, met in turn, never got a hint (the fill waits for the
 * same key twice in a row: hint_fill(), memo.c), so each of their sites
 * took the full lookup. With two slots a key loses its hint only where both
 * are held by others.
 */
static inline size_t ap_memo_hint_at2(const struct ap_memo *m, uint64_t key)
{
    uint64_t x = ap_memo_hint_x(m, key);
    size_t a = ap_memo_hint_slot(x);
    size_t b = (size_t)(x >> 54) & (AP_MEMO_HINTS - 1);
    return b != a ? b : a ^ 1u;
}

/* True when the memo's hints were proven in @p repl (a view's replacement
 * region): ap_memo_find_hint() may answer for the view's sites. */
static inline bool ap_memo_hints_in(const struct ap_memo *m, const struct ap_region *repl)
{
    return ((m->hint_repl.addr ^ repl->addr) | (m->hint_repl.size ^ repl->size) |
            ((uintptr_t)m->hint_repl.data ^ (uintptr_t)repl->data)) == 0;
}

/*
 * The template a hint names for site @p s (no preset reason; one or two
 * entries with the hint's replacement addresses and headers, so a site and
 * replacements the words hold), when the site holds its bytes under its
 * mask; else 0. For a site of a view whose replacement region the hints
 * were proven in (ap_memo_hints_in()): the same addresses and lengths in the
 * same region as when the hint was made, so the replacements lie inside
 * altinstr_replacement and hold the bytes the hint's template was matched
 * with (the caller drops the hints when they may not).
 */
static inline bool ap_memo_hint_holds(const struct ap_memo_hint *h, uint64_t sw,
                                      const struct ap_entry *e, const struct ap_site *s,
                                      const uint8_t *orig)
{
    uint64_t o1, o2;

    /* the same count and length, no preset reason, the same entries */
    if (h->site != sw || h->repl[0] != e->repl || h->hdr[0] != ap_memo_hint_hdr(e))
        return false;
    if ((uint16_t)h->site == 2 &&
        (h->repl[1] != e[1].repl || h->hdr[1] != ap_memo_hint_hdr(&e[1])))
        return false;
    /* the site's bytes under the template's mask */
    ap_memo_words(orig, s->len, &o1, &o2);
    return (((o1 ^ h->w[0]) & h->wm[0]) | ((o2 ^ h->w[1]) & h->wm[1])) == 0;
}

/** ap_memo_find_hint() at the second slot of the key of @p s's first entry @p e. */
AP_HIDDEN uint32_t ap_memo_find_hint2(const struct ap_memo *m, const struct ap_site *s,
                                      const struct ap_entry *e, const uint8_t *orig);

static inline uint32_t ap_memo_find_hint(const struct ap_memo *m, const struct ap_site *s,
                                         const struct ap_entry *entries, const uint8_t *orig)
{
    uint64_t sw = ap_memo_hint_site(s);

    if ((uint16_t)sw - 1u > 1u)
        return 0; /* not one or two entries */
    const struct ap_entry *e = &entries[s->first];
    uint64_t key = ap_memo_hint_key(e);
    const struct ap_memo_hint *h = &m->hint[ap_memo_hint_at(m, key)];
    if (ap_memo_hint_holds(h, sw, e, s, orig))
        return h->id;
    return ap_memo_find_hint2(m, s, e, orig); /* out of line: the loops' registers */
}

/* The template for site @p s of view @p v: a hint's (ap_memo_find_hint()),
 * else the full lookup. */
static inline uint32_t ap_memo_find_text(struct ap_memo *m, const struct ap_view *v,
                                         const struct ap_site *s,
                                         const struct ap_entry *entries, const uint8_t *orig)
{
    uint32_t id = ap_memo_hints_in(m, &v->repl) ? ap_memo_find_hint(m, s, entries, orig) : 0;
    return id ? id : ap_memo_find_full(m, v, s, entries, orig);
}

/**
 * True when no entry of site @p s applies under the memo's feature set and
 * the checks the records allow without decoding pass: no preset refusal, a
 * length and an entry, and per entry a known feature, no flag but
 * ALT_FLAG_NOT, a replacement no longer than the site and inside
 * altinstr_replacement. Such a site keeps its original bytes; its
 * instructions (the original's and the replacements' decoding, relative
 * fields) are not examined, so a site the planner refuses for an entry that
 * does not apply, or for an original that does not decode, is left as it is
 * without a refusal (memory untouched either way). False: the full decision.
 * ap_memo_keeps_original_entries(): the entries' part, for a caller that
 * checked the site (no preset reason, a length, an entry) and holds its
 * @p count entries from @p e and its length @p len.
 */
static inline bool ap_memo_keeps_original_entries(const struct ap_memo *m,
                                                  const struct ap_region *repl, unsigned len,
                                                  const struct ap_entry *e, uint32_t count)
{
    /* the replacement range, read once (ap_entry_repl's rule) */
    uint64_t raddr = repl->addr, rsize = repl->size;
    bool rdata = repl->data != NULL;

    for (uint32_t k = 0; k < count; k++, e++) {
        unsigned f = e->feature, rl = e->repllen;

        /* applies, or a feature or flag the planner refuses */
        if (e->flags > ALT_FLAG_NOT || f >= 32u * AP_NCAPWORDS ||
            !(m->keep[e->flags][f / 32] >> (f % 32) & 1u))
            return false;
        /* REPL_TOO_LONG, REPL_BOUNDS */
        if (rl > len || e->repl < raddr || rl > rsize || e->repl - raddr > rsize - rl ||
            (!rdata && rl))
            return false;
    }
    return true;
}

/**
 * ap_memo_keeps_original_entries() for entries known to have flags 0 or
 * ALT_FLAG_NOT, a feature below 32 * AP_NCAPWORDS and a replacement inside
 * altinstr_replacement (a module's records_plain): then its other checks
 * cannot fail, and the keep bits and the replacement's length against the
 * site's @p len answer.
 */
static inline bool ap_memo_keeps_original_plain(const struct ap_memo *m, unsigned len,
                                                const struct ap_entry *e, uint32_t count)
{
    for (uint32_t k = 0; k < count; k++, e++) {
        unsigned f = e->feature;
        if (!(m->keep[e->flags][f / 32] >> (f % 32) & 1u) || e->repllen > len)
            return false;
    }
    return true;
}

static inline bool ap_memo_keeps_original(const struct ap_memo *m, const struct ap_view *v,
                                          const struct ap_site *s,
                                          const struct ap_entry *entries)
{
    if (s->reason || !s->len || !s->count)
        return false;
    return ap_memo_keeps_original_entries(m, &v->repl, s->len, &entries[s->first], s->count);
}
/**
 * Template @p id at site @p s (whose checks ap_memo_find() made): the
 * chosen entry (-1: the original), with *@p final its final bytes (s->len):
 * the template's own when it has no relative field (valid while @p m lives:
 * templates never move), else @p buf, where they are instantiated for this
 * site. Or -2 when a relative field does not fit here or points into the
 * site: then only the planner can answer.
 */
static inline int ap_memo_inst(const struct ap_memo *m, uint32_t id, const struct ap_view *v,
                               const struct ap_site *s, const struct ap_entry *entries,
                               uint8_t *buf, const uint8_t **final);
/** ap_memo_inst() for a template with relative fields. */
static inline int ap_memo_inst_fields(const struct ap_memo *m, uint32_t id,
                                      const struct ap_view *v, const struct ap_site *s,
                                      const struct ap_entry *entries, uint8_t *buf,
                                      const uint8_t **final);
/** ap_memo_inst_fields() for any template with relative fields. */
AP_HIDDEN int ap_memo_inst_general(const struct ap_memo *m, uint32_t id, const struct ap_view *v,
                                   const struct ap_site *s, const struct ap_entry *entries,
                                   uint8_t *buf, const uint8_t **final);

static inline int ap_memo_inst_fields(const struct ap_memo *m, uint32_t id,
                                      const struct ap_view *v, const struct ap_site *s,
                                      const struct ap_entry *entries, uint8_t *buf,
                                      const uint8_t **final)
{
    const struct ap_memo_tmpl *t = &m->tmpl[id - 1];

    if (t->rel32) {
        /* one rel32 field, the chosen entry's (a call, a RIP-relative
         * operand): memo.c's field_value(), field_cuts() and field_store()
         * for it */
        const struct ap_memo_field f = t->f0;
        const struct ap_entry *e = &entries[s->first + f.entry];
        int32_t old;
        int64_t nv;
        uint32_t u;

        /* inside altinstr_replacement: ap_memo_find() checked it */
        memcpy(&old, v->repl.data + (e->repl - v->repl.addr) + f.pos, 4);
        nv = old;
        if ((uint64_t)f.end + (uint64_t)nv > f.repllen) {
            nv = (int64_t)((uint64_t)nv + e->repl - s->addr);
            if (nv != (int32_t)nv)
                return -2;
        }
        if ((uint64_t)f.end + (uint64_t)nv < s->len)
            return -2;
        ap_copy_small(buf, t->key + 2 * (size_t)t->keylen, t->len);
        u = (uint32_t)nv;
        memcpy(buf + f.pos, &u, 4);
        *final = buf;
        return t->chosen;
    }
    return ap_memo_inst_general(m, id, v, s, entries, buf, final);
}

static inline int ap_memo_inst(const struct ap_memo *m, uint32_t id, const struct ap_view *v,
                               const struct ap_site *s, const struct ap_entry *entries,
                               uint8_t *buf, const uint8_t **final)
{
    const struct ap_memo_tmpl *t = &m->tmpl[id - 1];

    if (t->nfields)
        return ap_memo_inst_fields(m, id, v, s, entries, buf, final);
    *final = t->key + 2 * (size_t)t->keylen; /* the same bytes at every site */
    return t->chosen;
}

#endif /* ALTPATCH_PLAN_H */
