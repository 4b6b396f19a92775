/* SPDX-License-Identifier: MIT */
/*
 * The single-thread proof of an apply that writes a large table through
 * non-live windows, and the user code the library calls while it applies:
 * a print callback that starts a thread after the proof was taken. This
 * file's table is one refused site (a warning during the decisions) below
 * PROOF_N sites that every feature set patches: large enough for the module
 * walk's early proof (its site array is 64 KiB and more) and for a part
 * written while the decisions go on.
 *
 * Every body runs in a fork()ed child (ap_isolate.h): Criterion's process
 * has two threads. Expectations come from the flags a test passes and from
 * the kernel's answer about threads, never from this host.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"

#define PROOF_N 6000
#define PROOF_STR2(x) #x
#define PROOF_STR(x) PROOF_STR2(x)

extern const unsigned char proof_lo[] __asm__("proof_lo");
extern const unsigned char proof_hi[] __asm__("proof_hi");
extern const unsigned char proof_bad_below[] __asm__("proof_bad_below");
extern const unsigned char proof_bad_above[] __asm__("proof_bad_above");

/* PROOF_N sites, each mov $1,%eax patched to mov $2,%eax by every set,
 * between two refused sites (their originals do not decode: 0xd6), each
 * jumped over: one below them, decided first, one above, decided after all
 * of them. Each refusal is a warning while the sites are decided. */
#define PROOF_BAD ALTERNATIVE(".byte 0xd6", "nop", X86_FEATURE_ALWAYS)
__attribute__((noinline, used)) static int proof_many(void)
{
    int r;
    __asm__ __volatile__("jmp proof_past_below\n"
                         "proof_bad_below:\n" PROOF_BAD "proof_past_below:\n"
                         "proof_lo:\n"
                         ".rept " PROOF_STR(PROOF_N) "\n" ALTERNATIVE(
                             "mov $1,%%eax", "mov $2,%%eax",
                             X86_FEATURE_ALWAYS) ".endr\n"
                                                 "proof_hi:\n"
                         "jmp proof_past_above\n"
                         "proof_bad_above:\n" PROOF_BAD "proof_past_above:\n"
                         : "=a"(r)::"memory");
    return r;
}

/* How many of the sites hold the original (*orig) and the replacement (*repl). */
static void proof_count(int *orig, int *repl)
{
    static const unsigned char o[5] = {0xb8, 1, 0, 0, 0}, p[5] = {0xb8, 2, 0, 0, 0};
    *orig = *repl = 0;
    for (const unsigned char *b = proof_lo; b + 5 <= proof_hi; b += 5) {
        *orig += !memcmp(b, o, 5);
        *repl += !memcmp(b, p, 5);
    }
}

/* The sites patched are the first ones, the originals all after them. */
static int proof_prefix_patched(void)
{
    static const unsigned char p[5] = {0xb8, 2, 0, 0, 0};
    int seen_orig = 0;
    for (const unsigned char *b = proof_lo; b + 5 <= proof_hi; b += 5) {
        int patched = !memcmp(b, p, 5);
        if (patched && seen_orig)
            return 0;
        seen_orig |= !patched;
    }
    return 1;
}

static int park_pipe[2];

static void *parked(void *arg)
{
    (void)arg;
    char c;
    while (read(park_pipe[0], &c, 1) < 0)
        ;
    return NULL;
}

static int started;   /* the callback started a thread */
static int start_on = 1; /* on this warning */
static int warnings;  /* warnings the callback saw */

static int stopped; /* the writer was reported stopped */

static int starter(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)ap;
    if (level != ALTPATCH_WARN)
        return 0;
    warnings++;
    stopped |= strstr(fmt, "writer stopped") != NULL;
    if (!started && warnings >= start_on) {
        pthread_t t;
        started = !pthread_create(&t, NULL, parked, NULL);
    }
    return 0;
}

struct proof_result {
    int bad_below;  /* the refused site lies below the others (decided first) */
    int size_ok;    /* proof_lo..proof_hi is PROOF_N sites */
    int rc, live, started, warnings;
    int orig, repl; /* after the apply */
    int ret;        /* proof_many() after the apply */
    int prefix;     /* proof_prefix_patched() */
    int bad_above;  /* the second refused site lies above them */
    int stopped;    /* "writer stopped" was warned */
    int walked;     /* altpatch_site_foreach()'s sites in proof_lo..proof_hi */
    int denied;     /* of them: REFUSED, WRITE_DENIED */
};

static int count_table(const struct altpatch_site_info *s, void *ctx)
{
    struct proof_result *res = ctx;
    if (s->addr < (uintptr_t)proof_lo || s->addr >= (uintptr_t)proof_hi)
        return 0;
    res->walked++;
    res->denied += s->state == ALTPATCH_SITE_REFUSED && s->reason == ALTPATCH_REASON_WRITE_DENIED;
    return 0;
}

