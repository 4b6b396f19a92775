/* SPDX-License-Identifier: MIT */
/*
 * NOP table, fill and folding (nop.c), on byte buffers. Every expectation is
 * written out as hex; every "is a NOP" check goes through ap_insn_decode(),
 * i.e. Zydis.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ap_hex.h"
#include "pure.h"




/* Fold @in (hex) and compare with @want (hex); return the run count. */
static size_t fold_hex(const char *in, const char *want)
{
    uint8_t b[512];
    size_t n = hex(in, b);
    size_t runs = ap_nop_fold(b, n);

    expect_bytes(b, n, want);
    return runs;
}

Test(nop_table, kernel_bytes)
{
    static const char *const want[AP_NOP_MAX + 1] = {
        NULL,
        "90",
        "66 90",
        "0f 1f 00",
        "0f 1f 40 00",
        "0f 1f 44 00 00",
        "66 0f 1f 44 00 00",
        "0f 1f 80 00 00 00 00",
        "0f 1f 84 00 00 00 00 00",
        "2e 0f 1f 84 00 00 00 00 00",
        "66 2e 0f 1f 84 00 00 00 00 00",
        "66 66 2e 0f 1f 84 00 00 00 00 00",
    };

    cr_assert_null(ap_nops[0]);
    for (size_t n = 1; n <= AP_NOP_MAX; n++)
        expect_bytes(ap_nops[n], n, want[n]);
}

Test(nop_table, each_is_one_nop_of_its_length)
{
    for (size_t n = 1; n <= AP_NOP_MAX; n++) {
        struct ap_insn in;
        uint8_t buf[16];

        memcpy(buf, ap_nops[n], n);
        cr_assert_eq(ap_insn_decode(buf, n, &in), 0, "nop%zu decodes", n);
        cr_assert_eq(in.len, n, "nop%zu is one instruction", n);
        cr_assert(in.is_nop, "nop%zu is a NOP", n);
        cr_assert_not(in.has_rel, "nop%zu has no relative field", n);
        /* one byte short: the instruction runs past the end */
        cr_assert_eq(ap_insn_decode(buf, n - 1, &in), -ENODATA, "nop%zu truncated", n);
    }
}

Test(nop_fill, table_lengths)
{
    for (size_t n = 1; n <= AP_NOP_MAX; n++) {
        uint8_t buf[16];

        memset(buf, 0xaa, sizeof(buf));
        ap_nop_fill(buf, n);
        cr_assert_arr_eq(buf, ap_nops[n], n, "fill %zu", n);
        cr_assert_eq(buf[n], 0xaa, "fill %zu wrote past its end", n);
    }
}

Test(nop_fill, zero_writes_nothing)
{
    uint8_t b = 0xaa;

    ap_nop_fill(&b, 0);
    cr_assert_eq(b, 0xaa);
}

Test(nop_fill, jmp8_over_int3)
{
    uint8_t buf[256];

    ap_nop_fill(buf, 12);
    expect_bytes(buf, 12, "eb 0a cc cc cc cc cc cc cc cc cc cc");
    ap_nop_fill(buf, 129); /* longest rel8: 2 + 127 */
    cr_assert_eq(buf[0], 0xeb);
    cr_assert_eq(buf[1], 127);
    for (size_t i = 2; i < 129; i++)
        cr_assert_eq(buf[i], 0xcc, "byte %zu", i);
}

Test(nop_fill, jmp32_above_129)
{
    uint8_t buf[256];

    memset(buf, 0, sizeof(buf));
    ap_nop_fill(buf, 130);
    expect_bytes(buf, 6, "e9 7d 00 00 00 cc");
    ap_nop_fill(buf, 255);
    expect_bytes(buf, 5, "e9 fa 00 00 00");
    for (size_t i = 5; i < 255; i++)
        cr_assert_eq(buf[i], 0xcc, "byte %zu", i);
}

