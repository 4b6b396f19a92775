/* SPDX-License-Identifier: MIT */
/*
 * insn.c - the library's only window onto x86 instruction encoding.
 *
 * Every decision about instruction boundaries, NOPs and relative operands is
 * made here by Zydis 4; no other file includes <Zydis/Zydis.h> and none keeps
 * a byte table of opcodes (the planner knows a 0x90 at an instruction
 * boundary as the NOP table's one-byte NOP, ap_nop1_at(), which test_insn
 * holds to Zydis for every byte that may follow). The decoder and formatter are plain structs that
 * are initialised on the stack at every call: no global state, thread-safe.
 *
 * Speed (the planner decodes each instruction of a site's original and of
 * each replacement once per plan, and never padding; the decoder is
 * initialised per call, about twenty instructions, which for a small program
 * is cheaper than a process-wide decoder's first touch): ap_insn_decode()
 * first decodes in ZYDIS_DECODER_MODE_MINIMAL (length, mnemonic, raw fields
 * and the IS_RELATIVE attribute, no operands, no semantic analysis). A
 * relative branch immediate is read from the raw fields. Operands are decoded
 * (a second, full decode) only when the ModRM byte has the RIP-relative form
 * (mod 00, r/m 101: the only encoding of a RIP/EIP-relative operand in 64-bit
 * mode; checked whether or not Zydis flags the instruction relative), or
 * when Zydis flags it relative without a relative immediate.
 *
 * Facts verified against Zydis 4.0.0 (64-bit mode):
 *   90, 66 90, 48 90, 2e/3e 90, 66 66 90  -> NOP
 *   f3 90                                 -> PAUSE  (not a NOP for us)
 *   41 90                                 -> XCHG eax, r8d (writes rax/r8)
 *   0f 1f /0 (any prefixes, any form)     -> NOP
 *   0f 19..0f 1e, 0f 1f /1..7             -> also NOP in Zydis: reserved
 *                                           hint space, not NOP for us
 *   f3 0f 1e fa                           -> ENDBR64 (never a NOP for us)
 *   66 e9 rel / 66 eb rel                 -> Intel: 64-bit target;
 *                                           AMD: rel16, 16-bit target
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <Zydis/Zydis.h>

#include "pure.h"

/* Decode one instruction of 64-bit code, operands included. */
static ZyanStatus decode_full(const uint8_t *buf, size_t avail, ZydisDecodedInstruction *in,
                              ZydisDecodedOperand *ops)
{
    ZydisDecoder dec;
    ZyanStatus st = ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);

    if (!ZYAN_SUCCESS(st))
        return st;
    return ZydisDecoderDecodeFull(&dec, buf, avail, in, ops);
}

/* Decode one instruction without operands or semantic analysis: length,
 * mnemonic, opcode, raw fields and the IS_RELATIVE attribute only. The same
 * decoder modes as decode_full() (Init's defaults) plus MINIMAL. */
static ZyanStatus decode_minimal(const uint8_t *buf, size_t avail, ZydisDecodedInstruction *in)
{
    ZydisDecoder dec;
    ZyanStatus st = ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);

    if (ZYAN_SUCCESS(st))
        st = ZydisDecoderEnableMode(&dec, ZYDIS_DECODER_MODE_MINIMAL, ZYAN_TRUE);
    if (!ZYAN_SUCCESS(st))
        return st;
    return ZydisDecoderDecodeInstruction(&dec, NULL, buf, avail, in);
}

/* ModRM in the RIP-relative memory form (mod 00, r/m 101 in 64-bit mode): the
 * only encoding of a RIP- (or, with 67, EIP-) relative memory operand. */
static bool rip_form(const ZydisDecodedInstruction *in)
{
    return in->raw.modrm.offset != 0 && in->raw.modrm.mod == 0 && in->raw.modrm.rm == 5;
}

static int status_to_errno(ZyanStatus st)
{
    return st == ZYDIS_STATUS_NO_MORE_DATA ? -ENODATA : -EILSEQ;
}

/* Only the two architectural NOP opcodes: 90 (not f3 90, not 41 90, which
 * Zydis already names PAUSE / XCHG) and 0f 1f /0 (NOPL). */
static bool insn_is_nop(const ZydisDecodedInstruction *in)
{
    if (in->mnemonic != ZYDIS_MNEMONIC_NOP)
        return false;
    if (in->opcode_map == ZYDIS_OPCODE_MAP_DEFAULT && in->opcode == 0x90)
        return true;
    return in->opcode_map == ZYDIS_OPCODE_MAP_0F && in->opcode == 0x1f &&
           (in->attributes & ZYDIS_ATTRIB_HAS_MODRM) && in->raw.modrm.reg == 0;
}

/* Relative branch immediate (jmp/call/jcc/loop/jrcxz/xbegin). 1: found. */
static int find_rel_imm(const ZydisDecodedInstruction *in, struct ap_insn *out)
{
    for (int i = 0; i < 2; i++) {
        if (!in->raw.imm[i].is_relative)
            continue;
        out->has_rel = true;
        out->rel_is_branch = true;
        out->rel_off = in->raw.imm[i].offset;
        out->rel_size = (uint8_t)(in->raw.imm[i].size / 8);
        out->rel_value = (int32_t)in->raw.imm[i].value.s; /* rel8/16/32: see ap_insn_decode */
        return 1;
    }
    return 0;
}