struct proof_ctx {
    unsigned flags;
    int thread_before; /* start a thread before the apply, no callback */
    int refused_module; /* load a module refused while the modules are walked */
    int start_on;       /* the warning that starts the thread (0: the first) */
};

static void proof_body(void *out, void *ctx)
{
    struct proof_result *res = out;
    const struct proof_ctx *c = ctx;
    res->bad_below = proof_bad_below[0] == 0xd6 && (uintptr_t)proof_bad_below < (uintptr_t)proof_lo;
    res->size_ok = proof_hi - proof_lo == 5 * PROOF_N;
    res->bad_above = proof_bad_above[0] == 0xd6 && (uintptr_t)proof_bad_above >= (uintptr_t)proof_hi;
    if (c->start_on)
        start_on = c->start_on;
    if (pipe(park_pipe))
        _exit(3);
    if (c->refused_module && !dlopen(PROOF_REFUSED_SO, RTLD_NOW))
        _exit(5);
    if (c->thread_before) {
        pthread_t t;
        if (pthread_create(&t, NULL, parked, NULL))
            _exit(4);
        altpatch_set_print(NULL); /* no user code during the apply */
    } else {
        altpatch_set_print(starter);
    }
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = c->flags};
    res->rc = altpatch_apply_opts(&o);
    struct altpatch_stats st = {.sz = sizeof(st)};
    res->live = altpatch_get_stats(&st) ? -1 : (int)st.live;
    res->started = started;
    res->warnings = warnings;
    proof_count(&res->orig, &res->repl);
    res->prefix = proof_prefix_patched();
    res->stopped = stopped;
    (void)altpatch_site_foreach(count_table, res);
    res->ret = proof_many();
}

static struct proof_result *proof_run(unsigned flags, int thread_before)
{
    struct proof_ctx c = {.flags = flags, .thread_before = thread_before};
    struct proof_result *r = ap_isolated(sizeof(*r), proof_body, &c);
    cr_assert(r->size_ok, "the table is %d sites of 5 bytes", PROOF_N);
    return r;
}

/* The callback starts its thread on the walk's warning about a refused
 * module (before any decision), whichever module is walked first. */
Test(proof, callback_thread_in_walk_no_live_is_refused)
{
    struct proof_ctx c = {.flags = ALTPATCH_APPLY_NO_LIVE, .refused_module = 1};
    struct proof_result *r = ap_isolated(sizeof(*r), proof_body, &c);
    cr_assert(r->started, "the callback started its thread");
    cr_assert_eq(r->rc, -EBUSY, "apply: %d", r->rc);
    cr_assert_eq(r->orig, PROOF_N, "originals left: %d of %d (%d patched)", r->orig, PROOF_N,
                 r->repl);
}

/* The callback starts a thread on the refusal's warning, after the proof was
 * taken: a non-live apply is refused as a fresh proof would refuse it, and
 * no site is written once that thread exists (the refused site is decided
 * before all others: nothing written at all). */
Test(proof, callback_thread_no_live_is_refused)
{
    struct proof_result *r = proof_run(ALTPATCH_APPLY_NO_LIVE, 0);
    cr_assert(r->bad_below, "the first refused site lies below the others, unpatched");
    cr_assert(r->started, "the callback started its thread");
    cr_assert_eq(r->rc, -EBUSY, "apply: %d", r->rc);
    cr_assert_eq(r->live, 0);
    cr_assert_eq(r->orig, PROOF_N, "originals left: %d of %d (%d patched)", r->orig, PROOF_N,
                 r->repl);
    cr_assert_eq(r->ret, 1);
    /* refused before the first part was written: the module, decided for the
     * first time, is left undecided (as a run refused after its decisions),
     * and no writer is reported stopped */
    cr_assert_eq(r->denied, 0, "sites reported write-denied: %d of %d", r->denied, PROOF_N);
    cr_assert_eq(r->walked, 0, "sites reported: %d (undecided: none)", r->walked);
    cr_assert_not(r->stopped, "\"writer stopped\" with nothing written");
}

/* Without ALTPATCH_APPLY_NO_LIVE the thread the callback started (on its
 * warning @p start_on, 0: the first) is met as at the start of an apply: the
 * live writer patches every site, or where it cannot be used the apply is
 * refused with no write after the thread exists -- none at all where it
 * started before any write (@p before_any_write), else only a first part.
 * Never a non-live write with that thread running. */
