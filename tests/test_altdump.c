/* SPDX-License-Identifier: MIT */
/*
 * altdump, driven as a program: golden outputs (table, --json, --size,
 * --compare) for several CPU profiles, --check on the corrupt-record
 * fixtures, .o vs linked program, every bad input, and the cross-check with
 * a live process (--pid) that ran altpatch_apply().
 *
 * Regenerate the goldens after an intended change:
 *   ALTDUMP_REGEN=1 ./tests/test_altdump   (then review `git diff testdata/altdump/golden`)
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host.h"

#ifndef ALTDUMP_BIN
Test(altdump, not_built)
{
    cr_skip_test("altdump is not built (ALTPATCH_BUILD_TOOLS=OFF)");
}
#else

/* --- helpers --------------------------------------------------------------- */

struct result {
    int rc;
    char *out, *err;
    long maxrss_kib; /* the run's peak resident memory (wait4()) */
};

static char *slurp_fd(int fd)
{
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    cr_assert_not_null(b);
    lseek(fd, 0, SEEK_SET);
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            b = realloc(b, cap);
            cr_assert_not_null(b);
        }
        ssize_t k = read(fd, b + len, cap - len - 1);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    b[len] = 0;
    return b;
}

static int tmpfile_fd(void)
{
    char path[] = "/tmp/altdump-test-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unlink(path);
    return fd;
}

/* Run @p exe with @p argv (NULL-terminated, without argv[0]) in the fixture directory. */
static struct result run_exe(const char *exe, const char *const *argv)
{
    const char *args[32] = {exe};
    size_t n = 1;
    for (; argv[n - 1] && n < 31; n++)
        args[n] = argv[n - 1];
    args[n] = NULL;
    int ofd = tmpfile_fd(), efd = tmpfile_fd();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(ofd, 1);
        dup2(efd, 2);
        if (chdir(ALTDUMP_FIXDIR) != 0)
            _exit(126);
        unsetenv("ALTPATCH_CLEARCPUID");
        unsetenv("ALTPATCH_OFF");
        execv(exe, (char *const *)args);
        _exit(127);
    }
    int st;
    struct rusage ru;
    cr_assert_eq(wait4(pid, &st, 0, &ru), pid);
    cr_assert(WIFEXITED(st), "altdump died (signal %d)", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    struct result r = {WEXITSTATUS(st), slurp_fd(ofd), slurp_fd(efd), ru.ru_maxrss};
    close(ofd);
    close(efd);
    return r;
}

/* Run altdump with @p argv in the fixture directory. */
static struct result run_v(const char *const *argv)
{
    return run_exe(ALTDUMP_BIN, argv);
}

#define RUN(...) run_v((const char *const[]){__VA_ARGS__, NULL})

static void result_free(struct result *r)
{
    free(r->out);
    free(r->err);
}

static char *read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    char *b = malloc((size_t)st.st_size + 1);
    cr_assert_not_null(b);
    ssize_t k = read(fd, b, (size_t)st.st_size);
    close(fd);
    cr_assert_eq(k, st.st_size);
    b[k] = 0;
    if (len)
        *len = (size_t)k;
    return b;
}

static void write_file(const char *path, const void *b, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0, "cannot write %s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, b, len), (ssize_t)len);
    close(fd);
}

/*
 * Drop the "features" array of the "cpu" object: it lists every feature of
 * the profile (features.c's tables), which is not altdump's output to pin down;
 * the decisions in the goldens still depend on the profiles.
 */
static void strip_features(char *s)
{
    char *a = strstr(s, "\"features\": [");
    if (!a)
        return;
    char *b = strchr(a, ']');
    cr_assert_not_null(b);
    const char *repl = "\"features\": [\"...\"]";
    size_t rl = strlen(repl);
    memcpy(a, repl, rl);
    memmove(a + rl, b + 1, strlen(b + 1) + 1);
}

static void golden(const char *name, char *actual)
{
    strip_features(actual);
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", ALTDUMP_GOLDEN, name);
    if (getenv("ALTDUMP_REGEN")) {
        mkdir(ALTDUMP_GOLDEN, 0755);
        write_file(path, actual, strlen(actual));
        return;
    }
    char *want = read_file(path, NULL);
    cr_assert_not_null(want, "missing golden %s (run with ALTDUMP_REGEN=1)", path);
    cr_assert_str_eq(actual, want, "output differs from %s", path);
    free(want);
}

/* --- golden outputs -------------------------------------------------------- */

struct gcase {
    const char *golden;
    int rc;
    const char *argv[8];
};

static const struct gcase gcases[] = {
    {"table-baseline.txt", 0, {"--cpu", "baseline", "sites.elf"}},
    {"table-amd-zen4.txt", 0, {"--cpu", "amd-zen4", "sites.elf"}},
    {"table-intel-spr-intel.txt", 0, {"--cpu", "intel-spr", "--intel", "sites.elf"}},
    {"table-all-obj.txt", 0, {"-c", "all", "sites.o"}},
    {"table-edit.txt", 0, {"--cpu", "amd-zen4,-fsgsbase,+serialize", "sites.elf"}},
    {"json-amd-zen4.json", 0, {"--json", "--cpu", "amd-zen4", "sites.elf"}},
    {"json-intel-spr-obj.json", 0, {"--json", "--cpu", "intel-spr,-popcnt", "sites.o"}},
    {"size-amd-zen4.txt", 0, {"--size", "--cpu", "amd-zen4", "sites.elf"}},
    {"size-baseline.txt", 0, {"--size", "--cpu", "baseline", "sites.elf", "sites.o"}},
    {"size-all.json", 0, {"--size", "--json", "--cpu", "all", "sites.elf"}},
    {"compare.txt", 0, {"--compare", "plain.elf", "sites.elf"}},
    {"compare.json", 0, {"--compare", "--json", "plain.elf", "sites.elf"}},
    {"check-sites.txt", 0, {"--check", "--cpu", "all", "sites.elf", "sites.o"}},
};

Test(altdump, golden_outputs)
{
    for (size_t i = 0; i < sizeof(gcases) / sizeof(gcases[0]); i++) {
        const struct gcase *g = &gcases[i];
        struct result r = run_v(g->argv);
        cr_assert_eq(r.rc, g->rc, "%s: exit %d, stderr: %s", g->golden, r.rc, r.err);
        cr_assert_str_empty(r.err, "%s: unexpected stderr: %s", g->golden, r.err);
        golden(g->golden, r.out);
        result_free(&r);
    }
}

/* The decisions that must hold whatever the golden files say. */
Test(altdump, decisions_by_profile)
{
    struct result r = RUN("--cpu", "baseline", "sites.elf");
    cr_assert_eq(r.rc, 0);
    /* baseline has no optional feature, and APIC_MSRS_FENCE (not AMD): nothing replaced. */
    cr_assert(strstr(r.out, ": 0 replaced, 9 kept, 0 refused"), "%s", r.out);
    result_free(&r);
    r = RUN("--cpu", "all", "sites.elf");
    cr_assert_eq(r.rc, 0);
    /* "all" has every feature: every site but ALT_NOT(ALWAYS) and ALT_NOT(APIC_MSRS_FENCE). */
    cr_assert(strstr(r.out, ": 7 replaced, 2 kept, 0 refused"), "%s", r.out);
    /* the call switch is relocated: call impl_new from the site */
    cr_assert(strstr(r.out, "0x401040  e8 5b 00 00 00"), "%s", r.out);
    result_free(&r);
}

/* --compare counts like size(1) (Berkeley format) on a real PIE and on a .o. */
Test(altdump, compare_counts_like_size)
{
    const char *files[] = {ALTDUMP_LIVE, ALTDUMP_FIXDIR "/sites.o", ALTDUMP_FIXDIR "/many.so"};
    for (size_t i = 0; i < 3; i++) {
        char cmd[1024], line[1024] = "";
        snprintf(cmd, sizeof(cmd), "size '%s' 2>/dev/null", files[i]);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        bool have = fgets(line, sizeof(line), p) && fgets(line, sizeof(line), p);
        int st = pclose(p);
        if (!have || st != 0)
            cr_skip_test("size(1) is not available");
        unsigned long long t, d, b, dec;
        cr_assert_eq(sscanf(line, "%llu %llu %llu %llu", &t, &d, &b, &dec), 4, "%s", line);
        struct result r = RUN("--compare", files[i], files[i]);
        cr_assert_eq(r.rc, 0, "%s", r.err);
        char want[128];
        snprintf(want, sizeof(want), "%7llu\t%7llu\t%7llu\t%7llu\t", t, d, b, dec);
        cr_assert(strstr(r.out, want), "size(1) says '%s', altdump says\n%s", line, r.out);
        result_free(&r);
    }
}

/* --- --check on the corrupt-record fixtures -------------------------------- */

#if ALTDUMP_HAVE_CORRUPT
/*
 * Site index -> expected reason, read from the corrupt-record table of
 * testdata/README.md (rows in record order; every record there is its own
 * site): "refused, `NAME`" -> ALTPATCH_REASON_NAME, anything else -> 0.
 */
