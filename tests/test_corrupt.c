/* SPDX-License-Identifier: MIT */
/*
 * Hostile records (testdata/corrupt*.S, listed in testdata/README.md): each
 * corrupt site is refused with its own reason, and the module's executable
 * segments change only at the valid sites. The segments are copied from
 * memory after dlopen (and checked against the file) before the first apply.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ap_isolate.h"
#include "ap_warnlog.h"
#include <altpatch/altpatch.h>

struct expect {
    const char *rec; /* exported record symbol */
    int state;
    int reason;
};

static const struct expect corrupt_expect[] = {
    {"apfix_rec_valid_mov", ALTPATCH_SITE_PATCHED, ALTPATCH_REASON_NONE},
    {"apfix_rec_valid_call", ALTPATCH_SITE_PATCHED, ALTPATCH_REASON_NONE},
    {"apfix_rec_valid_not", ALTPATCH_SITE_ORIGINAL, ALTPATCH_REASON_NONE},
    {"apfix_rec_site_below", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_BOUNDS},
    {"apfix_rec_site_above", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_BOUNDS},
    {"apfix_rec_site_data", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_BOUNDS},
    {"apfix_rec_site_in_repl", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_BOUNDS},
    {"apfix_rec_site_past_text", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_BOUNDS},
    {"apfix_rec_repl_text", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_REPL_BOUNDS},
    {"apfix_rec_repl_past", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_REPL_BOUNDS},
    {"apfix_rec_too_long", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_REPL_TOO_LONG},
    {"apfix_rec_orig_bad", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_ORIG_UNDECODABLE},
    {"apfix_rec_repl_bad", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_REPL_UNDECODABLE},
    {"apfix_rec_cross", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_ORIG_CROSSES_END},
    {"apfix_rec_repl_cross", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_REPL_CROSSES_END},
    {"apfix_rec_rel8", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_RELOC_OVERFLOW},
    {"apfix_rec_feature", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_UNKNOWN_FEATURE},
    {"apfix_rec_empty", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_EMPTY_SITE},
    {"apfix_rec_overlap1", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_OVERLAP},
    {"apfix_rec_overlap2", ALTPATCH_SITE_REFUSED, ALTPATCH_REASON_SITE_OVERLAP},
};
#define NEXPECT (sizeof(corrupt_expect) / sizeof(corrupt_expect[0]))

#define MAXSEG 4
#define MAXSEGSZ (1 << 16)

/* A module's executable segments, copied before apply. */
struct segs {
    const char *name;
    uintptr_t addr[MAXSEG];
    size_t size[MAXSEG];
    uint64_t off[MAXSEG], filesz[MAXSEG];
    uint8_t *copy[MAXSEG];
    int n;
    char path[512];
};

static int find_segs(struct dl_phdr_info *info, size_t size, void *p)
{
    struct segs *s = p;
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, s->name))
        return 0;
    snprintf(s->path, sizeof(s->path), "%s", info->dlpi_name);
    for (int i = 0; i < info->dlpi_phnum && s->n < MAXSEG; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        s->addr[s->n] = info->dlpi_addr + ph->p_vaddr;
        s->size[s->n] = ph->p_memsz;
        s->off[s->n] = ph->p_offset;
        s->filesz[s->n] = ph->p_filesz;
        s->n++;
    }
    return 1;
}

/* Copy the segments from memory; returns how many bytes differ from the file. */
static long snapshot(struct segs *s, const char *name)
{
    memset(s, 0, sizeof(*s));
    s->name = name;
    dl_iterate_phdr(find_segs, s);
    if (s->n == 0)
        return -1;
    int fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -2;
    long diff = 0;
    for (int i = 0; i < s->n; i++) {
        s->copy[i] = malloc(s->size[i]);
        memcpy(s->copy[i], (const void *)s->addr[i], s->size[i]);
        uint8_t *file = calloc(1, s->size[i]);
        if (pread(fd, file, s->filesz[i], (off_t)s->off[i]) != (ssize_t)s->filesz[i])
            diff = -3;
        for (size_t b = 0; diff >= 0 && b < s->filesz[i]; b++)
            diff += file[b] != s->copy[i][b];
        free(file);
    }
    close(fd);
    return diff;
}

