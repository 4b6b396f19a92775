/* SPDX-License-Identifier: MIT */
/*
 * CPU selection and the decisions: every site goes through the library's
 * planner (altpatch_image_plan), exactly as altpatch_apply() does; nothing
 * here re-implements a rule.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <Zydis/Zydis.h>

#include "altdump.h"
#include "../common/cpuspec.h"

int ad_cpu_parse(const char *spec, struct ad_cpu *cpu, char *err, size_t errsz)
{
    memset(cpu, 0, sizeof(*cpu));
    if (!spec || !*spec)
        spec = "host";
    if (strlen(spec) >= sizeof(cpu->spec)) {
        snprintf(err, errsz, "--cpu argument too long");
        return AD_EXIT_USAGE;
    }
    snprintf(cpu->spec, sizeof(cpu->spec), "%s", spec);
    char name[128];
    const char *edits;
    cpu->fs = cpuspec_split(spec, name, sizeof(name), &edits) ? NULL
                                                              : altpatch_features_profile(name);
    if (!cpu->fs) {
        cpuspec_unknown(name, err, errsz);
        return AD_EXIT_USAGE;
    }
    if (edits && *edits) {
        int rc = altpatch_features_edit(cpu->fs, edits);
        if (rc == -ENOENT) {
            snprintf(cpu->edit_err, sizeof(cpu->edit_err),
                     "--cpu: bad feature edit list '%.100s' (unknown feature name)", edits);
            return 0;
        }
        if (rc) {
            snprintf(err, errsz, "bad feature edit list '%s' (%s)", edits,
                     rc == -ENOENT ? "unknown feature name" : strerror(-rc));
            ad_cpu_free(cpu);
            return AD_EXIT_USAGE;
        }
    }
    return 0;
}

void ad_cpu_free(struct ad_cpu *cpu)
{
    altpatch_features_free(cpu->fs);
    cpu->fs = NULL;
}

struct fill {
    const struct ad_image *img;
    struct ad_plan *plans;
};

/* One site of the library's plan into the tool's ad_plan. */
static int fill_plan(const struct altpatch_image_site *s, void *ctx)
{
    struct fill *f = ctx;
    struct ad_plan *p = &f->plans[s->index];
    p->reason = s->reason;
    p->bad_entry = s->bad_entry;
    p->chosen = s->chosen;
    p->len = (uint8_t)s->len;
    if (s->original)
        memcpy(p->orig, s->original, s->len);
    memcpy(p->final, s->final ? s->final : p->orig, s->len);
    snprintf(p->detail, sizeof(p->detail), "%s", s->detail ? s->detail : "");
    return 0;
}

int ad_decide(const struct ad_image *img, const struct altpatch_features *fs,
              struct ad_plan **out)
{
    *out = calloc(img->nsites ? img->nsites : 1, sizeof(**out));
    if (!*out)
        return AD_EXIT_INTERNAL;
    struct fill f = {img, *out};
    /* Planning is the library's; the image keeps only its last plan, which
     * this copy makes the caller's. */
    if (altpatch_image_plan(img->ai, fs) != 0 ||
        altpatch_image_site_foreach(img->ai, fill_plan, &f) != 0) {
        free(*out);
        *out = NULL;
        return AD_EXIT_INTERNAL;
    }
    if (img->kernel.on)
        ad_kernel_direct_calls(img, *out);
    return 0;
}

int ad_decide_cpu(const struct ad_image *img, const struct ad_cpu *cpu, struct ad_plan **out,
                  char *err, size_t errsz)
{
    *out = NULL;
    if (!img->kernel.on && cpu->edit_err[0]) {
        snprintf(err, errsz, "%s", cpu->edit_err);
        return AD_EXIT_USAGE;
    }
    if (!img->kernel.on)
        return ad_decide(img, cpu->fs, out) ? AD_EXIT_INTERNAL : 0;
    struct altpatch_features *fs = NULL;
    int rc = ad_kernel_cpu(img, cpu->spec, &fs, err, errsz);
    if (rc)
        return rc;
    rc = ad_decide(img, fs, out) ? AD_EXIT_INTERNAL : 0;
    altpatch_features_free(fs);
    return rc;
}

size_t ad_count_refused(const struct ad_image *img, const struct ad_plan *plans)
{
    size_t n = 0;
    for (size_t i = 0; i < img->nsites; i++)
        n += plans[i].reason != ALTPATCH_REASON_NONE;
    return n;
}

const char *ad_decision_name(const struct ad_plan *p)
{
    if (p->reason != ALTPATCH_REASON_NONE)
        return "refused";
    return p->chosen >= 0 ? "replaced" : "kept";
}

const char *ad_feature_name(const struct ad_image *img, unsigned id)
{
    const char *n = img && img->kernel.on ? ad_kernel_feature_name(&img->kernel, id)
                                          : altpatch_feature_name(id);
    return n ? n : "unknown";
}

void ad_flags_str(const struct ad_image *img, unsigned flags, char *out, size_t outsz)
{
    if (!flags) {
        snprintf(out, outsz, "none");
        return;
    }
    bool dcall = img && img->kernel.on && (flags & AD_KALT_FLAG_DIRECT_CALL);
    unsigned rest = flags & ~(unsigned)ALT_FLAG_NOT & ~(dcall ? AD_KALT_FLAG_DIRECT_CALL : 0u);
    size_t n = 0;
    out[0] = '\0';
    if (flags & ALT_FLAG_NOT)
        n += (size_t)snprintf(out + n, outsz - n, "NOT");
    if (dcall && n < outsz)
        n += (size_t)snprintf(out + n, outsz - n, "%sDIRECT_CALL", n ? "|" : "");
    if (rest && n < outsz)
        snprintf(out + n, outsz - n, "%s0x%x", n ? "|" : "", rest);
}

size_t ad_padding(const uint8_t *orig, size_t len)
{
    ZydisDecoder dec;
    if (!ZYAN_SUCCESS(ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)))
        return 0;
    size_t off = 0, run = 0;
    while (off < len) {
        ZydisDecodedInstruction in;
        if (!ZYAN_SUCCESS(ZydisDecoderDecodeInstruction(&dec, NULL, orig + off, len - off, &in)) ||
            in.length == 0)
            return 0; /* not decodable: no padding claimed */
        /* The two architectural NOPs only: 90 (not f3 90 or 41 90, which
         * Zydis names PAUSE / XCHG) and 0f 1f /0. */
        bool nop = in.mnemonic == ZYDIS_MNEMONIC_NOP &&
                   ((in.opcode_map == ZYDIS_OPCODE_MAP_DEFAULT && in.opcode == 0x90) ||
                    (in.opcode_map == ZYDIS_OPCODE_MAP_0F && in.opcode == 0x1f &&
                     (in.attributes & ZYDIS_ATTRIB_HAS_MODRM) && in.raw.modrm.reg == 0));
        run = nop ? run + in.length : 0;
        off += in.length;
    }
    return run;
}
