/* SPDX-License-Identifier: MIT */
/*
 * Smoke runs of altbench, its generator and the generated programs, with tiny
 * sizes. No timing is asserted: only that every expected row is there, that
 * the numbers parse and are sane (non-negative, counts exact), and that bad
 * input is refused with the documented exit status.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <altpatch/altpatch.h>
#include <altpatch/cpufeatures.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ALTBENCH_ASAN 1
#endif
#endif
#ifndef TEST_ALTBENCH_ASAN
#define TEST_ALTBENCH_ASAN 0
#endif

#ifndef ALTBENCH_BIN
#define ALTBENCH_BIN ""
#define ALTBENCH_GEN ""
#define ALTBENCH_ALT ""
#define ALTBENCH_PLAIN ""
#define ALTBENCH_XRAY ""
#define ALTBENCH_N 0
#endif
#ifndef ALTBENCH_XRAY_STARTUP
#define ALTBENCH_XRAY_STARTUP ""
#endif

#define OUT_MAX (1 << 20)

static void need_tools(void)
{
    if (!ALTBENCH_BIN[0])
        cr_skip_test("altbench not built (ALTPATCH_BUILD_TOOLS=OFF)");
}

/* Run @p cmd, return its stdout (malloc'ed) and exit status. */
static char *run(const char *cmd, int *status)
{
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    char *buf = calloc(1, OUT_MAX);
    cr_assert(buf);
    size_t n = fread(buf, 1, OUT_MAX - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

static char *run_ok(const char *cmd)
{
    int st;
    char *out = run(cmd, &st);
    cr_assert_eq(st, 0, "%s exited %d; output:\n%s", cmd, st, out);
    return out;
}

/* The table row starting with "| @p name |"; NULL if absent. Copy in @p row. */
static bool find_row(const char *out, const char *name, char *row, size_t sz)
{
    char key[256];
    snprintf(key, sizeof(key), "\n| %s |", name);
    const char *p = strstr(out, key);
    if (!p)
        return false;
    p++;
    size_t len = strcspn(p, "\n");
    snprintf(row, sz, "%.*s", (int)len, p);
    return true;
}

/*
 * Check every number in the cells after the first @p skip cells of @p row is
 * >= 0 ("a / b" cells hold two). Returns how many numbers were found.
 */
static int check_numbers(const char *row, int skip)
{
    int cellno = -1, found = 0;
    for (const char *p = row; *p; p++) {
        if (*p == '|') {
            cellno++;
            continue;
        }
        if (cellno < skip || !(*p >= '0' && *p <= '9') || (p > row && p[-1] != ' '))
            continue;
        char *end;
        double v = strtod(p, &end);
        cr_assert_geq(v, 0.0, "negative number in row: %s", row);
        found++;
        p = end - 1;
    }
    return found;
}

static const char *const insn_rows[] = {
    "nop", "movq %fs:0, %reg", "mfence; lfence", "lfence", "mfence", "lock addl $0,-4(%rsp)",
    "rdtsc", "lfence; rdtsc",
};

Test(altbench, insn_table_has_every_row)
{
    need_tools();
    char *out = run_ok(ALTBENCH_BIN " insn --iters 1600 --reps 2");
    char row[1024];
    cr_assert(strstr(out, "### Per-instruction cost"));
    cr_assert(find_row(out, "(empty loop, per slot)", row, sizeof(row)));
    for (size_t i = 0; i < sizeof(insn_rows) / sizeof(insn_rows[0]); i++) {
        cr_assert(find_row(out, insn_rows[i], row, sizeof(row)), "row %s missing:\n%s",
                  insn_rows[i], out);
        cr_assert_eq(check_numbers(row, 1), 5, "row: %s", row);
    }
    /* rows that may be skipped on this machine still appear, with a reason */
    cr_assert(strstr(out, "| rdfsbase"));
    cr_assert(strstr(out, "| rdgsbase"));
    cr_assert(strstr(out, "| rdpid"));
    cr_assert(strstr(out, "| rdtscp"));
    cr_assert(strstr(out, "| load from memory"));
    free(out);
}

static const char *const prims[] = {
    "altpatch_weak_fence", "altpatch_fs_self",       "altpatch_gs_self",
    "altpatch_getcpu",     "altpatch_rdtsc_ordered", "ALTPATCH_ALT_CALL",
};

Test(altbench, sites_table_has_every_primitive)
{
    need_tools();
    char *out = run_ok(ALTBENCH_BIN " sites --iters 1600 --reps 2");
    char row[2048];
    unsigned long seen = 0, patched = 0;
    const char *c = strstr(out, "first apply: ");
    cr_assert(c, "no apply summary:\n%s", out);
    cr_assert_eq(sscanf(c, "first apply: %lu sites seen, %lu patched", &seen, &patched), 2);
    cr_assert_gt(seen, 6);
    cr_assert_leq(patched, seen);
    for (size_t i = 0; i < sizeof(prims) / sizeof(prims[0]); i++) {
        cr_assert(find_row(out, prims[i], row, sizeof(row)), "row %s missing:\n%s", prims[i], out);
        if (strstr(row, "skipped"))
            continue;
        /* unpatched, patched, ideal, fn pointer, IFUNC, flag: 2 numbers each, + ratio */
        cr_assert_geq(check_numbers(row, 2), 14, "row: %s", row);
        cr_assert(strstr(row, "goal"), "row without goal verdict: %s", row);
    }
    cr_assert(!strstr(out, "ALTPATCH_CLEARCPUID"), "sites mode must not print the selection");
    free(out);
}

Test(altbench, select_prints_a_valid_clearcpuid_line)
{
    need_tools();
    char *out = run_ok(ALTBENCH_BIN " select --iters 1600 --reps 2");
    char row[1024];
    cr_assert(find_row(out, "altpatch_fs_self", row, sizeof(row)));
    cr_assert(find_row(out, "altpatch_getcpu", row, sizeof(row)));
    const char *l = strstr(out, "    ALTPATCH_CLEARCPUID=");
    cr_assert(l, "no ready ALTPATCH_CLEARCPUID line:\n%s", out);
    l += strlen("    ALTPATCH_CLEARCPUID=");
    char list[256];
    snprintf(list, sizeof(list), "%.*s", (int)strcspn(l, "\n"), l);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
        cr_assert_geq(altpatch_feature_id(t), 0, "unknown feature '%s' in the line", t);
    free(out);
}

Test(altbench, bad_options_are_refused)
{
    need_tools();
    int st;
    free(run(ALTBENCH_BIN " insn --reps 0 2>/dev/null", &st));
    cr_assert_eq(st, 2);
    free(run(ALTBENCH_BIN " insn --iters x 2>/dev/null", &st));
    cr_assert_eq(st, 2);
    free(run(ALTBENCH_BIN " nosuchmode 2>/dev/null", &st));
    cr_assert_eq(st, 2);
    free(run(ALTBENCH_BIN " size /nonexistent /nonexistent 10 2>/dev/null", &st));
    cr_assert_eq(st, 1);
    free(run(ALTBENCH_BIN " size /etc/passwd /etc/passwd 10 2>/dev/null", &st));
    cr_assert_eq(st, 1);
    free(run(ALTBENCH_BIN " scaling /nonexistent 2>/dev/null", &st));
    cr_assert_eq(st, 1);
    free(run(ALTBENCH_GEN " alt 0 /dev/null 2>/dev/null", &st));
    cr_assert_eq(st, 2);
    free(run(ALTBENCH_GEN " xray 10 20 /tmp/x 2>/dev/null", &st));
    cr_assert_eq(st, 2);
}

/* Count lines of @p path equal to "\t@p word". */
static int count_lines(const char *path, const char *word)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s: %s", path, strerror(errno));
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        if (line[0] == '\t' && !strncmp(line + 1, word, strlen(word)) &&
            line[1 + strlen(word)] == '\n')
            n++;
    fclose(f);
    return n;
}

Test(altbench, generator_emits_n_sites)
{
    need_tools();
    char dir[] = "/tmp/altbench-gen-XXXXXX", cmd[512], path[256];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd), ALTBENCH_GEN " alt 25 %s/a.s && " ALTBENCH_GEN " plain 25 %s/p.s",
             dir, dir);
    free(run_ok(cmd));
    snprintf(path, sizeof(path), "%s/a.s", dir);
    int total = 0;
    static const char *const macros[] = {"AB_FENCE", "AB_FS", "AB_GS", "AB_CPU", "AB_TSC", "AB_CALL"};
    for (int i = 0; i < 6; i++) {
        int k = count_lines(path, macros[i]);
        cr_assert(k == 4 || k == 5, "%s used %d times", macros[i], k);
        total += k;
    }
    cr_assert_eq(total, 25);
    snprintf(cmd, sizeof(cmd), "grep -c altinstr_table %s/a.s; grep -c altinstr_table %s/p.s",
             dir, dir);
    int st;
    char *out = run(cmd, &st);
    int in_alt = -1, in_plain = -1;
    cr_assert_eq(sscanf(out, "%d %d", &in_alt, &in_plain), 2, "%s", out);
    cr_assert_gt(in_alt, 0);
    cr_assert_eq(in_plain, 0);
    free(out);
    snprintf(cmd, sizeof(cmd), ALTBENCH_GEN " xray 10 3 %s/x && cat %s/x0.c %s/x1.c %s/x2.c | "
             "grep -c '^__attribute__((noinline)) int ab_xf_'", dir, dir, dir, dir);
    out = run_ok(cmd);
    cr_assert_eq(atoi(out), 10);
    free(out);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    free(run_ok(cmd));
}

