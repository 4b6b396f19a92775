/* SPDX-License-Identifier: MIT */
/*
 * Pre-patched files (record format version 2): the image API writes a copy of
 * testdata/prepatch_fixture whose sites hold a profile's plan; the copy is
 * then run.
 *
 * Oracles: the plain fixture run the same way (a pre-patched copy must end
 * with exactly the bytes a plain program gets from apply, whatever profile it
 * was written for, and with the compiler's bytes after REVERT), the plain
 * file's own bytes, and the fixture's value checks (pthread_self,
 * sched_getcpu, the functions called). A copy made for another CPU is only
 * ever checked, never executed before apply: the fixture applies first.
 */
#include <criterion/criterion.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <altpatch/altpatch.h>
#include <altpatch/alternative.h>
#include <altpatch/image.h>

#include "ap_copyfile.h"
#include "pure.h"

/* The fixtures are built with this header: their format, and that format pre-patched. */
#define FIXTURE_FORMAT ALTPATCH_FORMAT_VERSION
#define FIXTURE_PREPATCHED (ALTPATCH_FORMAT_VERSION == ALTPATCH_FORMAT_COMPACT ? 4u : 2u)

#ifndef PREPATCH_FIXTURE
#error "PREPATCH_FIXTURE must be defined by tests/prepatch.cmake"
#endif
/* 1: the fixtures (PREPATCH_FIXTURE*, PREPATCH_LIB) carry the plan note
 * (test_prepatch_note); 0: built without it, as files before it. */
#ifndef PREPATCH_WITH_NOTE
#define PREPATCH_WITH_NOTE 0
#endif

static const char *const profiles[] = {"baseline", "amd-zen4", "intel-spr", "all", "host"};
#define NPROFILES (sizeof(profiles) / sizeof(profiles[0]))

static char tmpdir[64];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ap_prepatch.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", tmpdir);
}

