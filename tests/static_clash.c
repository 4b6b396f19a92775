/* SPDX-License-Identifier: MIT */
/*
 * A program that links libaltpatch.a statically and defines names the
 * library uses internally (ap_log, ap_poke, ap_nops): it must link (the
 * internals are local to the archive's one object) and both its own
 * functions and the library must work. Run by ctest (static_clash).
 */
#include <stdio.h>
#include <string.h>

#include <altpatch/altpatch.h>

static int calls;

void ap_log(int level, const char *msg);
void ap_log(int level, const char *msg)
{
    calls += level + (int)strlen(msg);
}

int ap_poke(void);
int ap_poke(void)
{
    return 40;
}

const char *ap_nops = "mine";

int main(void)
{
    ap_log(1, "hi");
    int rc = altpatch_apply();
    if (calls != 3 || ap_poke() != 40 || strcmp(ap_nops, "mine") != 0 || rc != 0) {
        fprintf(stderr, "static_clash: calls %d ap_poke %d apply %d\n", calls, ap_poke(), rc);
        return 1;
    }
    printf("static_clash: OK (%s)\n", altpatch_version());
    return 0;
}
