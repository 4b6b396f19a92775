/* SPDX-License-Identifier: MIT */
/* The readable views: one block per site, and the one-line refusals of --check. */
#include <elf.h>
#include <string.h>

#include "altdump.h"

#define BYTES_COL 34 /* width of the bytes column: 11 bytes */

void ad_print_insns(FILE *f, const struct ad_image *img, const uint8_t *bytes, size_t len,
                    uint64_t addr, bool intel, const char *indent)
{
    size_t off = 0;
    if (len == 0)
        fprintf(f, "%s(empty)\n", indent);
    while (off < len) {
        char text[512], hex[3 * AD_MAX_SITE + 1] = "";
        int n = ad_format_insn(img, bytes + off, len - off, addr + off, intel, text, sizeof(text));
        size_t take = n > 0 ? (size_t)n : len - off; /* (bad): show the rest at once */
        for (size_t k = 0; k < take; k++)
            snprintf(hex + 3 * k, sizeof(hex) - 3 * k, "%02x ", bytes[off + k]);
        fprintf(f, "%s0x%llx  %-*s %s\n", indent, (unsigned long long)(addr + off), BYTES_COL,
                hex, n > 0 ? text : "(bad)");
        off += take;
    }
}

static const char *type_name(int t)
{
    return t == ET_EXEC ? "EXEC" : t == ET_DYN ? "DYN" : t == ET_REL ? "REL" : "?";
}

static void print_entry(FILE *f, const struct ad_image *img, const struct ad_entry *e,
                        unsigned k, const struct ad_opts *o)
{
    char flags[32];
    ad_flags_str(img, e->flags, flags, sizeof(flags));
    fprintf(f, "  entry %u (record %u): %s (%u*32+%u), flags %s, instrlen %u, replacementlen %u\n",
            k, e->index, ad_feature_name(img, e->feature), e->feature / 32u, e->feature % 32u, flags,
            e->instrlen, e->repllen);
    const uint8_t *r = NULL;
    if (img->repl.data && e->repl >= img->repl.addr &&
        e->repl - img->repl.addr <= img->repl.size &&
        e->repllen <= img->repl.size - (e->repl - img->repl.addr))
        r = img->repl.data + (e->repl - img->repl.addr);
    fprintf(f, "  replacement %u at 0x%llx:\n", k, (unsigned long long)e->repl);
    if (r)
        ad_print_insns(f, img, r, e->repllen, e->repl, o->intel, "    ");
    else
        fprintf(f, "    (outside altinstr_replacement)\n");
}

static void print_decision(FILE *f, const struct ad_image *img, const struct ad_site *s,
                           const struct ad_plan *p)
{
    if (p->reason != ALTPATCH_REASON_NONE) {
        fprintf(f, "  decision: refused: %s", altpatch_strreason(p->reason));
        if (p->bad_entry >= 0 && !p->detail[0])
            fprintf(f, " (entry %d)", p->bad_entry);
        fprintf(f, "%s%s\n", p->detail[0] ? ": " : "", p->detail);
    } else if (p->chosen >= 0) {
        const struct ad_entry *e = &img->entries[s->first + (unsigned)p->chosen];
        fprintf(f, "  decision: replaced by entry %d (%s%s)%s%s\n", p->chosen,
                (e->flags & ALT_FLAG_NOT) ? "not " : "", ad_feature_name(img, e->feature),
                p->detail[0] ? ": " : "", p->detail);
    } else {
        fprintf(f, "  decision: kept original (no entry eligible)\n");
    }
}

static void print_site(FILE *f, const struct ad_image *img, size_t i, const struct ad_plan *p,
                       const struct ad_opts *o)
{
    const struct ad_site *s = &img->sites[i];
    char sym[256];
    ad_symbolize(img, s->addr, sym, sizeof(sym));
    fprintf(f, "\nsite %zu at 0x%llx%s%s%s, %u bytes, %u entr%s\n", i, (unsigned long long)s->addr,
            *sym ? " <" : "", sym, *sym ? ">" : "", s->len, s->count, s->count == 1 ? "y" : "ies");
    for (unsigned k = 0; k < s->count; k++)
        print_entry(f, img, &img->entries[s->first + k], k, o);
    const uint8_t *orig = s->orig;
    fprintf(f, "  original:\n");
    if (orig)
        ad_print_insns(f, img, orig, s->len, s->addr, o->intel, "    ");
    else
        fprintf(f, "    (outside the executable sections)\n");
    print_decision(f, img, s, p);
    if (orig) {
        fprintf(f, "  final:\n");
        ad_print_insns(f, img, p->final, p->len, s->addr, o->intel, "    ");
    }
}