static const struct {
    const char *name;
    int reason;
} reason_names[] = {
    {"SITE_BOUNDS", ALTPATCH_REASON_SITE_BOUNDS},
    {"REPL_BOUNDS", ALTPATCH_REASON_REPL_BOUNDS},
    {"REPL_TOO_LONG", ALTPATCH_REASON_REPL_TOO_LONG},
    {"EMPTY_SITE", ALTPATCH_REASON_EMPTY_SITE},
    {"SITE_OVERLAP", ALTPATCH_REASON_SITE_OVERLAP},
    {"ORIG_UNDECODABLE", ALTPATCH_REASON_ORIG_UNDECODABLE},
    {"ORIG_CROSSES_END", ALTPATCH_REASON_ORIG_CROSSES_END},
    {"REPL_UNDECODABLE", ALTPATCH_REASON_REPL_UNDECODABLE},
    {"REPL_CROSSES_END", ALTPATCH_REASON_REPL_CROSSES_END},
    {"UNKNOWN_FEATURE", ALTPATCH_REASON_UNKNOWN_FEATURE},
    {"RELOC_OVERFLOW", ALTPATCH_REASON_RELOC_OVERFLOW},
};

static size_t readme_reasons(int *out, size_t max)
{
    char *md = read_file(ALTDUMP_TESTDATA "/README.md", NULL);
    cr_assert_not_null(md, "testdata/README.md missing");
    char *table = strstr(md, "`libapfix_corrupt.so`");
    cr_assert_not_null(table, "no libapfix_corrupt.so table in testdata/README.md");
    size_t n = 0;
    for (char *l = table; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (!strncmp(l, "Whole-module", 12))
            break;
        if (strncmp(l, "| `apfix_rec_", 13) != 0)
            continue;
        char *eol = strchr(l, '\n');
        char *col1 = strchr(l + 1, '|');
        cr_assert_not_null(col1);
        char *last = eol ? eol : l + strlen(l);
        while (last > l && last[-1] != '|')
            last--;
        char *cell = last - 1;
        while (cell > l && cell[-1] != '|')
            cell--;
        int reason = 0;
        char *ref = strstr(cell, "refused, `");
        if (ref && ref >= last)
            ref = NULL;
        if (ref)
            for (size_t k = 0; k < sizeof(reason_names) / sizeof(reason_names[0]); k++)
                if (!strncmp(ref + 10, reason_names[k].name, strlen(reason_names[k].name)) &&
                    ref[10 + strlen(reason_names[k].name)] == '`')
                    reason = reason_names[k].reason;
        cr_assert(!ref || reason, "unknown reason in README row: %.*s", (int)(last - l), l);
        for (char *r = l; (r = strstr(r, "`apfix_rec_")) && r < col1; r++) {
            cr_assert_lt(n, max);
            out[n++] = reason;
        }
    }
    free(md);
    cr_assert_gt(n, 10, "too few rows parsed from testdata/README.md");
    return n;
}

Test(altdump, check_corrupt_reasons)
{
    const char *profiles[] = {"baseline", "all", "host"};
    for (size_t p = 0; p < 3; p++) {
        struct result r = RUN("--check", "--cpu", profiles[p], "libcorrupt.so");
        cr_assert_eq(r.rc, 1, "exit %d: %s %s", r.rc, r.out, r.err);
        int corrupt_reasons[64];
        size_t n = readme_reasons(corrupt_reasons, 64), lines = 0;
        for (char *l = r.out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
            lines++;
        size_t refused = 0;
        for (size_t i = 0; i < n; i++) {
            char key[64];
            snprintf(key, sizeof(key), "libcorrupt.so: site %zu at 0x", i);
            char *line = strstr(r.out, key);
            if (!corrupt_reasons[i]) {
                cr_assert_null(line, "valid site %zu reported: %s", i, r.out);
                continue;
            }
            refused++;
            cr_assert_not_null(line, "site %zu not reported: %s", i, r.out);
            char *eol = strchr(line, '\n');
            cr_assert_not_null(eol);
            *eol = 0;
            cr_assert(strstr(line, altpatch_strreason(corrupt_reasons[i])),
                      "site %zu: want '%s' in '%s'", i, altpatch_strreason(corrupt_reasons[i]),
                      line);
            *eol = '\n';
        }
        cr_assert_eq(lines, refused, "one line per refused site: %s", r.out);
        result_free(&r);
    }
}

Test(altdump, check_bad_table_and_version)
{
    struct result r = RUN("--check", "libcorrupt_badtable.so");
    cr_assert_eq(r.rc, 3);
    cr_assert(strstr(r.err, "altdump: libcorrupt_badtable.so: altinstructions holds 31 bytes, "
                            "not a multiple of the 14-byte record"),
              "%s", r.err);
    result_free(&r);
    r = RUN("--check", "libcorrupt_badversion.so");
    cr_assert_eq(r.rc, 3);
    cr_assert(strstr(r.err, "altdump: libcorrupt_badversion.so: unsupported altpatch note "
                            "(format version 99"),
              "%s", r.err);
    result_free(&r);
}
#endif

Test(altdump, check_good)
{
    struct result r = RUN("--check", "sites.elf", "sites.o");
    cr_assert_eq(r.rc, 0, "%s %s", r.out, r.err);
    cr_assert(strstr(r.out, "sites.elf: ok, 9 sites, 10 records\n"), "%s", r.out);
    cr_assert(strstr(r.out, "sites.o: ok, 9 sites, 10 records\n"), "%s", r.out);
    result_free(&r);
}

/* --- .o vs linked program -------------------------------------------------- */

/*
 * Reduce --json output to what must not depend on addresses: per site the
 * symbol, offset, length, decision, chosen entry, reason, and the original
 * and final bytes (relative operands are relocated to the site, and every
 * target of the fixture lies in .text, so they are equal).
 */
static char *site_keys(const char *json)
{
    size_t cap = strlen(json) + 1, o = 0;
    char *out = calloc(cap, 1);
    cr_assert_not_null(out);
    const char *want = NULL;
    for (const char *l = json; *l;) {
        const char *eol = strchr(l, '\n');
        size_t len = eol ? (size_t)(eol - l) : strlen(l);
        char line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)(len < 1023 ? len : 1023), l);
        const char *t = line + strspn(line, " ");
        if (!strncmp(t, "\"original\": {", 13) || !strncmp(t, "\"final\": {", 10))
            want = "\"bytes\"";
        else if (want && !strncmp(t, want, strlen(want))) {
            o += (size_t)snprintf(out + o, cap - o, "%s\n", t);
            want = NULL;
        } else if (!strncmp(t, "\"symbol\"", 8) || !strncmp(t, "\"offset\"", 8) ||
                   !strncmp(t, "\"length\"", 8) || !strncmp(t, "\"decision\"", 10) ||
                   !strncmp(t, "\"chosen\"", 8) || !strncmp(t, "\"reason\"", 8) ||
                   !strncmp(t, "\"feature_id\"", 12) || !strncmp(t, "\"flags\"", 7)) {
            o += (size_t)snprintf(out + o, cap - o, "%s\n", t);
        }
        l += len + (eol ? 1 : 0);
    }
    return out;
}

Test(altdump, object_matches_linked_program)
{
    const char *profiles[] = {"baseline", "amd-zen4", "intel-spr", "all"};
    for (size_t p = 0; p < 4; p++) {
        struct result a = RUN("--json", "--cpu", profiles[p], "sites.o");
        struct result b = RUN("--json", "--cpu", profiles[p], "sites.elf");
        cr_assert_eq(a.rc, 0);
        cr_assert_eq(b.rc, 0);
        char *ka = site_keys(a.out), *kb = site_keys(b.out);
        cr_assert_gt(strlen(ka), 200, "nothing extracted: %s", a.out);
        cr_assert(strstr(ka, "\"symbol\": \"alt_call\""), "%s", ka);
        cr_assert_str_eq(ka, kb, "profile %s: .o and linked program differ", profiles[p]);
        /* The addresses do differ: the comparison is not vacuous. */
        cr_assert(strstr(a.out, "\"address\": \"0x100000\""), "%s", a.out);
        cr_assert(strstr(b.out, "\"address\": \"0x401000\""), "%s", b.out);
        free(ka);
        free(kb);
        result_free(&a);
        result_free(&b);
    }
}

/* The lines of --json output @p json that give an address ("address",
 * "replacement_address"), in order (malloc'ed). */
static char *address_lines(const char *json)
{
    size_t cap = strlen(json) + 1, o = 0;
    char *out = calloc(cap, 1);
    cr_assert_not_null(out);
    for (const char *l = json; *l;) {
        const char *eol = strchr(l, '\n');
        size_t len = eol ? (size_t)(eol - l) : strlen(l);
        const char *t = l + strspn(l, " ");
        if ((size_t)(t - l) < len && memmem(t, len - (size_t)(t - l), "address\": \"", 11)) {
            memcpy(out + o, t, len - (size_t)(t - l));
            o += len - (size_t)(t - l);
            out[o++] = '\n';
        }
        l += len + (eol ? 1 : 0);
    }
    return out;
}

