/* SPDX-License-Identifier: MIT */
/*
 * altdump's kernel front end: Linux vmlinux images and .ko modules carry the
 * kernel's own .altinstructions / .altinstr_replacement tables, without
 * altpatch's note. kernel.c recognises them, finds the kernel version in the
 * image (vermagic, linux_banner), picks the record layout and the feature
 * numbering of that version (kfeatures.c), builds the feature set a kernel
 * sets on a CPU profile, and resolves ALT_FLAG_DIRECT_CALL entries.
 *
 * Record layouts:
 *   before 6.3  12 bytes: s32 instr_offset, s32 repl_offset, u16 cpuid
 *               (bit 15 ALTINSTR_FLAG_INV = ALT_NOT), u8 instrlen,
 *               u8 replacementlen
 *   6.3 on      14 bytes: s32, s32, u32 ft_flags (feature in bits 0-15,
 *               flags in 16-31: ALT_FLAG_NOT 1<<0, ALT_FLAG_DIRECT_CALL 1<<1),
 *               u8 instrlen, u8 replacementlen -- altpatch's own record
 */
#ifndef ALTDUMP_KERNEL_H
#define ALTDUMP_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** One X86_FEATURE_* / X86_BUG_* of a kernel version. */
struct ad_kfeat {
    unsigned id;          /* word*32+bit */
    const char *name;     /* "FSGSBASE", "BUG_SPECTRE_V2" */
    const char *cpuinfo;  /* /proc/cpuinfo spelling, "" when not printed */
};

/** The numbering of one kernel version. */
struct ad_ktable {
    const char *version;
    int major, minor;
    const struct ad_kfeat *f;
    size_t n;
};

extern const struct ad_ktable ad_ktables[];
extern const size_t ad_nktables;

/** Pre-6.3 records: bit 15 of the u16 cpuid means "feature absent". */
#define AD_KALTINSTR_FLAG_INV 0x8000u
/** 6.3+ records: ALT_FLAG_DIRECT_CALL (6.10 on). */
#define AD_KALT_FLAG_DIRECT_CALL (1u << 1)
/** Size of one record of each layout. */
#define AD_KREC_OLD 12u
#define AD_KREC_NEW 14u

/** What the image says about itself as a kernel. */
struct ad_kernel {
    bool on;                    /* a kernel image or module (.altinstructions, no note) */
    bool module;                /* ET_REL (.ko) */
    int major, minor;           /* 0 when no version string was found */
    char release[80];           /* e.g. "6.12.107+deb12-cloud-amd64", or "" */
    const char *source;         /* where the release came from: "vermagic", "linux_banner" */
    unsigned record_size;       /* AD_KREC_OLD or AD_KREC_NEW */
    const char *layout_why;     /* how the layout was chosen */
    const struct ad_ktable *tab;
};

/** Parse a release string ("6.1.0-57-cloud-amd64 SMP ...") into @p k. */
void ad_kernel_set_release(struct ad_kernel *k, const char *s, size_t len, const char *source);
/**
 * Choose the record layout and numbering for a table of @p size bytes (the
 * version if known, else the size). Returns 0, or non-zero with a message.
 */
int ad_kernel_layout(struct ad_kernel *k, uint64_t size, char *err, size_t errsz);
/** X86_FEATURE / X86_BUG name of @p id in the image's version, or NULL. */
const char *ad_kernel_feature_name(const struct ad_kernel *k, unsigned id);

#endif /* ALTDUMP_KERNEL_H */
