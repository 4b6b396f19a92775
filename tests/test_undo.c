/* SPDX-License-Identifier: MIT */
/*
 * An apply refused (-EBUSY) after its decisions and before any write: a
 * print callback starts a thread while the sites are decided, the apply
 * asks about threads again before the writer and refuses (NO_LIVE).
 * Memory then holds what it held before; altpatch_site_foreach() must say
 * so (no site reported with a replacement it does not hold), and the next
 * apply without the thread decides those sites again and writes them.
 *
 * The tables are small (a first decision waits for the writer to ask about
 * threads: a library loaded after the program's apply, undo_lib.c) and
 * their sites change with the feature set a test applies (ALWAYS or
 * nothing), so a second apply under the other set is a switch of a module
 * decided before. Every body runs in a fork()ed child
 * (ap_isolate.h); expectations come from the sets applied, never from this
 * host.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"
#include "ap_mov_sites.h"
#include "ap_scribble.h"

#define UNDO_N 16

extern const unsigned char undo_lo[] __asm__("undo_lo");
extern const unsigned char undo_hi[] __asm__("undo_hi");

/* One refused site (its original does not decode: a warning each time its
 * reason is new) jumped over, below UNDO_N sites of mov $1,%eax that ALWAYS
 * patches to mov $2,%eax. */
__attribute__((noinline, used)) static int undo_sites(void)
{
    int r;
    __asm__ __volatile__("jmp undo_past_bad\n" ALTERNATIVE(".byte 0xd6", "nop",
                                                           X86_FEATURE_ALWAYS) "undo_past_bad:\n"
                                                                               "undo_lo:\n"
                         AP_MOV_SITES(AP_MOV_STR(UNDO_N)) "undo_hi:\n"
                         : "=a"(r)::"memory");
    return r;
}

static int park_pipe[2];
static pthread_t parked_thread;

static void *parked(void *arg)
{
    (void)arg;
    char c;
    while (read(park_pipe[0], &c, 1) < 0)
        ;
    return NULL;
}

static int armed;   /* the next warning starts the thread */
static int started; /* it did */
static int denied_warnings; /* warnings of a site not written, once it had started */

static int starter(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level != ALTPATCH_WARN)
        return 0;
    if (started) {
        char line[512];
        vsnprintf(line, sizeof(line), fmt, ap);
        denied_warnings += !!strstr(line, altpatch_strreason(ALTPATCH_REASON_WRITE_DENIED));
    } else if (armed) {
        started = !pthread_create(&parked_thread, NULL, parked, NULL);
    }
    return 0;
}

/* The thread leaves; the apply after it retries while the kernel still
 * counts the thread's last reference to the memory map (join returns as it
 * clears its id, a moment before). */
static int undo_stop_thread_and_apply(const struct altpatch_features *fs)
{
    close(park_pipe[1]);
    if (pthread_join(parked_thread, NULL))
        _exit(6);
    struct altpatch_apply_opts o = {
        .sz = sizeof(o), .features = fs, .flags = ALTPATCH_APPLY_NO_LIVE};
    int rc = -EBUSY;
    for (int i = 0; i < 200 && rc == -EBUSY; i++) {
        if (i)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        rc = altpatch_apply_opts(&o);
    }
    return rc;
}

/* What site_foreach says about the UNDO_N sites in [lo, hi), against memory. */
struct undo_view {
    uintptr_t lo, hi;
    int seen;
    int patched;      /* PATCHED, chosen >= 0 */
    int original;     /* ORIGINAL, chosen -1 */
    int denied;       /* REFUSED, WRITE_DENIED */
    int mismatch;     /* REFUSED, MEM_MISMATCH */
    int other;        /* any other state or reason */
    int wrong;        /* reported with bytes memory does not hold */
    int mem_orig, mem_repl;
};

