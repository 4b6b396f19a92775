/* SPDX-License-Identifier: MIT */
/*
 * XRay's peer of the start-up program (startup_main.c), for altbench
 * startup: built with clang -fxray-instrument, 8 instrumented functions (16
 * sleds: entry and exit), main() patches them with __xray_patch() as the
 * first thing it does, calls each and exits. Run with ALTPATCH_OFF=1 it
 * skips the patch -- the same switch as the altpatch program, so that
 * altbench startup times both alike; with ALTBENCH_STARTUP_NS set it prints
 * "apply_ns=N", the wall time of that first __xray_patch().
 *
 * XRay reads its sled table before main() in both variants; nothing is
 * patched before main() unless XRAY_OPTIONS asks for patch_premain, which
 * this program refuses (both variants would patch).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern int __xray_patch(void); /* XRayPatchingStatus: SUCCESS = 1 */

#define AB_XS_FN(k)                                                                                \
    __attribute__((noinline, xray_always_instrument)) int ab_xs_f##k(int x)                       \
    {                                                                                              \
        return x * 3 + k;                                                                          \
    }
AB_XS_FN(0)
AB_XS_FN(1)
AB_XS_FN(2)
AB_XS_FN(3)
AB_XS_FN(4)
AB_XS_FN(5)
AB_XS_FN(6)
AB_XS_FN(7)

int main(void)
{
    const char *xo = getenv("XRAY_OPTIONS");
    if (xo && strstr(xo, "patch_premain=true")) {
        fputs("altbench_xray_startup_8: XRAY_OPTIONS asks for patch_premain: refused\n", stderr);
        return 2;
    }
    int rc = 1;
    const char *off = getenv("ALTPATCH_OFF"); /* on as the library reads it: set, not "" or "0" */
    bool patch = !(off && *off && strcmp(off, "0") != 0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (patch)
        rc = __xray_patch();
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (getenv("ALTBENCH_STARTUP_NS"))
        printf("apply_ns=%lld\n", (long long)(b.tv_sec - a.tv_sec) * 1000000000LL +
                                      (b.tv_nsec - a.tv_nsec));
    int sum = ab_xs_f0(1) + ab_xs_f1(1) + ab_xs_f2(1) + ab_xs_f3(1) + ab_xs_f4(1) + ab_xs_f5(1) +
              ab_xs_f6(1) + ab_xs_f7(1);
    return rc == 1 && sum == 8 * 3 + 28 ? 0 : 1;
}
