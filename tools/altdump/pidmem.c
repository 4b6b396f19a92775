/* SPDX-License-Identifier: MIT */
/*
 * --pid: compare a live process with the plan. Each file mapped by the
 * process (/proc/PID/maps) is read with libelf; a file with altpatch tables
 * gets its load bias from the mapping of a PT_LOAD segment
 * (bias = mapping start - page-aligned p_vaddr, for the mapping whose file
 * offset is the segment's page-aligned p_offset), and every site is read
 * from /proc/PID/mem at its address + bias.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "altdump.h"

#define AD_PG 4096ull

struct mapping {
    uint64_t start, end, offset;
    char *path;
};

struct maps {
    struct mapping *m;
    size_t n, cap;
};

static void maps_free(struct maps *mp)
{
    for (size_t i = 0; i < mp->n; i++)
        free(mp->m[i].path);
    free(mp->m);
}

static int maps_read(long pid, struct maps *mp)
{
    char path[64], line[4096 + 256];
    snprintf(path, sizeof(path), "/proc/%ld/maps", pid);
    FILE *f = fopen(path, "re");
    if (!f) {
        fprintf(stderr, "altdump: pid %ld: cannot open %s (%s)\n", pid, path, strerror(errno));
        return AD_EXIT_BADINPUT;
    }
    while (fgets(line, sizeof(line), f)) {
        unsigned long long s, e, off;
        int pos = 0;
        if (sscanf(line, "%llx-%llx %*4s %llx %*s %*u %n", &s, &e, &off, &pos) < 3 || pos <= 0)
            continue;
        char *p = line + pos;
        p[strcspn(p, "\n")] = 0;
        if (p[0] != '/' || strstr(p, " (deleted)"))
            continue;
        if (mp->n == mp->cap) {
            size_t cap = mp->cap ? 2 * mp->cap : 64;
            struct mapping *m = realloc(mp->m, cap * sizeof(*m));
            if (!m)
                break;
            mp->m = m;
            mp->cap = cap;
        }
        mp->m[mp->n] = (struct mapping){s, e, off, strdup(p)};
        if (mp->m[mp->n].path)
            mp->n++;
    }
    fclose(f);
    return 0;
}

static bool find_bias(const struct maps *mp, const char *path, const struct ad_image *img,
                      uint64_t *bias)
{
    for (size_t i = 0; i < mp->n; i++) {
        if (strcmp(mp->m[i].path, path) != 0)
            continue;
        for (size_t k = 0; k < img->nloads; k++) {
            if ((img->loads[k].offset & ~(AD_PG - 1)) == mp->m[i].offset) {
                *bias = mp->m[i].start - (img->loads[k].vaddr & ~(AD_PG - 1));
                return true;
            }
        }
    }
    return false;
}

static const char *state_name(enum ad_mem_state s)
{
    static const char *const n[AD_MEM__COUNT] = {"final", "original", "mismatch", "unreadable",
                                                 "refused"};
    return n[s];
}

static void hex(FILE *f, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, i ? " %02x" : "%02x", b[i]);
}

static void hexs(char *out, size_t outsz, const uint8_t *b, size_t n)
{
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && o + 4 <= outsz; i++)
        o += (size_t)snprintf(out + o, outsz - o, i ? " %02x" : "%02x", b[i]);
}

struct tally {
    size_t n[AD_MEM__COUNT];
    size_t modules;
};

static void site_out(const struct ad_opts *o, struct ad_json *j, const struct ad_image *img,
                     size_t i, uint64_t bias, const struct ad_plan *p, const uint8_t *mem,
                     enum ad_mem_state st)
{
    const struct ad_site *s = &img->sites[i];
    const uint8_t *orig = s->orig;
    char sym[256];
    ad_symbolize(img, s->addr, sym, sizeof(sym));
    if (o->json) {
        char b[3 * AD_MAX_SITE + 4];
        ad_json_obj(j, NULL);
        ad_json_uint(j, "index", i);
        ad_json_hex(j, "address", s->addr + bias);
        ad_json_hex(j, "file_address", s->addr);
        ad_json_str(j, "symbol", sym);
        ad_json_str(j, "state", state_name(st));
        ad_json_str(j, "decision", ad_decision_name(p));
        hexs(b, sizeof(b), mem, st == AD_MEM_UNREADABLE || st == AD_MEM_REFUSED ? 0 : s->len);
        ad_json_str(j, "memory", b);
        hexs(b, sizeof(b), orig ? orig : p->orig, orig ? s->len : 0);
        ad_json_str(j, "original", b);
        hexs(b, sizeof(b), p->final, s->len);
        ad_json_str(j, "final", b);
        ad_json_end_obj(j);
        return;
    }
    printf("  site %zu at 0x%llx%s%s%s: %-10s (%s)", i, (unsigned long long)(s->addr + bias),
           *sym ? " <" : "", sym, *sym ? ">" : "", state_name(st), ad_decision_name(p));
    if (st == AD_MEM_MISMATCH) {
        printf("\n    memory:   ");
        hex(stdout, mem, s->len);
        printf("\n    original: ");
        hex(stdout, orig ? orig : p->orig, orig ? s->len : 0);
        printf("\n    final:    ");
        hex(stdout, p->final, s->len);
    }
    printf("\n");
}

static int module(long pid, int memfd, const struct maps *mp, const char *path,
                  const struct ad_opts *o, struct ad_json *j, struct tally *t)
{
    struct ad_image img;
    char err[512], rooted[4200];
    /* Through the process's root first: right inside containers and chroots too. */
    snprintf(rooted, sizeof(rooted), "/proc/%ld/root%s", pid, path);
    if (ad_read_file(rooted, AD_READ_ALLOW_NOALT, &img, err, sizeof(err)) != 0 &&
        ad_read_file(path, AD_READ_ALLOW_NOALT, &img, err, sizeof(err)) != 0)
        return 0; /* data files, fonts, locale archives: not ours */
    img.file = path;
    uint64_t bias = 0;
    struct ad_plan *plans = NULL;
    if (!img.has_alt || img.elf_type == ET_REL || img.kernel.on || !find_bias(mp, path, &img, &bias) ||
        ad_decide(&img, o->cpu->fs, &plans) != 0) {
        free(plans);
        ad_image_free(&img);
        return 0;
    }
    t->modules++;
    if (o->json) {
        ad_json_obj(j, NULL);
        ad_json_str(j, "file", path);
        ad_json_hex(j, "bias", bias);
        ad_json_arr(j, "sites");
    } else {
        printf("pid %ld: %s: bias 0x%llx, %zu sites\n", pid, path, (unsigned long long)bias,
               img.nsites);
    }
    for (size_t i = 0; i < img.nsites; i++) {
        const struct ad_site *s = &img.sites[i];
        const uint8_t *orig = s->orig;
        uint8_t mem[AD_MAX_SITE];
        enum ad_mem_state st;
        bool refused = plans[i].reason != ALTPATCH_REASON_NONE;
        if (refused && !orig)
            st = AD_MEM_REFUSED; /* the runtime never touches it; its address may be bogus */
        else if (pread(memfd, mem, s->len, (off_t)(s->addr + bias)) != (ssize_t)s->len)
            st = AD_MEM_UNREADABLE;
        else if (refused)
            st = memcmp(mem, orig, s->len) == 0 ? AD_MEM_ORIGINAL : AD_MEM_MISMATCH;
        else if (memcmp(mem, plans[i].final, s->len) == 0)
            st = AD_MEM_FINAL;
        else if (orig && memcmp(mem, orig, s->len) == 0)
            st = AD_MEM_ORIGINAL;
        else
            st = AD_MEM_MISMATCH;
        t->n[st]++;
        site_out(o, j, &img, i, bias, &plans[i], mem, st);
    }
    if (o->json) {
        ad_json_end_arr(j);
        ad_json_end_obj(j);
    }
    free(plans);
    ad_image_free(&img);
    return 0;
}

