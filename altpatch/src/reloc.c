/* SPDX-License-Identifier: MIT */
/*
 * reloc.c - make position-dependent fields of moved code reach the same place.
 *
 * A replacement is assembled in `altinstr_replacement` (address src) but will
 * run at the site (address dst). x86-64 has two kinds of fields that encode a
 * distance from the end of their own instruction:
 *
 *   - the immediate of a relative branch: jmp/call/jcc rel8 or rel32, loop,
 *     jrcxz, xbegin;
 *   - the displacement of a RIP-relative memory operand: mov/lea/cmp/...
 *     disp32(%rip), including call/jmp *disp32(%rip).
 *
 * For an instruction at offset `off` within the block, of length `n`, with
 * field value `old`:
 *
 *   src_insn = src + off + n              (where the CPU adds the field)
 *   target   = src_insn + old             (where the field points)
 *   dst_insn = dst + off + n
 *   new      = target - dst_insn
 *            = old + src_insn - dst_insn  = old + src - dst
 *
 * computed modulo 2^64 like the CPU does, then checked against the field's
 * signed range: rel8 [-128, 127], rel16 [-32768, 32767], rel32 [-2^31, 2^31-1].
 * A value that does not fit is refused (ALTPATCH_REASON_RELOC_OVERFLOW), never
 * truncated, and we do not rewrite a rel8 branch into a longer form: the site
 * has no room for it and the original stays correct.
 *
 * Targets inside the block [src, src+len] keep their value: the block moves
 * as a whole, so a branch between two of its own instructions keeps its
 * distance. The end (src+len) counts as inside: `jne 1f; ...; 1:` with the
 * label right after the replacement means "continue after the alternative";
 * at the site, dst+len is where the padding begins, and the padding falls
 * through to the end of the site. Relocating such a branch would instead send
 * it to the byte after the replacement in `altinstr_replacement`, i.e. into
 * the next, unrelated replacement.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "pure.h"

bool ap_rel_fits(int64_t v, unsigned size)
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

void ap_rel_store(uint8_t *p, int64_t v, unsigned size)
{
    uint64_t u = (uint64_t)v;

    for (unsigned i = 0; i < size; i++)
        p[i] = (uint8_t)(u >> (8 * i));
}

/* "insn +3 'jne 0x...' rel8 target 0x... out of range from 0x..." */
static void reloc_detail(char *detail, size_t detailsz, const uint8_t *insn, size_t avail,
                         size_t off, uint64_t at, const struct ap_insn *in, uint64_t target,
                         uint64_t dst_at)
{
    char txt[96];

    if (!detail || detailsz == 0)
        return;
    ap_insn_format(insn, avail, at, false, txt, sizeof(txt));
    snprintf(detail, detailsz,
             "insn +%zu '%s' %s%u target 0x%" PRIx64 " out of range from 0x%" PRIx64, off, txt,
             in->rel_is_branch ? "rel" : "disp", 8u * in->rel_size, target, dst_at);
}

static int decode_refusal(int err, char *detail, size_t detailsz, size_t off)
{
    if (detail && detailsz)
        snprintf(detail, detailsz, "insn +%zu %s", off,
                 err == -ENODATA ? "runs past the end" : "does not decode");
    return err == -ENODATA ? ALTPATCH_REASON_REPL_CROSSES_END
                           : ALTPATCH_REASON_REPL_UNDECODABLE;
}

/* Relocate the field of instruction @in at @off (see ap_reloc). */
static int reloc_one(uint8_t *buf, size_t len, size_t off, const struct ap_insn *in, uint64_t src,
                     uint64_t dst, char *detail, size_t detailsz)
{
    uint64_t src_insn = src + off + in->len;
    uint64_t dst_insn = dst + off + in->len;
    uint64_t target = src_insn + (uint64_t)in->rel_value;
    int64_t nv = (int64_t)(target - dst_insn); /* = old + src - dst */

    if (!in->has_rel)
        return ALTPATCH_REASON_NONE;
    /* Unsigned: wraps for targets below src, so one test covers both sides. */
    if (target - src > len) {
        if (!ap_rel_fits(nv, in->rel_size)) {
            reloc_detail(detail, detailsz, buf + off, len - off, off, src + off, in, target,
                         dst + off);
            return ALTPATCH_REASON_RELOC_OVERFLOW;
        }
        ap_rel_store(buf + off + in->rel_off, nv, in->rel_size);
    }
    return ALTPATCH_REASON_NONE;
}

int ap_reloc(uint8_t *buf, size_t len, uint64_t src, uint64_t dst, char *detail,
             size_t detailsz)
{
    struct ap_insn in;
    size_t off = 0;
    int r;

    if (detail && detailsz)
        detail[0] = '\0';
    while (off < len) {
        r = ap_insn_decode(buf + off, len - off, &in);
        if (r < 0)
            return decode_refusal(r, detail, detailsz, off);
        r = reloc_one(buf, len, off, &in, src, dst, detail, detailsz);
        if (r)
            return r;
        off += in.len;
    }
    return ALTPATCH_REASON_NONE;
}

int ap_reloc_insns(uint8_t *buf, size_t len, const struct ap_insn *insns, size_t n, uint64_t src,
                   uint64_t dst, char *detail, size_t detailsz)
{
    size_t off = 0;
    int r;

    if (detail && detailsz)
        detail[0] = '\0';
    for (size_t i = 0; i < n && off < len; i++) {
        if (insns[i].len == 0 || insns[i].len > len - off)
            return decode_refusal(-ENODATA, detail, detailsz, off); /* not this block's list */
        r = reloc_one(buf, len, off, &insns[i], src, dst, detail, detailsz);
        if (r)
            return r;
        off += insns[i].len;
    }
    return off == len ? ALTPATCH_REASON_NONE : decode_refusal(-ENODATA, detail, detailsz, off);
}
