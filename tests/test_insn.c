/* SPDX-License-Identifier: MIT */
/*
 * Instruction decoding through Zydis (insn.c): lengths, relative fields,
 * errors, and formatting with absolute branch targets.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ap_hex.h"
#include "pure.h"


/* Decode @h fully; assert success and whole-buffer length. */
static struct ap_insn dec(const char *h)
{
    uint8_t b[32];
    size_t n = hex(h, b);
    struct ap_insn in;

    cr_assert_eq(ap_insn_decode(b, n, &in), 0, "%s decodes", h);
    cr_assert_eq(in.len, n, "%s is %zu bytes (got %u)", h, n, in.len);
    return in;
}

static void expect_rel(const char *h, bool branch, unsigned off, unsigned size, int64_t value)
{
    struct ap_insn in = dec(h);

    cr_assert(in.has_rel, "%s has a relative field", h);
    cr_assert_eq(in.rel_is_branch, branch, "%s branch?", h);
    cr_assert_eq(in.rel_off, off, "%s field offset %u", h, in.rel_off);
    cr_assert_eq(in.rel_size, size, "%s field size %u", h, in.rel_size);
    cr_assert_eq(in.rel_value, value, "%s value %lld", h, (long long)in.rel_value);
}

Test(insn, plain_lengths)
{
    cr_assert_not(dec("0f ae e8").has_rel);          /* lfence */
    cr_assert_not(dec("64 48 8b 04 25 00 00 00 00").has_rel); /* mov %fs:0,%rax */
    cr_assert_not(dec("f3 48 0f ae c0").has_rel);    /* rdfsbase %rax */
    cr_assert_not(dec("48 b8 01 02 03 04 05 06 07 08").has_rel); /* movabs */
    cr_assert(dec("cc").is_int3);
    cr_assert_not(dec("90").is_int3);
}

Test(insn, calls_of_every_form)
{
    cr_assert(dec("e8 10 00 00 00").is_call);         /* call rel32 */
    cr_assert(dec("ff d0").is_call);                  /* call *%rax */
    cr_assert(dec("41 ff d3").is_call);               /* call *%r11 */
    cr_assert(dec("ff 15 00 10 00 00").is_call);      /* call *0x1000(%rip) */
    cr_assert(dec("ff 14 24").is_call);               /* call *(%rsp) */
    cr_assert(dec("3e ff d0").is_call);               /* notrack call *%rax */
    cr_assert(dec("ff 1c 24").is_call);               /* lcall *(%rsp): far, indirect */
    cr_assert_not(dec("e9 10 00 00 00").is_call);     /* jmp rel32 */
    cr_assert_not(dec("ff e0").is_call);              /* jmp *%rax */
    cr_assert_not(dec("c3").is_call);                 /* ret */
    cr_assert_not(dec("90").is_call);
    cr_assert_not(dec("0f 1f 44 00 00").is_call);     /* nopl */
}

Test(insn, branch_immediates)
{
    expect_rel("e8 10 00 00 00", true, 1, 4, 0x10);        /* call rel32 */
    expect_rel("e9 f0 ff ff ff", true, 1, 4, -0x10);       /* jmp rel32 */
    expect_rel("eb fe", true, 1, 1, -2);                   /* jmp rel8 */
    expect_rel("75 7f", true, 1, 1, 127);                  /* jne rel8 */
    expect_rel("0f 84 00 01 00 00", true, 2, 4, 0x100);    /* je rel32 */
    expect_rel("e3 05", true, 1, 1, 5);                    /* jrcxz */
    expect_rel("e2 80", true, 1, 1, -128);                 /* loop */
    expect_rel("c7 f8 20 00 00 00", true, 2, 4, 0x20);     /* xbegin */
}

Test(insn, rip_relative_displacements)
{
    expect_rel("48 8b 05 10 00 00 00", false, 3, 4, 0x10);  /* mov 0x10(%rip),%rax */
    expect_rel("48 8d 3d f0 ff ff ff", false, 3, 4, -0x10); /* lea -0x10(%rip),%rdi */
    expect_rel("ff 15 00 10 00 00", false, 2, 4, 0x1000);   /* call *0x1000(%rip) */
    /* movl $5, 0x1(%rip): displacement before the immediate */
    expect_rel("c7 05 01 00 00 00 05 00 00 00", false, 2, 4, 1);
    /* VEX: vmovdqa 0x1(%rip),%ymm0 */
    expect_rel("c5 fd 6f 05 01 00 00 00", false, 4, 4, 1);
}

Test(insn, non_rip_memory_is_not_relative)
{
    cr_assert(dec("48 8b 05 10 00 00 00").has_rel);                  /* the rip form is */
    cr_assert_not(dec("48 8b 04 25 10 00 00 00").has_rel);           /* absolute disp32 */
    cr_assert_not(dec("48 8b 40 10").has_rel);                       /* 0x10(%rax) */
    cr_assert_not(dec("ff d0").has_rel);                             /* call *%rax */
}

