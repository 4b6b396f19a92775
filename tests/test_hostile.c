/* SPDX-License-Identifier: MIT */
/*
 * Hostile input and hostile systems (docs/hardening.md).
 *
 *  - records: the libaphost_*.so modules (testdata/hostile/) carry the kinds of
 *    corrupt records and lying notes that tests/test_corrupt.c does not; each
 *    is refused with its own reason, and every executable byte of every module
 *    is compared before and after apply: only the valid sites change;
 *  - strict W^X: under PR_SET_MDWE the writer reports /proc/self/mem in the
 *    stats; a seccomp filter that kills the process on any mprotect/mmap/
 *    pkey_mprotect asking for PROT_WRITE|PROT_EXEC proves apply (ordinary and
 *    live) never maps a page writable and executable;
 *  - AT_SECURE: a set-uid root copy of hostile_secure_helper run as uid 65534
 *    ignores ALTPATCH_OFF / ALTPATCH_CLEARCPUID / ALTPATCH_DEBUG.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <link.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_exec_segs.h"
#include "ap_isolate.h"
#include "ap_mdwe.h"
#include "ap_procmem.h"
#include "ap_seccomp.h"
#include "ap_warnlog.h"


/* ---- hostile records ---------------------------------------------------------- */

struct rec_expect {
    const char *sym; /* record symbol in libaphost_records.so */
    int state, reason;
};

static const struct rec_expect rec_expect[] = {
    {"aph_valid_a_rec", ALTPATCH_SITE_PATCHED, ALTPATCH_REASON_NONE},
    {"aph_valid_b_rec", ALTPATCH_SITE_PATCHED, ALTPATCH_REASON_NONE},
    {"aph_rec_repl_below", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_REPL_BOUNDS},
    {"aph_rec_repl_above", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_REPL_BOUNDS},
    {"aph_rec_repl_data", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_REPL_BOUNDS},
    {"aph_rec_site_self", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_BOUNDS},
    {"aph_rec_site_max", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_BOUNDS},
    {"aph_rec_site_min", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_BOUNDS},
    {"aph_rec_nested", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_UNKNOWN_FEATURE},
    {"aph_rec_call_bad", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_ORIG_CROSSES_END},
};
#define NREC (sizeof(rec_expect) / sizeof(rec_expect[0]))

/* Modules whose note lies: refused as a whole. */
struct mod_expect {
    const char *name; /* libaphost_<name>.so, function aph_<name>_fn */
    int reason;
};

static const struct mod_expect mod_expect[] = {
    {"recsize", ALTPATCH_REASON_BAD_VERSION},   {"descsz", ALTPATCH_REASON_BAD_VERSION},
    {"inverted", ALTPATCH_REASON_BAD_TABLE},    {"misaligned", ALTPATCH_REASON_BAD_TABLE},
    {"table_out", ALTPATCH_REASON_BAD_TABLE},   {"repl_out", ALTPATCH_REASON_BAD_TABLE},
    {"v3recsize", ALTPATCH_REASON_BAD_VERSION}, {"v3table", ALTPATCH_REASON_BAD_TABLE},
    {"wtable", ALTPATCH_REASON_BAD_TABLE},
};
#define NMOD (sizeof(mod_expect) / sizeof(mod_expect[0]))
#define NALL (NMOD + 1)

#define MAXSEG AP_EXEC_SEGS_MAX

/* The executable segments of one module and a copy of their bytes. */
struct segs {
    struct ap_exec_segs x;
    uint8_t *copy[MAXSEG];
};

static int segs_take(struct segs *s, const char *file)
{
    memset(s, 0, sizeof(*s));
    ap_exec_segs_find(&s->x, file);
    for (int i = 0; i < s->x.n; i++) {
        s->copy[i] = malloc(s->x.size[i]);
        memcpy(s->copy[i], (const void *)s->x.addr[i], s->x.size[i]);
    }
    return s->x.n;
}

/* Bytes of the segments that changed outside the ranges [lo[k], lo[k]+len). */
static long segs_changed_outside(const struct segs *s, const uintptr_t *lo, int nr, size_t len)
{
    long n = 0;
    for (int i = 0; i < s->x.n; i++)
        for (size_t b = 0; b < s->x.size[i]; b++) {
            uintptr_t a = s->x.addr[i] + b;
            if (*(const uint8_t *)a == s->copy[i][b])
                continue;
            int in = 0;
            for (int k = 0; k < nr; k++)
                in |= a >= lo[k] && a < lo[k] + len;
            n += !in;
        }
    return n;
}

