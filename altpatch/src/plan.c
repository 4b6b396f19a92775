/* SPDX-License-Identifier: MIT */
/*
 * plan.c - decide the final bytes of one site. PURE: no syscalls, no globals,
 * no allocation; the same code runs on live memory (apply.c) and on an ELF
 * file (altdump).
 *
 * Order of work for a site:
 *   1. refusals known before planning (SITE_OVERLAP, EMPTY_SITE);
 *   2. the site lies in one text region (SITE_BOUNDS);
 *   3. the original decodes, instruction by instruction, to exactly the site
 *      length (ORIG_UNDECODABLE / ORIG_CROSSES_END);
 *   4. EVERY entry, eligible or not: feature known (UNKNOWN_FEATURE), no
 *      flag but ALT_FLAG_NOT (UNKNOWN_FLAGS), replacement no longer than the site (REPL_TOO_LONG), inside
 *      altinstr_replacement (REPL_BOUNDS), decodes to exactly its length
 *      (REPL_UNDECODABLE / REPL_CROSSES_END), relocates to the site address
 *      (RELOC_OVERFLOW). So whether a site is refused never depends on the CPU;
 *   5. select the last eligible entry (nested ALTERNATIVE_n: later wins);
 *      none: final = original, byte for byte (nothing will be written);
 *   6. final = relocated replacement + NOP padding to the site length, then
 *      NOP runs folded, never across a branch target inside the site.
 *
 * Speed: every byte is decoded once. The instructions of each replacement
 * are kept from step 4 (relocation changes only the value of a relative
 * field, never a length or a kind) and relocated from that list
 * (ap_reloc_insns), only for a replacement that has a relative field; step 6
 * decodes nothing: the padding's instructions are what ap_nop_fill() wrote
 * (ap_nop_fill_insns), and NOP runs are folded from the kept instructions
 * (the same result as ap_nop_fold() on each stretch between branch
 * targets). So a site costs one Zydis decode per instruction of its original
 * and of each replacement, and none more; none for a 0x90 at an instruction
 * boundary (the padding of an original): that is the NOP table's one-byte
 * NOP whatever follows it (ap_nop1_at()). The relative fields met on the way
 * are listed in the plan (ap_plan.fields: block, offsets, size, kind, value
 * as encoded), so a caller that derives an address-free template from the
 * plan need not decode again. Only the header fields, the listed fields and
 * the site's bytes of the plan are written, never the whole record.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "plan.h"

bool ap_entry_eligible(const struct ap_entry *e, const struct altpatch_features *fs)
{
    bool has = fs && ap_features_test(fs, e->feature);

    return has != !!(e->flags & ALT_FLAG_NOT);
}

/* The record checks of check_entry() that need no decoding; NONE or the reason. */
static int entry_record_reason(const struct ap_view *v, const struct ap_site *s,
                               const struct ap_entry *e, const struct ap_plan_rules *rules,
                               const uint8_t **repl);

AP_HOT int ap_plan_pick(const struct ap_view *v, const struct ap_site *s, const struct ap_entry *entries,
                 const struct altpatch_features *fs)
{
    const uint8_t *bytes, *repl;
    int chosen = -1;

    if (ap_site_check(v, s, NULL, &bytes))
        return AP_PICK_REFUSED;
    for (uint32_t k = 0; k < s->count; k++) {
        const struct ap_entry *e = &entries[s->first + k];

        if (entry_record_reason(v, s, e, NULL, &repl))
            return AP_PICK_REFUSED;
        if (ap_entry_eligible(e, fs))
            chosen = (int)k; /* the last one wins, as in ap_plan_site() */
    }
    return chosen;
}

AP_HOT bool ap_region_holds(const struct ap_region *r, uint64_t addr, uint64_t len)
{
    return addr >= r->addr && len <= r->size && addr - r->addr <= r->size - len;
}

AP_HOT const struct ap_region *ap_view_find(const struct ap_view *v, uint64_t addr, uint64_t len)
{
    size_t n = v->ntext < AP_MAX_TEXT ? v->ntext : AP_MAX_TEXT;

    for (size_t i = 0; i < n; i++)
        if (ap_region_holds(&v->text[i], addr, len))
            return &v->text[i];
    return NULL;
}

const uint8_t *ap_view_text(const struct ap_view *v, uint64_t addr, uint64_t len)
{
    const struct ap_region *r = ap_view_find(v, addr, len);

    return r && r->data ? r->data + (addr - r->addr) : NULL;
}

