/* SPDX-License-Identifier: MIT */
/* A small streaming JSON writer and the JSON form of every view (schema: docs/altdump.md). */
#include <elf.h>
#include <string.h>

#include "altdump.h"

static void sep(struct ad_json *j, const char *key)
{
    if (j->depth > 0) {
        if (!j->first[j->depth])
            fputc(',', j->f);
        j->first[j->depth] = false;
        fprintf(j->f, "\n%*s", 2 * j->depth, "");
    }
    if (key) {
        fputc('"', j->f);
        fputs(key, j->f); /* keys are literals of this file */
        fputs("\": ", j->f);
    }
}

static void push(struct ad_json *j, char c)
{
    fputc(c, j->f);
    if (j->depth + 1 < (int)(sizeof(j->first) / sizeof(j->first[0])))
        j->depth++;
    j->first[j->depth] = true;
}

static void pop(struct ad_json *j, char c)
{
    bool empty = j->first[j->depth];
    if (j->depth > 0)
        j->depth--;
    if (!empty)
        fprintf(j->f, "\n%*s", 2 * j->depth, "");
    fputc(c, j->f);
}

void ad_json_begin(struct ad_json *j, FILE *f)
{
    memset(j, 0, sizeof(*j));
    j->f = f;
}

void ad_json_obj(struct ad_json *j, const char *key)
{
    sep(j, key);
    push(j, '{');
}

void ad_json_arr(struct ad_json *j, const char *key)
{
    sep(j, key);
    push(j, '[');
}

void ad_json_end_obj(struct ad_json *j)
{
    pop(j, '}');
}

void ad_json_end_arr(struct ad_json *j)
{
    pop(j, ']');
}

void ad_json_str(struct ad_json *j, const char *key, const char *val)
{
    sep(j, key);
    fputc('"', j->f);
    for (const unsigned char *p = (const unsigned char *)val; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(j->f, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(j->f, "\\u%04x", *p);
        else
            fputc(*p, j->f);
    }
    fputc('"', j->f);
}

void ad_json_int(struct ad_json *j, const char *key, long long val)
{
    sep(j, key);
    fprintf(j->f, "%lld", val);
}

void ad_json_uint(struct ad_json *j, const char *key, unsigned long long val)
{
    sep(j, key);
    fprintf(j->f, "%llu", val);
}

void ad_json_hex(struct ad_json *j, const char *key, uint64_t val)
{
    char b[24];
    snprintf(b, sizeof(b), "0x%llx", (unsigned long long)val);
    ad_json_str(j, key, b);
}

void ad_json_bool(struct ad_json *j, const char *key, bool val)
{
    sep(j, key);
    fputs(val ? "true" : "false", j->f);
}

void ad_json_double(struct ad_json *j, const char *key, double val)
{
    sep(j, key);
    fprintf(j->f, "%.3f", val);
}

void ad_json_null(struct ad_json *j, const char *key)
{
    sep(j, key);
    fputs("null", j->f);
}

void ad_json_finish(struct ad_json *j)
{
    fputc('\n', j->f);
}

/* --- views ----------------------------------------------------------------- */

/* "aa bb cc" into out (at least 3*n bytes). */
static void hexstr(char *out, size_t outsz, const uint8_t *b, size_t n)
{
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && o + 4 <= outsz; i++)
        o += (size_t)snprintf(out + o, outsz - o, i ? " %02x" : "%02x", b[i]);
}

/* {"address", "bytes", "insns": [{"address","bytes","text"}...]} */
static void code(struct ad_json *j, const struct ad_image *img, const char *key,
                 const uint8_t *b, size_t n, uint64_t addr, const struct ad_opts *o)
{
    char hex[3 * AD_MAX_SITE + 4];
    ad_json_obj(j, key);
    ad_json_hex(j, "address", addr);
    hexstr(hex, sizeof(hex), b, n);
    ad_json_str(j, "bytes", hex);
    ad_json_arr(j, "insns");
    size_t off = 0;
    while (off < n) {
        char text[512];
        int k = ad_format_insn(img, b + off, n - off, addr + off, o->intel, text, sizeof(text));
        size_t take = k > 0 ? (size_t)k : n - off;
        ad_json_obj(j, NULL);
        ad_json_hex(j, "address", addr + off);
        hexstr(hex, sizeof(hex), b + off, take);
        ad_json_str(j, "bytes", hex);
        ad_json_str(j, "text", k > 0 ? text : "(bad)");
        ad_json_end_obj(j);
        off += take;
    }
    ad_json_end_arr(j);
    ad_json_end_obj(j);
}

