/* SPDX-License-Identifier: MIT */
/*
 * Part 2 (site cost against what a user would write instead) and part 5
 * (measured selection: which features make a site slower on this CPU).
 *
 * Every row is one noinline function: a loop whose body makes 16 calls of
 * one variant, each result added into an accumulator that stays live. The
 * loop framing is identical for every row, so ratios compare like with like;
 * numbers are TSC ticks per call *including* the loop's share (not
 * subtracted here: the call-style rows have no meaningful "net").
 *
 * "site" rows run the same code twice per repetition: once after
 * altpatch_apply_opts(REVERT) (unpatched: the original bytes) and once after
 * altpatch_apply() (patched), so drift hits both alike.
 */
#include "bench.h"

#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>

#include <altpatch/altpatch.h>
#include <altpatch/primitives.h>

#include "dispatch.h"

#define R4_(s) s s s s
#define R16_(s) R4_(R4_(s))

/* One timed loop: @p n iterations of 16 evaluations of @p expr added into acc. */
#define AB_CALL_LOOP(fname, expr)                                                          \
    static __attribute__((noinline)) uint64_t fname(uint64_t n)                            \
    {                                                                                      \
        uint64_t acc = 0;                                                                  \
        uint64_t t0 = ab_tsc_begin();                                                      \
        for (uint64_t i = 0; i < n; i++) {                                                 \
            R16_(acc += (uint64_t)(expr);)                                                 \
        }                                                                                  \
        uint64_t t1 = ab_tsc_end();                                                        \
        ab_sink = acc;                                                                     \
        return t1 - t0;                                                                    \
    }

/* --- hand-written sequences (the "ideal" candidates) ----------------------- */

#define AB_FENCE_NONE() __extension__({ __asm__ __volatile__("" : : : "memory"); 0; })
#define AB_FENCE_FULL() __extension__({ __asm__ __volatile__("mfence; lfence" : : : "memory"); 0; })

/* --- the site rows --------------------------------------------------------- */

AB_CALL_LOOP(site_fence, (altpatch_weak_fence(), 0))
AB_CALL_LOOP(site_fs, altpatch_fs_self())
AB_CALL_LOOP(site_gs, altpatch_gs_self())
AB_CALL_LOOP(site_cpu, altpatch_getcpu())
AB_CALL_LOOP(site_tsc, altpatch_rdtsc_ordered())
AB_CALL_LOOP(site_call, ALTPATCH_ALT_CALL(ab_call_old, ab_call_new, AB_CALL_FEATURE, acc))

/* --- hand-written instruction loops (ideal candidates, part 5) ------------- */

AB_CALL_LOOP(hand_fence_none, AB_FENCE_NONE())
AB_CALL_LOOP(hand_fence_full, AB_FENCE_FULL())
AB_CALL_LOOP(hand_fs_mov, ab_fs_mov())
AB_CALL_LOOP(hand_fs_rd, ab_fs_rd())
AB_CALL_LOOP(hand_gs_mov, ab_gs_mov())
AB_CALL_LOOP(hand_gs_rd, ab_gs_rd())
AB_CALL_LOOP(hand_cpu_libc, ab_cpu_libc())
AB_CALL_LOOP(hand_cpu_rdpid, ab_cpu_rdpid())
AB_CALL_LOOP(hand_tsc_rdtsc, ab_tsc_rdtsc())
AB_CALL_LOOP(hand_tsc_lfence, ab_tsc_lfence_rdtsc())
AB_CALL_LOOP(hand_tsc_rdtscp, ab_tsc_rdtscp())
AB_CALL_LOOP(hand_call_new, ab_call_new((long)acc))
AB_CALL_LOOP(hand_call_old, ab_call_old((long)acc))

AB_CALL_LOOP(same_fs, ab_same_fs_rd())
AB_CALL_LOOP(same_gs, ab_same_gs_rd())
AB_CALL_LOOP(same_cpu, ab_same_cpu_rdpid())
AB_CALL_LOOP(same_tsc, ab_same_tsc_rdtscp())
AB_CALL_LOOP(same_call, AB_SAME_CALL(ab_call_new, acc))

/* --- what users write instead --------------------------------------------- */