static int undo_site(const struct altpatch_site_info *s, void *ctx)
{
    struct undo_view *v = ctx;
    if (s->addr < v->lo || s->addr >= v->hi)
        return 0;
    v->seen++;
    const unsigned char *mem = s->current;
    bool holds_orig = mem && !memcmp(mem, ap_mov_orig, 5);
    bool holds_repl = mem && !memcmp(mem, ap_mov_repl, 5);
    v->mem_orig += holds_orig;
    v->mem_repl += holds_repl;
    if (s->state == ALTPATCH_SITE_PATCHED && s->chosen == 0) {
        v->patched++;
        v->wrong += !holds_repl;
    } else if (s->state == ALTPATCH_SITE_ORIGINAL && s->chosen == -1) {
        v->original++;
        v->wrong += !holds_orig;
    } else if (s->state == ALTPATCH_SITE_REFUSED && s->reason == ALTPATCH_REASON_WRITE_DENIED) {
        v->denied++;
        /* not written: what the site held before (its original here) */
        v->wrong += !holds_orig || s->chosen != -1;
    } else if (s->state == ALTPATCH_SITE_REFUSED &&
               s->reason == ALTPATCH_REASON_MEM_MISMATCH) {
        v->mismatch++;
        v->wrong += holds_orig || holds_repl;
    } else {
        v->other++;
    }
    return 0;
}

static void undo_look(struct undo_view *v, const void *lo, const void *hi)
{
    memset(v, 0, sizeof(*v));
    v->lo = (uintptr_t)lo;
    v->hi = (uintptr_t)hi;
    if (altpatch_site_foreach(undo_site, v))
        v->seen = -1;
}

struct undo_result {
    int size_ok;
    int rc_first, rc_busy, rc_after;
    int started, denied_warnings;
    struct undo_view busy, after;
    int ret_busy, ret_after;
};

static void undo_prepare(struct undo_result *res)
{
    res->size_ok = undo_hi - undo_lo == 5 * UNDO_N;
    if (pipe(park_pipe))
        _exit(3);
    altpatch_set_print(starter);
}

/*
 * Both scenarios' end: the apply of @p o, whose print callback starts the
 * thread (refused before any write), then what memory holds and what the
 * listing says of the sites in [@p lo, @p hi) and what @p sites (the
 * function running them) returns; then the apply under @p again once the
 * thread has left, and the same.
 */
static void undo_refused_then_again(struct undo_result *res, const struct altpatch_apply_opts *o,
                                    const struct altpatch_features *again, const void *lo,
                                    const void *hi, int (*sites)(void))
{
    armed = 1;
    res->rc_busy = altpatch_apply_opts(o);
    res->started = started;
    res->denied_warnings = denied_warnings;
    undo_look(&res->busy, lo, hi);
    res->ret_busy = sites();
    armed = 0;
    res->rc_after = started ? undo_stop_thread_and_apply(again) : -1;
    undo_look(&res->after, lo, hi);
    res->ret_after = sites();
}

/* A library's first decision (ALWAYS), in an apply after the program's,
 * refused before the writer: the module is left as never decided, its sites
 * reported with their originals. */
static void first_body(void *out, void *ctx)
{
    (void)ctx;
    struct undo_result *res = out;
    undo_prepare(res);
    struct altpatch_features *always = altpatch_features_new();
    if (!always || altpatch_features_set(always, X86_FEATURE_ALWAYS))
        _exit(4);
    struct altpatch_apply_opts o = {
        .sz = sizeof(o), .features = always, .flags = ALTPATCH_APPLY_NO_LIVE};
    res->rc_first = altpatch_apply_opts(&o);
    void *h = dlopen(UNDO_LIB, RTLD_NOW);
    const unsigned char *lo = h ? dlsym(h, "undo_lib_lo") : NULL;
    const unsigned char *hi = h ? dlsym(h, "undo_lib_hi") : NULL;
    int (*sites)(void) = h ? (int (*)(void))dlsym(h, "undo_lib_sites") : NULL;
    if (!lo || !hi || !sites)
        _exit(5);
    res->size_ok = hi - lo == 5 * UNDO_N;
    /* the thread starts on the library's refused site, during the decisions */
    undo_refused_then_again(res, &o, always, lo, hi, sites);
    altpatch_features_free(always);
}

