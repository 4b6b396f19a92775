/* SPDX-License-Identifier: MIT */
/*
 * apply.h - floor 4 of libaltpatch: the runtime API (floors below: host.h,
 * plan.h, pure.h, util.h). image.c, the offline API, is on this floor too
 * and needs nothing of this header but the floors below.
 *
 *   apply.c      altpatch_apply(), stats, the site walk: decide per site
 *                against memory, one batch of writes, per-site results
 *   pins.c       libraries held loaded while apply reads or writes them
 *   sitecache.c  each site's template, the planner for what no template answers
 *   debug.c      ALTPATCH_DEBUG blocks and refusal warnings
 *   image.c      the image API (<altpatch/image.h>): ELF files, offline
 *   image_regions.c  the image API on memory a tool describes (sections,
 *                a process, a kernel): altpatch_image_open_regions()
 */
#ifndef ALTPATCH_APPLY_H
#define ALTPATCH_APPLY_H

#include <elf.h>

#include <altpatch/image.h>

#include "host.h"

enum ap_action { AP_ACT_UNCHANGED, AP_ACT_WRITE, AP_ACT_REFUSED };

/** One site of one apply (kept small: applies of 10^5..10^6 sites keep them all). */
struct ap_work {
    struct ap_module *m;
    size_t idx;
    const uint8_t *orig;    /* saved original, NULL when outside the text */
    const uint8_t *cur;     /* live memory, NULL when outside the text */
    const uint8_t *old;     /* what memory holds, for the writer */
    const uint8_t *target;  /* the bytes memory must hold: orig, or final in the run's arena */
    char *detail;           /* the planner's detail of a refusal (malloc'ed), or NULL */
    int chosen;             /* entry memory will hold; -1 = original */
    int reason;             /* refusal, or NONE */
    enum ap_action action;
};

/* ------------------------------------------------------------------------- */
/* Pins (pins.c)                                                             */
/* ------------------------------------------------------------------------- */

/** Libraries held loaded (one dlopen(RTLD_NOLOAD) reference each). */
struct ap_pins {
    void **h;
    uintptr_t *base;
    char **name;
    size_t n, cap;
    struct ap_notes_seen seen; /* every object's note, as the pins' walk found it */
};

/** No pins, no object seen (the notes' array is not cleared: never read). */
static inline void ap_pins_empty(struct ap_pins *p)
{
    p->h = NULL;
    p->base = NULL;
    p->name = NULL;
    p->n = p->cap = 0;
    ap_notes_seen_init(&p->seen);
}

/** Pin every loaded library (never called with apply's lock held). */
AP_HIDDEN void ap_pins_take(struct ap_pins *p);
/** Release the pins (a library dlclose'd meanwhile is unmapped here). */
AP_HIDDEN void ap_pins_release(struct ap_pins *p);
/** Mark the modules of @p list that @p p does not pin as gone (skipped). */
AP_HIDDEN void ap_pin(struct ap_module *list, const struct ap_pins *p);
/** Forget the pins held by the list (ap_pins_release() drops them). */
AP_HIDDEN void ap_unpin(struct ap_module *list);
/**
 * The gate of the phases that run inside the loader (taking and releasing
 * pins, altpatch_dlopen's dlopen): any number of threads at once, none while
 * a fork() holds it (apply.c).
 */
AP_HIDDEN void ap_gate_enter(void);
AP_HIDDEN void ap_gate_leave(void);

/* ------------------------------------------------------------------------- */
/* Each module's plans (sitecache.c)                                         */
/* ------------------------------------------------------------------------- */

/**
 * The plan of site @p i (original bytes @p orig, NULL when outside the
 * text) by the planner, through @p memo (which keeps the template if
 * accepted, and the site remembers it in its st[i].shape): for what no template
 * answers. Returns the chosen entry (-1: the original), with its final bytes
 * in @p final (site length), or -2 for a refusal: *@p reason, and *@p detail
 * the planner's detail (malloc'ed) or NULL (both untouched otherwise).
 */
AP_HIDDEN int ap_plan_slow(struct ap_module *m, size_t i, const uint8_t *orig,
                           struct ap_memo *memo, uint8_t *final, int *reason, char **detail);
/** Forget a module's site templates unless they belong to memo generation @p gen. */
AP_HIDDEN void ap_cache_check(struct ap_module *m, uint64_t gen);

/* ------------------------------------------------------------------------- */
/* Debug output (debug.c)                                                    */
/* ------------------------------------------------------------------------- */

/** One block per site, in the style of the kernel's debug-alternative. */
AP_HIDDEN void ap_debug_site(const struct ap_work *wk);
/** One WARN line when a site becomes refused (not again while the reason stays). */
AP_HIDDEN void ap_warn_refusal(const struct ap_work *wk);

/* ------------------------------------------------------------------------- */
/* Images (image.c: ELF files; image_regions.c: caller-described memory)     */
/* ------------------------------------------------------------------------- */

/** Largest file opened (the whole file is read into memory). */
#define AP_IMAGE_MAX (1ull << 32)

struct ap_image_plan {
    int reason;
    int chosen;
    int bad_entry;
    char *detail; /* malloc'ed for refusals, else NULL */
};

struct altpatch_image {
    char *name;
    uint8_t *buf; /* the file */
    size_t len;
    unsigned mode;
    Elf64_Phdr *ph; /* copy of the program headers */
    size_t nph;
    struct ap_view view;
    struct ap_note note;
    uint64_t note_off; /* file offset of the note descriptor */
    struct ap_entry *entries;
    size_t nentries;
    struct ap_site *sites;
    size_t nsites;
    uint8_t *orig;     /* per site at orig_off: the compiler's bytes */
    size_t *orig_off;  /* AP_NO_ORIG: outside the text */
    /* pre-patched files */
    bool prepatched;
    char profile[AP_PREPATCH_PROFILE];
    uint32_t planner; /* the planner version the file records */
    struct altpatch_features pfs;
    bool has_origsec;
    /* the plan note: ALTPATCH_PLAN_NOTE_NONE, _EMPTY or _FILLED (plan_note
     * decoded), its descriptor at file offset plan_off, address plan_addr */
    unsigned plan_state;
    uint64_t plan_off, plan_addr;
    uint32_t plansz;
    struct ap_plan_note plan_note;
    struct ap_elf_section origsec;
    /* the last plan */
    bool planned;
    struct altpatch_features plan_fs; /* the set of the last plan */
    struct ap_image_plan *plan; /* per site */
    uint8_t *final;             /* per site at orig_off */
    /* altpatch_image_open_regions(): the caller's planning rules (NULL: this
     * library's features and flags), and no ELF file behind the image. */
    struct ap_plan_rules *rules;
    bool regions;
};

/**
 * Copy every site's bytes out of the view (the originals), allocate the
 * per-site plan state: the last step of every constructor, once the view,
 * entries and sites are set. 0 or -ENOMEM.
 */
AP_HIDDEN int ap_image_take_originals(struct altpatch_image *img);

#endif /* ALTPATCH_APPLY_H */