AB_CALL_LOOP(fp_fence, ab_fp.fence())
AB_CALL_LOOP(fp_fs, ab_fp.fs())
AB_CALL_LOOP(fp_gs, ab_fp.gs())
AB_CALL_LOOP(fp_cpu, ab_fp.cpu())
AB_CALL_LOOP(fp_tsc, ab_fp.tsc())
AB_CALL_LOOP(fp_call, ab_fp.call((long)acc))

AB_CALL_LOOP(if_fence, ab_ifunc_fence())
AB_CALL_LOOP(if_fs, ab_ifunc_fs())
AB_CALL_LOOP(if_gs, ab_ifunc_gs())
AB_CALL_LOOP(if_cpu, ab_ifunc_cpu())
AB_CALL_LOOP(if_tsc, ab_ifunc_tsc())
AB_CALL_LOOP(if_call, ab_ifunc_call((long)acc))

AB_CALL_LOOP(tc_call, ab_clones_call((long)acc))

AB_CALL_LOOP(flag_fence, ab_flags.fence ? AB_FENCE_FULL() : AB_FENCE_NONE())
AB_CALL_LOOP(flag_fs, ab_flags.fsgsbase ? ab_fs_rd() : ab_fs_mov())
AB_CALL_LOOP(flag_gs, ab_flags.fsgsbase ? ab_gs_rd() : ab_gs_mov())
AB_CALL_LOOP(flag_cpu, ab_flags.rdpid ? ab_cpu_rdpid() : ab_cpu_libc())
AB_CALL_LOOP(flag_tsc, ab_flags.rdtscp ? ab_tsc_rdtscp()
                                       : (ab_flags.lfence_rdtsc ? ab_tsc_lfence_rdtsc()
                                                                : ab_tsc_rdtsc()))
AB_CALL_LOOP(flag_call, ab_flags.call ? ab_call_new((long)acc) : ab_call_old((long)acc))

/* glibc declares pthread_self() const, which lets the compiler hoist it out of
 * the loop; the same symbol without the attribute is called every time. */
extern pthread_t ab_pthread_self(void) __asm__("pthread_self");
AB_CALL_LOOP(libc_fs, (uintptr_t)ab_pthread_self())
AB_CALL_LOOP(libc_cpu, (unsigned)sched_getcpu())

/* --- the table ------------------------------------------------------------- */

typedef uint64_t (*ab_loop_fn)(uint64_t);

enum { P_FENCE, P_FS, P_GS, P_CPU, P_TSC, P_CALL, P_COUNT };

static const char *const prim_name[P_COUNT] = {
    "altpatch_weak_fence", "altpatch_fs_self", "altpatch_gs_self",
    "altpatch_getcpu",     "altpatch_rdtsc_ordered", "ALTPATCH_ALT_CALL",
};

/* Every loop of one primitive. The ideal is picked per host at run time. */
struct prim_loops {
    ab_loop_fn site, fp, ifunc, clones, flag, libc;
    const char *libc_name;
    ab_loop_fn ideal_if_set, ideal_if_clear; /* replacement / original, hand-written */
    ab_loop_fn same; /* the replacement with the site's registers (when it is selected) */
};

static const struct prim_loops loops[P_COUNT] = {
    [P_FENCE] = {site_fence, fp_fence, if_fence, NULL, flag_fence, NULL, NULL, hand_fence_none,
                 hand_fence_full, hand_fence_none},
    [P_FS] = {site_fs, fp_fs, if_fs, NULL, flag_fs, libc_fs, "pthread_self()", hand_fs_rd,
              hand_fs_mov, same_fs},
    [P_GS] = {site_gs, fp_gs, if_gs, NULL, flag_gs, NULL, NULL, hand_gs_rd, hand_gs_mov, same_gs},
    [P_CPU] = {site_cpu, fp_cpu, if_cpu, NULL, flag_cpu, libc_cpu, "sched_getcpu() (glibc: rseq cpu_id, else vDSO)",
               hand_cpu_rdpid, hand_cpu_libc, same_cpu},
    [P_TSC] = {site_tsc, fp_tsc, if_tsc, NULL, flag_tsc, NULL, NULL, NULL, NULL, same_tsc},
    [P_CALL] = {site_call, fp_call, if_call, tc_call, flag_call, NULL, NULL, hand_call_new,
                hand_call_old, same_call},
};