static uintptr_t rec_site(void *h, const char *sym)
{
    const uint8_t *rec = dlsym(h, sym);
    int32_t off;
    if (!rec)
        return 0;
    memcpy(&off, rec, 4);
    return (uintptr_t)rec + (intptr_t)off;
}

struct seen {
    int found, state, reason;
};

struct walk {
    const char *module;
    uintptr_t addr[NREC];
    struct seen *seen;
    int listed, patched, other_reason, reason;
};

static int walk_cb(const struct altpatch_site_info *s, void *p)
{
    struct walk *w = p;
    const char *slash = strrchr(s->module, '/');
    if (!slash || strcmp(slash + 1, w->module))
        return 0;
    w->listed++;
    w->patched += s->state == ALTPATCH_SITE_PATCHED;
    w->other_reason += s->reason != w->reason;
    for (size_t i = 0; w->seen && i < NREC; i++)
        if (w->addr[i] == s->addr) {
            w->seen[i].found++;
            w->seen[i].state = s->state;
            w->seen[i].reason = s->reason;
        }
    return 0;
}

struct rec_res {
    int loaded, apply_rc, segs_ok;
    char msg[256];
    long outside[NALL], valid_changed;
    long fn_before[NALL], fn_after[NALL], valid_after[2];
    struct seen seen[NREC];
    int mod_listed[NMOD], mod_patched[NMOD], mod_other[NMOD], mod_logged[NMOD];
};

typedef long (*fn_t)(void);

static void records_body(void *out, void *ctx)
{
    struct rec_res *r = out;
    (void)ctx;
    static void *h[NALL];
    static struct segs sg[NALL];
    static char file[NALL][64];
    char path[512];
    for (size_t i = 0; i < NALL; i++) {
        snprintf(file[i], sizeof(file[i]), "libaphost_%s.so", i ? mod_expect[i - 1].name : "records");
        snprintf(path, sizeof(path), "%s/%s", APH_LIBDIR, file[i]);
        if (!(h[i] = dlopen(path, RTLD_NOW))) {
            snprintf(r->msg, sizeof(r->msg), "dlopen: %s", dlerror());
            return;
        }
    }
    r->loaded = 1;
    r->segs_ok = 1;
    for (size_t i = 0; i < NALL; i++)
        r->segs_ok &= segs_take(&sg[i], file[i]) > 0;
    fn_t va = (fn_t)dlsym(h[0], "aph_valid_a"), vb = (fn_t)dlsym(h[0], "aph_valid_b");
    r->fn_before[0] = va() + 10 * vb();
    for (size_t i = 1; i < NALL; i++) {
        char sym[64];
        snprintf(sym, sizeof(sym), "aph_%s_fn", mod_expect[i - 1].name);
        r->fn_before[i] = ((fn_t)dlsym(h[i], sym))();
    }
    struct walk w = {.module = file[0], .seen = r->seen};
    for (size_t i = 0; i < NREC; i++)
        w.addr[i] = rec_site(h[0], rec_expect[i].sym);

    altpatch_set_print(ap_warn_capture);
    r->apply_rc = altpatch_apply();

    r->outside[0] = segs_changed_outside(&sg[0], w.addr, 2, 5);
    r->valid_changed = segs_changed_outside(&sg[0], NULL, 0, 0);
    for (size_t i = 1; i < NALL; i++)
        r->outside[i] = segs_changed_outside(&sg[i], NULL, 0, 0);
    r->fn_after[0] = va() + 10 * vb();
    for (size_t i = 1; i < NALL; i++) {
        char sym[64];
        snprintf(sym, sizeof(sym), "aph_%s_fn", mod_expect[i - 1].name);
        r->fn_after[i] = ((fn_t)dlsym(h[i], sym))();
    }
    altpatch_site_foreach(walk_cb, &w);
    for (size_t i = 0; i < NMOD; i++) {
        struct walk m = {.module = file[i + 1], .reason = mod_expect[i].reason};
        altpatch_site_foreach(walk_cb, &m);
        r->mod_listed[i] = m.listed;
        r->mod_patched[i] = m.patched;
        r->mod_other[i] = m.other_reason;
        r->mod_logged[i] = ap_warn_logged(file[i + 1], mod_expect[i].reason);
    }
}

static struct rec_res *records(void)
{
    struct rec_res *r = ap_isolated(sizeof(*r), records_body, NULL);
    cr_assert(r->loaded, "%s", r->msg);
    cr_assert(r->segs_ok, "executable segments of the hostile modules not found");
    cr_assert_eq(r->apply_rc, 0, "apply must process the modules and refuse, got %d", r->apply_rc);
    return r;
}

