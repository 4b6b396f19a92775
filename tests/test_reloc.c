/* SPDX-License-Identifier: MIT */
/*
 * Relocation of moved code (reloc.c): new = old + src - dst for every field
 * whose target lies outside [src, src+len]; targets inside keep their value;
 * values that do not fit their field are refused. Addresses are plain
 * numbers: nothing here touches real memory beyond the byte buffers.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ap_hex.h"
#include "pure.h"



/*
 * ap_reloc_insns() on the decoded list of @b[0..n) must give what ap_reloc()
 * gave (@reason, bytes @want) when every instruction decodes.
 */
static void reloc_insns_same(const uint8_t *in, size_t n, uint64_t src, uint64_t dst, int reason,
                             const uint8_t *want)
{
    struct ap_insn list[64];
    uint8_t b[64];
    char detail[160];
    size_t k = 0, off = 0;

    while (off < n && k < 64) {
        if (ap_insn_decode(in + off, n - off, &list[k]) < 0)
            return; /* undecodable: only ap_reloc() decides that */
        off += list[k++].len;
    }
    memcpy(b, in, n);
    int r = ap_reloc_insns(b, n, list, k, src, dst, detail, sizeof(detail));
    cr_assert_eq(r, reason, "ap_reloc_insns: reason %d, ap_reloc %d (%s)", r, reason, detail);
    if (reason == ALTPATCH_REASON_NONE)
        cr_assert_arr_eq(b, want, n, "ap_reloc_insns: same bytes as ap_reloc");
    if (k > 0 && reason == ALTPATCH_REASON_NONE) {
        /* a list that does not cover the block is refused, never trusted */
        memcpy(b, in, n);
        cr_assert_eq(ap_reloc_insns(b, n, list, k - 1, src, dst, NULL, 0),
                     ALTPATCH_REASON_REPL_CROSSES_END);
    }
}

/* Relocate @in from @src to @dst; assert @reason and, when NONE, the bytes. */
static void reloc_expect(const char *in, uint64_t src, uint64_t dst, int reason,
                         const char *want)
{
    uint8_t b[64], w[64], in_b[64];
    char gs[256], ws[256], detail[160];
    size_t n = hex(in, b);
    memcpy(in_b, b, n);
    int r = ap_reloc(b, n, src, dst, detail, sizeof(detail));

    reloc_insns_same(in_b, n, src, dst, r, b);

    cr_assert_eq(r, reason, "%s: reason %d, want %d (%s)", in, r, reason, detail);
    if (reason != ALTPATCH_REASON_NONE) {
        cr_assert_neq(detail[0], '\0', "%s: a refusal carries a detail", in);
        return;
    }
    cr_assert_eq(hex(want, w), n);
    to_hex(b, n, gs);
    to_hex(w, n, ws);
    cr_assert_str_eq(gs, ws, "%s from 0x%llx to 0x%llx", in, (unsigned long long)src,
                     (unsigned long long)dst);
}

/* After relocation, the instruction at @dst reaches the same @target. */
static void same_target(const char *in, uint64_t src, uint64_t dst)
{
    uint8_t b[64], orig[64];
    size_t n = hex(in, b);
    struct ap_insn a, c;

    memcpy(orig, b, n);
    cr_assert_eq(ap_reloc(b, n, src, dst, NULL, 0), ALTPATCH_REASON_NONE);
    cr_assert_eq(ap_insn_decode(orig, n, &a), 0);
    cr_assert_eq(ap_insn_decode(b, n, &c), 0);
    cr_assert_eq(src + a.len + (uint64_t)a.rel_value, dst + c.len + (uint64_t)c.rel_value,
                 "%s reaches the same target", in);
}

Test(reloc, call_rel32_outside)
{
    /* call at 0x2000 -> 0x2015; moved to 0x1000: rel = 0x10 + 0x1000 */
    reloc_expect("e8 10 00 00 00", 0x2000, 0x1000, 0, "e8 10 10 00 00");
    same_target("e8 10 00 00 00", 0x2000, 0x1000);
    /* moving up: rel = 0x1000 - 0x2000 */
    reloc_expect("e8 00 10 00 00", 0x1000, 0x3000, 0, "e8 00 f0 ff ff");
}

Test(reloc, jmp_rel32_backwards_outside)
{
    /* target 0x2005 - 0x10 = 0x1ff5 < src: outside */
    reloc_expect("e9 f0 ff ff ff", 0x2000, 0x1000, 0, "e9 f0 0f 00 00");
    same_target("e9 f0 ff ff ff", 0x2000, 0x1000);
}

Test(reloc, jcc_rel32_outside)
{
    reloc_expect("0f 85 00 00 01 00", 0x500000, 0x400000, 0, "0f 85 00 00 11 00");
    same_target("0f 85 00 00 01 00", 0x500000, 0x400000);
}

Test(reloc, field_offset_of_later_instruction)
{
    /* lfence; call: only the call's field changes */
    reloc_expect("0f ae e8 e8 10 00 00 00", 0x2000, 0x1000, 0, "0f ae e8 e8 10 10 00 00");
}

