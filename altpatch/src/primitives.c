/* SPDX-License-Identifier: MIT */
/*
 * Out-of-line part of <altpatch/primitives.h>: installing the per-thread GS
 * block that altpatch_gs_self() reads, checking that this thread installed
 * the block its GS base points to.
 */
#include <asm/prctl.h>
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <altpatch/primitives.h>

/*
 * glibc keeps its TCB at the FS base and leaves GS alone on x86-64, so the GS
 * base is ours. arch_prctl(ARCH_SET_GS) works on every kernel (wrgsbase would
 * need FSGSBASE enabled by the kernel, and valgrind does not emulate it).
 */
/*
 * The block this thread installed, NULL until it calls altpatch_gs_install().
 * A new thread starts with NULL here although the kernel copies its creator's
 * GS base into it: that difference is what altpatch_gs_check() reports.
 */
static __thread void *ap_gs_installed;

ALTPATCH_API int altpatch_gs_install(void *block)
{
    if (!block)
        return -EINVAL;
    *(void **)block = block;
    if (syscall(SYS_arch_prctl, ARCH_SET_GS, (unsigned long)block) != 0)
        return -errno;
    ap_gs_installed = block;
    return 0;
}

ALTPATCH_API int altpatch_gs_check(void)
{
    if (!ap_gs_installed)
        return -ENOENT;
    unsigned long base = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_GS, &base) != 0)
        return -errno;
    return (void *)base == ap_gs_installed ? 0 : -ESTALE;
}
