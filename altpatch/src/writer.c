/* SPDX-License-Identifier: MIT */
/*
 * writer.c - what the two writers share: poke.c (RW windows, /proc/self/mem;
 * a single thread runs) and live.c (int3 + membarrier while other threads
 * run). The same check decides which writes are pending, the same rule
 * counts pages, the same raw system call masks signals, and the same calls
 * write through /proc/self/mem.
 */
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

bool ap_write_pending(struct ap_write *w)
{
    w->wrote = false;
    w->result = ALTPATCH_REASON_NONE;
    if (w->len == 0 || memcmp((const void *)w->addr, w->new, w->len) == 0)
        return false;
    if (memcmp((const void *)w->addr, w->old, w->len) != 0) {
        w->result = ALTPATCH_REASON_MEM_MISMATCH;
        return false;
    }
    return true;
}

uint64_t ap_pages_written(const struct ap_write *w, size_t n, uintptr_t pgsz)
{
    uint64_t pages = 0;
    uintptr_t done = 0; /* end of the last page counted */
    for (size_t i = 0; i < n; i++) {
        if (!w[i].wrote)
            continue;
        uintptr_t s = w[i].addr & ~(pgsz - 1);
        uintptr_t e = (w[i].addr + w[i].len + pgsz - 1) & ~(pgsz - 1);
        if (s < done)
            s = done;
        if (e > s)
            pages += (e - s) / pgsz;
        if (e > done)
            done = e;
    }
    return pages;
}

void ap_signals_block(uint64_t *saved)
{
    uint64_t all = ~0ull;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, saved, sizeof(all));
}

void ap_signals_restore(const uint64_t *saved)
{
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, saved, NULL, sizeof(*saved));
}

int ap_procmem_open(void)
{
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int ap_procmem_write(int fd, uintptr_t addr, const uint8_t *src, size_t len)
{
    ssize_t r;
    do {
        r = pwrite(fd, src, len, (off_t)addr);
    } while (r < 0 && errno == EINTR);
    if (r < 0)
        return -errno;
    return r == (ssize_t)len ? 0 : -EIO;
}