/* Sample columns. */
enum { C_UNPATCHED, C_PATCHED, C_IDEAL, C_SAME, C_FP, C_IFUNC, C_CLONES, C_FLAG, C_LIBC, C_COUNT };

/* Hand-written candidates for part 5. */
enum {
    H_FENCE_FULL, H_FENCE_NONE, H_FS_MOV, H_FS_RD, H_GS_MOV, H_GS_RD, H_CPU_LIBC,
    H_CPU_RDPID, H_TSC_RDTSC, H_TSC_LFENCE, H_TSC_RDTSCP, H_COUNT
};
static const ab_loop_fn hand[H_COUNT] = {
    hand_fence_full, hand_fence_none, hand_fs_mov,  hand_fs_rd,     hand_gs_mov,   hand_gs_rd,
    hand_cpu_libc,   hand_cpu_rdpid,  hand_tsc_rdtsc, hand_tsc_lfence, hand_tsc_rdtscp,
};

struct samples {
    double col[P_COUNT][C_COUNT][AB_MAX_REPS];
    double hand[H_COUNT][AB_MAX_REPS];
    bool hand_ok[H_COUNT];
    uint64_t n[P_COUNT][C_COUNT], hn[H_COUNT]; /* iterations per sample, 0 = not calibrated */
    uint64_t max;                              /* at most this many iterations */
    ab_loop_fn ideal[P_COUNT];
    ab_loop_fn same[P_COUNT]; /* NULL where the host keeps the original */
    const char *ideal_name[P_COUNT];
};

static void *gs_block[8] __attribute__((aligned(64)));

/* The ideal for this host: what the site should hold, written by hand. */
static void pick_ideals(struct samples *s)
{
    bool fence = altpatch_cpu_has(X86_FEATURE_APIC_MSRS_FENCE);
    bool fsgs = altpatch_cpu_has(X86_FEATURE_FSGSBASE);
    s->ideal[P_FENCE] = fence ? hand_fence_full : hand_fence_none;
    s->ideal_name[P_FENCE] = fence ? "mfence; lfence" : "(nothing: compiler barrier)";
    s->ideal[P_FS] = fsgs ? hand_fs_rd : hand_fs_mov;
    s->ideal_name[P_FS] = fsgs ? "rdfsbase" : "movq %fs:0";
    s->ideal[P_GS] = fsgs ? hand_gs_rd : hand_gs_mov;
    s->ideal_name[P_GS] = fsgs ? "rdgsbase" : "movq %gs:0";
    bool rdpid = altpatch_cpu_has(X86_FEATURE_RDPID);
    s->ideal[P_CPU] = rdpid ? hand_cpu_rdpid : hand_cpu_libc;
    s->ideal_name[P_CPU] = rdpid ? "rdpid" : "sched_getcpu()";
    if (altpatch_cpu_has(X86_FEATURE_RDTSCP)) {
        s->ideal[P_TSC] = hand_tsc_rdtscp;
        s->ideal_name[P_TSC] = "rdtscp";
    } else if (altpatch_cpu_has(X86_FEATURE_LFENCE_RDTSC)) {
        s->ideal[P_TSC] = hand_tsc_lfence;
        s->ideal_name[P_TSC] = "lfence; rdtsc";
    } else {
        s->ideal[P_TSC] = hand_tsc_rdtsc;
        s->ideal_name[P_TSC] = "rdtsc";
    }
    s->same[P_FENCE] = fence ? NULL : hand_fence_none;
    s->same[P_FS] = fsgs ? same_fs : NULL;
    s->same[P_GS] = fsgs ? same_gs : NULL;
    s->same[P_CPU] = rdpid ? same_cpu : NULL;
    s->same[P_TSC] = altpatch_cpu_has(X86_FEATURE_RDTSCP) ? same_tsc : NULL;
    bool call = altpatch_cpu_has(AB_CALL_FEATURE);
    s->same[P_CALL] = call ? same_call : NULL;
    s->ideal[P_CALL] = call ? hand_call_new : hand_call_old;
    s->ideal_name[P_CALL] = call ? "direct call newfn(x)" : "direct call oldfn(x)";
}

