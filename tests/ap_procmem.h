/* SPDX-License-Identifier: MIT */
/*
 * Whether this kernel lets a process write its own read-only text through
 * /proc/self/mem, as a debugger writes. Linux 6.12 and later may forbid it
 * (CONFIG_PROC_MEM_FORCE_PTRACE, CONFIG_PROC_MEM_NO_FORCE, or the boot option
 * proc_mem.force_override=never|ptrace): such a write then fails (EIO,
 * EACCES or EPERM) while writes to writable mappings still pass.
 *
 * The oracle is the operation itself, on a page of its own: a fresh private
 * PROT_READ|PROT_EXEC mapping (zero-filled: no mprotect, so it holds under
 * PR_SET_MDWE too) gets one byte written through /proc/self/mem, which must
 * land where it was aimed and nowhere else. The answer is the kernel's, so
 * it is asked once per process (a fork()ed child inherits it).
 *
 * A test that writes text through /proc/self/mem itself skips where the
 * answer is no (AP_PROCMEM_DENIED says why); a test that expects the library
 * to write through it expects there the library's refusal instead
 * (ALTPATCH_REASON_WRITE_DENIED, the text original).
 */
#ifndef AP_TEST_PROCMEM_H
#define AP_TEST_PROCMEM_H

#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

/** Why a test that writes text through /proc/self/mem itself is skipped. */
#define AP_PROCMEM_DENIED                                                                      \
    "this kernel refuses writes through /proc/self/mem to read-only mappings "                 \
    "(proc_mem.force_override)"

/** 1 when a write through /proc/self/mem lands in a read-only executable mapping, else 0. */
static inline int ap_procmem_can_write_text(void)
{
    static int known = -1;
    if (known >= 0)
        return known;
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *p = mmap(NULL, (size_t)pg, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0; /* not known: asked again next time */
    int ok = 0;
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        uint8_t b = 0xcc, back = 0;
        ok = pwrite(fd, &b, 1, (off_t)(uintptr_t)(p + 1)) == 1 &&
             pread(fd, &back, 1, (off_t)(uintptr_t)(p + 1)) == 1 && back == 0xcc &&
             p[0] == 0 && p[1] == 0xcc && p[2] == 0;
        close(fd);
    }
    munmap(p, (size_t)pg);
    return known = ok;
}

#endif /* AP_TEST_PROCMEM_H */
