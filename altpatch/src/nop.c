/* SPDX-License-Identifier: MIT */
/*
 * nop.c - padding that does nothing, and folding of NOP runs.
 *
 * The table is the Linux kernel's x86-64 one (arch/x86/include/asm/nops.h):
 * P6 NOPL forms up to 8 bytes, then a CS segment prefix (9) and one or two
 * operand-size prefixes (10, 11) on the 8-byte form. Longer gaps are a jump
 * over int3 filler, as the kernel's add_nop() does: executing one jmp is
 * cheaper than a chain of long NOPs, and the int3 bytes trap if anything ever
 * lands inside the gap.
 *
 * Which instruction is a NOP is decided by ap_insn_decode() (Zydis), never by
 * matching bytes here. ap_nop_fill_insns() says what ap_nop_fill() writes
 * (its own output, as ap_insn_decode() reports it; test_nop checks every
 * length against Zydis), so the planner need not decode its padding.
 */
#include <string.h>

#include "pure.h"

static const uint8_t nop1[] = {0x90};
static const uint8_t nop2[] = {0x66, 0x90};
static const uint8_t nop3[] = {0x0f, 0x1f, 0x00};
static const uint8_t nop4[] = {0x0f, 0x1f, 0x40, 0x00};
static const uint8_t nop5[] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
static const uint8_t nop6[] = {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00};
static const uint8_t nop7[] = {0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00};
static const uint8_t nop8[] = {0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t nop9[] = {0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t nop10[] = {0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t nop11[] = {0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84,
                                0x00, 0x00, 0x00, 0x00, 0x00};

const uint8_t *const ap_nops[AP_NOP_MAX + 1] = {
    NULL, nop1, nop2, nop3, nop4, nop5, nop6, nop7, nop8, nop9, nop10, nop11,
};

#define AP_JMP8 0xeb
#define AP_JMP32 0xe9
#define AP_INT3 0xcc
/* A jmp rel8 reaches at most 127 bytes past its own end: fills up to 2 + 127. */
#define AP_JMP8_MAX_FILL (2 + 127)

void ap_nop_fill(uint8_t *buf, size_t len)
{
    size_t jlen;

    if (len == 0)
        return;
    if (len <= AP_NOP_MAX) {
        ap_copy_small(buf, ap_nops[len], len);
        return;
    }
    if (len <= AP_JMP8_MAX_FILL) {
        jlen = 2;
        buf[0] = AP_JMP8;
        buf[1] = (uint8_t)(len - jlen);
    } else {
        /* len <= AP_MAX_SITE in practice; rel32 covers any size_t we meet. */
        uint32_t rel = (uint32_t)(len - 5);

        jlen = 5;
        buf[0] = AP_JMP32;
        memcpy(buf + 1, &rel, sizeof(rel)); /* x86-64: little-endian */
    }
    ap_fill_small(buf + jlen, AP_INT3, len - jlen);
}

size_t ap_nop_fill_insns(size_t len, struct ap_insn *out)
{
    size_t jlen, n = 0;

    if (len == 0)
        return 0;
    if (len <= AP_NOP_MAX) {
        out[0] = (struct ap_insn){.len = (uint8_t)len, .is_nop = true};
        return 1;
    }
    jlen = len <= AP_JMP8_MAX_FILL ? 2 : 5;
    out[n++] = (struct ap_insn){.len = (uint8_t)jlen, .has_rel = true, .rel_is_branch = true,
                                .rel_off = 1, .rel_size = (uint8_t)(jlen - 1),
                                .rel_value = (int32_t)(len - jlen)};
    for (size_t i = jlen; i < len; i++)
        out[n++] = (struct ap_insn){.len = 1, .is_int3 = true};
    return n;
}

/* Re-fill buf[start, end) (a run of NOP instructions); 1 if bytes changed. */
static size_t refill_run(uint8_t *buf, size_t start, size_t end)
{
    uint8_t tmp[AP_MAX_SITE];
    size_t n = end - start;

    if (n == 0)
        return 0;
    if (n > sizeof(tmp)) {
        ap_nop_fill(buf + start, n);
        return 1;
    }
    ap_nop_fill(tmp, n);
    if (memcmp(tmp, buf + start, n) == 0)
        return 0;
    memcpy(buf + start, tmp, n);
    return 1;
}

size_t ap_nop_fold(uint8_t *buf, size_t len)
{
    size_t off = 0, run = 0, runs = 0;
    bool in_run = false;
    struct ap_insn insn;

    while (off < len) {
        if (ap_insn_decode(buf + off, len - off, &insn) < 0)
            break;
        if (insn.is_nop && !in_run) {
            in_run = true;
            run = off;
        } else if (!insn.is_nop && in_run) {
            in_run = false;
            runs += refill_run(buf, run, off);
        }
        off += insn.len;
    }
    if (in_run)
        runs += refill_run(buf, run, off);
    return runs;
}