static int apply_revert(void)
{
    struct altpatch_apply_opts ao = {.sz = sizeof(ao), .flags = ALTPATCH_APPLY_REVERT};
    return altpatch_apply_opts(&ao);
}

/* One sample of @p fn in ticks per call, calibrating its size on first use. */
static double sample(ab_loop_fn fn, uint64_t *n, uint64_t max)
{
    if (!*n)
        *n = ab_calibrate(fn, max);
    return (double)fn(*n) / (double)(*n * 16);
}

/* One repetition: revert, unpatched sites, apply, everything else. */
static int one_rep(struct samples *s, unsigned r, bool gs_ok)
{
    int rc = apply_revert();
    if (rc < 0)
        return rc;
    for (int p = 0; p < P_COUNT; p++)
        if (p != P_GS || gs_ok)
            s->col[p][C_UNPATCHED][r] = sample(loops[p].site, &s->n[p][C_UNPATCHED], s->max);
    rc = altpatch_apply();
    if (rc < 0)
        return rc;
    for (int p = 0; p < P_COUNT; p++) {
        const struct prim_loops *l = &loops[p];
        if (p == P_GS && !gs_ok)
            continue;
        ab_loop_fn fn[C_COUNT] = {NULL,      l->site,  s->ideal[p], s->same[p], l->fp,
                                  l->ifunc,  l->clones, l->flag,    l->libc};
        for (int c = C_PATCHED; c < C_COUNT; c++)
            if (fn[c])
                s->col[p][c][r] = sample(fn[c], &s->n[p][c], s->max);
    }
    for (int h = 0; h < H_COUNT; h++)
        if (s->hand_ok[h])
            s->hand[h][r] = sample(hand[h], &s->hn[h], s->max);
    return 0;
}

static void mark_hand_ok(struct samples *s, bool gs_ok)
{
    bool fsgs = ab_fsgsbase_usable(), rdpid = ab_has_rdpid();
    for (int h = 0; h < H_COUNT; h++)
        s->hand_ok[h] = true;
    s->hand_ok[H_FS_RD] = fsgs;
    s->hand_ok[H_GS_RD] = fsgs && gs_ok;
    s->hand_ok[H_GS_MOV] = gs_ok;
    s->hand_ok[H_CPU_RDPID] = rdpid;
    s->hand_ok[H_TSC_RDTSCP] = altpatch_cpu_has(X86_FEATURE_RDTSCP); /* executed, not CPUID alone */
}

static void print_cell(const double *v, unsigned reps, bool have)
{
    if (!have) {
        printf(" n/a |");
        return;
    }
    struct ab_stat st = ab_stat_of(v, reps);
    printf(" %.2f / %.2f |", st.min, st.med);
}

/* patched / column @p c: ratio of the minima, and median of the per-repetition ratios. */
static void patched_over(const struct samples *s, int p, int c, unsigned reps, double *rmin,
                         double *rmed)
{
    double q[AB_MAX_REPS];
    for (unsigned r = 0; r < reps; r++)
        q[r] = s->col[p][c][r] > 0 ? s->col[p][C_PATCHED][r] / s->col[p][c][r] : 0;
    struct ab_stat pa = ab_stat_of(s->col[p][C_PATCHED], reps);
    struct ab_stat id = ab_stat_of(s->col[p][c], reps);
    *rmin = id.min > 0 ? pa.min / id.min : 0;
    *rmed = ab_stat_of(q, reps).med;
}

