/* SPDX-License-Identifier: MIT */
/*
 * view.h - the one builder of a module's view (struct ap_view), used by the
 * runtime on live memory (module.c) and by the image API on an ELF file
 * (image.c), so both hand the planner the same address ranges for the same
 * module.
 */
#ifndef ALTPATCH_VIEW_H
#define ALTPATCH_VIEW_H

#include "internal.h"

/** One loadable segment as the view builder needs it (a PT_LOAD header, resolved). */
struct ap_segment {
    uint64_t addr;       /* where the segment's first byte is (runtime or link-time) */
    uint64_t size;       /* bytes of it that @c data holds (live: p_memsz; file: p_filesz) */
    const uint8_t *data; /* those bytes */
    bool exec;           /* PF_X and PF_R */
};

/**
 * Fill @p v from the module's segments: the replacement range
 * [@p repl_addr, +@p repl_size) with its bytes (@p repl_data), and as text
 * every executable segment minus the replacement range (at most AP_MAX_TEXT
 * regions; further ones are left out and their sites refused as SITE_BOUNDS).
 */
AP_HIDDEN void ap_view_build(struct ap_view *v, const struct ap_segment *seg, size_t nseg,
                             uint64_t repl_addr, uint64_t repl_size, const uint8_t *repl_data);

#endif /* ALTPATCH_VIEW_H */