/* Run "[env] path arg" with stdout into *out (malloc'ed) and stderr into *err; exit status. */
static int run(const char *env, const char *path, const char *arg, char **out, char **err)
{
    char cmd[1024], ef[128];
    snprintf(ef, sizeof(ef), "%s/stderr", tmpdir);
    snprintf(cmd, sizeof(cmd), "%s '%s' %s 2>'%s'", env ? env : "", path, arg, ef);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    size_t n;
    while ((n = fread(buf + len, 1, cap - 1 - len, p)) > 0) {
        len += n;
        if (len + 1 == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
    }
    buf[len] = '\0';
    int st = pclose(p);
    *out = buf;
    if (err) {
        FILE *f = fopen(ef, "r");
        char *e = calloc(1, 4096);
        cr_assert_not_null(e);
        if (f) {
            size_t k = fread(e, 1, 4095, f);
            e[k] = '\0';
            fclose(f);
        }
        *err = e;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The lines of @p out starting with @p word and a space (malloc'ed). */
static char *lines_of(const char *out, const char *word)
{
    char *r = calloc(1, strlen(out) + 1);
    cr_assert_not_null(r);
    size_t wl = strlen(word);
    for (const char *l = out; *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) + 1 : strlen(l);
        if (strncmp(l, word, wl) == 0 && l[wl] == ' ')
            strncat(r, l + wl, n - wl);
        l += n;
    }
    return r;
}

struct lines {
    char *buf;
    size_t len, cap;
    bool original; /* the original bytes, else current */
};

static int add_line(const struct altpatch_image_site *s, void *ctx)
{
    struct lines *l = ctx;
    const uint8_t *b = l->original ? s->original : s->current;
    cr_assert_not_null(b, "site %#llx outside the text", (unsigned long long)s->addr);
    if (l->cap - l->len < 600) {
        l->cap = l->cap * 2 + 4096;
        l->buf = realloc(l->buf, l->cap);
        cr_assert_not_null(l->buf);
    }
    l->len += (size_t)sprintf(l->buf + l->len, " %llx ", (unsigned long long)s->addr);
    for (unsigned i = 0; i < s->len; i++)
        l->len += (size_t)sprintf(l->buf + l->len, "%02x", b[i]);
    l->len += (size_t)sprintf(l->buf + l->len, "\n");
    return 0;
}

/* " ADDR HEX" lines of a file's original or current bytes, as lines_of(out, "site")
 * gives the fixture's "site ADDR HEX" lines. */
static char *file_sites(const char *path, bool original)
{
    struct altpatch_image *img;
    cr_assert_eq(altpatch_image_open(path, NULL, &img), 0, "open %s", path);
    struct lines l = {calloc(1, 1), 0, 1, original};
    cr_assert_eq(altpatch_image_site_foreach(img, add_line, &l), 0);
    altpatch_image_close(img);
    return l.buf;
}

/* Pre-patch @p src for @p profile into tmpdir; returns the path (static buffer). */
static const char *prepatch(const char *src, const char *profile)
{
    static char out[128];
    struct altpatch_features *fs = altpatch_features_profile(profile);
    cr_assert_not_null(fs, "profile %s", profile);
    struct altpatch_image *img;
    cr_assert_eq(altpatch_image_open(src, NULL, &img), 0);
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    snprintf(out, sizeof(out), "%s/%s", tmpdir, profile);
    struct altpatch_image_write_opts wo = {.sz = sizeof(wo), .profile = profile};
    cr_assert_eq(altpatch_image_write(img, out, &wo), 0);
    altpatch_image_close(img);
    altpatch_features_free(fs);
    return out;
}

struct cmp {
    unsigned sites, differ;
};

static int cmp_site(const struct altpatch_image_site *s, void *ctx)
{
    struct cmp *c = ctx;
    c->sites++;
    cr_assert_not_null(s->original);
    cr_assert_not_null(s->current);
    cr_assert_not_null(s->final);
    /* In the pre-patched file, planned for the profile it was written for:
     * it holds that plan, and its final bytes are that plan. */
    cr_assert_eq(memcmp(s->current, s->final, s->len), 0, "site %#llx does not hold the plan",
                 (unsigned long long)s->addr);
    c->differ += memcmp(s->current, s->original, s->len) != 0;
    return 0;
}

/* What altpatch_image_get_info() says of @p file. */
static struct altpatch_image_info image_info(const char *file)
{
    struct altpatch_image *img;
    cr_assert_eq(altpatch_image_open(file, NULL, &img), 0, "open %s", file);
    struct altpatch_image_info info = {.sz = sizeof(info)};
    cr_assert_eq(altpatch_image_get_info(img, &info), 0);
    altpatch_image_close(img);
    return info;
}

/* The format version the note of @p file says. */
static unsigned file_format(const char *file)
{
    return image_info(file).format_version;
}

static void check_written(const char *plain, const char *pre, const char *profile)
{
    struct altpatch_image *img;
    /* format 1 pre-patched is 2, format 3 pre-patched is 4 */
    unsigned want = file_format(plain) == ALTPATCH_FORMAT_KERNEL ? 2u : 4u;
    cr_assert_eq(altpatch_image_open(pre, NULL, &img), 0, "reopen %s", pre);
    struct altpatch_image_info info = {.sz = sizeof(info)};
    cr_assert_eq(altpatch_image_get_info(img, &info), 0);
    cr_assert_eq(info.format_version, want);
    cr_assert_str_eq(info.prepatched_profile, profile);
    cr_assert_eq(info.prepatched_planner, AP_PREPATCH_PLANNER, "planner version %u",
                 info.prepatched_planner);
    struct altpatch_features *fs = altpatch_features_profile(profile);
    const struct altpatch_features *rec = altpatch_image_prepatched_features(img);
    cr_assert_not_null(rec);
    for (unsigned id = 0; id < 32 * 32; id++)
        cr_assert_eq(altpatch_features_has(rec, id), altpatch_features_has(fs, id),
                     "recorded set differs from %s at feature %u", profile, id);
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    struct cmp c = {0};
    cr_assert_eq(altpatch_image_site_foreach(img, cmp_site, &c), 0);
    cr_assert_gt(c.sites, 2);
    altpatch_image_close(img);
    altpatch_features_free(fs);
    /* The originals it keeps are the plain file's bytes. */
    char *a = file_sites(plain, false), *b = file_sites(pre, true);
    cr_assert_str_eq(a, b, "originals kept in %s differ from %s", pre, plain);
    free(a);
    free(b);
}

/* Pre-patch @p plain for every profile; each copy converges under apply and reverts. */
static void each_profile(const char *plain)
{
    char *out0, *rev0;
    cr_assert_eq(run(NULL, plain, "apply", &out0, NULL), 0, "plain apply:\n%s", out0);
    cr_assert_eq(run(NULL, plain, "revert", &rev0, NULL), 0, "plain revert:\n%s", rev0);
    char *want_apply = lines_of(out0, "site"), *want_revert = lines_of(rev0, "site");
    char *orig = file_sites(plain, false);
    cr_assert_str_neq(orig, "", "no site lines in %s", plain);
    cr_assert_str_eq(want_revert, orig, "REVERT must restore the file's bytes");
    for (size_t i = 0; i < NPROFILES; i++) {
        const char *pre = prepatch(plain, profiles[i]);
        check_written(plain, pre, profiles[i]);
        char *out, *err;
        int st = run(NULL, pre, "apply", &out, &err);
        cr_assert_eq(st, 0, "%s apply -> %d:\n%s%s", profiles[i], st, out, err);
        char *got = lines_of(out, "site");
        cr_assert_str_eq(got, want_apply, "%s: apply did not converge to this CPU's plan",
                         profiles[i]);
        free(got);
        free(out);
        free(err);
        st = run(NULL, pre, "revert", &out, &err);
        cr_assert_eq(st, 0, "%s revert -> %d:\n%s%s", profiles[i], st, out, err);
        got = lines_of(out, "site");
        cr_assert_str_eq(got, orig, "%s: REVERT did not restore the compiler's bytes",
                         profiles[i]);
        free(got);
        free(out);
        free(err);
    }
    free(want_apply);
    free(want_revert);
    free(orig);
    free(out0);
    free(rev0);
}

TestSuite(prepatch, .init = setup, .fini = teardown, .timeout = 120);

/* A FIFO nobody writes: opened without waiting for a writer, refused by its type. */
Test(prepatch, image_open_does_not_wait_on_a_fifo)
{
    char fifo[128];
    snprintf(fifo, sizeof(fifo), "%s/fifo", tmpdir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    alarm(10); /* a blocking open() would end the test here */
    struct altpatch_image *img = NULL;
    int rc = altpatch_image_open(fifo, NULL, &img);
    alarm(0);
    cr_assert_lt(rc, 0, "a FIFO opened as an image: %d", rc);
    cr_assert_null(img);
}

/*
 * A copy whose section header names a byte at or past the end of the
 * section name table: the pre-patched copy's new section name goes there, so
 * that header would be read as the new section and the copy could not be
 * opened again. Refused (-ENOTSUP) before anything is written.
 */
Test(prepatch, write_refuses_a_name_past_the_name_table)
{
    char bad[128], out[128];
    snprintf(bad, sizeof(bad), "%s/badname", tmpdir);
    snprintf(out, sizeof(out), "%s/badname.out", tmpdir);
    cr_assert_eq(ap_copy_file(PREPATCH_FIXTURE, bad), 0);
    int fd = open(bad, O_RDWR);
    cr_assert_geq(fd, 0);
    Elf64_Ehdr eh;
    Elf64_Shdr ss, s1;
    cr_assert_eq(pread(fd, &eh, sizeof(eh), 0), (ssize_t)sizeof(eh));
    off_t at_ss = (off_t)(eh.e_shoff + eh.e_shstrndx * sizeof(ss));
    off_t at_s1 = (off_t)(eh.e_shoff + 1 * sizeof(s1));
    cr_assert_eq(pread(fd, &ss, sizeof(ss), at_ss), (ssize_t)sizeof(ss));
    cr_assert_eq(pread(fd, &s1, sizeof(s1), at_s1), (ssize_t)sizeof(s1));
    s1.sh_name = (Elf64_Word)ss.sh_size;
    cr_assert_eq(pwrite(fd, &s1, sizeof(s1), at_s1), (ssize_t)sizeof(s1));
    close(fd);
    struct altpatch_features *fs = altpatch_features_profile("amd-zen4");
    struct altpatch_image *img;
    cr_assert_eq(altpatch_image_open(bad, NULL, &img), 0);
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    struct altpatch_image_write_opts wo = {.sz = sizeof(wo), .profile = "amd-zen4"};
    cr_assert_eq(altpatch_image_write(img, out, &wo), -ENOTSUP);
    cr_assert_neq(access(out, F_OK), 0, "a copy was written");
    altpatch_image_close(img);
    altpatch_features_free(fs);
}

Test(prepatch, every_profile_converges_pie)
{
    each_profile(PREPATCH_FIXTURE);
}

/* A program with format-1 records (earlier headers, ALTPATCH_KERNEL_RECORDS):
 * written as format 2, converges and reverts like the format-3 one. */
Test(prepatch, every_profile_converges_format1)
{
    cr_assert_eq(file_format(PREPATCH_FIXTURE_FORMAT1), ALTPATCH_FORMAT_KERNEL);
    cr_assert_eq(file_format(PREPATCH_FIXTURE), FIXTURE_FORMAT);
    each_profile(PREPATCH_FIXTURE_FORMAT1);
}

Test(prepatch, every_profile_converges_nopie)
{
    each_profile(PREPATCH_FIXTURE_NOPIE);
}

/* A copy for this CPU runs its bytes without any apply. The "host" profile
 * is the host set without ALTPATCH_CLEARCPUID, so neither run inherits it
 * (the fixture checks its calls against altpatch_cpu_has(), which honours it). */
static void host_without_apply(const char *plain)
{
    const char *pre = prepatch(plain, "host");
    char *out, *err;
    int st = run("env -u ALTPATCH_CLEARCPUID ALTPATCH_OFF=1", pre, "noapply", &out, &err);
    cr_assert_eq(st, 0, "noapply -> %d:\n%s%s", st, out, err);
    char *got = lines_of(out, "site"), *want = file_sites(pre, false);
    cr_assert_str_eq(got, want, "memory must hold the file's pre-patched bytes");
    /* and they are the host's plan: the plain program's bytes after apply */
    char *out0;
    cr_assert_eq(run("env -u ALTPATCH_CLEARCPUID", plain, "apply", &out0, NULL), 0);
    char *applied = lines_of(out0, "site");
    cr_assert_str_eq(got, applied, "host copy differs from the host's apply");
    free(applied);
    free(out0);
    free(got);
    free(want);
    free(out);
    free(err);
}

Test(prepatch, host_copy_runs_without_apply_pie)
{
    host_without_apply(PREPATCH_FIXTURE);
}

Test(prepatch, host_copy_runs_without_apply_nopie)
{
    host_without_apply(PREPATCH_FIXTURE_NOPIE);
}

/* A shared library pre-patched for every profile: dlopen'ed, applied, reverted. */
Test(prepatch, shared_library_every_profile)
{
    for (size_t i = 0; i < NPROFILES; i++) {
        const char *pre = prepatch(PREPATCH_LIB, profiles[i]);
        char lib[160], args[256], *out, *err;
        snprintf(lib, sizeof(lib), "%s.so", pre);
        cr_assert_eq(rename(pre, lib), 0);
        check_written(PREPATCH_LIB, lib, profiles[i]);
        snprintf(args, sizeof(args), "dl '%s'", lib);
        int st = run(NULL, PREPATCH_FIXTURE, args, &out, &err);
        cr_assert_eq(st, 0, "%s: dl -> %d\n%s%s", profiles[i], st, out, err);
        free(out);
        free(err);
        if (strcmp(profiles[i], "host") == 0) {
            snprintf(args, sizeof(args), "dlnoapply '%s'", lib);
            st = run("env -u ALTPATCH_CLEARCPUID ALTPATCH_OFF=1", PREPATCH_FIXTURE, args, &out,
                     &err);
            cr_assert_eq(st, 0, "host: dlnoapply -> %d\n%s%s", st, out, err);
            free(out);
            free(err);
        }
    }
}

/* Pre-patching a pre-patched file starts from the originals it keeps. */
Test(prepatch, prepatch_again)
{
    char first[160];
    snprintf(first, sizeof(first), "%s", prepatch(PREPATCH_FIXTURE, "all"));
    char again[160];
    snprintf(again, sizeof(again), "%s/again", tmpdir);
    struct altpatch_image *img;
    struct altpatch_features *fs = altpatch_features_profile("baseline");
    cr_assert_eq(altpatch_image_open(first, NULL, &img), 0);
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    struct altpatch_image_write_opts wo = {.sz = sizeof(wo), .profile = "baseline"};
    cr_assert_eq(altpatch_image_write(img, again, &wo), 0);
    altpatch_image_close(img);
    altpatch_features_free(fs);
    const char *direct = prepatch(PREPATCH_FIXTURE, "baseline");
    char *a = file_sites(direct, false), *b = file_sites(again, false);
    char *c = file_sites(direct, true), *d = file_sites(again, true);
    cr_assert_str_eq(a, b, "re-pre-patched sites differ from a direct pre-patch");
    cr_assert_str_eq(c, d, "re-pre-patched originals differ");
    free(a);
    free(b);
    free(c);
    free(d);
}

/* Read a whole file. */
static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

struct first_changed {
    uint64_t addr;
    unsigned len;
    uint8_t orig[255];
};

static int find_changed(const struct altpatch_image_site *s, void *ctx)
{
    struct first_changed *f = ctx;
    if (memcmp(s->current, s->original, s->len) == 0)
        return 0;
    f->addr = s->addr;
    f->len = s->len;
    memcpy(f->orig, s->original, s->len);
    return 1;
}

/*
 * A pre-patched file whose site bytes do not match its record: the image API
 * refuses to open it, and the runtime refuses the module (which then runs
 * what the file holds: here the compiler's bytes, always correct).
 */
Test(prepatch, mismatched_record_refused)
{
    const char *pre = prepatch(PREPATCH_FIXTURE, "host");
    struct altpatch_image *img;
    cr_assert_eq(altpatch_image_open(pre, NULL, &img), 0);
    struct first_changed fc = {0};
    if (altpatch_image_site_foreach(img, find_changed, &fc) != 1) {
        altpatch_image_close(img);
        cr_skip_test("no site holds a replacement for this CPU");
    }
    altpatch_image_close(img);
    /* File offset of the site: the same bytes in the plain file. */
    size_t len, plen;
    uint8_t *b = slurp(pre, &len), *p = slurp(PREPATCH_FIXTURE, &plen);
    size_t off = 0;
    bool found = false;
    for (size_t i = 0; i + fc.len <= plen && i + fc.len <= len; i++)
        if (memcmp(p + i, fc.orig, fc.len) == 0 && memcmp(b + i, fc.orig, fc.len) != 0) {
            off = i;
            found = true;
            break;
        }
    cr_assert(found);
    memcpy(b + off, fc.orig, fc.len); /* put the original back behind the record's back */
    char bad[160];
    snprintf(bad, sizeof(bad), "%s/bad", tmpdir);
    int fd = open(bad, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, b, len), (ssize_t)len);
    close(fd);
    altpatch_print_fn old = altpatch_set_print(NULL);
    cr_assert_eq(altpatch_image_open(bad, NULL, &img), -EBADMSG);
    altpatch_set_print(old);
    char *out, *err;
    int st = run(NULL, bad, "apply", &out, &err);
    cr_assert_eq(st, 1, "a module with a mismatched record must be refused:\n%s", out);
    cr_assert(strstr(out, "refused"), "%s", out);
    cr_assert(strstr(err, "pre-patched file: originals not usable"), "%s", err);
    free(out);
    free(err);
    char args[256];
    snprintf(args, sizeof(args), "--check '%s'", bad);
    cr_assert_eq(run(NULL, ALTDUMP, args, &out, &err), 3, "%s%s", out, err);
    cr_assert(strstr(err, "does not hold the bytes"), "%s", err);
    free(out);
    free(err);
    free(b);
    free(p);
}

/* ------------------------------------------------------------------------- */
/* A copy pre-patched for the set the apply uses: settled without planning    */
/* ------------------------------------------------------------------------- */

/* The message of an apply that took a module as its file planned it. */
#define SETTLED_LOG "pre-patched for this feature set"

/* Pre-patch @p src for the set @p fs into tmpdir/@p name; the path (static buffer). */
static const char *prepatch_fs(const char *src, const struct altpatch_features *fs,
                               const char *name)
{
    static char out[160];
    struct altpatch_image *img;
    cr_assert_eq(altpatch_image_open(src, NULL, &img), 0);
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    snprintf(out, sizeof(out), "%s/%s", tmpdir, name);
    struct altpatch_image_write_opts wo = {.sz = sizeof(wo), .profile = name};
    cr_assert_eq(altpatch_image_write(img, out, &wo), 0);
    altpatch_image_close(img);
    return out;
}

/* The lines tagged @p tag of two runs' outputs are the same. */
static void same_lines(const char *out, const char *want, const char *tag)
{
    char *a = lines_of(out, tag), *b = lines_of(want, tag);
    cr_assert_str_eq(a, b, "%s lines differ", tag);
    free(a);
    free(b);
}

/* A counter of the "stats" line of @p out. */
static unsigned long long stat_of(const char *out, const char *name)
{
    const char *l = strstr(out, "\nstats ");
    cr_assert_not_null(l, "no stats line:\n%s", out);
    char key[32];
    snprintf(key, sizeof(key), " %s=", name);
    const char *k = strstr(l, key);
    cr_assert_not_null(k, "no %s in the stats line", name);
    return strtoull(k + strlen(key), NULL, 10);
}

/* Run the fixture @p prog with @p arg under @p env (ALTPATCH_CLEARCPUID not
 * inherited); exit status 0 asserted; its stdout (malloc'ed). */
static char *run_ok(const char *env, const char *prog, const char *arg)
{
    char e[256], *out, *err;
    snprintf(e, sizeof(e), "env -u ALTPATCH_CLEARCPUID %s", env ? env : "");
    int st = run(e, prog, arg, &out, &err);
    cr_assert_eq(st, 0, "%s %s %s -> %d:\n%s%s", env ? env : "", prog, arg, st, out, err);
    free(err);
    return out;
}

/*
 * @p prog run under @p env ("stats") is not settled from its file (@p why)
 * but planned: no site refused, something written where @p writes, and the
 * states and bytes of the plain program run under the same environment.
 * With @p by_note, on the fixtures with the plan note, the copy's note (as
 * altprepatch filled it: only the file's record was changed since) holds
 * against memory: its first apply settles from the note without reading the
 * record, with the plain program's states and bytes all the same.
 */
static void planned_like_plain_or_note(const char *env, const char *prog, const char *why,
                                       bool writes, bool by_note)
{
    char *want = run_ok(env, PREPATCH_FIXTURE, "stats");
    char *out = run_ok(env, prog, "stats");
    if (PREPATCH_WITH_NOTE && by_note)
        cr_assert(strstr(out, SETTLED_LOG), "not settled from its note:\n%s", out);
    else
        cr_assert(!strstr(out, SETTLED_LOG), "%s:\n%s", why, out);
    writes = writes && !(PREPATCH_WITH_NOTE && by_note);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    if (writes)
        cr_assert_gt(stat_of(out, "written"), 0, "%s", out);
    same_lines(out, want, "state");
    same_lines(out, want, "site");
    free(out);
    free(want);
}

static void planned_like_plain(const char *env, const char *prog, const char *why, bool writes)
{
    planned_like_plain_or_note(env, prog, why, writes, false);
}

/* The run @p out of a copy made for another set than the applied one is not
 * settled (@p why) but planned: something written, nothing refused, the
 * states and bytes of the plain program's run @p want. */
static void rewritten_like_plain(const char *out, const char *want, const char *why)
{
    cr_assert(!strstr(out, SETTLED_LOG), "%s:\n%s", why, out);
    cr_assert_gt(stat_of(out, "written"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    same_lines(out, want, "state");
    same_lines(out, want, "site");
}

/* The set the fixture's apply uses under ALTPATCH_CLEARCPUID=@p clear (NULL:
 * none): the host's, less that feature, as a test names it for itself. */
/* @p set with FSGSBASE toggled (a set that differs from it in one feature the
 * records name). */
static void toggle_fsgsbase(struct altpatch_features *set)
{
    unsigned fsgs = (unsigned)altpatch_feature_id("fsgsbase");
    if (altpatch_features_has(set, fsgs))
        altpatch_features_clear(set, fsgs);
    else
        altpatch_features_set(set, fsgs);
}

static struct altpatch_features *applied_set(const char *clear)
{
    struct altpatch_features *fs = altpatch_features_host();
    cr_assert_not_null(fs);
    if (clear)
        cr_assert_eq(altpatch_features_clear(fs, (unsigned)altpatch_feature_id(clear)), 0);
    return fs;
}

/* A copy of @p plain pre-patched for the applied set: tmpdir/@p name (prepatch_fs()'s buffer). */
static const char *applied_copy(const char *plain, const char *name)
{
    struct altpatch_features *fs = applied_set(NULL);
    const char *pre = prepatch_fs(plain, fs, name);
    altpatch_features_free(fs);
    return pre;
}

/*
 * A copy of @p plain pre-patched for the set its apply uses (the host's
 * less @p clear, applied with ALTPATCH_CLEARCPUID=@p clear): its first apply
 * takes every site as the file planned it -- the message, nothing written,
 * memory the same before and after, byte for byte, and the file's bytes --
 * and lists the states, entries and bytes the planner gives the plain program
 * under the same set. The same copy made for a set that differs in one
 * feature the records name (FSGSBASE) goes through the planner: it is
 * rewritten to exactly the plain program's bytes and states.
 */
static void settles(const char *plain, const char *clear)
{
    char env[64] = "";
    if (clear)
        snprintf(env, sizeof(env), "ALTPATCH_CLEARCPUID=%s", clear);
    struct altpatch_features *fs = applied_set(clear);
    char pre[160];
    snprintf(pre, sizeof(pre), "%s", prepatch_fs(plain, fs, "same"));

    char *want = run_ok(env, plain, "stats");
    char *want_states = lines_of(want, "state"), *want_sites = lines_of(want, "site");
    cr_assert(!strstr(want, SETTLED_LOG), "a plain program has no file plan:\n%s", want);

    char *out = run_ok(env, pre, "stats");
    cr_assert(strstr(out, SETTLED_LOG), "the copy for the applied set was planned:\n%s", out);
    cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "syscalls"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "patched"), stat_of(want, "patched"), "%s\n%s", out, want);
    cr_assert_eq(stat_of(out, "unchanged"), stat_of(out, "seen"), "%s", out);
    char *before = lines_of(out, "before"), *after = lines_of(out, "site");
    char *file_b = file_sites(pre, false);
    cr_assert_str_eq(before, after, "memory changed by a settled apply");
    cr_assert_str_eq(before, file_b, "memory does not hold the file's bytes");
    char *states = lines_of(out, "state");
    cr_assert_str_eq(states, want_states, "settled states differ from the planner's");
    cr_assert_str_eq(after, want_sites, "settled bytes differ from the planner's");
    free(before);
    free(after);
    free(file_b);
    free(states);
    free(out);

    /* one feature the records name differs: the planner decides */
    toggle_fsgsbase(fs);
    snprintf(pre, sizeof(pre), "%s", prepatch_fs(plain, fs, "other"));
    out = run_ok(env, pre, "stats");
    cr_assert(!strstr(out, SETTLED_LOG), "a copy for another set was settled:\n%s", out);
    cr_assert_gt(stat_of(out, "written"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    states = lines_of(out, "state");
    after = lines_of(out, "site");
    cr_assert_str_eq(states, want_states, "planned states differ from the plain program's");
    cr_assert_str_eq(after, want_sites, "planned bytes differ from the plain program's");
    free(states);
    free(after);
    free(out);
    free(want);
    free(want_states);
    free(want_sites);
    altpatch_features_free(fs);
}

Test(prepatch, settles_for_the_applied_set_pie)
{
    settles(PREPATCH_FIXTURE, NULL);
}

Test(prepatch, settles_for_the_applied_set_nopie)
{
    settles(PREPATCH_FIXTURE_NOPIE, NULL);
}

Test(prepatch, settles_for_the_applied_set_format1)
{
    settles(PREPATCH_FIXTURE_FORMAT1, NULL);
}

/*
 * Dry runs leave a pre-patched module's file choices to the next apply: after
 * one for a set that differs in FSGSBASE (it plans the module, and reports
 * that plan) and one for the applied set, the apply settles from the file
 * exactly as without them -- the message, nothing written, no system call,
 * memory the same before and after, and the plain program's states and bytes.
 * A copy made for the set that differs in FSGSBASE: the dry run for the
 * applied set plans it, and the apply after it compares the file's choices
 * (not that dry run's plan) with what it selects: planned and rewritten to
 * the plain program's bytes.
 */
Test(prepatch, settles_after_dry_runs)
{
    struct altpatch_features *fs = applied_set(NULL);
    const char *pre = prepatch_fs(PREPATCH_FIXTURE, fs, "same");
    char *want = run_ok(NULL, PREPATCH_FIXTURE, "stats");
    char *out = run_ok(NULL, pre, "drystats");
    cr_assert(strstr(out, SETTLED_LOG), "planned after dry runs:\n%s", out);
    cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "syscalls"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "patched"), stat_of(want, "patched"), "%s\n%s", out, want);
    same_lines(out, want, "state");
    same_lines(out, want, "site");
    char *before = lines_of(out, "before"), *after = lines_of(out, "site");
    cr_assert_str_eq(before, after, "memory changed by a settled apply");
    free(before);
    free(after);
    free(out);

    toggle_fsgsbase(fs);
    pre = prepatch_fs(PREPATCH_FIXTURE, fs, "other");
    out = run_ok(NULL, pre, "drystats");
    rewritten_like_plain(out, want, "settled on a dry run's plan");
    free(out);
    free(want);
    altpatch_features_free(fs);
}

/*
 * The main program's file is read through /proc/self/exe (the file mapped):
 * a copy replaced on disk after it started (by the plain program, or by a
 * copy for another set) still settles, without a warning; one started by a
 * relative path too.
 */
Test(prepatch, settles_when_its_path_changed)
{
    struct altpatch_features *fs = applied_set(NULL);
    char same[160], other[160], plain[160], args[400];
    snprintf(same, sizeof(same), "%s", prepatch_fs(PREPATCH_FIXTURE, fs, "same"));
    struct altpatch_features *fo = altpatch_features_dup(fs);
    toggle_fsgsbase(fo);
    snprintf(other, sizeof(other), "%s", prepatch_fs(PREPATCH_FIXTURE, fo, "other"));
    snprintf(plain, sizeof(plain), "%s/plain", tmpdir);
    cr_assert_eq(ap_copy_file(PREPATCH_FIXTURE, plain), 0);
    char *want = run_ok(NULL, PREPATCH_FIXTURE, "stats");
    char *want_states = lines_of(want, "state"), *want_sites = lines_of(want, "site");
    const char *by[] = {plain, other};
    for (int k = 0; k < 2; k++) {
        char prog[200];
        snprintf(prog, sizeof(prog), "%s/run%d", tmpdir, k);
        cr_assert_eq(ap_copy_file(same, prog), 0);
        cr_assert_eq(chmod(prog, 0755), 0);
        snprintf(args, sizeof(args), "replaced '%s'", by[k]);
        char *out = run_ok(NULL, prog, args);
        cr_assert(strstr(out, SETTLED_LOG), "replaced by %s:\n%s", by[k], out);
        cr_assert(!strstr(out, "not usable"), "%s", out);
        cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
        char *a = lines_of(out, "state"), *b = lines_of(out, "site");
        cr_assert_str_eq(a, want_states);
        cr_assert_str_eq(b, want_sites);
        free(a);
        free(b);
        free(out);
    }
    /* started by a relative path */
    char e[400], *out, *err;
    snprintf(e, sizeof(e), "cd '%s' && env -u ALTPATCH_CLEARCPUID", tmpdir);
    cr_assert_eq(run(e, "./same", "stats", &out, &err), 0, "%s%s", out, err);
    free(err);
    cr_assert(strstr(out, SETTLED_LOG), "%s", out);
    cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
    free(out);
    free(want);
    free(want_states);
    free(want_sites);
    altpatch_features_free(fo);
    altpatch_features_free(fs);
}

/* ALTPATCH_CLEARCPUID is part of the applied set: a copy made for the host
 * less FSGSBASE settles under ALTPATCH_CLEARCPUID=fsgsbase. */
Test(prepatch, settles_under_clearcpuid)
{
    settles(PREPATCH_FIXTURE, "fsgsbase");
}

/* The copy for the applied set run plainly under ALTPATCH_CLEARCPUID that
 * clears a feature the file's set has: the planner decides. */
Test(prepatch, clearcpuid_differs_from_the_file)
{
    struct altpatch_features *fs = applied_set(NULL);
    unsigned fsgs = (unsigned)altpatch_feature_id("fsgsbase");
    altpatch_features_set(fs, fsgs); /* the file's set has it, the apply's not */
    const char *pre = prepatch_fs(PREPATCH_FIXTURE, fs, "with");
    planned_like_plain("ALTPATCH_CLEARCPUID=fsgsbase", pre, "settled on another set's file", true);
    altpatch_features_free(fs);
}

/*
 * A copy of @p plain for the applied set, settled: REVERT writes the
 * compiler's bytes back, byte for byte; the next apply brings the file's
 * bytes back, as the planner's: the plain program's states, bytes and
 * writes, nothing refused, the file always usable.
 */
static void settled_reverts(const char *plain)
{
    const char *pre = applied_copy(plain, "same");
    char *want = run_ok(NULL, plain, "again");
    char *out = run_ok(NULL, pre, "again");
    cr_assert(strstr(out, SETTLED_LOG), "%s", out);
    cr_assert(!strstr(out, "not usable"), "%s", out);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    char *orig_l = file_sites(plain, false);
    char *rev = lines_of(out, "reverted");
    cr_assert_str_eq(rev, orig_l, "REVERT after a settled apply did not restore the originals");
    char *file_l = file_sites(pre, false);
    char *after = lines_of(out, "site"), *want_sites = lines_of(want, "site");
    cr_assert_str_eq(after, file_l, "the apply after REVERT did not bring the file's bytes back");
    cr_assert_str_eq(after, want_sites);
    same_lines(out, want, "state");
    cr_assert_eq(stat_of(out, "written"), stat_of(want, "written"), "%s\n%s", out, want);
    free(orig_l);
    free(rev);
    free(file_l);
    free(after);
    free(want_sites);
    free(out);
    free(want);
}

/* After a settled apply: REVERT writes the compiler's bytes back, byte for
 * byte; the next apply brings the file's bytes back, as the planner's. */
Test(prepatch, settled_reverts_and_applies_again)
{
    settled_reverts(PREPATCH_FIXTURE);
}

/* Copy @p src to @p dst with the first site's `chosen` in its section of
 * originals set to 99 (header 240 bytes, then the record's field at +12). */
static void bad_choice_copy(const char *src, const char *dst)
{
    size_t len;
    uint8_t *b = slurp(src, &len);
    uint8_t *hdr = memmem(b, len, "ALTPREP1", 8);
    cr_assert_not_null(hdr);
    cr_assert_lt((size_t)(hdr - b) + 240 + 16, len);
    int32_t bad = 99;
    memcpy(hdr + 240 + 12, &bad, 4);
    int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, b, len), (ssize_t)len);
    close(fd);
    free(b);
}

/*
 * A file whose first site names an entry its site does not have: none of its
 * choices is taken. A library so made is listed as its original entries
 * (state ORIGINAL, chosen -1, memory's bytes) before its first apply; the
 * planner then decides, and a program ends with the plain program's bytes
 * and states. With the plan note (test_prepatch_note) the program's first
 * apply settles from the note, which still holds (only the record was
 * changed): the record is read later, for the site list, which then keeps
 * that apply's states.
 */
Test(prepatch, bad_choice_is_planned)
{
    char badf[160];
    snprintf(badf, sizeof(badf), "%s/badchoice", tmpdir);
    bad_choice_copy(applied_copy(PREPATCH_FIXTURE, "same"), badf);
    planned_like_plain_or_note(NULL, badf, "a bad choice was taken", false, true);

    char lib[200], args[420];
    snprintf(lib, sizeof(lib), "%s/badchoice.so", tmpdir);
    bad_choice_copy(applied_copy(PREPATCH_LIB, "lib"), lib);
    snprintf(args, sizeof(args), "dllist '%s'", lib);
    char *out = run_ok(NULL, PREPATCH_FIXTURE, args);
    char *mid = strstr(out, "\napplied\n");
    cr_assert_not_null(mid, "%s", out);
    mid[1] = '\0';
    char *before = lines_of(out, "state");
    cr_assert_str_neq(before, "");
    /* " ADDR 0 -1 0 CURRENT ORIGINAL" */
    for (char *l = before; *l; l = strchr(l, '\n') + 1)
        cr_assert_eq(strncmp(strchr(l + 1, ' '), " 0 -1 0 ", 8), 0,
                     "a site of a file with a bad choice listed as: %s", l);
    cr_assert(!strstr(mid + 2, SETTLED_LOG), "%s", mid + 2);
    cr_assert_eq(stat_of(mid + 2, "refused"), 0, "%s", mid + 2);
    free(before);
    free(out);
}

/*
 * An apply that settles every module from its file writes nothing, so it does
 * not need the process to be single-threaded: with a second thread running
 * and live patching refused, it returns 0 (nothing written, the live
 * protocol not used); the plain program's apply returns -EBUSY, and a copy
 * made for another set, which must write, too.
 */
Test(prepatch, settled_with_another_thread)
{
    char *want = run_ok(NULL, PREPATCH_FIXTURE, "thread");
    cr_assert(strstr(want, "\nrc -16\n") || strncmp(want, "rc -16\n", 7) == 0,
              "the plain program's apply with a thread running: %s", want);
    struct altpatch_features *fs = applied_set(NULL);
    const char *pre = prepatch_fs(PREPATCH_FIXTURE, fs, "same");
    char *out = run_ok(NULL, pre, "thread");
    cr_assert(strstr(out, "rc 0\n"), "%s", out);
    cr_assert(strstr(out, SETTLED_LOG), "%s", out);
    cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "syscalls"), 0, "%s", out);
    free(out);
    toggle_fsgsbase(fs);
    pre = prepatch_fs(PREPATCH_FIXTURE, fs, "other");
    out = run_ok(NULL, pre, "thread");
    cr_assert(strstr(out, "rc -16\n"), "a copy for another set must write: %s", out);
    free(out);
    free(want);
    altpatch_features_free(fs);
}