void ad_print_table(FILE *f, const struct ad_image *img, const struct ad_plan *plans,
                    const struct ad_opts *o)
{
    size_t repl = 0, kept = 0, ref = 0;
    for (size_t i = 0; i < img->nsites; i++) {
        ref += plans[i].reason != ALTPATCH_REASON_NONE;
        repl += plans[i].reason == ALTPATCH_REASON_NONE && plans[i].chosen >= 0;
        kept += plans[i].reason == ALTPATCH_REASON_NONE && plans[i].chosen < 0;
    }
    if (img->kernel.on)
        fprintf(f, "%s: ELF64 x86-64 %s, Linux kernel %s%s (%s), %u-byte records (%s), "
                   "feature names of %s, %zu records, %zu sites\n",
                img->file, type_name(img->elf_type), img->kernel.module ? "module " : "",
                img->kernel.release[0] ? img->kernel.release : "of unknown version",
                img->kernel.source ? img->kernel.source : "no version string",
                img->kernel.record_size, img->kernel.layout_why, img->kernel.tab->version,
                img->nentries, img->nsites);
    else
        fprintf(f, "%s: ELF64 x86-64 %s, altpatch format %u, %zu records, %zu sites\n",
                img->file, type_name(img->elf_type), img->note.version, img->nentries,
                img->nsites);
    if (img->prepatched)
        fprintf(f, "pre-patched for %s (planner version %u): the sites hold its plan; originals in %s\n",
                img->pp_profile, img->pp_planner, AD_PREPATCH_SECTION);
    if (img->prepatched)
        fprintf(f, "plan note: %s%s\n", ad_plan_note_name(img->pp_plan_note),
                img->pp_plan_note == ALTPATCH_PLAN_NOTE_FILLED
                    ? " (a first apply that selects the same entries settles without reading "
                      "the file)"
                : img->pp_plan_note == ALTPATCH_PLAN_NOTE_EMPTY
                    ? " (the plan is not its set's selection at every site: a first apply "
                      "reads the file)"
                : img->pp_plan_note == ALTPATCH_PLAN_NOTE_STALE
                    ? " (warning: it does not describe what the file holds -- left by an older "
                      "altprepatch, or damaged: not used, a first apply reads the file; "
                      "pre-patching the file again rewrites it)"
                    : " (built without it: a first apply reads the file)");
    fprintf(f, "cpu %s (%s): %zu replaced, %zu kept, %zu refused\n", o->cpu->spec,
            altpatch_features_vendor(o->cpu->fs), repl, kept, ref);
    for (size_t i = 0; i < img->nsites; i++)
        print_site(f, img, i, &plans[i], o);
}

size_t ad_print_refusals(FILE *f, const char *prefix, const struct ad_image *img,
                         const struct ad_plan *plans)
{
    size_t n = 0;
    for (size_t i = 0; i < img->nsites; i++) {
        const struct ad_plan *p = &plans[i];
        if (p->reason == ALTPATCH_REASON_NONE)
            continue;
        char sym[256];
        ad_symbolize(img, img->sites[i].addr, sym, sizeof(sym));
        char detail[256];
        if (p->detail[0])
            snprintf(detail, sizeof(detail), "%s", p->detail);
        else if (p->bad_entry >= 0)
            snprintf(detail, sizeof(detail), "entry %d", p->bad_entry);
        else
            snprintf(detail, sizeof(detail), "no detail");
        fprintf(f, "%s%s: site %zu at 0x%llx (%s): %s (%s)\n", prefix, img->file, i,
                (unsigned long long)img->sites[i].addr, *sym ? sym : "no symbol",
                altpatch_strreason(p->reason), detail);
        n++;
    }
    return n;
}
