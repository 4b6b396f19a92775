/* SPDX-License-Identifier: MIT */
/*
 * The start-up program of the start-up benchmark (altbench startup): linked
 * with a generated 8-site module (gen_alt_8.s), it applies once as the first
 * thing main() does and exits. Run with ALTPATCH_OFF=1 it is the same program
 * without the patching, which is the reference its start-up is compared to.
 */
#include <altpatch/altpatch.h>

int main(void)
{
    int rc = altpatch_apply();
    return rc < 0 ? 1 : 0;
}
