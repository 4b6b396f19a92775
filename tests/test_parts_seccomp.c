/* SPDX-License-Identifier: MIT */
/*
 * A seccomp filter installed by the application's print callback in the
 * middle of a first apply: the library proved no filter before its
 * decisions, then a refused site's warning runs the callback, which installs
 * a filter that kills the process on madvise(). The text windows written
 * after it (thousands of sites, pages enough for a window's prefault) must
 * not ask the advice: the apply returns, the process lives, every other site
 * is patched, the refused one keeps its original and the text is r-x again.
 *
 * Applying needs a single-threaded process and a filter is never removed:
 * the body runs in a fork()ed child (ap_isolate.h).
 */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"
#include "ap_seccomp.h"

enum { N_MANY = 6000 };

/* A site the planner refuses (0xd6 decodes as no instruction): its warning
 * comes with the module's first decision, before any write. Its record is
 * the table's first (emitted first in this file). */
__attribute__((noinline, used, aligned(64))) static void refused(void)
{
    __asm__ __volatile__("ps_refused_at:\n" ALTERNATIVE(".byte 0xd6", "nop",
                                                        X86_FEATURE_ALWAYS) ::: "memory");
}

/* N_MANY sites of 5 bytes, each written under every set: about 8 pages of
 * text, written in windows of more than 4 pages. */
__attribute__((noinline, used, aligned(4096))) static long many(void)
{
    long v;
    __asm__ __volatile__("ps_many_lo:\n\t.rept 6000\n\t" ALTERNATIVE(
                             "movl $1, %%eax", "movl $2, %%eax", X86_FEATURE_ALWAYS) "\n\t.endr"
                         : "=a"(v));
    return v;
}
_Static_assert(N_MANY == 6000, "the .rept count");

/* Where the sites lie: a function's first bytes may be its prologue (-O0). */
extern const uint8_t ps_refused_at[] __asm__("ps_refused_at");
extern const uint8_t ps_many_lo[] __asm__("ps_many_lo");

struct result {
    int installed; /* 1: the callback installed its filter, -errno: it failed */
    int warnings;
    int rc;
    int mode_after;
    long many_ret;
    unsigned bad_bytes; /* sites of many() not holding movl $2 */
    uint8_t refused_byte;
    char perms[8];
    struct altpatch_stats st;
};

static struct result *res;

/* Kills the process on madvise(), allows the rest. */
static int install_madvise_killer(void)
{
    struct sock_filter f[] = {
        AP_SECCOMP_PROLOGUE,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_madvise, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return AP_SECCOMP_INSTALL(f);
}

static int printer(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)fmt;
    (void)ap;
    if (level != ALTPATCH_WARN)
        return 0;
    if (!res->warnings++) {
        int set = install_madvise_killer();
        res->installed = set ? set : 1;
    }
    return 0;
}

/* The protection of the mapping holding @p addr ("r-xp"), from /proc/self/maps. */
static void perms_at(const void *addr, char out[8])
{
    strcpy(out, "?");
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return;
    unsigned long s, e;
    char p[8];
    while (fscanf(f, "%lx-%lx %7s%*[^\n]", &s, &e, p) == 3)
        if ((uintptr_t)addr >= s && (uintptr_t)addr < e) {
            strcpy(out, p);
            break;
        }
    fclose(f);
}

static void body(void *out, void *ctx)
{
    (void)ctx;
    res = out;
    altpatch_set_print(printer);
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_NO_LIVE};
    res->rc = altpatch_apply_opts(&o);
    altpatch_set_print(NULL);
    res->mode_after = prctl(PR_GET_SECCOMP, 0L, 0L, 0L, 0L);
    const uint8_t *p = ps_many_lo;
    static const uint8_t mov2[5] = {0xb8, 2, 0, 0, 0};
    for (unsigned i = 0; i < N_MANY; i++)
        res->bad_bytes += memcmp(p + 5 * i, mov2, 5) != 0;
    res->refused_byte = *(const volatile uint8_t *)ps_refused_at;
    perms_at(p + 5 * N_MANY / 2, res->perms);
    res->st.sz = sizeof(res->st);
    if (altpatch_get_stats(&res->st))
        res->st.sz = 0;
    res->many_ret = many();
}

Test(parts_seccomp, filter_installed_by_a_print_callback_is_not_crossed)
{
    struct result *r = ap_isolated(sizeof(*r), body, NULL); /* asserts the child lived */
    if (r->installed < 0)
        ap_seccomp_require(r->installed);
    cr_assert_eq(r->installed, 1, "a refused site's warning ran the callback (%d warnings)",
                 r->warnings);
    cr_assert_eq(r->mode_after, 2, "the filter stayed (mode %d)", r->mode_after);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->bad_bytes, 0, "%u sites of many() not written", r->bad_bytes);
    cr_assert_eq(r->many_ret, 2);
    cr_assert_eq(r->refused_byte, 0xd6, "the refused site keeps its original");
    cr_assert_str_eq(r->perms, "r-xp", "text after the apply: %s", r->perms);
    cr_assert_eq(r->st.sz, sizeof(r->st));
    cr_assert_geq(r->st.sites_patched, N_MANY);
    cr_assert_geq(r->st.pages_written, 7, "%lu pages", (unsigned long)r->st.pages_written);
    cr_assert_geq(r->st.sites_refused, 1);
}
