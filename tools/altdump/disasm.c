/* SPDX-License-Identifier: MIT */
/*
 * Instructions as objdump users read them, with Zydis: branch targets as
 * "1c60 <reloc_check>", RIP-relative operands as "0x2775(%rip)" followed by
 * "# 40f0 <reloc_mem>", lower-case hex without zero padding. Symbols come
 * from the image (ad_symbol_at); an address without one is printed bare.
 */
#include <Zydis/Zydis.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "altdump.h"

/* "<sym>" or "<sym+0x10>" for @p addr, or "" when no symbol covers it. */
void ad_symbol_ref(const struct ad_image *img, uint64_t addr, char *out, size_t outsz)
{
    uint64_t off = 0;
    const struct ad_symbol *s = img ? ad_symbol_at(img, addr, &off) : NULL;
    if (!s)
        out[0] = '\0';
    else if (off)
        snprintf(out, outsz, " <%.200s+0x%" PRIx64 ">", s->name, off);
    else
        snprintf(out, outsz, " <%.200s>", s->name);
}

static ZyanStatus append(ZydisFormatterBuffer *buffer, const char *text)
{
    ZyanString *str;
    ZyanStringView v;
    ZYAN_CHECK(ZydisFormatterBufferGetString(buffer, &str));
    ZYAN_CHECK(ZyanStringViewInsideBufferEx(&v, text, strlen(text)));
    return ZyanStringAppend(str, &v);
}

/* Branch and call targets: "1c60 <reloc_check>". */
static ZyanStatus print_abs(const ZydisFormatter *fmt, ZydisFormatterBuffer *buffer,
                            ZydisFormatterContext *ctx)
{
    (void)fmt;
    ZyanU64 addr;
    char text[256], sym[240];
    ZYAN_CHECK(ZydisCalcAbsoluteAddress(ctx->instruction, ctx->operand, ctx->runtime_address,
                                        &addr));
    ad_symbol_ref(ctx->user_data, addr, sym, sizeof(sym));
    snprintf(text, sizeof(text), "%" PRIx64 "%s", (uint64_t)addr, sym);
    ZYAN_CHECK(ZydisFormatterBufferAppend(buffer, ZYDIS_TOKEN_ADDRESS_ABS));
    return append(buffer, text);
}

int ad_format_insn(const struct ad_image *img, const uint8_t *buf, size_t avail, uint64_t addr,
                   bool intel, char *out, size_t outsz)
{
    ZydisDecoder dec;
    ZydisDecodedInstruction in;
    ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
    ZydisFormatter fmt;
    ZydisFormatterFunc hook = print_abs;
    if (outsz < sizeof("(bad)")) {
        if (outsz)
            out[0] = '\0';
        return -EINVAL;
    }
    if (!buf || avail == 0) {
        snprintf(out, outsz, "(bad)");
        return -ENODATA;
    }
    ZyanStatus st = ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
    if (ZYAN_SUCCESS(st))
        st = ZydisDecoderDecodeFull(&dec, buf, avail, &in, ops);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterInit(&fmt, intel ? ZYDIS_FORMATTER_STYLE_INTEL
                                            : ZYDIS_FORMATTER_STYLE_ATT);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterSetProperty(&fmt, ZYDIS_FORMATTER_PROP_FORCE_RELATIVE_RIPREL, 1);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterSetProperty(&fmt, ZYDIS_FORMATTER_PROP_HEX_UPPERCASE, 0);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterSetProperty(&fmt, ZYDIS_FORMATTER_PROP_ADDR_PADDING_ABSOLUTE,
                                       ZYDIS_PADDING_DISABLED);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterSetProperty(&fmt, ZYDIS_FORMATTER_PROP_ADDR_PADDING_RELATIVE,
                                       ZYDIS_PADDING_DISABLED);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterSetProperty(&fmt, ZYDIS_FORMATTER_PROP_IMM_PADDING,
                                       ZYDIS_PADDING_DISABLED);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterSetProperty(&fmt, ZYDIS_FORMATTER_PROP_DISP_PADDING,
                                       ZYDIS_PADDING_DISABLED);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterSetHook(&fmt, ZYDIS_FORMATTER_FUNC_PRINT_ADDRESS_ABS,
                                   (const void **)&hook);
    if (ZYAN_SUCCESS(st))
        st = ZydisFormatterFormatInstruction(&fmt, &in, ops, in.operand_count_visible, out,
                                               outsz, addr, (void *)(uintptr_t)img);
    if (!ZYAN_SUCCESS(st)) {
        snprintf(out, outsz, "(bad)");
        return -EILSEQ;
    }
    /* AT&T indirect branches read "call *..." (objdump, and Zydis without the
     * relative RIP form). */
    if (!intel && in.operand_count_visible > 0 && ops[0].type != ZYDIS_OPERAND_TYPE_IMMEDIATE &&
        (in.meta.category == ZYDIS_CATEGORY_CALL || in.meta.category == ZYDIS_CATEGORY_UNCOND_BR) &&
        !strchr(out, '*')) {
        char *sp = strchr(out, ' ');
        size_t used = strlen(out);
        if (sp && used + 2 <= outsz) {
            memmove(sp + 2, sp + 1, used - (size_t)(sp + 1 - out) + 1);
            sp[1] = '*';
        }
    }
    /* A RIP-relative memory operand: objdump's "# target <symbol>" comment. */
    for (unsigned i = 0; i < in.operand_count_visible; i++) {
        ZyanU64 target;
        char sym[240];
        if (ops[i].type != ZYDIS_OPERAND_TYPE_MEMORY || ops[i].mem.base != ZYDIS_REGISTER_RIP ||
            !ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&in, &ops[i], addr, &target)))
            continue;
        ad_symbol_ref(img, target, sym, sizeof(sym));
        size_t used = strlen(out);
        snprintf(out + used, outsz - used, "  # %" PRIx64 "%s", (uint64_t)target, sym);
        break;
    }
    return in.length;
}