Test(hostile, each_corrupt_record_refused_with_its_reason)
{
    struct rec_res *r = records();
    for (size_t i = 0; i < NREC; i++) {
        const struct rec_expect *e = &rec_expect[i];
        cr_expect_eq(r->seen[i].found, 1, "%s: listed %d times", e->sym, r->seen[i].found);
        cr_expect_eq(r->seen[i].state, e->state, "%s: state %d, want %d", e->sym,
                     r->seen[i].state, e->state);
        cr_expect_eq(r->seen[i].reason, e->reason, "%s: '%s', want '%s'", e->sym,
                     altpatch_strreason(r->seen[i].reason), altpatch_strreason(e->reason));
    }
}

Test(hostile, lying_notes_refuse_the_whole_module)
{
    struct rec_res *r = records();
    for (size_t i = 0; i < NMOD; i++) {
        const struct mod_expect *e = &mod_expect[i];
        cr_expect_eq(r->fn_before[i + 1], 1, "%s", e->name);
        cr_expect_eq(r->fn_after[i + 1], 1, "%s: site patched in a refused module", e->name);
        cr_expect_eq(r->mod_patched[i], 0, "%s", e->name);
        cr_expect_eq(r->mod_other[i], 0, "%s: a site listed with another reason", e->name);
        cr_expect(r->mod_logged[i] || r->mod_listed[i] > 0,
                  "%s: neither a warning nor listed sites say '%s'", e->name,
                  altpatch_strreason(e->reason));
    }
}

Test(hostile, whole_text_changes_only_at_valid_sites)
{
    struct rec_res *r = records();
    cr_assert_eq(r->outside[0], 0, "%ld byte(s) changed outside the 2 valid sites",
                 r->outside[0]);
    cr_assert_eq(r->valid_changed, 2, "exactly one byte per valid site (mov imm 1 -> 2)");
    cr_assert_eq(r->fn_before[0], 11);
    cr_assert_eq(r->fn_after[0], 22);
    for (size_t i = 1; i < NALL; i++)
        cr_assert_eq(r->outside[i], 0, "%s: %ld byte(s) changed", mod_expect[i - 1].name,
                     r->outside[i]);
}

/* ---- one refused record among valid ones ------------------------------------------ */

/* libaphost_onebad_<k>.so: 32 valid sites and one record the planner refuses
 * for the reason below (k = 0: a valid one kept original), whose entry would
 * not apply: the site is refused, not kept by the feature test, and every
 * other site is decided as in a module without it. */
static const int onebad_reason[] = {
    ALTPATCH_REASON_NONE,          ALTPATCH_REASON_REPL_BOUNDS,     ALTPATCH_REASON_REPL_TOO_LONG,
    ALTPATCH_REASON_UNKNOWN_FLAGS, ALTPATCH_REASON_UNKNOWN_FEATURE, ALTPATCH_REASON_SITE_BOUNDS,
};
#define NONEBAD (sizeof(onebad_reason) / sizeof(onebad_reason[0]))

struct onebad_walk {
    const char *module;
    uintptr_t bad;
    int listed, patched, kept, wrong, bad_found, bad_state, bad_reason;
};

static int onebad_cb(const struct altpatch_site_info *s, void *p)
{
    struct onebad_walk *w = p;
    static const uint8_t add1[3] = {0x83, 0xc0, 0x01}, add3[3] = {0x83, 0xc0, 0x03},
                         add4[3] = {0x83, 0xc0, 0x04};
    const char *slash = strrchr(s->module, '/');
    if (!slash || strcmp(slash + 1, w->module))
        return 0;
    w->listed++;
    if (s->addr == w->bad) {
        w->bad_found++;
        w->bad_state = s->state;
        w->bad_reason = s->reason;
        /* memory unchanged (a site outside the text has no bytes to show) */
        w->wrong += s->len != 3 ||
                    (s->current && s->original && memcmp(s->current, s->original, 3) != 0);
    } else if (s->len == 3 && !memcmp(s->original, add1, 3)) {
        bool ok = s->state == ALTPATCH_SITE_PATCHED && s->reason == ALTPATCH_REASON_NONE &&
                  s->chosen == 0 && !memcmp(s->current, add3, 3);
        w->patched += ok;
        w->wrong += !ok;
    } else if (s->len == 3 && !memcmp(s->original, add4, 3)) {
        bool ok = s->state == ALTPATCH_SITE_ORIGINAL && s->reason == ALTPATCH_REASON_NONE &&
                  s->chosen == -1 && !memcmp(s->current, add4, 3);
        w->kept += ok;
        w->wrong += !ok;
    } else {
        w->wrong++;
    }
    return 0;
}