/*
 * The section of originals of a file, edited: header 240 bytes (nsites at
 * +8), then per site u64 address, u8 length L, 3 zero bytes, s32 entry
 * written, L bytes original, L bytes written.
 */
struct orig_site {
    uint8_t *rec; /* the record in the file's bytes */
    unsigned len;
    int32_t chosen;
    uint8_t *orig, *written;
};

/* The file @p path read whole (*@p buf, *@p len) and its @p max first site
 * records; their number. */
static size_t orig_sites(const char *path, uint8_t **buf, size_t *len, struct orig_site *s,
                         size_t max)
{
    *buf = slurp(path, len);
    uint8_t *hdr = memmem(*buf, *len, "ALTPREP1", 8);
    cr_assert_not_null(hdr, "%s has no section of originals", path);
    uint32_t n;
    memcpy(&n, hdr + 8, 4);
    cr_assert_leq(n, max);
    uint8_t *p = hdr + 240, *end = *buf + *len;
    for (size_t i = 0; i < n; i++) {
        cr_assert_leq(p + 16, end);
        s[i].rec = p;
        s[i].len = p[8];
        memcpy(&s[i].chosen, p + 12, 4);
        s[i].orig = p + 16;
        s[i].written = p + 16 + s[i].len;
        p += 16 + 2 * (size_t)s[i].len;
        cr_assert_leq(p, end);
    }
    return n;
}

