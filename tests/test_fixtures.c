/* SPDX-License-Identifier: MIT */
/*
 * Runs every build of testdata/fixture.c (-O0, -O2, -O3, -flto, gc-sections,
 * non-PIE, format-1 records, -static, the other compiler) and asserts its exit status and its
 * result line. Each fixture checks its own sites' bytes and values after
 * altpatch_apply() (see testdata/fixture.c).
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <altpatch/altpatch.h>
#include <altpatch/alternative.h>
#include <altpatch/image.h>

extern char **environ;

#if defined(__SANITIZE_ADDRESS__)
#define APFIX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define APFIX_ASAN 1
#endif
#endif

struct run {
    int status;
    char out[4096];
};

/* Run @p path with @p extra_env (NULL or "NAME=value") prepended to ours,
 * under qemu-x86_64 -cpu @p qemu_cpu when that is not NULL. */
static void run_fixture_in(const char *qemu_cpu, const char *path, const char *extra_env,
                           struct run *r)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 2, sizeof(*env));
    cr_assert_not_null(env);
    size_t k = 0;
    if (extra_env)
        env[k++] = (char *)extra_env;
    for (size_t i = 0; i < n; i++)
        env[k++] = environ[i];
    char *argv[] = {(char *)path, NULL};
    char *qargv[] = {"qemu-x86_64", "-cpu", (char *)qemu_cpu, (char *)path, NULL};
    pid_t pid;
    int err = qemu_cpu ? posix_spawnp(&pid, "qemu-x86_64", &fa, NULL, qargv, env)
                       : posix_spawn(&pid, path, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    close(fds[1]);
    cr_assert_eq(err, 0, "posix_spawn %s: %s", path, strerror(err));
    size_t used = 0;
    ssize_t got;
    while ((got = read(fds[0], r->out + used, sizeof(r->out) - 1 - used)) > 0)
        used += (size_t)got;
    r->out[used] = '\0';
    close(fds[0]);
    cr_assert_eq(waitpid(pid, &r->status, 0), pid);
}

struct counts {
    unsigned sites, patched, fence, fs, gs, getcpu, tsc, call;
};

/* Runs the variant (under qemu-x86_64 -cpu @p qemu_cpu unless NULL) and
 * checks its result line; returns its counts. */
static struct counts check_variant_in(const char *qemu_cpu, const char *file,
                                      const char *variant, const char *extra_env)
{
    char path[1024], head[128];
    snprintf(path, sizeof(path), "%s/%s", APFIX_DIR, file);
    cr_assert_eq(access(path, X_OK), 0, "fixture %s not built", path);
    struct run r;
    run_fixture_in(qemu_cpu, path, extra_env, &r);
    cr_assert(WIFEXITED(r.status), "%s killed by signal %d; output:\n%s", file,
              WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0, r.out);
    cr_assert_eq(WEXITSTATUS(r.status), 0, "%s exited %d; output:\n%s", file,
                 WEXITSTATUS(r.status), r.out);
    snprintf(head, sizeof(head), "fixture %s: ok ", variant);
    const char *line = strstr(r.out, head);
    cr_assert_not_null(line, "no '%s' line in output:\n%s", head, r.out);
    struct counts c;
    int n = sscanf(line + strlen(head),
                   "sites=%u patched=%u fence=%u fs=%u gs=%u getcpu=%u tsc=%u call=%u", &c.sites,
                   &c.patched, &c.fence, &c.fs, &c.gs, &c.getcpu, &c.tsc, &c.call);
    cr_assert_eq(n, 8, "malformed result line: %s", line);
    cr_assert_eq(c.sites, c.fence + c.fs + c.gs + c.getcpu + c.tsc + c.call,
                 "sites not accounted for: %s", line);
    cr_assert(c.fence >= 1 && c.fs >= 1 && c.gs >= 1 && c.getcpu >= 1 && c.tsc >= 1 &&
                  c.call >= 3,
              "a primitive's site is missing: %s", line);
    /* At least the ALWAYS call is patched, except where qemu-user's helper thread
     * makes the apply live and the live protocol may refuse any site. */
    if (!qemu_cpu)
        cr_assert_geq(c.patched, 1, "nothing patched: %s", line);
    return c;
}

static struct counts check_variant(const char *file, const char *variant, const char *extra_env)
{
    return check_variant_in(NULL, file, variant, extra_env);
}

Test(fixtures, O0) { check_variant("apfix_O0", "O0", NULL); }
Test(fixtures, O2) { check_variant("apfix_O2", "O2", NULL); }
Test(fixtures, O3) { check_variant("apfix_O3", "O3", NULL); }
Test(fixtures, lto) { check_variant("apfix_lto", "lto", NULL); }
Test(fixtures, gc_sections) { check_variant("apfix_gcsections", "gcsections", NULL); }
Test(fixtures, non_pie) { check_variant("apfix_nopie", "nopie", NULL); }

/* The record format a fixture file carries, read back through the image API. */
static unsigned file_format(const char *file)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", APFIX_DIR, file);
    struct altpatch_image *img = NULL;
    cr_assert_eq(altpatch_image_open(path, NULL, &img), 0, "%s", path);
    struct altpatch_image_info info = {.sz = sizeof(info)};
    cr_assert_eq(altpatch_image_get_info(img, &info), 0);
    altpatch_image_close(img);
    return info.format_version;
}

/* A program whose records are format 1 with a replacement per site (built
 * with ALTPATCH_KERNEL_RECORDS and ALTPATCH_UNSHARED_REPLACEMENTS, as earlier
 * headers emit them) applies and checks like the format-3 builds. */
