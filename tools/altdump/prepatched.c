/* SPDX-License-Identifier: MIT */
/*
 * prepatched.c - files written by altprepatch (record format 4, or 2): the sites
 * hold a profile's plan and .altpatch.orig keeps the compiler's bytes. The
 * reader puts the originals back so that every view (table, --check, --size,
 * --pid) plans from them as it does for any file; --check then also checks
 * that each site holds the plan for the recorded set.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "altdump.h"

struct pp_walk {
    struct ad_image *img;
    size_t n, off;
    char *err;
    size_t errsz;
    int rc;
};

/*
 * One site as the library read it: what the file holds there is kept
 * (pp_written), and the original goes back into altdump's own copy of the
 * file's bytes, so that every view plans from the compiler's bytes.
 */
static int pp_site(const struct altpatch_image_site *s, void *ctx)
{
    struct pp_walk *w = ctx;
    struct ad_image *img = w->img;
    w->n++;
    img->pp_off[s->index] = SIZE_MAX;
    img->pp_addr[s->index] = s->addr;
    img->pp_len[s->index] = (uint8_t)s->len;
    if (!s->original || !s->current || !s->len)
        return 0;
    const uint8_t *at = ad_bytes_at(img, s->addr, s->len);
    if (!at || memcmp(at, s->current, s->len) != 0) {
        snprintf(w->err, w->errsz, "site %u at 0x%llx: the sections and the segments disagree",
                 s->index, (unsigned long long)s->addr);
        w->rc = AD_EXIT_BADINPUT;
        return 1;
    }
    img->pp_off[s->index] = w->off;
    memcpy(img->pp_written + w->off, s->current, s->len);
    w->off += s->len;
    memcpy((uint8_t *)(uintptr_t)at, s->original, s->len); /* the file's private copy */
    return 0;
}

/* Bytes of every site the file holds (what pp_written keeps). */
static int pp_count(const struct altpatch_image_site *s, void *ctx)
{
    if (s->current)
        *(size_t *)ctx += s->len;
    return 0;
}

static char *pp_msg;
static size_t pp_msgsz;

static int pp_capture(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level == ALTPATCH_WARN && pp_msg && !pp_msg[0])
        vsnprintf(pp_msg, pp_msgsz, fmt, ap);
    return 0;
}

int ad_prepatched_read(struct ad_image *img, char *err, size_t errsz)
{
    const struct ad_section *sec = ad_section_by_name(img, AD_PREPATCH_SECTION);
    if (!sec || !sec->data) {
        snprintf(err, errsz, "pre-patched (format %u) but no %s section", img->note.version,
                 AD_PREPATCH_SECTION);
        return AD_EXIT_BADINPUT;
    }
    /* The library checks the record against the file and keeps both bytes. */
    struct altpatch_image_opts o = {.sz = sizeof(o), .name = img->file};
    struct altpatch_image *li = NULL;
    err[0] = '\0';
    pp_msg = err;
    pp_msgsz = errsz;
    altpatch_print_fn prev = altpatch_set_print(pp_capture);
    int r = altpatch_image_open_mem(img->buf, img->len, &o, &li);
    altpatch_set_print(prev);
    pp_msg = NULL;
    if (r == -ENOMEM) {
        snprintf(err, errsz, "out of memory");
        return AD_EXIT_INTERNAL;
    }
    if (r) {
        ad_strip_msg(err, img->file);
        if (!err[0])
            snprintf(err, errsz, "malformed %s section (%s)", AD_PREPATCH_SECTION, strerror(-r));
        return AD_EXIT_BADINPUT;
    }
    struct altpatch_image_info info = {.sz = sizeof(info)};
    const struct altpatch_features *fs = altpatch_image_prepatched_features(li);
    if (altpatch_image_get_info(li, &info) != 0 || !fs || !info.prepatched_profile) {
        altpatch_image_close(li);
        snprintf(err, errsz, "pre-patched (format %u) but the library does not read it as such",
                 img->note.version);
        return AD_EXIT_BADINPUT;
    }
    size_t total = 0;
    altpatch_image_site_foreach(li, pp_count, &total);
    img->pp_written = malloc(total ? total : 1);
    img->pp_off = malloc((info.sites ? info.sites : 1) * sizeof(*img->pp_off));
    img->pp_addr = malloc((info.sites ? info.sites : 1) * sizeof(*img->pp_addr));
    img->pp_len = malloc(info.sites ? info.sites : 1);
    img->pp_fs = altpatch_features_dup(fs);
    if (!img->pp_written || !img->pp_off || !img->pp_addr || !img->pp_len || !img->pp_fs) {
        altpatch_image_close(li);
        snprintf(err, errsz, "out of memory");
        return AD_EXIT_INTERNAL;
    }
    struct pp_walk w = {img, 0, 0, err, errsz, 0};
    altpatch_image_site_foreach(li, pp_site, &w);
    img->pp_nsites = info.sites;
    snprintf(img->pp_profile, sizeof(img->pp_profile), "%s", info.prepatched_profile);
    for (char *c = img->pp_profile; *c; c++) /* printed on one line */
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    img->pp_planner = info.prepatched_planner;
    img->pp_plan_note = info.plan_note;
    altpatch_image_close(li);
    if (w.rc)
        return w.rc;
    img->prepatched = true;
    return 0;
}

