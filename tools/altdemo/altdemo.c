/* SPDX-License-Identifier: MIT */
/*
 * altdemo: what altpatch does to a program, site by site.
 *
 * Uses every primitive of <altpatch/primitives.h>, runs them once unpatched,
 * calls altpatch_apply(), prints each site (module, address, feature,
 * decision, original and final bytes), then runs the primitives again and
 * checks their values. Exit status 0 only if every check passed.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <altpatch/altpatch.h>
#include <altpatch/primitives.h>

static int failures;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            printf("  FAIL: ");                                                            \
        } else {                                                                           \
            printf("  ok:   ");                                                            \
        }                                                                                  \
        printf(__VA_ARGS__);                                                               \
        putchar('\n');                                                                     \
    } while (0)

/* Two implementations of one operation: the generic one and the one the
 * ALTPATCH_ALT_CALL sites switch to. Distinct results show which one ran. */
static long sum_generic(long n) { return n * (n + 1) / 2; }
static long sum_fast(long n) { return n * (n + 1) / 2 + 1000000; }
static long ident_generic(long x) { return x; }
static long ident_never(long x) { return -x; }

static void print_bytes(const char *label, const uint8_t *b, unsigned n)
{
    printf("    %-8s", label);
    for (unsigned i = 0; i < n; i++)
        printf(" %02x", b[i]);
    putchar('\n');
}

struct walk {
    bool live;              /* the apply used the live protocol */
    unsigned refused;       /* refused for any other reason: a failure */
    unsigned live_refused;  /* left original by the live protocol (docs/live.md) */
};

static bool live_reason(int reason)
{
    return reason == ALTPATCH_REASON_LIVE_CALL_INSIDE ||
           reason == ALTPATCH_REASON_LIVE_THREAD_INSIDE || reason == ALTPATCH_REASON_LIVE_NO_ANSWER ||
           reason == ALTPATCH_REASON_LIVE_NO_FLIP || reason == ALTPATCH_REASON_LIVE_SHORT_ENTRY;
}

static int print_site(const struct altpatch_site_info *s, void *ctx)
{
    struct walk *w = ctx;
    const char *fname = altpatch_feature_name(s->feature);
    printf("%s %#" PRIxPTR " [%s] len %u, %u entr%s, feature %s%s (%u): ",
           s->module[0] ? s->module : "(main)", s->addr, s->module[0] ? "lib" : "exe", s->len,
           s->entries, s->entries == 1 ? "y" : "ies", (s->flags & ALT_FLAG_NOT) ? "!" : "",
           fname ? fname : "?", s->feature);
    switch (s->state) {
    case ALTPATCH_SITE_PATCHED:
        printf("patched (entry %d)\n", s->chosen);
        break;
    case ALTPATCH_SITE_ORIGINAL:
        printf("original (no entry eligible)\n");
        break;
    default:
        printf("refused: %s\n", altpatch_strreason(s->reason));
        if (w->live && live_reason(s->reason))
            w->live_refused++;
        else
            w->refused++;
        break;
    }
    print_bytes("original", s->original, s->len);
    print_bytes("final", s->current, s->len);
    return 0;
}

/* Runs every primitive; compares with what they must return. */
static void run_primitives(const char *when, void *gs_block)
{
    printf("%s:\n", when);
    altpatch_weak_fence();
    CHECK(altpatch_fs_self() == (void *)pthread_self(), "fs_self %p == pthread_self()",
          altpatch_fs_self());
    CHECK(altpatch_gs_self() == gs_block, "gs_self %p == installed block %p",
          altpatch_gs_self(), gs_block);
    int cpu = sched_getcpu();
    unsigned got = altpatch_getcpu();
    CHECK(cpu >= 0 && got == (unsigned)cpu, "getcpu %u == sched_getcpu() %d", got, cpu);
    uint64_t prev = altpatch_rdtsc_ordered(), now = prev;
    int backwards = 0;
    for (int i = 0; i < 1000; i++) {
        now = altpatch_rdtsc_ordered();
        backwards += now < prev;
        prev = now;
    }
    CHECK(backwards == 0, "rdtsc_ordered monotonic over 1000 reads (last %" PRIu64 ")", now);
    long s = ALTPATCH_ALT_CALL(sum_generic, sum_fast, X86_FEATURE_ALWAYS, 100);
    printf("    alt call (ALWAYS) -> %ld (%s)\n", s, s == 5050 ? "generic" : "fast");
    CHECK(s == 5050 || s == 1005050, "alt call returned one of the implementations");
    long x = ALTPATCH_ALT_CALL(ident_generic, ident_never, ALT_NOT(X86_FEATURE_ALWAYS), 42);
    CHECK(x == 42, "alt call (!ALWAYS) -> %ld, never switched", x);
}

/* Pin to the CPU we are on, so getcpu and sched_getcpu agree. */
static void pin_here(void)
{
    int cpu = sched_getcpu();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu < 0 ? 0 : cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        perror("sched_setaffinity");
}

int main(void)
{
    static void *gs_block[8];
    pin_here();
    printf("altpatch %s\n", altpatch_version());
    int rc = altpatch_gs_install(gs_block);
    CHECK(rc == 0, "altpatch_gs_install -> %d", rc);
    if (rc != 0)
        return 1;

    run_primitives("before altpatch_apply (original bytes)", gs_block);

    rc = altpatch_apply();
    printf("altpatch_apply() -> %d (%s)\n", rc, rc ? strerror(-rc) : "ok");
    if (rc != 0)
        return 1;
    struct altpatch_stats st = {.sz = sizeof(st)};
    rc = altpatch_get_stats(&st);
    CHECK(rc == 0, "altpatch_get_stats -> %d", rc);
    if (rc == 0)
        printf("modules %" PRIu64 ", sites %" PRIu64 ": patched %" PRIu64 ", unchanged %" PRIu64
               ", refused %" PRIu64 "; %" PRIu64 " bytes in %" PRIu64 " pages, %" PRIu64
               " syscalls, %" PRIu64 " ns\n",
               st.modules, st.sites_seen, st.sites_patched, st.sites_unchanged, st.sites_refused,
               st.bytes_written, st.pages_written, st.syscalls, st.ns);

    struct walk w = {.live = st.live != 0};
    rc = altpatch_site_foreach(print_site, &w);
    /* With ALTPATCH_OFF=1 apply records no site, and the walk has no data. */
    CHECK(rc == 0 || (rc == -ENODATA && st.sites_seen == 0), "altpatch_site_foreach -> %d", rc);
    CHECK(w.refused == 0, "%u site(s) refused", w.refused);
    if (w.live_refused) /* another thread exists (e.g. under qemu-user): see docs/live.md */
        printf("note: the apply was live; %u site(s) kept their original bytes\n",
               w.live_refused);

    run_primitives("after altpatch_apply", gs_block);
    /* ALWAYS holds on every CPU: the call is switched unless apply saw no
     * site at all (ALTPATCH_OFF=1). */
    long want = st.sites_seen ? 1005050 : 5050;
    long s = ALTPATCH_ALT_CALL(sum_generic, sum_fast, X86_FEATURE_ALWAYS, 100);
    if (w.live_refused && s == 5050)
        want = 5050; /* this call site may be among those the live protocol kept */
    CHECK(s == want, "alt call (ALWAYS) after apply -> %ld (want %ld: %s)", s, want,
          st.sites_seen ? "switched" : "apply saw no site");

    printf("%s\n", failures ? "altdemo: FAILED" : "altdemo: all checks passed");
    return failures ? 1 : 0;
}
