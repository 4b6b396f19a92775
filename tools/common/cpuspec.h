/* SPDX-License-Identifier: MIT */
/*
 * cpuspec.h - the --cpu argument of the tools (altdump, altprepatch):
 * "PROFILE[,EDITS]", or "+name,-name..." for the host with edits.
 */
#ifndef TOOLS_CPUSPEC_H
#define TOOLS_CPUSPEC_H

#include <stddef.h>

/**
 * Split @p spec into its profile name (copied into @p name, "host" for an
 * empty spec or one that starts with '+' or '-') and its edit list (*edits:
 * NULL when there is none, else a pointer into @p spec). Returns 0, or -1
 * when the name does not fit @p namesz bytes (@p name then holds as much of
 * it as fits: no profile has such a name).
 */
int cpuspec_split(const char *spec, char *name, size_t namesz, const char **edits);

/**
 * Write "unknown CPU profile 'NAME' (known: a, b, ...)" into @p err, listing
 * the library's profiles.
 */
void cpuspec_unknown(const char *name, char *err, size_t errsz);

#endif /* TOOLS_CPUSPEC_H */
