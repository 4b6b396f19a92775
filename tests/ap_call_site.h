/* SPDX-License-Identifier: MIT */
/*
 * A call site's bytes (call rel32) and another writer's call put at a site
 * through /proc/self/mem, as a debugger writes: the relocated-call tests'
 * common steps (test_parts, test_parts_settled).
 */
#ifndef AP_TEST_CALL_SITE_H
#define AP_TEST_CALL_SITE_H

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "ap_procmem.h"

/** The 5 bytes of `call fn` at address @p at. */
static inline void ap_call_bytes(uint8_t out[5], uintptr_t at, void *fn)
{
    int32_t rel = (int32_t)((intptr_t)fn - (intptr_t)(at + 5));
    out[0] = 0xe8;
    memcpy(out + 1, &rel, 4);
}

/** Another writer's `call fn` at @p at, through /proc/self/mem (in an
 * isolated child: it exits with status 5 where that write fails; the test
 * skips before, where ap_procmem_can_write_text() says the kernel refuses). */
static inline void ap_put_call(uintptr_t at, void *fn)
{
    uint8_t b[5];
    ap_call_bytes(b, at, fn);
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    if (fd < 0 || pwrite(fd, b, 5, (off_t)at) != 5)
        _exit(5);
    close(fd);
}

#endif