int ad_prepatched_match(const struct ad_image *img, char *err, size_t errsz)
{
    if (img->pp_nsites != img->nsites) {
        snprintf(err, errsz, "%s describes another table", AD_PREPATCH_SECTION);
        return AD_EXIT_BADINPUT;
    }
    /* The sections' table (altdump) and the segments' (the library, the
     * runtime) must name the same sites: pp_written is laid out by the latter. */
    for (size_t i = 0; i < img->nsites; i++)
        if (img->sites[i].addr != img->pp_addr[i] || img->sites[i].len != img->pp_len[i]) {
            snprintf(err, errsz,
                     "site %zu: the sections' table says 0x%llx len %u, the segments' 0x%llx "
                     "len %u (the sections and the segments disagree)",
                     i, (unsigned long long)img->sites[i].addr, (unsigned)img->sites[i].len,
                     (unsigned long long)img->pp_addr[i], (unsigned)img->pp_len[i]);
            return AD_EXIT_BADINPUT;
        }
    return 0;
}

static void hex(const uint8_t *b, size_t n, char *out, size_t outsz)
{
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && k + 3 < outsz; i++)
        k += (size_t)snprintf(out + k, outsz - k, "%02x", b[i]);
}

size_t ad_prepatched_check(FILE *f, const struct ad_image *img)
{
    struct ad_plan *plans;
    if (ad_decide(img, img->pp_fs, &plans) != 0)
        return (size_t)-1;
    size_t bad = 0;
    for (size_t i = 0; i < img->nsites; i++) {
        if (img->pp_off[i] == SIZE_MAX)
            continue;
        const uint8_t *w = img->pp_written + img->pp_off[i];
        const struct ad_plan *p = &plans[i];
        if (memcmp(w, p->final, p->len) == 0)
            continue;
        char sym[256], h1[AD_MAX_SITE * 2 + 1], h2[AD_MAX_SITE * 2 + 1];
        ad_symbolize(img, img->sites[i].addr, sym, sizeof(sym));
        hex(w, p->len, h1, sizeof(h1));
        hex(p->final, p->len, h2, sizeof(h2));
        fprintf(f, "%s: site %zu at 0x%llx%s%s%s: holds %s, the plan for %s is %s\n", img->file,
                i, (unsigned long long)img->sites[i].addr, sym[0] ? " (" : "", sym,
                sym[0] ? ")" : "", h1, img->pp_profile, h2);
        bad++;
    }
    free(plans);
    return bad;
}

const char *ad_plan_note_name(unsigned state)
{
    return state == ALTPATCH_PLAN_NOTE_FILLED  ? "filled"
           : state == ALTPATCH_PLAN_NOTE_EMPTY ? "empty"
           : state == ALTPATCH_PLAN_NOTE_STALE ? "stale"
                                               : "none";
}
