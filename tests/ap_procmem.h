/* SPDX-License-Identifier: MIT */
/*
 * Whether this kernel lets a process write its own read-only text through
 * /proc/self/mem, as a debugger writes. Linux 6.12 and later may forbid it
 * (CONFIG_PROC_MEM_FORCE_PTRACE, CONFIG_PROC_MEM_NO_FORCE, or the boot option
 * proc_mem.force_override=never|ptrace): such a write then fails (EIO,
 * EACCES or EPERM) while writes to writable mappings still pass.
 *
 * The oracle is the operation itself, on a page of its own: a fresh private
 * PROT_READ|PROT_EXEC mapping of the program's own file -- file-backed text,
 * as the library writes it, which a policy that refuses anonymous executable
 * memory still maps; no mprotect, so it holds under PR_SET_MDWE too -- gets
 * one byte written through /proc/self/mem, which must land where it was
 * aimed and nowhere else (the file is untouched: the write copies the page).
 * The answer is the kernel's, so it is asked once per process (a fork()ed
 * child inherits it).
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
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

/** Why a test that writes text through /proc/self/mem itself is skipped. */
#define AP_PROCMEM_DENIED                                                                      \
    "this kernel refuses writes through /proc/self/mem to read-only mappings "                 \
    "(CONFIG_PROC_MEM_NO_FORCE, CONFIG_PROC_MEM_FORCE_PTRACE or proc_mem.force_override)"

/** The program's first page, mapped private and PROT_READ|PROT_EXEC (file-backed text), or NULL. */
static inline uint8_t *ap_procmem_exe_page(void)
{
    int exe = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (exe < 0)
        return NULL;
    uint8_t *p = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_EXEC, MAP_PRIVATE,
                      exe, 0);
    close(exe);
    return p == MAP_FAILED ? NULL : p;
}

/** 1 when a write through /proc/self/mem lands in a read-only executable mapping, else 0. */
static inline int ap_procmem_can_write_text(void)
{
    static int known = -1;
    if (known >= 0)
        return known;
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *p = ap_procmem_exe_page();
    if (!p)
        return 0; /* not known: asked again next time */
    int ok = 0;
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        uint8_t before[3] = {p[0], p[1], p[2]};
        uint8_t b = (uint8_t)(before[1] ^ 0xff), back = before[1];
        ok = pwrite(fd, &b, 1, (off_t)(uintptr_t)(p + 1)) == 1 &&
             pread(fd, &back, 1, (off_t)(uintptr_t)(p + 1)) == 1 && back == b &&
             p[0] == before[0] && p[1] == b && p[2] == before[2];
        close(fd);
    }
    munmap(p, (size_t)pg);
    return known = ok;
}

/** Why a test that wants the writer's spans (text written through /proc/self/mem run) is skipped. */
#define AP_PROCMEM_NOT_RUN                                                                     \
    "text written through /proc/self/mem is not what runs here (the kernel refuses the "      \
    "write, or an emulator keeps its translation of the old bytes)"

/**
 * 1 when code written through /proc/self/mem into a read-only executable
 * mapping that has run before is what runs next, else 0: not so under an
 * emulator that keeps its translation of file-backed code (valgrind without
 * --smc-check=all, qemu-user). The operation itself, once per process: the
 * program's first page mapped private and executable gets a function
 * returning 11, is called, gets one returning 22, is called again.
 */
static inline int ap_procmem_written_text_runs(void)
{
    static int known = -1;
    if (known >= 0)
        return known;
    if (!ap_procmem_can_write_text())
        return known = 0;
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *p = ap_procmem_exe_page();
    if (!p)
        return 0;
    /* endbr64; mov $11, %eax; ret */
    uint8_t f[] = {0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 11, 0, 0, 0, 0xc3};
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC), ok = 0;
    uint8_t seen[64];
    /* the descriptor must read at p what p holds (an emulator's guest
     * addresses may not be the host's): else nothing is written */
    if (fd >= 0 && pread(fd, seen, sizeof(seen), (off_t)(uintptr_t)p) == (ssize_t)sizeof(seen) &&
        !memcmp(seen, p, sizeof(seen))) {
        int (*fn)(void) = (int (*)(void))(uintptr_t)p;
        unsigned a, b, c, d;
        if (pwrite(fd, f, sizeof(f), (off_t)(uintptr_t)p) == (ssize_t)sizeof(f) &&
            !memcmp(p, f, sizeof(f))) {
            __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "0"(0u) : "memory");
            if (fn() == 11) {
                f[5] = 22;
                if (pwrite(fd, f, sizeof(f), (off_t)(uintptr_t)p) == (ssize_t)sizeof(f) &&
                    !memcmp(p, f, sizeof(f))) {
                    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "0"(0u)
                                     : "memory");
                    ok = fn() == 22;
                }
            }
        }
    }
    if (fd >= 0)
        close(fd);
    munmap(p, (size_t)pg);
    return known = ok;
}

#endif /* AP_TEST_PROCMEM_H */
