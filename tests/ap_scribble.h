/* SPDX-License-Identifier: MIT */
/*
 * Put foreign bytes into a site of the test's own text, as a program or a
 * debugger might, so that the next apply finds memory holding neither the
 * site's original nor its plan. Through /proc/self/mem (no page made
 * writable: one writable and executable may be refused, one writable alone
 * may hold the code running); where the kernel refuses that, in a writable
 * and executable moment. For a fork()ed child (ap_isolate.h): a failure
 * ends it with status 7.
 */
#ifndef AP_TEST_SCRIBBLE_H
#define AP_TEST_SCRIBBLE_H

#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

static inline void ap_scribble(uintptr_t a, const unsigned char *bytes, size_t n)
{
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    bool done = fd >= 0 && pwrite(fd, bytes, n, (off_t)a) == (ssize_t)n;
    if (fd >= 0)
        close(fd);
    if (done)
        return;
    long pg = sysconf(_SC_PAGESIZE);
    /* through an address the compiler knows nothing of: a label names
     * constant bytes, a store to them it may drop */
    __asm__("" : "+r"(a));
    volatile unsigned char *at = (volatile unsigned char *)a;
    uintptr_t lo = a & ~(uintptr_t)(pg - 1);
    size_t span = a + n - lo;
    if (mprotect((void *)lo, span, PROT_READ | PROT_WRITE | PROT_EXEC))
        _exit(7);
    for (size_t i = 0; i < n; i++)
        at[i] = bytes[i];
    if (mprotect((void *)lo, span, PROT_READ | PROT_EXEC))
        _exit(7);
}

#endif
