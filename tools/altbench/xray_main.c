/* SPDX-License-Identifier: MIT */
/*
 * XRay peer harness (built with clang, linked with -fxray-instrument against
 * the generated functions). Usage: PROG [REPS [CPU]]. Prints
 *
 *   xray n=N phase=P reps=R ns_min=.. ns_med=.. rc=..
 *
 * phases: first    first __xray_patch() of a fresh process (fork()ed child per
 *                  repetition; XRay's sled table was read before main)
 *         unpatch  __xray_unpatch()
 *         warm     __xray_patch() after an unpatch
 * XRAY_OPTIONS=patch_premain=false is set (re-exec) so nothing is patched
 * before the first timed call. <xray/xray_interface.h> is C++ only: the two
 * extern "C" entry points are declared here (XRayPatchingStatus is an int
 * enum, SUCCESS = 1).
 */
#include "harness.h"

extern int __xray_patch(void);
extern int __xray_unpatch(void);
extern const unsigned long ab_xray_nfuncs;

static void timed(struct ab_h_sample *s, int (*fn)(void))
{
    uint64_t t0 = ab_h_now();
    int rc = fn();
    s->ns = ab_h_now() - t0;
    s->rc = rc;
}

static void cold_one(struct ab_h_sample *s) { timed(s, __xray_patch); }

static void report(const char *phase, const struct ab_h_sample *s, unsigned reps)
{
    uint64_t min, med;
    ab_h_minmed(s, reps, &min, &med);
    printf("xray n=%lu phase=%s reps=%u ns_min=%llu ns_med=%llu rc=%lld\n", ab_xray_nfuncs,
           phase, reps, (unsigned long long)min, (unsigned long long)med,
           (long long)s[reps - 1].rc);
}

int main(int argc, char **argv)
{
    static struct ab_h_sample first[AB_H_MAX_REPS], unp[AB_H_MAX_REPS], warm[AB_H_MAX_REPS];
    const char *xo = getenv("XRAY_OPTIONS");
    if (!xo || !strstr(xo, "patch_premain=false")) {
        setenv("XRAY_OPTIONS", "patch_premain=false verbosity=0", 1);
        execv("/proc/self/exe", argv);
        perror("execv /proc/self/exe");
        return 1;
    }
    unsigned reps = ab_h_setup(argc, argv);
    if (ab_h_cold(reps, cold_one, first) != 0) {
        fprintf(stderr, "%s: a first-patch child failed\n", argv[0]);
        return 1;
    }
    struct ab_h_sample once;
    timed(&once, __xray_patch);
    for (unsigned r = 0; r < reps; r++) {
        timed(&unp[r], __xray_unpatch);
        timed(&warm[r], __xray_patch);
    }
    report("first", first, reps);
    report("unpatch", unp, reps);
    report("warm", warm, reps);
    return once.rc == 1 ? 0 : 1;
}