static void print_sites_table(const struct samples *s, const struct ab_opts *o, bool gs_ok)
{
    printf("### Site cost against the alternatives (TSC ticks per call, min / median)\n\n");
    printf("Each cell: a loop of 16 calls per iteration, timed with rdtsc; each sample sized to "
           "about %d ticks (at most %llu calls), %u samples per cell, pinned to CPU %d; "
           "the revert / unpatched / apply / patched+rest order repeats per sample. Loop "
           "overhead included in every cell alike. The goal column uses the ratio of the "
           "minima; the second number is the median of the per-sample ratios. "
           "*ideal* = the instruction sequence this CPU should run, written by hand without "
           "padding, registers left to the compiler; *ideal, site's registers* = the same "
           "instruction with the fixed registers and clobbers primitives.h uses (so "
           "patched / that = what patching itself costs: padding NOPs, nothing else). *fn pointer* = call through a volatile pointer to a noinline function; "
           "*IFUNC* = GNU ifunc resolved at load; *target_clones* = GCC/clang function "
           "multiversioning (only where the compiler generates the code: the call "
           "primitive); *flag* = `if (global_flag)` around both sequences.\n\n",
           AB_TARGET_TICKS, (unsigned long long)(o->iters / 16 * 16), o->reps, o->cpu);
    printf("| primitive | ideal here | unpatched site | patched site | ideal | ideal, site's "
           "registers | fn pointer | IFUNC | target_clones | flag branch | libc | "
           "patched/ideal (min, median) | patched/same-registers (min, median) |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int p = 0; p < P_COUNT; p++) {
        if (p == P_GS && !gs_ok) {
            printf("| %s | skipped: altpatch_gs_install() failed |||||||||\n", prim_name[p]);
            continue;
        }
        printf("| %s | %s |", prim_name[p], s->ideal_name[p]);
        for (int c = C_UNPATCHED; c < C_COUNT; c++) {
            bool have = c <= C_IDEAL || (c == C_SAME && s->same[p]) || (c == C_FP) || (c == C_IFUNC) || (c == C_FLAG) ||
                        (c == C_CLONES && loops[p].clones) || (c == C_LIBC && loops[p].libc);
            print_cell(s->col[p][c], o->reps, have);
        }
        double rmin, rmed;
        patched_over(s, p, C_IDEAL, o->reps, &rmin, &rmed);
        printf(" %.3f, %.3f %s |", rmin, rmed,
               rmin <= 1.02 ? "(goal met)" : "(goal <= 1.02 NOT met)");
        if (s->same[p]) {
            patched_over(s, p, C_SAME, o->reps, &rmin, &rmed);
            printf(" %.3f, %.3f |\n", rmin, rmed);
        } else {
            printf(" n/a |\n");
        }
    }
    printf("\nlibc column: `%s` for altpatch_fs_self, `%s` for altpatch_getcpu.\n\n",
           loops[P_FS].libc_name, loops[P_CPU].libc_name);
}

/* One selection row: original vs replacement; true when the replacement is slower. */
static bool select_row(const struct samples *s, unsigned reps, const char *prim, unsigned feat,
                       int h_orig, int h_repl, const char *orig, const char *repl)
{
    const char *name = altpatch_feature_name(feat);
    if (!s->hand_ok[h_orig] || !s->hand_ok[h_repl]) {
        printf("| %s | %s | %s | %s | n/a | n/a | - | not measurable here (instruction "
               "unavailable) |\n",
               prim, name ? name : "?", orig, repl);
        return false;
    }
    struct ab_stat a = ab_stat_of(s->hand[h_orig], reps), b = ab_stat_of(s->hand[h_repl], reps);
    bool slower = b.min > a.min * 1.02 && b.med > a.med * 1.02;
    bool faster = b.min * 1.02 < a.min && b.med * 1.02 < a.med;
    printf("| %s | %s | %s | %s | %.2f / %.2f | %.2f / %.2f | %.2f | %s |\n", prim,
           name ? name : "?", orig, repl, a.min, a.med, b.min, b.med,
           a.med > 0 ? b.med / a.med : 0,
           slower ? "**replacement SLOWER here**" : faster ? "replacement faster" : "same (within 2%)");
    return slower;
}