/* The value of @p key on the line of @p phase of tool @p tool. */
static unsigned long long field(const char *out, const char *tool, const char *phase, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof(pat), " phase=%s ", phase);
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        size_t len = strcspn(l, "\n");
        char line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)len, l);
        if (strncmp(line, tool, strlen(tool)) || !strstr(line, pat))
            continue;
        char k[64];
        snprintf(k, sizeof(k), " %s=", key);
        const char *v = strstr(line, k);
        cr_assert(v, "no %s in: %s", key, line);
        return strtoull(v + strlen(k), NULL, 10);
    }
    cr_assert_fail("no %s phase=%s line in:\n%s", tool, phase, out);
    return 0;
}

/*
 * Sites of the generated program that the host set (what the harness applies)
 * changes: site i is of kind i % 6, in altbench_gen's order (fence, fs, gs,
 * getcpu, rdtsc_ordered, call keyed on AVX2).
 */
static unsigned long long generated_sites_patched(unsigned long long n)
{
    bool change[6] = {
        !altpatch_cpu_has(X86_FEATURE_APIC_MSRS_FENCE),
        altpatch_cpu_has(X86_FEATURE_FSGSBASE),
        altpatch_cpu_has(X86_FEATURE_FSGSBASE),
        altpatch_cpu_has(X86_FEATURE_RDPID),
        altpatch_cpu_has(X86_FEATURE_RDTSCP) || altpatch_cpu_has(X86_FEATURE_LFENCE_RDTSC),
        altpatch_cpu_has(X86_FEATURE_AVX2),
    };
    unsigned long long p = 0;
    for (unsigned k = 0; k < 6; k++)
        if (change[k])
            p += n / 6 + (n % 6 > k);
    return p;
}

