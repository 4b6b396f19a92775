/* SPDX-License-Identifier: MIT */
/*
 * prepatch.c - the section of a pre-patched file that keeps the originals
 * (docs/format.md, "Version 2"). Pure: bytes in, bytes out. All fields are
 * little-endian and read with memcpy (the section has no alignment).
 *
 *   header (AP_PREPATCH_HDR = 240 bytes)
 *     0   magic "ALTPREP1"
 *     8   u32 nsites
 *     12  u32 planner version (AP_PREPATCH_PLANNER; 0 in older files)
 *     16  u64 table address (link-time)
 *     24  u64 table size
 *     32  char profile[64], NUL-terminated
 *     96  u32 feature words[32] (kernel numbering)
 *     224 char vendor[16]
 *   then nsites records, in table order:
 *     0   u64 site address (link-time)
 *     8   u8  length L
 *     9   u8  zero x3
 *     12  s32 entry written (-1: original kept)
 *     16  L bytes original, then L bytes written
 */
#include <errno.h>
#include <string.h>

#include "pure.h"

_Static_assert(AP_NCAPWORDS * 4 + AP_PREPATCH_PROFILE + 32 + 16 == AP_PREPATCH_HDR,
               "prepatch header layout");

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;

    memcpy(&v, p, 4);
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v;

    memcpy(&v, p, 8);
    return v;
}

/* Whether the @p n bytes at @p p hold a NUL (a first apply reads this). */
static bool has_nul(const char *p, size_t n)
{
    return ap_strnlen(p, n) < n;
}

int ap_prepatch_parse(const uint8_t *buf, size_t len, struct ap_prepatch *out)
{
    memset(out, 0, sizeof(*out));
    if (!buf || len < AP_PREPATCH_HDR ||
        !ap_equal_small(buf, (const uint8_t *)AP_PREPATCH_MAGIC, 8))
        return -EINVAL;
    out->nsites = get32(buf + 8);
    out->planner = get32(buf + 12);
    out->table_addr = get64(buf + 16);
    out->table_size = get64(buf + 24);
    memcpy(out->profile, buf + 32, AP_PREPATCH_PROFILE);
    if (!has_nul(out->profile, AP_PREPATCH_PROFILE))
        return -EINVAL;
    for (size_t i = 0; i < AP_NCAPWORDS; i++)
        out->fs.word[i] = get32(buf + 96 + 4 * i);
    memcpy(out->fs.vendor, buf + 224, sizeof(out->fs.vendor));
    if (!has_nul(out->fs.vendor, sizeof(out->fs.vendor)))
        return -EINVAL;
    out->sites = buf + AP_PREPATCH_HDR;
    out->sites_len = len - AP_PREPATCH_HDR;
    /* Every record inside, and nothing after the last one. */
    size_t pos = 0, n = 0;
    struct ap_prepatch_site s;
    while (ap_prepatch_next(out, &pos, &s) == 0)
        n++;
    if (n != out->nsites || pos != out->sites_len)
        return -EINVAL;
    return 0;
}

int ap_prepatch_next(const struct ap_prepatch *p, size_t *pos, struct ap_prepatch_site *out)
{
    size_t left = p->sites_len - *pos;

    if (*pos >= p->sites_len || left < AP_PREPATCH_SITE_HDR)
        return -ENOENT;
    const uint8_t *r = p->sites + *pos;
    uint8_t len = r[8];
    if (r[9] || r[10] || r[11] || left - AP_PREPATCH_SITE_HDR < 2u * len)
        return -ENOENT;
    out->addr = get64(r);
    out->len = len;
    out->chosen = (int32_t)get32(r + 12);
    out->orig = r + AP_PREPATCH_SITE_HDR;
    out->written = out->orig + len;
    *pos += AP_PREPATCH_SITE_HDR + 2u * len;
    return 0;
}

size_t ap_prepatch_size(size_t nsites, size_t site_bytes)
{
    return AP_PREPATCH_HDR + nsites * AP_PREPATCH_SITE_HDR + 2 * site_bytes;
}