int ad_pid_report(long pid, const struct ad_opts *o)
{
    struct maps mp = {0};
    int rc = maps_read(pid, &mp);
    if (rc)
        return rc;
    char mempath[64];
    snprintf(mempath, sizeof(mempath), "/proc/%ld/mem", pid);
    int memfd = open(mempath, O_RDONLY | O_CLOEXEC);
    if (memfd < 0) {
        fprintf(stderr, "altdump: pid %ld: cannot open %s (%s)\n", pid, mempath, strerror(errno));
        maps_free(&mp);
        return AD_EXIT_BADINPUT;
    }
    struct ad_json j;
    struct tally t = {0};
    if (o->json) {
        ad_json_begin(&j, stdout);
        ad_json_obj(&j, NULL);
        ad_json_uint(&j, "altdump_schema", 1);
        ad_json_int(&j, "pid", pid);
        ad_json_cpu(&j, o->cpu);
        ad_json_arr(&j, "modules");
    }
    for (size_t i = 0; i < mp.n; i++) {
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++)
            seen = strcmp(mp.m[k].path, mp.m[i].path) == 0;
        if (!seen)
            module(pid, memfd, &mp, mp.m[i].path, o, &j, &t);
    }
    size_t total = 0;
    for (int s = 0; s < AD_MEM__COUNT; s++)
        total += t.n[s];
    if (o->json) {
        ad_json_end_arr(&j);
        ad_json_obj(&j, "summary");
        for (int s = 0; s < AD_MEM__COUNT; s++)
            ad_json_uint(&j, state_name((enum ad_mem_state)s), t.n[s]);
        ad_json_end_obj(&j);
        ad_json_end_obj(&j);
        ad_json_finish(&j);
    } else if (t.modules) {
        printf("pid %ld: %zu sites in %zu modules: %zu final, %zu original, %zu mismatch, %zu "
               "unreadable, %zu refused\n",
               pid, total, t.modules, t.n[0], t.n[1], t.n[2], t.n[3], t.n[4]);
    }
    close(memfd);
    maps_free(&mp);
    if (!t.modules) {
        fprintf(stderr, "altdump: pid %ld: no mapped file carries altpatch tables\n", pid);
        return AD_EXIT_BADINPUT;
    }
    return t.n[AD_MEM_MISMATCH] || t.n[AD_MEM_UNREADABLE] ? AD_EXIT_REFUSED : AD_EXIT_OK;
}