Test(altbench, apply_harness_reports_every_phase)
{
    need_tools();
    char *out = run_ok(ALTBENCH_ALT " 2");
    unsigned long long n = ALTBENCH_N, p = generated_sites_patched(n);
    cr_assert_eq(field(out, "altpatch", "cold", "seen"), n);
    cr_assert_eq(field(out, "altpatch", "cold", "patched"), p, "%s", out);
    cr_assert_eq(field(out, "altpatch", "cold", "unchanged"), n - p, "%s", out);
    cr_assert_eq(field(out, "altpatch", "cold", "refused"), 0);
    if (p) /* an unknown vendor without RDTSCP could leave every site as it is */
        cr_assert_gt(field(out, "altpatch", "cold", "pages"), 0);
    cr_assert_gt(field(out, "altpatch", "cold", "ns_min"), 0);
    cr_assert_eq(field(out, "altpatch", "nochange", "unchanged"), n);
    cr_assert_eq(field(out, "altpatch", "nochange", "pages"), 0);
    cr_assert_eq(field(out, "altpatch", "nochange", "bytes"), 0);
    cr_assert_eq(field(out, "altpatch", "dryrun", "bytes"), 0);
    if (p)
        cr_assert_gt(field(out, "altpatch", "revert", "bytes"), 0);
    cr_assert_eq(field(out, "altpatch", "warm", "patched"), p);
    cr_assert_geq(field(out, "altpatch", "warm", "ns_med"), field(out, "altpatch", "warm", "ns_min"));
    /* the state kept after the first apply: something per site, far from a page
     * (a sanitizer's allocator answers mallinfo2() with zeros: the line only) */
    unsigned long long heap = field(out, "altpatch", "heap", "heap_bytes");
#if defined(__SANITIZE_ADDRESS__) || TEST_ALTBENCH_ASAN
    (void)heap;
#else
    cr_assert_gt(heap, n, "%s", out);
    cr_assert_lt(heap, 4096 * n + 65536, "%s", out);
#endif
    free(out);

    out = run_ok(ALTBENCH_PLAIN " 1");
    cr_assert_eq(field(out, "altpatch", "cold", "seen"), 0);
    free(out);
}

