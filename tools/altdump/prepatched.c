/* SPDX-License-Identifier: MIT */
/*
 * prepatched.c - files written by altprepatch (record format 2): the sites
 * hold a profile's plan and .altpatch.orig keeps the compiler's bytes. The
 * reader puts the originals back so that every view (table, --check, --size,
 * --pid) plans from them as it does for any file; --check then also checks
 * that each site holds the plan for the recorded set.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "altdump.h"

int ad_prepatched_read(struct ad_image *img, char *err, size_t errsz)
{
    const struct ad_section *sec = ad_section_by_name(img, AP_PREPATCH_SECTION);
    struct ap_prepatch p;
    struct ap_prepatch_site ps;
    if (!sec || !sec->data) {
        snprintf(err, errsz, "pre-patched (format 2) but no %s section", AP_PREPATCH_SECTION);
        return AD_EXIT_BADINPUT;
    }
    if (ap_prepatch_parse(sec->data, sec->size, &p)) {
        snprintf(err, errsz, "malformed %s section", AP_PREPATCH_SECTION);
        return AD_EXIT_BADINPUT;
    }
    if (p.table_addr != img->table_addr || p.table_size != img->table_size ||
        p.nsites != img->nsites) {
        snprintf(err, errsz, "%s describes another table", AP_PREPATCH_SECTION);
        return AD_EXIT_BADINPUT;
    }
    size_t total = 0;
    for (size_t i = 0; i < img->nsites; i++)
        total += img->sites[i].len;
    img->pp_written = malloc(total ? total : 1);
    img->pp_off = malloc((img->nsites ? img->nsites : 1) * sizeof(*img->pp_off));
    if (!img->pp_written || !img->pp_off) {
        snprintf(err, errsz, "out of memory");
        return AD_EXIT_INTERNAL;
    }
    size_t pos = 0, off = 0;
    for (size_t i = 0; i < img->nsites; i++) {
        const struct ap_site *s = &img->sites[i];
        if (ap_prepatch_next(&p, &pos, &ps) || ps.addr != s->addr || ps.len != s->len) {
            snprintf(err, errsz, "%s: site %zu is not the table's", AP_PREPATCH_SECTION, i);
            return AD_EXIT_BADINPUT;
        }
        const uint8_t *at = s->len ? ap_view_text(&img->view, s->addr, s->len) : NULL;
        img->pp_off[i] = at ? off : SIZE_MAX;
        if (!at)
            continue;
        if (memcmp(at, ps.written, s->len) != 0) {
            snprintf(err, errsz, "site %zu at 0x%llx does not hold the bytes %s says were "
                     "written there", i, (unsigned long long)s->addr, AP_PREPATCH_SECTION);
            return AD_EXIT_BADINPUT;
        }
        memcpy(img->pp_written + off, at, s->len);
        off += s->len;
        /* The view's bytes are altdump's own copy of the file. */
        memcpy((uint8_t *)(uintptr_t)at, ps.orig, s->len);
    }
    img->prepatched = true;
    snprintf(img->pp_profile, sizeof(img->pp_profile), "%s", p.profile);
    img->pp_fs = p.fs;
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
    struct ap_plan *plans;
    if (ad_decide(img, &img->pp_fs, &plans) != 0)
        return (size_t)-1;
    size_t bad = 0;
    for (size_t i = 0; i < img->nsites; i++) {
        if (img->pp_off[i] == SIZE_MAX)
            continue;
        const uint8_t *w = img->pp_written + img->pp_off[i];
        const struct ap_plan *p = &plans[i];
        if (memcmp(w, p->final, p->len) == 0)
            continue;
        char sym[256], h1[AP_MAX_SITE * 2 + 1], h2[AP_MAX_SITE * 2 + 1];
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