struct onebad_res {
    int loaded, apply_rc, segs_ok;
    char msg[256];
    long before[NONEBAD], after[NONEBAD], changed[NONEBAD];
    struct onebad_walk w[NONEBAD];
};

/* Records of a table kept in an array for its first apply (module.c): the
 * default, or 0, so that the first decision decodes each site's records from
 * the mapped table (host.h's ap_records_keep_max; the test links the library
 * whole). */
extern unsigned ap_records_keep_max;

static void onebad_body(void *out, void *ctx)
{
    struct onebad_res *r = out;
    ap_records_keep_max = *(const unsigned *)ctx;
    static void *h[NONEBAD];
    static struct segs sg[NONEBAD];
    static char file[NONEBAD][64];
    char path[512];
    for (size_t k = 0; k < NONEBAD; k++) {
        snprintf(file[k], sizeof(file[k]), "libaphost_onebad_%zu.so", k);
        snprintf(path, sizeof(path), "%s/%s", APH_LIBDIR, file[k]);
        if (!(h[k] = dlopen(path, RTLD_NOW))) {
            snprintf(r->msg, sizeof(r->msg), "dlopen: %s", dlerror());
            return;
        }
    }
    r->loaded = 1;
    r->segs_ok = 1;
    for (size_t k = 0; k < NONEBAD; k++) {
        r->segs_ok &= segs_take(&sg[k], file[k]) > 0;
        r->before[k] = ((fn_t)dlsym(h[k], "aph_onebad_fn"))();
        r->w[k].module = file[k];
        r->w[k].bad = (uintptr_t)dlsym(h[k], k == 5 ? "aph_onebad_rodata_site" : "aph_onebad_site");
    }
    altpatch_set_print(ap_warn_capture);
    r->apply_rc = altpatch_apply();
    for (size_t k = 0; k < NONEBAD; k++) {
        r->after[k] = ((fn_t)dlsym(h[k], "aph_onebad_fn"))();
        r->changed[k] = segs_changed_outside(&sg[k], NULL, 0, 0);
        altpatch_site_foreach(onebad_cb, &r->w[k]);
    }
}

static void onebad_check(unsigned records)
{
    struct onebad_res *r = ap_isolated(sizeof(*r), onebad_body, &records);
    cr_assert(r->loaded, "%s", r->msg);
    cr_assert(r->segs_ok, "executable segments of the modules not found");
    cr_assert_eq(r->apply_rc, 0);
    for (size_t k = 0; k < NONEBAD; k++) {
        const struct onebad_walk *w = &r->w[k];
        int want = onebad_reason[k];
        cr_expect_eq(r->before[k], 136, "onebad_%zu", k);
        cr_expect_eq(r->after[k], 168, "onebad_%zu: the 16 sites under ALWAYS patched", k);
        cr_expect_eq(r->changed[k], 16, "onebad_%zu: one byte per patched site, not %ld", k,
                     r->changed[k]);
        cr_expect_eq(w->listed, 33, "onebad_%zu: %d sites listed", k, w->listed);
        cr_expect_eq(w->patched, 16, "onebad_%zu: %d patched", k, w->patched);
        cr_expect_eq(w->kept, 16, "onebad_%zu: %d kept", k, w->kept);
        cr_expect_eq(w->wrong, 0, "onebad_%zu: %d sites decided otherwise", k, w->wrong);
        cr_expect_eq(w->bad_found, 1, "onebad_%zu", k);
        cr_expect_eq(w->bad_state, want ? ALTPATCH_SITE_REFUSED : ALTPATCH_SITE_ORIGINAL,
                     "onebad_%zu: state %d", k, w->bad_state);
        cr_expect_eq(w->bad_reason, want, "onebad_%zu: '%s', want '%s'", k,
                     altpatch_strreason(w->bad_reason), altpatch_strreason(want));
    }
}

Test(hostile, one_bad_record_among_valid_ones)
{
    onebad_check(ap_records_keep_max);
}

Test(hostile, one_bad_record_among_valid_ones_records_decoded)
{
    onebad_check(0);
}

/* ---- the library's own data in an executable segment ------------------------------ */

/* libaphost_ttable.so (testdata/hostile/ttable.S): the record table in .text,
 * a second record whose site is the first record's instr_offset. */
struct ttable_walk {
    uintptr_t table_site;
    int found, state, reason, patched;
};

