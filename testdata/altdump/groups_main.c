/* SPDX-License-Identifier: MIT */
/*
 * Runtime side of the groups.S fixture, linked with the shared libaltpatch:
 * apply, then print how many sites the runtime knows and how many it
 * patched, and what grp_two() returns (2 original, 22 once its site calls
 * grp_two_helper from the second group's replacement). Exit 0 only if all
 * three sites are patched and the relocated call works.
 */
#include <stdio.h>
#include <string.h>

#include <altpatch/altpatch.h>

int grp_two(void);

struct count {
    unsigned sites, patched;
};

static int count_site(const struct altpatch_site_info *s, void *ctx)
{
    struct count *c = ctx;
    if (strcmp(s->module, "") != 0)
        return 0; /* only the main program's sites */
    c->sites++;
    c->patched += s->state == ALTPATCH_SITE_PATCHED && memcmp(s->original, s->current, s->len);
    return 0;
}

int main(void)
{
    struct count c = {0, 0};
    int rc = altpatch_apply();
    int frc = altpatch_site_foreach(count_site, &c);
    int two = grp_two();
    printf("apply %d foreach %d sites %u patched %u grp_two %d\n", rc, frc, c.sites, c.patched, two);
    return rc < 0 || frc != 0 || c.sites != 3 || c.patched != 3 || two != 22;
}
