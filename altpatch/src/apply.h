/* SPDX-License-Identifier: MIT */
/*
 * apply.h - floor 4 of libaltpatch: the runtime API (floors below: host.h,
 * plan.h, pure.h, util.h). image.c, the offline API, is on this floor too
 * and needs nothing of this header but the floors below.
 *
 *   apply.c      altpatch_apply(), stats, the site walk: decide per site
 *                against memory, one batch of writes, per-site results
 *   pins.c       libraries held loaded while apply reads or writes them
 *   sitecache.c  each module's plans from the last apply
 *   debug.c      ALTPATCH_DEBUG blocks and refusal warnings
 *   image.c      the image API (<altpatch/image.h>): ELF files, offline
 */
#ifndef ALTPATCH_APPLY_H
#define ALTPATCH_APPLY_H

#include "host.h"

enum ap_action { AP_ACT_UNCHANGED, AP_ACT_WRITE, AP_ACT_REFUSED };

/** One site of one apply (kept small: applies of 10^5..10^6 sites keep them all). */
struct ap_work {
    struct ap_module *m;
    size_t idx;
    const uint8_t *orig;    /* saved original, NULL when outside the text */
    const uint8_t *cur;     /* live memory, NULL when outside the text */
    const uint8_t *old;     /* what memory holds, for the writer */
    uint8_t *target;        /* the bytes memory must hold (in the run's arena) */
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
};

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
 * The plan of site @p i: from the module's cache when it holds one for this
 * feature set, else from the planner through @p memo (and then cached if
 * accepted). Fills out->reason, chosen and detail; returns the final bytes
 * (valid while @p out and the module live).
 */
AP_HIDDEN const uint8_t *ap_plan_cached(struct ap_module *m, size_t i,
                                        const struct altpatch_features *fs,
                                        struct ap_memo *memo, struct ap_plan *out);
/** Forget a module's cached plans unless they were made for @p fs. */
AP_HIDDEN void ap_cache_check(struct ap_module *m, const struct altpatch_features *fs);

/* ------------------------------------------------------------------------- */
/* Debug output (debug.c)                                                    */
/* ------------------------------------------------------------------------- */

/** One block per site, in the style of the kernel's debug-alternative. */
AP_HIDDEN void ap_debug_site(const struct ap_work *wk);
/** One WARN line when a site becomes refused (not again while the reason stays). */
AP_HIDDEN void ap_warn_refusal(const struct ap_work *wk);

#endif /* ALTPATCH_APPLY_H */
