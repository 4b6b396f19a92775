/* SPDX-License-Identifier: MIT */
/*
 * Copy a file to a path by a rename() over it: a library rebuilt in place,
 * the way an installer replaces it (a process that has the old one mapped
 * keeps the old inode).
 */
#ifndef AP_TEST_COPYFILE_H
#define AP_TEST_COPYFILE_H

#include <stdio.h>

static inline int ap_copy_file(const char *from, const char *to)
{
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s.tmp", to);
    FILE *in = fopen(from, "rb"), *out = fopen(tmp, "wb");
    int ok = in && out;
    char buf[8192];
    for (size_t n; ok && (n = fread(buf, 1, sizeof(buf), in)) > 0;)
        ok = fwrite(buf, 1, n, out) == n;
    if (in)
        fclose(in);
    if (out && fclose(out))
        ok = 0;
    return ok && rename(tmp, to) == 0 ? 0 : -1;
}

#endif
