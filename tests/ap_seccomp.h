/* SPDX-License-Identifier: MIT */
/*
 * seccomp filters of the tests (each installed in a fork()ed child). Every
 * filter starts with AP_SECCOMP_PROLOGUE: a system call from another
 * architecture kills the process, then the accumulator holds the system
 * call's number. Where the system offers no seccomp filters a test skips
 * (ap_seccomp_require()); any other failure to install one fails it.
 */
#ifndef AP_TEST_SECCOMP_H
#define AP_TEST_SECCOMP_H

#include <criterion/criterion.h>
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define AP_SECCOMP_PROLOGUE                                                   \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)), \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),            \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),                     \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))

/** Offset of the low 32 bits of argument 2 (mprotect's and mmap's protection). */
#define AP_SECCOMP_ARG2_LO (offsetof(struct seccomp_data, args) + 2 * sizeof(uint64_t))

/** Install the filter @p f of @p n instructions (no_new_privs first): 0 or -errno. */
static inline int ap_seccomp_install(struct sock_filter *f, unsigned short n)
{
    struct sock_fprog prog = {.len = n, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1L, 0L, 0L, 0L))
        return -errno;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) ? -errno : 0;
}

/** ap_seccomp_install() of the array @p f. */
#define AP_SECCOMP_INSTALL(f) ap_seccomp_install((f), (unsigned short)(sizeof(f) / sizeof((f)[0])))

/** A filter that allows every x86-64 system call: 0 or -errno. */
static inline int ap_seccomp_allow_all(void)
{
    struct sock_filter f[] = {
        AP_SECCOMP_PROLOGUE,
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return AP_SECCOMP_INSTALL(f);
}

/** Whether this system installs seccomp filters at all: a fork()ed child
 * installs ap_seccomp_allow_all(), a filter every kernel with them accepts.
 * Asked once (a child of fork() inherits the answer). */
static inline bool ap_seccomp_available(void)
{
    static int known = -1;
    if (known >= 0)
        return known;
    pid_t pid = fork();
    if (pid < 0)
        return true; /* not known: asked again next time, and no skip on it */
    if (pid == 0)
        _exit(ap_seccomp_allow_all() == 0 ? 0 : 1);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    known = !(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    return known;
}

/** With an ap_seccomp_install() result @p set: true where this system offers
 * no seccomp filters -- EINVAL (a kernel without CONFIG_SECCOMP_FILTER) or
 * ENOSYS -- and a trivial filter is refused too (EINVAL also answers a
 * malformed filter: that is the test's fault, not a missing facility). */
static inline bool ap_seccomp_absent(int set)
{
    return (set == -EINVAL || set == -ENOSYS) && !ap_seccomp_available();
}

/** With an ap_seccomp_install() result @p set: skip the test where seccomp
 * filters are absent; else the filter must have been installed. */
static inline void ap_seccomp_require(int set)
{
    if (ap_seccomp_absent(set))
        cr_skip_test("seccomp filters cannot be installed here: %s", strerror(-set));
    cr_assert_eq(set, 0, "seccomp filter: %s", strerror(-set));
}

/** A filter that answers @p err to every system call @p nr and allows the
 * rest: 0 or -errno. */
static inline int ap_seccomp_refuse(unsigned nr, unsigned err)
{
    struct sock_filter f[] = {
        AP_SECCOMP_PROLOGUE,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return AP_SECCOMP_INSTALL(f);
}

/** A filter that answers ENOTTY to every ioctl (as a kernel before 6.11
 * answers PROCMAP_QUERY) and allows the rest: 0 or -errno. */
static inline int ap_seccomp_refuse_ioctl(void)
{
    return ap_seccomp_refuse(SYS_ioctl, ENOTTY);
}

#endif /* AP_TEST_SECCOMP_H */
