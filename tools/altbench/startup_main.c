/* SPDX-License-Identifier: MIT */
/*
 * The start-up program of the start-up benchmark (altbench startup): linked
 * with a generated 8-site module (gen_alt_8.s), it applies once as the first
 * thing main() does and exits. Run with ALTPATCH_OFF=1 it is the same program
 * without the patching, which is the reference its start-up is compared to.
 * With ALTBENCH_STARTUP_NS set it also prints "apply_ns=N": the wall time of
 * that first altpatch_apply() seen from inside (altbench startup --inside).
 *
 * ALTBENCH_STARTUP_MALLOC=1: the process's first malloc() comes before the
 * apply (not timed), as in a program that has used the heap already.
 *
 * ALTBENCH_STARTUP_FLOOR=WHAT: no apply; "apply_ns=N" is the first time in
 * this fresh process of one thing an apply does, to measure the floor:
 *   cpuid    one CPUID (leaf 0: a hypervisor exit in a guest)
 *   syscall  one system call (prctl(PR_GET_SECCOMP))
 *   malloc   the first malloc() (the C library sets up its heap)
 *   page     the first write to a page of .bss (where the library's region of
 *            small blocks lies)
 *   mmap     mmap() of 32 KiB and the first write to it
 *   maps     open() and close() of /proc/self/maps
 *   window   signals blocked, mprotect RW, one byte stored (copy on write of
 *            a text page), mprotect RX, signals restored: an empty window
 *   procmem  the same byte written with pwrite() through /proc/self/mem
 *            (open, pwrite, close): the writer's other way
 */
#include <altpatch/altpatch.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A text page of its own for the empty window (nothing else runs from it). */
__attribute__((noinline, used, aligned(4096), section(".text.altbench_floor"))) int
ab_floor_target(int x)
{
    return x + 1;
}

static long long ab_ns(const struct timespec *a, const struct timespec *b)
{
    return (long long)(b->tv_sec - a->tv_sec) * 1000000000LL + (b->tv_nsec - a->tv_nsec);
}

/* One floor operation; 0 or -1 when it failed. */
static int ab_floor(const char *what)
{
    if (!strcmp(what, "cpuid")) {
        uint32_t a = 0, b, c, d;
        __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "=c"(c), "=d"(d) : : "memory");
        return 0;
    }
    if (!strcmp(what, "syscall"))
        return prctl(PR_GET_SECCOMP, 0L, 0L, 0L, 0L) < 0 ? -1 : 0;
    if (!strcmp(what, "malloc")) {
        void *volatile p = malloc(64);
        return p ? 0 : -1;
    }
    if (!strcmp(what, "page")) {
        static uint8_t pages[2 * 4096] __attribute__((aligned(4096)));
        ((volatile uint8_t *)pages)[4096] = 1;
        return 0;
    }
    if (!strcmp(what, "mmap")) {
        volatile uint8_t *p =
            mmap(NULL, 32768, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return -1;
        *p = 1;
        return 0;
    }
    if (!strcmp(what, "maps")) {
        int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return -1;
        close(fd);
        return 0;
    }
    if (!strcmp(what, "window")) {
        long pg = sysconf(_SC_PAGESIZE);
        uintptr_t at = (uintptr_t)ab_floor_target;
        void *page = (void *)(at & ~(uintptr_t)(pg - 1));
        uint64_t all = ~0ull, saved = 0;
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &saved, sizeof(all));
        int r = mprotect(page, (size_t)pg, PROT_READ | PROT_WRITE);
        if (r == 0) {
            volatile uint8_t *b = (volatile uint8_t *)at;
            *b = *b;
            r = mprotect(page, (size_t)pg, PROT_READ | PROT_EXEC);
        }
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &saved, NULL, sizeof(saved));
        return r == 0 && ab_floor_target(1) == 2 ? 0 : -1;
    }
    if (!strcmp(what, "procmem")) {
        int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return -1;
        uint8_t b = *(volatile uint8_t *)(uintptr_t)ab_floor_target;
        ssize_t r = pwrite(fd, &b, 1, (off_t)(uintptr_t)ab_floor_target);
        close(fd);
        return r == 1 && ab_floor_target(1) == 2 ? 0 : -1;
    }
    return -1;
}

int main(void)
{
    struct timespec a, b;
    const char *floor = getenv("ALTBENCH_STARTUP_FLOOR");
    if (getenv("ALTBENCH_STARTUP_MALLOC")) {
        void *volatile p = malloc(64);
        if (!p)
            return 1;
    }
    int rc;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (floor)
        rc = ab_floor(floor);
    else
        rc = altpatch_apply();
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (getenv("ALTBENCH_STARTUP_NS"))
        printf("apply_ns=%lld\n", ab_ns(&a, &b));
    return rc < 0 ? 1 : 0;
}
