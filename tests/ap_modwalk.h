/* SPDX-License-Identifier: MIT */
/*
 * The module fixtures' sites checked against ap_expect.h, shared by the tests
 * of testdata/apfix_mod.c's libraries (libapfix_linked.so is a DT_NEEDED of
 * the test, the others are dlopen'ed).
 */
#ifndef AP_MODWALK_H
#define AP_MODWALK_H

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "ap_expect.h"

/* From libapfix_linked.so. */
long apfix_linked_call(long x);
long apfix_linked_call2(long x);
void *apfix_linked_fs(void);
void apfix_linked_fence(void);
const struct apx_call *apfix_linked_calls(size_t *n);

struct mres {
    int rc[4];
    unsigned sites[4], bad[4], patched[4], kinds_fs[4];
    long val[8];
    int flag[8];
    char msg[512];
};

struct mwalk {
    const char *module; /* substring of the module path */
    const struct apx_call *calls;
    size_t ncalls;
    unsigned sites, bad, patched, fs;
    char *msg;
    size_t msgsz;
};

static inline int mod_one(const struct altpatch_site_info *s, void *p)
{
    struct mwalk *w = p;
    if (!strstr(s->module, w->module))
        return 0;
    uint8_t want[AP_EXPECT_MAX];
    char h1[64], h2[64];
    enum apx_kind k = apx_expect(s, apx_has_host, NULL, w->calls, w->ncalls, want);
    w->sites++;
    w->fs += k == APX_FS;
    if (k == APX_UNKNOWN || memcmp((const void *)s->addr, want, s->len) != 0) {
        w->bad++;
        size_t len = strlen(w->msg);
        snprintf(w->msg + len, w->msgsz - len, "[%s %s: %s want %s] ", w->module,
                 apx_kind_names[k], apx_hex((const uint8_t *)s->addr, s->len, h1, sizeof(h1)),
                 k == APX_UNKNOWN ? "?" : apx_hex(want, s->len, h2, sizeof(h2)));
    }
    w->patched += s->state == ALTPATCH_SITE_PATCHED;
    return 0;
}

/* Walk the sites of the module whose path contains @p module into slot @p i. */
static inline void walk_module(struct mres *r, int i, const char *module, const struct apx_call *calls,
                        size_t ncalls)
{
    struct mwalk w = {module, calls, ncalls, 0, 0, 0, 0, r->msg, sizeof(r->msg)};
    if (altpatch_site_foreach(mod_one, &w) != 0)
        w.bad++;
    r->sites[i] = w.sites, r->bad[i] = w.bad, r->patched[i] = w.patched, r->kinds_fs[i] = w.fs;
}

static inline void assert_patched(const struct mres *r, int i, const char *what)
{
    cr_assert_eq(r->rc[i], 0, "%s: apply returned %d", what, r->rc[i]);
    cr_assert_geq(r->sites[i], 4, "%s: %u sites (2 calls, fs, fence expected)", what, r->sites[i]);
    cr_assert_eq(r->bad[i], 0, "%s: %s", what, r->msg);
    cr_assert_geq(r->patched[i], 1, "%s: nothing patched", what);
}

/* dlopen(@p path, RTLD_NOW); NULL with the loader's reason in @p msg. */
static inline void *mod_dlopen(const char *path, char *msg, size_t msgsz)
{
    void *h = dlopen(path, RTLD_NOW);
    if (!h)
        snprintf(msg, msgsz, "dlopen: %s", dlerror());
    return h;
}

typedef long (*call_fn)(long);
typedef const struct apx_call *(*calls_fn)(size_t *);
typedef void *(*fs_fn)(void);

#endif /* AP_MODWALK_H */