static void entry(struct ad_json *j, const struct ad_image *img, const struct ad_entry *e,
                  const struct ad_opts *o)
{
    char flags[32];
    ad_flags_str(img, e->flags, flags, sizeof(flags));
    ad_json_obj(j, NULL);
    ad_json_uint(j, "record", e->index);
    ad_json_str(j, "feature", ad_feature_name(img, e->feature));
    ad_json_uint(j, "feature_id", e->feature);
    ad_json_uint(j, "feature_word", e->feature / 32u);
    ad_json_uint(j, "feature_bit", e->feature % 32u);
    ad_json_uint(j, "flags", e->flags);
    ad_json_str(j, "flags_text", flags);
    ad_json_uint(j, "instrlen", e->instrlen);
    ad_json_uint(j, "replacementlen", e->repllen);
    const struct ad_region *r = &img->repl;
    if (r->data && e->repl >= r->addr && e->repl - r->addr <= r->size &&
        e->repllen <= r->size - (e->repl - r->addr))
        code(j, img, "replacement", r->data + (e->repl - r->addr), e->repllen, e->repl, o);
    else
        ad_json_null(j, "replacement");
    ad_json_hex(j, "replacement_address", e->repl);
    ad_json_end_obj(j);
}

static void site(struct ad_json *j, const struct ad_image *img, size_t i, const struct ad_plan *p,
                 const struct ad_opts *o)
{
    const struct ad_site *s = &img->sites[i];
    uint64_t off = 0;
    const struct ad_symbol *sym = ad_symbol_at(img, s->addr, &off);
    ad_json_obj(j, NULL);
    ad_json_uint(j, "index", i);
    ad_json_hex(j, "address", s->addr);
    if (sym) {
        ad_json_str(j, "symbol", sym->name);
        ad_json_uint(j, "offset", off);
    } else {
        ad_json_null(j, "symbol");
        ad_json_null(j, "offset");
    }
    ad_json_uint(j, "length", s->len);
    ad_json_arr(j, "entries");
    for (unsigned k = 0; k < s->count; k++)
        entry(j, img, &img->entries[s->first + k], o);
    ad_json_end_arr(j);
    const uint8_t *orig = s->orig;
    if (orig)
        code(j, img, "original", orig, s->len, s->addr, o);
    else
        ad_json_null(j, "original");
    ad_json_str(j, "decision", ad_decision_name(p));
    ad_json_int(j, "chosen", p->chosen);
    ad_json_str(j, "reason", p->reason ? altpatch_strreason(p->reason) : "");
    ad_json_int(j, "reason_id", p->reason);
    ad_json_int(j, "bad_entry", p->bad_entry);
    ad_json_str(j, "detail", p->detail);
    if (orig)
        code(j, img, "final", p->final, p->len, s->addr, o);
    else
        ad_json_null(j, "final");
    ad_json_bool(j, "changes", orig && p->reason == 0 && memcmp(orig, p->final, s->len) != 0);
    ad_json_end_obj(j);
}

static void size_obj(struct ad_json *j, const struct ad_size *s)
{
    ad_json_obj(j, "size");
    ad_json_uint(j, "text", s->text);
    ad_json_uint(j, "sites", s->sites);
    ad_json_uint(j, "records", s->records);
    ad_json_uint(j, "table_bytes", s->table_bytes);
    ad_json_uint(j, "replacement_bytes", s->repl_bytes);
    ad_json_uint(j, "padding_bytes", s->padding_bytes);
    ad_json_uint(j, "note_bytes", s->note_bytes);
    ad_json_uint(j, "total_bytes", s->total);
    ad_json_double(j, "total_percent_of_text", s->text ? 100.0 * (double)s->total / (double)s->text : 0);
    ad_json_double(j, "bytes_per_site", s->sites ? (double)s->total / (double)s->sites : 0);
    ad_json_uint(j, "changed_sites", s->changed_sites);
    ad_json_uint(j, "changed_bytes", s->changed_bytes);
    ad_json_uint(j, "pages_written", s->pages);
    ad_json_obj(j, "berkeley");
    ad_json_uint(j, "text", s->sz_text);
    ad_json_uint(j, "data", s->sz_data);
    ad_json_uint(j, "bss", s->sz_bss);
    ad_json_uint(j, "dec", s->sz_text + s->sz_data + s->sz_bss);
    ad_json_end_obj(j);
    ad_json_end_obj(j);
}

void ad_json_cpu(struct ad_json *j, const struct ad_cpu *cpu)
{
    ad_json_obj(j, "cpu");
    ad_json_str(j, "spec", cpu->spec);
    ad_json_str(j, "vendor", altpatch_features_vendor(cpu->fs));
    ad_json_arr(j, "features");
    for (unsigned id = 0; id < ALTPATCH_FEATURE_BITS; id++)
        if (altpatch_features_has(cpu->fs, id) && altpatch_feature_name(id))
            ad_json_str(j, NULL, altpatch_feature_name(id));
    ad_json_end_arr(j);
    ad_json_end_obj(j);
}