Test(nop_fill, jump_lands_at_end)
{
    for (size_t n = AP_NOP_MAX + 1; n <= AP_MAX_SITE; n++) {
        uint8_t buf[AP_MAX_SITE];
        struct ap_insn in;

        ap_nop_fill(buf, n);
        cr_assert_eq(ap_insn_decode(buf, n, &in), 0);
        cr_assert(in.has_rel && in.rel_is_branch);
        cr_assert_eq(in.len + in.rel_value, (int64_t)n, "fill %zu jumps to the end", n);
    }
}

/* ap_nop_fill_insns() describes ap_nop_fill()'s bytes exactly as Zydis decodes them. */
Test(nop_fill, insns_as_decoded)
{
    for (size_t n = 0; n <= AP_MAX_SITE; n++) {
        uint8_t buf[AP_MAX_SITE];
        struct ap_insn known[AP_MAX_SITE], in;
        size_t k, i = 0, off = 0;

        memset(buf, 0, sizeof(buf));
        ap_nop_fill(buf, n);
        k = ap_nop_fill_insns(n, known);
        cr_assert_leq(k, n, "fill %zu: at most one instruction per byte", n);
        for (; off < n; off += in.len, i++) {
            cr_assert_eq(ap_insn_decode(buf + off, n - off, &in), 0, "fill %zu +%zu decodes", n,
                         off);
            cr_assert_lt(i, k, "fill %zu: %zu instructions known, more decoded", n, k);
            cr_assert_eq(known[i].len, in.len, "fill %zu insn %zu len", n, i);
            cr_assert_eq(known[i].is_nop, in.is_nop, "fill %zu insn %zu is_nop", n, i);
            cr_assert_eq(known[i].is_int3, in.is_int3, "fill %zu insn %zu is_int3", n, i);
            cr_assert_eq(known[i].is_call, in.is_call, "fill %zu insn %zu is_call", n, i);
            cr_assert_eq(known[i].is_fence, in.is_fence, "fill %zu insn %zu is_fence", n, i);
            cr_assert_eq(known[i].has_rel, in.has_rel, "fill %zu insn %zu has_rel", n, i);
            cr_assert_eq(known[i].rel_is_branch, in.rel_is_branch, "fill %zu insn %zu branch", n,
                         i);
            cr_assert_eq(known[i].rel_off, in.rel_off, "fill %zu insn %zu rel_off", n, i);
            cr_assert_eq(known[i].rel_size, in.rel_size, "fill %zu insn %zu rel_size", n, i);
            cr_assert_eq(known[i].rel_value, in.rel_value, "fill %zu insn %zu rel_value", n, i);
        }
        cr_assert_eq(i, k, "fill %zu: %zu instructions known, %zu decoded", n, k, i);
    }
}

Test(nop_insn, what_is_a_nop)
{
    static const struct {
        const char *hex;
        bool nop;
    } t[] = {
        {"90", true},
        {"66 90", true},
        {"48 90", true},
        {"0f 1f 00", true},
        {"66 0f 1f c0", true},
        {"66 2e 0f 1f 84 00 00 00 00 00", true},
        {"f3 90", false},          /* PAUSE */
        {"41 90", false},          /* xchg %eax,%r8d: writes both */
        {"0f 1f 48 00", false},    /* 0f 1f /1: hint space, not NOPL */
        {"0f 19 00", false},       /* reserved-NOP hint space */
        {"f3 0f 1e fa", false},    /* ENDBR64 */
        {"87 c0", false},          /* xchg %eax,%eax zero-extends rax */
        {"cc", false},
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        uint8_t b[16];
        size_t n = hex(t[i].hex, b);
        struct ap_insn in;

        cr_assert_eq(ap_insn_decode(b, n, &in), 0, "%s decodes", t[i].hex);
        cr_assert_eq(in.len, n, "%s length", t[i].hex);
        cr_assert_eq(in.is_nop, t[i].nop, "%s is_nop", t[i].hex);
    }
}

Test(nop_fold, merges_runs)
{
    cr_assert_eq(fold_hex("90 90 90", "0f 1f 00"), 1);
    cr_assert_eq(fold_hex("66 90 0f 1f 00 90", "66 0f 1f 44 00 00"), 1);
    cr_assert_eq(fold_hex("90 90 90 90 90 90 90 90 90 90 90",
                          "66 66 2e 0f 1f 84 00 00 00 00 00"),
                 1);
}