static int ttable_cb(const struct altpatch_site_info *s, void *p)
{
    struct ttable_walk *w = p;
    const char *slash = strrchr(s->module, '/');
    if (!slash || strcmp(slash + 1, "libaphost_ttable.so"))
        return 0;
    if (s->addr == w->table_site) {
        w->found++;
        w->state = s->state;
        w->reason = s->reason;
    }
    w->patched += s->state == ALTPATCH_SITE_PATCHED;
    return 0;
}

struct ttable_res {
    int loaded, segs_ok, rc[4];
    char msg[256];
    long fn[5], changed[4];
    int table_same[4];
    struct ttable_walk w[2];
};

static void ttable_body(void *out, void *ctx)
{
    struct ttable_res *r = out;
    (void)ctx;
    char path[512];
    snprintf(path, sizeof(path), "%s/libaphost_ttable.so", APH_LIBDIR);
    void *h = dlopen(path, RTLD_NOW);
    if (!h) {
        snprintf(r->msg, sizeof(r->msg), "dlopen: %s", dlerror());
        return;
    }
    r->loaded = 1;
    static struct segs sg;
    r->segs_ok = segs_take(&sg, "libaphost_ttable.so") > 0;
    const uint8_t *table = dlsym(h, "aph_ttable_start");
    uint8_t copy[24];
    memcpy(copy, table, sizeof(copy));
    fn_t fn = (fn_t)dlsym(h, "aph_ttable_fn");
    r->fn[0] = fn();
    struct altpatch_apply_opts rev = {.sz = sizeof(rev), .flags = ALTPATCH_APPLY_REVERT};
    altpatch_set_print(ap_warn_capture);
    for (int k = 0; k < 4; k++) {
        /* apply, apply again (the table read again), revert, apply */
        r->rc[k] = k == 2 ? altpatch_apply_opts(&rev) : altpatch_apply();
        r->fn[k + 1] = fn();
        r->table_same[k] = !memcmp(copy, table, sizeof(copy));
        r->changed[k] = segs_changed_outside(&sg, NULL, 0, 0);
        if (k < 2) {
            r->w[k].table_site = (uintptr_t)table + 2;
            altpatch_site_foreach(ttable_cb, &r->w[k]);
        }
    }
}

Test(hostile, site_over_the_record_table_is_refused)
{
    struct ttable_res *r = ap_isolated(sizeof(*r), ttable_body, NULL);
    cr_assert(r->loaded, "%s", r->msg);
    cr_assert(r->segs_ok, "executable segments of libaphost_ttable.so not found");
    static const long fn_want[5] = {1, 2, 2, 1, 2};
    static const long changed_want[4] = {1, 1, 0, 1};
    for (int k = 0; k < 4; k++) {
        cr_expect_eq(r->rc[k], 0, "call %d: %d", k, r->rc[k]);
        cr_expect(r->table_same[k], "call %d: the record table changed", k);
        cr_expect_eq(r->changed[k], changed_want[k],
                     "call %d: %ld byte(s) of text differ from the file's", k, r->changed[k]);
    }
    for (int k = 0; k < 5; k++)
        cr_expect_eq(r->fn[k], fn_want[k], "after call %d: aph_ttable_fn() = %ld", k - 1,
                     r->fn[k]);
    for (int k = 0; k < 2; k++) {
        cr_expect_eq(r->w[k].found, 1, "apply %d: the site over the table listed %d times", k,
                     r->w[k].found);
        cr_expect_eq(r->w[k].state, ALTPATCH_SITE_REFUSED);
        cr_expect_eq(r->w[k].reason, ALTPATCH_REASON_SITE_BOUNDS, "'%s'",
                     altpatch_strreason(r->w[k].reason));
        cr_expect_eq(r->w[k].patched, 1, "apply %d: %d sites patched", k, r->w[k].patched);
    }
}

/* The most bytes of sites one module may have (host.h), lowered: a module
 * past it is refused as a whole (BAD_TABLE, said in a warning) and the apply
 * goes on with the others, instead of failing for every module. */
extern uint64_t ap_site_bytes_max;

struct sitebytes_res {
    int loaded, rc, logged;
    char msg[256];
    long big_before, big_after, small_before, small_after, big_changed;
    struct onebad_walk w;
};

