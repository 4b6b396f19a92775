/* SPDX-License-Identifier: MIT */
/*
 * Runs every build of testdata/fixture.c (-O0, -O2, -O3, -flto, gc-sections,
 * non-PIE, -static, the other compiler) and asserts its exit status and its
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

extern char **environ;

struct run {
    int status;
    char out[4096];
};

/* Run @p path with @p extra_env (NULL or "NAME=value") prepended to ours. */
static void run_fixture(const char *path, const char *extra_env, struct run *r)
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
    pid_t pid;
    int err = posix_spawn(&pid, path, &fa, NULL, argv, env);
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

/* Runs the variant and checks its result line; returns its counts. */
static struct counts check_variant(const char *file, const char *variant, const char *extra_env)
{
    char path[1024], head[128];
    snprintf(path, sizeof(path), "%s/%s", APFIX_DIR, file);
    cr_assert_eq(access(path, X_OK), 0, "fixture %s not built", path);
    struct run r;
    run_fixture(path, extra_env, &r);
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
    /* Under the host features of this machine, at least the ALWAYS call is patched. */
    cr_assert_geq(c.patched, 1, "nothing patched: %s", line);
    return c;
}

Test(fixtures, O0) { check_variant("apfix_O0", "O0", NULL); }
Test(fixtures, O2) { check_variant("apfix_O2", "O2", NULL); }
Test(fixtures, O3) { check_variant("apfix_O3", "O3", NULL); }
Test(fixtures, lto) { check_variant("apfix_lto", "lto", NULL); }
Test(fixtures, gc_sections) { check_variant("apfix_gcsections", "gcsections", NULL); }
Test(fixtures, non_pie) { check_variant("apfix_nopie", "nopie", NULL); }

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
