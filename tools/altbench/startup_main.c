/* SPDX-License-Identifier: MIT */
/*
 * The start-up program of the start-up benchmark (altbench startup): linked
 * with a generated 8-site module (gen_alt_8.s), it applies once as the first
 * thing main() does and exits. Run with ALTPATCH_OFF=1 it is the same program
 * without the patching, which is the reference its start-up is compared to.
 * With ALTBENCH_STARTUP_NS set it also prints "apply_ns=N": the wall time of
 * that first altpatch_apply() seen from inside (altbench startup --inside).
 */
#include <altpatch/altpatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(void)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = altpatch_apply();
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (getenv("ALTBENCH_STARTUP_NS"))
        printf("apply_ns=%lld\n", (long long)(b.tv_sec - a.tv_sec) * 1000000000LL +
                                      (long long)(b.tv_nsec - a.tv_nsec));
    return rc < 0 ? 1 : 0;
}