void ap_prepatch_put_header(uint8_t *buf, const struct ap_prepatch *p)
{
    memset(buf, 0, AP_PREPATCH_HDR);
    memcpy(buf, AP_PREPATCH_MAGIC, 8);
    memcpy(buf + 8, &p->nsites, 4);
    memcpy(buf + 12, &p->planner, 4);
    memcpy(buf + 16, &p->table_addr, 8);
    memcpy(buf + 24, &p->table_size, 8);
    memcpy(buf + 32, p->profile, strnlen(p->profile, AP_PREPATCH_PROFILE - 1));
    for (size_t i = 0; i < AP_NCAPWORDS; i++)
        memcpy(buf + 96 + 4 * i, &p->fs.word[i], 4);
    memcpy(buf + 224, p->fs.vendor, strnlen(p->fs.vendor, sizeof(p->fs.vendor) - 1));
}

size_t ap_prepatch_put_site(uint8_t *buf, const struct ap_prepatch_site *s)
{
    memset(buf, 0, AP_PREPATCH_SITE_HDR);
    memcpy(buf, &s->addr, 8);
    buf[8] = s->len;
    memcpy(buf + 12, &s->chosen, 4);
    memcpy(buf + AP_PREPATCH_SITE_HDR, s->orig, s->len);
    memcpy(buf + AP_PREPATCH_SITE_HDR + s->len, s->written, s->len);
    return AP_PREPATCH_SITE_HDR + 2u * s->len;
}

/* ------------------------------------------------------------------------- */
/* The plan note (pure.h)                                                    */
/* ------------------------------------------------------------------------- */

_Static_assert(32 + AP_NCAPWORDS * 4 + 16 == ALTPATCH_PLAN_NOTE_SIZE, "plan note layout");

AP_HOT int ap_plan_note_parse(const uint8_t *desc, size_t descsz, struct ap_plan_note *out)
{
    memset(out, 0, sizeof(*out));
    /* another size or state is another layout: not this reader's to use */
    if (!desc || descsz != ALTPATCH_PLAN_NOTE_SIZE || get32(desc) != AP_PLAN_NOTE_FILLED)
        return 0;
    if (get32(desc + 12))
        return -EINVAL;
    out->planner = get32(desc + 4);
    out->nsites = get32(desc + 8);
    out->table_size = get64(desc + 16);
    out->hash = get64(desc + 24);
    for (size_t i = 0; i < AP_NCAPWORDS; i++)
        out->fs.word[i] = get32(desc + 32 + 4 * i);
    memcpy(out->fs.vendor, desc + 160, sizeof(out->fs.vendor));
    if (!has_nul(out->fs.vendor, sizeof(out->fs.vendor)))
        return -EINVAL;
    return 1;
}

void ap_plan_note_put(uint8_t *buf, const struct ap_plan_note *n)
{
    uint32_t state = AP_PLAN_NOTE_FILLED;
    memset(buf, 0, ALTPATCH_PLAN_NOTE_SIZE);
    memcpy(buf, &state, 4);
    memcpy(buf + 4, &n->planner, 4);
    memcpy(buf + 8, &n->nsites, 4);
    memcpy(buf + 16, &n->table_size, 8);
    memcpy(buf + 24, &n->hash, 8);
    for (size_t i = 0; i < AP_NCAPWORDS; i++)
        memcpy(buf + 32 + 4 * i, &n->fs.word[i], 4);
    memcpy(buf + 160, n->fs.vendor, strnlen(n->fs.vendor, sizeof(n->fs.vendor) - 1));
}

AP_HOT const char *ap_plan_note_check(const struct ap_plan_note *pn, const struct ap_plan_note_sites *s)
{
    if (pn->nsites != s->nsites || pn->table_size != s->table_size)
        return "it describes another table";
    size_t pos = 0;
    struct ap_prepatch_site ps;
    for (size_t i = 0; i < s->nsites; i++) {
        int pick = s->pick(s->ctx, i, &pn->fs);
        if (pick == AP_NOTE_OUTSIDE)
            return "a site lies outside the text";
        if (pick < -1)
            return "a site it says was planned is refused";
        if (s->rec && (ap_prepatch_next(s->rec, &pos, &ps) || ps.chosen != pick))
            return "the file's choices are not its";
    }
    /* every site in the text: the bytes are all of them */
    if (s->bytes && ap_bytes_hash(s->bytes, s->nbytes) != pn->hash)
        return "memory does not hold the bytes it says were written";
    if (s->rec && s->rec->planner != pn->planner)
        return "the file's planner version is not its";
    return NULL;
}
