/* SPDX-License-Identifier: MIT */
/*
 * Helper of test_hostile (AT_SECURE): run set-uid root by an unprivileged
 * user, with ALTPATCH_OFF / ALTPATCH_CLEARCPUID / ALTPATCH_DEBUG in its
 * environment, which the library must ignore. Prints one line:
 *
 *   secure=S patched=P cleared=C
 *
 * S: getauxval(AT_SECURE); P: its own ALWAYS site holds the replacement after
 * altpatch_apply() (1) or not (0); C: number of features named in
 * ALTPATCH_CLEARCPUID that altpatch_cpu_has() reports absent although the
 * host has them. Debug blocks, if any, go to stderr (the default printer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

__attribute__((noinline)) static long site(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", X86_FEATURE_ALWAYS)
                         : "=a"(v));
    return v;
}

/** Features of @p list (comma-separated) the host has but altpatch_cpu_has() denies. */
static int cleared(const char *list)
{
    struct altpatch_features *host = altpatch_features_host();
    char buf[256];
    int n = 0;
    snprintf(buf, sizeof(buf), "%s", list ? list : "");
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int id = altpatch_feature_id(tok);
        if (id >= 0 && host && altpatch_features_has(host, (unsigned)id) &&
            !altpatch_cpu_has((unsigned)id))
            n++;
    }
    altpatch_features_free(host);
    return n;
}

int main(void)
{
    int rc = altpatch_apply();
    printf("secure=%lu patched=%d cleared=%d rc=%d\n", getauxval(AT_SECURE), site() == 2,
           cleared(getenv("ALTPATCH_CLEARCPUID")), rc);
    return 0;
}
