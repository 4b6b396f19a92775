/* SPDX-License-Identifier: MIT */
/*
 * prepatch.h - pre-patched files (record format version 2, docs/format.md).
 *
 * A pre-patched file is a version-1 file whose sites already hold the plan
 * for one feature set (a CPU profile), written by altprepatch. Its note says
 * version 2, and a non-allocated section, AP_PREPATCH_SECTION, records the
 * profile, its feature set, and per site the compiler's original bytes and
 * the bytes written in their place. The layout of that section (the
 * "prepatch record") is parsed and built here, without touching any file.
 */
#ifndef ALTPATCH_PREPATCH_H
#define ALTPATCH_PREPATCH_H

#include "internal.h"

/** Note version of a pre-patched file (version 1 plus the section below). */
#define AP_FORMAT_PREPATCHED 2u
/** Name of the non-allocated section that keeps the originals. */
#define AP_PREPATCH_SECTION ".altpatch.orig"
/** First 8 bytes of that section. */
#define AP_PREPATCH_MAGIC "ALTPREP1"
/** Bytes before the first site record. */
#define AP_PREPATCH_HDR 240u
/** Bytes of a site record before its two byte strings. */
#define AP_PREPATCH_SITE_HDR 16u
/** Longest profile text kept (with its NUL). */
#define AP_PREPATCH_PROFILE 64u

/** The section's header, decoded. */
struct ap_prepatch {
    uint32_t nsites;
    uint64_t table_addr;  /* link-time address of altinstructions */
    uint64_t table_size;
    char profile[AP_PREPATCH_PROFILE];
    struct altpatch_features fs; /* the set the sites were planned for */
    const uint8_t *sites; /* first site record */
    size_t sites_len;
};

/** One site record. */
struct ap_prepatch_site {
    uint64_t addr;           /* link-time address */
    uint8_t len;
    int32_t chosen;          /* entry written, -1: the original was kept */
    const uint8_t *orig;     /* @c len bytes: the compiler's */
    const uint8_t *written;  /* @c len bytes: what the file's site holds */
};

/**
 * Check and decode the section @p buf of @p len bytes. Every site record must
 * lie inside it and together they must fill it exactly. 0 or -EINVAL.
 */
AP_HIDDEN int ap_prepatch_parse(const uint8_t *buf, size_t len, struct ap_prepatch *out);

/**
 * The site record at *@p pos of @p p's site records (start with *pos = 0);
 * advances *pos. 0, or -ENOENT past the last one.
 */
AP_HIDDEN int ap_prepatch_next(const struct ap_prepatch *p, size_t *pos,
                               struct ap_prepatch_site *out);

/** Size of a section with @p nsites sites of total length @p site_bytes. */
AP_HIDDEN size_t ap_prepatch_size(size_t nsites, size_t site_bytes);

/** Write the header of a section into @p buf (AP_PREPATCH_HDR bytes). */
AP_HIDDEN void ap_prepatch_put_header(uint8_t *buf, const struct ap_prepatch *p);

/** Write one site record at @p buf; returns the bytes written. */
AP_HIDDEN size_t ap_prepatch_put_site(uint8_t *buf, const struct ap_prepatch_site *s);

struct ap_module;
/**
 * Runtime (prepatch_load.c): module @p m's note says version 2, so its sites
 * hold a profile's bytes. Read the originals from the module's file, check
 * that they belong to these bytes (same table, same sites, memory holding
 * exactly what the file says was written) and put them in m->orig. Any
 * mismatch refuses the module (m->reason, one WARN line). 0 or -ENOMEM.
 */
AP_HIDDEN int ap_prepatch_originals(struct ap_module *m);

#endif /* ALTPATCH_PREPATCH_H */
