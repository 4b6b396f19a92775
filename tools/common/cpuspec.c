/* SPDX-License-Identifier: MIT */
/* cpuspec.c - the --cpu argument of the tools (see cpuspec.h). */
#include "cpuspec.h"

#include <stdio.h>
#include <string.h>

#include <altpatch/altpatch.h>

int cpuspec_split(const char *spec, char *name, size_t namesz, const char **edits)
{
    *edits = NULL;
    if (!spec || !*spec || spec[0] == '+' || spec[0] == '-') {
        if (spec && *spec)
            *edits = spec;
        return snprintf(name, namesz, "host") < (int)namesz ? 0 : -1;
    }
    const char *comma = strchr(spec, ',');
    size_t n = comma ? (size_t)(comma - spec) : strlen(spec);
    *edits = comma ? comma + 1 : NULL;
    snprintf(name, namesz, "%.*s", (int)n, spec);
    return n < namesz ? 0 : -1;
}

void cpuspec_unknown(const char *name, char *err, size_t errsz)
{
    char list[256] = "";
    const char *const *p = altpatch_features_profiles();
    for (size_t i = 0; p && p[i]; i++) {
        strncat(list, i ? ", " : "", sizeof(list) - strlen(list) - 1);
        strncat(list, p[i], sizeof(list) - strlen(list) - 1);
    }
    snprintf(err, errsz, "unknown CPU profile '%s' (known: %s)", name, list);
}