/* Bytes that differ from the snapshot outside [lo[k], hi[k]); and how many of the ranges changed. */
static long changed_outside(const struct segs *s, const uintptr_t *lo, const uintptr_t *hi, int nr,
                            int *ranges_changed)
{
    long outside = 0;
    *ranges_changed = 0;
    for (int i = 0; i < s->n; i++)
        for (size_t b = 0; b < s->size[i]; b++) {
            uintptr_t a = s->addr[i] + b;
            if (*(const uint8_t *)a == s->copy[i][b])
                continue;
            int in = 0;
            for (int k = 0; k < nr; k++)
                in |= a >= lo[k] && a < hi[k];
            outside += !in;
        }
    for (int k = 0; k < nr; k++) {
        for (int i = 0; i < s->n; i++)
            if (lo[k] >= s->addr[i] && hi[k] <= s->addr[i] + s->size[i] &&
                memcmp((const void *)lo[k], s->copy[i] + (lo[k] - s->addr[i]), hi[k] - lo[k]))
                (*ranges_changed)++;
    }
    return outside;
}

static uintptr_t rec_site(void *h, const char *sym)
{
    const uint8_t *rec = dlsym(h, sym);
    if (!rec)
        return 0;
    int32_t off;
    memcpy(&off, rec, 4);
    return (uintptr_t)rec + (intptr_t)off;
}

struct site_seen {
    int found, state, reason;
};

struct cres {
    int load_ok, apply_rc, apply2_rc;
    long file_diff[3];
    long outside[3], outside2;
    int ranges_changed;
    long val_before[3], val_after[3], bt_after, bv_after;
    struct site_seen seen[NEXPECT];
    int bt_logged, bv_logged;
    int bt_patched, bv_patched, bt_listed, bv_listed, bt_badreason, bv_badreason;
    char msg[256];
};

struct find {
    uintptr_t addr[NEXPECT];
    struct site_seen *seen;
    const char *module;
};

static int find_one(const struct altpatch_site_info *s, void *p)
{
    struct find *f = p;
    if (!strstr(s->module, f->module))
        return 0;
    for (size_t i = 0; i < NEXPECT; i++)
        if (f->addr[i] == s->addr) {
            f->seen[i].found++;
            f->seen[i].state = s->state;
            f->seen[i].reason = s->reason;
        }
    return 0;
}

struct modwalk {
    const char *module;
    int reason;
    int listed, patched, badreason;
};

static int modwalk_one(const struct altpatch_site_info *s, void *p)
{
    struct modwalk *w = p;
    if (!strstr(s->module, w->module))
        return 0;
    w->listed++;
    w->patched += s->state == ALTPATCH_SITE_PATCHED;
    w->badreason += s->state != ALTPATCH_SITE_REFUSED || s->reason != w->reason;
    return 0;
}

typedef long (*fn_t)(void);

static void body(void *out, void *ctx)
{
    struct cres *r = out;
    (void)ctx;
    void *h = dlopen(APFIX_CORRUPT_PATH, RTLD_NOW);
    void *hbt = dlopen(APFIX_BADTABLE_PATH, RTLD_NOW);
    void *hbv = dlopen(APFIX_BADVERSION_PATH, RTLD_NOW);
    if (!h || !hbt || !hbv) {
        snprintf(r->msg, sizeof(r->msg), "dlopen: %s", dlerror());
        return;
    }
    r->load_ok = 1;
    static struct segs sc, sbt, sbv;
    r->file_diff[0] = snapshot(&sc, "libapfix_corrupt.so");
    r->file_diff[1] = snapshot(&sbt, "libapfix_corrupt_badtable.so");
    r->file_diff[2] = snapshot(&sbv, "libapfix_corrupt_badversion.so");
    fn_t mov = (fn_t)dlsym(h, "apfix_valid_mov"), call = (fn_t)dlsym(h, "apfix_valid_call"),
         keep = (fn_t)dlsym(h, "apfix_valid_not");
    fn_t bt = (fn_t)dlsym(hbt, "apfix_bt_fn"), bv = (fn_t)dlsym(hbv, "apfix_bv_fn");
    r->val_before[0] = mov(), r->val_before[1] = call(), r->val_before[2] = keep();

    struct find f = {.seen = r->seen, .module = "libapfix_corrupt.so"};
    for (size_t i = 0; i < NEXPECT; i++)
        f.addr[i] = rec_site(h, corrupt_expect[i].rec);

    altpatch_set_print(ap_warn_capture);
    r->apply_rc = altpatch_apply();
    r->bt_logged = ap_warn_logged("libapfix_corrupt_badtable.so", ALTPATCH_REASON_BAD_TABLE);
    r->bv_logged = ap_warn_logged("libapfix_corrupt_badversion.so", ALTPATCH_REASON_BAD_VERSION);

    uintptr_t lo[2] = {f.addr[0], f.addr[1]}, hi[2] = {f.addr[0] + 5, f.addr[1] + 5};
    r->outside[0] = changed_outside(&sc, lo, hi, 2, &r->ranges_changed);
    int dummy;
    r->outside[1] = changed_outside(&sbt, lo, lo, 0, &dummy);
    r->outside[2] = changed_outside(&sbv, lo, lo, 0, &dummy);
    r->val_after[0] = mov(), r->val_after[1] = call(), r->val_after[2] = keep();
    r->bt_after = bt(), r->bv_after = bv();

    altpatch_site_foreach(find_one, &f);
    struct modwalk wbt = {"libapfix_corrupt_badtable", ALTPATCH_REASON_BAD_TABLE, 0, 0, 0};
    struct modwalk wbv = {"libapfix_corrupt_badversion", ALTPATCH_REASON_BAD_VERSION, 0, 0, 0};
    altpatch_site_foreach(modwalk_one, &wbt);
    altpatch_site_foreach(modwalk_one, &wbv);
    r->bt_listed = wbt.listed, r->bt_patched = wbt.patched, r->bt_badreason = wbt.badreason;
    r->bv_listed = wbv.listed, r->bv_patched = wbv.patched, r->bv_badreason = wbv.badreason;

    /* A second apply writes nothing more. */
    r->apply2_rc = altpatch_apply();
    r->outside2 = changed_outside(&sc, lo, hi, 2, &dummy);
}