static void set_chosen(struct orig_site *s, int32_t chosen)
{
    memcpy(s->rec + 12, &chosen, 4);
    s->chosen = chosen;
}

static void write_file(const char *path, const uint8_t *b, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    cr_assert_geq(fd, 0, "%s", path);
    cr_assert_eq(write(fd, b, len), (ssize_t)len);
    cr_assert_eq(close(fd), 0);
}

#define MAX_SITES 64

/*
 * The main program's originals and choices come from the file mapped, never
 * from the path it was started by: a program whose start path names, by its
 * first apply, a copy that agrees with memory on table, sites and written
 * bytes but lies about the rest is applied and reverted as the file mapped
 * says. Forged originals (ud2, int3): REVERT writes the compiler's bytes.
 * Forged choices (those a copy for the applied set makes, in a copy made for
 * a set that differs in FSGSBASE): the planner decides, and the program ends
 * with the plain program's bytes and states.
 */
Test(prepatch, start_path_not_believed)
{
    struct altpatch_features *fs = applied_set(NULL);
    char same[160], forged[200], prog[200], args[420];
    snprintf(same, sizeof(same), "%s", prepatch_fs(PREPATCH_FIXTURE, fs, "same"));
    static struct orig_site s[MAX_SITES];
    uint8_t *b;
    size_t len, n = orig_sites(same, &b, &len, s, MAX_SITES);
    cr_assert_gt(n, 2);
    for (size_t i = 0; i < n; i++) {
        memset(s[i].orig, 0xcc, s[i].len);
        if (s[i].len >= 2)
            s[i].orig[0] = 0x0f, s[i].orig[1] = 0x0b; /* ud2 */
    }
    snprintf(forged, sizeof(forged), "%s/forged-orig", tmpdir);
    write_file(forged, b, len);
    free(b);
    snprintf(prog, sizeof(prog), "%s/prog-orig", tmpdir);
    cr_assert_eq(ap_copy_file(same, prog), 0);
    cr_assert_eq(chmod(prog, 0755), 0);
    snprintf(args, sizeof(args), "replacedagain '%s'", forged);
    char *out = run_ok(NULL, prog, args);
    char *orig_l = file_sites(PREPATCH_FIXTURE, false);
    char *rev = lines_of(out, "reverted");
    cr_assert_str_eq(rev, orig_l, "REVERT wrote originals read by the start path:\n%s", out);
    free(rev);
    free(orig_l);
    free(out);

    /* choices: a copy for the other set, its choices those of the applied set */
    char *want = run_ok(NULL, PREPATCH_FIXTURE, "stats");
    char *want_states = lines_of(want, "state"), *want_sites = lines_of(want, "site");
    struct altpatch_features *fo = altpatch_features_dup(fs);
    toggle_fsgsbase(fo);
    char other[160];
    snprintf(other, sizeof(other), "%s", prepatch_fs(PREPATCH_FIXTURE, fo, "other"));
    static struct orig_site so[MAX_SITES];
    uint8_t *bo;
    size_t lo, no = orig_sites(other, &bo, &lo, so, MAX_SITES);
    cr_assert_eq(no, n);
    n = orig_sites(same, &b, &len, s, MAX_SITES);
    size_t forged_n = 0;
    for (size_t i = 0; i < n; i++) {
        forged_n += so[i].chosen != s[i].chosen;
        set_chosen(&so[i], s[i].chosen);
    }
    cr_assert_gt(forged_n, 0, "the two sets choose alike");
    snprintf(forged, sizeof(forged), "%s/forged-chosen", tmpdir);
    write_file(forged, bo, lo);
    free(b);
    free(bo);
    snprintf(prog, sizeof(prog), "%s/prog-chosen", tmpdir);
    cr_assert_eq(ap_copy_file(other, prog), 0);
    cr_assert_eq(chmod(prog, 0755), 0);
    snprintf(args, sizeof(args), "replaced '%s'", forged);
    out = run_ok(NULL, prog, args);
    cr_assert(!strstr(out, SETTLED_LOG), "settled on choices read by the start path:\n%s", out);
    cr_assert_gt(stat_of(out, "written"), 0, "%s", out);
    char *a = lines_of(out, "state"), *c = lines_of(out, "site");
    cr_assert_str_eq(a, want_states);
    cr_assert_str_eq(c, want_sites);
    free(a);
    free(c);
    free(out);
    free(want);
    free(want_states);
    free(want_sites);
    altpatch_features_free(fo);
    altpatch_features_free(fs);
}

/*
 * A site the file says kept its original (entry -1) must still hold that
 * original: a copy made for the applied set plus FSGSBASE, whose sites that
 * only FSGSBASE decides are marked as kept (-1, what the applied set picks)
 * while they hold FSGSBASE's bytes, is planned, not settled, and ends with
 * the plain program's bytes and states.
 */
Test(prepatch, kept_original_not_in_memory_is_planned)
{
    const char *env = "ALTPATCH_CLEARCPUID=fsgsbase";
    struct altpatch_features *fs = applied_set("fsgsbase");
    char without[160], with[160], bad[200];
    snprintf(without, sizeof(without), "%s", prepatch_fs(PREPATCH_FIXTURE, fs, "without"));
    unsigned fsgs = (unsigned)altpatch_feature_id("fsgsbase");
    cr_assert_eq(altpatch_features_set(fs, fsgs), 0);
    snprintf(with, sizeof(with), "%s", prepatch_fs(PREPATCH_FIXTURE, fs, "with"));
    static struct orig_site sw[MAX_SITES], so[MAX_SITES];
    uint8_t *bw, *bo;
    size_t lw, lo, n = orig_sites(with, &bw, &lw, sw, MAX_SITES);
    cr_assert_eq(orig_sites(without, &bo, &lo, so, MAX_SITES), n);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (sw[i].chosen == so[i].chosen)
            continue;
        cr_assert_eq(so[i].chosen, -1, "site %zu: an entry without FSGSBASE", i);
        cr_assert_neq(memcmp(sw[i].written, sw[i].orig, sw[i].len), 0);
        set_chosen(&sw[i], -1);
        kept++;
    }
    cr_assert_gt(kept, 0, "no site depends on FSGSBASE");
    snprintf(bad, sizeof(bad), "%s/kept", tmpdir);
    write_file(bad, bw, lw);
    free(bw);
    free(bo);
    planned_like_plain(env, bad, "settled while memory differs from the originals", true);
    altpatch_features_free(fs);
}

/*
 * A copy for the applied set with its section's planner version set to
 * @p planner and, when @p flip, the last written byte of its first site that
 * holds a replacement changed in both the text and the record (the choice
 * kept): what another planner (other padding) would have written. Into
 * tmpdir/@p name; the path (static buffer).
 */
static const char *other_planner_copy(const char *name, uint32_t planner, bool flip)
{
    static char dst[200];
    char same[160];
    snprintf(same, sizeof(same), "%s", applied_copy(PREPATCH_FIXTURE, "same"));
    static struct orig_site s[MAX_SITES];
    uint8_t *b;
    size_t len, n = orig_sites(same, &b, &len, s, MAX_SITES);
    uint8_t *hdr = memmem(b, len, "ALTPREP1", 8);
    uint32_t was;
    memcpy(&was, hdr + 12, 4);
    cr_assert_eq(was, AP_PREPATCH_PLANNER, "the writer records this library's planner");
    memcpy(hdr + 12, &planner, 4);
    if (flip) {
        size_t plen, k, off = 0;
        uint8_t *p = slurp(PREPATCH_FIXTURE, &plen);
        /* the first site holding a replacement found once in the text: its
         * bytes there, and the plain file's original at the same offset */
        for (k = 0; k < n; k++) {
            if (s[k].chosen < 0 || !memcmp(s[k].written, s[k].orig, s[k].len))
                continue;
            size_t found = 0;
            for (size_t i = 0; i + s[k].len <= plen && i + s[k].len <= len; i++)
                if (!memcmp(b + i, s[k].written, s[k].len) &&
                    !memcmp(p + i, s[k].orig, s[k].len)) {
                    off = i;
                    found++;
                }
            if (found == 1)
                break;
        }
        cr_assert_lt(k, n, "no site holds a replacement found once in the text");
        b[off + s[k].len - 1] ^= 0x40;
        s[k].written[s[k].len - 1] ^= 0x40;
        free(p);
    }
    snprintf(dst, sizeof(dst), "%s/%s", tmpdir, name);
    write_file(dst, b, len);
    free(b);
    return dst;
}

/*
 * A file whose section records another planner version (0: written before
 * the version was recorded; one above this library's): its bytes are not
 * taken as this library's plan, whatever its choices. Planned, not settled;
 * it ends with the plain program's states and bytes. With the plan note
 * (only the record changed) the first apply settles from the note: the
 * record is not read then.
 */
Test(prepatch, other_planner_version_is_planned)
{
    const uint32_t versions[] = {0, AP_PREPATCH_PLANNER + 1};
    for (size_t v = 0; v < sizeof(versions) / sizeof(versions[0]); v++)
        planned_like_plain_or_note(
            NULL, other_planner_copy(v ? "newer" : "older", versions[v], false),
            v ? "settled on a newer planner's file" : "settled on an older file", false, true);
}

/*
 * Another planner's bytes for the same choices (one written byte changed in
 * the text and in the record, version 0): the apply plans the module and
 * writes this library's bytes at that site; nothing is listed with bytes
 * other than the plain program's. (A file of this library's version is
 * believed for its written bytes, as for its originals: docs/hardening.md.)
 */
Test(prepatch, other_planner_bytes_are_planned)
{
    planned_like_plain(NULL, other_planner_copy("flipped", 0, true),
                       "settled on another planner's bytes", true);
}

/*
 * A REVERT writes even where the file chose what the applied set selects:
 * as the first call of a copy for the applied set, with a second thread
 * running and live patching refused, it returns -EBUSY and writes nothing
 * (memory keeps the file's bytes).
 */
Test(prepatch, revert_with_another_thread_busy)
{
    const char *pre = applied_copy(PREPATCH_FIXTURE, "same");
    char *out = run_ok(NULL, pre, "threadrevert");
    cr_assert(strstr(out, "\nrc -16\n") || strncmp(out, "rc -16\n", 7) == 0,
              "a REVERT with another thread running and live patching refused:\n%s", out);
    char *file_l = file_sites(pre, false);
    char *mem = lines_of(out, "site");
    cr_assert_str_eq(mem, file_l, "a refused REVERT changed memory");
    free(mem);
    free(file_l);
    free(out);
}

/*
 * A copy of the library @p plain pre-patched for the applied set, named as
 * a library (NAME.so, into @p lib of @p size bytes).
 */
static void lib_copy(const char *plain, char *lib, size_t size)
{
    const char *pre = applied_copy(plain, "lib");
    snprintf(lib, size, "%s.so", pre);
    cr_assert_eq(rename(pre, lib), 0);
}

/*
 * The fixture in @p mode on the library @p lib (a FIFO at its path while
 * nobody writes it, at some point), under a watchdog: no apply blocked,
 * exit status 0, "rc 0"; its stdout.
 */
static char *run_lib_fifo(const char *mode, const char *lib)
{
    char args[420], *out, *err;
    snprintf(args, sizeof(args), "%s '%s'", mode, lib);
    int st = run("env -u ALTPATCH_CLEARCPUID timeout -k 2 30", PREPATCH_FIXTURE, args, &out,
                 &err);
    cr_assert(st != 124 && st != 128 + 9, "an apply blocked on a FIFO:\n%s%s", out, err);
    cr_assert_eq(st, 0, "%s -> %d:\n%s%s", mode, st, out, err);
    cr_assert(strstr(out, "rc 0\n"), "%s", out);
    free(err);
    return out;
}

/*
 * The "state" lines of @p out ("ADDR STATE CHOSEN REASON CURRENT ORIGINAL"),
 * at least one, as " ADDR BYTES" lines (malloc'ed): each site's current
 * bytes, or with @p original its original ones. Every site is REFUSED for
 * @p refused, or, where @p refused is negative, not REFUSED.
 */
static char *state_bytes(const char *out, bool original, int refused)
{
    char *states = lines_of(out, "state"), *list = calloc(1, strlen(states) + 1);
    cr_assert_not_null(list);
    cr_assert_str_neq(states, "", "%s", out);
    for (char *l = states; *l;) {
        char addr[32], cur[600], orig[600];
        int state, why;
        int n = sscanf(l, " %31s %d %*d %d %599s %599s", addr, &state, &why, cur, orig);
        cr_assert_geq(n, original ? 5 : 4, "%s", l);
        if (refused < 0) {
            cr_assert_neq(state, ALTPATCH_SITE_REFUSED, "%s", l);
        } else {
            cr_assert_eq(state, ALTPATCH_SITE_REFUSED, "%s", l);
            cr_assert_eq(why, refused, "%s", l);
        }
        sprintf(list + strlen(list), " %s %s\n", addr, original ? orig : cur);
        l = strchr(l, '\n') + 1;
    }
    free(states);
    return list;
}

/* Every site of @p out REFUSED for @p reason, holding the bytes @p want
 * lists (" ADDR BYTES" lines; @p what: what differs otherwise). */
static void refused_holding(const char *out, int reason, const char *want, const char *what)
{
    char *mem = state_bytes(out, false, reason);
    cr_assert_str_eq(mem, want, "%s:\n%s", what, out);
    free(mem);
}