Test(undo, first_decision_refused_before_write_is_undone)
{
    struct undo_result *r = ap_isolated(sizeof(*r), first_body, NULL);
    cr_assert(r->size_ok, "the library's table is %d sites of 5 bytes", UNDO_N);
    cr_assert_eq(r->rc_first, 0, "the program's apply: %d", r->rc_first);
    cr_assert(r->started, "the callback started its thread");
    cr_assert_eq(r->rc_busy, -EBUSY, "apply: %d", r->rc_busy);
    cr_assert_eq(r->busy.seen, UNDO_N, "sites listed: %d", r->busy.seen);
    cr_assert_eq(r->busy.mem_orig, UNDO_N, "originals in memory: %d", r->busy.mem_orig);
    cr_assert_eq(r->busy.original, UNDO_N,
                 "listed as originals: %d (patched %d, denied %d, other %d)", r->busy.original,
                 r->busy.patched, r->busy.denied, r->busy.other);
    cr_assert_eq(r->busy.wrong, 0);
    cr_assert_eq(r->ret_busy, 1);
    cr_assert_eq(r->rc_after, 0, "apply without the thread: %d", r->rc_after);
    cr_assert_eq(r->after.mem_repl, UNDO_N, "written: %d", r->after.mem_repl);
    cr_assert_eq(r->after.patched, UNDO_N);
    cr_assert_eq(r->after.wrong, 0);
    cr_assert_eq(r->ret_after, 2);
}

/* Put foreign bytes at site @p k (memory holds neither its original nor a
 * plan: refused with a warning when it is decided next). */
static void undo_scribble(int k)
{
    ap_scribble((uintptr_t)undo_lo + 5 * (uintptr_t)k, ap_mov_foreign, sizeof(ap_mov_foreign));
}

#define UNDO_SCRIBBLED 5

/* Decided under the empty set (every site its original), then switched to
 * ALWAYS: the callback starts the thread on the warning about the site
 * that holds foreign bytes, the apply is refused before its writer. */
static void switch_body(void *out, void *ctx)
{
    (void)ctx;
    struct undo_result *res = out;
    undo_prepare(res);
    struct altpatch_features *none = altpatch_features_new();
    struct altpatch_features *always = altpatch_features_new();
    if (!none || !always || altpatch_features_set(always, X86_FEATURE_ALWAYS))
        _exit(4);
    struct altpatch_apply_opts o = {
        .sz = sizeof(o), .features = none, .flags = ALTPATCH_APPLY_NO_LIVE};
    res->rc_first = altpatch_apply_opts(&o);
    undo_scribble(UNDO_SCRIBBLED);
    o.features = always;
    undo_refused_then_again(res, &o, always, undo_lo, undo_hi, undo_sites);
    altpatch_features_free(none);
    altpatch_features_free(always);
}

Test(undo, switch_refused_before_write_reports_memory)
{
    struct undo_result *r = ap_isolated(sizeof(*r), switch_body, NULL);
    cr_assert(r->size_ok, "the table is %d sites of 5 bytes", UNDO_N);
    cr_assert_eq(r->rc_first, 0, "apply under no feature: %d", r->rc_first);
    cr_assert(r->started, "the callback started its thread");
    cr_assert_eq(r->rc_busy, -EBUSY, "apply: %d", r->rc_busy);
    cr_assert_eq(r->busy.seen, UNDO_N, "sites listed: %d", r->busy.seen);
    cr_assert_eq(r->busy.mem_orig, UNDO_N - 1, "originals in memory: %d", r->busy.mem_orig);
    cr_assert_eq(r->busy.mismatch, 1, "the foreign bytes refused");
    cr_assert_eq(r->busy.patched, 0,
                 "listed as patched with their originals in memory: %d", r->busy.patched);
    cr_assert_eq(r->busy.original + r->busy.denied, UNDO_N - 1,
                 "listed as originals %d, not written %d, other %d", r->busy.original,
                 r->busy.denied, r->busy.other);
    cr_assert_eq(r->busy.wrong, 0);
    cr_assert_eq(r->ret_busy, 1, "the last site runs its original");
    /* the refusal's warning says why nothing was written: none per site */
    cr_assert_eq(r->denied_warnings, 0, "sites warned as not written: %d", r->denied_warnings);
    /* the next apply decides the sites not written again and writes them */
    cr_assert_eq(r->rc_after, 0, "apply without the thread: %d", r->rc_after);
    cr_assert_eq(r->after.mem_repl, UNDO_N - 1, "written: %d", r->after.mem_repl);
    cr_assert_eq(r->after.patched, UNDO_N - 1);
    cr_assert_eq(r->after.mismatch, 1);
    cr_assert_eq(r->after.wrong, 0);
    cr_assert_eq(r->ret_after, 2, "the last site runs its replacement");
}
