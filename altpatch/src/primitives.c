/* SPDX-License-Identifier: MIT */
/*
 * Out-of-line part of <altpatch/primitives.h>: installing the per-thread GS
 * block that altpatch_gs_self() reads.
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
ALTPATCH_API int altpatch_gs_install(void *block)
{
    if (!block)
        return -EINVAL;
    *(void **)block = block;
    if (syscall(SYS_arch_prctl, ARCH_SET_GS, (unsigned long)block) != 0)
        return -errno;
    return 0;
}

ALTPATCH_API void altpatch_call_unwinds(void)
{
}