/*
 * A library whose path names a FIFO by its first apply (nobody writes it):
 * the file is not read (it would block), the module is refused as one whose
 * file is unreadable, and keeps the bytes it runs; the apply returns at once
 * (the run is under a watchdog).
 */
Test(prepatch, library_path_fifo_refused)
{
    char lib[200];
    lib_copy(PREPATCH_LIB, lib, sizeof(lib));
    char *file_l = file_sites(lib, false);
    char *out = run_lib_fifo("dlfifo", lib);
    cr_assert(strstr(out, "not a regular file"), "%s", out);
    cr_assert_gt(stat_of(out, "refused"), 0, "%s", out);
    /* the library's sites: refused, holding the file's bytes */
    refused_holding(out, ALTPATCH_REASON_BAD_TABLE, file_l,
                    "the refused library's memory is not its file's bytes");
    free(file_l);
    free(out);
}

/*
 * A library pre-patched for the applied set, loaded after an apply: before
 * its first apply the site list shows the file's choices and memory's bytes
 * (the planner's states for the plain library); its apply then writes
 * nothing. The plain library lists its originals until its apply.
 */
Test(prepatch, library_listed_with_the_file_choices)
{
    char lib[200], args[420];
    lib_copy(PREPATCH_LIB, lib, sizeof(lib));
    snprintf(args, sizeof(args), "dllist '%s'", PREPATCH_LIB);
    char *want = run_ok(NULL, PREPATCH_FIXTURE, args);
    snprintf(args, sizeof(args), "dllist '%s'", lib);
    char *out = run_ok(NULL, PREPATCH_FIXTURE, args);
    /* "state" lines before the line "applied", then after it */
    char *w_mid = strstr(want, "\napplied\n"), *o_mid = strstr(out, "\napplied\n");
    cr_assert(w_mid && o_mid, "%s\n%s", want, out);
    w_mid[1] = o_mid[1] = '\0';
    char *w_before = lines_of(want, "state"), *w_after = lines_of(w_mid + 2, "state");
    char *o_before = lines_of(out, "state"), *o_after = lines_of(o_mid + 2, "state");
    cr_assert_str_neq(w_before, "", "no site listed");
    cr_assert_str_eq(o_before, w_after, "the file's choices are not listed before its apply");
    cr_assert_str_eq(o_after, w_after);
    cr_assert_str_neq(w_before, w_after, "the plain library lists its originals first");
    cr_assert(strstr(o_mid + 2, SETTLED_LOG), "%s", o_mid + 2);
    cr_assert_eq(stat_of(o_mid + 2, "written"), 0, "%s", o_mid + 2);
    free(w_before);
    free(w_after);
    free(o_before);
    free(o_after);
    free(out);
    free(want);
}

/* ------------------------------------------------------------------------- */
/* The API's argument checks                                                 */
/* ------------------------------------------------------------------------- */

static int quiet(enum altpatch_print_level l, const char *f, va_list ap)
{
    (void)l;
    (void)f;
    (void)ap;
    return 0;
}

Test(image_api, bad_arguments)
{
    altpatch_print_fn old = altpatch_set_print(quiet);
    struct altpatch_image *img = (void *)1;
    cr_assert_eq(altpatch_image_open_mem("hello", 5, NULL, &img), -ENOEXEC);
    cr_assert_null(img);
    cr_assert_eq(altpatch_image_open(NULL, NULL, &img), -EINVAL);
    cr_assert_eq(altpatch_image_open("/nonexistent/x", NULL, &img), -ENOENT);
    struct altpatch_image_opts o = {.sz = sizeof(o), .reserved = 1};
    cr_assert_eq(altpatch_image_open(PREPATCH_FIXTURE, &o, &img), -EINVAL);
    o.reserved = 0;
    o.name = "fixture";
    cr_assert_eq(altpatch_image_open(PREPATCH_FIXTURE, &o, &img), 0);
    struct altpatch_image_info info;
    memset(&info, 0xa5, sizeof(info)); /* every field written by the call */
    info.sz = sizeof(info);
    cr_assert_eq(altpatch_image_get_info(img, &info), 0);
    cr_assert_str_eq(info.name, "fixture");
    cr_assert_eq(info.format_version, FIXTURE_FORMAT);
    cr_assert_null(info.prepatched_profile);
    cr_assert_eq(info.prepatched_planner, 0, "not pre-patched: %u", info.prepatched_planner);
    cr_assert_null(altpatch_image_prepatched_features(img));
    cr_assert_eq(errno, ENOENT);
    cr_assert(!info.planned);
    void *buf;
    size_t len;
    cr_assert_eq(altpatch_image_write_mem(img, NULL, &buf, &len), -EINVAL, "no plan yet");
    struct altpatch_image_entry e = {.sz = sizeof(e)};
    cr_assert_eq(altpatch_image_site_entry(img, (unsigned)info.sites, 0, &e), -ENOENT);
    cr_assert_eq(altpatch_image_site_entry(img, 0, 99, &e), -ENOENT);
    cr_assert_eq(altpatch_image_site_entry(img, 0, 0, &e), 0);
    cr_assert_not_null(e.replacement);
    struct altpatch_features *fs = altpatch_features_profile("baseline");
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    struct altpatch_image_write_opts wo = {.sz = sizeof(wo), .reserved = 1};
    cr_assert_eq(altpatch_image_write_mem(img, &wo, &buf, &len), -EINVAL);
    wo.reserved = 0;
    wo.profile = "0123456789012345678901234567890123456789012345678901234567890123";
    cr_assert_eq(altpatch_image_write_mem(img, &wo, &buf, &len), -EINVAL, "profile too long");
    wo.profile = "baseline";
    cr_assert_eq(altpatch_image_write_mem(img, &wo, &buf, &len), 0);
    altpatch_image_close(img);
    /* The bytes written open as a pre-patched image. */
    cr_assert_eq(altpatch_image_open_mem(buf, len, NULL, &img), 0);
    cr_assert_eq(altpatch_image_get_info(img, &info), 0);
    cr_assert_eq(info.format_version, FIXTURE_PREPATCHED);
    cr_assert_str_eq(info.prepatched_profile, "baseline");
    cr_assert_eq(info.prepatched_planner, AP_PREPATCH_PLANNER);
    altpatch_image_close(img);
    /* Truncated: headers out of bounds, no tables found, never a crash. */
    for (size_t cut = 0; cut < len; cut += len / 97 + 1) {
        int r = altpatch_image_open_mem(buf, cut, NULL, &img);
        cr_assert_lt(r, 0, "a file cut at %zu bytes opened", cut);
    }
    free(buf);
    altpatch_features_free(fs);
    altpatch_set_print(old);
}

/*
 * The file truncated after altpatch_image_open(): the image is the file as
 * it was opened (read whole into memory, never mapped), so its sites, plan
 * and the bytes a write makes are those of an image opened before the cut,
 * and nothing reads the file again (no SIGBUS).
 */
Test(image_api, file_truncated_after_open, .init = setup, .fini = teardown)
{
    size_t len;
    uint8_t *b = slurp(PREPATCH_FIXTURE, &len);
    char path[128];
    snprintf(path, sizeof(path), "%s/cut", tmpdir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
    struct altpatch_image *ref, *img;
    cr_assert_eq(altpatch_image_open_mem(b, len, NULL, &ref), 0);
    cr_assert_eq(altpatch_image_open(path, NULL, &img), 0);
    cr_assert_eq(truncate(path, 0), 0);
    struct lines a = {calloc(1, 1), 0, 1, false}, c = {calloc(1, 1), 0, 1, false};
    cr_assert_eq(altpatch_image_site_foreach(ref, add_line, &a), 0);
    cr_assert_eq(altpatch_image_site_foreach(img, add_line, &c), 0);
    cr_assert_gt(a.len, 0);
    cr_assert_str_eq(c.buf, a.buf);
    struct altpatch_features *fs = altpatch_features_profile("all");
    cr_assert_eq(altpatch_image_plan(ref, fs), 0);
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    void *wa, *wc;
    size_t la, lc;
    cr_assert_eq(altpatch_image_write_mem(ref, NULL, &wa, &la), 0);
    cr_assert_eq(altpatch_image_write_mem(img, NULL, &wc, &lc), 0);
    cr_assert_eq(lc, la);
    cr_assert_arr_eq(wc, wa, la, "the copy written differs from the file's as it was opened");
    free(wa);
    free(wc);
    free(a.buf);
    free(c.buf);
    altpatch_features_free(fs);
    altpatch_image_close(img);
    altpatch_image_close(ref);
    /* a file empty when opened is refused */
    altpatch_print_fn old = altpatch_set_print(quiet);
    cr_assert_lt(altpatch_image_open(path, NULL, &img), 0);
    altpatch_set_print(old);
    free(b);
}

/* ------------------------------------------------------------------------- */
/* The tool                                                                  */
/* ------------------------------------------------------------------------- */

/* Run @p tool with @p args; exit status 0 asserted; its stdout (malloc'ed). */
static char *tool_ok(const char *tool, const char *args)
{
    char *o, *e;
    int st = run(NULL, tool, args, &o, &e);
    cr_assert_eq(st, 0, "%s %s -> %d:\n%s", tool, args, st, e);
    free(e);
    return o;
}

static void tool_fails(const char *args, int want, const char *msg, const char *out)
{
    char *o, *e;
    int st = run(NULL, ALTPREPATCH, args, &o, &e);
    cr_assert_eq(st, want, "altprepatch %s -> %d, want %d\n%s", args, st, want, e);
    cr_assert(strstr(e, msg), "altprepatch %s: stderr '%s' lacks '%s'", args, e, msg);
    char *nl = strchr(e, '\n');
    cr_assert(nl && nl[1] == '\0', "altprepatch %s: one line expected, got '%s'", args, e);
    cr_assert_eq(access(out, F_OK), -1, "altprepatch %s left %s behind", args, out);
    free(o);
    free(e);
}

Test(prepatch, tool_bad_input)
{
    char out[160], args[512], txt[160];
    snprintf(out, sizeof(out), "%s/out", tmpdir);
    snprintf(txt, sizeof(txt), "%s/text", tmpdir);
    FILE *f = fopen(txt, "w");
    cr_assert_not_null(f);
    fputs("not an ELF file\n", f);
    fclose(f);
    snprintf(args, sizeof(args), "--cpu host '%s' '%s'", txt, out);
    tool_fails(args, 3, "not an ELF file", out);
    snprintf(args, sizeof(args), "--cpu host '%s' '%s'", ALTPREPATCH, out);
    tool_fails(args, 3, "no altpatch tables", out);
    snprintf(args, sizeof(args), "--cpu pentium '%s' '%s'", PREPATCH_FIXTURE, out);
    tool_fails(args, 2, "unknown CPU profile 'pentium'", out);
    snprintf(args, sizeof(args), "--cpu host,+nosuchfeature '%s' '%s'", PREPATCH_FIXTURE, out);
    tool_fails(args, 2, "bad feature edit list", out);
    snprintf(args, sizeof(args), "'%s' '%s'", PREPATCH_FIXTURE, out);
    tool_fails(args, 2, "--cpu is required", out);
    char nodir[200];
    snprintf(nodir, sizeof(nodir), "%s/no/such/dir/out", tmpdir);
    snprintf(args, sizeof(args), "--cpu host '%s' '%s'", PREPATCH_FIXTURE, nodir);
    tool_fails(args, 3, "cannot create", nodir);
    /* An output that is a directory: rename fails, the temporary file goes. */
    snprintf(args, sizeof(args), "--cpu host '%s' '%s'", PREPATCH_FIXTURE, tmpdir);
    char *o, *e;
    cr_assert_eq(run(NULL, ALTPREPATCH, args, &o, &e), 3, "%s", e);
    cr_assert(strstr(e, "cannot write"), "%s", e);
    free(o);
    free(e);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "ls '%s' | grep -q XXXX\\|'\\.[A-Za-z0-9]\\{6\\}$'", tmpdir);
    cr_assert_neq(system(cmd), 0, "a temporary file was left in %s", tmpdir);
}

Test(prepatch, tool_writes_and_reports)
{
    char out[160], args[512];
    snprintf(out, sizeof(out), "%s/tool-out", tmpdir);
    snprintf(args, sizeof(args), "--cpu amd-zen4,-avx2 '%s' '%s'", PREPATCH_FIXTURE, out);
    char *o, *e;
    cr_assert_eq(run(NULL, ALTPREPATCH, args, &o, &e), 0, "%s", e);
    cr_assert(strstr(o, "hold a replacement for amd-zen4,-avx2"), "%s", o);
    struct altpatch_image *img;
    cr_assert_eq(altpatch_image_open(out, NULL, &img), 0);
    struct altpatch_image_info info = {.sz = sizeof(info)};
    cr_assert_eq(altpatch_image_get_info(img, &info), 0);
    cr_assert_str_eq(info.prepatched_profile, "amd-zen4,-avx2");
    const struct altpatch_features *rec = altpatch_image_prepatched_features(img);
    cr_assert(!altpatch_features_has(rec, X86_FEATURE_AVX2));
    cr_assert(altpatch_features_has(rec, X86_FEATURE_FSGSBASE));
    altpatch_image_close(img);
    struct stat st;
    cr_assert_eq(stat(out, &st), 0);
    cr_assert(st.st_mode & S_IXUSR, "the copy of an executable is executable");
    free(o);
    free(e);
    cr_assert_eq(run(NULL, ALTPREPATCH, "--help", &o, NULL), 0);
    cr_assert(strstr(o, "Usage: altprepatch"));
    free(o);
    cr_assert_eq(run(NULL, ALTPREPATCH, "--version", &o, NULL), 0);
    cr_assert(strstr(o, "record format 4 (2 from format-1 input)"));
    free(o);
}