static void sitebytes_body(void *out, void *ctx)
{
    struct sitebytes_res *r = out;
    (void)ctx;
    char path[512];
    snprintf(path, sizeof(path), "%s/libaphost_onebad_0.so", APH_LIBDIR);
    void *big = dlopen(path, RTLD_NOW); /* 33 sites of 3 bytes: 99 */
    snprintf(path, sizeof(path), "%s/libaphost_ttable.so", APH_LIBDIR);
    void *small = dlopen(path, RTLD_NOW); /* 5 + 2 */
    if (!big || !small) {
        snprintf(r->msg, sizeof(r->msg), "dlopen: %s", dlerror());
        return;
    }
    r->loaded = 1;
    static struct segs sg;
    segs_take(&sg, "libaphost_onebad_0.so");
    fn_t fb = (fn_t)dlsym(big, "aph_onebad_fn"), fs = (fn_t)dlsym(small, "aph_ttable_fn");
    r->big_before = fb();
    r->small_before = fs();
    ap_site_bytes_max = 99;
    altpatch_set_print(ap_warn_capture);
    r->rc = altpatch_apply();
    r->big_after = fb();
    r->small_after = fs();
    r->big_changed = segs_changed_outside(&sg, NULL, 0, 0);
    r->logged = ap_warn_logged("libaphost_onebad_0.so", ALTPATCH_REASON_BAD_TABLE);
    r->w.module = "libaphost_onebad_0.so";
    altpatch_site_foreach(onebad_cb, &r->w);
}

Test(hostile, module_past_the_site_bytes_limit_is_refused_alone)
{
    struct sitebytes_res *r = ap_isolated(sizeof(*r), sitebytes_body, NULL);
    cr_assert(r->loaded, "%s", r->msg);
    cr_assert_eq(r->rc, 0, "apply: %d", r->rc);
    cr_expect_eq(r->big_before, 136);
    cr_expect_eq(r->big_after, 136, "a site of the refused module was patched");
    cr_expect_eq(r->big_changed, 0);
    cr_expect_eq(r->w.patched, 0);
    cr_expect(r->logged, "no warning names the module and 'bad record table'");
    cr_expect_eq(r->small_before, 1);
    cr_expect_eq(r->small_after, 2, "the module under the limit was not patched");
}

/* ---- strict W^X ------------------------------------------------------------------ */

__attribute__((noinline)) static long site_wx(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %%eax\n\taddl $10, %%eax",
                                     "movl $2, %%eax\n\taddl $20, %%eax", X86_FEATURE_ALWAYS)
                         : "=a"(v)
                         :
                         : "cc");
    return v;
}

struct wx_res {
    int set, rc, rc_live, rc_revert, rc_nomem, rc_refused;
    long v, v_live, v_revert, v_nomem, v_refused;
    struct altpatch_stats st, st_live, st_nomem;
    char log[2048];
};

static char wx_log[2048];

static int capture_wx(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    size_t n = strlen(wx_log);
    (void)level;
    if (n + 1 < sizeof(wx_log))
        vsnprintf(wx_log + n, sizeof(wx_log) - n, fmt, ap);
    return 0;
}

static int apply_flags(unsigned flags)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = flags};
    return altpatch_apply_opts(&o);
}

static void get_st(struct altpatch_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->sz = sizeof(*st);
    altpatch_get_stats(st);
}

static void mdwe_body(void *out, void *ctx)
{
    struct wx_res *r = out;
    (void)ctx;
    altpatch_set_print(capture_wx);
    r->set = ap_mdwe_set();
    r->rc_nomem = apply_flags(ALTPATCH_APPLY_NO_PROCMEM);
    get_st(&r->st_nomem);
    r->v_nomem = site_wx();
    r->rc = altpatch_apply();
    get_st(&r->st);
    r->v = site_wx();
    r->rc_revert = apply_flags(ALTPATCH_APPLY_REVERT | ALTPATCH_APPLY_LIVE);
    r->v_revert = site_wx();
    r->rc_live = apply_flags(ALTPATCH_APPLY_LIVE);
    get_st(&r->st_live);
    r->v_live = site_wx();
    memcpy(r->log, wx_log, sizeof(r->log));
}

