/* SPDX-License-Identifier: MIT */
/*
 * pins.c - loaded libraries held with a dlopen() reference while apply or a
 * site walk reads or writes their bytes.
 *
 * The module list describes what dl_iterate_phdr() saw; once the walk returns
 * another thread may dlclose() a library and unmap its site and replacement
 * bytes. Every loaded library is therefore pinned with dlopen(path,
 * RTLD_NOLOAD) for the duration of an apply or a site walk, and released at
 * the end -- every library that carries an altpatch note, the only ones whose
 * bytes are read or written (ap_module_note_seen()); a module of the list that is not pinned (unloaded meanwhile, or a
 * new copy at another address, or loaded after the pins were taken) is
 * skipped this time. The main program (empty path) cannot be unloaded. A
 * library loaded with dlmopen() into another namespace is not found by name
 * and is skipped too.
 *
 * The pins are taken BEFORE ap_lock and released AFTER it: dlopen() takes the
 * loader's lock, which a thread running a library constructor holds; if that
 * constructor calls altpatch_apply() while we held ap_lock and waited for the
 * loader, both would wait forever.
 */
#include "apply.h"

#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

AP_HOT static int ap_pins_collect(struct dl_phdr_info *info, size_t size, void *data)
{
    struct ap_pins *p = data;
    /* a library's note is remembered for the module walk that follows
     * (ap_modules_refresh_seen); the main program (empty name) needs no pin
     * and is not searched here */
    bool lib = info->dlpi_name && info->dlpi_name[0];
    if (!ap_module_note_seen(info, size, lib, &p->seen))
        return 0;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 32;
        char **nn = realloc(p->name, cap * sizeof(*nn));
        if (!nn)
            return 1;
        p->name = nn;
        p->cap = cap;
    }
    if (!(p->name[p->n] = strdup(info->dlpi_name)))
        return 1;
    p->n++;
    return 0;
}

/** Pin every loaded library (never called with ap_lock held). */
AP_HOT void ap_pins_take(struct ap_pins *p)
{
    ap_gate_enter(); /* see ap_gate_mx in apply.c */
    ap_pins_empty(p);
    /* dlopen() is not allowed inside the walk */
    p->seen.complete = dl_iterate_phdr(ap_pins_collect, p) == 0;
    if (p->n == 0) { /* nothing to pin (the main program needs none) */
        ap_gate_leave();
        return;
    }
    p->h = calloc(p->n, sizeof(*p->h));
    p->base = calloc(p->n, sizeof(*p->base));
    for (size_t i = 0; p->h && p->base && i < p->n; i++) {
        void *h = dlopen(p->name[i], RTLD_NOLOAD | RTLD_LAZY);
        struct link_map *lm = NULL;
        if (h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm) {
            p->h[i] = h;
            p->base[i] = lm->l_addr;
        } else if (h) {
            dlclose(h);
        }
    }
    ap_gate_leave();
}

/** Release the pins (a library dlclose'd meanwhile is unmapped here). */
AP_HOT void ap_pins_release(struct ap_pins *p)
{
    ap_gate_enter();
    if (p->name) { /* else nothing was taken (free(NULL) would bind free() for nothing) */
        for (size_t i = 0; i < p->n; i++) {
            if (p->h && p->h[i])
                dlclose(p->h[i]);
            free(p->name[i]);
        }
        free(p->h);
        free(p->base);
        free(p->name);
    }
    ap_pins_empty(p);
    ap_gate_leave();
}

/** Mark the modules of @p list that @p p does not pin as gone (skipped). */
AP_HOT void ap_pin(struct ap_module *list, const struct ap_pins *p)
{
    for (struct ap_module *m = list; m; m = m->next) {
        m->pin = NULL;
        m->gone = m->path[0] != '\0';
        for (size_t i = 0; m->gone && p->h && i < p->n; i++) {
            if (p->h[i] && p->base[i] == m->base && strcmp(p->name[i], m->path) == 0) {
                m->pin = p->h[i];
                m->gone = false;
            }
        }
        if (m->gone)
            ap_log(ALTPATCH_DEBUG, "%s: unloaded or loaded while applying: skipped\n",
                   m->path);
    }
}

/** Forget the pins held by the list (ap_pins_release() drops them). */
AP_HOT void ap_unpin(struct ap_module *list)
{
    for (struct ap_module *m = list; m; m = m->next)
        m->pin = NULL;
}