/* ------------------------------------------------------------------------- */
/* altdump on pre-patched files                                              */
/* ------------------------------------------------------------------------- */

/* The scalar after "@p key": in altdump's JSON @p j, as text ("" when absent). */
static const char *json_value(const char *j, const char *key)
{
    static char v[32];
    char k[64];
    snprintf(k, sizeof(k), "\"%s\":", key);
    const char *p = strstr(j, k);
    v[0] = 0;
    if (!p)
        return v;
    p += strlen(k);
    while (*p == ' ')
        p++;
    size_t n = strcspn(p, ",}\n ");
    if (n >= sizeof(v))
        n = sizeof(v) - 1;
    memcpy(v, p, n);
    v[n] = 0;
    return v;
}

Test(prepatch, altdump_shows_and_checks)
{
    const char *pre = prepatch(PREPATCH_FIXTURE, "amd-zen4");
    char args[512], *o, *e;
    snprintf(args, sizeof(args), "'%s'", pre);
    cr_assert_eq(run(NULL, ALTDUMP, args, &o, &e), 0, "%s", e);
    char want[32];
    snprintf(want, sizeof(want), "altpatch format %u", FIXTURE_PREPATCHED);
    cr_assert(strstr(o, want), "%s", o);
    cr_assert(strstr(o, "pre-patched for amd-zen4"), "%s", o);
    snprintf(want, sizeof(want), "(planner version %u)", AP_PREPATCH_PLANNER);
    cr_assert(strstr(o, want), "%s", o);
    free(o);
    free(e);
    snprintf(args, sizeof(args), "--check '%s'", pre);
    cr_assert_eq(run(NULL, ALTDUMP, args, &o, &e), 0, "%s%s", o, e);
    cr_assert(strstr(o, "ok, ") && strstr(o, "pre-patched for amd-zen4"), "%s", o);
    free(o);
    free(e);
    /* The originals are put back: the plain file and the copy show the same plan. */
    snprintf(args, sizeof(args), "--json --cpu intel-spr '%s'", pre);
    char *a, *b;
    cr_assert_eq(run(NULL, ALTDUMP, args, &a, &e), 0, "%s", e);
    free(e);
    snprintf(args, sizeof(args), "--json --cpu intel-spr '%s'", PREPATCH_FIXTURE);
    cr_assert_eq(run(NULL, ALTDUMP, args, &b, &e), 0, "%s", e);
    free(e);
    snprintf(want, sizeof(want), "%u", AP_PREPATCH_PLANNER);
    cr_assert_str_eq(json_value(a, "prepatched_planner"), want, "%s", a);
    cr_assert_str_eq(json_value(b, "prepatched_planner"), "null", "%s", b);
    const char *sa = strstr(a, "\"sites\""), *sb = strstr(b, "\"sites\"");
    cr_assert(sa && sb);
    cr_assert_str_eq(sa, sb, "altdump plans a pre-patched copy differently from its source");
    free(a);
    free(b);
}

/*
 * A record whose feature set is not the one the sites were planned for:
 * --check reports every site that does not hold the recorded set's plan.
 */
