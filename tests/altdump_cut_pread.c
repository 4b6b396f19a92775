/* SPDX-License-Identifier: MIT */
/*
 * Preloaded into altdump by test_altdump: the first pread() of a file whose
 * name ends in ".cut" first truncates that file to half its size -- a file
 * cut while altdump reads it, at a moment a test can choose.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    static int done;
    ssize_t (*real)(int, void *, size_t, off_t) =
        (ssize_t(*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
    if (!done) {
        char link[64], path[4096];
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, path, sizeof(path) - 1);
        struct stat st;
        if (k > 4 && (path[k] = '\0', strcmp(path + k - 4, ".cut") == 0) && fstat(fd, &st) == 0) {
            done = 1;
            if (truncate(path, st.st_size / 2) != 0)
                return -1;
        }
    }
    return real(fd, buf, n, off);
}