static void print_select(const struct samples *s, const struct ab_opts *o)
{
    unsigned r = o->reps;
    printf("### Measured selection: original vs replacement on this CPU (ticks per call, "
           "min / median)\n\n");
    printf("Hand-written sequences in the same loop framing as above. A replacement counts as "
           "slower when both its min and its median exceed the original's by more than 2%%.\n\n");
    printf("| primitive | feature | original | replacement | original | replacement | "
           "repl/orig (median) | verdict |\n");
    printf("|---|---|---|---|---:|---:|---:|---|\n");
    bool fs_slow = select_row(s, r, "altpatch_fs_self", X86_FEATURE_FSGSBASE, H_FS_MOV, H_FS_RD,
                              "movq %fs:0", "rdfsbase");
    bool gs_slow = select_row(s, r, "altpatch_gs_self", X86_FEATURE_FSGSBASE, H_GS_MOV, H_GS_RD,
                              "movq %gs:0", "rdgsbase");
    bool cpu_slow = select_row(s, r, "altpatch_getcpu", X86_FEATURE_RDPID, H_CPU_LIBC,
                               H_CPU_RDPID, "sched_getcpu()", "rdpid");
    bool tsc_slow = select_row(s, r, "altpatch_rdtsc_ordered", X86_FEATURE_RDTSCP, H_TSC_LFENCE,
                               H_TSC_RDTSCP, "lfence; rdtsc", "rdtscp");
    select_row(s, r, "altpatch_weak_fence", X86_FEATURE_APIC_MSRS_FENCE, H_FENCE_FULL,
               H_FENCE_NONE, "mfence; lfence", "(NOP6)");
    printf("\nNotes: the weak fence row is informational: the fence is kept for correctness "
           "where APIC_MSRS_FENCE is set, never for speed, so it is never a clearcpuid "
           "candidate. For altpatch_rdtsc_ordered the unordered `rdtsc` original is not a "
           "candidate (it does not order); clearing rdtscp selects `lfence; rdtsc` where "
           "LFENCE_RDTSC is set. ALTPATCH_ALT_CALL's cost is the user's functions'.\n\n");
    char line[128] = "";
    if (fs_slow && gs_slow)
        strcat(line, "fsgsbase,");
    if (cpu_slow)
        strcat(line, "rdpid,");
    if (tsc_slow)
        strcat(line, "rdtscp,");
    size_t len = strlen(line);
    if (len)
        line[len - 1] = 0;
    if (fs_slow != gs_slow)
        printf("fsgsbase: rdfsbase and rdgsbase disagree here (one slower, one not): not "
               "cleared; weigh your own use.\n\n");
    if (len)
        printf("Replacements slower on this CPU: run with\n\n    ALTPATCH_CLEARCPUID=%s\n\n", line);
    else
        printf("No replacement is slower on this CPU:\n\n    ALTPATCH_CLEARCPUID=\n\n");
    printf("(clearing a feature affects every site keyed on it in the process)\n\n");
}

int ab_mode_sites(const struct ab_opts *o, bool table, bool select)
{
    static struct samples s;
    memset(&s, 0, sizeof(s));
    bool gs_ok = altpatch_gs_install(gs_block) == 0;
    ab_dispatch_init();
    pick_ideals(&s);
    mark_hand_ok(&s, gs_ok);
    s.max = o->iters / 16;
    int rc = altpatch_apply();
    struct altpatch_stats st = {.sz = sizeof(st)};
    if (rc < 0 || altpatch_get_stats(&st) < 0) {
        fprintf(stderr, "altbench: altpatch_apply() failed: %d (%s)\n", rc,
                strerror(rc < 0 ? -rc : 0));
        return 1;
    }
    printf("<!-- altbench sites: first apply: %llu sites seen, %llu patched, %llu refused -->\n\n",
           (unsigned long long)st.sites_seen, (unsigned long long)st.sites_patched,
           (unsigned long long)st.sites_refused);
    if (st.sites_patched == 0)
        printf("**No site was patched** (ALTPATCH_OFF set, or no replacement applies here): the "
               "patched columns measure the original bytes.\n\n");
    if (one_rep(&s, 0, gs_ok) < 0) /* calibrate, warm up */
        return 1;
    for (unsigned r = 0; r < o->reps; r++) {
        rc = one_rep(&s, r, gs_ok);
        if (rc < 0) {
            fprintf(stderr, "altbench: apply/revert failed: %d (%s)\n", rc, strerror(-rc));
            return 1;
        }
    }
    if (table)
        print_sites_table(&s, o, gs_ok);
    if (select)
        print_select(&s, o);
    return 0;
}