AP_HOT int ap_site_check(const struct ap_view *v, const struct ap_site *s, const uint8_t *orig,
                  const uint8_t **bytes)
{
    const struct ap_region *r;

    *bytes = NULL;
    if (s->reason)
        return s->reason;
    if (s->len == 0 || s->count == 0)
        return ALTPATCH_REASON_EMPTY_SITE;
    r = ap_view_find(v, s->addr, s->len);
    if (!r)
        return ALTPATCH_REASON_SITE_BOUNDS;
    *bytes = orig ? orig : r->data ? r->data + (s->addr - r->addr) : NULL;
    return *bytes ? ALTPATCH_REASON_NONE : ALTPATCH_REASON_SITE_BOUNDS;
}

bool ap_entry_repl(const struct ap_view *v, const struct ap_entry *e, const uint8_t **bytes)
{
    *bytes = NULL;
    if (!ap_region_holds(&v->repl, e->repl, e->repllen) || (!v->repl.data && e->repllen))
        return false;
    if (e->repllen)
        *bytes = v->repl.data + (e->repl - v->repl.addr);
    return true;
}

static int refuse(struct ap_plan *out, int reason, int entry, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Record a refusal; final goes back to the original. */
static int refuse(struct ap_plan *out, int reason, int entry, const char *fmt, ...)
{
    va_list ap;

    out->reason = reason;
    out->bad_entry = entry;
    out->chosen = -1;
    memcpy(out->final, out->orig, out->len);
    va_start(ap, fmt);
    vsnprintf(out->detail, sizeof(out->detail), fmt, ap);
    va_end(ap);
    return reason;
}

/* Instructions of one replacement, as decoded (lengths, kinds, relative
 * fields): room for one per byte of the site (a replacement is no longer,
 * and the chosen one's padding fills the rest of the site). */
struct insn_list {
    size_t n;
    bool has_rel; /* some instruction has a relative field */
    struct ap_insn *in;
};

/*
 * Decode @buf instruction by instruction; it must end exactly at @len.
 * Returns NONE or one of the two given reasons, with *bad_off set. When
 * @list is not NULL it receives the instructions.
 */
/* Note relative field @in at @off of block @entry (-1: the original) in @out. */
static void note_field(struct ap_plan *out, int entry, size_t off, const struct ap_insn *in)
{
    if (out->nfields >= AP_PLAN_MAX_FIELDS) {
        out->fields_over = true;
        return;
    }
    out->fields[out->nfields++] = (struct ap_plan_field){
        .entry = (int16_t)entry, .off = (uint8_t)off, .len = in->len, .rel_off = in->rel_off,
        .rel_size = in->rel_size, .branch = in->rel_is_branch, .is_nop = in->is_nop,
        .value = (int32_t)in->rel_value};
}

static int decode_exact(const uint8_t *buf, size_t len, int undecodable, int crosses,
                        size_t *bad_off, struct insn_list *list, int entry,
                        struct ap_plan *out)
{
    struct ap_insn tmp, *in = &tmp;
    size_t off = 0;

    if (list) {
        list->n = 0;
        list->has_rel = false;
    }
    while (off < len) {
        int r;

        if (list)
            in = &list->in[list->n];
        /* padding (0x90 at a boundary): the one-byte NOP, known without Zydis */
        r = ap_nop1_at(buf + off, in) ? 0 : ap_insn_decode(buf + off, len - off, in);
        if (r < 0) {
            *bad_off = off;
            return r == -ENODATA ? crosses : undecodable;
        }
        if (list) {
            list->has_rel |= in->has_rel;
            list->n++;
        }
        if (in->has_rel)
            note_field(out, entry, off, in);
        off += in->len;
    }
    return ALTPATCH_REASON_NONE;
}

/* Steps 2-3: the site's original bytes (@bytes, from ap_site_check()), their decoding. */
static int check_orig(const uint8_t *bytes, const struct ap_site *s, struct ap_plan *out)
{
    size_t off = 0;
    int reason;

    memcpy(out->orig, bytes, s->len);
    memcpy(out->final, bytes, s->len);
    reason = decode_exact(out->orig, s->len, ALTPATCH_REASON_ORIG_UNDECODABLE,
                          ALTPATCH_REASON_ORIG_CROSSES_END, &off, NULL, -1, out);
    if (reason)
        return refuse(out, reason, -1, "original insn +%zu %s", off,
                      reason == ALTPATCH_REASON_ORIG_CROSSES_END ? "runs past the site end"
                                                                 : "does not decode");
    return ALTPATCH_REASON_NONE;
}

/*
 * Step 4 for entry @k: validate it and leave its relocated replacement in
 * @buf (repllen bytes) and its instructions in @list. Returns NONE or the
 * refusal (already recorded).
 */
/* Is @p id a feature the rules (or, without rules, this library) know? */
static bool rules_known(const struct ap_plan_rules *rules, unsigned id)
{
    if (!rules)
        return ap_feature_known(id);
    return id < 32u * AP_NCAPWORDS && (rules->known[id / 32] >> (id % 32) & 1u);
}

/* The flags a record may carry under @p rules (none: ALT_FLAG_NOT only). */
static unsigned rules_flags(const struct ap_plan_rules *rules)
{
    return ALT_FLAG_NOT | (rules ? rules->flags : 0u);
}

static int entry_record_reason(const struct ap_view *v, const struct ap_site *s,
                               const struct ap_entry *e, const struct ap_plan_rules *rules,
                               const uint8_t **repl)
{
    unsigned flags_ok = rules_flags(rules);

    *repl = NULL;
    if (!rules_known(rules, e->feature))
        return ALTPATCH_REASON_UNKNOWN_FEATURE;
    if (e->flags & ~flags_ok)
        return ALTPATCH_REASON_UNKNOWN_FLAGS;
    if (e->repllen > s->len)
        return ALTPATCH_REASON_REPL_TOO_LONG;
    if (!ap_entry_repl(v, e, repl))
        return ALTPATCH_REASON_REPL_BOUNDS;
    return ALTPATCH_REASON_NONE;
}

static int check_entry(const struct ap_view *v, const struct ap_site *s,
                       const struct ap_entry *e, int k, uint8_t *buf, struct insn_list *list,
                       const struct ap_plan_rules *rules, struct ap_plan *out)
{
    char why[sizeof(out->detail) - 32];
    const uint8_t *repl;
    size_t off = 0;
    int reason;

    reason = entry_record_reason(v, s, e, rules, &repl);
    if (reason == ALTPATCH_REASON_UNKNOWN_FEATURE)
        return refuse(out, reason, k, "entry %d: feature %u unknown", k, e->feature);
    if (reason == ALTPATCH_REASON_UNKNOWN_FLAGS) /* e.g. the kernel's ALT_FLAG_DIRECT_CALL */
        return refuse(out, reason, k, "entry %d: flags 0x%x unknown", k,
                      (unsigned)(e->flags & ~rules_flags(rules)));
    if (reason == ALTPATCH_REASON_REPL_TOO_LONG)
        return refuse(out, reason, k, "entry %d: replacement %u bytes, site %u", k, e->repllen,
                      s->len);
    if (reason)
        return refuse(out, reason, k,
                      "entry %d: replacement 0x%" PRIx64 " len %u outside altinstr_replacement",
                      k, e->repl, e->repllen);
    if (e->repllen)
        memcpy(buf, repl, e->repllen);
    reason = decode_exact(buf, e->repllen, ALTPATCH_REASON_REPL_UNDECODABLE,
                          ALTPATCH_REASON_REPL_CROSSES_END, &off, list, k, out);
    if (reason)
        return refuse(out, reason, k, "entry %d: replacement insn +%zu %s", k, off,
                      reason == ALTPATCH_REASON_REPL_CROSSES_END ? "runs past its end"
                                                                 : "does not decode");
    if (!list->has_rel)
        return ALTPATCH_REASON_NONE; /* nothing to relocate: ap_reloc() would change nothing */
    out->relative = true;
    reason = ap_reloc_insns(buf, e->repllen, list->in, list->n, e->repl, s->addr, why,
                            sizeof(why));
    if (reason)
        return refuse(out, reason, k, "entry %d: %s", k, why);
    return ALTPATCH_REASON_NONE;
}

/* The value of the relative field of @in, read from its bytes at @p
 * (little-endian, sign-extended: what the decoder reports). */
static int64_t rel_read(const uint8_t *p, const struct ap_insn *in)
{
    uint64_t u = 0;

    for (unsigned i = 0; i < in->rel_size; i++)
        u |= (uint64_t)p[in->rel_off + i] << (8 * i);
    if (in->rel_size < 8 && (u >> (8 * in->rel_size - 1)) & 1)
        u |= ~0ull << (8 * in->rel_size);
    return (int64_t)u;
}

/*
 * Fold NOP runs of the final bytes @buf (@list: their instructions), but
 * never across an offset that a relative branch or RIP-relative operand of
 * the site points to: merging NOPs around a branch target would land the
 * branch inside a longer NOP. If a target is not an instruction boundary,
 * nothing is folded. Same bytes as ap_nop_fold() on each stretch between
 * targets: every maximal run of NOPs is re-filled with ap_nop_fill().
 */
static void fold_site(uint8_t *buf, size_t len, const struct insn_list *list)
{
    uint64_t boundary[(AP_MAX_SITE + 64) / 64] = {0}; /* bit sets over offsets 0..len */
    uint64_t cut[(AP_MAX_SITE + 64) / 64] = {0};
    size_t off = 0, run = 0;
    bool in_run = false, any_cut = false;

    for (size_t i = 0; i < list->n; i++) {
        const struct ap_insn *in = &list->in[i];

        boundary[off / 64] |= 1ull << (off % 64);
        if (in->has_rel) {
            /* offset of the target within the site (mod 2^64) */
            uint64_t t = (uint64_t)off + in->len + (uint64_t)rel_read(buf + off, in);

            if (t < len) {
                cut[t / 64] |= 1ull << (t % 64);
                any_cut = true;
            }
        }
        off += in->len;
    }
    /* a target inside an instruction (offset 0 is always a boundary) */
    for (size_t w = 0; any_cut && w < sizeof(cut) / sizeof(cut[0]); w++)
        if (cut[w] & ~boundary[w])
            return;
    off = 0;
    for (size_t i = 0; i < list->n; i++) {
        if (in_run && (cut[off / 64] >> (off % 64) & 1)) { /* a stretch ends here: so does its run */
            ap_nop_fill(buf + run, off - run);
            in_run = false;
        }
        if (list->in[i].is_nop && !in_run) {
            in_run = true;
            run = off;
        } else if (!list->in[i].is_nop && in_run) {
            ap_nop_fill(buf + run, off - run);
            in_run = false;
        }
        off += list->in[i].len;
    }
    if (in_run)
        ap_nop_fill(buf + run, off - run);
}

/* Steps 5-6. @best holds the relocated replacement of entry @chosen, @list
 * its instructions (extended here by the padding's). */
static void build_final(const struct ap_site *s, const struct ap_entry *e,
                        const uint8_t *best, struct insn_list *list, struct ap_plan *out)
{
    memcpy(out->final, best, e->repllen);
    ap_nop_fill(out->final + e->repllen, s->len - e->repllen);
    /* the padding's instructions are known, not decoded (at most one per byte) */
    list->n += ap_nop_fill_insns(s->len - e->repllen, &list->in[list->n]);
    fold_site(out->final, s->len, list);
}

void ap_plan_site(const struct ap_view *v, const struct ap_site *s,
                  const struct ap_entry *entries, const uint8_t *orig,
                  const struct altpatch_features *fs, struct ap_plan *out)
{
    ap_plan_site_rules(v, s, entries, orig, fs, NULL, out);
}

void ap_plan_site_rules(const struct ap_view *v, const struct ap_site *s,
                        const struct ap_entry *entries, const uint8_t *orig,
                        const struct altpatch_features *fs, const struct ap_plan_rules *rules,
                        struct ap_plan *out)
{
    const uint8_t *bytes;
    int chosen = -1, cur = 0, reason;

    /* Only the header and the site's bytes: the record is ~600 bytes and a
     * caller reads orig/final up to len and detail as a string. */
    out->reason = ALTPATCH_REASON_NONE;
    out->bad_entry = -1;
    out->chosen = -1;
    out->len = s->len;
    out->relative = false;
    out->nfields = 0;
    out->fields_over = false;
    out->detail[0] = '\0';
    memset(out->orig, 0, s->len);
    reason = ap_site_check(v, s, orig, &bytes);
    if (reason == s->reason && reason) {
        const uint8_t *o = orig ? orig : ap_view_text(v, s->addr, s->len);

        if (o)
            memcpy(out->orig, o, s->len);
        refuse(out, s->reason, -1, "site 0x%" PRIx64 " refused by the table checks",
               s->addr);
        return;
    }
    if (reason == ALTPATCH_REASON_EMPTY_SITE) {
        refuse(out, reason, -1, "site 0x%" PRIx64 " is empty", s->addr);
        return;
    }
    if (reason && ap_view_find(v, s->addr, s->len)) {
        refuse(out, reason, -1, "site 0x%" PRIx64 ": no bytes available", s->addr);
        return;
    }
    if (reason) {
        refuse(out, reason, -1, "site 0x%" PRIx64 " len %u outside the text sections", s->addr,
               s->len);
        return;
    }
    if (check_orig(bytes, s, out))
        return;
    /* Two entries' bytes and instructions (the one kept, the one checked),
     * sized by the site (1..AP_MAX_SITE bytes): a site of a few bytes,
     * the usual kind, takes a few hundred bytes of stack, not 4.6 KB. */
    size_t room = s->len;
    uint8_t buf[2][room];
    struct ap_insn insns[2][room];
    struct insn_list list[2] = {{.in = insns[0]}, {.in = insns[1]}};
    for (uint32_t k = 0; k < s->count; k++) {
        const struct ap_entry *e = &entries[s->first + k];

        if (check_entry(v, s, e, (int)k, buf[cur], &list[cur], rules, out))
            return;
        if (ap_entry_eligible(e, fs)) {
            chosen = (int)k;
            cur ^= 1; /* keep this one: the next entry goes to the other buffer */
        }
    }
    out->chosen = chosen;
    if (chosen >= 0)
        build_final(s, &entries[s->first + (uint32_t)chosen], buf[cur ^ 1], &list[cur ^ 1],
                    out);
}
