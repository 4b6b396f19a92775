/* SPDX-License-Identifier: MIT */
/*
 * Preloaded into altdump by test_altdump, in pread() and pread64():
 *  - the first read of a file whose name ends in ".cut" first truncates that
 *    file to half its size -- a file cut while altdump reads it, at a moment
 *    a test can choose;
 *  - a file whose name ends in ".shift" is rewritten between two reads of its
 *    section header table: every read of that table but the first returns the
 *    section-name table's header with an offset and size far past the end,
 *    and the first such forged read creates "<file>.forged" beside it (the
 *    test's proof that the second read happened);
 *  - every read of a file whose name ends in ".logged" is logged to
 *    "<file>.reads", one line "OFFSET LENGTH" (the bytes it returned) each:
 *    what a test expects altdump never to read can be checked.
 */
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);

/* True when descriptor @p fd names a file ending in @p suffix; its path in @p path. */
static int named(int fd, const char *suffix, char *path, size_t size)
{
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, path, size - 1);
    size_t n = strlen(suffix);
    return k > (ssize_t)n && (path[k] = '\0', strcmp(path + k - n, suffix) == 0);
}

static ssize_t hooked(int fd, void *buf, size_t n, off_t off)
{
    static int cut, shdr_reads, marked;
    pread_fn real = (pread_fn)dlsym(RTLD_NEXT, "pread");
    char path[4096];
    if (!cut && named(fd, ".cut", path, sizeof(path))) {
        struct stat st;
        cut = 1;
        if (fstat(fd, &st) != 0 || truncate(path, st.st_size / 2) != 0)
            return -1;
    }
    ssize_t k = real(fd, buf, n, off);
    if (k > 0 && named(fd, ".logged", path, sizeof(path))) {
        char log[4200];
        snprintf(log, sizeof(log), "%s.reads", path);
        int l = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (l < 0)
            return -1; /* no read unlogged */
        dprintf(l, "%lld %zd\n", (long long)off, k);
        close(l);
    }
    Elf64_Ehdr eh;
    if (k > 0 && named(fd, ".shift", path, sizeof(path)) &&
        real(fd, &eh, sizeof(eh), 0) == (ssize_t)sizeof(eh) && eh.e_shstrndx < eh.e_shnum) {
        /* the name table's sh_offset and sh_size, where this read put them */
        uint64_t at = eh.e_shoff + (uint64_t)eh.e_shstrndx * sizeof(Elf64_Shdr) +
                      offsetof(Elf64_Shdr, sh_offset);
        if (at >= (uint64_t)off && at + 16 <= (uint64_t)off + (uint64_t)k && shdr_reads++) {
            uint64_t far = 0x4000000000ull;
            memcpy((char *)buf + (at - (uint64_t)off), &far, 8);
            memcpy((char *)buf + (at - (uint64_t)off) + 8, &far, 8);
            if (!marked) {
                char mark[4200];
                marked = 1;
                snprintf(mark, sizeof(mark), "%s.forged", path);
                int m = open(mark, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                if (m >= 0)
                    close(m);
            }
        }
    }
    return k;
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    return hooked(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
    return hooked(fd, buf, n, off);
}
