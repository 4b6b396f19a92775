/* SPDX-License-Identifier: MIT */
/*
 * A quick switch -- an apply after a revert, or a revert, of a module whose
 * sites all hold what the last apply left -- compares each site with memory
 * once, after the proof that the process runs alone, and the writer takes
 * those comparisons without making them again, but only while no user code
 * ran since that proof. Here a library decided again (its
 * site holds foreign bytes: refused, with a warning) makes the print
 * callback run after the program's module was compared and before the
 * writer, and the callback puts foreign bytes into one of the program's
 * sites. The writer must find them: that site refused (MEM_MISMATCH) with
 * the foreign bytes left, every other site written.
 *
 * Every body runs in a fork()ed child (ap_isolate.h); expectations come from
 * the set applied (ALWAYS), never from this host.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"
#include "ap_mov_sites.h"
#include "ap_scribble.h"

#define QS_N 16
#define QS_SCRIBBLED 5

extern const unsigned char qs_lo[] __asm__("qs_lo");
extern const unsigned char qs_hi[] __asm__("qs_hi");

/* QS_N sites of mov $1,%eax that ALWAYS patches to mov $2,%eax. */
__attribute__((noinline, used)) static int qs_sites(void)
{
    int r;
    __asm__ __volatile__("qs_lo:\n" AP_MOV_SITES(AP_MOV_STR(QS_N)) "qs_hi:\n"
                         : "=a"(r)::"memory");
    return r;
}

/* Put foreign bytes at @p a (5 bytes of text). */
static void qs_scribble(uintptr_t a)
{
    ap_scribble(a, ap_mov_foreign, sizeof(ap_mov_foreign));
}

static int armed;    /* the next warning scribbles on the program's site */
static int scribbled; /* it did */

static int scribbler(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)fmt;
    (void)ap;
    if (level == ALTPATCH_WARN && armed && !scribbled) {
        qs_scribble((uintptr_t)qs_lo + 5 * QS_SCRIBBLED);
        scribbled = 1;
    }
    return 0;
}

struct qs_result {
    int size_ok, lib_ok;
    int rc_first, rc_revert, rc_switch;
    int orig_after_revert;
    int scribbled;
    int repl, foreign, other; /* what the program's sites hold after the switch */
    int foreign_at_scribbled;
    int state, reason; /* the listing's word on the scribbled site */
    int lib_reason;
    int program_first; /* the listing's order, an apply's: the program's module first */
    struct altpatch_stats st;
};

struct qs_look {
    uintptr_t at, lib;
    int state, reason, lib_reason;
    int seen, at_seen, lib_seen; /* where each came in the listing */
};

static int qs_site(const struct altpatch_site_info *s, void *ctx)
{
    struct qs_look *l = ctx;
    l->seen++;
    if (s->addr == l->at) {
        l->state = s->state;
        l->reason = s->reason;
        l->at_seen = l->seen;
    } else if (s->addr == l->lib) {
        l->lib_reason = s->reason;
        l->lib_seen = l->seen;
    }
    return 0;
}

static void switch_body(void *out, void *ctx)
{
    (void)ctx;
    struct qs_result *res = out;
    res->size_ok = qs_hi - qs_lo == 5 * QS_N;
    void *h = dlopen(QS_LIB, RTLD_NOW);
    const unsigned char *lib = h ? dlsym(h, "qs_lib_lo") : NULL;
    const unsigned char *lib_hi = h ? dlsym(h, "qs_lib_hi") : NULL;
    res->lib_ok = lib && lib_hi && lib_hi - lib == 5;
    if (!res->lib_ok)
        _exit(5);
    struct altpatch_features *always = altpatch_features_new();
    if (!always || altpatch_features_set(always, X86_FEATURE_ALWAYS))
        _exit(4);
    altpatch_set_print(scribbler);
    struct altpatch_apply_opts o = {
        .sz = sizeof(o), .features = always, .flags = ALTPATCH_APPLY_NO_LIVE};
    res->rc_first = altpatch_apply_opts(&o);
    o.flags |= ALTPATCH_APPLY_REVERT;
    res->rc_revert = altpatch_apply_opts(&o);
    for (int i = 0; i < QS_N; i++)
        res->orig_after_revert += !memcmp(qs_lo + 5 * i, ap_mov_orig, 5);
    /* the library decided again at the switch: its site refused, a warning */
    qs_scribble((uintptr_t)lib);
    o.flags &= ~(unsigned)ALTPATCH_APPLY_REVERT;
    armed = 1;
    res->rc_switch = altpatch_apply_opts(&o);
    armed = 0;
    res->st.sz = sizeof(res->st);
    if (altpatch_get_stats(&res->st))
        _exit(8);
    res->scribbled = scribbled;
    for (int i = 0; i < QS_N; i++) {
        const unsigned char *s = qs_lo + 5 * i;
        if (!memcmp(s, ap_mov_repl, 5))
            res->repl++;
        else if (!memcmp(s, ap_mov_foreign, 5))
            res->foreign++;
        else
            res->other++;
    }
    res->foreign_at_scribbled = !memcmp(qs_lo + 5 * QS_SCRIBBLED, ap_mov_foreign, 5);
    struct qs_look l = {(uintptr_t)qs_lo + 5 * QS_SCRIBBLED, (uintptr_t)lib, -1, -1, -1, 0, 0, 0};
    if (altpatch_site_foreach(qs_site, &l))
        _exit(6);
    res->program_first = l.at_seen && l.lib_seen && l.at_seen < l.lib_seen;
    res->state = l.state;
    res->reason = l.reason;
    res->lib_reason = l.lib_reason;
    altpatch_features_free(always);
}

Test(quick_switch, user_code_between_compare_and_writer_is_seen)
{
    struct qs_result *r = ap_isolated(sizeof(*r), switch_body, NULL);
    cr_assert(r->size_ok, "the table is %d sites of 5 bytes", QS_N);
    cr_assert(r->lib_ok, "the library's site");
    cr_assert_eq(r->rc_first, 0, "apply: %d", r->rc_first);
    cr_assert_eq(r->rc_revert, 0, "revert: %d", r->rc_revert);
    cr_assert_eq(r->orig_after_revert, QS_N, "originals after the revert: %d",
                 r->orig_after_revert);
    cr_assert_eq(r->rc_switch, 0, "apply after the revert: %d", r->rc_switch);
    cr_assert(r->scribbled, "the library's refusal ran the callback");
    /* modules are decided in the listing's order (the loader's: the
     * program first), so the callback ran after the program's compares */
    cr_assert(r->program_first, "the program's module before the library's");
    cr_assert_eq(r->lib_reason, ALTPATCH_REASON_MEM_MISMATCH, "the library's site: %d",
                 r->lib_reason);
    cr_assert(r->foreign_at_scribbled, "the foreign bytes were written over");
    cr_assert_eq(r->state, ALTPATCH_SITE_REFUSED, "the scribbled site: state %d", r->state);
    cr_assert_eq(r->reason, ALTPATCH_REASON_MEM_MISMATCH, "the scribbled site: reason %d",
                 r->reason);
    cr_assert_eq(r->repl, QS_N - 1, "the other sites written: %d (other bytes %d)", r->repl,
                 r->other);
    cr_assert_eq(r->foreign, 1);
    cr_assert_eq(r->st.sites_refused, 2, "refused: %llu",
                 (unsigned long long)r->st.sites_refused);
}