Test(reloc, targets_inside_keep_their_value)
{
    /* jne over a ud2 to the instruction after it (inside) */
    reloc_expect("75 02 0f 0b 90", 0x2000, 0x1000, 0, "75 02 0f 0b 90");
    /* jmp rel32 to its own block start (inside) */
    reloc_expect("90 e9 fa ff ff ff", 0x2000, 0x1000, 0, "90 e9 fa ff ff ff");
    /* lea of a label inside the block */
    reloc_expect("48 8d 05 00 00 00 00 90", 0x2000, 0x1000, 0, "48 8d 05 00 00 00 00 90");
}

Test(reloc, target_at_end_counts_as_inside)
{
    /* jne 1f; ud2; 1:  with 1: right after the block */
    reloc_expect("75 02 0f 0b", 0x2000, 0x1000, 0, "75 02 0f 0b");
    /* one byte further is outside, and a rel8 cannot reach it from 4 KiB away */
    reloc_expect("75 03 0f 0b", 0x2000, 0x1000, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
}

Test(reloc, jcc_rel8_outside_fits)
{
    /* moved 0x10 down: 0x10 + 0x10 = 0x20 still fits */
    reloc_expect("75 10", 0x1010, 0x1000, 0, "75 20");
    same_target("75 10", 0x1010, 0x1000);
    /* exactly the limits */
    reloc_expect("75 7e", 0x1001, 0x1000, 0, "75 7f");
    reloc_expect("75 81", 0x1000, 0x1001, 0, "75 80");
}

Test(reloc, jcc_rel8_overflow)
{
    reloc_expect("75 7f", 0x1001, 0x1000, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
    reloc_expect("75 80", 0x1000, 0x1001, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
    reloc_expect("75 10", 0x2000, 0x1000, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
}

Test(reloc, rel32_overflow_4gib_apart)
{
    const uint64_t lo = 0x400000, hi = lo + (4ull << 30);

    /* e8 01 00 00 00: target one byte past the block, i.e. outside */
    reloc_expect("e8 01 00 00 00", hi, lo, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
    reloc_expect("e8 01 00 00 00", lo, hi, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
    reloc_expect("0f 84 01 00 00 00", hi, lo, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
    reloc_expect("48 8b 05 10 00 00 00", hi, lo, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
    /* the limits of rel32: new = 1 + (src - dst) */
    reloc_expect("e8 01 00 00 00", lo + 0x7ffffffe, lo, 0, "e8 ff ff ff 7f");
    reloc_expect("e8 01 00 00 00", lo + 0x7fffffff, lo, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
    reloc_expect("e8 01 00 00 00", lo, lo + 0x80000001, 0, "e8 00 00 00 80");
    reloc_expect("e8 01 00 00 00", lo, lo + 0x80000002, ALTPATCH_REASON_RELOC_OVERFLOW, NULL);
}

Test(reloc, rip_relative_outside)
{
    /* mov 0x10(%rip),%rax */
    reloc_expect("48 8b 05 10 00 00 00", 0x2000, 0x1000, 0, "48 8b 05 10 10 00 00");
    same_target("48 8b 05 10 00 00 00", 0x2000, 0x1000);
    /* lea -0x10(%rip),%rdi */
    reloc_expect("48 8d 3d f0 ff ff ff", 0x2000, 0x1000, 0, "48 8d 3d f0 0f 00 00");
    /* movl $5,0x1(%rip): the immediate after the displacement is untouched */
    reloc_expect("c7 05 01 00 00 00 05 00 00 00", 0x2000, 0x1000, 0,
                 "c7 05 01 10 00 00 05 00 00 00");
    /* call *0x10(%rip) */
    reloc_expect("ff 15 10 00 00 00", 0x2000, 0x1000, 0, "ff 15 10 10 00 00");
}

Test(reloc, no_move_changes_nothing)
{
    reloc_expect("e8 10 00 00 00 75 80", 0x1000, 0x1000, 0, "e8 10 00 00 00 75 80");
}

Test(reloc, bad_bytes)
{
    reloc_expect("90 06", 0x2000, 0x1000, ALTPATCH_REASON_REPL_UNDECODABLE, NULL);
    reloc_expect("90 e8 00 00", 0x2000, 0x1000, ALTPATCH_REASON_REPL_CROSSES_END, NULL);
}

Test(reloc, detail_names_the_instruction)
{
    uint8_t b[8];
    char detail[160];
    size_t n = hex("90 90 90 75 10", b);

    cr_assert_eq(ap_reloc(b, n, 0x2000, 0x1000, detail, sizeof(detail)),
                 ALTPATCH_REASON_RELOC_OVERFLOW);
    cr_assert_str_eq(detail, "insn +3 'jnz 0x0000000000002015' rel8 target 0x2015 out of range "
                             "from 0x1003");
    /* a NULL detail is fine */
    cr_assert_eq(ap_reloc(b, n, 0x2000, 0x1000, NULL, 0), ALTPATCH_REASON_RELOC_OVERFLOW);
}