Test(altbench, xray_peer_and_scaling_table)
{
    need_tools();
    char dir[] = "/tmp/altbench-sc-XXXXXX", cmd[1024];
    cr_assert(mkdtemp(dir));
    bool xray = ALTBENCH_XRAY[0] && access(ALTBENCH_XRAY, X_OK) == 0;
    snprintf(cmd, sizeof(cmd), ALTBENCH_ALT " 2 > %s/r.txt%s%s%s%s", dir,
             xray ? " && " : "", xray ? ALTBENCH_XRAY : "", xray ? " 2 >> " : "", xray ? dir : "");
    if (xray)
        strncat(cmd, "/r.txt", sizeof(cmd) - strlen(cmd) - 1);
    free(run_ok(cmd));
    snprintf(cmd, sizeof(cmd), ALTBENCH_BIN " scaling %s/r.txt", dir);
    char *out = run_ok(cmd);
    char row[1024], key[32];
    snprintf(key, sizeof(key), "%d", ALTBENCH_N);
    cr_assert(strstr(out, "### altpatch_apply() cost by site count"));
    cr_assert(find_row(out, key, row, sizeof(row)), "no row for N=%s:\n%s", key, out);
    /* N, 5 phases x (min, median), patched, seen, pages, syscalls, bytes */
    cr_assert_geq(check_numbers(row, 0), 16, "row: %s", row);
    cr_assert(strstr(out, "### Against LLVM XRay"));
    if (xray) {
        const char *x = strstr(out, "### Against LLVM XRay");
        cr_assert(find_row(x, key, row, sizeof(row)));
        cr_assert(!strstr(row, "| - |"), "XRay numbers missing: %s", row);
    }
    free(out);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    free(run_ok(cmd));
}

/*
 * Three rounds of one run at N=1000 (ns_min 300, 100, 200 us; XRay 100, 50,
 * 100 us), then a second N given by one line: the rounds' cells are the min /
 * median of their minima (100.0 / 200.0 and 50.0 / 100.0 ns per site, the
 * lines' own ns_med ignored), the round-by-round ratios 3, 2, 2 (median 2,
 * range 2-3); the single line keeps its own min / median.
 */