Test(fixtures, format1_records)
{
    cr_assert_eq(file_format("apfix_format1"), ALTPATCH_FORMAT_KERNEL);
    cr_assert_eq(file_format("apfix_O2"), ALTPATCH_FORMAT_COMPACT);
    struct counts one = check_variant("apfix_format1", "format1", NULL);
    struct counts three = check_variant("apfix_O2", "O2", NULL);
    cr_assert_eq(memcmp(&one, &three, sizeof(one)), 0, "same sites, same decisions");
}

Test(fixtures, static_exe)
{
    const char *why = APFIX_STATIC_SKIP;
    if (why[0])
        cr_skip_test("%s", why);
    check_variant("apfix_static", "static", NULL);
}

Test(fixtures, other_compiler)
{
    const char *name = APFIX_OTHER_NAME;
    if (!name[0])
        cr_skip_test("%s", APFIX_OTHER_SKIP);
    check_variant("apfix_other", name, NULL);
}

/* The fixtures honour ALTPATCH_CLEARCPUID: fewer sites patched, still correct. */
Test(fixtures, O2_clearcpuid)
{
    struct counts host = check_variant("apfix_O2", "O2", NULL);
    struct counts cleared =
        check_variant("apfix_O2", "O2", "ALTPATCH_CLEARCPUID=fsgsbase,rdpid,rdtscp,lfence_rdtsc");
    unsigned lost = 0;
    if (altpatch_cpu_has(X86_FEATURE_FSGSBASE))
        lost += host.fs + host.gs + 1; /* the FSGSBASE alt call */
    if (altpatch_cpu_has(X86_FEATURE_RDPID))
        lost += host.getcpu;
    if (altpatch_cpu_has(X86_FEATURE_RDTSCP) || altpatch_cpu_has(X86_FEATURE_LFENCE_RDTSC))
        lost += host.tsc;
    cr_assert_eq(cleared.patched + lost, host.patched, "patched %u with the features cleared, %u without",
                 cleared.patched, host.patched);
}

/*
 * The CPU matrix: the same fixture planned for explicit feature sets. Bytes
 * for a set this CPU may not run are checked, then reverted, never executed
 * (testdata/fixture.c). The expected counts follow from each set.
 */
static void check_set(const char *set, unsigned want_patched)
{
    char env[64];
    snprintf(env, sizeof(env), "APFIX_FEATURES=%s", set);
    struct counts c = check_variant("apfix_O2", "O2", env);
    cr_assert_eq(c.patched, want_patched, "%s: %u sites patched, want %u", set, c.patched,
                 want_patched);
}

/* apfix_O2 has 2 fs, 2 gs, 1 getcpu, 2 rdtsc_ordered, 1 weak fence and 3
 * calls (ALWAYS, ALT_NOT(ALWAYS), FSGSBASE): counts checked by check_variant. */
Test(fixtures, set_baseline) { check_set("baseline", 1); }           /* the ALWAYS call */
Test(fixtures, set_intel_spr) { check_set("intel-spr", 2 + 2 + 1 + 2 + 2); }
Test(fixtures, set_amd_zen4) { check_set("amd-zen4", 1 + 2 + 2 + 1 + 2 + 2); }
Test(fixtures, set_all) { check_set("all", 2 + 2 + 1 + 2 + 2); }
Test(fixtures, set_host) { check_variant("apfix_O2", "O2", "APFIX_FEATURES=host"); }

/*
 * qemu-user answers CPUID as the named CPU model (qemu64 has no RDTSCP, RDPID
 * or FSGSBASE), so the host set, its probes and the planner meet other real
 * answers. qemu's own helper thread makes the apply live.
 */
static void check_qemu(const char *cpu, const char *set)
{
#ifdef APFIX_ASAN
    cr_skip_test("AddressSanitizer build: its shadow memory does not fit qemu-user's address space");
#endif
    if (system("command -v qemu-x86_64 >/dev/null 2>&1") != 0)
        cr_skip_test("qemu-x86_64 not installed (Debian package qemu-user)");
    char env[64];
    snprintf(env, sizeof(env), "APFIX_FEATURES=%s", set);
    char path[1024];
    snprintf(path, sizeof(path), "%s/apfix_O2", APFIX_DIR);
    struct run r;
    run_fixture_in(cpu, path, env, &r);
    if (strstr(r.out, "altpatch_apply -> -16")) {
        /* qemu's helper thread blocks SIGTRAP, so the live apply refuses with
         * -EBUSY (docs/live.md). The originals ran before it under this CPU
         * model's answers: that failure must be the only one. */
        cr_assert(WIFEXITED(r.status), "killed by signal %d under -cpu %s; output:\n%s",
                  WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0, cpu, r.out);
        unsigned fails = 0;
        for (const char *p = r.out; (p = strstr(p, ": FAIL ")) != NULL; p++)
            fails++;
        cr_assert_eq(fails, 1, "originals failed under -cpu %s; output:\n%s", cpu, r.out);
        return;
    }
    check_variant_in(cpu, "apfix_O2", "O2", env);
}

Test(fixtures, qemu_qemu64_host, .timeout = 120) { check_qemu("qemu64", "host"); }
Test(fixtures, qemu_epyc_rome_host, .timeout = 120) { check_qemu("EPYC-Rome-v1", "host"); }
Test(fixtures, qemu_haswell_host, .timeout = 120) { check_qemu("Haswell-v4", "host"); }
Test(fixtures, qemu_qemu64_amd_zen4, .timeout = 120) { check_qemu("qemu64", "amd-zen4"); }
