/* SPDX-License-Identifier: MIT */
/*
 * Apply harness, linked into every generated program (altbench_alt_N,
 * altbench_plain_N). Usage: PROG [REPS [CPU]]. Prints one line per phase:
 *
 *   altpatch n=N phase=P ns_min=.. ns_med=.. rc=.. seen=.. patched=.. unchanged=..
 *            refused=.. pages=.. syscalls=.. bytes=..
 *
 * phases: cold      first altpatch_apply() of a fresh process (fork()ed child
 *                   per repetition): discovery, saving originals, plan, write
 *         nochange  altpatch_apply() again: every site already holds its final
 *                   bytes, so this is the cost of deciding alone
 *         dryrun    ALTPATCH_APPLY_DRY_RUN: plan every site, write nothing
 *         revert    ALTPATCH_APPLY_REVERT: write every original back
 *         warm      altpatch_apply() after a revert (modules already known)
 *
 * and one line with the memory the library keeps after its first apply in this
 * process, per site: the heap's (mallinfo2: bytes in use after minus before)
 * plus the blocks it took from its own region (region_bytes, in heap_bytes):
 *
 *   altpatch n=N phase=heap heap_bytes=.. heap_per_site=.. region_bytes=..
 *
 * ALTBENCH_PROFILE=NAME plans every phase for that feature profile instead of
 * this CPU (altpatch_features_profile(): amd-zen4, intel-spr, baseline, ...):
 * the sites another CPU would have written, written here. The generated
 * functions are never called, so bytes this CPU cannot run are harmless.
 */
#include "harness.h"

#include <altpatch/altpatch.h>
#include <malloc.h>

extern const unsigned long ab_gen_sites;
/* The library's region in use (altpatch/src/mem.c; linked from its plain objects). */
size_t ap_mem_in_use(void);

/* ALTBENCH_PROFILE's set, made before anything is timed; NULL: this CPU. */
static struct altpatch_features *profile;

static void timed(struct ab_h_sample *s, unsigned flags)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = profile, .flags = flags};
    struct altpatch_stats st = {.sz = sizeof(st)};
    uint64_t t0 = ab_h_now();
    int rc = flags || profile ? altpatch_apply_opts(&o) : altpatch_apply();
    s->ns = ab_h_now() - t0;
    s->rc = rc;
    if (altpatch_get_stats(&st) == 0) {
        uint64_t c[8] = {st.sites_seen,    st.sites_patched, st.sites_unchanged,
                         st.sites_refused, st.pages_written, st.syscalls,
                         st.bytes_written, st.modules};
        memcpy(s->c, c, sizeof(c));
    }
}

static void cold_one(struct ab_h_sample *s) { timed(s, 0); }

static void report(const char *phase, const struct ab_h_sample *s, unsigned reps)
{
    uint64_t min, med;
    ab_h_minmed(s, reps, &min, &med);
    const struct ab_h_sample *l = &s[reps - 1];
    printf("altpatch n=%lu phase=%s reps=%u ns_min=%llu ns_med=%llu rc=%lld seen=%llu "
           "patched=%llu unchanged=%llu refused=%llu pages=%llu syscalls=%llu bytes=%llu\n",
           ab_gen_sites, phase, reps, (unsigned long long)min, (unsigned long long)med,
           (long long)l->rc, (unsigned long long)l->c[0], (unsigned long long)l->c[1],
           (unsigned long long)l->c[2], (unsigned long long)l->c[3], (unsigned long long)l->c[4],
           (unsigned long long)l->c[5], (unsigned long long)l->c[6]);
}

int main(int argc, char **argv)
{
    static struct ab_h_sample cold[AB_H_MAX_REPS], noch[AB_H_MAX_REPS], dry[AB_H_MAX_REPS],
        rev[AB_H_MAX_REPS], warm[AB_H_MAX_REPS];
    unsigned reps = ab_h_setup(argc, argv);
    altpatch_set_print(NULL);
    const char *pname = getenv("ALTBENCH_PROFILE");
    if (pname && *pname && !(profile = altpatch_features_profile(pname))) {
        fprintf(stderr, "%s: unknown ALTBENCH_PROFILE '%s'\n", argv[0], pname);
        return 2;
    }
    if (ab_h_cold(reps, cold_one, cold) != 0) {
        fprintf(stderr, "%s: a cold-apply child failed\n", argv[0]);
        return 1;
    }
    struct ab_h_sample first;
    struct mallinfo2 h0 = mallinfo2();
    size_t r0 = ap_mem_in_use();
    timed(&first, 0);
    struct mallinfo2 h1 = mallinfo2();
    size_t region = ap_mem_in_use() - r0;
    if (first.rc < 0) {
        fprintf(stderr, "%s: altpatch_apply() = %lld\n", argv[0], (long long)first.rc);
        return 1;
    }
    for (unsigned r = 0; r < reps; r++) {
        timed(&noch[r], 0);
        timed(&dry[r], ALTPATCH_APPLY_DRY_RUN);
        timed(&rev[r], ALTPATCH_APPLY_REVERT);
        timed(&warm[r], 0);
    }
    size_t heap = (h1.uordblks + h1.hblkhd) - (h0.uordblks + h0.hblkhd) + region;
    printf("altpatch n=%lu phase=heap heap_bytes=%zu heap_per_site=%.1f region_bytes=%zu\n",
           ab_gen_sites, heap, ab_gen_sites ? (double)heap / (double)ab_gen_sites : 0.0, region);
    report("cold", cold, reps);
    report("nochange", noch, reps);
    report("dryrun", dry, reps);
    report("revert", rev, reps);
    report("warm", warm, reps);
    return 0;
}
