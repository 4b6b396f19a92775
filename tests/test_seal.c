/* SPDX-License-Identifier: MIT */
/*
 * The writer when mprotect() fails part way through a window: Linux changes
 * the mappings of a range one after the other and stops at the first it may
 * not change, so a window over two mappings whose second is sealed (mseal(2))
 * leaves the first RW and not executable unless the writer restores it. The
 * window's original protection must be back on every page afterwards, and
 * the writes either go through /proc/self/mem or are refused with nothing
 * changed.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ap_procmem.h"
#include "host.h"

#ifndef SYS_mseal
#define SYS_mseal 462 /* x86-64 */
#endif

/** Protection of the mapping holding @p addr, as "r-x" etc., from /proc/self/maps. */
static void prot_of(const void *addr, char out[4])
{
    strcpy(out, "???");
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert(f, "open /proc/self/maps");
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        unsigned long s, e;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &s, &e, perms) == 3 && (uintptr_t)addr >= s &&
            (uintptr_t)addr < e) {
            memcpy(out, perms, 3);
            out[3] = '\0';
            break;
        }
    }
    fclose(f);
}

/** Two RX pages filled with NOPs, the second sealed. Skips when mseal is missing. */
static uint8_t *sealed_pair(long pg)
{
    uint8_t *p = mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED, "mmap");
    memset(p, 0x90, 2 * (size_t)pg);
    cr_assert_eq(mprotect(p, 2 * (size_t)pg, PROT_READ | PROT_EXEC), 0, "mprotect RX");
    if (syscall(SYS_mseal, p + pg, (size_t)pg, 0) != 0) {
        int e = errno;
        munmap(p, 2 * (size_t)pg);
        if (e == ENOSYS || e == EINVAL || e == EPERM)
            cr_skip_test("mseal not available: %s", strerror(e));
        cr_assert_fail("mseal: %s", strerror(e));
    }
    return p;
}

static const uint8_t OLD1[1] = {0x90}, NEW1[1] = {0xcc};

static void poke_pair(uint8_t *p, long pg, unsigned flags, struct ap_write w[2])
{
    w[0] = (struct ap_write){.addr = (uintptr_t)p + 16, .old = OLD1, .new = NEW1, .len = 1};
    w[1] = (struct ap_write){.addr = (uintptr_t)p + pg + 16, .old = OLD1, .new = NEW1, .len = 1};
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 2, flags, &st), 0);
}

/* Both writes of poke_pair() refused, the two pages' bytes unchanged. */
static void assert_both_refused(const uint8_t *p, long pg, const struct ap_write *w)
{
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(w[i].result, ALTPATCH_REASON_WRITE_DENIED, "write %d: result %d", i,
                     w[i].result);
        cr_assert(!w[i].wrote, "write %d", i);
    }
    cr_assert_eq(p[16], 0x90, "nothing changed");
    cr_assert_eq(p[pg + 16], 0x90, "nothing changed");
}

Test(seal, partial_mprotect_restored_then_procmem)
{
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *p = sealed_pair(pg);
    struct ap_write w[2];
    poke_pair(p, pg, 0, w);
    char a[4], b[4];
    prot_of(p, a);
    prot_of(p + pg, b);
    cr_assert_str_eq(a, "r-x", "first page after the failed window: %s", a);
    cr_assert_str_eq(b, "r-x", "sealed page: %s", b);
    if (!ap_procmem_can_write_text()) {
        /* the kernel refuses /proc/self/mem writes to text: refused, nothing changed */
        assert_both_refused(p, pg, w);
        return;
    }
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(w[i].result, ALTPATCH_REASON_NONE, "write %d: result %d", i, w[i].result);
        cr_assert(w[i].wrote, "write %d through /proc/self/mem", i);
    }
    cr_assert_eq(p[16], 0xcc);
    cr_assert_eq(p[pg + 16], 0xcc);
}

Test(seal, partial_mprotect_restored_no_procmem)
{
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *p = sealed_pair(pg);
    struct ap_write w[2];
    poke_pair(p, pg, AP_POKE_NO_PROCMEM, w);
    char a[4];
    prot_of(p, a);
    cr_assert_str_eq(a, "r-x", "first page after the failed window: %s", a);
    assert_both_refused(p, pg, w);
}