Test(hostile, mdwe_fails_over_to_procmem_and_says_so)
{
    ap_mdwe_skip_under_valgrind();
    struct wx_res *r = ap_isolated(sizeof(*r), mdwe_body, NULL);
    ap_mdwe_require(r->set);
    /* Without /proc/self/mem: nothing can be written, sites stay original, reported. */
    cr_assert_eq(r->rc_nomem, 0);
    cr_assert_eq(r->v_nomem, 11);
    cr_assert_gt(r->st_nomem.sites_refused, 0);
    cr_assert_eq(r->st_nomem.bytes_written, 0);
    cr_assert_eq(r->st_nomem.mprotect_windows, 0);
    cr_assert_eq(r->st_nomem.procmem_writes, 0);
    if (!ap_procmem_can_write_text()) {
        /* The kernel refuses /proc/self/mem writes to text: the same refusals
         * with it, and no live patching (it writes through it too). */
        cr_assert_eq(r->rc, 0);
        cr_assert_eq(r->v, 11);
        cr_assert_gt(r->st.sites_refused, 0);
        cr_assert_eq(r->st.bytes_written, 0);
        cr_assert_eq(r->st.mprotect_windows, 0, "no window may be opened under MDWE");
        cr_assert_eq(r->st.procmem_writes, 0);
        cr_assert_eq(r->rc_revert, -EBUSY);
        cr_assert_eq(r->v_revert, 11);
        cr_assert_eq(r->rc_live, -EBUSY);
        cr_assert_eq(r->v_live, 11);
        return;
    }
    /* With it: patched through /proc/self/mem, and the stats say which writer. */
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->v, 22);
    cr_assert_eq(r->st.sites_refused, 0);
    cr_assert_eq(r->st.mprotect_windows, 0, "no window may be opened under MDWE");
    cr_assert_gt(r->st.procmem_writes, 0);
    cr_assert_eq(r->rc_revert, 0);
    cr_assert_eq(r->v_revert, 11);
    cr_assert_eq(r->rc_live, 0);
    cr_assert_eq(r->v_live, 22);
    cr_assert_eq(r->st_live.live, 1);
}

/* seccomp: kill the process on mprotect / pkey_mprotect / mmap with W and X. */
static int install_no_wx_filter(void)
{
    struct sock_filter f[] = {
        AP_SECCOMP_PROLOGUE,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pkey_mprotect, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, AP_SECCOMP_ARG2_LO),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, PROT_WRITE | PROT_EXEC),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PROT_WRITE | PROT_EXEC, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return AP_SECCOMP_INSTALL(f);
}

static void seccomp_body(void *out, void *ctx)
{
    struct wx_res *r = out;
    (void)ctx;
    altpatch_set_print(NULL);
    r->set = install_no_wx_filter();
    if (r->set)
        return;
    r->rc = altpatch_apply(); /* mprotect windows: RW, then back to RX */
    get_st(&r->st);
    r->v = site_wx();
    r->rc_revert = apply_flags(ALTPATCH_APPLY_REVERT);
    r->v_revert = site_wx();
    r->rc_refused = apply_flags(ALTPATCH_APPLY_LIVE); /* a filter: refused unless vouched */
    r->v_refused = site_wx();
    r->rc_live = apply_flags(ALTPATCH_APPLY_LIVE | ALTPATCH_APPLY_FILTER_ALLOWS_LIVE);
    get_st(&r->st_live);
    r->v_live = site_wx();
}

static void seccomp_control_body(void *out, void *ctx)
{
    (void)ctx;
    int set = install_no_wx_filter();
    if (set) {
        *(int *)out = set;
        _exit(3);
    }
    void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mprotect(p, 4096, PROT_READ | PROT_WRITE | PROT_EXEC); /* must kill us */
    _exit(0);
}

Test(hostile, seccomp_filter_can_kill)
{
    void *out = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0)
        seccomp_control_body(out, NULL);
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 3)
        ap_seccomp_require(*(int *)out);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS,
              "the W|X filter did not kill an mprotect(RWX) (status 0x%x)", st);
}

Test(hostile, no_mapping_is_ever_writable_and_executable)
{
    if (ap_under_valgrind())
        cr_skip_test("valgrind's own code cache maps RWX");
    struct wx_res *r = ap_isolated(sizeof(*r), seccomp_body, NULL);
    ap_seccomp_require(r->set);
    cr_assert_eq(r->rc, 0);
    cr_assert_gt(r->st.mprotect_windows, 0, "the mprotect path ran under the filter");
    cr_assert_eq(r->v, 22);
    cr_assert_eq(r->rc_revert, 0);
    cr_assert_eq(r->v_revert, 11);
    cr_assert_eq(r->rc_refused, -EBUSY, "live patching under a filter not vouched for");
    cr_assert_eq(r->v_refused, 11);
    if (!ap_procmem_can_write_text()) {
        /* live patching writes through /proc/self/mem, which the kernel refuses */
        cr_assert_eq(r->rc_live, -EBUSY);
        cr_assert_eq(r->v_live, 11);
        return;
    }
    cr_assert_eq(r->rc_live, 0);
    cr_assert_eq(r->st_live.live, 1);
    cr_assert_eq(r->v_live, 22);
}

/* ---- AT_SECURE -------------------------------------------------------------------- */

struct run_out {
    int status;
    char out[512], err[4096];
};

