/* SPDX-License-Identifier: MIT */
/*
 * spans_run: text the writer changes in a later decision's batch (spans
 * through /proc/self/mem where the machine runs what they write, else the
 * window) is what runs next. A function in a private executable mapping of
 * a file of its own returns 1; it is run, the writer makes it return 2 with
 * AP_POKE_SPANS, it is run again, and back, five times. A plain program (no
 * test framework that re-executes itself), so that it runs under valgrind's
 * default --smc-check and under qemu-user too, with and without a guest
 * base: there the writer must not take spans, and must not crash asking.
 * Prints "spans_run: ok" or the first failure; reports how the writes went.
 */
#include "host.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

/*
 * No seccomp filter: PR_GET_SECCOMP says 0, or -- where it is not answered,
 * as under qemu-user, which refuses it -- /proc/self/status says "Seccomp: 0"
 * (the emulator's process, which is the one a filter would stop).
 */
static bool seccomp_off(void)
{
    if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) == 0)
        return true;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    bool off = false;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "Seccomp:", 8))
            off = strtol(line + 8, NULL, 10) == 0;
    if (f)
        fclose(f);
    return off;
}

int main(void)
{
    /* endbr64; mov $V, %eax; ret */
    static const uint8_t one[] = {0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 1, 0, 0, 0, 0xc3};
    uint8_t two[sizeof(one)];
    memcpy(two, one, sizeof(one));
    two[5] = 2;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char path[] = "/tmp/spans-run-XXXXXX";
    int fd = mkstemp(path);
    uint8_t *page = calloc(1, pg);
    if (fd < 0 || !page) {
        printf("spans_run: FAILED: temporary file\n");
        return 1;
    }
    unlink(path);
    memcpy(page, one, sizeof(one));
    ssize_t wrote = write(fd, page, pg);
    free(page);
    if (wrote != (ssize_t)pg) {
        printf("spans_run: FAILED: write\n");
        return 1;
    }
    uint8_t *p = mmap(NULL, pg, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        printf("spans_run: FAILED: mmap\n");
        return 1;
    }
    long (*fn)(void) = (long (*)(void))(uintptr_t)p;
    /* the flag's promise: no seccomp filter (checked, not assumed) */
    unsigned flags = AP_POKE_SPANS | (seccomp_off() ? AP_POKE_SECCOMP_OFF : 0);
    unsigned spans = 0, windows = 0;
    if (fn() != 1) {
        printf("spans_run: FAILED: the function before any write\n");
        return 1;
    }
    for (int i = 0; i < 10; i++) {
        const uint8_t *from = i % 2 ? two : one, *to = i % 2 ? one : two;
        struct ap_write w = {.addr = (uintptr_t)p, .old = from, .new = to, .len = sizeof(one)};
        struct ap_poke_stats st = {0};
        int rc = ap_poke(&w, 1, flags, &st);
        long want = to[5], got = fn();
        if (rc || !w.wrote || memcmp(p, to, sizeof(one)) || got != want) {
            printf("spans_run: FAILED: write %d: rc %d, wrote %d, ran %ld, want %ld\n", i, rc,
                   w.wrote, got, want);
            return 1;
        }
        spans += st.procmem_writes;
        windows += st.mprotect_writes;
    }
    printf("spans_run: %u pwrites, %u windows\nspans_run: ok\n", spans, windows);
    return 0;
}