void ad_json_image(struct ad_json *j, const struct ad_image *img, const struct ad_plan *plans,
                   const struct ad_size *sz, const struct ad_opts *o)
{
    ad_json_obj(j, NULL);
    ad_json_str(j, "file", img->file);
    ad_json_str(j, "type", img->elf_type == ET_EXEC ? "EXEC" : img->elf_type == ET_DYN ? "DYN" : "REL");
    if (img->kernel.on) {
        ad_json_null(j, "note");
        ad_json_obj(j, "kernel");
        ad_json_bool(j, "module", img->kernel.module);
        if (img->kernel.release[0])
            ad_json_str(j, "release", img->kernel.release);
        else
            ad_json_null(j, "release");
        ad_json_str(j, "release_from", img->kernel.source ? img->kernel.source : "");
        ad_json_uint(j, "record_size", img->kernel.record_size);
        ad_json_str(j, "feature_names", img->kernel.tab->version);
        ad_json_hex(j, "table_start", img->table_addr);
        ad_json_hex(j, "table_end", img->table_addr + img->table_size);
        ad_json_hex(j, "replacement_start", img->repl.addr);
        ad_json_hex(j, "replacement_end", img->repl.addr + img->repl.size);
        ad_json_end_obj(j);
    } else if (img->has_alt) {
        ad_json_obj(j, "note");
        ad_json_uint(j, "version", img->note.version);
        ad_json_uint(j, "record_size", img->note.record_size);
        ad_json_hex(j, "table_start", img->note.table_start);
        ad_json_hex(j, "table_end", img->note.table_end);
        ad_json_hex(j, "replacement_start", img->note.repl_start);
        ad_json_hex(j, "replacement_end", img->note.repl_end);
        ad_json_end_obj(j);
        if (img->prepatched) {
            ad_json_str(j, "prepatched", img->pp_profile);
            ad_json_uint(j, "prepatched_planner", img->pp_planner);
            ad_json_str(j, "prepatched_plan_note", ad_plan_note_name(img->pp_plan_note));
        } else {
            ad_json_null(j, "prepatched");
            ad_json_null(j, "prepatched_planner");
            ad_json_null(j, "prepatched_plan_note");
        }
    } else {
        ad_json_null(j, "note");
    }
    ad_json_uint(j, "records", img->nentries);
    size_t refused = plans ? ad_count_refused(img, plans) : 0;
    ad_json_uint(j, "refused", refused);
    ad_json_arr(j, "sites");
    for (size_t i = 0; plans && i < img->nsites; i++)
        site(j, img, i, &plans[i], o);
    ad_json_end_arr(j);
    if (sz)
        size_obj(j, sz);
    ad_json_end_obj(j);
}

void ad_json_compare(struct ad_json *j, const struct ad_image *a, const struct ad_size *sa,
                     const struct ad_image *b, const struct ad_size *sb)
{
    const struct ad_image *im[2] = {a, b};
    const struct ad_size *sz[2] = {sa, sb};
    ad_json_obj(j, "compare");
    ad_json_arr(j, "files");
    for (int i = 0; i < 2; i++) {
        uint64_t dec = sz[i]->sz_text + sz[i]->sz_data + sz[i]->sz_bss;
        ad_json_obj(j, NULL);
        ad_json_str(j, "file", im[i]->file);
        ad_json_uint(j, "text", sz[i]->sz_text);
        ad_json_uint(j, "data", sz[i]->sz_data);
        ad_json_uint(j, "bss", sz[i]->sz_bss);
        ad_json_uint(j, "dec", dec);
        ad_json_uint(j, "sites", sz[i]->sites);
        ad_json_end_obj(j);
    }
    ad_json_end_arr(j);
    uint64_t da = sa->sz_text + sa->sz_data + sa->sz_bss, db = sb->sz_text + sb->sz_data + sb->sz_bss;
    const uint64_t av[4] = {sa->sz_text, sa->sz_data, sa->sz_bss, da};
    const uint64_t bv[4] = {sb->sz_text, sb->sz_data, sb->sz_bss, db};
    const char *names[4] = {"text", "data", "bss", "dec"};
    ad_json_obj(j, "delta");
    for (int i = 0; i < 4; i++)
        ad_json_int(j, names[i], (long long)(bv[i] - av[i]));
    ad_json_end_obj(j);
    ad_json_obj(j, "delta_percent");
    for (int i = 0; i < 4; i++) {
        if (av[i])
            ad_json_double(j, names[i], 100.0 * ((double)bv[i] - (double)av[i]) / (double)av[i]);
        else
            ad_json_null(j, names[i]);
    }
    ad_json_end_obj(j);
    ad_json_end_obj(j);
}
