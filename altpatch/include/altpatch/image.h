/* SPDX-License-Identifier: MIT */
/**
 * @file image.h
 * @brief altpatch image API: the sites of an ELF file, planned offline.
 *
 * An image is one executable or shared library (ELF64, x86-64) read from a
 * file or from bytes, never loaded or run. The image API finds its altpatch
 * tables the way the runtime finds them in a loaded module (the note in a
 * PT_NOTE segment, the view built from the executable PT_LOAD segments), runs
 * the runtime's planner for any feature set, lets a tool walk every site with
 * its original, current and final bytes and the reason for a refusal, and
 * writes a pre-patched copy: a file whose sites already hold the plan (record
 * format version 4, or 2 for a format-1 file, docs/format.md).
 *
 * Conventions as in <altpatch/altpatch.h>: 0 or a negative errno; options
 * structs start with `size_t sz`; messages go through altpatch_set_print()
 * (one WARN line per failure, naming the image).
 */
#ifndef ALTPATCH_IMAGE_H
#define ALTPATCH_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include <altpatch/altpatch.h>

#ifdef __cplusplus
extern "C" {
#endif

/** An opened image. Opaque; free with altpatch_image_close(). Not thread-safe. */
struct altpatch_image;

/** Options of altpatch_image_open() and altpatch_image_open_mem(). */
struct altpatch_image_opts {
    size_t sz;        /**< sizeof(struct altpatch_image_opts) */
    const char *name; /**< name used in messages (default: the path, or "image") */
    /** Must be zero (-EINVAL otherwise); a later version may give it a meaning. */
    unsigned reserved;
};

/**
 * Open the ELF file at @p path (read into memory; the file is not kept open).
 * @p opts may be NULL. On success *@p out is the image and 0 is returned.
 * Errors: -EINVAL (bad arguments or opts), -ENOEXEC (not an ELF64 x86-64
 * executable or shared library, or its headers are out of bounds), -ENODATA
 * (no altpatch tables), -EPROTO (an altpatch note of an unknown version),
 * -EBADMSG (tables or the record of a pre-patched file that do not hold
 * together), -ENOMEM, or the error of open()/read().
 */
ALTPATCH_API int altpatch_image_open(const char *path, const struct altpatch_image_opts *opts,
                                     struct altpatch_image **out);

/**
 * altpatch_image_open() on @p len bytes at @p buf (copied: the caller may free
 * them on return).
 */
ALTPATCH_API int altpatch_image_open_mem(const void *buf, size_t len,
                                         const struct altpatch_image_opts *opts,
                                         struct altpatch_image **out);

/** Free @p img and everything it owns (NULL is a no-op). */
ALTPATCH_API void altpatch_image_close(struct altpatch_image *img);

/** What an image is. Pointers stay valid until altpatch_image_close(). */
struct altpatch_image_info {
    size_t sz;               /**< set by the caller: sizeof(struct altpatch_image_info) */
    const char *name;        /**< as given in the opts, or the path */
    unsigned format_version; /**< 3 or 1; 4 or 2 for a pre-patched file of that format */
    /** Pre-patched files: the profile text it was written for (as given to the writer); else NULL. */
    const char *prepatched_profile;
    size_t entries;          /**< records in the table */
    size_t sites;            /**< sites (groups of records for one address) */
    uint64_t table_addr;     /**< link-time address of the record table */
    uint64_t repl_addr;      /**< link-time address of altinstr_replacement */
    uint64_t repl_size;
    bool planned;            /**< altpatch_image_plan() succeeded at least once */
    /**
     * Pre-patched files: the planner version its writer recorded (1 for this
     * library's; 0: a file written before the version was recorded); else 0.
     * The runtime takes a file's written bytes as its own plan only when the
     * version is this library's. This field lies in what was the struct's
     * tail padding (sizeof is the same with and without it), so sz cannot
     * tell whether the library filled it: a library older than the field
     * copies its own padding there (not defined). From this library on every
     * byte up to sz is written, padding as 0.
     */
    unsigned prepatched_planner;
    /**
     * The file's plan note (loaded space next to the table note that the
     * header reserves; docs/format.md, "The plan note"):
     * ALTPATCH_PLAN_NOTE_NONE (built without it, or by an older header),
     * ALTPATCH_PLAN_NOTE_EMPTY (as compiled, or a pre-patched copy whose plan
     * is not its set's selection at every site: a first apply reads the file),
     * ALTPATCH_PLAN_NOTE_FILLED (written by altprepatch: a first apply of
     * the main program on a CPU that selects the same entries settles
     * without reading the file; a library's file is always read),
     * ALTPATCH_PLAN_NOTE_STALE (filled, but not what the file holds -- an
     * older altprepatch pre-patched the copy again and left it, or it is
     * malformed or forged -- or in a file that is not pre-patched: never
     * used, a first apply reads the file as without it; writing the image
     * overwrites it). Only with sz covering it.
     */
    unsigned plan_note;
};

/** altpatch_image_info.plan_note values. */
enum {
    ALTPATCH_PLAN_NOTE_NONE = 0,
    ALTPATCH_PLAN_NOTE_EMPTY = 1,
    ALTPATCH_PLAN_NOTE_FILLED = 2,
    ALTPATCH_PLAN_NOTE_STALE = 3,
};

/** Fill @p info (info->sz must be set). -EINVAL on a bad argument. */
ALTPATCH_API int altpatch_image_get_info(const struct altpatch_image *img,
                                         struct altpatch_image_info *info);

/**
 * The feature set a pre-patched image was planned for (owned by @p img), or
 * NULL (errno ENOENT) when the image is not pre-patched.
 */
ALTPATCH_API const struct altpatch_features *
altpatch_image_prepatched_features(const struct altpatch_image *img);

/**
 * Plan every site for @p fs with the runtime's planner (which also validates
 * every record, whatever the set). The plan replaces the previous one. Sites
 * are planned from the compiler's original bytes, also in a pre-patched
 * image. 0 or -EINVAL / -ENOMEM.
 */
ALTPATCH_API int altpatch_image_plan(struct altpatch_image *img,
                                     const struct altpatch_features *fs);

/** One site of an image. Pointers are valid during the callback only. */
struct altpatch_image_site {
    size_t sz;               /**< sizeof(struct altpatch_image_site) of the library */
    unsigned index;          /**< site number, in table order */
    uint64_t addr;           /**< link-time address */
    unsigned len;            /**< bytes */
    unsigned entries;        /**< records of this site (nested ALTERNATIVE_n) */
    int chosen;              /**< entry of the plan, -1 for the original (and before a plan) */
    int reason;              /**< enum altpatch_reason of the plan (or of the table checks) */
    const char *detail;      /**< text of a refusal, "" when none */
    const uint8_t *original; /**< the compiler's bytes; NULL when the site lies outside the text */
    const uint8_t *current;  /**< the bytes the image holds there (a pre-patched file: the profile's) */
    const uint8_t *final;    /**< the plan's bytes; NULL before a plan or outside the text */
    /** Entry (within the site) whose record caused the refusal, -1 when none or not one entry. */
    int bad_entry;
};

/** Return non-zero to stop the walk. */
typedef int (*altpatch_image_site_fn)(const struct altpatch_image_site *site, void *ctx);

/**
 * Walk the sites of @p img in table order. Returns the callback's non-zero
 * value, 0 at the end, -EINVAL on a bad argument.
 */
ALTPATCH_API int altpatch_image_site_foreach(const struct altpatch_image *img,
                                             altpatch_image_site_fn fn, void *ctx);

/** One record of a site. */
struct altpatch_image_entry {
    size_t sz;                  /**< set by the caller: sizeof(struct altpatch_image_entry) */
    unsigned index;             /**< position in the table */
    unsigned feature;           /**< X86_FEATURE_* id */
    unsigned flags;             /**< ALT_FLAG_* */
    unsigned instrlen;          /**< the record's site length */
    uint64_t repl_addr;         /**< link-time address of the replacement */
    unsigned repl_len;
    const uint8_t *replacement; /**< its bytes; NULL when outside altinstr_replacement */
};

/**
 * Entry @p k (0 = first record) of site @p site (its index). @p out->sz must
 * be set. 0, -EINVAL, or -ENOENT for a site or entry that does not exist.
 * Pointers stay valid until altpatch_image_close().
 */
ALTPATCH_API int altpatch_image_site_entry(const struct altpatch_image *img, unsigned site,
                                           unsigned k, struct altpatch_image_entry *out);

/** Options of altpatch_image_write(). */
struct altpatch_image_write_opts {
    size_t sz;           /**< sizeof(struct altpatch_image_write_opts) */
    /** Text recorded as the profile (at most 63 bytes; default "custom"). */
    const char *profile;
    /** Permissions of the new file; 0: those of the opened file (0755 for bytes). */
    unsigned mode;
    /** Must be zero (-EINVAL otherwise). */
    unsigned reserved;
};

/**
 * Write a pre-patched copy of @p img to @p path: every site inside the text
 * holds the last plan's final bytes (the original where the plan keeps it),
 * the note says format version 4 (2 for a format-1 file), and a non-allocated section
 * `.altpatch.orig` keeps the profile, its feature set and every site's
 * original bytes, so that altpatch_apply() still converges to the running
 * CPU's plan and ALTPATCH_APPLY_REVERT restores the compiler's bytes. The
 * file appears complete or not at all (written beside @p path, then renamed).
 * Errors: -EINVAL (no plan yet, bad opts), -ENOMEM, -ENOTSUP (the image has
 * no section header table to extend), or the error of creating or writing
 * the file.
 */
ALTPATCH_API int altpatch_image_write(const struct altpatch_image *img, const char *path,
                                      const struct altpatch_image_write_opts *opts);

/**
 * altpatch_image_write() into memory: *@p buf (malloc'ed, free() it) holds
 * *@p len bytes. Same errors, except those of files.
 */
ALTPATCH_API int altpatch_image_write_mem(const struct altpatch_image *img,
                                          const struct altpatch_image_write_opts *opts,
                                          void **buf, size_t *len);

/* ------------------------------------------------------------------------- */
/* Images described by the caller                                            */
/* ------------------------------------------------------------------------- */

/** Record layouts of altpatch_image_open_regions(). */
enum altpatch_record_layout {
    /** This library's 14-byte record of format 1 (docs/format.md), also Linux's from 6.3 on. */
    ALTPATCH_LAYOUT_ALTPATCH = 0,
    /**
     * Linux before 6.3, 12 bytes: s32 site offset, s32 replacement offset,
     * u16 cpuid (bit 15: inverted, read as ALT_FLAG_NOT), u8 site length,
     * u8 replacement length. This library's format 3 uses this layout.
     */
    ALTPATCH_LAYOUT_LINUX_12 = 1,
    /** This library's 12-byte record of format 3: the same layout as ALTPATCH_LAYOUT_LINUX_12. */
    ALTPATCH_LAYOUT_COMPACT = ALTPATCH_LAYOUT_LINUX_12,
};

/** Most text regions altpatch_image_open_regions() takes. */
#define ALTPATCH_IMAGE_MAX_TEXT 16

/** One range of bytes at an address, described by the caller. */
struct altpatch_image_region {
    uint64_t addr;    /**< address of the first byte (link-time, or any consistent numbering) */
    uint64_t size;    /**< bytes */
    const void *data; /**< the @c size bytes (copied); NULL only when @c size is 0 */
};

/**
 * What altpatch_image_open_regions() builds an image from: the record table,
 * the replacements and the text, as a tool found them (in a relocatable
 * object's sections, a process's memory, a kernel image), plus the planner's
 * rules when the records do not use this library's feature numbering.
 */
struct altpatch_image_regions {
    size_t sz;          /**< sizeof(struct altpatch_image_regions) */
    const char *name;   /**< name used in messages (default "image") */
    unsigned layout;    /**< enum altpatch_record_layout */
    /** The record table; its size a multiple of the layout's record. */
    struct altpatch_image_region table;
    /** The replacements (altinstr_replacement); may be empty. */
    struct altpatch_image_region repl;
    /**
     * Where sites may lie: executable ranges, at most ALTPATCH_IMAGE_MAX_TEXT,
     * not overlapping one another. The view is built from them as the runtime
     * builds a module's from its executable segments: the replacement range
     * is taken out. Sites outside every region are refused (SITE_BOUNDS).
     */
    const struct altpatch_image_region *text;
    size_t ntext;
    /**
     * Feature ids the planner accepts (each below 1024), e.g. a kernel
     * version's numbering; records naming another id are refused
     * (UNKNOWN_FEATURE). NULL with @c nknown 0: this library's table.
     */
    const unsigned *known;
    size_t nknown;
    /**
     * ALT_FLAG_* bits besides ALT_FLAG_NOT that the planner lets through (a
     * caller that resolves them itself, e.g. the kernel's DIRECT_CALL);
     * records with other bits are refused (UNKNOWN_FLAGS).
     */
    unsigned flags;
    /** Must be zero (-EINVAL otherwise). */
    unsigned reserved;
};

/**
 * Open an image from caller-described memory @p desc (every byte copied).
 * The image is planned, walked and queried like one read from a file
 * (altpatch_image_plan() applies @p desc's rules); it has no file behind it,
 * so altpatch_image_write() answers -ENOTSUP, and its format_version is 1
 * (ALTPATCH_LAYOUT_ALTPATCH) or 3 (the 12-byte layout).
 * Errors, each with one WARN line and nothing allocated: -EINVAL (NULL
 * arguments, bad @c sz, non-zero reserved or unknown fields, an unknown
 * layout, a region with NULL data or that wraps around, more than
 * ALTPATCH_IMAGE_MAX_TEXT or overlapping text regions, a known id of 1024
 * or more), -EBADMSG (a table size that is not a multiple of the layout's
 * record), -ENOMEM.
 */
ALTPATCH_API int altpatch_image_open_regions(const struct altpatch_image_regions *desc,
                                             struct altpatch_image **out);

#ifdef __cplusplus
}
#endif

#endif /* ALTPATCH_IMAGE_H */
