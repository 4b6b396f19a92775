/* SPDX-License-Identifier: MIT */
/*
 * writer.c - what the two writers share: poke.c (RW windows, /proc/self/mem;
 * a single thread runs) and live.c (int3 + membarrier while other threads
 * run). The same check decides which writes are pending (ap_write_pending(),
 * inline in host.h: word compares of a site's few bytes), the same rule
 * counts pages, the same raw system call masks signals, and the same calls
 * write through /proc/self/mem, and the same function (ten bytes of x86)
 * asks whether what they write is what runs. Which of the two writers may
 * run is decided here too (ap_mm_alone(), ap_count_threads()).
 */
#include "host.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/*
 * unshare(CLONE_VM) changes nothing: the kernel has no way to give a task a
 * copy of its address space. It succeeds only when there is nothing to unshare
 * -- no other thread in this thread group and no other task using this mm
 * (kernel/fork.c, check_unshare_flags(): thread_group_empty(),
 * current_is_single_threaded()) -- and fails with EINVAL otherwise. That is
 * the kernel's own answer, so it also counts threads the C library did not
 * create (qemu-user's, a raw clone()) and processes sharing the address space
 * without being threads (clone(CLONE_VM) without CLONE_THREAD), which
 * /proc/self/task does not list. One system call, no /proc.
 *
 * A seccomp filter may answer an unexpected system call with a signal that
 * ends the process (SECCOMP_RET_KILL, RET_TRAP): under any filter the call is
 * not made and the caller counts /proc/self/task instead.
 */

/*
 * A seccomp mode once set is never cleared: the kernel moves a task only from
 * SECCOMP_MODE_DISABLED to strict or filter (kernel/seccomp.c,
 * seccomp_may_assign_mode()), fork() copies it (copy_seccomp()) and execve()
 * keeps it. A positive answer is kept for the process: the next ask is
 * skipped. (Modes are per thread: an answer kept from a filtered thread may
 * be too careful for another, never too bold.) Zero is asked every time.
 */
AP_STATE static long ap_seccomp_kept;


long ap_seccomp_mode(uint64_t *syscalls)
{
    long kept = __atomic_load_n(&ap_seccomp_kept, __ATOMIC_RELAXED);
    if (kept > 0)
        return kept;
    long sc = ap_sys(SYS_prctl, PR_GET_SECCOMP, 0, 0, 0, 0);
    if (syscalls)
        (*syscalls)++;
    if (sc > 0)
        __atomic_store_n(&ap_seccomp_kept, sc, __ATOMIC_RELAXED);
    return sc;
}

AP_PLAIN_PATH int ap_mm_state(void)
{
    long sc = ap_seccomp_mode(NULL);
    if (sc != 0)
        return AP_MM_UNKNOWN; /* filtered (2), or unknown (-errno: no answer means no proof) */
    long r = ap_sys(SYS_unshare, CLONE_VM, 0, 0, 0, 0);
    return r == 0 ? AP_MM_ALONE : r == -EINVAL ? AP_MM_SHARED : AP_MM_UNKNOWN;
}

AP_PLAIN_PATH bool ap_mm_alone(void)
{
    return ap_mm_state() == AP_MM_ALONE;
}

long ap_count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    long n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
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

AP_PLAIN_PATH void ap_signals_block(uint64_t set, uint64_t *saved)
{
    ap_sys(SYS_rt_sigprocmask, SIG_SETMASK, (long)&set, (long)saved, sizeof(set), 0);
}

AP_PLAIN_PATH void ap_signals_restore(const uint64_t *saved)
{
    ap_sys(SYS_rt_sigprocmask, SIG_SETMASK, (long)saved, 0, sizeof(*saved), 0);
}

void ap_selftest_fn(uint8_t out[AP_SELFTEST_FN_LEN], uint8_t v)
{
    static const uint8_t fn[AP_SELFTEST_FN_LEN] = {0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 0, 0, 0, 0, 0xc3};
    for (size_t i = 0; i < AP_SELFTEST_FN_LEN; i++)
        out[i] = fn[i];
    out[5] = v;
}

int ap_procmem_open(void)
{
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

long ap_procmem_pwrite(int fd, uintptr_t addr, const uint8_t *src, size_t len)
{
    long r; /* the system call itself: the live round must not enter a wrapper */
    do {
        r = ap_sys(SYS_pwrite64, fd, (long)src, (long)len, (long)addr, 0);
    } while (r == -EINTR);
    return r;
}

int ap_procmem_write(int fd, uintptr_t addr, const uint8_t *src, size_t len)
{
    long r = ap_procmem_pwrite(fd, addr, src, len);
    if (r < 0)
        return (int)r;
    return r == (long)len ? 0 : -EIO;
}