Test(insn, errors)
{
    uint8_t b[16];
    struct ap_insn in;
    size_t n;

    n = hex("e8 01 02", b);
    cr_assert_eq(ap_insn_decode(b, n, &in), -ENODATA, "truncated call");
    cr_assert_eq(ap_insn_decode(b, 0, &in), -ENODATA, "empty buffer");
    n = hex("06", b);
    cr_assert_eq(ap_insn_decode(b, n, &in), -EILSEQ, "push %%es is invalid in 64-bit mode");
    n = hex("f0 90", b);
    cr_assert_eq(ap_insn_decode(b, n, &in), -EILSEQ, "lock nop");
    /* 66 e9: rel32 on Intel, rel16 on AMD: ambiguous, refused; 66 90 is still fine */
    n = hex("66 e9 01 00 00 00", b);
    cr_assert_eq(ap_insn_decode(b, n, &in), -EILSEQ, "66-prefixed jmp");
    /* same length on both, but AMD truncates the target to 16 bits */
    n = hex("66 eb 00", b);
    cr_assert_eq(ap_insn_decode(b, n, &in), -EILSEQ, "66-prefixed jmp rel8");
    n = hex("66 0f 85 00 00 00 00", b);
    cr_assert_eq(ap_insn_decode(b, n, &in), -EILSEQ, "66-prefixed jne");
    /* 67: EIP-relative, wraps at 4 GiB */
    n = hex("67 48 8b 05 10 00 00 00", b);
    cr_assert_eq(ap_insn_decode(b, n, &in), -EILSEQ, "eip-relative");
}

Test(insn, format_att_and_intel_with_absolute_targets)
{
    uint8_t b[16];
    char out[96];
    size_t n = hex("e8 00 10 00 00", b);

    cr_assert_eq(ap_insn_format(b, n, 0x401000, false, out, sizeof(out)), 5);
    cr_assert_str_eq(out, "call 0x0000000000402005");
    cr_assert_eq(ap_insn_format(b, n, 0x401000, true, out, sizeof(out)), 5);
    cr_assert_str_eq(out, "call 0x0000000000402005");
    n = hex("48 8b 05 10 00 00 00", b);
    cr_assert_eq(ap_insn_format(b, n, 0x1000, false, out, sizeof(out)), 7);
    cr_assert_str_eq(out, "mov 0x0000000000001017, %rax");
    cr_assert_eq(ap_insn_format(b, n, 0x1000, true, out, sizeof(out)), 7);
    cr_assert_str_eq(out, "mov rax, [0x0000000000001017]");
}

Test(insn, format_bad)
{
    uint8_t b[4] = {0x06};
    char out[32];

    cr_assert_eq(ap_insn_format(b, 1, 0, false, out, sizeof(out)), -EILSEQ);
    cr_assert_str_eq(out, "(bad)");
    b[0] = 0xe8;
    cr_assert_eq(ap_insn_format(b, 2, 0, false, out, sizeof(out)), -ENODATA);
    cr_assert_str_eq(out, "(bad)");
}

/* ap_nop1_at(): a 0x90 at an instruction boundary is exactly what Zydis
 * decodes there, whatever follows it; any other first byte is left to Zydis. */
Test(insn, one_byte_nop_known_without_decoding)
{
    for (unsigned next = 0; next < 256; next++) {
        uint8_t b[16];
        struct ap_insn in, known;

        memset(b, (int)next, sizeof(b));
        b[0] = 0x90;
        for (size_t avail = 1; avail <= sizeof(b); avail += 15) {
            cr_assert_eq(ap_insn_decode(b, avail, &in), 0, "90 %02x decodes", next);
            memset(&known, 0xa5, sizeof(known));
            cr_assert(ap_nop1_at(b, &known), "90 %02x: known", next);
            cr_assert(known.len == in.len && known.rel_off == in.rel_off &&
                          known.rel_size == in.rel_size && known.is_nop == in.is_nop &&
                          known.is_int3 == in.is_int3 && known.is_call == in.is_call &&
                          known.is_fence == in.is_fence && known.has_rel == in.has_rel &&
                          known.rel_is_branch == in.rel_is_branch &&
                          known.rel_value == in.rel_value,
                      "90 %02x (%zu bytes): as Zydis decodes it", next, avail);
            cr_assert(in.len == 1 && in.is_nop);
        }
        b[0] = (uint8_t)next;
        memset(&known, 0xa5, sizeof(known));
        cr_assert_eq(ap_nop1_at(b, &known), next == 0x90, "%02x: not the one-byte NOP", next);
        if (next != 0x90)
            for (size_t i = 0; i < sizeof(known); i++)
                cr_assert_eq(((uint8_t *)&known)[i], 0xa5, "%02x: out untouched", next);
    }
    /* the prefixed forms are not it (f3 90: PAUSE, 41 90: XCHG) */
    cr_assert_not(ap_nop1_at((const uint8_t[]){0xf3, 0x90}, &(struct ap_insn){0}));
    cr_assert_not(ap_nop1_at((const uint8_t[]){0x41, 0x90}, &(struct ap_insn){0}));
}