Test(altbench, scaling_table_of_rounds)
{
    need_tools();
    char dir[] = "/tmp/altbench-rd-XXXXXX", path[256], cmd[512];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/r.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    static const unsigned alt[] = {300000, 100000, 200000}, xr[] = {100000, 50000, 100000};
    for (int r = 0; r < 3; r++) {
        fprintf(f, "altpatch n=1000 phase=cold reps=3 ns_min=%u ns_med=999999 rc=0 seen=1000 "
                   "patched=500 unchanged=500 refused=0 pages=3 syscalls=10 bytes=900\n",
                alt[r]);
        fprintf(f, "xray n=1000 phase=first reps=3 ns_min=%u ns_med=999999 rc=1\n", xr[r]);
    }
    fprintf(f, "altpatch n=10000 phase=cold reps=3 ns_min=400000 ns_med=500000 rc=0 seen=10000 "
               "patched=5000 unchanged=5000 refused=0 pages=9 syscalls=20 bytes=9000\n");
    cr_assert_eq(fclose(f), 0);
    snprintf(cmd, sizeof(cmd), ALTBENCH_BIN " scaling %s", path);
    char *out = run_ok(cmd), row[1024];
    cr_assert(find_row(out, "1000", row, sizeof(row)), "%s", out);
    cr_assert(strstr(row, "| 1000 | 100.0 / 200.0 |"), "cold of the rounds: %s", row);
    cr_assert(strstr(row, "500 of 1000 | 3 | 10 | 900 |"), "counters: %s", row);
    cr_assert(find_row(out, "10000", row, sizeof(row)), "%s", out);
    cr_assert(strstr(row, "| 10000 | 40.0 / 50.0 |"), "one line, its own: %s", row);
    const char *x = strstr(out, "### Against LLVM XRay");
    cr_assert(x && find_row(x, "1000", row, sizeof(row)), "%s", out);
    cr_assert(strstr(row, "| 1000 | 100.0 / 200.0 | 50.0 / 100.0 | 2.00 / 2.00 | 2.00 (2.00-3.00) |"),
              "against XRay: %s", row);
    free(out);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    free(run_ok(cmd));
}

Test(altbench, size_table_adds_up)
{
    need_tools();
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), ALTBENCH_BIN " size " ALTBENCH_ALT " " ALTBENCH_PLAIN " %d",
             ALTBENCH_N);
    char *out = run_ok(cmd);
    char row[1024];
    long long rec = -1, repl = -1, pad = -1, note = -1, total = -1, diff = -1;
    cr_assert(find_row(out, "records (12.00 B per entry)", row, sizeof(row)), "%s", out);
    sscanf(strchr(row + 2, '|') + 1, "%lld", &rec);
    cr_assert(find_row(out, "replacements (`altinstr_replacement`)", row, sizeof(row)));
    sscanf(strchr(row + 2, '|') + 1, "%lld", &repl);
    cr_assert(find_row(out, "padding (`.text` growth: NOPs after shorter originals)", row, sizeof(row)));
    sscanf(strchr(row + 2, '|') + 1, "%lld", &pad);
    cr_assert(find_row(out, "`.note.altpatch` (once per module)", row, sizeof(row)));
    sscanf(strchr(row + 2, '|') + 1, "%lld", &note);
    cr_assert(find_row(out, "**total**", row, sizeof(row)));
    sscanf(strchr(row + 2, '|') + 1, "%lld", &total);
    cr_assert(find_row(out, "difference", row, sizeof(row)));
    sscanf(strchr(row + 2, '|') + 1, "%lld", &diff);
    /* the mix: 1 of 6 sites is an ALTERNATIVE_2 (two records) */
    long long n = ALTBENCH_N, entries = n + n / 6 + (n % 6 > 4);
    cr_assert_eq(rec, 12 * entries, "records %lld for %lld entries", rec, entries);
    /*
     * One copy of each distinct replacement in the program (one assembly
     * file): mfence;lfence -> "" 0 bytes, rdfsbase %rax 5 (f3 48 0f ae c0),
     * rdgsbase %rax 5 (f3 48 0f ae c8), rdpid %rcx 4 (f3 0f c7 f9),
     * lfence;rdtsc 5 (0f ae e8 0f 31), rdtscp 3 (0f 01 f9), call 5 (e8 rel32).
     */
    cr_assert_geq(n, 6, "every primitive appears");
    cr_assert_eq(repl, 0 + 5 + 5 + 4 + 5 + 3 + 5, "replacements %lld", repl);
    cr_assert_geq(pad, 0);
    cr_assert_gt(note, 0);
    cr_assert_eq(total, rec + repl + pad + note);
    cr_assert_eq(total, diff, "split %lld != text difference %lld", total, diff);
    free(out);