Test(nop_fold, optimal_run_is_not_counted)
{
    cr_assert_eq(fold_hex("0f 1f 40 00", "0f 1f 40 00"), 0);
    cr_assert_eq(fold_hex("90", "90"), 0);
    cr_assert_eq(fold_hex("", ""), 0);
}

Test(nop_fold, non_nops_untouched)
{
    /* mov %rax,%rdi between two runs */
    cr_assert_eq(fold_hex("90 90 48 89 c7 90 90 90", "66 90 48 89 c7 0f 1f 00"), 2);
    /* a NOPL with a displacement is a NOP; an lfence is not */
    cr_assert_eq(fold_hex("0f ae e8 0f 1f 40 00 90 0f ae e8",
                          "0f ae e8 0f 1f 44 00 00 0f ae e8"),
                 1);
}

Test(nop_fold, pause_and_xchg_r8_kept)
{
    cr_assert_eq(fold_hex("90 90 f3 90 90 90 90", "66 90 f3 90 0f 1f 00"), 2);
    cr_assert_eq(fold_hex("90 90 41 90 90", "66 90 41 90 90"), 1);
    cr_assert_eq(fold_hex("f3 90 f3 90", "f3 90 f3 90"), 0);
    cr_assert_eq(fold_hex("f3 0f 1e fa 90 90", "f3 0f 1e fa 66 90"), 1);
}

Test(nop_fold, long_run_uses_jmp)
{
    uint8_t b[40];

    memset(b, 0x90, 20);
    cr_assert_eq(ap_nop_fold(b, 20), 1);
    expect_bytes(b, 20, "eb 12 cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc");
    /* the result is stable: a jmp is not a NOP, int3 is not a NOP */
    cr_assert_eq(ap_nop_fold(b, 20), 0);
    expect_bytes(b, 20, "eb 12 cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc");
}

Test(nop_fold, long_run_of_mixed_nops)
{
    /* 8 + 4 + 1 = 13 bytes of NOPs, then ret */
    cr_assert_eq(fold_hex("0f 1f 84 00 00 00 00 00 0f 1f 40 00 90 c3",
                          "eb 0b cc cc cc cc cc cc cc cc cc cc cc c3"),
                 1);
}

Test(nop_fold, stops_at_undecodable)
{
    /* 06 (push %es) is invalid in 64-bit mode: the rest stays as it is */
    cr_assert_eq(fold_hex("90 90 06 90 90", "66 90 06 90 90"), 1);
    /* a call cut short by the end of the buffer */
    cr_assert_eq(fold_hex("90 90 90 e8 01", "0f 1f 00 e8 01"), 1);
}

/*
 * The copies and fills the planner and the memo make without a library call
 * (util.h): every length up to past the longest key, at every alignment, the
 * bytes around the destination untouched.
 */
Test(nop, small_copy_and_fill_match_memcpy_and_memset)
{
    uint8_t src[600], dst[640], ref[640];

    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)(i * 131u + 7u);
    for (size_t al = 0; al < 8; al++) {
        for (size_t n = 0; n <= 520; n++) {
            memset(dst, 0x5a, sizeof(dst));
            memset(ref, 0x5a, sizeof(ref));
            ap_copy_small(dst + 16 + al, src + (n % 7), n);
            memcpy(ref + 16 + al, src + (n % 7), n);
            cr_assert_arr_eq(dst, ref, sizeof(dst), "copy of %zu bytes at +%zu", n, al);
            memset(dst, 0x5a, sizeof(dst));
            memset(ref, 0x5a, sizeof(ref));
            ap_fill_small(dst + 16 + al, (uint8_t)(0xc3 + n), n);
            memset(ref + 16 + al, (uint8_t)(0xc3 + n), n);
            cr_assert_arr_eq(dst, ref, sizeof(dst), "fill of %zu bytes at +%zu", n, al);
        }
    }
}