static struct cres *run(void)
{
    struct cres *r = ap_isolated(sizeof(*r), body, NULL);
    cr_assert(r->load_ok, "%s", r->msg);
    cr_assert_eq(r->file_diff[0], 0, "corrupt module differs from its file before apply");
    cr_assert_eq(r->file_diff[1], 0);
    cr_assert_eq(r->file_diff[2], 0);
    cr_assert_eq(r->apply_rc, 0, "apply must process the modules and refuse sites, got %d",
                 r->apply_rc);
    return r;
}

Test(corrupt, only_valid_sites_change)
{
    struct cres *r = run();
    cr_assert_eq(r->outside[0], 0, "%ld byte(s) changed outside the valid sites", r->outside[0]);
    cr_assert_eq(r->ranges_changed, 2, "both valid sites must have been patched");
    cr_assert_eq(r->val_before[0], 1);
    cr_assert_eq(r->val_before[1], 10);
    cr_assert_eq(r->val_after[0], 2, "valid mov site not patched");
    cr_assert_eq(r->val_after[1], 20, "valid call site not patched (rel32 relocation)");
    cr_assert_eq(r->val_after[2], 3, "ALT_NOT(ALWAYS) site must stay original");
    cr_assert_eq(r->apply2_rc, 0);
    cr_assert_eq(r->outside2, 0, "second apply changed bytes");
}

Test(corrupt, each_site_refused_with_its_reason)
{
    struct cres *r = run();
    for (size_t i = 0; i < NEXPECT; i++) {
        const struct expect *e = &corrupt_expect[i];
        const struct site_seen *s = &r->seen[i];
        cr_expect_eq(s->found, 1, "%s: listed %d times by altpatch_site_foreach", e->rec,
                     s->found);
        cr_expect_eq(s->state, e->state, "%s: state %d, want %d", e->rec, s->state, e->state);
        cr_expect_eq(s->reason, e->reason, "%s: reason '%s', want '%s'", e->rec,
                     altpatch_strreason(s->reason), altpatch_strreason(e->reason));
    }
}

Test(corrupt, truncated_table_module_refused)
{
    struct cres *r = run();
    cr_assert_eq(r->outside[1], 0, "%ld byte(s) changed in the bad-table module", r->outside[1]);
    cr_assert_eq(r->bt_after, 1, "bad-table module's site was patched");
    cr_assert_eq(r->bt_patched, 0);
    cr_assert_eq(r->bt_badreason, 0, "bad-table sites must be refused with BAD_TABLE");
    cr_assert(r->bt_logged, "no warning naming the module and '%s'",
              altpatch_strreason(ALTPATCH_REASON_BAD_TABLE));
}

Test(corrupt, wrong_version_module_refused)
{
    struct cres *r = run();
    cr_assert_eq(r->outside[2], 0, "%ld byte(s) changed in the bad-version module", r->outside[2]);
    cr_assert_eq(r->bv_after, 1, "bad-version module's site was patched");
    cr_assert_eq(r->bv_patched, 0);
    cr_assert_eq(r->bv_badreason, 0, "bad-version sites must be refused with BAD_VERSION");
    cr_assert(r->bv_logged, "no warning naming the module and '%s'",
              altpatch_strreason(ALTPATCH_REASON_BAD_VERSION));
}