#ifdef ALTBENCH_ALTDUMP
    /* altdump --size reads the same program through the note and the records. */
    out = run_ok(ALTBENCH_ALTDUMP " --size " ALTBENCH_ALT);
    static const char *const keys[] = {"sites", "records", "record table (altinstr_table)",
                                       "replacements (altinstr_replacement)",
                                       "note (.note.altpatch)"};
    long long want[] = {n, entries, rec, repl, note};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const char *p = strstr(out, keys[i]);
        cr_assert(p, "altdump --size has no '%s':\n%s", keys[i], out);
        long long v = -1;
        cr_assert_eq(sscanf(p + strlen(keys[i]), "%lld", &v), 1);
        cr_assert_eq(v, want[i], "%s: altdump %lld, sections %lld", keys[i], v, want[i]);
    }
    free(out);
#endif
}

Test(altbench, startup_reports_both_variants)
{
    need_tools();
    int st;
    char *out = run_ok(ALTBENCH_BIN " startup -n 3 " ALTBENCH_STARTUP);
    cr_assert(strstr(out, "startup prog=" ALTBENCH_STARTUP " runs=3 "), "%s", out);
    double on_min, on_med, off_min, off_med;
    const char *p = strstr(out, "on_min_us=");
    cr_assert_not_null(p, "%s", out);
    cr_assert_eq(sscanf(p, "on_min_us=%lf on_med_us=%lf off_min_us=%lf off_med_us=%lf", &on_min,
                        &on_med, &off_min, &off_med),
                 4, "%s", out);
    cr_assert(on_min > 0 && on_min <= on_med && off_min > 0 && off_min <= off_med, "%s", out);
    free(out);
    /* a program that fails is reported, not timed; bad arguments are refused */
    free(run(ALTBENCH_BIN " startup -n 2 /bin/false 2>/dev/null", &st));
    cr_assert_eq(st, 1);
    free(run(ALTBENCH_BIN " startup -n 0 /bin/true 2>/dev/null", &st));
    cr_assert_eq(st, 2);
    free(run(ALTBENCH_BIN " startup 2>/dev/null", &st));
    cr_assert_eq(st, 2);
}

/* altbench startup --inside -n 3 @p prog: its line, with min <= p10 <= median, all > 0 */
static void inside_report_ok(const char *prog)
{
    char cmd[4096], want[4096];
    snprintf(cmd, sizeof(cmd), "%s startup --inside -n 3 %s", ALTBENCH_BIN, prog);
    snprintf(want, sizeof(want), "startup_inside prog=%s runs=3 ", prog);
    char *out = run_ok(cmd);
    const char *p = strstr(out, want);
    cr_assert_not_null(p, "%s", out);
    double mn, p10, med;
    p = strstr(p, "apply_min_us=");
    cr_assert_not_null(p, "%s", out);
    cr_assert_eq(sscanf(p, "apply_min_us=%lf apply_p10_us=%lf apply_med_us=%lf", &mn, &p10, &med),
                 3, "%s", out);
    cr_assert(mn > 0 && mn <= p10 && p10 <= med, "%s", out);
    free(out);
}

Test(altbench, startup_inside_reports_the_apply_time)
{
    need_tools();
    int st;
    inside_report_ok(ALTBENCH_STARTUP);
    /* a program that does not report is refused, not timed */
    free(run(ALTBENCH_BIN " startup --inside -n 2 /bin/true 2>/dev/null", &st));
    cr_assert_eq(st, 1);
}

/* XRay's peer of the start-up program: the same switch, the same report */
Test(altbench, startup_xray_peer_reports_its_first_patch)
{
    need_tools();
    if (!ALTBENCH_XRAY_STARTUP[0] || access(ALTBENCH_XRAY_STARTUP, X_OK) != 0)
        cr_skip_test("no XRay runtime: the peer is not built");
    int st;
    inside_report_ok(ALTBENCH_XRAY_STARTUP);
    char *out = run_ok(ALTBENCH_BIN " startup -n 3 " ALTBENCH_XRAY_STARTUP);
    cr_assert(strstr(out, "startup prog=" ALTBENCH_XRAY_STARTUP " runs=3 "), "%s", out);
    free(out);
    /* a premain patch would patch both variants: refused */
    free(run("XRAY_OPTIONS=patch_premain=true " ALTBENCH_XRAY_STARTUP " 2>/dev/null", &st));
    cr_assert_eq(st, 2);
}