/* RIP-relative memory operand. 1: found; -EILSEQ: EIP-relative (67 prefix),
 * whose target wraps at 4 GiB and cannot be moved safely. */
static int find_rip_disp(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops,
                         struct ap_insn *out)
{
    for (unsigned i = 0; i < in->operand_count; i++) {
        if (ops[i].type != ZYDIS_OPERAND_TYPE_MEMORY)
            continue;
        if (ops[i].mem.base == ZYDIS_REGISTER_EIP)
            return -EILSEQ;
        if (ops[i].mem.base != ZYDIS_REGISTER_RIP)
            continue;
        if (in->raw.disp.size == 0)
            return -EILSEQ;
        out->has_rel = true;
        out->rel_is_branch = false;
        out->rel_off = in->raw.disp.offset;
        out->rel_size = (uint8_t)(in->raw.disp.size / 8);
        out->rel_value = (int32_t)in->raw.disp.value; /* disp32 */
        return 1;
    }
    return 0;
}

/*
 * A relative branch with an operand-size prefix (66) means different things
 * on different CPUs: Intel ignores the prefix in 64-bit mode (rel32, 64-bit
 * target), AMD honours it (rel16 immediate, target truncated to 16 bits).
 * Compilers never emit it; refuse it rather than guess.
 */
static int check_vendor_neutral(const ZydisDecodedInstruction *in)
{
    return (in->attributes & ZYDIS_ATTRIB_HAS_OPERANDSIZE) ? -EILSEQ : 0;
}

/* The relative field of a fully decoded instruction, if any (see ap_insn). */
static int decode_rel(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops,
                      struct ap_insn *out)
{
    int r;

    if (!(in->attributes & ZYDIS_ATTRIB_IS_RELATIVE))
        return 0;
    if (find_rel_imm(in, out)) {
        r = check_vendor_neutral(in);
        if (r == 0 && find_rip_disp(in, ops, &(struct ap_insn){0}) != 0)
            r = -EILSEQ; /* two relative fields: not representable */
    } else {
        r = find_rip_disp(in, ops, out);
        r = r < 0 ? r : 0;
    }
    return r;
}

/*
 * The common cases from a minimal decode. 1: done (out filled, or r < 0 in
 * *err); 0: the operands are needed (RIP-relative ModRM form, or a relative
 * instruction without a relative immediate).
 */
static int decode_rel_minimal(const ZydisDecodedInstruction *in, struct ap_insn *out, int *err)
{
    *err = 0;
    if (rip_form(in))
        return 0;
    if (!(in->attributes & ZYDIS_ATTRIB_IS_RELATIVE))
        return 1; /* no relative immediate, no RIP-relative operand */
    if (!find_rel_imm(in, out))
        return 0;
    /* a branch immediate; without the RIP form there is no second relative field */
    *err = check_vendor_neutral(in);
    return 1;
}

int ap_insn_decode(const uint8_t *buf, size_t avail, struct ap_insn *out)
{
    ZydisDecodedInstruction in;
    ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
    ZyanStatus st;
    int r;

    memset(out, 0, sizeof(*out));
    if (!buf || avail == 0)
        return -ENODATA;
    st = decode_minimal(buf, avail, &in);
    if (!ZYAN_SUCCESS(st))
        return status_to_errno(st);
    if (!decode_rel_minimal(&in, out, &r)) {
        memset(out, 0, sizeof(*out));
        st = decode_full(buf, avail, &in, ops);
        if (!ZYAN_SUCCESS(st))
            return status_to_errno(st);
        r = decode_rel(&in, ops, out);
    }
    if (r == 0 && out->has_rel && (out->rel_size == 0 || out->rel_size > 4))
        r = -EILSEQ; /* no such relative field in 64-bit code: never truncated */
    if (r < 0) {
        memset(out, 0, sizeof(*out));
        return r;
    }
    out->len = in.length;
    out->is_nop = insn_is_nop(&in);
    out->is_int3 = in.mnemonic == ZYDIS_MNEMONIC_INT3;
    out->is_call = in.mnemonic == ZYDIS_MNEMONIC_CALL; /* near or far, any form */
    out->is_fence = in.mnemonic == ZYDIS_MNEMONIC_LFENCE || in.mnemonic == ZYDIS_MNEMONIC_MFENCE ||
                    in.mnemonic == ZYDIS_MNEMONIC_SFENCE;
    return 0;
}

int ap_insn_format(const uint8_t *buf, size_t avail, uint64_t addr, bool intel, char *out,
                   size_t outsz)
{
    ZydisDecodedInstruction in;
    ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
    ZydisFormatter fmt;
    ZyanStatus st;
    struct ap_insn chk;
    int r;

    if (!out || outsz == 0)
        return -EINVAL;
    r = ap_insn_decode(buf, avail, &chk);
    if (r < 0)
        goto bad;
    st = decode_full(buf, avail, &in, ops);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterInit(&fmt, intel ? ZYDIS_FORMATTER_STYLE_INTEL
                                            : ZYDIS_FORMATTER_STYLE_ATT);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterFormatInstruction(&fmt, &in, ops, in.operand_count_visible, out,
                                             outsz, addr, NULL);
    if (!ZYAN_SUCCESS(st)) {
        r = st == ZYAN_STATUS_INSUFFICIENT_BUFFER_SIZE ? -ENOSPC : status_to_errno(st);
        goto bad;
    }
    return in.length;
bad:
    snprintf(out, outsz, "(bad)");
    return r;
}