static void live_or_refused(int start_on, bool before_any_write)
{
    struct proof_ctx c = {.start_on = start_on};
    struct proof_result *r = ap_isolated(sizeof(*r), proof_body, &c);
    cr_assert(r->size_ok, "the table is %d sites of 5 bytes", PROOF_N);
    cr_assert(r->started, "the callback started its thread");
    if (r->rc == 0) {
        cr_assert_eq(r->live, 1, "written with a thread running, not by the live writer");
        cr_assert_eq(r->repl, PROOF_N, "patched %d of %d", r->repl, PROOF_N);
        cr_assert_eq(r->ret, 2);
        return;
    }
    cr_assert_eq(r->rc, -EBUSY, "apply: %d", r->rc);
    if (before_any_write)
        cr_assert_eq(r->orig, PROOF_N, "originals left: %d of %d", r->orig, PROOF_N);
    cr_assert_gt(r->orig, 0);
    cr_assert(r->prefix, "only a first part written");
}

Test(proof, callback_thread_live_or_refused)
{
    live_or_refused(0, true);
}

/* A thread started before the apply, no user code during it: the module
 * walk's early proof is the one the apply keeps, and it must say "not
 * alone" (a wrong yes writes through non-live windows). */
Test(proof, thread_before_large_apply_no_live_is_refused)
{
    struct proof_result *r = proof_run(ALTPATCH_APPLY_NO_LIVE, 1);
    cr_assert_eq(r->rc, -EBUSY, "apply: %d", r->rc);
    cr_assert_eq(r->orig, PROOF_N, "originals left: %d of %d", r->orig, PROOF_N);
    cr_assert_eq(r->ret, 1);
}

/* The callback runs, starts no thread: the proof asked again says alone and
 * every site is written. */
static int quiet_calls;
static int quiet(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    (void)fmt;
    (void)ap;
    quiet_calls++;
    return 0;
}

static void quiet_body(void *out, void *ctx)
{
    (void)ctx;
    struct proof_result *res = out;
    altpatch_set_print(quiet);
    res->rc = altpatch_apply_opts(&(struct altpatch_apply_opts){
        .sz = sizeof(struct altpatch_apply_opts), .flags = ALTPATCH_APPLY_NO_LIVE});
    res->warnings = quiet_calls;
    proof_count(&res->orig, &res->repl);
    res->ret = proof_many();
}

Test(proof, callback_without_thread_writes_all)
{
    struct proof_result *r = ap_isolated(sizeof(*r), quiet_body, NULL);
    cr_assert_eq(r->rc, 0, "apply: %d", r->rc);
    cr_assert_gt(r->warnings, 0, "the refusal reached the callback");
    cr_assert_eq(r->repl, PROOF_N, "patched %d of %d", r->repl, PROOF_N);
    cr_assert_eq(r->ret, 2);
}

/* The thread starts on the warning of the refused site above the others:
 * after their decisions, when the first of them may have been written in a
 * part already (while alone). No write is made after the thread exists: the
 * sites not written by then keep their originals and the apply is refused. */
Test(proof, callback_thread_after_parts_no_live_writes_nothing_more)
{
    struct proof_ctx c = {.flags = ALTPATCH_APPLY_NO_LIVE, .start_on = 2};
    struct proof_result *r = ap_isolated(sizeof(*r), proof_body, &c);
    cr_assert(r->bad_above, "the second refused site lies above the others, unpatched");
    cr_assert(r->started, "the callback started its thread");
    cr_assert_eq(r->rc, -EBUSY, "apply: %d", r->rc);
    cr_assert_eq(r->orig + r->repl, PROOF_N);
    cr_assert_gt(r->orig, 0, "every site written, the last ones after the thread started");
    cr_log_info("written in parts before the thread: %d of %d", r->repl, PROOF_N);
    cr_assert(r->prefix, "only a first part written");
    cr_assert_eq(r->ret, 1);
    if (r->repl) {
        /* parts written: the rest reported as memory holds it, the stop warned */
        cr_assert_eq(r->denied, r->orig, "write-denied %d, originals %d", r->denied, r->orig);
        cr_assert(r->stopped);
    } else {
        /* refused at the first part: nothing written, left undecided */
        cr_assert_eq(r->denied, 0);
        cr_assert_not(r->stopped);
    }
    /* the two refused sites, the refusal's line saying why the rest is not
     * written and the writer's stop: no warning per site not written */
    cr_assert_lt(r->warnings, 10, "warnings: %d (%d sites not written)", r->warnings, r->orig);
}

/* The same without ALTPATCH_APPLY_NO_LIVE: the rest by the live writer, or
 * refused as above. */
Test(proof, callback_thread_after_parts_live_or_refused)
{
    live_or_refused(2, false);
}
