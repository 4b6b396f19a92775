/* SPDX-License-Identifier: MIT */
/*
 * image_regions.c - altpatch_image_open_regions(): an image built from memory
 * a tool describes (a relocatable object's sections, a process's memory, a
 * kernel image) instead of an ELF file's program headers. The view comes from
 * ap_view_build(), as for files and loaded modules; the records from
 * ap_records_parse() (the older kernel layout is format 3's); the rest (originals,
 * plans, walks) is the file image's code.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply.h"

static int rfail(const char *name, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One WARN line naming the image; returns @p err. */
static int rfail(const char *name, int err, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ap_log(ALTPATCH_WARN, "%s: %s\n", name, msg);
    return err;
}

static bool region_ok(const struct altpatch_image_region *r)
{
    return (r->data || !r->size) && r->addr + r->size >= r->addr;
}

static bool desc_ok(const struct altpatch_image_regions *d)
{
    if (d->sz < offsetof(struct altpatch_image_regions, reserved) + sizeof(d->reserved))
        return false;
    for (size_t i = sizeof(*d); i < d->sz; i++)
        if (((const uint8_t *)d)[i])
            return false;
    return true;
}

/* Everything wrong with @p d that needs no copy; 0 when it can be opened. */
static int check(const struct altpatch_image_regions *d, const char *name)
{
    if (d->reserved)
        return rfail(name, -EINVAL, "reserved field is not zero");
    if (d->layout != ALTPATCH_LAYOUT_ALTPATCH && d->layout != ALTPATCH_LAYOUT_LINUX_12)
        return rfail(name, -EINVAL, "unknown record layout %u", d->layout);
    if (!region_ok(&d->table) || !region_ok(&d->repl))
        return rfail(name, -EINVAL, "table or replacement region without bytes or wrapping around");
    if (d->ntext > ALTPATCH_IMAGE_MAX_TEXT)
        return rfail(name, -EINVAL, "%zu text regions (at most %d)", d->ntext,
                     ALTPATCH_IMAGE_MAX_TEXT);
    if (d->ntext && !d->text)
        return rfail(name, -EINVAL, "%zu text regions without an array", d->ntext);
    for (size_t i = 0; i < d->ntext; i++) {
        const struct altpatch_image_region *a = &d->text[i];
        if (!region_ok(a))
            return rfail(name, -EINVAL, "text region %zu without bytes or wrapping around", i);
        for (size_t j = 0; j < i; j++) {
            const struct altpatch_image_region *b = &d->text[j];
            if (a->size && b->size && a->addr < b->addr + b->size && b->addr < a->addr + a->size)
                return rfail(name, -EINVAL, "text regions %zu and %zu overlap", j, i);
        }
    }
    if (d->nknown && !d->known)
        return rfail(name, -EINVAL, "%zu known feature ids without an array", d->nknown);
    for (size_t i = 0; i < d->nknown; i++)
        if (d->known[i] >= 32u * AP_NCAPWORDS)
            return rfail(name, -EINVAL, "known feature id %u out of range (below %u)", d->known[i],
                         32u * AP_NCAPWORDS);
    size_t rec = d->layout == ALTPATCH_LAYOUT_LINUX_12 ? ALTPATCH_RECORD_SIZE_COMPACT
                                                       : ALTPATCH_RECORD_SIZE_KERNEL;
    if (d->table.size % rec)
        return rfail(name, -EBADMSG, "table of %llu bytes is not a whole number of %zu-byte records",
                     (unsigned long long)d->table.size, rec);
    return 0;
}

/* Copy the regions into one buffer and build the view, entries and sites. */
static int build(struct altpatch_image *img, const struct altpatch_image_regions *d)
{
    size_t total = d->table.size + d->repl.size;
    for (size_t i = 0; i < d->ntext; i++)
        total += d->text[i].size;
    img->buf = malloc(total ? total : 1);
    if (!img->buf)
        return -ENOMEM;
    img->len = total;
    size_t off = 0;
    const uint8_t *table = img->buf + off;
    if (d->table.size)
        memcpy(img->buf + off, d->table.data, d->table.size);
    off += d->table.size;
    const uint8_t *repl = d->repl.size ? img->buf + off : NULL;
    if (d->repl.size)
        memcpy(img->buf + off, d->repl.data, d->repl.size);
    off += d->repl.size;
    struct ap_segment seg[ALTPATCH_IMAGE_MAX_TEXT];
    size_t ns = 0;
    for (size_t i = 0; i < d->ntext; i++) {
        if (!d->text[i].size)
            continue;
        memcpy(img->buf + off, d->text[i].data, d->text[i].size);
        seg[ns++] = (struct ap_segment){d->text[i].addr, d->text[i].size, img->buf + off, true};
        off += d->text[i].size;
    }
    ap_view_build(&img->view, seg, ns, d->repl.addr, d->repl.size, repl);
    ap_view_cut(&img->view, d->table.addr, d->table.addr + d->table.size);

    bool compact = d->layout == ALTPATCH_LAYOUT_LINUX_12;
    img->note = (struct ap_note){
        .version = compact ? ALTPATCH_FORMAT_COMPACT : ALTPATCH_FORMAT_KERNEL,
        .record_size = compact ? ALTPATCH_RECORD_SIZE_COMPACT : ALTPATCH_RECORD_SIZE_KERNEL,
        .table_start = d->table.addr,
        .table_end = d->table.addr + d->table.size,
        .repl_start = d->repl.addr,
        .repl_end = d->repl.addr + d->repl.size,
    };
    /* Linux's layout before 6.3 is this library's format 3. */
    int r = ap_records_parse(table, d->table.size, d->table.addr, img->note.record_size,
                             &img->entries, &img->nentries);
    if (r > 0) /* the layout and size were checked: nothing else is refused here */
        r = -EBADMSG;
    if (r)
        return r;
    if (d->nknown || d->flags) {
        img->rules = calloc(1, sizeof(*img->rules));
        if (!img->rules)
            return -ENOMEM;
        for (size_t i = 0; i < d->nknown; i++)
            img->rules->known[d->known[i] / 32] |= 1u << (d->known[i] % 32);
        if (!d->nknown) /* flags only: this library's features */
            for (unsigned id = 0; id < 32u * AP_NCAPWORDS; id++)
                if (ap_feature_known(id))
                    img->rules->known[id / 32] |= 1u << (id % 32);
        img->rules->flags = d->flags;
    }
    r = ap_sites_group(img->entries, img->nentries, &img->sites, &img->nsites);
    if (!r)
        r = ap_image_take_originals(img);
    return r;
}

ALTPATCH_API int altpatch_image_open_regions(const struct altpatch_image_regions *desc,
                                             struct altpatch_image **out)
{
    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!desc || !desc_ok(desc))
        return rfail("image", -EINVAL, "bad region description (sz or unknown fields)");
    const char *name = desc->name ? desc->name : "image";
    int r = check(desc, name);
    if (r)
        return r;
    struct altpatch_image *img = calloc(1, sizeof(*img));
    if (!img || !(img->name = strdup(name))) {
        free(img);
        return -ENOMEM;
    }
    img->regions = true;
    img->mode = 0644;
    r = build(img, desc);
    if (r) {
        altpatch_image_close(img);
        return r;
    }
    *out = img;
    return 0;
}
