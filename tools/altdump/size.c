/* SPDX-License-Identifier: MIT */
/*
 * --size and --compare. The rules (docs/altdump.md "Size figures"):
 *   text      sum of SHF_ALLOC+SHF_EXECINSTR sections, altinstr_replacement excluded
 *   padding   per site, the trailing NOP instructions of the original bytes
 *   total     record table (altinstr_table, or altinstructions for format 1)
 *             + altinstr_replacement + padding + .note.altpatch
 *   pages     distinct 4 KiB pages touched by sites whose final bytes differ
 *   size(1)   Berkeley rule over section headers: SHF_ALLOC sections only;
 *             executable or read-only -> text, else NOBITS -> bss, else data
 */
#include <elf.h>
#include <stdlib.h>
#include <string.h>

#include "altdump.h"
#include "../common/berkeley.h"

#define AD_PAGE 4096ull

static void berkeley(const struct ad_image *img, struct ad_size *s)
{
    struct berkeley_sizes z = {s->sz_text, s->sz_data, s->sz_bss};
    for (size_t i = 1; i < img->nsecs; i++) {
        const struct ad_section *sec = &img->secs[i];
        if (!(sec->flags & SHF_ALLOC))
            continue;
        berkeley_add(&z, sec->flags, sec->type, sec->size);
        if ((sec->flags & SHF_EXECINSTR) && sec->type != SHT_NOBITS &&
            strcmp(sec->name, "altinstr_replacement") != 0)
            s->text += sec->size;
    }
    s->sz_text = z.text;
    s->sz_data = z.data;
    s->sz_bss = z.bss;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void sites(const struct ad_image *img, const struct ad_plan *plans, struct ad_size *s)
{
    uint64_t *pages = calloc(2 * img->nsites + 1, sizeof(*pages));
    size_t np = 0;
    s->sites = img->nsites;
    s->records = img->nentries;
    s->table_bytes = img->table_size;
    s->repl_bytes = img->repl.size;
    s->note_bytes = img->note_size;
    for (size_t i = 0; i < img->nsites; i++) {
        const struct ad_site *st = &img->sites[i];
        const uint8_t *orig = st->orig;
        if (!orig)
            continue;
        s->padding_bytes += ad_padding(orig, st->len);
        const struct ad_plan *p = plans ? &plans[i] : NULL;
        if (!p || p->reason != ALTPATCH_REASON_NONE || memcmp(p->final, orig, st->len) == 0)
            continue;
        s->changed_sites++;
        s->changed_bytes += st->len;
        if (pages) {
            pages[np++] = st->addr / AD_PAGE;
            if ((st->addr + st->len - 1) / AD_PAGE != st->addr / AD_PAGE)
                pages[np++] = (st->addr + st->len - 1) / AD_PAGE;
        }
    }
    if (pages && np) {
        qsort(pages, np, sizeof(*pages), cmp_u64);
        s->pages = 1;
        for (size_t i = 1; i < np; i++)
            s->pages += pages[i] != pages[i - 1];
    }
    free(pages);
    s->total = s->table_bytes + s->repl_bytes + s->padding_bytes + s->note_bytes;
}

void ad_size_compute(const struct ad_image *img, const struct ad_plan *plans, struct ad_size *out)
{
    memset(out, 0, sizeof(*out));
    berkeley(img, out);
    if (img->has_alt)
        sites(img, plans, out);
}

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

void ad_print_size(FILE *f, const struct ad_image *img, const struct ad_size *s,
                   const struct ad_opts *o)
{
    fprintf(f, "%s: text-size cost of alternatives (cpu %s)\n", img->file, o->cpu->spec);
    fprintf(f, "  %-36s %10llu bytes\n", "text (executable sections)", (unsigned long long)s->text);
    fprintf(f, "  %-36s %10llu\n", "sites", (unsigned long long)s->sites);
    fprintf(f, "  %-36s %10llu\n", "records", (unsigned long long)s->records);
    fprintf(f, "  %-36s %10llu bytes\n",
            !img->kernel.on && img->note.record_size == ALTPATCH_RECORD_SIZE_COMPACT
                ? "record table (altinstr_table)"
                : "record table (altinstructions)",
            (unsigned long long)s->table_bytes);
    fprintf(f, "  %-36s %10llu bytes\n", "replacements (altinstr_replacement)",
            (unsigned long long)s->repl_bytes);
    fprintf(f, "  %-36s %10llu bytes\n", "padding (NOPs after the original)",
            (unsigned long long)s->padding_bytes);
    fprintf(f, "  %-36s %10llu bytes\n", "note (.note.altpatch)", (unsigned long long)s->note_bytes);
    fprintf(f, "  %-36s %10llu bytes = %.3f%% of text\n", "total", (unsigned long long)s->total,
            pct(s->total, s->text));
    fprintf(f, "  %-36s %10.1f bytes\n", "per site",
            s->sites ? (double)s->total / (double)s->sites : 0.0);
    fprintf(f, "  %-36s %10llu (%llu bytes) in %llu text page%s\n", "sites written on this cpu",
            (unsigned long long)s->changed_sites, (unsigned long long)s->changed_bytes,
            (unsigned long long)s->pages, s->pages == 1 ? "" : "s");
    fprintf(f, "  %-36s text %llu  data %llu  bss %llu  dec %llu  hex %llx\n", "size(1)",
            (unsigned long long)s->sz_text, (unsigned long long)s->sz_data,
            (unsigned long long)s->sz_bss,
            (unsigned long long)(s->sz_text + s->sz_data + s->sz_bss),
            (unsigned long long)(s->sz_text + s->sz_data + s->sz_bss));
}

static void delta_pct(FILE *f, uint64_t a, uint64_t b, const char *sep)
{
    if (a)
        fprintf(f, "%+6.3f%%%s", 100.0 * ((double)b - (double)a) / (double)a, sep);
    else
        fprintf(f, "%7s%s", "n/a", sep);
}

void ad_print_compare(FILE *f, const struct ad_image *a, const struct ad_size *sa,
                      const struct ad_image *b, const struct ad_size *sb)
{
    uint64_t da = sa->sz_text + sa->sz_data + sa->sz_bss;
    uint64_t db = sb->sz_text + sb->sz_data + sb->sz_bss;
    fprintf(f, "%7s\t%7s\t%7s\t%7s\t%7s\t%s\n", "text", "data", "bss", "dec", "hex", "filename");
    fprintf(f, "%7llu\t%7llu\t%7llu\t%7llu\t%7llx\t%s\n", (unsigned long long)sa->sz_text,
            (unsigned long long)sa->sz_data, (unsigned long long)sa->sz_bss,
            (unsigned long long)da, (unsigned long long)da, a->file);
    fprintf(f, "%7llu\t%7llu\t%7llu\t%7llu\t%7llx\t%s\n", (unsigned long long)sb->sz_text,
            (unsigned long long)sb->sz_data, (unsigned long long)sb->sz_bss,
            (unsigned long long)db, (unsigned long long)db, b->file);
    fprintf(f, "%+7lld\t%+7lld\t%+7lld\t%+7lld\t%7s\t%s\n",
            (long long)(sb->sz_text - sa->sz_text), (long long)(sb->sz_data - sa->sz_data),
            (long long)(sb->sz_bss - sa->sz_bss), (long long)(db - da), "", "delta");
    delta_pct(f, sa->sz_text, sb->sz_text, "\t");
    delta_pct(f, sa->sz_data, sb->sz_data, "\t");
    delta_pct(f, sa->sz_bss, sb->sz_bss, "\t");
    delta_pct(f, da, db, "\t");
    fprintf(f, "%7s\t%s\n", "", "delta %");
    fprintf(f, "sites: %llu -> %llu; alternatives cost %llu bytes (%.3f%% of %s text), %.1f bytes "
               "per site\n",
            (unsigned long long)sa->sites, (unsigned long long)sb->sites,
            (unsigned long long)sb->total, pct(sb->total, sb->text), b->file,
            sb->sites ? (double)sb->total / (double)sb->sites : 0.0);
}