Test(prepatch, altdump_check_finds_wrong_plan)
{
    struct altpatch_image *img;
    struct altpatch_features *fs = altpatch_features_profile("baseline");
    cr_assert_eq(altpatch_image_open(PREPATCH_FIXTURE, NULL, &img), 0);
    cr_assert_eq(altpatch_image_plan(img, fs), 0);
    struct altpatch_image_write_opts wo = {.sz = sizeof(wo), .profile = "baseline"};
    void *buf;
    size_t len;
    cr_assert_eq(altpatch_image_write_mem(img, &wo, &buf, &len), 0);
    altpatch_image_close(img);
    altpatch_features_free(fs);
    uint8_t *rec = memmem(buf, len, "ALTPREP1", 8);
    cr_assert_not_null(rec);
    memset(rec + 96, 0xff, 128); /* every feature bit: the record now claims "all" */
    char bad[160];
    snprintf(bad, sizeof(bad), "%s/wrongplan", tmpdir);
    FILE *f = fopen(bad, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
    free(buf);
    char args[256], *o, *e;
    snprintf(args, sizeof(args), "--check '%s'", bad);
    cr_assert_eq(run(NULL, ALTDUMP, args, &o, &e), 1, "%s%s", o, e);
    cr_assert(strstr(o, ", the plan for baseline is "), "%s", o);
    free(o);
    free(e);
}

/* ------------------------------------------------------------------------- */
/* The .altpatch.orig record itself (prepatch.c)                             */
/* ------------------------------------------------------------------------- */


/* A record of two sites (3 and 5 bytes); returns its length. */
static size_t two_sites(uint8_t *b)
{
    static const uint8_t o1[3] = {1, 2, 3}, w1[3] = {4, 5, 6};
    static const uint8_t o2[5] = {7, 8, 9, 10, 11}, w2[5] = {12, 13, 14, 15, 16};
    struct ap_prepatch h = {
        .nsites = 2, .planner = AP_PREPATCH_PLANNER, .table_addr = 0x4000, .table_size = 28};
    snprintf(h.profile, sizeof(h.profile), "amd-zen4");
    snprintf(h.fs.vendor, sizeof(h.fs.vendor), "AuthenticAMD");
    h.fs.word[9] = 1;
    ap_prepatch_put_header(b, &h);
    size_t n = AP_PREPATCH_HDR;
    n += ap_prepatch_put_site(b + n, &(struct ap_prepatch_site){0x1000, 3, 0, o1, w1});
    n += ap_prepatch_put_site(b + n, &(struct ap_prepatch_site){0x1010, 5, -1, o2, w2});
    cr_assert_eq(n, ap_prepatch_size(2, 8));
    return n;
}

Test(prepatch_record, round_trip_and_every_cut_refused)
{
    uint8_t b[512];
    size_t n = two_sites(b);
    struct ap_prepatch p;
    struct ap_prepatch_site s;
    cr_assert_eq(ap_prepatch_parse(b, n, &p), 0);
    cr_assert_eq(p.nsites, 2);
    cr_assert_eq(p.planner, AP_PREPATCH_PLANNER);
    cr_assert_eq(p.table_addr, 0x4000);
    cr_assert_eq(p.table_size, 28);
    cr_assert_str_eq(p.profile, "amd-zen4");
    cr_assert_str_eq(p.fs.vendor, "AuthenticAMD");
    cr_assert_eq(p.fs.word[9], 1);
    size_t pos = 0;
    cr_assert_eq(ap_prepatch_next(&p, &pos, &s), 0);
    cr_assert_eq(s.addr, 0x1000);
    cr_assert_eq(s.len, 3);
    cr_assert_eq(s.chosen, 0);
    cr_assert_eq(s.orig[2], 3);
    cr_assert_eq(s.written[0], 4);
    cr_assert_eq(ap_prepatch_next(&p, &pos, &s), 0);
    cr_assert_eq(s.addr, 0x1010);
    cr_assert_eq(s.chosen, -1);
    cr_assert_eq(s.written[4], 16);
    cr_assert_eq(ap_prepatch_next(&p, &pos, &s), -ENOENT);
    for (size_t cut = 0; cut < n; cut++)
        cr_assert_eq(ap_prepatch_parse(b, cut, &p), -EINVAL, "cut at %zu accepted", cut);
    uint8_t c[512];
    memcpy(c, b, n);
    c[n] = 0;
    cr_assert_eq(ap_prepatch_parse(c, n + 1, &p), -EINVAL, "a trailing byte");
    memcpy(c, b, n);
    c[0] = 'X';
    cr_assert_eq(ap_prepatch_parse(c, n, &p), -EINVAL, "magic");
    memcpy(c, b, n);
    memset(c + 32, 'a', AP_PREPATCH_PROFILE);
    cr_assert_eq(ap_prepatch_parse(c, n, &p), -EINVAL, "profile without NUL");
    memcpy(c, b, n);
    c[AP_PREPATCH_HDR + 9] = 1;
    cr_assert_eq(ap_prepatch_parse(c, n, &p), -EINVAL, "reserved site bytes");
    memcpy(c, b, n);
    c[8] = 3;
    cr_assert_eq(ap_prepatch_parse(c, n, &p), -EINVAL, "nsites larger than the records");
    /* a file written before the planner's version was recorded: read, version 0 */
    memcpy(c, b, n);
    memset(c + 12, 0, 4);
    cr_assert_eq(ap_prepatch_parse(c, n, &p), 0);
    cr_assert_eq(p.planner, 0);
    cr_assert_eq(ap_prepatch_parse(NULL, n, &p), -EINVAL);
}

/* ap_plan_note_check()'s sites: a selection per site, and the sites asked. */
struct note_picks {
    int pick[2];
    unsigned asked;
};

static int note_pick(void *ctx, size_t i, const struct altpatch_features *fs)
{
    struct note_picks *np = ctx;
    cr_assert_eq(fs->word[9], 1, "the note's set");
    cr_assert_eq(i, np->asked++, "the sites in table order");
    return np->pick[i];
}

/*
 * The plan note's check, on two_sites()'s record and written bytes: each
 * refusal with its reason, the record's choices and planner only when a
 * record is given, the hash only when bytes are, the sites asked in order
 * until one fails.
 */
Test(prepatch_record, plan_note_check_each_refusal)
{
    uint8_t b[512], bytes[8] = {4, 5, 6, 12, 13, 14, 15, 16};
    struct ap_prepatch p;
    cr_assert_eq(ap_prepatch_parse(b, two_sites(b), &p), 0);
    const struct ap_plan_note good = {AP_PREPATCH_PLANNER, 2, 28, ap_bytes_hash(bytes, 8), p.fs};
    static const char other_table[] = "it describes another table",
                      outside[] = "a site lies outside the text",
                      refused[] = "a site it says was planned is refused",
                      choices[] = "the file's choices are not its",
                      hash[] = "memory does not hold the bytes it says were written",
                      planner[] = "the file's planner version is not its";
    struct {
        uint32_t nsites, planner;
        uint64_t table_size, hash;
        int pick0, pick1;
        bool rec, bytes;
        const char *why;
        unsigned asked;
    } cases[] = {
        {2, AP_PREPATCH_PLANNER, 28, 0, 0, -1, true, true, NULL, 2},
        {3, AP_PREPATCH_PLANNER, 28, 0, 0, -1, true, true, other_table, 0},
        {2, AP_PREPATCH_PLANNER, 29, 0, 0, -1, true, true, other_table, 0},
        {2, AP_PREPATCH_PLANNER, 28, 0, AP_NOTE_OUTSIDE, -1, true, true, outside, 1},
        {2, AP_PREPATCH_PLANNER, 28, 0, 0, -2, true, true, refused, 2},
        {2, AP_PREPATCH_PLANNER, 28, 0, 0, 0, true, true, choices, 2},
        {2, AP_PREPATCH_PLANNER, 28, 0, 0, 0, false, true, NULL, 2},
        {2, AP_PREPATCH_PLANNER, 28, 1, 0, -1, true, true, hash, 2},
        {2, AP_PREPATCH_PLANNER, 28, 1, 0, -1, true, false, NULL, 2},
        {2, 0, 28, 0, 0, -1, true, true, planner, 2},
        {2, 0, 28, 0, 0, -1, false, true, NULL, 2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct ap_plan_note pn = good;
        pn.nsites = cases[i].nsites;
        pn.planner = cases[i].planner;
        pn.table_size = cases[i].table_size;
        pn.hash ^= cases[i].hash;
        struct note_picks np = {{cases[i].pick0, cases[i].pick1}, 0};
        struct ap_plan_note_sites s = {
            .nsites = 2,
            .table_size = 28,
            .bytes = cases[i].bytes ? bytes : NULL,
            .nbytes = sizeof(bytes),
            .rec = cases[i].rec ? &p : NULL,
            .pick = note_pick,
            .ctx = &np,
        };
        const char *why = ap_plan_note_check(&pn, &s);
        if (cases[i].why)
            cr_assert(why && !strcmp(why, cases[i].why), "case %zu: %s", i, why ? why : "holds");
        else
            cr_assert_null(why, "case %zu: %s", i, why);
        cr_assert_eq(np.asked, cases[i].asked, "case %zu", i);
    }
}

/* ------------------------------------------------------------------------- */
/* The plan note: settling from loaded memory                                */
/* ------------------------------------------------------------------------- */

/* run once: in the binary built on the fixtures without the note */
TestSuite(plan_note, .init = setup, .fini = teardown, .timeout = 120,
          .disabled = PREPATCH_WITH_NOTE);

/* The plan note state altpatch_image_get_info() reads in @p file. */
static unsigned plan_note_of(const char *file)
{
    return image_info(file).plan_note;
}

/*
 * The header reserves the note (empty as compiled; none where the program
 * opts out); altprepatch fills it for a copy whose plan is its set's
 * selection at every site, and a copy made from that copy for another set
 * holds the other set's note.
 */
Test(plan_note, reserved_and_filled)
{
    cr_assert_eq(plan_note_of(PREPATCH_FIXTURE_PLAN), ALTPATCH_PLAN_NOTE_EMPTY);
    cr_assert_eq(plan_note_of(PREPATCH_LIB_PLAN), ALTPATCH_PLAN_NOTE_EMPTY);
    cr_assert_eq(plan_note_of(PREPATCH_FIXTURE), ALTPATCH_PLAN_NOTE_NONE);
    cr_assert_eq(plan_note_of(PREPATCH_LIB), ALTPATCH_PLAN_NOTE_NONE);
    for (size_t i = 0; i < NPROFILES; i++) {
        const char *pre = prepatch(PREPATCH_FIXTURE_PLAN, profiles[i]);
        cr_assert_eq(plan_note_of(pre), ALTPATCH_PLAN_NOTE_FILLED, "%s", profiles[i]);
        check_written(PREPATCH_FIXTURE_PLAN, pre, profiles[i]);
    }
    /* pre-patched again from a copy: the note is the new set's */
    char first[160];
    snprintf(first, sizeof(first), "%s", prepatch(PREPATCH_FIXTURE_PLAN, "amd-zen4"));
    char again[200];
    snprintf(again, sizeof(again), "%s.again", first);
    cr_assert_eq(rename(first, again), 0);
    const char *pre = prepatch(again, "baseline");
    cr_assert_eq(plan_note_of(pre), ALTPATCH_PLAN_NOTE_FILLED);
    check_written(PREPATCH_FIXTURE_PLAN, pre, "baseline");
    /* a copy without the note stays without it */
    pre = prepatch(PREPATCH_FIXTURE, "host");
    cr_assert_eq(plan_note_of(pre), ALTPATCH_PLAN_NOTE_NONE);
    /* the tool says which */
    const struct {
        const char *src, *says;
    } tool[] = {{PREPATCH_FIXTURE_PLAN, "; plan note filled ("},
                {PREPATCH_FIXTURE, "; no plan note ("}};
    char out[160], args[512];
    snprintf(out, sizeof(out), "%s/tool-out", tmpdir);
    for (size_t i = 0; i < sizeof(tool) / sizeof(tool[0]); i++) {
        snprintf(args, sizeof(args), "--cpu host '%s' '%s'", tool[i].src, out);
        char *o = tool_ok(ALTPREPATCH, args);
        cr_assert(strstr(o, tool[i].says), "%s", o);
        free(o);
    }
}

/* The file offset of link-time address @p addr in the ELF image @p b (a PT_LOAD maps it). */
static size_t file_offset_of(const uint8_t *b, size_t len, uint64_t addr)
{
    Elf64_Ehdr eh;
    cr_assert_geq(len, sizeof(eh));
    memcpy(&eh, b, sizeof(eh));
    for (size_t i = 0; i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        cr_assert_leq(eh.e_phoff + (i + 1) * sizeof(ph), len);
        memcpy(&ph, b + eh.e_phoff + i * sizeof(ph), sizeof(ph));
        if (ph.p_type == PT_LOAD && addr >= ph.p_vaddr && addr - ph.p_vaddr < ph.p_filesz)
            return (size_t)(ph.p_offset + (addr - ph.p_vaddr));
    }
    cr_assert_fail("address %#llx not in the file", (unsigned long long)addr);
    return 0;
}

/*
 * A plan that is not its set's selection at every site -- here one site
 * refused by the record checks (its first record's replacement made longer
 * than the site) -- leaves the copy's note empty: its first apply reads the
 * file. The tool says so.
 */
Test(plan_note, left_empty_where_a_site_is_refused)
{
    struct altpatch_image_info info = image_info(PREPATCH_FIXTURE_PLAN);
    cr_assert_eq(info.format_version, ALTPATCH_FORMAT_COMPACT);
    size_t len;
    uint8_t *b = slurp(PREPATCH_FIXTURE_PLAN, &len);
    size_t rec = file_offset_of(b, len, info.table_addr);
    cr_assert_lt(rec + 12, len);
    b[rec + 11] = (uint8_t)(b[rec + 10] + 1); /* replacementlen > instrlen */
    char bad[160], out[200], args[512];
    snprintf(bad, sizeof(bad), "%s/oneref", tmpdir);
    write_file(bad, b, len);
    free(b);
    snprintf(out, sizeof(out), "%s/oneref-pp", tmpdir);
    snprintf(args, sizeof(args), "--cpu host '%s' '%s'", bad, out);
    char *o = tool_ok(ALTPREPATCH, args);
    cr_assert(strstr(o, ", 1 refused (original kept); plan note left empty ("), "%s", o);
    free(o);
    cr_assert_eq(plan_note_of(out), ALTPATCH_PLAN_NOTE_EMPTY);
}

/* With the note: settled for the applied set, planned for another (as without). */
Test(plan_note, settles_for_the_applied_set)
{
    settles(PREPATCH_FIXTURE_PLAN, NULL);
}

Test(plan_note, settles_under_clearcpuid)
{
    settles(PREPATCH_FIXTURE_PLAN, "fsgsbase");
}

/* Lazy originals: REVERT after an apply settled from the note writes the
 * compiler's bytes back, byte for byte; the next apply brings the file's
 * bytes back. */
Test(plan_note, settled_reverts_and_applies_again)
{
    settled_reverts(PREPATCH_FIXTURE_PLAN);
}

/* Lazy originals: a copy made for another set (FSGSBASE toggled) is planned
 * from the file's originals and rewritten to the plain program's bytes;
 * one for the set ALTPATCH_CLEARCPUID takes away is too. */
Test(plan_note, other_set_is_planned_from_the_file)
{
    struct altpatch_features *fs = applied_set(NULL);
    toggle_fsgsbase(fs);
    const char *pre = prepatch_fs(PREPATCH_FIXTURE_PLAN, fs, "other");
    char *want = run_ok(NULL, PREPATCH_FIXTURE_PLAN, "stats");
    char *out = run_ok(NULL, pre, "stats");
    rewritten_like_plain(out, want, "settled on another set's file");
    free(out);
    free(want);
    altpatch_features_free(fs);
}

/*
 * No file is read by a first apply that settles from the note: with open()
 * and openat() refused from before the first apply on, a copy for the
 * applied set settles (nothing written, every primitive right); the REVERT
 * after it needs the originals, cannot read them (a warning), and, with
 * /proc refused, cannot list the threads either: -EBUSY, nothing written
 * (the sites still hold this CPU's plan, and the primitives still run as
 * decided). The same copy without the note
 * reads its file in its first apply: refused there.
 */
/* Run fixture @p prog in mode @p mode (open/openat refused by a seccomp
 * filter after its first look) under @p env; exit status @p status
 * asserted; its stdout. Skips the test where no seccomp filter can be
 * installed. */
/*
 * The environment of a sealed run: without a CLEARCPUID of the test's, and
 * under AddressSanitizer without its leak check at exit (LeakSanitizer reads
 * /proc/<pid>/task, which the fixture's filter refuses: it would end the
 * child with an error of its own).
 */
#define SEALED_ENV "env -u ALTPATCH_CLEARCPUID ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

static char *run_sealed(const char *env, const char *prog, const char *mode, int status)
{
    char e[256], *out, *err;
    snprintf(e, sizeof(e), SEALED_ENV " %s", env ? env : "");
    int st = run(e, prog, mode, &out, &err);
    if (st == 3)
        cr_skip("%s", out); /* "seccomp filter unavailable: ..." */
    cr_assert_eq(st, status, "%s %s -> %d:\n%s%s", prog, mode, st, out, err);
    free(err);
    return out;
}

Test(plan_note, settles_without_opening_a_file)
{
    const char *pre = applied_copy(PREPATCH_FIXTURE_PLAN, "same");
    char *out = run_sealed(NULL, pre, "sealed", 0);
    char *first = strstr(out, "\nstats ");
    cr_assert_not_null(first, "%s", out);
    cr_assert(strstr(out, SETTLED_LOG), "%s", out);
    cr_assert(strstr(out, "originals not usable: Permission denied"), "%s", out);
    cr_assert_lt((size_t)(strstr(out, SETTLED_LOG) - out), (size_t)(first - out));
    cr_assert_gt((size_t)(strstr(out, "not usable") - out), (size_t)(first - out),
                 "the first apply read the file:\n%s", out);
    cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    char *second = strstr(first + 1, "\nstats ");
    cr_assert_not_null(second, "%s", out);
    /* the REVERT would write: with /proc refused, whether other threads run
     * cannot be known, and nothing is written */
    cr_assert(strstr(out, "\nrc -16\n"), "%s", out);
    cr_assert(strstr(out, "cannot list this process's threads"), "%s", out);
    cr_assert_eq(stat_of(second, "written"), 0, "%s", out);
    char *before = lines_of(out, "before");
    char *mem = state_bytes(out, false, -1);
    cr_assert_str_eq(mem, before, "memory changed:\n%s", out);
    free(mem);
    free(before);
    free(out);

    /* without the note: the first apply reads the file */
    pre = applied_copy(PREPATCH_FIXTURE, "noteless");
    out = run_sealed(NULL, pre, "sealed", 1);
    cr_assert(strstr(out, "originals not usable: Permission denied"), "%s", out);
    cr_assert(!strstr(out, SETTLED_LOG), "%s", out);
    free(out);
}

/*
 * A site list and a debug run cannot read the file (open/openat refused
 * after the first look) of a main program settled from its note: nothing
 * changes -- the sites listed as the note planned them (PATCHED or
 * ORIGINAL, no reason) with no original bytes (memory's are not the
 * compiler's), and the next apply finds the module settled, nothing
 * refused. ALTPATCH_DEBUG changes nothing of that (before: the list refused
 * the module, and the next apply refused every site).
 */
Test(plan_note, unreadable_file_does_not_refuse_a_settled_module)
{
    const char *pre = applied_copy(PREPATCH_FIXTURE_PLAN, "same");
    const char *envs[] = {NULL, "ALTPATCH_DEBUG=1"};
    for (size_t k = 0; k < 2; k++) {
        char *out = run_sealed(envs[k], pre, "sealedlist", 0);
        cr_assert(strstr(out, SETTLED_LOG), "%s", out);
        cr_assert(!strstr(out, "refused: bad"), "%s", out);
        cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
        cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
        char *again = strstr(out, "\nagain\n");
        cr_assert_not_null(again, "%s", out);
        cr_assert_eq(stat_of(again, "refused"), 0, "%s", out);
        cr_assert_eq(stat_of(again, "written"), 0, "%s", out);
        char *states = lines_of(out, "state");
        cr_assert_str_neq(states, "", "%s", out);
        for (char *l = states; *l;) {
            char addr[32], cur[600], orig[600] = "";
            int state, reason;
            char *nl = strchr(l, '\n');
            *nl = '\0'; /* one line */
            int n = sscanf(l, " %31s %d %*d %d %599s %599s", addr, &state, &reason, cur, orig);
            cr_assert_eq(n, 4, "an original listed without the file: %s", l);
            cr_assert_neq(state, ALTPATCH_SITE_REFUSED, "%s", l);
            cr_assert_eq(reason, ALTPATCH_REASON_NONE, "%s", l);
            l = nl + 1;
        }
        free(states);
        free(out);
    }
}

/*
 * ALTPATCH_DEBUG on a copy settled from its note: the debug run reads the
 * file for the originals it logs -- every "old_insn" line is a site's
 * compiler bytes, never memory's -- and changes nothing of the outcome: the
 * same counters, states and bytes as the run without it.
 */
Test(plan_note, debug_logs_the_originals_and_changes_nothing)
{
    const char *pre = applied_copy(PREPATCH_FIXTURE_PLAN, "same");
    char *plain = run_ok(NULL, pre, "stats");
    char *dbg = run_ok("ALTPATCH_DEBUG=1", pre, "stats");
    cr_assert(strstr(plain, SETTLED_LOG), "%s", plain);
    const char *keys[] = {"written", "patched", "unchanged", "refused", "seen"};
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
        cr_assert_eq(stat_of(dbg, keys[k]), stat_of(plain, keys[k]), "%s\n%s", dbg, plain);
    same_lines(dbg, plain, "state");
    same_lines(dbg, plain, "site");
    /* the originals logged: each old_insn is the compiler's bytes of a site */
    char *orig_l = file_sites(PREPATCH_FIXTURE_PLAN, false);
    size_t n = 0;
    for (const char *l = strstr(dbg, "old_insn: "); l; l = strstr(l + 1, "old_insn: ")) {
        /* "old_insn: 0f ae f0 ..." up to the line's end, without spaces */
        char hex[600], want[610];
        size_t h = 0;
        for (const char *c = l + strlen("old_insn: "); *c && *c != '\n' && h < 599; c++)
            if (*c != ' ')
                hex[h++] = *c;
        hex[h] = '\0';
        snprintf(want, sizeof(want), " %s\n", hex);
        cr_assert(strstr(orig_l, want), "old_insn %s is no site's original:\n%s", hex, orig_l);
        n++;
    }
    cr_assert_gt(n, 0, "no old_insn line:\n%s", dbg);
    free(orig_l);
    free(dbg);
    free(plain);
}

/*
 * A program settled from its note, then: a forked child reverts (its file
 * read in the child, its primitives checked on the originals), the parent
 * still runs its plan; with a second thread running, a live REVERT and a
 * live apply (the originals read by the REVERT, nothing refused), the sites
 * ending with the file's bytes again. (Where the host cannot patch live, the
 * fixture says so and the live part is left out.)
 */
Test(plan_note, fork_and_live_after_settling)
{
    const char *pre = applied_copy(PREPATCH_FIXTURE_PLAN, "same");
    char *out = run_ok(NULL, pre, "forklive");
    cr_assert(strstr(out, SETTLED_LOG), "%s", out);
    cr_assert(strstr(out, "child reverted: ok\n"), "%s", out);
    cr_assert(!strstr(out, "not usable"), "%s", out);
    size_t nstats = 0;
    for (const char *l = strstr(out, "\nstats "); l; l = strstr(l + 1, "\nstats ")) {
        cr_assert_eq(stat_of(l, "refused"), 0, "%s", out);
        nstats++;
    }
    /* live patching may be impossible on the host (docs/live.md): then the
     * fork part alone */
    cr_assert_eq(nstats, strstr(out, "\nlive unavailable\n") ? 1 : 3, "%s", out);
    char *after = lines_of(out, "site"), *file_l = file_sites(pre, false);
    cr_assert_str_eq(after, file_l, "the live apply did not bring the file's bytes back");
    free(after);
    free(file_l);
    free(out);
}

/*
 * A library's file is read at its first apply, note or not: its path may
 * name nothing, or another file, later. Applied while its file is there,
 * then with a FIFO in place of its file (reading it would block): the site
 * list shows the compiler's bytes, REVERT writes them back (the library's
 * calls run their originals), the apply after it brings the file's bytes
 * back; nothing refused, nothing read from the path (before: the library
 * settled from its note, and the REVERT found the FIFO: every site refused,
 * the replacements left in place).
 */
Test(plan_note, library_reads_its_file_at_its_first_apply)
{
    char lib[200];
    lib_copy(PREPATCH_LIB_PLAN, lib, sizeof(lib));
    char *orig_l = file_sites(PREPATCH_LIB_PLAN, false);
    char *out = run_lib_fifo("dlgone", lib);
    cr_assert(!strstr(out, "not a regular file"), "%s", out);
    char settled[300];
    snprintf(settled, sizeof(settled), "%s: " SETTLED_LOG, lib);
    cr_assert(strstr(out, settled), "%s", out);
    for (const char *l = strstr(out, "\nstats "); l; l = strstr(l + 1, "\nstats "))
        cr_assert_eq(stat_of(l, "refused"), 0, "%s", out);
    /* listed with the compiler's bytes */
    char *orig = state_bytes(out, true, -1);
    cr_assert_str_eq(orig, orig_l, "the library's listed originals are not the compiler's");
    free(orig);
    free(orig_l);
    free(out);
}

/* The plan note's descriptor (ALTPATCH_PLAN_NOTE_SIZE bytes) in the image @p b of @p file. */
static uint8_t *note_desc_in(uint8_t *b, size_t len, const char *file)
{
    /* the note header: namesz 9, descsz, type, "altpatch\0" padded to 12 */
    uint8_t hdr[24] = {9, 0, 0, 0};
    uint32_t dsz = ALTPATCH_PLAN_NOTE_SIZE, type = ALTPATCH_PLAN_NOTE_TYPE;
    memcpy(hdr + 4, &dsz, 4);
    memcpy(hdr + 8, &type, 4);
    memcpy(hdr + 12, "altpatch", 9);
    uint8_t *n = memmem(b, len, hdr, sizeof(hdr));
    cr_assert_not_null(n, "no plan note in %s", file);
    return n + sizeof(hdr);
}

/*
 * Copy @p src to @p dst (executable) with its plan note's descriptor edited
 * by @p edit (the note of @p src asserted filled), or, without @p edit,
 * replaced by @p desc (whatever state the note of @p src is in).
 */
static void note_copy(const char *src, const char *dst, void (*edit)(uint8_t *desc),
                      const uint8_t *desc)
{
    size_t len;
    uint8_t *b = slurp(src, &len), *d = note_desc_in(b, len, src);
    if (edit) {
        uint32_t state;
        memcpy(&state, d, 4);
        cr_assert_eq(state, 1, "the plan note of %s is not filled", src);
        edit(d);
    } else {
        memcpy(d, desc, ALTPATCH_PLAN_NOTE_SIZE);
    }
    write_file(dst, b, len);
    cr_assert_eq(chmod(dst, 0755), 0);
    free(b);
}

/* Copy @p src to @p dst with @p edit applied to its filled plan note's descriptor. */
static void forged_note_copy(const char *src, const char *dst, void (*edit)(uint8_t *desc))
{
    note_copy(src, dst, edit, NULL);
}

static void edit_hash(uint8_t *d)
{
    d[24] ^= 1;
}
static void edit_nsites(uint8_t *d)
{
    d[8] += 1;
}
static void edit_state(uint8_t *d)
{
    d[0] = 7;
}
static void edit_reserved(uint8_t *d)
{
    d[12] = 1;
}
static void edit_fsgsbase(uint8_t *d)
{
    /* feature words at +32: FSGSBASE is word 9, bit 0 */
    d[32 + 9 * 4] ^= 1;
}

/*
 * A note that does not hold -- forged, malformed, or naming another set than
 * the one the file's records were written for -- is not used: the image API
 * reports it stale, and the first apply reads the file as without a note
 * (the copy is for the applied set: it settles from the file, nothing
 * written, nothing refused). A note whose set was changed is believed where
 * the records' selection under it is still what memory's hash says: it is
 * checked when the file is read -- the apply for the applied set (which
 * selects other entries than the forged set) reads the file, finds the
 * choices are not the note's, and takes the file's.
 */
Test(plan_note, forged_note_not_used)
{
    char same[160];
    snprintf(same, sizeof(same), "%s", applied_copy(PREPATCH_FIXTURE_PLAN, "same"));
    struct {
        void (*edit)(uint8_t *);
        const char *why;
    } cases[] = {
        {edit_hash, "plan note not used (memory does not hold the bytes it says were written)"},
        {edit_nsites, "plan note not used (it describes another table)"},
        {edit_fsgsbase, "plan note not used (the file's choices are not its)"},
        {edit_reserved, "plan note not used (malformed)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char dst[200];
        snprintf(dst, sizeof(dst), "%s/forged%zu", tmpdir, i);
        forged_note_copy(same, dst, cases[i].edit);
        cr_assert_eq(plan_note_of(dst), ALTPATCH_PLAN_NOTE_STALE, "case %zu", i);
        char *out = run_ok(NULL, dst, "stats");
        cr_assert(strstr(out, cases[i].why), "case %zu:\n%s", i, out);
        cr_assert(strstr(out, SETTLED_LOG), "case %zu:\n%s", i, out);
        cr_assert_eq(stat_of(out, "written"), 0, "case %zu:\n%s", i, out);
        cr_assert_eq(stat_of(out, "refused"), 0, "case %zu:\n%s", i, out);
        free(out);
    }
}

/* A note of a state this reader does not know is not used: the file is read
 * (and the copy settles from it, as one without a note); sealed, that first
 * apply cannot read it. */
Test(plan_note, unknown_state_reads_the_file)
{
    char same[160], dst[200];
    snprintf(same, sizeof(same), "%s", applied_copy(PREPATCH_FIXTURE_PLAN, "same"));
    snprintf(dst, sizeof(dst), "%s/state7", tmpdir);
    forged_note_copy(same, dst, edit_state);
    cr_assert_eq(plan_note_of(dst), ALTPATCH_PLAN_NOTE_EMPTY);
    char *out = run_ok(NULL, dst, "stats");
    cr_assert(strstr(out, SETTLED_LOG), "%s", out);
    cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
    free(out);
    /* the same copy, sealed: its first apply reads the file, and cannot */
    out = run_sealed(NULL, dst, "sealed", 1);
    cr_assert(strstr(out, "originals not usable: Permission denied"), "%s", out);
    free(out);
}

/* The plan note descriptor of @p file (ALTPATCH_PLAN_NOTE_SIZE bytes into @p desc). */
static void note_desc_of(const char *file, uint8_t *desc)
{
    size_t len;
    uint8_t *b = slurp(file, &len);
    memcpy(desc, note_desc_in(b, len, file), ALTPATCH_PLAN_NOTE_SIZE);
    free(b);
}

static uint8_t stale_desc[ALTPATCH_PLAN_NOTE_SIZE];
static void edit_to_stale(uint8_t *d)
{
    memcpy(d, stale_desc, sizeof(stale_desc));
}

/*
 * What an altprepatch that does not know the note leaves when it pre-patches
 * again a copy the current one filled: the records and sites of its set (here
 * the applied set's), the note of the first set (a profile's whose choices
 * differ from the applied set's: which one depends on this CPU). The image API
 * and altdump say it is stale; the program's first apply under a set without
 * FSGSBASE reads the file and plans: the states and bytes of the plain
 * program under that set, nothing refused (before: every site refused, the
 * FSGSBASE instructions left in place). altprepatch rewrites the note.
 */
Test(plan_note, stale_note_of_an_older_writer)
{
    char dst[200];
    char host[160];
    snprintf(host, sizeof(host), "%s", applied_copy(PREPATCH_FIXTURE_PLAN, "host"));
    snprintf(dst, sizeof(dst), "%s/stale", tmpdir);
    /* baseline and all choose differently at every site whose entry needs a
     * feature: the applied set agrees with one of them at most */
    static const char *const first[] = {"amd-zen4", "intel-spr", "baseline", "all"};
    bool stale = false;
    for (size_t i = 0; !stale && i < sizeof(first) / sizeof(first[0]); i++) {
        const char *older = prepatch(PREPATCH_FIXTURE_PLAN, first[i]);
        cr_assert_eq(plan_note_of(older), ALTPATCH_PLAN_NOTE_FILLED, "%s", first[i]);
        note_desc_of(older, stale_desc);
        forged_note_copy(host, dst, edit_to_stale);
        stale = plan_note_of(dst) == ALTPATCH_PLAN_NOTE_STALE;
    }
    cr_assert(stale, "no profile's note is stale in the applied set's copy");

    const char *env = "ALTPATCH_CLEARCPUID=fsgsbase";
    char *want = run_ok(env, PREPATCH_FIXTURE_PLAN, "stats");
    char *out = run_ok(env, dst, "stats");
    cr_assert(strstr(out, "plan note not used ("), "%s", out);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    same_lines(out, want, "state");
    same_lines(out, want, "site");
    free(out);
    free(want);
    /* and settles for the applied set, from the file */
    out = run_ok(NULL, dst, "stats");
    cr_assert(strstr(out, SETTLED_LOG), "%s", out);
    cr_assert_eq(stat_of(out, "written"), 0, "%s", out);
    cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
    free(out);

    char args[512];
    snprintf(args, sizeof(args), "'%s'", dst);
    char *o = tool_ok(ALTDUMP, args);
    cr_assert(strstr(o, "\nplan note: stale (warning: "), "%s", o);
    free(o);
    char again[200];
    snprintf(again, sizeof(again), "%s/stale-again", tmpdir);
    snprintf(args, sizeof(args), "--cpu host '%s' '%s'", dst, again);
    o = tool_ok(ALTPREPATCH, args);
    cr_assert(strstr(o, "; plan note filled ("), "%s", o);
    free(o);
    cr_assert_eq(plan_note_of(again), ALTPATCH_PLAN_NOTE_FILLED);
}

/*
 * A plain (not pre-patched) file's plan note is never read by a first apply:
 * filled or malformed, the image API opens the file and calls the note
 * stale (before: a malformed one failed the open with -EBADMSG), and the
 * program applies as the plain program does.
 */
Test(plan_note, plain_file_note_is_never_used)
{
    char zen4[160], dst[200];
    snprintf(zen4, sizeof(zen4), "%s", prepatch(PREPATCH_FIXTURE_PLAN, "amd-zen4"));
    uint8_t desc[ALTPATCH_PLAN_NOTE_SIZE];
    note_desc_of(zen4, desc);
    char *want = run_ok(NULL, PREPATCH_FIXTURE_PLAN, "stats");
    for (int bad = 0; bad < 2; bad++) {
        if (bad)
            desc[12] = 1; /* a nonzero reserved field: malformed */
        snprintf(dst, sizeof(dst), "%s/plain-note%d", tmpdir, bad);
        note_copy(PREPATCH_FIXTURE_PLAN, dst, NULL, desc);
        cr_assert_eq(plan_note_of(dst), ALTPATCH_PLAN_NOTE_STALE, "case %d", bad);
        char *out = run_ok(NULL, dst, "stats");
        cr_assert(!strstr(out, "plan note"), "%s", out);
        cr_assert_eq(stat_of(out, "refused"), 0, "%s", out);
        same_lines(out, want, "state");
        same_lines(out, want, "site");
        free(out);
    }
    free(want);
}

/* altdump shows the note: text and JSON (a plain program's: no text line). */
Test(plan_note, altdump_shows_it)
{
    const struct {
        const char *src, *profile, *state, *json;
    } cases[] = {
        {PREPATCH_FIXTURE_PLAN, "amd-zen4", "filled", "\"filled\""},
        {PREPATCH_FIXTURE, "amd-zen4", "none", "\"none\""},
        {PREPATCH_FIXTURE_PLAN, NULL, NULL, "null"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *file = cases[i].profile ? prepatch(cases[i].src, cases[i].profile)
                                            : cases[i].src;
        char args[512], want[64], *o;
        if (cases[i].state) {
            snprintf(args, sizeof(args), "'%s'", file);
            snprintf(want, sizeof(want), "\nplan note: %s (", cases[i].state);
            o = tool_ok(ALTDUMP, args);
            cr_assert(strstr(o, want), "%s", o);
            free(o);
        }
        snprintf(args, sizeof(args), "--json '%s'", file);
        o = tool_ok(ALTDUMP, args);
        cr_assert_str_eq(json_value(o, "prepatched_plan_note"), cases[i].json, "%s", o);
        free(o);
    }
}