/*
 * The sites (site_keys()) of object @p obj and of the program or library
 * @p linked from it, under @p profile: the same, at other addresses.
 * Returned (malloc'ed) for the caller's own checks.
 */
static char *same_sites(const char *obj, const char *linked, const char *profile)
{
    struct result a = RUN("--json", "--cpu", profile, obj);
    struct result b = RUN("--json", "--cpu", profile, linked);
    cr_assert_eq(a.rc, 0, "%s: %s", obj, a.err);
    cr_assert_eq(b.rc, 0, "%s: %s", linked, b.err);
    cr_assert(strstr(a.out, "\"type\": \"REL\""), "%s", a.out);
    cr_assert(strstr(b.out, "\"type\": \"DYN\"") || strstr(b.out, "\"type\": \"EXEC\""), "%s",
              b.out);
    char *ka = site_keys(a.out), *kb = site_keys(b.out);
    cr_assert_str_eq(ka, kb, "profile %s: %s and %s differ", profile, obj, linked);
    /* an object's sections are laid out by altdump, the linked file's by the
     * linker: the sites are the same at other addresses */
    char *aa = address_lines(a.out), *ab = address_lines(b.out);
    cr_assert_gt(strlen(aa), 0, "%s: no address: %s", obj, a.out);
    cr_assert_gt(strlen(ab), 0, "%s: no address: %s", linked, b.out);
    cr_assert_str_neq(aa, ab, "profile %s: %s and %s at the same addresses", profile, obj, linked);
    free(aa);
    free(ab);
    free(kb);
    result_free(&a);
    result_free(&b);
    return ka;
}

/* The same on C code compiled with the real macros: live.c's .o and the PIE linked from it. */
Test(altdump, object_matches_linked_program_c)
{
    const char *profiles[] = {"baseline", "host", "all"};
    for (size_t p = 0; p < 3; p++) {
        char *k = same_sites(ALTDUMP_LIVE_OBJ, ALTDUMP_LIVE, profiles[p]);
        cr_assert(strstr(k, "\"symbol\": \"fs_self\""), "%s", k);
        free(k);
    }
}

/* 20 function sections: the .o's text is merged into one region; same sites as the .so. */
Test(altdump, object_matches_linked_many_sections)
{
    const char *profiles[] = {"baseline", "all"};
    for (size_t p = 0; p < 2; p++) {
        char *k = same_sites("many.o", "many.so", profiles[p]);
        cr_assert(strstr(k, "\"symbol\": \"f19\""), "%s", k);
        if (p == 1) /* call g19, relocated from the replacement to the site */
            cr_assert(strstr(k, "\"bytes\": \"e8 01 00 00 00\""), "%s", k);
        free(k);
    }
}

/*
 * Sites in COMDAT groups ("a?R", as alternative.h emits for C++ inline
 * functions): the .o holds three altinstructions and three
 * altinstr_replacement sections, which altdump joins as the linker does.
 */
Test(altdump, object_matches_linked_comdat_groups)
{
    const char *profiles[] = {"baseline", "all"};
    for (size_t p = 0; p < 2; p++) {
        char *k = same_sites("groups.o", "groups.so", profiles[p]);
        /* one site per group and one in .text, every one replaced (feature "always") */
        cr_assert(strstr(k, "\"symbol\": \"grp_plain\""), "%s", k);
        cr_assert(strstr(k, "\"symbol\": \"grp_one\""), "%s", k);
        cr_assert(strstr(k, "\"symbol\": \"grp_two\""), "%s", k);
        /* call grp_two_helper, relocated from the third replacement section to the site */
        cr_assert(strstr(k, "\"bytes\": \"e8 01 00 00 00\""), "%s", k);
        free(k);
    }
    struct result t = RUN("groups.o");
    cr_assert_eq(t.rc, 0, "%s", t.err);
    cr_assert(strstr(t.out, "REL, altpatch format 1, 3 records, 3 sites"), "%s", t.out);
    cr_assert(strstr(t.out, "3 replaced, 0 kept, 0 refused"), "%s", t.out);
    result_free(&t);
}

/* The runtime side: groups.o linked into a program with the shared library; apply patches all 3. */
Test(altdump, comdat_groups_patched_at_runtime)
{
    struct result r = run_exe(ALTDUMP_GROUPS_RUN, (const char *const[]){NULL});
    cr_assert_eq(r.rc, 0, "out: %s err: %s", r.out, r.err);
    cr_assert_str_eq(r.out, "apply 0 foreach 0 sites 3 patched 3 grp_two 22\n");
    result_free(&r);
}

/* --- bad input ------------------------------------------------------------- */

static char tmpdir[64];