/* Run @p exe with @p env as uid/gid @p id (-1: unchanged); capture stdout and stderr. */
static void run_as(const char *exe, char *const env[], int id, struct run_out *o)
{
    int po[2], pe[2];
    cr_assert(pipe(po) == 0 && pipe(pe) == 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        if (id >= 0 && (setgroups(0, NULL) || setgid((gid_t)id) || setuid((uid_t)id)))
            _exit(126);
        char *argv[] = {(char *)exe, NULL};
        execve(exe, argv, env);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    waitpid(pid, &o->status, 0);
    ssize_t n = read(po[0], o->out, sizeof(o->out) - 1);
    o->out[n > 0 ? n : 0] = '\0';
    n = read(pe[0], o->err, sizeof(o->err) - 1);
    o->err[n > 0 ? n : 0] = '\0';
    close(po[0]);
    close(pe[0]);
}

/* A directory on a filesystem that honours set-uid bits and runs programs. */
static void suid_dir(char *dir, size_t sz)
{
    const char *bases[] = {getenv("TMPDIR"), "/tmp", APH_LIBDIR};
    for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
        struct statvfs vfs;
        if (!bases[i] || statvfs(bases[i], &vfs) || (vfs.f_flag & (ST_NOSUID | ST_NOEXEC)))
            continue;
        snprintf(dir, sz, "%s/aphsecXXXXXX", bases[i]);
        if (mkdtemp(dir) && chmod(dir, 0755) == 0)
            return;
    }
    cr_skip_test("no directory without nosuid and noexec found");
}

static void copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    cr_assert(in >= 0 && out >= 0, "copy %s -> %s", from, to);
    char buf[65536];
    for (ssize_t n; (n = read(in, buf, sizeof(buf))) > 0;)
        cr_assert_eq(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
}

Test(hostile, at_secure_ignores_the_environment)
{
    if (APH_SANITIZED)
        cr_skip_test("sanitizer runtimes refuse to run set-uid");
    if (geteuid() != 0)
        cr_skip_test("not root: cannot make a set-uid root helper (CI runs the suite as root)");
    char dir[512], exe[600];
    suid_dir(dir, sizeof(dir));
    snprintf(exe, sizeof(exe), "%s/helper", dir);
    copy_file(APH_HELPER, exe);
    cr_assert_eq(chown(exe, 0, 0), 0);
    cr_assert_eq(chmod(exe, 0755), 0);

    char *env_off[] = {"ALTPATCH_OFF=1", NULL};
    char *env_dbg[] = {"ALTPATCH_DEBUG=1", "ALTPATCH_CLEARCPUID=fsgsbase,rdpid,popcnt,sse2", NULL};
    struct run_out ctl_off, ctl_dbg, off, dbg;
    /* Control: the same copy, not set-uid, honours the environment. */
    run_as(exe, env_off, 65534, &ctl_off);
    run_as(exe, env_dbg, 65534, &ctl_dbg);
    cr_assert_eq(chmod(exe, 04755), 0);
    run_as(exe, env_off, 65534, &off);
    run_as(exe, env_dbg, 65534, &dbg);
    unlink(exe);
    rmdir(dir);

    cr_assert(!(WIFEXITED(ctl_off.status) && WEXITSTATUS(ctl_off.status) >= 126),
              "uid 65534 could not run %s (exit %d): directory not traversable?", exe,
              WEXITSTATUS(ctl_off.status));
    cr_assert(strstr(ctl_off.out, "secure=0 patched=0"), "control OFF: %s%s", ctl_off.out,
              ctl_off.err);
    cr_assert(strstr(ctl_dbg.out, "secure=0 patched=1"), "control: %s", ctl_dbg.out);
    cr_assert(!strstr(ctl_dbg.out, "cleared=0"), "control CLEARCPUID not honoured: %s",
              ctl_dbg.out);
    cr_assert(strstr(ctl_dbg.err, "old_insn"), "control DEBUG printed no block: %s",
              ctl_dbg.err);

    cr_assert(strstr(off.out, "secure=1 "), "the copy did not run with AT_SECURE: %s%s",
              off.out, off.err);
    cr_assert(strstr(off.out, "patched=1"), "ALTPATCH_OFF honoured when AT_SECURE: %s",
              off.out);
    cr_assert(strstr(dbg.out, "secure=1 patched=1 cleared=0"),
              "ALTPATCH_CLEARCPUID honoured when AT_SECURE: %s", dbg.out);
    cr_assert(!strstr(dbg.err, "old_insn"), "ALTPATCH_DEBUG honoured when AT_SECURE: %s",
              dbg.err);
}