static void mktmp(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/altdump-bad-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rmtmp(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

/* Write a variant of sites.elf changed by @p edit into tmpdir/@p name; returns its path. */
static char *variant(const char *name, void (*edit)(uint8_t *b, size_t *len))
{
    size_t len;
    char *src = read_file(ALTDUMP_FIXDIR "/sites.elf", &len);
    cr_assert_not_null(src);
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    edit((uint8_t *)src, &len);
    write_file(path, src, len);
    free(src);
    return path;
}

/* Section header of @p name in the image, through libelf. */
static GElf_Shdr shdr_of(uint8_t *b, size_t len, const char *name, size_t *shoff_of_hdr)
{
    cr_assert_neq(elf_version(EV_CURRENT), EV_NONE);
    Elf *e = elf_memory((char *)b, len);
    cr_assert_not_null(e);
    size_t shstrndx;
    cr_assert_eq(elf_getshdrstrndx(e, &shstrndx), 0);
    GElf_Ehdr eh;
    cr_assert_not_null(gelf_getehdr(e, &eh));
    Elf_Scn *scn = NULL;
    GElf_Shdr sh;
    while ((scn = elf_nextscn(e, scn))) {
        cr_assert_not_null(gelf_getshdr(scn, &sh));
        if (!strcmp(elf_strptr(e, shstrndx, sh.sh_name), name)) {
            if (shoff_of_hdr)
                *shoff_of_hdr = eh.e_shoff + elf_ndxscn(scn) * eh.e_shentsize;
            elf_end(e);
            return sh;
        }
    }
    cr_assert_fail("no section %s", name);
    return sh;
}

static void e_truncate(uint8_t *b, size_t *len)
{
    (void)b;
    *len = 700;
}
static void e_class32(uint8_t *b, size_t *len)
{
    (void)len;
    b[EI_CLASS] = ELFCLASS32;
}
static void e_machine(uint8_t *b, size_t *len)
{
    (void)len;
    Elf64_Ehdr *eh = (Elf64_Ehdr *)b;
    eh->e_machine = 183; /* EM_AARCH64 */
}
static void e_shoff(uint8_t *b, size_t *len)
{
    Elf64_Ehdr *eh = (Elf64_Ehdr *)b;
    eh->e_shoff = *len + 0x1000;
}
static void e_secoff(uint8_t *b, size_t *len)
{
    size_t at;
    shdr_of(b, *len, "altinstructions", &at);
    Elf64_Shdr *sh = (Elf64_Shdr *)(b + at);
    sh->sh_offset = 0x7fffff00;
}
static void e_record(uint8_t *b, size_t *len)
{
    GElf_Shdr sh = shdr_of(b, *len, "altinstructions", NULL);
    int32_t off;
    memcpy(&off, b + sh.sh_offset, 4);
    off += 0x100000; /* site 0 moves 1 MiB away */
    memcpy(b + sh.sh_offset, &off, 4);
}
static void e_note_field(uint8_t *b, size_t len, size_t field, int32_t add)
{
    GElf_Shdr sh = shdr_of(b, len, ".note.altpatch", NULL);
    uint8_t *desc = b + sh.sh_offset + 12 + 12; /* nhdr + "altpatch\0" padded */
    int32_t v;
    memcpy(&v, desc + 4 * field, 4);
    v += add;
    memcpy(desc + 4 * field, &v, 4);
}
static void e_version(uint8_t *b, size_t *len)
{
    e_note_field(b, *len, 0, 2); /* version 3: unknown (2 is a pre-patched file) */
}
static void e_table_size(uint8_t *b, size_t *len)
{
    e_note_field(b, *len, 3, -3); /* __stop_altinstructions - 3 */
}
static void e_table_far(uint8_t *b, size_t *len)
{
    e_note_field(b, *len, 2, 0x10000000); /* both bounds of the table move 256 MiB */
    e_note_field(b, *len, 3, 0x10000000);
}

static void e_note_type(uint8_t *b, size_t *len)
{
    GElf_Shdr sh = shdr_of(b, *len, ".note.altpatch", NULL);
    b[sh.sh_offset + 8] ^= 0xff; /* n_type no longer 'APT1' */
}

/* Header offsets of every section named altinstructions in the image; returns how many. */
static size_t alt_shdrs(uint8_t *b, size_t len, size_t *offs, size_t max)
{
    cr_assert_neq(elf_version(EV_CURRENT), EV_NONE);
    Elf *e = elf_memory((char *)b, len);
    cr_assert_not_null(e);
    size_t shstrndx, n = 0;
    cr_assert_eq(elf_getshdrstrndx(e, &shstrndx), 0);
    GElf_Ehdr eh;
    cr_assert_not_null(gelf_getehdr(e, &eh));
    GElf_Shdr sh;
    for (Elf_Scn *scn = NULL; (scn = elf_nextscn(e, scn));) {
        cr_assert_not_null(gelf_getshdr(scn, &sh));
        if (!strcmp(elf_strptr(e, shstrndx, sh.sh_name), "altinstructions") && n < max)
            offs[n++] = eh.e_shoff + elf_ndxscn(scn) * eh.e_shentsize;
    }
    elf_end(e);
    return n;
}

/* groups.o with its altinstructions section headers changed by @p edit: refused, one line, exit 3. */
static void bad_groups(const char *name, void (*edit)(Elf64_Shdr *sh, size_t k, size_t len),
                       const char *msg)
{
    size_t len, offs[8];
    uint8_t *b = (uint8_t *)read_file(ALTDUMP_FIXDIR "/groups.o", &len);
    cr_assert_not_null(b);
    size_t n = alt_shdrs(b, len, offs, 8);
    cr_assert_eq(n, 3, "groups.o has %zu altinstructions sections", n);
    for (size_t k = 0; k < n; k++) {
        Elf64_Shdr sh;
        memcpy(&sh, b + offs[k], sizeof(sh));
        edit(&sh, k, len);
        memcpy(b + offs[k], &sh, sizeof(sh));
    }
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    write_file(path, b, len);
    free(b);
    struct result r = RUN("--json", path);
    cr_assert_eq(r.rc, 3, "%s: exit %d, stderr %s", name, r.rc, r.err);
    cr_assert(strstr(r.err, msg), "%s: want '%s' in '%s'", name, msg, r.err);
    cr_assert(strchr(r.err, '\n') == r.err + strlen(r.err) - 1, "one line only: %s", r.err);
    result_free(&r);
}

static void g_nobits(Elf64_Shdr *sh, size_t k, size_t len)
{
    (void)len;
    if (k == 2)
        sh->sh_type = SHT_NOBITS;
}

/* Every copy claims the whole file: together they would span 3x the file. */
static void g_whole_file(Elf64_Shdr *sh, size_t k, size_t len)
{
    (void)k;
    sh->sh_offset = 0;
    sh->sh_size = len;
}

Test(altdump, bad_comdat_groups, .init = mktmp, .fini = rmtmp)
{
    bad_groups("nobits.o", g_nobits, "'altinstructions' has no contents");
    bad_groups("whole.o", g_whole_file, "the 3 'altinstructions' sections span 0x");
}

struct bad {
    const char *name;
    void (*edit)(uint8_t *, size_t *);
    int rc;
    const char *msg;
};

Test(altdump, bad_input, .init = mktmp, .fini = rmtmp)
{
    static const struct bad cases[] = {
        {"truncated.elf", e_truncate, 3, "section headers outside the file ([0x"},
        {"class32.elf", e_class32, 3, "not a 64-bit ELF"},
        {"aarch64.elf", e_machine, 3, "not an x86-64 ELF (e_machine 183)"},
        {"shoff.elf", e_shoff, 3, "section headers outside the file"},
        {"secoff.elf", e_secoff, 3, "section 3 'altinstructions' [0x7fffff00, +0x8c) lies outside the file"},
        {"record.elf", e_record, 1, "site 0 at 0x501000 (no symbol): site outside the module's executable sections"},
        {"version.elf", e_version, 3, "unsupported altpatch note (format version 3"},
        {"tablesize.elf", e_table_size, 3, "altinstructions holds 137 bytes, not a multiple of the 14-byte record"},
        {"notetype.elf", e_note_type, 3, "has altinstructions but no altpatch note"},
        {"tablefar.elf", e_table_far, 3, "altinstructions [0x10403000, 0x1040308c) named by the note lies outside the file's sections"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct bad *c = &cases[i];
        char *path = variant(c->name, c->edit);
        const char *modes[] = {"--check", "--size", "--json"};
        for (size_t m = 0; m < 3; m++) {
            struct result r = RUN(modes[m], path);
            char want[512];
            snprintf(want, sizeof(want), "altdump: %s: %s", path, c->msg);
            cr_assert_eq(r.rc, c->rc, "%s %s: exit %d, stderr %s", c->name, modes[m], r.rc, r.err);
            if (c->rc == 1 && m == 0) /* --check reports refusals on stdout */
                cr_assert(strstr(r.out, want + strlen("altdump: ")), "%s: %s", c->name, r.out);
            else
                cr_assert(strstr(r.err, want), "%s %s: want '%s' in stderr '%s'", c->name,
                          modes[m], want, r.err);
            if (c->rc == 3)
                cr_assert(strchr(r.err, '\n') == r.err + strlen(r.err) - 1,
                          "one line only: %s", r.err);
            cr_assert(!strstr(r.err, "no error") && !strstr(r.err, " 0 headers"),
                      "%s: a message that says nothing: %s", c->name, r.err);
            result_free(&r);
        }
    }
}

/* A file with record tables and a broken note is bad input for --compare
 * too (where a file without any tables is allowed). */
Test(altdump, compare_refuses_tables_without_their_note, .init = mktmp, .fini = rmtmp)
{
    char *path = variant("notetype.elf", e_note_type);
    struct result r = RUN("--compare", ALTDUMP_FIXDIR "/plain.elf", path);
    cr_assert_eq(r.rc, 3, "exit %d, stdout %s, stderr %s", r.rc, r.out, r.err);
    cr_assert(strstr(r.err, "has altinstructions but no altpatch note"), "%s", r.err);
    result_free(&r);
}

/* fs_self's name with a newline in it: a name is never printed with a
 * control byte (it would forge an output line). */
static void e_name_newline(uint8_t *b, size_t *len)
{
    GElf_Shdr sh = shdr_of(b, *len, ".strtab", NULL);
    uint8_t *t = b + sh.sh_offset, *hit = NULL;
    for (size_t i = 0; i + 8 <= sh.sh_size && !hit; i++)
        if (!memcmp(t + i, "fs_self", 8))
            hit = t + i;
    cr_assert_not_null(hit, "no fs_self in .strtab");
    hit[2] = '\n';
}

Test(altdump, names_with_control_bytes_are_not_printed, .init = mktmp, .fini = rmtmp)
{
    char *path = variant("newline.elf", e_name_newline);
    const char *modes[] = {"--cpu=all", "--check"};
    for (size_t m = 0; m < 2; m++) {
        struct result r = RUN(modes[m], path);
        cr_assert_eq(r.rc, 0, "%s: exit %d, stderr %s", modes[m], r.rc, r.err);
        cr_assert_null(strstr(r.out, "fs\nself"), "%s", r.out);
        cr_assert_null(strstr(r.err, "fs\nself"), "%s", r.err);
        for (const char *l = r.out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
            cr_assert(l[0] != ':' && strncmp(l, "self", 4), "a forged line: %s", r.out);
        result_free(&r);
    }
}

/*
 * A file that is not ELF (a data file a process maps, --pid) is refused on
 * its first bytes: the rest is never read. Given a 256 MiB file (sparse:
 * zeros after "garbage"), altdump's peak resident memory stays far below
 * it; reading it whole would make every page of its copy resident.
 */
Test(altdump, a_file_that_is_not_elf_is_refused_on_its_header)
{
    char path[] = "/tmp/altdump-notelf-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const long size = 256L << 20;
    cr_assert_eq(write(fd, "garbage", 7), 7);
    cr_assert_eq(ftruncate(fd, size), 0);
    close(fd);
    struct result r = RUN(path);
    unlink(path);
    cr_assert_eq(r.rc, 3, "exit %d, stderr %s", r.rc, r.err);
    cr_assert_not_null(strstr(r.err, "not an ELF file"), "%s", r.err);
    cr_assert_lt(r.maxrss_kib, (size >> 10) / 4, "peak resident %ld KiB for a %ld KiB file",
                 r.maxrss_kib, size >> 10);
    result_free(&r);
}

/* A .o whose code section is SHT_NOBITS of almost 1 GiB: the merged text
 * span would be filled with int3 to that size; refused as larger than the
 * file instead. */
Test(altdump, text_span_larger_than_the_file_is_refused, .init = mktmp, .fini = rmtmp)
{
    size_t len;
    uint8_t *b = (uint8_t *)read_file(ALTDUMP_FIXDIR "/many.o", &len);
    cr_assert_not_null(b);
    size_t at;
    GElf_Shdr sh = shdr_of(b, len, ".text.f10", &at);
    Elf64_Shdr h;
    memcpy(&h, b + at, sizeof(h));
    h.sh_type = SHT_NOBITS;
    h.sh_size = 0x3ff00000;
    memcpy(b + at, &h, sizeof(h));
    (void)sh;
    char path[256];
    snprintf(path, sizeof(path), "%s/nobits-text.o", tmpdir);
    write_file(path, (char *)b, len);
    free(b);
    struct result r = RUN("--size", path);
    cr_assert_eq(r.rc, 3, "exit %d, stderr %s", r.rc, r.err);
    cr_assert(strstr(r.err, "more than the file's"), "%s", r.err);
    result_free(&r);
}

Test(altdump, bad_files, .init = mktmp, .fini = rmtmp)
{
    char text[256], empty[256];
    snprintf(text, sizeof(text), "%s/text.txt", tmpdir);
    snprintf(empty, sizeof(empty), "%s/empty", tmpdir);
    write_file(text, "hello, world\n", 13);
    write_file(empty, "", 0);
    struct result r = RUN(text);
    cr_assert_eq(r.rc, 3);
    cr_assert(strstr(r.err, ": not an ELF file"), "%s", r.err);
    result_free(&r);
    r = RUN(empty);
    cr_assert_eq(r.rc, 3);
    cr_assert(strstr(r.err, ": empty file"), "%s", r.err);
    result_free(&r);
    r = RUN("/nonexistent/file");
    cr_assert_eq(r.rc, 3);
    cr_assert(strstr(r.err, "altdump: /nonexistent/file: cannot open (No such file or directory)"),
              "%s", r.err);
    result_free(&r);
    r = RUN("plain.elf");
    cr_assert_eq(r.rc, 3);
    cr_assert(strstr(r.err, "altdump: plain.elf: no altpatch tables"), "%s", r.err);
    result_free(&r);
    /* The good file still counts; the worst status wins. */
    r = RUN("--check", "sites.elf", text);
    cr_assert_eq(r.rc, 3);
    cr_assert(strstr(r.out, "sites.elf: ok"), "%s", r.out);
    result_free(&r);
}

/* A FIFO, a directory and a device: refused by type before any open that could block. */
Test(altdump, not_regular, .init = mktmp, .fini = rmtmp, .timeout = 20)
{
    char fifo[256];
    snprintf(fifo, sizeof(fifo), "%s/fifo", tmpdir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const struct {
        const char *path, *what;
    } cases[] = {{fifo, "a FIFO"}, {tmpdir, "a directory"}, {"/dev/null", "a character device"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *modes[] = {"--check", "--size", "--json", "--compare"};
        for (size_t m = 0; m < 4; m++) {
            struct result r = m == 3 ? RUN(modes[m], "sites.elf", cases[i].path)
                                     : RUN(modes[m], cases[i].path);
            char want[512];
            snprintf(want, sizeof(want), "altdump: %s: not a regular file (%s)\n", cases[i].path,
                     cases[i].what);
            cr_assert_eq(r.rc, 3, "%s %s: exit %d", cases[i].path, modes[m], r.rc);
            cr_assert_str_eq(r.err, want, "%s %s", cases[i].path, modes[m]);
            result_free(&r);
        }
    }
}

/* Copy the wide.so fixture to tmpdir/@p name (its path into @p path); its size. */
static size_t copy_wide(char *path, size_t size, const char *name)
{
    snprintf(path, size, "%s/%s", tmpdir, name);
    size_t len;
    char *src = read_file(ALTDUMP_FIXDIR "/wide.so", &len);
    cr_assert_not_null(src);
    write_file(path, src, len);
    free(src);
    return len;
}

/*
 * The file truncated while altdump shows it: altdump's output fills a pipe
 * nobody reads yet (it then waits in write()), the file is cut to nothing,
 * and the rest of the output is read. altdump read the file when it opened
 * it: it ends normally with the dump of the file as it was, never killed by
 * a signal (SIGBUS, were the file's pages mapped).
 */
Test(altdump, file_truncated_while_shown, .init = mktmp, .fini = rmtmp, .timeout = 60)
{
    char path[256];
    copy_wide(path, sizeof(path), "wide.so");
    struct result want = RUN(path);
    cr_assert_eq(want.rc, 0, "%s", want.err);

    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    int psz = fcntl(p[1], F_SETPIPE_SZ, 4096);
    if (psz < 0)
        psz = fcntl(p[1], F_GETPIPE_SZ);
    cr_assert_gt(psz, 0);
    cr_assert_gt(strlen(want.out), (size_t)psz * 2, "the dump must not fit the pipe");
    int efd = tmpfile_fd();
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(efd, 2);
        execl(ALTDUMP_BIN, ALTDUMP_BIN, path, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    /* wait until the pipe is full: altdump has opened the file and waits */
    int queued = 0;
    for (int i = 0; i < 20000 && queued < psz; i++) {
        cr_assert_eq(ioctl(p[0], FIONREAD, &queued), 0);
        if (queued < psz)
            usleep(1000);
    }
    cr_assert_eq(queued, psz, "the pipe never filled: %d of %d bytes", queued, psz);
    cr_assert_eq(truncate(path, 0), 0);

    size_t cap = strlen(want.out) + 65536, got = 0;
    char *out = malloc(cap + 1);
    cr_assert_not_null(out);
    for (ssize_t k; got < cap && (k = read(p[0], out + got, cap - got)) != 0;) {
        if (k < 0 && errno == EINTR)
            continue;
        cr_assert_gt(k, 0, "read: %s", strerror(errno));
        got += (size_t)k;
    }
    out[got] = '\0';
    close(p[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    char *err = slurp_fd(efd);
    close(efd);
    cr_assert(WIFEXITED(st), "altdump killed by signal %d after %zu bytes of output",
              WIFSIGNALED(st) ? WTERMSIG(st) : 0, got);
    cr_assert_eq(WEXITSTATUS(st), 0, "exit %d: %s", WEXITSTATUS(st), err);
    cr_assert_str_eq(err, "");
    cr_assert_str_eq(out, want.out, "the dump differs from the file's as it was opened");
    free(out);
    free(err);
    result_free(&want);
}

/*
 * Run altdump with the test's pread preload. Under AddressSanitizer the
 * runtime wants to come first in the initial library list; the preload only
 * wraps pread, so that order check is turned off for this run alone.
 */
static struct result run_preloaded(const char *path)
{
    const char *old = getenv("ASAN_OPTIONS");
    char *saved = old ? strdup(old) : NULL;
    char opts[1024];
    snprintf(opts, sizeof(opts), "%s%sverify_asan_link_order=0", old ? old : "",
             old && *old ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    setenv("LD_PRELOAD", ALTDUMP_CUT_PREAD, 1);
    struct result r = RUN(path);
    unsetenv("LD_PRELOAD");
    if (saved)
        setenv("ASAN_OPTIONS", saved, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(saved);
    return r;
}

/* The file cut to half its size while altdump reads it (a preload truncates
 * it at the first pread): a clear error, exit status 3, no signal. */
Test(altdump, file_truncated_while_read, .init = mktmp, .fini = rmtmp)
{
    char path[256];
    size_t len = copy_wide(path, sizeof(path), "wide.cut");
    struct result r = run_preloaded(path);
    char want[512];
    snprintf(want, sizeof(want), "altdump: %s: truncated while read (%zu bytes when opened)\n",
             path, len);
    cr_assert_eq(r.rc, 3, "exit %d: %s", r.rc, r.err);
    cr_assert_str_eq(r.err, want);
    cr_assert_str_eq(r.out, "");
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq((size_t)st.st_size, len / 2, "the preload did not cut the file");
    result_free(&r);
}

/*
 * The file rewritten while altdump reads it: a section covers the section
 * header table, so the table is read twice, and the second read (a preload)
 * finds the section-name table's header pointing far past the end (the
 * preload leaves "<file>.forged" when it forged that read). altdump keeps
 * what it read first: no signal, a dump or a clear error.
 */
Test(altdump, headers_changed_while_read, .init = mktmp, .fini = rmtmp)
{
    char path[256];
    size_t len = copy_wide(path, sizeof(path), "wide.shift");
    char *b = read_file(path, &len);
    cr_assert_not_null(b);
    Elf64_Ehdr eh;
    memcpy(&eh, b, sizeof(eh));
    cr_assert_gt(eh.e_shnum, 3);
    cr_assert_lt(eh.e_shoff + (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr), len + 1);
    Elf64_Shdr sh;
    char *at = b + eh.e_shoff + sizeof(Elf64_Shdr); /* section 1, before the others */
    memcpy(&sh, at, sizeof(sh));
    sh.sh_type = SHT_PROGBITS;
    sh.sh_offset = eh.e_shoff;
    sh.sh_size = (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr);
    memcpy(at, &sh, sizeof(sh));
    write_file(path, b, len);
    free(b);
    struct result r = run_preloaded(path); /* run_exe: altdump ended by a signal fails here */
    cr_assert(r.rc == 0 || (r.rc == 3 && strstr(r.err, path)), "exit %d: %s", r.rc, r.err);
    char mark[300];
    snprintf(mark, sizeof(mark), "%s.forged", path);
    struct stat st;
    cr_assert_eq(stat(mark, &st), 0, "the preload did not forge a second read of the headers");
    unlink(mark);
    result_free(&r);
}

/* Whether a line "OFFSET LENGTH" of @p reads (the preload's log) covers a
 * byte of [off, off + len). */
static bool read_within(const char *reads, uint64_t off, uint64_t len)
{
    for (const char *l = reads; *l;) {
        unsigned long long o, n;
        cr_assert_eq(sscanf(l, "%llu %llu", &o, &n), 2, "log line: %s", l);
        if (o < off + len && off < o + n)
            return true;
        const char *eol = strchr(l, '\n');
        l = eol ? eol + 1 : l + strlen(l);
    }
    return false;
}

/*
 * What altdump reads of an object (a preload logs every read): never a
 * relocation section that is neither loaded nor applied -- of debugging
 * information (live.c's object is built with -g: .rela.debug_*), or SHT_REL
 * (a copy whose .rela.eh_frame, which relocates a loaded section, is made
 * SHT_REL) -- and every one it applies (.rela.text, .rela.altinstr_*).
 */
Test(altdump, object_relocations_not_applied_not_read, .init = mktmp, .fini = rmtmp)
{
    for (int rel = 0; rel < 2; rel++) {
        char path[256], log[300];
        snprintf(path, sizeof(path), "%s/live%d.logged", tmpdir, rel);
        snprintf(log, sizeof(log), "%s.reads", path);
        size_t len;
        char *b = read_file(ALTDUMP_LIVE_OBJ, &len);
        cr_assert_not_null(b);
        Elf64_Ehdr eh;
        memcpy(&eh, b, sizeof(eh));
        cr_assert_eq(eh.e_type, ET_REL);
        cr_assert_leq(eh.e_shoff + (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr), len);
        Elf64_Shdr *sh = calloc(eh.e_shnum, sizeof(*sh));
        cr_assert_not_null(sh);
        memcpy(sh, b + eh.e_shoff, eh.e_shnum * sizeof(*sh));
        const char *names = b + sh[eh.e_shstrndx].sh_offset;
        size_t made_rel = 0;
        for (size_t i = 1; rel && i < eh.e_shnum; i++)
            if (!strcmp(names + sh[i].sh_name, ".rela.eh_frame")) {
                cr_assert(sh[sh[i].sh_info].sh_flags & SHF_ALLOC);
                sh[i].sh_type = SHT_REL;
                made_rel++;
            }
        cr_assert_eq(made_rel, (size_t)rel, "no .rela.eh_frame in %s", ALTDUMP_LIVE_OBJ);
        memcpy(b + eh.e_shoff, sh, eh.e_shnum * sizeof(*sh));
        write_file(path, b, len);
        struct result r = run_preloaded(path);
        cr_assert_eq(r.rc, 0, "exit %d: %s", r.rc, r.err);
        cr_assert(strstr(r.out, "fs_self"), "%s", r.out);
        char *reads = read_file(log, NULL);
        cr_assert_not_null(reads, "the preload logged no read");
        size_t skipped = 0, debug = 0, rels = 0, applied = 0;
        for (size_t i = 1; i < eh.e_shnum; i++) {
            if ((sh[i].sh_type != SHT_RELA && sh[i].sh_type != SHT_REL) || !sh[i].sh_size)
                continue;
            const char *name = names + sh[i].sh_name;
            bool target_loaded = sh[i].sh_info < eh.e_shnum &&
                                 (sh[sh[i].sh_info].sh_flags & SHF_ALLOC);
            bool read = read_within(reads, sh[i].sh_offset, sh[i].sh_size);
            if (sh[i].sh_type == SHT_RELA && target_loaded) {
                cr_assert(read, "%s: %s (applied) not read", path, name);
                applied++;
            } else if (!(sh[i].sh_flags & SHF_ALLOC)) {
                cr_assert(!read, "%s: %s read (neither loaded nor applied)", path, name);
                skipped++;
                debug += !strncmp(name, ".rela.debug_", 12);
                rels += sh[i].sh_type == SHT_REL;
            }
        }
        cr_assert_gt(applied, 0);
        cr_assert_gt(debug, 0, "%s has no .rela.debug_* section (built without -g?)",
                     ALTDUMP_LIVE_OBJ);
        cr_assert_eq(rels, (size_t)rel);
        cr_log_info("%s: %zu relocation sections not read, %zu read", path, skipped, applied);
        free(reads);
        free(sh);
        free(b);
        result_free(&r);
    }
}

Test(altdump, usage)
{
    struct result r = run_v((const char *const[]){NULL});
    cr_assert_eq(r.rc, 2);
    cr_assert(strstr(r.err, "no input file"), "%s", r.err);
    result_free(&r);
    r = RUN("--cpu", "pentium2", "sites.elf");
    cr_assert_eq(r.rc, 2);
    cr_assert(strstr(r.err, "unknown CPU profile 'pentium2'"), "%s", r.err);
    result_free(&r);
    r = RUN("--cpu", "all,+nosuchfeature", "sites.elf");
    cr_assert_eq(r.rc, 2);
    result_free(&r);
    r = RUN("--pid", "abc");
    cr_assert_eq(r.rc, 2);
    result_free(&r);
    r = RUN("--compare", "sites.elf");
    cr_assert_eq(r.rc, 2);
    result_free(&r);
    r = RUN("--bogus");
    cr_assert_eq(r.rc, 2);
    result_free(&r);
    r = RUN("--help");
    cr_assert_eq(r.rc, 0);
    cr_assert(strstr(r.out, "Usage: altdump"), "%s", r.out);
    result_free(&r);
    r = RUN("--version");
    cr_assert_eq(r.rc, 0);
    cr_assert(strstr(r.out, "altdump (altpatch) "), "%s", r.out);
    result_free(&r);
}

/* --- objects of both record formats in one program ----------------------- */

/* The linker keeps the first object's note (format 3): its site is patched,
 * the format-1 object's keeps its original; altdump says so. */
Test(altdump, mixed_formats)
{
    struct result r = run_exe(ALTDUMP_MIXED, (const char *const[]){NULL});
    cr_assert_eq(r.rc, 0, "%s%s", r.out, r.err);
    cr_assert(strstr(r.out, "mixed rc=0 a=2 b=1"), "%s", r.out);
    result_free(&r);
    r = RUN(ALTDUMP_MIXED);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert(strstr(r.out, "altpatch format 3, 1 records, 1 sites"), "%s", r.out);
    cr_assert(strstr(r.err, "also has 14 bytes of format-1 records in altinstructions that its "
                            "note (format 3) does not describe"),
              "%s", r.err);
    result_free(&r);
    r = RUN("--check", ALTDUMP_MIXED);
    cr_assert_eq(r.rc, 1, "%s%s", r.out, r.err);
    cr_assert_null(strstr(r.out, "ok, "), "%s", r.out);
    result_free(&r);
}

/* --- cross-check with a live process --------------------------------------- */

struct live {
    pid_t pid;
    int in; /* write end of its stdin: close to let it exit */
};

static struct live live_start(bool off, const char *lib)
{
    int pin[2], pout[2];
    cr_assert_eq(pipe(pin), 0);
    cr_assert_eq(pipe(pout), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        close(pin[1]);
        close(pout[0]);
        unsetenv("ALTPATCH_CLEARCPUID");
        if (off)
            setenv("ALTPATCH_OFF", "1", 1);
        else
            unsetenv("ALTPATCH_OFF");
        execl(ALTDUMP_LIVE, ALTDUMP_LIVE, lib, (char *)NULL);
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    char buf[64] = "";
    ssize_t k = read(pout[0], buf, sizeof(buf) - 1);
    close(pout[0]);
    cr_assert_gt(k, 0, "live fixture did not start");
    cr_assert(!strncmp(buf, "ready ", 6), "live fixture said '%s'", buf);
    return (struct live){pid, pin[1]};
}

static void live_stop(struct live *l)
{
    close(l->in);
    int st;
    cr_assert_eq(waitpid(l->pid, &st, 0), l->pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Parse "pid N: T sites in M modules: a final, b original, c mismatch, d unreadable, e refused". */
static void summary(const char *out, size_t v[6])
{
    const char *s = strstr(out, " sites in ");
    cr_assert_not_null(s, "%s", out);
    while (s > out && s[-1] != ' ')
        s--;
    unsigned long long t, m, a, b, c, d, e;
    cr_assert_eq(sscanf(s, "%llu sites in %llu modules: %llu final, %llu original, %llu mismatch, "
                           "%llu unreadable, %llu refused",
                        &t, &m, &a, &b, &c, &d, &e),
                 7, "%s", out);
    v[0] = t, v[1] = a, v[2] = b, v[3] = c, v[4] = d, v[5] = e;
}

Test(altdump, pid_final_after_apply)
{
    struct live l = live_start(false, NULL);
    char pid[32];
    snprintf(pid, sizeof(pid), "%d", (int)l.pid);
    struct result r = RUN("--pid", pid);
    cr_assert_eq(r.rc, 0, "exit %d: %s %s", r.rc, r.out, r.err);
    size_t v[6];
    summary(r.out, v);
    cr_assert_geq(v[0], 5, "the live fixture has 5 sites: %s", r.out);
    cr_assert_eq(v[1], v[0], "every site must hold its final bytes: %s", r.out);
    cr_assert(strstr(r.out, ALTDUMP_LIVE), "%s", r.out);
    for (const char *s = r.out; (s = strstr(s, "  site ")); s++)
        cr_assert(!strncmp(strstr(s, ": ") + 2, "final", 5), "%s", s);
    result_free(&r);

    /* Planned for a CPU with nothing: sites the host patched now mismatch. */
    r = RUN("--pid", pid, "--cpu", "baseline");
    summary(r.out, v);
    if (altpatch_cpu_has(X86_FEATURE_FSGSBASE) || altpatch_cpu_has(X86_FEATURE_RDTSCP) ||
        altpatch_cpu_has(X86_FEATURE_LFENCE_RDTSC)) {
        cr_assert_eq(r.rc, 1, "%s", r.out);
        cr_assert_geq(v[3], 1, "%s", r.out);
        cr_assert(strstr(r.out, "    memory:   "), "%s", r.out);
    }
    result_free(&r);
    live_stop(&l);
}

Test(altdump, pid_original_when_off)
{
    struct live l = live_start(true, NULL);
    char pid[32];
    snprintf(pid, sizeof(pid), "%d", (int)l.pid);
    struct result r = RUN("--pid", pid, "--json");
    cr_assert_eq(r.rc, 0, "exit %d: %s %s", r.rc, r.out, r.err);
    cr_assert(strstr(r.out, "\"state\": \"final\"") || strstr(r.out, "\"state\": \"original\""));
    if (altpatch_cpu_has(X86_FEATURE_FSGSBASE) || altpatch_cpu_has(X86_FEATURE_RDTSCP))
        cr_assert(strstr(r.out, "\"state\": \"original\""), "%s", r.out);
    cr_assert_null(strstr(r.out, "\"state\": \"mismatch\""), "%s", r.out);
    result_free(&r);
    live_stop(&l);
}

#if ALTDUMP_HAVE_CORRUPT
/* A process that loaded the corrupt-record library: refused sites are original, none mismatch. */
Test(altdump, pid_with_refused_sites)
{
    struct live l = live_start(false, ALTDUMP_FIXDIR "/libcorrupt.so");
    char pid[32];
    snprintf(pid, sizeof(pid), "%d", (int)l.pid);
    struct result r = RUN("--pid", pid);
    cr_assert_eq(r.rc, 0, "exit %d: %s %s", r.rc, r.out, r.err);
    cr_assert(strstr(r.out, "/libcorrupt.so: bias 0x"), "%s", r.out);
    size_t v[6];
    summary(r.out, v);
    cr_assert_eq(v[3] + v[4], 0, "%s", r.out);
    cr_assert_geq(v[2], 10, "refused sites in the file's text stay original: %s", r.out);
    cr_assert_geq(v[5], 3, "refused sites outside the file's sections: %s", r.out);
    result_free(&r);
    live_stop(&l);
}
#endif

Test(altdump, pid_bad)
{
    struct result r = RUN("--pid", "999999999");
    cr_assert_eq(r.rc, 3);
    cr_assert(strstr(r.err, "altdump: pid 999999999: cannot open /proc/999999999/maps"), "%s",
              r.err);
    result_free(&r);
    char self[32];
    snprintf(self, sizeof(self), "%d", (int)getpid());
    r = RUN("--pid", self); /* this test program: static library, no sites of its own? */
    cr_assert(r.rc == 0 || r.rc == 3, "%d %s", r.rc, r.err);
    result_free(&r);
}

#endif /* ALTDUMP_BIN */

/* --- Linux kernel images and modules (kernel.S in both record layouts) ------ */

/* Value of symbol @p name in the ELF file @p path (0 when absent). */
static uint64_t elf_sym(const char *path, const char *name)
{
    size_t len;
    char *b = read_file(path, &len);
    cr_assert_not_null(b, "%s", path);
    cr_assert_neq(elf_version(EV_CURRENT), EV_NONE);
    Elf *e = elf_memory(b, len);
    cr_assert_not_null(e);
    uint64_t v = 0;
    for (Elf_Scn *scn = NULL; (scn = elf_nextscn(e, scn));) {
        GElf_Shdr sh;
        cr_assert_not_null(gelf_getshdr(scn, &sh));
        if (sh.sh_type != SHT_SYMTAB)
            continue;
        Elf_Data *d = elf_getdata(scn, NULL);
        for (size_t i = 0; d && i < d->d_size / sizeof(Elf64_Sym); i++) {
            GElf_Sym s;
            cr_assert_not_null(gelf_getsym(d, (int)i, &s));
            if (strcmp(elf_strptr(e, sh.sh_link, s.st_name), name) == 0)
                v = s.st_value;
        }
    }
    elf_end(e);
    free(b);
    return v;
}

/* Size of section @p name of the ELF file @p path. */
static uint64_t elf_section_size(const char *path, const char *name)
{
    size_t len, shstrndx;
    char *b = read_file(path, &len);
    cr_assert_not_null(b, "%s", path);
    Elf *e = elf_memory(b, len);
    cr_assert_not_null(e);
    cr_assert_eq(elf_getshdrstrndx(e, &shstrndx), 0);
    uint64_t size = 0;
    for (Elf_Scn *scn = NULL; (scn = elf_nextscn(e, scn));) {
        GElf_Shdr sh;
        cr_assert_not_null(gelf_getshdr(scn, &sh));
        if (strcmp(elf_strptr(e, shstrndx, sh.sh_name), name) == 0)
            size = sh.sh_size;
    }
    elf_end(e);
    free(b);
    return size;
}

/* The text block of site @p i in the table view @p out (malloc'ed). */
static char *site_block(const char *out, int i)
{
    char head[32];
    snprintf(head, sizeof(head), "\nsite %d at ", i);
    const char *p = strstr(out, head);
    cr_assert_not_null(p, "no site %d in\n%s", i, out);
    const char *end = strstr(p + 1, "\nsite ");
    size_t n = end ? (size_t)(end - p) : strlen(p);
    char *b = malloc(n + 1);
    cr_assert_not_null(b);
    memcpy(b, p, n);
    b[n] = 0;
    return b;
}

/* The decision of site @p i and, when @p final_hex, that its final bytes start so. */
static void want_site(const char *out, int i, const char *decision, const char *final_hex)
{
    char *b = site_block(out, i);
    cr_assert(strstr(b, decision), "site %d: want '%s' in\n%s", i, decision, b);
    if (final_hex) {
        const char *f = strstr(b, "  final:\n");
        cr_assert_not_null(f, "%s", b);
        char hex[256] = "";
        /* "    0xADDR  bytes...  text" per instruction: join the bytes columns */
        for (const char *l = f + 9; strncmp(l, "    0x", 6) == 0;) {
            const char *sp = strstr(l + 6, "  ");
            cr_assert_not_null(sp);
            size_t n = strnlen(sp + 2, 34);
            strncat(hex, sp + 2, n);
            const char *nl = strchr(l, '\n');
            if (!nl)
                break;
            l = nl + 1;
        }
        /* collapse the column padding */
        char norm[256];
        size_t k = 0;
        for (size_t j = 0; hex[j] && k + 1 < sizeof(norm); j++)
            if (hex[j] != ' ' || (k && norm[k - 1] != ' '))
                norm[k++] = hex[j];
        norm[k] = 0;
        cr_assert(strncmp(norm, final_hex, strlen(final_hex)) == 0,
                  "site %d: final bytes '%s', want '%s...'", i, norm, final_hex);
    }
    free(b);
}

Test(altdump, kernel_layouts)
{
    static const struct {
        const char *file, *head;
        unsigned recsize;
        const char *ids[4];
    } cases[] = {
        {"kernel61.o", "Linux kernel module 6.1.0-99-test (vermagic), 12-byte records (version < "
                       "6.3), feature names of 6.1, 4 records, 4 sites",
         12, {"LFENCE_RDTSC (3*32+18), flags none", "XENPV (8*32+16), flags NOT",
              "BUG_SPECTRE_V1 (22*32+15), flags none", "AVX2 (9*32+5)"}},
        {"kernel61.elf", "EXEC, Linux kernel 6.1.0-99-test (linux_banner), 12-byte records", 12,
         {"LFENCE_RDTSC (3*32+18)", "XENPV (8*32+16), flags NOT", "BUG_SPECTRE_V1", NULL}},
        {"kernel612.o", "Linux kernel module 6.12.99+test (vermagic), 14-byte records (version >= "
                        "6.3), feature names of 6.12, 6 records, 6 sites",
         14, {"LFENCE_RDTSC (20*32+2), flags none", "XENPV (8*32+16), flags NOT",
              "ALWAYS (3*32+21), flags DIRECT_CALL", NULL}},
        {"kernel612.elf", "EXEC, Linux kernel 6.12.99+test (linux_banner), 14-byte records", 14,
         {"LFENCE_RDTSC (20*32+2)", "ALWAYS (3*32+21), flags DIRECT_CALL", NULL, NULL}},
        {"kernelnover.o", "Linux kernel module of unknown version (no version string), 14-byte "
                          "records (no version found; size a multiple of 14 only)",
         14, {"LFENCE_RDTSC (20*32+2)", NULL, NULL, NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct result r = RUN("--cpu", "baseline", cases[i].file);
        cr_assert_eq(r.rc, 0, "%s: exit %d: %s", cases[i].file, r.rc, r.err);
        cr_assert(strstr(r.out, cases[i].head), "%s: want '%s' in\n%s", cases[i].file,
                  cases[i].head, r.out);
        for (size_t k = 0; k < 4 && cases[i].ids[k]; k++)
            cr_assert(strstr(r.out, cases[i].ids[k]), "%s: want '%s'", cases[i].file,
                      cases[i].ids[k]);
        result_free(&r);
        /* records == section size / record size, counted from the section header */
        char path[512], want[64];
        snprintf(path, sizeof(path), "%s/%s", ALTDUMP_FIXDIR, cases[i].file);
        uint64_t size = elf_section_size(path, ".altinstructions");
        cr_assert_gt(size, 0);
        r = RUN("--json", cases[i].file);
        cr_assert_eq(r.rc, 0, "%s", r.err);
        snprintf(want, sizeof(want), "\"records\": %llu,",
                 (unsigned long long)(size / cases[i].recsize));
        cr_assert(strstr(r.out, want), "%s: want %s", cases[i].file, want);
        snprintf(want, sizeof(want), "\"record_size\": %u,", cases[i].recsize);
        cr_assert(strstr(r.out, want), "%s: want %s", cases[i].file, want);
        cr_assert(strstr(r.out, "\"refused\": 0,"), "%s", cases[i].file);
        result_free(&r);
    }
}

/* The kernel's own feature set per profile, and +NAME/-NAME edits with its names. */
Test(altdump, kernel_profiles)
{
    const char *files[] = {"kernel61.o", "kernel61.elf", "kernel612.o", "kernel612.elf"};
    for (size_t i = 0; i < 4; i++) {
        const char *f = files[i];
        /* baseline: an unknown CPU; the kernel assumes Spectre v1, is no Xen PV guest */
        struct result r = RUN("--cpu", "baseline", f);
        cr_assert_eq(r.rc, 0, "%s: %s", f, r.err);
        want_site(r.out, 0, "kept original", "0f 31 90 90 90");
        want_site(r.out, 1, "replaced by entry 0 (not XENPV)", "fa ");
        want_site(r.out, 2, "replaced by entry 0 (BUG_SPECTRE_V1)", "0f ae e8");
        want_site(r.out, 3, "kept original", "e8 ");
        result_free(&r);
        /* edits by the kernel's names (header spelling, any case, or cpuinfo's) */
        r = RUN("--cpu", "baseline,-BUG_SPECTRE_V1,+lfence_rdtsc,+X86_FEATURE_AVX2", f);
        cr_assert_eq(r.rc, 0, "%s: %s", f, r.err);
        want_site(r.out, 0, "replaced by entry 0 (LFENCE_RDTSC)", "0f ae e8 0f 31");
        want_site(r.out, 2, "kept original", "90 90 90");
        want_site(r.out, 3, "replaced by entry 0 (AVX2)", "e8 ");
        result_free(&r);
        /* all: a Xen PV guest too, so the paravirt call stays */
        r = RUN("--cpu", "all", f);
        cr_assert_eq(r.rc, 0, "%s: %s", f, r.err);
        want_site(r.out, 1, "kept original", "ff 15");
        result_free(&r);
        r = RUN("--cpu", "all,-xenpv", f);
        cr_assert_eq(r.rc, 0, "%s: %s", f, r.err);
        want_site(r.out, 1, "replaced by entry 0 (not XENPV)", "fa ");
        result_free(&r);
        /* the AMD model: LFENCE serialises RDTSC */
        r = RUN("--cpu", "amd-zen4", f);
        cr_assert_eq(r.rc, 0, "%s: %s", f, r.err);
        want_site(r.out, 0, "replaced by entry 0 (LFENCE_RDTSC)", "0f ae e8 0f 31");
        result_free(&r);
        /* a name the kernel does not have: usage error, nothing printed */
        r = RUN("--cpu", "all,+NOPE", f);
        cr_assert_eq(r.rc, 2, "%s", f);
        cr_assert(strstr(r.err, "--cpu: 'NOPE' is no X86_FEATURE or X86_BUG name of Linux 6.1"),
                  "%s: %s", f, r.err);
        cr_assert_str_eq(r.out, "");
        result_free(&r);
    }
    /* a kernel name is no altpatch feature: the kernel image reads, the program does not */
    struct result r = RUN("--check", "--cpu", "all,-xenpv", "kernel61.o", "sites.elf");
    cr_assert_eq(r.rc, 2);
    cr_assert(strstr(r.out, "kernel61.o: ok, 4 sites, 4 records"), "%s", r.out);
    cr_assert(strstr(r.err, "sites.elf: --cpu: bad feature edit list '-xenpv'"), "%s", r.err);
    result_free(&r);
}

/* ALT_FLAG_DIRECT_CALL: the target from the image's own pointer, else decided at boot. */
Test(altdump, kernel_direct_call)
{
    uint64_t nop_site = elf_sym(ALTDUMP_FIXDIR "/kernel612.elf", "nop_call");
    uint64_t nop_slot = elf_sym(ALTDUMP_FIXDIR "/kernel612.elf", "pv_nop");
    uint64_t site = elf_sym(ALTDUMP_FIXDIR "/kernel612.elf", "direct_call");
    uint64_t target = elf_sym(ALTDUMP_FIXDIR "/kernel612.elf", "native_irq_disable");
    uint64_t slot = elf_sym(ALTDUMP_FIXDIR "/kernel612.elf", "pv_irq_disable");
    cr_assert(site && target && slot && nop_site && nop_slot);
    uint32_t rel = (uint32_t)(target - (site + 5));
    char dec[256], fin[64];
    snprintf(dec, sizeof(dec),
             "replaced by entry 0 (ALWAYS): direct call via *0x%llx <pv_irq_disable>: 0x%llx "
             "<native_irq_disable>",
             (unsigned long long)slot, (unsigned long long)target);
    snprintf(fin, sizeof(fin), "e8 %02x %02x %02x %02x", rel & 0xff, (rel >> 8) & 0xff,
             (rel >> 16) & 0xff, rel >> 24);
    const char *profiles[] = {"baseline", "all"};
    for (size_t p = 0; p < 2; p++) {
        struct result r = RUN("--cpu", profiles[p], "kernel612.elf");
        cr_assert_eq(r.rc, 0, "%s", r.err);
        want_site(r.out, 5, dec, fin);
        char *b = site_block(r.out, 5);
        cr_assert(strstr(b, "nop\n"), "%s", b); /* call + one-byte NOP fill the 6 bytes */
        free(b);
        /* a pointer to nop_func: no call left, the 6 bytes are one NOP */
        char nop[160];
        snprintf(nop, sizeof(nop), "site 4 at 0x%llx <nop_call+0x0>", (unsigned long long)nop_site);
        want_site(r.out, 4, nop, NULL);
        snprintf(nop, sizeof(nop), "direct call via *0x%llx <pv_nop>: nop_func, the call becomes NOPs",
                 (unsigned long long)nop_slot);
        want_site(r.out, 4, nop, "66 0f 1f 44 00 00");
        result_free(&r);
    }
    /* a module's pointer is set at load: the final shown is the indirect call itself */
    struct result r = RUN("--cpu", "all", "kernel612.o");
    cr_assert_eq(r.rc, 0, "%s", r.err);
    want_site(r.out, 5, "<pv_irq_disable>: target decided at boot", "ff 15 ");
    want_site(r.out, 5, "call *0x", NULL); /* objdump's form of the indirect call */
    want_site(r.out, 5, "<BUG_func>", NULL);
    want_site(r.out, 4, "<pv_nop>: target decided at boot", "ff 15 ");
    cr_assert(!strstr(r.out, "0x0000"), "no zero-padded operands:\n%s", r.out);
    result_free(&r);
}

Test(altdump, kernel_size_compare)
{
    struct result r = RUN("--size", "kernel612.elf");
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert(strstr(r.out, "  sites                                         6\n"), "%s", r.out);
    cr_assert(strstr(r.out, "  records                                       6\n"), "%s", r.out);
    result_free(&r);
    r = RUN("--compare", "kernel61.o", "kernel612.o");
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert(strstr(r.out, "sites: 4 -> 6;"), "%s", r.out);
    result_free(&r);
    r = RUN("--compare", "--json", "kernel61.elf", "kernel612.elf");
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\"sites\": 4") && strstr(r.out, "\"sites\": 6"), "%s", r.out);
    result_free(&r);
}

/* No version string and a table size that fits both layouts: refused, one line. */
Test(altdump, kernel_layout_ambiguous)
{
    const char *files[] = {"kernelambig.o", "kernelambig.elf"};
    for (size_t i = 0; i < 2; i++) {
        struct result r = RUN("--check", files[i]);
        char want[256];
        snprintf(want, sizeof(want),
                 "altdump: %s: kernel .altinstructions of 84 bytes and no kernel version in the "
                 "image (vermagic, linux_banner): cannot tell 12-byte from 14-byte records\n",
                 files[i]);
        cr_assert_eq(r.rc, 3, "%s: %d", files[i], r.rc);
        cr_assert_str_eq(r.err, want);
        cr_assert_str_eq(r.out, "");
        result_free(&r);
    }
}
