/* SPDX-License-Identifier: MIT */
/*
 * The writer (poke.c) on private mappings this test creates: bytes land,
 * unchanged writes cost nothing, protections come back exactly, pages are
 * grouped into windows, and the /proc/self/mem fallback is used (and
 * reported) when mprotect may not be used. Protections are learnt with
 * PROCMAP_QUERY where the kernel answers it, else from the whole maps file;
 * the tests marked "both ways" also force the file (AP_POKE_MAPS_FILE), so
 * both paths are checked on any kernel.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <linux/perf_event.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include "ap_isolate.h"
#include "ap_mdwe.h"
#include "ap_procmem.h"
#include "ap_seccomp.h"
#include "host.h"

#include <altpatch/altpatch.h>

/* The library's fork handlers live with its entry points (apply.c): linked here
 * as in every program that reaches ap_poke() through the library. */
static int (*const link_fork_handlers)(struct altpatch_stats *) __attribute__((used)) =
    altpatch_get_stats;


static size_t pgsz(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/** A private mapping of @p pages pages filled with 0xcc, then made PROT_READ|PROT_EXEC. */
static uint8_t *rx_pages(size_t pages)
{
    uint8_t *p = mmap(NULL, pages * pgsz(), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED);
    memset(p, 0xcc, pages * pgsz());
    cr_assert_eq(mprotect(p, pages * pgsz(), PROT_READ | PROT_EXEC), 0);
    return p;
}

/** Permissions ("r-xp") of the mapping holding @p addr, from /proc/self/maps. */
static void perms_of(const void *addr, char out[5])
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert(f);
    char line[512];
    strcpy(out, "none");
    while (fgets(line, sizeof(line), f)) {
        unsigned long s, e;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &s, &e, perms) == 3 && (uintptr_t)addr >= s &&
            (uintptr_t)addr < e) {
            memcpy(out, perms, 5);
            break;
        }
    }
    fclose(f);
}

static void assert_rx(const void *addr)
{
    char perms[5];
    perms_of(addr, perms);
    cr_assert_str_eq(perms, "r-xp", "protection after poke: %s", perms);
}

static const uint8_t CC3[3] = {0xcc, 0xcc, 0xcc};
static const uint8_t NEW3[3] = {0x0f, 0x1f, 0x00};

static struct ap_write wr(uint8_t *addr, const uint8_t *old, const uint8_t *new, size_t len)
{
    return (struct ap_write){.addr = (uintptr_t)addr, .old = old, .new = new, .len = len};
}

/*
 * The writer's once-per-process work done before a count of system calls:
 * the first batch keeps the maps descriptor, the second maps the page that
 * tells a child of fork() (both where the kernel answers PROCMAP_QUERY).
 */
static void settle_writer(unsigned flags)
{
    uint8_t *s = rx_pages(1);
    struct ap_write a = wr(s + 10, CC3, NEW3, 3), b = wr(s + 10, NEW3, CC3, 3);
    cr_assert_eq(ap_poke(&a, 1, flags, NULL), 0);
    cr_assert_eq(ap_poke(&b, 1, flags, NULL), 0);
    cr_assert_arr_eq(s + 10, CC3, 3);
    munmap(s, pgsz());
}

Test(poke, write_lands_and_protection_restored)
{
    uint8_t *p = rx_pages(2);
    struct ap_write w = wr(p + 100, CC3, NEW3, 3);
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(&w, 1, 0, &st), 0);
    cr_assert_eq(w.result, ALTPATCH_REASON_NONE);
    cr_assert(w.wrote);
    cr_assert_arr_eq(p + 100, NEW3, 3);
    cr_assert_eq(p[99], 0xcc);
    cr_assert_eq(p[103], 0xcc);
    cr_assert_eq(st.bytes, 3);
    cr_assert_eq(st.pages, 1);
    cr_assert_eq(st.mprotect_writes, 1);
    cr_assert_eq(st.procmem_writes, 0);
    cr_assert_geq(st.syscalls, 5, "open, query or read, close maps, 2 mprotect: %lu",
                  (unsigned long)st.syscalls);
    assert_rx(p);
    assert_rx(p + pgsz());
}

Test(poke, unchanged_write_is_skipped)
{
    uint8_t *p = rx_pages(1);
    struct ap_write w = wr(p + 8, NEW3, CC3, 3); /* memory already holds "new" */
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(&w, 1, 0, &st), 0);
    cr_assert_eq(w.result, ALTPATCH_REASON_NONE);
    cr_assert_not(w.wrote);
    cr_assert_eq(st.bytes, 0);
    cr_assert_eq(st.pages, 0);
    cr_assert_eq(st.syscalls, 0, "nothing to write must cost no syscall");
    cr_assert_arr_eq(p + 8, CC3, 3);
}

Test(poke, procmem_only)
{
    uint8_t *p = rx_pages(1);
    struct ap_write w = wr(p + 4000, CC3, NEW3, 3);
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(&w, 1, AP_POKE_PROCMEM_ONLY, &st), 0);
    if (!ap_procmem_can_write_text()) {
        /* the kernel refuses the only writer allowed: refused, nothing written */
        cr_assert_eq(w.result, ALTPATCH_REASON_WRITE_DENIED);
        cr_assert_not(w.wrote);
        cr_assert_arr_eq(p + 4000, CC3, 3);
        cr_assert_eq(st.procmem_writes + st.mprotect_writes, 0);
        cr_assert_eq(st.bytes, 0);
        assert_rx(p);
        return;
    }
    cr_assert_eq(w.result, ALTPATCH_REASON_NONE);
    cr_assert(w.wrote);
    cr_assert_arr_eq(p + 4000, NEW3, 3);
    cr_assert_eq(st.procmem_writes, 1);
    cr_assert_eq(st.mprotect_writes, 0);
    cr_assert_eq(st.bytes, 3);
    cr_assert_eq(st.pages, 1);
    assert_rx(p);
}

Test(poke, mismatch_leaves_memory_untouched)
{
    uint8_t *p = rx_pages(1);
    static const uint8_t other[3] = {1, 2, 3};
    struct ap_write w[2] = {wr(p + 10, other, NEW3, 3), wr(p + 20, CC3, NEW3, 3)};
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 2, 0, &st), 0);
    cr_assert_eq(w[0].result, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_not(w[0].wrote);
    cr_assert_arr_eq(p + 10, CC3, 3, "mismatching site must stay as it was");
    cr_assert_eq(w[1].result, ALTPATCH_REASON_NONE);
    cr_assert_arr_eq(p + 20, NEW3, 3, "the other write of the batch still lands");
    cr_assert_eq(st.bytes, 3);
}

Test(poke, two_writes_one_page)
{
    uint8_t *p = rx_pages(1);
    struct ap_write w[2] = {wr(p + 10, CC3, NEW3, 3), wr(p + 30, CC3, NEW3, 3)};
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 2, 0, &st), 0);
    cr_assert_eq(st.pages, 1);
    cr_assert_eq(st.mprotect_writes, 1);
    cr_assert_eq(st.bytes, 6);
    cr_assert_arr_eq(p + 10, NEW3, 3);
    cr_assert_arr_eq(p + 30, NEW3, 3);
    assert_rx(p);
}

Test(poke, adjacent_pages_one_window)
{
    uint8_t *p = rx_pages(3);
    /* one write straddles pages 0 and 1, one sits on page 2: one window of 3 pages */
    struct ap_write w[2] = {wr(p + pgsz() - 1, CC3, NEW3, 3), wr(p + 2 * pgsz() + 5, CC3, NEW3, 3)};
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 2, 0, &st), 0);
    cr_assert_eq(st.pages, 3);
    cr_assert_eq(st.mprotect_writes, 1);
    cr_assert_arr_eq(p + pgsz() - 1, NEW3, 3);
    cr_assert_arr_eq(p + 2 * pgsz() + 5, NEW3, 3);
    for (int i = 0; i < 3; i++)
        assert_rx(p + i * pgsz());
}

Test(poke, distant_pages_two_windows)
{
    uint8_t *p = rx_pages(3);
    struct ap_write w[2] = {wr(p + 5, CC3, NEW3, 3), wr(p + 2 * pgsz() + 5, CC3, NEW3, 3)};
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 2, 0, &st), 0);
    cr_assert_eq(st.pages, 2);
    cr_assert_eq(st.mprotect_writes, 2);
    cr_assert_arr_eq(p + pgsz() + 5, CC3, 3, "the page between is not touched");
}

Test(poke, readonly_data_page_keeps_its_protection)
{
    uint8_t *p = mmap(NULL, pgsz(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED);
    memset(p, 0xcc, pgsz());
    cr_assert_eq(mprotect(p, pgsz(), PROT_READ), 0);
    struct ap_write w = wr(p, CC3, NEW3, 3);
    cr_assert_eq(ap_poke(&w, 1, 0, NULL), 0);
    cr_assert_arr_eq(p, NEW3, 3);
    char perms[5];
    perms_of(p, perms);
    cr_assert_str_eq(perms, "r--p");
}

Test(poke, no_selinux_label_means_not_enforcing)
{
    /* the writer's shortcut: no security.selinux label on /proc/self/maps ->
     * SELinux is not enforcing (checked against /sys/fs/selinux/enforce) */
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    errno = 0;
    ssize_t n = fgetxattr(fd, "security.selinux", NULL, 0);
    int err = errno;
    close(fd);
    char c = '0';
    int efd = open("/sys/fs/selinux/enforce", O_RDONLY | O_CLOEXEC);
    if (efd >= 0) {
        cr_assert_eq(read(efd, &c, 1), 1);
        close(efd);
    }
    if (n < 0 && (err == EOPNOTSUPP || err == ENODATA))
        cr_assert_eq(c, '0', "no label on /proc/self/maps, yet SELinux enforces");
    if (c == '1')
        cr_assert_gt(n, 0, "SELinux enforces: /proc/self/maps has a label");
}

/* The two ways of learning protections, for the "both ways" tests. */
static const unsigned maps_ways[] = {0, AP_POKE_MAPS_FILE};

Test(poke, both_ways_write_lands_and_protection_restored)
{
    for (size_t k = 0; k < 2; k++) {
        uint8_t *p = rx_pages(2);
        struct ap_write w = wr(p + pgsz() + 7, CC3, NEW3, 3);
        struct ap_poke_stats st = {0};
        cr_assert_eq(ap_poke(&w, 1, maps_ways[k], &st), 0);
        cr_assert(w.wrote, "way %zu", k);
        cr_assert_arr_eq(p + pgsz() + 7, NEW3, 3);
        cr_assert_eq(st.mprotect_writes, 1);
        cr_assert_eq(st.procmem_writes, 0);
        assert_rx(p);
        assert_rx(p + pgsz());
        munmap(p, 2 * pgsz());
    }
}

Test(poke, both_ways_window_stops_where_the_protection_changes)
{
    for (size_t k = 0; k < 2; k++) {
        /* page 0 r-x, page 1 r--: two mappings, two windows, each restored to its own */
        uint8_t *p = rx_pages(2);
        cr_assert_eq(mprotect(p + pgsz(), pgsz(), PROT_READ), 0);
        struct ap_write w[2] = {wr(p + pgsz() - 8, CC3, NEW3, 3), wr(p + pgsz() + 8, CC3, NEW3, 3)};
        struct ap_poke_stats st = {0};
        cr_assert_eq(ap_poke(w, 2, maps_ways[k], &st), 0);
        cr_assert(w[0].wrote && w[1].wrote, "way %zu", k);
        cr_assert_eq(st.mprotect_writes, 2, "way %zu: %u windows", k, st.mprotect_writes);
        cr_assert_arr_eq(p + pgsz() - 8, NEW3, 3);
        cr_assert_arr_eq(p + pgsz() + 8, NEW3, 3);
        char perms[5];
        perms_of(p, perms);
        cr_assert_str_eq(perms, "r-xp", "way %zu", k);
        perms_of(p + pgsz(), perms);
        cr_assert_str_eq(perms, "r--p", "way %zu", k);
        munmap(p, 2 * pgsz());
    }
}

Test(poke, both_ways_write_straddling_two_protections_uses_procmem)
{
    for (size_t k = 0; k < 2; k++) {
        /* one write across an r-x and an r-- page: no one protection to restore */
        uint8_t *p = rx_pages(2);
        cr_assert_eq(mprotect(p + pgsz(), pgsz(), PROT_READ), 0);
        struct ap_write w = wr(p + pgsz() - 1, CC3, NEW3, 3);
        struct ap_poke_stats st = {0};
        cr_assert_eq(ap_poke(&w, 1, maps_ways[k], &st), 0);
        if (!ap_procmem_can_write_text()) {
            /* the kernel refuses /proc/self/mem: refused, nothing written */
            cr_assert_eq(w.result, ALTPATCH_REASON_WRITE_DENIED, "way %zu", k);
            cr_assert_not(w.wrote, "way %zu", k);
            cr_assert_eq(st.mprotect_writes + st.procmem_writes, 0);
            cr_assert_arr_eq(p + pgsz() - 1, CC3, 3);
        } else {
            cr_assert(w.wrote, "way %zu", k);
            cr_assert_eq(st.mprotect_writes, 0);
            cr_assert_eq(st.procmem_writes, 1);
            cr_assert_arr_eq(p + pgsz() - 1, NEW3, 3);
        }
        char perms[5];
        perms_of(p, perms);
        cr_assert_str_eq(perms, "r-xp");
        perms_of(p + pgsz(), perms);
        cr_assert_str_eq(perms, "r--p");
        munmap(p, 2 * pgsz());
    }
}

Test(poke, both_ways_shared_mapping_is_never_written)
{
    for (size_t k = 0; k < 2; k++) {
        int fd = memfd_create("ap_test", MFD_CLOEXEC);
        cr_assert_geq(fd, 0);
        cr_assert_eq(ftruncate(fd, (off_t)pgsz()), 0);
        uint8_t *p = mmap(NULL, pgsz(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        cr_assert(p != MAP_FAILED);
        memset(p, 0xcc, pgsz());
        cr_assert_eq(mprotect(p, pgsz(), PROT_READ | PROT_EXEC), 0);
        struct ap_write w = wr(p + 1, CC3, NEW3, 3);
        cr_assert_eq(ap_poke(&w, 1, maps_ways[k], NULL), 0);
        cr_assert_eq(w.result, ALTPATCH_REASON_WRITE_DENIED, "way %zu", k);
        cr_assert_arr_eq(p + 1, CC3, 3, "the file's bytes are untouched");
        char perms[5];
        perms_of(p, perms);
        cr_assert_str_eq(perms, "r-xs");
        munmap(p, pgsz());
        close(fd);
    }
}

Test(poke, shared_mapping_is_never_written)
{
    int fd = memfd_create("ap_test", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)pgsz()), 0);
    uint8_t *p = mmap(NULL, pgsz(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert(p != MAP_FAILED);
    memset(p, 0xcc, pgsz());
    cr_assert_eq(mprotect(p, pgsz(), PROT_READ), 0);
    struct ap_write w = wr(p + 1, CC3, NEW3, 3);
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(&w, 1, 0, &st), 0);
    cr_assert_eq(w.result, ALTPATCH_REASON_WRITE_DENIED);
    cr_assert_arr_eq(p + 1, CC3, 3, "the file's bytes are untouched");
    cr_assert_eq(st.bytes, 0);
    char perms[5];
    perms_of(p, perms);
    cr_assert_str_eq(perms, "r--s");
}

/* Bytes in the writer's own section: a window there would take away the
 * execute permission of the code running the window, so /proc/self/mem is
 * used. Never executed. */
__asm__(".pushsection altpatch_poke_text,\"ax\",@progbits\n"
        ".globl ap_test_in_poke_text\n"
        ".hidden ap_test_in_poke_text\n"
        "ap_test_in_poke_text:\n"
        ".byte 0xcc, 0xcc, 0xcc, 0xcc\n"
        ".popsection\n");
extern uint8_t ap_test_in_poke_text[];

Test(poke, own_section_uses_procmem)
{
    struct ap_write w = wr(ap_test_in_poke_text, CC3, NEW3, 3);
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(&w, 1, 0, &st), 0);
    if (!ap_procmem_can_write_text()) {
        /* the kernel refuses /proc/self/mem: refused, nothing written, still executable */
        cr_assert_eq(w.result, ALTPATCH_REASON_WRITE_DENIED);
        cr_assert_not(w.wrote);
        cr_assert_arr_eq(ap_test_in_poke_text, CC3, 3);
        cr_assert_eq(st.procmem_writes + st.mprotect_writes, 0);
        assert_rx(ap_test_in_poke_text);
        return;
    }
    cr_assert_eq(w.result, ALTPATCH_REASON_NONE);
    cr_assert_arr_eq(ap_test_in_poke_text, NEW3, 3);
    cr_assert_eq(st.procmem_writes, 1);
    cr_assert_eq(st.mprotect_writes, 0);
    assert_rx(ap_test_in_poke_text);
    w = wr(ap_test_in_poke_text, NEW3, CC3, 3);
    cr_assert_eq(ap_poke(&w, 1, AP_POKE_NO_PROCMEM, &st), 0);
    cr_assert_eq(w.result, ALTPATCH_REASON_WRITE_DENIED);
    cr_assert_arr_eq(ap_test_in_poke_text, NEW3, 3);
}

/* ---- PR_SET_MDWE: mprotect may not give execute permission back ---------- */

struct mdwe_result {
    int set;                 /* prctl(PR_SET_MDWE) result, -errno */
    int rw_then_rx;          /* scratch mapping: mprotect RW ok, then RX -> -errno */
    int rc, result;
    bool wrote;
    uint8_t bytes[3];
    char perms[5];
    struct ap_poke_stats st;
};

struct mdwe_ctx {
    uint8_t *p;
    unsigned flags;
};

static void mdwe_body(void *out, void *ctx)
{
    struct mdwe_result *r = out;
    struct mdwe_ctx *c = ctx;
    r->set = ap_mdwe_set();
    if (r->set)
        return;
    /* What exactly fails under MDWE: RX -> RW is allowed, RW -> RX is not. */
    uint8_t *s = mmap(NULL, pgsz(), PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r->rw_then_rx = mprotect(s, pgsz(), PROT_READ | PROT_WRITE) ? -1000 - errno
                    : mprotect(s, pgsz(), PROT_READ | PROT_EXEC) ? -errno
                                                                 : 0;
    struct ap_write w = wr(c->p + 50, CC3, NEW3, 3);
    r->rc = ap_poke(&w, 1, c->flags, &r->st);
    r->result = w.result;
    r->wrote = w.wrote;
    memcpy(r->bytes, c->p + 50, 3);
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long a, e;
        if (sscanf(line, "%lx-%lx %4s", &a, &e, r->perms) == 3 && (uintptr_t)c->p >= a &&
            (uintptr_t)c->p < e)
            break;
    }
    if (f)
        fclose(f);
}

static struct mdwe_result *run_mdwe(unsigned flags)
{
    ap_mdwe_skip_under_valgrind();
    struct mdwe_ctx c = {rx_pages(1), flags};
    struct mdwe_result *r = ap_isolated(sizeof(*r), mdwe_body, &c);
    ap_mdwe_require(r->set);
    cr_assert_eq(r->rw_then_rx, -EACCES, "MDWE: RW->RX should be EACCES, got %d", r->rw_then_rx);
    return r;
}

Test(poke, mdwe_falls_back_to_procmem)
{
    struct mdwe_result *r = run_mdwe(0);
    cr_assert_eq(r->rc, 0);
    if (!ap_procmem_can_write_text()) {
        /* the kernel refuses the fallback too: refused, nothing written */
        cr_assert_eq(r->result, ALTPATCH_REASON_WRITE_DENIED);
        cr_assert_not(r->wrote);
        cr_assert_arr_eq(r->bytes, CC3, 3, "memory untouched");
        cr_assert_eq(r->st.procmem_writes + r->st.mprotect_writes, 0);
        cr_assert_str_eq(r->perms, "r-xp", "still executable: %s", r->perms);
        return;
    }
    cr_assert_eq(r->result, ALTPATCH_REASON_NONE);
    cr_assert(r->wrote);
    cr_assert_arr_eq(r->bytes, NEW3, 3);
    cr_assert_eq(r->st.procmem_writes, 1, "the fallback is reported");
    cr_assert_eq(r->st.mprotect_writes, 0);
    cr_assert_str_eq(r->perms, "r-xp", "still executable: %s", r->perms);
}

Test(poke, mdwe_and_no_procmem_is_denied)
{
    struct mdwe_result *r = run_mdwe(AP_POKE_NO_PROCMEM);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->result, ALTPATCH_REASON_WRITE_DENIED);
    cr_assert_not(r->wrote);
    cr_assert_arr_eq(r->bytes, CC3, 3, "memory untouched");
    cr_assert_eq(r->st.bytes, 0);
    cr_assert_eq(r->st.procmem_writes + r->st.mprotect_writes, 0);
    cr_assert_str_eq(r->perms, "r-xp");
}

/* ---- answers kept from one batch to the next ---------------------------------- */

/** True when the kernel answers PROCMAP_QUERY on /proc/self/maps (Linux 6.11+), asked here. */
static bool procmap_query_answers(void)
{
    struct {
        uint64_t size, query_flags, query_addr;
        uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
        uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
        uint64_t vma_name_addr, build_id_addr;
    } q;
    memset(&q, 0, sizeof(q));
    q.size = sizeof(q);
    q.query_addr = (uintptr_t)&procmap_query_answers;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    int r = ioctl(fd, _IOWR('f', 17, q), &q);
    close(fd);
    return r == 0 && q.vma_start <= q.query_addr && q.query_addr < q.vma_end;
}

/** Descriptors of this process open on its own maps file (by /proc/self/fd), the last in *@p last. */
static int maps_fds(int *last)
{
    char want[64], path[300], target[128];
    snprintf(want, sizeof(want), "/proc/%d/maps", (int)getpid());
    DIR *d = opendir("/proc/self/fd");
    cr_assert(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof(target) - 1);
        if (k <= 0)
            continue;
        target[k] = '\0';
        if (strcmp(target, want) == 0) {
            n++;
            if (last)
                *last = atoi(e->d_name);
        }
    }
    closedir(d);
    return n;
}

/*
 * Three writing batches on an RX page, each one window: the same bytes, the
 * same protection after, fewer system calls. The first asks the kernel's list
 * of security modules (once per process), the second asks the seccomp mode
 * itself, the third is told mode 0 by its caller (AP_POKE_SECCOMP_OFF).
 */
struct kept_result {
    int seccomp;
    int rc[3];
    bool wrote[3];
    uint8_t bytes[3][3];
    char perms[3][5];
    struct ap_poke_stats st[3];
};

static void kept_body(void *out, void *ctx)
{
    (void)ctx;
    struct kept_result *r = out;
    r->seccomp = prctl(PR_GET_SECCOMP, 0L, 0L, 0L, 0L);
    uint8_t *p = rx_pages(1);
    static const unsigned flags[3] = {0, 0, AP_POKE_SECCOMP_OFF};
    for (int i = 0; i < 3; i++) {
        /* write, revert, write */
        struct ap_write w = i == 1 ? wr(p + 200, NEW3, CC3, 3) : wr(p + 200, CC3, NEW3, 3);
        r->rc[i] = ap_poke(&w, 1, flags[i], &r->st[i]);
        r->wrote[i] = w.wrote && w.result == ALTPATCH_REASON_NONE;
        memcpy(r->bytes[i], p + 200, 3);
        perms_of(p, r->perms[i]);
    }
}

/** True when the kernel takes MADV_WIPEONFORK on a page of anonymous memory (Linux 4.14), asked here. */
static bool wipeonfork_taken(void)
{
    void *p = mmap(NULL, pgsz(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    bool ok = madvise(p, pgsz(), 18 /* MADV_WIPEONFORK */) == 0;
    munmap(p, pgsz());
    return ok;
}

Test(poke, answers_kept_cut_system_calls)
{
    struct kept_result *r = ap_isolated(sizeof(*r), kept_body, NULL);
    if (r->seccomp != 0)
        cr_skip_test("under a seccomp filter (mode %d): the probe runs every time", r->seccomp);
    /* where the maps descriptor is kept, the first batch asks fstat and getpid
     * instead of close, the second both instead of open and close and maps
     * the page that tells a child of fork() (the seccomp mode asked first,
     * mmap, madvise), the third only fstat */
    uint64_t keep = procmap_query_answers() ? 1 : 0;
    uint64_t token = keep && wipeonfork_taken() ? 3 : 0;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(r->rc[i], 0, "batch %d", i);
        cr_assert(r->wrote[i], "batch %d", i);
        cr_assert_arr_eq(r->bytes[i], i == 1 ? CC3 : NEW3, 3, "batch %d", i);
        cr_assert_str_eq(r->perms[i], "r-xp", "batch %d: %s", i, r->perms[i]);
        cr_assert_eq(r->st[i].mprotect_writes, 1, "batch %d", i);
        cr_assert_eq(r->st[i].procmem_writes, 0, "batch %d", i);
        cr_assert_eq(r->st[i].bytes, 3, "batch %d", i);
    }
    cr_log_info("system calls: %lu, %lu, %lu", (unsigned long)r->st[0].syscalls,
                (unsigned long)r->st[1].syscalls, (unsigned long)r->st[2].syscalls);
    cr_assert_eq(r->st[1].syscalls, r->st[0].syscalls - 1 - keep + token,
                 "the list of security modules is asked once: %lu then %lu",
                 (unsigned long)r->st[0].syscalls, (unsigned long)r->st[1].syscalls);
    cr_assert_eq(r->st[2].syscalls, r->st[1].syscalls - 1 - (token ? token + 1 : 0),
                 "the seccomp mode the caller knows is not asked, nor getpid(): %lu then %lu",
                 (unsigned long)r->st[1].syscalls, (unsigned long)r->st[2].syscalls);
}

/*
 * Under a seccomp filter (one that allows everything) the mode is asked once:
 * a mode is never cleared. The probe of RW -> RX still runs every batch (a
 * filter may be added), and the writes land as before.
 */
struct filtered_result {
    int set, mode;
    int rc[2];
    bool wrote[2];
    char perms[2][5];
    struct ap_poke_stats st[2];
};

static void filtered_body(void *out, void *ctx)
{
    (void)ctx;
    struct filtered_result *r = out;
    r->set = ap_seccomp_allow_all();
    if (r->set)
        return;
    r->mode = prctl(PR_GET_SECCOMP, 0L, 0L, 0L, 0L);
    uint8_t *p = rx_pages(1);
    for (int i = 0; i < 2; i++) {
        struct ap_write w = i ? wr(p + 300, NEW3, CC3, 3) : wr(p + 300, CC3, NEW3, 3);
        r->rc[i] = ap_poke(&w, 1, 0, &r->st[i]);
        r->wrote[i] = w.wrote && w.result == ALTPATCH_REASON_NONE;
        perms_of(p, r->perms[i]);
    }
}

Test(poke, seccomp_mode_asked_once_under_a_filter)
{
    struct filtered_result *r = ap_isolated(sizeof(*r), filtered_body, NULL);
    ap_seccomp_require(r->set);
    cr_assert_eq(r->mode, SECCOMP_MODE_FILTER);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(r->rc[i], 0, "batch %d", i);
        cr_assert(r->wrote[i], "batch %d", i);
        cr_assert_str_eq(r->perms[i], "r-xp", "batch %d: %s", i, r->perms[i]);
        cr_assert_eq(r->st[i].mprotect_writes, 1, "batch %d: the probe passed", i);
    }
    /* under a filter the page that tells a child of fork() is not mapped:
     * getpid() asked each time */
    uint64_t keep = procmap_query_answers() ? 1 : 0;
    cr_assert_eq(r->st[1].syscalls, r->st[0].syscalls - 1 - keep,
                 "mode asked once: %lu then %lu",
                 (unsigned long)r->st[0].syscalls, (unsigned long)r->st[1].syscalls);
}

/*
 * Where the kernel refuses PROCMAP_QUERY (a filter answers ENOTTY to every
 * ioctl here, as a kernel before 6.11 does), the whole maps file is read:
 * every mapping of the process is learnt (more than the few kept without an
 * allocation), and writes into two mappings land with their protection
 * restored.
 */
struct noquery_result {
    int set;
    int rc;
    bool wrote[2];
    char perms[2][5];
    struct ap_poke_stats st;
};

static void noquery_body(void *out, void *ctx)
{
    (void)ctx;
    struct noquery_result *r = out;
    uint8_t *p[2] = {rx_pages(1), rx_pages(3)};
    r->set = ap_seccomp_refuse_ioctl();
    if (r->set)
        return;
    struct ap_write w[2] = {wr(p[0] + 10, CC3, NEW3, 3), wr(p[1] + 2 * pgsz() + 7, CC3, NEW3, 3)};
    if (w[1].addr < w[0].addr) { /* a batch is in address order */
        struct ap_write t = w[0];
        w[0] = w[1];
        w[1] = t;
    }
    r->rc = ap_poke(w, 2, 0, &r->st);
    for (int i = 0; i < 2; i++) {
        r->wrote[i] = w[i].wrote && w[i].result == ALTPATCH_REASON_NONE &&
                      memcmp((const void *)(uintptr_t)w[i].addr, NEW3, 3) == 0;
        perms_of((const void *)(uintptr_t)w[i].addr, r->perms[i]);
    }
}

Test(poke, whole_maps_file_where_procmap_query_is_refused)
{
    struct noquery_result *r = ap_isolated(sizeof(*r), noquery_body, NULL);
    ap_seccomp_require(r->set);
    cr_assert_eq(r->rc, 0);
    for (int i = 0; i < 2; i++) {
        cr_assert(r->wrote[i], "write %d", i);
        cr_assert_str_eq(r->perms[i], "r-xp", "write %d: %s", i, r->perms[i]);
    }
    /* the protections learnt from the file: windows, not /proc/self/mem
     * (the two mappings may be one window where the kernel merged them) */
    cr_assert_geq(r->st.mprotect_writes, 1);
    cr_assert_eq(r->st.procmem_writes, 0, "%lu writes through /proc/self/mem",
                 (unsigned long)r->st.procmem_writes);
}

/*
 * The maps descriptor kept between batches: one, not one per batch; one the
 * program replaced behind the library's back is neither used nor closed; a
 * child of fork() asks about its own mappings, not its parent's.
 */
struct keptfd_result {
    int answers;
    int after[4];
    int rc[4];
    bool wrote[4];
    char perms[4][5];
    int replaced_fd, replaced_ok;
    int child_rc;
    bool child_wrote;
    char child_perms[5];
};

static void keptfd_body(void *out, void *ctx)
{
    (void)ctx;
    struct keptfd_result *r = out;
    r->answers = procmap_query_answers();
    uint8_t *p = rx_pages(1);
    for (int i = 0; i < 4; i++) {
        if (i == 2) {
            /* the program puts another file where the kept descriptor was */
            int fd = -1;
            maps_fds(&fd);
            int null = open("/dev/null", O_RDONLY);
            r->replaced_fd = fd;
            if (fd >= 0 && null >= 0 && dup2(null, fd) == fd)
                close(null);
        }
        struct ap_write w = i % 2 ? wr(p + 400, NEW3, CC3, 3) : wr(p + 400, CC3, NEW3, 3);
        struct ap_poke_stats st = {0};
        r->rc[i] = ap_poke(&w, 1, 0, &st);
        r->wrote[i] = w.wrote && w.result == ALTPATCH_REASON_NONE;
        perms_of(p, r->perms[i]);
        r->after[i] = maps_fds(NULL);
    }
    char path[64], target[64] = "";
    snprintf(path, sizeof(path), "/proc/self/fd/%d", r->replaced_fd);
    ssize_t k = readlink(path, target, sizeof(target) - 1);
    r->replaced_ok = k > 0 && (target[k] = '\0', strcmp(target, "/dev/null") == 0);
    /* a child whose page is RW where the parent's is RX */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int ok = mprotect(p, pgsz(), PROT_READ | PROT_WRITE) == 0;
        struct ap_write w = wr(p + 400, CC3, NEW3, 3);
        struct ap_poke_stats st = {0};
        r->child_rc = ok ? ap_poke(&w, 1, 0, &st) : -1000;
        r->child_wrote = w.wrote && w.result == ALTPATCH_REASON_NONE;
        perms_of(p, r->child_perms);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
}

Test(poke, maps_descriptor_kept_checked_and_never_stolen)
{
    struct keptfd_result *r = ap_isolated(sizeof(*r), keptfd_body, NULL);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(r->rc[i], 0, "batch %d", i);
        cr_assert(r->wrote[i], "batch %d", i);
        cr_assert_str_eq(r->perms[i], "r-xp", "batch %d: %s", i, r->perms[i]);
        /* kept where the kernel answers PROCMAP_QUERY, else closed */
        cr_assert_eq(r->after[i], r->answers ? 1 : 0, "batch %d: %d maps descriptors", i,
                     r->after[i]);
    }
    if (r->answers) {
        cr_assert_geq(r->replaced_fd, 0);
        cr_assert(r->replaced_ok, "the program's descriptor %d was closed or changed",
                  r->replaced_fd);
    }
    cr_assert_eq(r->child_rc, 0);
    cr_assert(r->child_wrote);
    cr_assert_str_eq(r->child_perms, "rw-p",
                     "the child's page got the parent's protection: %s", r->child_perms);
}

/*
 * A child made without the C library's fork handlers (the raw system call,
 * as a sandbox's or an emulator's clone is) after the parent's batches kept
 * the maps descriptor and mapped the page that tells a child of fork(): the
 * child's batch asks about its own mappings (its page RW where the parent's
 * is RX) and keeps a descriptor of its own; the parent's next batch goes on
 * with its descriptor, without getpid().
 */
struct rawfork_result {
    int answers, token;
    int rc[4], child_rc, child_own;
    bool child_wrote;
    char child_perms[5], perms[5];
    struct ap_poke_stats st[4];
};

static void rawfork_body(void *out, void *ctx)
{
    (void)ctx;
    struct rawfork_result *r = out;
    r->answers = procmap_query_answers();
    r->token = r->answers && wipeonfork_taken();
    uint8_t *p = rx_pages(1);
    for (int i = 0; i < 3; i++) {
        struct ap_write w = i % 2 ? wr(p + 400, NEW3, CC3, 3) : wr(p + 400, CC3, NEW3, 3);
        r->rc[i] = ap_poke(&w, 1, AP_POKE_SECCOMP_OFF, &r->st[i]);
    }
    fflush(NULL);
    long pid = syscall(SYS_fork);
    if (pid == 0) {
        int ok = mprotect(p, pgsz(), PROT_READ | PROT_WRITE) == 0;
        struct ap_write w = wr(p + 400, NEW3, CC3, 3);
        struct ap_poke_stats st = {0};
        r->child_rc = ok ? ap_poke(&w, 1, AP_POKE_SECCOMP_OFF, &st) : -1000;
        r->child_wrote = w.wrote && w.result == ALTPATCH_REASON_NONE;
        perms_of(p, r->child_perms);
        r->child_own = maps_fds(NULL);
        _exit(0);
    }
    if (pid > 0)
        waitpid((pid_t)pid, NULL, 0);
    struct ap_write w = wr(p + 400, NEW3, CC3, 3);
    r->rc[3] = ap_poke(&w, 1, AP_POKE_SECCOMP_OFF, &r->st[3]);
    perms_of(p, r->perms);
}

Test(poke, child_without_fork_handlers_asks_about_its_own_mappings)
{
    struct rawfork_result *r = ap_isolated(sizeof(*r), rawfork_body, NULL);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(r->rc[i], 0, "batch %d", i);
        cr_assert_eq(r->st[i].bytes, 3, "batch %d", i);
    }
    cr_assert_eq(r->child_rc, 0);
    cr_assert(r->child_wrote);
    cr_assert_str_eq(r->child_perms, "rw-p",
                     "the child's page got the parent's protection: %s", r->child_perms);
    cr_assert_eq(r->child_own, r->answers ? 1 : 0, "the child keeps %d of its own maps file",
                 r->child_own);
    cr_assert_str_eq(r->perms, "r-xp");
    /* the third batch and the one after the child's: fstat() alone, where
     * the page is mapped; getpid() too where it is not */
    cr_log_info("system calls: %lu %lu %lu %lu", (unsigned long)r->st[0].syscalls,
                (unsigned long)r->st[1].syscalls, (unsigned long)r->st[2].syscalls,
                (unsigned long)r->st[3].syscalls);
    cr_assert_eq(r->st[3].syscalls, r->st[2].syscalls);
    if (r->token) /* getpid(), the seccomp mode, mmap, madvise */
        cr_assert_eq(r->st[2].syscalls, r->st[1].syscalls - 4,
                     "getpid() asked after the page was mapped: %lu then %lu",
                     (unsigned long)r->st[1].syscalls, (unsigned long)r->st[2].syscalls);
}

/** Descriptors this process has open (by /proc/self/fd, the directory's own not counted). */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d))
            n++;
    closedir(d);
    return n;
}

/** True when descriptor @p fd names @p want. */
static bool fd_names(int fd, const char *want)
{
    char path[64], target[128];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t k = readlink(path, target, sizeof(target) - 1);
    return k > 0 && (target[k] = '\0', strcmp(target, want) == 0);
}

/*
 * A pre-fork server: the parent applies (the maps descriptor is kept), then
 * each worker it forks applies too. A worker starts without the parent's
 * kept descriptor (the library's fork handler closed the copy) and ends with
 * its own kept instead: one more descriptor where the kernel answers
 * PROCMAP_QUERY; its grandchild does the same. A worker that put another
 * file under the inherited number keeps that file.
 */
#define FORK_WORKERS 3
struct forkfd_result {
    int answers;
    int parent_rc, parent_fds;
    int rc[FORK_WORKERS], before[FORK_WORKERS], after[FORK_WORKERS], own[FORK_WORKERS];
    int inherited[FORK_WORKERS], grand_inherited;
    bool wrote[FORK_WORKERS];
    int grand_rc, grand_before, grand_after, grand_own;
    int replaced_fd, replaced_rc;
    bool replaced_ok;
};

/** In a worker: apply one write at @p at, descriptors counted before and after. */
static int worker_poke(uint8_t *at, int *before, int *after, int *own, bool *wrote)
{
    struct ap_write w = at[0] == 0xcc ? wr(at, CC3, NEW3, 3) : wr(at, NEW3, CC3, 3);
    *before = open_fds();
    int rc = ap_poke(&w, 1, 0, NULL);
    *after = open_fds();
    *own = maps_fds(NULL);
    if (wrote)
        *wrote = w.wrote && w.result == ALTPATCH_REASON_NONE;
    return rc;
}

static void forkfd_body(void *out, void *ctx)
{
    (void)ctx;
    struct forkfd_result *r = out;
    r->answers = procmap_query_answers();
    uint8_t *p = rx_pages(1);
    struct ap_write w = wr(p + 500, CC3, NEW3, 3);
    r->parent_rc = ap_poke(&w, 1, 0, NULL);
    r->parent_fds = maps_fds(NULL);
    fflush(NULL);
    for (int i = 0; i < FORK_WORKERS; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            r->inherited[i] = maps_fds(NULL);
            r->rc[i] = worker_poke(p + 500, &r->before[i], &r->after[i], &r->own[i],
                                   &r->wrote[i]);
            if (i == 0) {
                pid_t g = fork();
                if (g == 0) {
                    r->grand_inherited = maps_fds(NULL);
                    r->grand_rc = worker_poke(p + 500, &r->grand_before, &r->grand_after,
                                              &r->grand_own, NULL);
                    _exit(0);
                }
                waitpid(g, NULL, 0);
            }
            _exit(0);
        }
        waitpid(pid, NULL, 0);
    }
    /* a worker that replaced the inherited number with a file of its own */
    int kept = -1;
    char want[64];
    snprintf(want, sizeof(want), "/proc/%d/maps", (int)getpid());
    for (int fd = 0; fd < 1024 && kept < 0; fd++)
        if (fd_names(fd, want))
            kept = fd;
    r->replaced_fd = kept;
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        if (kept >= 0 && null >= 0 && null != kept && dup2(null, kept) == kept)
            close(null);
        int b, a, o;
        r->replaced_rc = worker_poke(p + 500, &b, &a, &o, NULL);
        r->replaced_ok = kept < 0 || fd_names(kept, "/dev/null");
        _exit(0);
    }
    waitpid(pid, NULL, 0);
}

Test(poke, forked_worker_closes_the_inherited_maps_descriptor)
{
    struct forkfd_result *r = ap_isolated(sizeof(*r), forkfd_body, NULL);
    cr_assert_eq(r->parent_rc, 0);
    cr_assert_eq(r->parent_fds, r->answers ? 1 : 0);
    for (int i = 0; i < FORK_WORKERS; i++) {
        cr_assert_eq(r->rc[i], 0, "worker %d", i);
        cr_assert(r->wrote[i], "worker %d", i);
        cr_assert_eq(r->inherited[i], 0, "worker %d: the parent's maps descriptor inherited", i);
        cr_assert_eq(r->after[i], r->before[i] + (r->answers ? 1 : 0),
                     "worker %d: %d descriptors, then %d", i, r->before[i], r->after[i]);
        cr_assert_eq(r->own[i], r->answers ? 1 : 0, "worker %d: %d on its own maps file", i,
                     r->own[i]);
    }
    cr_assert_eq(r->grand_rc, 0);
    cr_assert_eq(r->grand_inherited, 0, "grandchild: its parent's maps descriptor inherited");
    cr_assert_eq(r->grand_after, r->grand_before + (r->answers ? 1 : 0),
                 "grandchild: %d descriptors, then %d", r->grand_before, r->grand_after);
    cr_assert_eq(r->grand_own, r->answers ? 1 : 0);
    if (r->answers)
        cr_assert_geq(r->replaced_fd, 0, "the parent's kept descriptor not found");
    cr_assert_eq(r->replaced_rc, 0);
    cr_assert(r->replaced_ok, "the worker's /dev/null under %d was closed or changed",
              r->replaced_fd);
}

/*
 * A child that closes what it does not know and opens its parent's maps file
 * (a crash reporter's view; close on exec, as the library opens it) under the
 * number the parent's kept descriptor had: the same file to fstat() and
 * F_GETFD. The library's fork handler closed its copy at the fork; the
 * child's batch leaves the program's FILE alone.
 */
struct ownmaps_result {
    int answers, kept, parent_rc;
    int child_rc, child_fd, child_flags, child_read, child_same;
    bool child_wrote;
};

static void ownmaps_body(void *out, void *ctx)
{
    (void)ctx;
    struct ownmaps_result *r = out;
    r->answers = procmap_query_answers();
    uint8_t *p = rx_pages(1);
    struct ap_write w = wr(p + 100, CC3, NEW3, 3);
    r->parent_rc = ap_poke(&w, 1, 0, NULL);
    r->kept = -1;
    maps_fds(&r->kept);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int target = r->kept >= 0 ? r->kept : 100;
        close(target); /* the program's clean-up: EBADF when the library closed it */
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/maps", (int)getppid());
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && fd != target) {
            if (dup3(fd, target, O_CLOEXEC) == target)
                close(fd);
            fd = target;
        }
        FILE *f = fd >= 0 ? fdopen(fd, "re") : NULL;
        struct stat before, after;
        if (fstat(fd, &before))
            _exit(1);
        struct ap_write w2 = wr(p + 100, NEW3, CC3, 3);
        r->child_rc = ap_poke(&w2, 1, 0, NULL);
        r->child_wrote = w2.wrote && w2.result == ALTPATCH_REASON_NONE;
        r->child_fd = fd;
        r->child_flags = fcntl(fd, F_GETFD);
        /* still the program's: the library's own might have taken the number */
        r->child_same = fstat(fd, &after) == 0 && after.st_ino == before.st_ino &&
                        after.st_dev == before.st_dev;
        char line[256];
        r->child_read = f && fseek(f, 0, SEEK_SET) == 0 && fgets(line, sizeof(line), f) != NULL;
        _exit(0);
    }
    waitpid(pid, NULL, 0);
}

Test(poke, child_maps_file_under_the_kept_number_is_left_alone)
{
    struct ownmaps_result *r = ap_isolated(sizeof(*r), ownmaps_body, NULL);
    cr_assert_eq(r->parent_rc, 0);
    if (r->answers)
        cr_assert_geq(r->kept, 0, "the parent's kept descriptor not found");
    cr_assert_eq(r->child_rc, 0);
    cr_assert(r->child_wrote);
    cr_assert_geq(r->child_flags, 0, "the program's descriptor %d was closed", r->child_fd);
    cr_assert(r->child_same, "the program's descriptor %d was closed and the number reused",
              r->child_fd);
    cr_assert(r->child_read, "the program's FILE on %d does not read", r->child_fd);
}

/*
 * A daemon that closes every descriptor it does not know after start-up and
 * opens a file of its own, which takes the number the kept maps descriptor
 * had, then forks a worker: the library's fork handler leaves that file
 * open in the worker (it is not the library's any more).
 */
struct closefrom_result {
    int answers, kept, parent_rc, reopened;
    int child_flags, child_null;
};

static void closefrom_body(void *out, void *ctx)
{
    (void)ctx;
    struct closefrom_result *r = out;
    r->answers = procmap_query_answers();
    uint8_t *p = rx_pages(1);
    struct ap_write w = wr(p + 200, CC3, NEW3, 3);
    r->parent_rc = ap_poke(&w, 1, 0, NULL);
    r->kept = -1;
    maps_fds(&r->kept);
    int target = r->kept >= 0 ? r->kept : 100;
    close(target); /* the daemon's clean-up of what it did not open */
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && fd != target) {
        if (dup3(fd, target, O_CLOEXEC) == target)
            close(fd);
    }
    r->reopened = fd_names(target, "/dev/null");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        r->child_flags = fcntl(target, F_GETFD);
        r->child_null = fd_names(target, "/dev/null");
        _exit(0);
    }
    waitpid(pid, NULL, 0);
}

Test(poke, file_reopened_under_the_kept_number_survives_a_fork)
{
    struct closefrom_result *r = ap_isolated(sizeof(*r), closefrom_body, NULL);
    cr_assert_eq(r->parent_rc, 0);
    if (r->answers)
        cr_assert_geq(r->kept, 0, "the parent's kept descriptor not found");
    cr_assert(r->reopened, "the test could not put /dev/null under %d", r->kept);
    cr_assert_geq(r->child_flags, 0, "the program's /dev/null under %d was closed in the child",
                  r->kept);
    cr_assert(r->child_null, "the number %d names another file in the child", r->kept);
}

/*
 * The kept descriptor where the whole file is read instead: asked by the
 * caller (AP_POKE_MAPS_FILE), or the kernel stops answering PROCMAP_QUERY on
 * it (here a filter refuses the ioctl from some batch on). It is closed, not
 * lost: the process holds no more than one maps descriptor after any batch,
 * and none once the kernel does not answer.
 */
struct stopfd_result {
    int answers, set;
    int rc[4];
    bool wrote[4];
    int fds[4], maps[4];
};

static void stopfd_body(void *out, void *ctx)
{
    (void)ctx;
    struct stopfd_result *r = out;
    r->answers = procmap_query_answers();
    uint8_t *p = rx_pages(1);
    static const unsigned flags[4] = {0, AP_POKE_MAPS_FILE, 0, 0};
    for (int i = 0; i < 4; i++) {
        if (i == 3) {
            r->set = ap_seccomp_refuse_ioctl();
            if (r->set)
                return;
        }
        struct ap_write w = i % 2 ? wr(p + 600, NEW3, CC3, 3) : wr(p + 600, CC3, NEW3, 3);
        r->rc[i] = ap_poke(&w, 1, flags[i], NULL);
        r->wrote[i] = w.wrote && w.result == ALTPATCH_REASON_NONE;
        r->fds[i] = open_fds();
        r->maps[i] = maps_fds(NULL);
    }
}

Test(poke, maps_descriptor_closed_where_the_file_is_read)
{
    struct stopfd_result *r = ap_isolated(sizeof(*r), stopfd_body, NULL);
    ap_seccomp_require(r->set);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(r->rc[i], 0, "batch %d", i);
        cr_assert(r->wrote[i], "batch %d", i);
        cr_assert_leq(r->maps[i], 1, "batch %d: %d maps descriptors", i, r->maps[i]);
    }
    /* kept after the first batch, closed by the second (the file read), kept
     * again by the third, closed by the fourth (the kernel stopped answering) */
    int k = r->answers ? 1 : 0;
    cr_assert_eq(r->maps[0], k);
    cr_assert_eq(r->maps[1], 0);
    cr_assert_eq(r->fds[1], r->fds[0] - k, "%d descriptors, then %d", r->fds[0], r->fds[1]);
    cr_assert_eq(r->maps[2], k);
    cr_assert_eq(r->fds[2], r->fds[0], "%d descriptors, then %d", r->fds[0], r->fds[2]);
    cr_assert_eq(r->maps[3], 0);
    cr_assert_eq(r->fds[3], r->fds[0] - k, "%d descriptors, then %d", r->fds[0], r->fds[3]);
}

/* The window routine must not call out of its section: every relative branch
 * stays inside, and there is no call at all (direct or indirect). */
extern const uint8_t __start_altpatch_poke_text[];
extern const uint8_t __stop_altpatch_poke_text[];

Test(poke, window_routine_calls_nothing)
{
    const uint8_t *s = __start_altpatch_poke_text, *e = __stop_altpatch_poke_text;
    cr_assert_lt(s, e);
    size_t ninsn = 0, nsyscall = 0;
    for (const uint8_t *p = s; p < e;) {
        struct ap_insn in;
        cr_assert_eq(ap_insn_decode(p, (size_t)(e - p), &in), 0, "undecodable at +%td", p - s);
        if (in.has_rel && in.rel_is_branch) {
            const uint8_t *t = p + in.len + in.rel_value;
            cr_assert(t >= s && t <= e, "branch at +%td leaves the section", p - s);
        }
        size_t k = 0;
        while (k < in.len && (p[k] == 0x66 || p[k] == 0xf2 || p[k] == 0xf3 || (p[k] & 0xf0) == 0x40))
            k++;
        cr_assert_neq(p[k], 0xe8, "call rel32 at +%td", p - s);
        if (p[k] == 0xff && k + 1 < in.len) {
            unsigned reg = (p[k + 1] >> 3) & 7;
            cr_assert(reg != 2 && reg != 3 && reg != 4 && reg != 5,
                      "indirect call/jmp at +%td", p - s);
        }
        nsyscall += in.len == 2 && p[0] == 0x0f && p[1] == 0x05;
        ninsn++;
        p += in.len;
    }
    cr_assert_geq(nsyscall, 2, "mprotect RW and back are raw syscalls");
    cr_assert_gt(ninsn, 10);
}

/* The two writers' shared rules (writer.c), on plain data. */
Test(poke, pending_rule_and_page_count)
{
    static uint8_t mem[3] = {1, 2, 3};
    static const uint8_t old[3] = {1, 2, 3}, new[3] = {4, 5, 6}, other[3] = {7, 8, 9};
    struct ap_write w = {.addr = (uintptr_t)mem, .old = old, .new = new, .len = 3,
                         .result = 99, .wrote = true};
    cr_assert(ap_write_pending(&w));
    cr_assert_eq(w.result, ALTPATCH_REASON_NONE);
    cr_assert_not(w.wrote);
    w.new = old; /* memory already holds the new bytes */
    cr_assert_not(ap_write_pending(&w));
    cr_assert_eq(w.result, ALTPATCH_REASON_NONE);
    w.new = new;
    w.old = other; /* memory holds neither */
    cr_assert_not(ap_write_pending(&w));
    cr_assert_eq(w.result, ALTPATCH_REASON_MEM_MISMATCH);
    w.len = 0;
    cr_assert_not(ap_write_pending(&w));

    /* pages: 0x1000-page writes at 0xff0 (2 pages), 0x1800 (same page), 0x5000 */
    struct ap_write v[4] = {
        {.addr = 0xff0, .len = 0x20, .wrote = true},
        {.addr = 0x1800, .len = 4, .wrote = true},
        {.addr = 0x3000, .len = 4, .wrote = false},
        {.addr = 0x5000, .len = 0x1000, .wrote = true},
    };
    cr_assert_eq(ap_pages_written(v, 4, 0x1000), 3);
    cr_assert_eq(ap_pages_written(v, 2, 0x1000), 2);
    cr_assert_eq(ap_pages_written(v, 0, 0x1000), 0);
}

/*
 * Every length the writer copies by words or by bytes (1..40), three kinds of
 * write in one batch and one page: memory holds old (lands, exactly its
 * bytes), memory holds new already (skipped: not written, not counted), and
 * memory holds old but for its last byte (MEM_MISMATCH, untouched: the tail
 * of each length is compared too). The window and /proc/self/mem paths.
 */
static void lengths_and_kinds(unsigned flags)
{
    static const size_t lens[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 40};
    enum { NL = sizeof(lens) / sizeof(lens[0]), SLOT = 64 };
    static uint8_t oldb[NL][SLOT], newb[NL][SLOT];
    uint8_t *p = mmap(NULL, pgsz(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED);
    cr_assert_geq(pgsz(), 3 * NL * SLOT);
    memset(p, 0xcc, pgsz());
    struct ap_write w[3 * NL];
    uint64_t want_bytes = 0;
    for (size_t i = 0; i < NL; i++) {
        size_t n = lens[i];
        for (size_t k = 0; k < n; k++) {
            oldb[i][k] = (uint8_t)(0x10 + k);
            newb[i][k] = (uint8_t)(0x80 + 3 * k + i);
        }
        uint8_t *a = p + (3 * i) * SLOT + 8, *b = a + SLOT, *c = b + SLOT;
        memcpy(a, oldb[i], n);     /* pending */
        memcpy(b, newb[i], n);     /* already new */
        memcpy(c, oldb[i], n);     /* old but for the last byte */
        c[n - 1] ^= 0x40;
        w[3 * i] = wr(a, oldb[i], newb[i], n);
        w[3 * i + 1] = wr(b, oldb[i], newb[i], n);
        w[3 * i + 2] = wr(c, oldb[i], newb[i], n);
        w[3 * i + 2].result = 99;
        w[3 * i + 1].wrote = true; /* outputs are set, whatever they held */
        want_bytes += n;
    }
    cr_assert_eq(mprotect(p, pgsz(), PROT_READ | PROT_EXEC), 0);
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 3 * NL, flags, &st), 0);
    /* where the kernel refuses /proc/self/mem, its only writer here: the
     * pending writes refused, nothing written */
    bool denied = (flags & AP_POKE_PROCMEM_ONLY) && !ap_procmem_can_write_text();
    for (size_t i = 0; i < NL; i++) {
        size_t n = lens[i];
        uint8_t *a = p + (3 * i) * SLOT + 8, *b = a + SLOT, *c = b + SLOT;
        if (denied) {
            cr_assert_eq(w[3 * i].result, ALTPATCH_REASON_WRITE_DENIED, "len %zu", n);
            cr_assert_not(w[3 * i].wrote, "len %zu", n);
            cr_assert_arr_eq(a, oldb[i], n, "len %zu: untouched", n);
        } else {
            cr_assert_eq(w[3 * i].result, ALTPATCH_REASON_NONE, "len %zu", n);
            cr_assert(w[3 * i].wrote, "len %zu", n);
            cr_assert_arr_eq(a, newb[i], n, "len %zu: new bytes", n);
        }
        cr_assert_eq(a[-1], 0xcc, "len %zu: byte before untouched", n);
        cr_assert_eq(a[n], 0xcc, "len %zu: byte after untouched", n);
        cr_assert_eq(w[3 * i + 1].result, ALTPATCH_REASON_NONE, "len %zu", n);
        cr_assert_not(w[3 * i + 1].wrote, "len %zu: memory held new already", n);
        cr_assert_arr_eq(b, newb[i], n);
        cr_assert_eq(w[3 * i + 2].result, ALTPATCH_REASON_MEM_MISMATCH, "len %zu", n);
        cr_assert_not(w[3 * i + 2].wrote);
        cr_assert_arr_eq(c, oldb[i], n - 1, "len %zu: mismatching write untouched", n);
        cr_assert_eq(c[n - 1], oldb[i][n - 1] ^ 0x40);
        cr_assert_eq(c[n], 0xcc);
    }
    if (denied) {
        cr_assert_eq(st.bytes + st.pages + st.procmem_writes + st.mprotect_writes, 0);
        assert_rx(p);
        munmap(p, pgsz());
        return;
    }
    cr_assert_eq(st.bytes, want_bytes);
    cr_assert_eq(st.pages, 1);
    if (flags & AP_POKE_PROCMEM_ONLY)
        cr_assert_eq(st.procmem_writes, NL);
    else
        cr_assert_eq(st.mprotect_writes, 1);
    assert_rx(p);
    munmap(p, pgsz());
}

Test(poke, every_length_and_kind_in_one_window)
{
    lengths_and_kinds(0);
}

Test(poke, every_length_and_kind_through_procmem)
{
    lengths_and_kinds(AP_POKE_PROCMEM_ONLY);
}

/* A batch whose first writes need nothing: no system call until one is pending. */
Test(poke, writes_before_the_first_pending_one_are_checked)
{
    uint8_t *p = rx_pages(2);
    static const uint8_t other[3] = {1, 2, 3};
    struct ap_write w[4] = {
        wr(p + 4, other, NEW3, 3),        /* neither: mismatch */
        wr(p + 12, NEW3, CC3, 3),         /* holds new (CC3) already */
        wr(p + 20, CC3, NEW3, 0),         /* empty */
        wr(p + pgsz() + 8, CC3, NEW3, 3), /* pending, next page */
    };
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 4, 0, &st), 0);
    cr_assert_eq(w[0].result, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_eq(w[1].result, ALTPATCH_REASON_NONE);
    cr_assert_not(w[1].wrote);
    cr_assert_eq(w[2].result, ALTPATCH_REASON_NONE);
    cr_assert_not(w[2].wrote);
    cr_assert(w[3].wrote);
    cr_assert_arr_eq(p + 4, CC3, 3);
    cr_assert_arr_eq(p + pgsz() + 8, NEW3, 3);
    cr_assert_eq(st.pages, 1, "only the page written is counted");
    cr_assert_eq(st.bytes, 3);
    assert_rx(p);
    assert_rx(p + pgsz());
}

/* Writes after the first pending one that need nothing: checked where they
 * would be written, not written, not counted. */
Test(poke, writes_after_the_first_pending_one_are_checked)
{
    uint8_t *p = rx_pages(3);
    static const uint8_t other[3] = {1, 2, 3};
    struct ap_write w[3] = {
        wr(p + 8, CC3, NEW3, 3),                 /* pending */
        wr(p + 2 * pgsz() + 4, NEW3, CC3, 3),    /* holds new (CC3) already */
        wr(p + 2 * pgsz() + 12, other, NEW3, 3), /* neither: mismatch */
    };
    w[1].wrote = true;
    w[2].result = 99;
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 3, 0, &st), 0);
    cr_assert(w[0].wrote);
    cr_assert_arr_eq(p + 8, NEW3, 3);
    cr_assert_not(w[1].wrote);
    cr_assert_eq(w[1].result, ALTPATCH_REASON_NONE);
    cr_assert_not(w[2].wrote);
    cr_assert_eq(w[2].result, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_arr_eq(p + 2 * pgsz() + 12, CC3, 3, "mismatching write untouched");
    cr_assert_eq(st.pages, 1);
    cr_assert_eq(st.bytes, 3);
    cr_assert_eq(st.mprotect_writes, 2, "two windows opened (the second writes nothing)");
    for (int i = 0; i < 3; i++)
        assert_rx(p + i * pgsz());
}

/* ---- ap_malloc_filled(): pages present at once where allowed --------------------- */

/* Pages of [p, p + n) the kernel holds now (mincore), over the whole pages inside. */
static size_t resident_pages(const void *p, size_t n, size_t *total)
{
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    size_t pages = (e - a) / 4096, in = 0;
    unsigned char *v = malloc(pages ? pages : 1);
    cr_assert_not_null(v);
    cr_assert_eq(mincore((void *)a, e - a, v), 0, "mincore: %s", strerror(errno));
    for (size_t i = 0; i < pages; i++)
        in += v[i] & 1;
    free(v);
    *total = pages;
    return in;
}

/** Whether this kernel knows MADV_POPULATE_WRITE (5.14 and later). */
static bool populate_write_known(void)
{
    void *probe = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(probe, MAP_FAILED);
    bool known = madvise(probe, 4096, 23 /* MADV_POPULATE_WRITE */) == 0;
    munmap(probe, 4096);
    return known;
}

/*
 * No transparent huge pages in this process and the children it forks from
 * now on (PR_SET_THP_DISABLE). With THP "always", the first write to a block
 * nobody asked to fill (malloc()'s own header) may make a whole 2 MiB page
 * present: the count of present pages would then say nothing of the advice.
 */
static void base_pages_only(void)
{
    cr_assert_eq(prctl(PR_SET_THP_DISABLE, 1L, 0L, 0L, 0L), 0, "PR_SET_THP_DISABLE: %s",
                 strerror(errno));
}

/** Whether this thread runs without a seccomp filter (PR_GET_SECCOMP answers 0). */
static bool no_filter(void)
{
    return prctl(PR_GET_SECCOMP, 0L, 0L, 0L, 0L) == 0;
}

Test(poke, filled_block_present_only_where_allowed)
{
    base_pages_only();
    enum { SIZE = 4 << 20 };
    bool valgrind = ap_under_valgrind(); /* its malloc hands out touched memory */
    bool known = populate_write_known();

    size_t total, in;
    ap_fill_allow(false);
    uint8_t *a = ap_malloc_filled(SIZE);
    cr_assert_not_null(a);
    in = resident_pages(a, SIZE, &total);
    cr_assert_gt(total, 1000);
    if (!valgrind)
        cr_assert_leq(in, 2, "not allowed: %zu of %zu pages present before any write", in, total);

    ap_fill_allow(true);
    uint8_t *b = ap_malloc_filled(SIZE);
    uint8_t *small = ap_malloc_filled(4096); /* below the threshold: no advice */
    ap_fill_allow(false);
    cr_assert(b && small);
    in = resident_pages(b, SIZE, &total);
    if (known) /* allowed, no callback since: not asked again */
        cr_assert_eq(in, total, "allowed: %zu of %zu pages present", in, total);
    /* the memory is the caller's either way */
    memset(a, 0x5a, SIZE);
    memset(b, 0xa5, SIZE);
    memset(small, 1, 4096);
    cr_assert_eq(a[SIZE - 1], 0x5a);
    cr_assert_eq(b[0], 0xa5);
    cr_assert_eq(b[SIZE - 1], 0xa5);
    ap_mem_free(a);
    ap_mem_free(b);
    ap_mem_free(small);
}

static unsigned proofs_asked;
static bool proof_yes(void)
{
    proofs_asked++;
    return true;
}
static bool proof_no(void)
{
    proofs_asked++;
    return false;
}

/* The proof asked by the first block large enough to be filled, once; its
 * answer decides that block and the later ones. */
Test(poke, filled_block_asks_its_proof_once)
{
    base_pages_only();
    enum { SIZE = 4 << 20 };
    bool valgrind = ap_under_valgrind();
    bool known = populate_write_known();
    size_t total, in;

    proofs_asked = 0;
    ap_fill_ask(proof_yes);
    uint8_t *small = ap_malloc_filled(4096);
    cr_assert_eq(proofs_asked, 0, "a small block asks nothing");
    uint8_t *b = ap_malloc_filled(SIZE);
    cr_assert_eq(proofs_asked, 1, "the first large block asks");
    uint8_t *c = ap_malloc_filled(SIZE);
    cr_assert_eq(proofs_asked, 1, "asked once");
    ap_fill_allow(false);
    cr_assert(small && b && c);
    if (known) {
        in = resident_pages(b, SIZE, &total);
        cr_assert_eq(in, total, "proved: %zu of %zu pages present", in, total);
    }
    if (known) { /* the proof holds for a later block: no callback since */
        in = resident_pages(c, SIZE, &total);
        cr_assert_eq(in, total, "proved, the next block: %zu of %zu pages present", in, total);
    }

    proofs_asked = 0;
    ap_fill_ask(proof_no);
    uint8_t *d = ap_malloc_filled(SIZE);
    uint8_t *e = ap_malloc_filled(SIZE);
    cr_assert_eq(proofs_asked, 1);
    ap_fill_allow(false);
    cr_assert(d && e);
    in = resident_pages(d, SIZE, &total);
    if (!valgrind)
        cr_assert_leq(in, 2, "not proved: %zu of %zu pages present", in, total);
    in = resident_pages(e, SIZE, &total);
    if (!valgrind)
        cr_assert_leq(in, 2, "not proved, the next block: %zu of %zu pages present", in, total);

    /* ap_fill_allow() drops a proof not asked yet */
    proofs_asked = 0;
    ap_fill_ask(proof_yes);
    ap_fill_allow(false);
    uint8_t *f = ap_malloc_filled(SIZE);
    cr_assert_eq(proofs_asked, 0);
    cr_assert_not_null(f);
    ap_mem_free(small);
    ap_mem_free(b);
    ap_mem_free(c);
    ap_mem_free(d);
    ap_mem_free(e);
    ap_mem_free(f);
}

/*
 * A filter installed after the proof by a print callback, one that kills the
 * process on madvise(): the next large block asks the mode (the callback ran
 * since the proof), finds the filter and gives no advice. In a child: a
 * filter is never removed.
 */
struct filled_filter_result {
    int installed;
    bool allocated;
    size_t in_before, in_after, total;
};

static int filled_filter_installed;

static int install_madvise_killer(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level, (void)fmt, (void)ap;
    struct sock_filter f[] = {
        AP_SECCOMP_PROLOGUE,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_madvise, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    if (!filled_filter_installed) {
        int set = AP_SECCOMP_INSTALL(f);
        filled_filter_installed = set ? set : 1;
    }
    return 0;
}

static void filled_filter_body(void *out, void *ctx)
{
    enum { SIZE = 4 << 20 };
    (void)ctx;
    struct filled_filter_result *r = out;
    ap_fill_ask(proof_yes);
    uint8_t *b = ap_malloc_filled(SIZE); /* proved: advised */
    altpatch_set_print(install_madvise_killer);
    ap_log(ALTPATCH_WARN, "a line for the print callback\n");
    altpatch_set_print(NULL);
    r->installed = filled_filter_installed;
    uint8_t *c = ap_malloc_filled(SIZE); /* a madvise() here ends the child */
    uint8_t *d = ap_malloc_filled(SIZE); /* and here: the answer is kept */
    ap_fill_allow(false);
    r->allocated = b && c && d;
    if (r->allocated) {
        size_t in_d;
        r->in_before = resident_pages(b, SIZE, &r->total);
        r->in_after = resident_pages(c, SIZE, &r->total);
        in_d = resident_pages(d, SIZE, &r->total);
        if (in_d > r->in_after)
            r->in_after = in_d;
    }
}

/* A sanitizer's allocator gives madvise() advice of its own (the filter
 * would end the child there, not in the library). */
Test(poke, filled_block_after_a_filter_gives_no_advice)
{
    if (AP_SANITIZED)
        cr_skip_test("the sanitizer's allocator calls madvise() itself");
    base_pages_only(); /* the child inherits it */
    struct filled_filter_result *r = ap_isolated(sizeof(*r), filled_filter_body, NULL);
    if (r->installed < 0)
        ap_seccomp_require(r->installed);
    cr_assert(r->allocated);
    if (populate_write_known() && !ap_under_valgrind()) {
        cr_assert_eq(r->in_before, r->total, "before the filter: %zu of %zu pages present",
                     r->in_before, r->total);
        cr_assert_leq(r->in_after, 2, "under the filter: %zu of %zu pages present",
                      r->in_after, r->total);
    }
}

/*
 * Once the print callback ran since the proof, no later block gets advice,
 * and the mode is not asked: the callback may have started a thread that
 * installs a filter at any time, which a question would not see. A filter
 * that kills the process on prctl() (installed after the callback, as such a
 * thread would) tells that nothing asked. In a child: a filter is never
 * removed.
 */
struct filled_callback_result {
    int installed;
    bool allocated;
    size_t in[3], total;
};

static unsigned filled_callback_lines;

static int count_lines(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level, (void)fmt, (void)ap;
    filled_callback_lines++;
    return 0;
}

static void filled_callback_body(void *out, void *ctx)
{
    enum { SIZE = 4 << 20 };
    (void)ctx;
    struct filled_callback_result *r = out;
    uint8_t *b[3] = {0};
    ap_fill_ask(proof_yes);
    b[0] = ap_malloc_filled(SIZE); /* proved: advised */
    altpatch_set_print(count_lines);
    ap_log(ALTPATCH_WARN, "a line for the print callback\n");
    altpatch_set_print(NULL);
    struct sock_filter f[] = {
        AP_SECCOMP_PROLOGUE,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prctl, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    int set = AP_SECCOMP_INSTALL(f);
    r->installed = set ? set : 1;
    b[1] = ap_malloc_filled(SIZE); /* a callback since the proof: no advice, nothing asked */
    b[2] = ap_malloc_filled(SIZE); /* nor for any later block */
    ap_fill_allow(false);
    r->allocated = b[0] && b[1] && b[2] && filled_callback_lines == 1;
    for (int i = 0; i < 3 && r->allocated; i++)
        r->in[i] = resident_pages(b[i], SIZE, &r->total);
}

Test(poke, filled_block_after_a_callback_gives_no_advice_and_asks_nothing)
{
    if (AP_SANITIZED)
        cr_skip_test("the sanitizer's allocator calls madvise() itself");
    /* the child is killed where the mode is asked under the filter */
    base_pages_only(); /* the child inherits it */
    struct filled_callback_result *r = ap_isolated(sizeof(*r), filled_callback_body, NULL);
    if (r->installed < 0)
        ap_seccomp_require(r->installed);
    cr_assert(r->allocated);
    if (!populate_write_known() || ap_under_valgrind())
        return;
    cr_assert_eq(r->in[0], r->total, "proved: %zu of %zu pages present", r->in[0], r->total);
    cr_assert_leq(r->in[1], 2, "after a callback: %zu of %zu pages present", r->in[1], r->total);
    cr_assert_leq(r->in[2], 2, "a later block: %zu of %zu pages present", r->in[2], r->total);
}

/* Page faults taken by this thread from now on (exceptions only: pages a
 * system call makes present are not counted), or -1 where counters are not
 * allowed. */
static int fault_counter(void)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof(a));
    a.type = PERF_TYPE_SOFTWARE;
    a.size = sizeof(a);
    a.config = PERF_COUNT_SW_PAGE_FAULTS;
    a.disabled = 0;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
}

static long faults_read(int fd)
{
    uint64_t v = 0;
    return read(fd, &v, sizeof(v)) == (ssize_t)sizeof(v) ? (long)v : -1;
}

/*
 * A private file mapping of PAGES pages, each present and still the file's
 * (read once), with one 3-byte write per page: one window. Returns the
 * exceptions taken while it was written (-1: not countable) and the stats.
 */
static long write_fresh_file_pages(unsigned flags, struct ap_poke_stats *st)
{
    enum { PAGES = 6 };
    size_t pg = pgsz();
    int fd = (int)syscall(SYS_memfd_create, "altpatch-prefault", 0u);
    cr_assert_geq(fd, 0);
    uint8_t *buf = malloc(PAGES * pg);
    cr_assert_not_null(buf);
    memset(buf, 0xcc, PAGES * pg);
    cr_assert_eq(write(fd, buf, PAGES * pg), (ssize_t)(PAGES * pg));
    free(buf);
    uint8_t *p = mmap(NULL, PAGES * pg, PROT_READ, MAP_PRIVATE, fd, 0);
    cr_assert_neq(p, MAP_FAILED);
    close(fd);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < PAGES; i++)
        sink ^= p[i * pg]; /* present, shared with the file */
    (void)sink;
    struct ap_write w[PAGES];
    for (size_t i = 0; i < PAGES; i++)
        w[i] = wr(p + i * pg + 100, CC3, NEW3, 3);
    /* the writer's own first calls (the maps descriptor, its buffers) made
     * before the count: the count is the window's */
    settle_writer(flags);
    int pf = fault_counter();
    long before = pf >= 0 ? faults_read(pf) : -1;
    cr_assert_eq(ap_poke(w, PAGES, flags, st), 0);
    long taken = pf >= 0 && before >= 0 ? faults_read(pf) - before : -1;
    if (pf >= 0)
        close(pf);
    for (size_t i = 0; i < PAGES; i++) {
        cr_assert_eq(w[i].result, ALTPATCH_REASON_NONE);
        cr_assert(w[i].wrote);
        cr_assert_arr_eq(p + i * pg + 100, NEW3, 3);
        cr_assert_eq(p[i * pg + 99], 0xcc);
        cr_assert_eq(p[i * pg + 103], 0xcc);
    }
    char perms[5];
    perms_of(p, perms);
    cr_assert_str_eq(perms, "r--p", "protection after poke: %s", perms);
    cr_assert_eq(st->pages, PAGES);
    cr_assert_eq(st->mprotect_writes, 1);
    munmap(p, PAGES * pg);
    return taken;
}

/*
 * A window of 6 pages: told that no filter runs (AP_POKE_SECCOMP_OFF), the
 * window asks PR_GET_SECCOMP itself and, answered 0, advises all its pages
 * at once (two calls more, no store faults); under a filter (the caller's
 * word then stale) it asks and gives no advice (one call more, a fault per
 * page). Without the caller's word it asks neither: the same calls as the
 * plain window.
 */
Test(poke, prefault_breaks_copy_on_write_in_one_call)
{
    bool filtered = !no_filter(); /* a container's filter, say */
    bool valgrind = ap_under_valgrind();
    struct ap_poke_stats plain = {0}, pre_st = {0}, nofilter = {0};
    long f_plain = write_fresh_file_pages(AP_POKE_SECCOMP_OFF, &plain);
    long f_pre = write_fresh_file_pages(AP_POKE_SECCOMP_OFF | AP_POKE_PREFAULT, &pre_st);
    long f_nofilter = write_fresh_file_pages(AP_POKE_PREFAULT, &nofilter);
    cr_log_info("system calls: %lu plain, %lu prefaulted, %lu without the word",
                (unsigned long)plain.syscalls, (unsigned long)pre_st.syscalls,
                (unsigned long)nofilter.syscalls);
    cr_assert_eq(pre_st.syscalls, plain.syscalls + (filtered ? 1 : 2),
                 "the window's ask of the mode%s: %lu, %lu", filtered ? "" : " and its advice",
                 (unsigned long)plain.syscalls, (unsigned long)pre_st.syscalls);
    cr_assert_eq(pre_st.bytes, plain.bytes);
    /* the pages are not executable: no probe of RW -> RX, no ask of the
     * mode by the writer; without the word, nothing asked in the window */
    cr_assert_eq(nofilter.syscalls, plain.syscalls,
                 "no ask, no advice without the word: %lu, %lu",
                 (unsigned long)plain.syscalls, (unsigned long)nofilter.syscalls);
    bool known = populate_write_known();
    cr_log_info("page faults in the window: %ld plain, %ld prefaulted, %ld without the word",
                f_plain, f_pre, f_nofilter);
    if (f_plain >= 0 && f_pre >= 0 && f_nofilter >= 0 && !valgrind) {
        cr_assert_geq(f_plain, 6, "each of the 6 pages faults on its first store: %ld", f_plain);
        cr_assert_geq(f_nofilter, 6, "no advice without the word: %ld faults", f_nofilter);
        if (filtered)
            cr_assert_geq(f_pre, 6, "no advice under a filter: %ld faults", f_pre);
        else if (known)
            cr_assert_lt(f_pre, 3, "made private in one call, no store faults: %ld", f_pre);
    }
}

/* A window of 3 pages asks nothing more: its faults cost no more than the call. */
Test(poke, prefault_skipped_for_three_pages)
{
    uint8_t *p = rx_pages(3), *q = rx_pages(3);
    struct ap_write w[3], v[3];
    for (size_t i = 0; i < 3; i++) {
        w[i] = wr(p + i * pgsz() + 100, CC3, NEW3, 3);
        v[i] = wr(q + i * pgsz() + 100, CC3, NEW3, 3);
    }
    struct ap_poke_stats a = {0}, b = {0};
    /* the process's first batches ask what later ones keep */
    settle_writer(AP_POKE_SECCOMP_OFF);
    cr_assert_eq(ap_poke(w, 3, AP_POKE_SECCOMP_OFF, &a), 0);
    cr_assert_eq(ap_poke(v, 3, AP_POKE_SECCOMP_OFF | AP_POKE_PREFAULT, &b), 0);
    for (size_t i = 0; i < 3; i++)
        cr_assert_arr_eq(q + i * pgsz() + 100, NEW3, 3);
    cr_assert_eq(a.mprotect_writes, 1);
    cr_assert_eq(b.mprotect_writes, 1);
    cr_assert_eq(b.syscalls, a.syscalls, "%lu, %lu", (unsigned long)a.syscalls,
                 (unsigned long)b.syscalls);
    assert_rx(q);
}

/* ------------------------------------------------------------------------- */
/* Spans: a later decision's writes through /proc/self/mem                   */
/* ------------------------------------------------------------------------- */

/* A later decision's batch, no filter (the caller's proof): AP_POKE_SPANS. */
#define SPANS (AP_POKE_SECCOMP_OFF | AP_POKE_SPANS)

/** 0xcc pages holding a byte pattern between the sites, so that bytes written back as read can be told. */
static uint8_t *patterned_pages(size_t pages)
{
    uint8_t *p = mmap(NULL, pages * pgsz(), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED);
    for (size_t i = 0; i < pages * pgsz(); i++)
        p[i] = (uint8_t)(i * 7 + 1);
    cr_assert_eq(mprotect(p, pages * pgsz(), PROT_READ | PROT_EXEC), 0);
    return p;
}

/*
 * Sixty writes 3 bytes long every 100 bytes over two pages: one span, so one
 * pwrite and no window; every site holds its new bytes and every byte between
 * them what it held. Where this kernel refuses such writes (the oracle: the
 * operation on a page of the test's own), the writes go through a window.
 */
Test(poke, spans_write_nearby_sites_in_one_pwrite)
{
    const size_t n = 60;
    uint8_t *p = patterned_pages(2), *before = malloc(2 * pgsz());
    cr_assert(before);
    struct ap_write w[60];
    uint8_t old[60][3];
    for (size_t i = 0; i < n; i++) {
        memcpy(old[i], p + 40 + i * 100, 3);
        w[i] = wr(p + 40 + i * 100, old[i], NEW3, 3);
    }
    memcpy(before, p, 2 * pgsz());
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, n, SPANS, &st), 0);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(w[i].result, ALTPATCH_REASON_NONE);
        cr_assert(w[i].wrote, "write %zu", i);
        memcpy(before + 40 + i * 100, NEW3, 3);
    }
    cr_assert_arr_eq(p, before, 2 * pgsz(), "the sites new, every other byte as it was");
    cr_assert_eq(st.bytes, 3 * n);
    cr_assert_eq(st.pages, 2);
    if (ap_procmem_written_text_runs()) {
        cr_assert_eq(st.procmem_writes, 1, "one span: %u pwrites", st.procmem_writes);
        cr_assert_eq(st.mprotect_writes, 0);
    } else {
        cr_assert_eq(st.procmem_writes, 0);
        cr_assert_eq(st.mprotect_writes, 1, "refused spans leave the window");
    }
    assert_rx(p);
    assert_rx(p + pgsz());
    free(before);
}

/*
 * The spans are counted over the pending writes: ten writes already done,
 * one every 1200 bytes across three pages (ten spans, were they pending,
 * more than the window's pages plus two), around two pending ones 50 bytes
 * apart: one span, one pwrite, no window.
 */
Test(poke, spans_count_only_the_pending_writes)
{
    if (!ap_procmem_written_text_runs())
        cr_skip_test(AP_PROCMEM_NOT_RUN);
    settle_writer(SPANS);
    uint8_t *p = rx_pages(3);
    struct ap_write w[12];
    size_t n = 0;
    for (size_t i = 0; i < 10; i++) {
        if (i == 5) {
            w[n++] = wr(p + 6000, CC3, NEW3, 3);
            w[n++] = wr(p + 6050, CC3, NEW3, 3);
        }
        w[n++] = wr(p + 100 + 1200 * i, NEW3, CC3, 3); /* memory holds new: done */
    }
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, n, SPANS, &st), 0);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(w[i].result, ALTPATCH_REASON_NONE, "write %zu", i);
        cr_assert_eq(w[i].wrote, w[i].addr == (uintptr_t)(p + 6000) ||
                                     w[i].addr == (uintptr_t)(p + 6050), "write %zu", i);
    }
    cr_assert_arr_eq(p + 6000, NEW3, 3);
    cr_assert_arr_eq(p + 6050, NEW3, 3);
    cr_assert_eq(p[6003], 0xcc);
    cr_assert_eq(st.bytes, 6);
    cr_assert_eq(st.procmem_writes, 1, "one span: %u pwrites", st.procmem_writes);
    cr_assert_eq(st.mprotect_writes, 0, "a window opened");
    cr_assert_eq(st.pages, 1);
    assert_rx(p + pgsz());
}

/*
 * In one span: a site already new is skipped, one holding neither old nor new
 * is MEM_MISMATCH and keeps its bytes, the others land; the batch asks fewer
 * system calls than the same writes in a window (no PR_GET_MDWE, no signal
 * mask, no mprotect pair).
 */
Test(poke, spans_check_every_site_and_cost_fewer_calls)
{
    if (!ap_procmem_written_text_runs())
        cr_skip_test(AP_PROCMEM_NOT_RUN);
    uint8_t *p = rx_pages(1), *q = rx_pages(1);
    static const uint8_t ODD3[3] = {0x11, 0x22, 0x33}, ODDNEW3[3] = {0x44, 0x55, 0x66};
    settle_writer(SPANS); /* the questions asked once, spans' too */
    struct ap_write w[4], v[4];
    for (size_t i = 0; i < 4; i++) {
        w[i] = wr(p + 16 + i * 32, CC3, NEW3, 3);
        v[i] = wr(q + 16 + i * 32, CC3, NEW3, 3);
    }
    w[1].old = ODD3; /* memory holds 0xcc: neither */
    w[1].new = ODDNEW3;
    w[2] = wr(p + 16 + 2 * 32, NEW3, CC3, 3); /* memory holds new already */
    struct ap_poke_stats a = {0}, b = {0};
    cr_assert_eq(ap_poke(w, 4, SPANS, &a), 0);
    cr_assert_eq(ap_poke(v, 4, AP_POKE_SECCOMP_OFF, &b), 0);
    cr_assert(w[0].wrote && w[3].wrote);
    cr_assert_arr_eq(p + 16, NEW3, 3);
    cr_assert_arr_eq(p + 16 + 3 * 32, NEW3, 3);
    cr_assert_eq(w[1].result, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_not(w[1].wrote);
    cr_assert_arr_eq(p + 16 + 32, CC3, 3, "a mismatch keeps its bytes");
    cr_assert_eq(w[2].result, ALTPATCH_REASON_NONE);
    cr_assert_not(w[2].wrote);
    cr_assert_arr_eq(p + 16 + 2 * 32, CC3, 3);
    cr_assert_eq(a.bytes, 6);
    cr_assert_eq(a.procmem_writes, 1);
    cr_assert_eq(a.mprotect_writes, 0);
    cr_assert_eq(b.mprotect_writes, 1);
    cr_log_info("system calls: spans %lu, window %lu", (unsigned long)a.syscalls,
                (unsigned long)b.syscalls);
    cr_assert_lt(a.syscalls, b.syscalls, "spans %lu, window %lu", (unsigned long)a.syscalls,
                 (unsigned long)b.syscalls);
    assert_rx(p);
}

/*
 * Writes far apart (more than the spans' gap) need more pwrites than the
 * window has pages plus two: one window instead. Without the caller's proof
 * that no filter runs, spans are not taken either (a filter may kill the
 * process for the pwrite).
 */
Test(poke, scattered_writes_and_unproven_batches_open_a_window)
{
    uint8_t *p = rx_pages(1), *q = rx_pages(2);
    struct ap_write w[4], v[2];
    for (size_t i = 0; i < 4; i++)
        w[i] = wr(p + i * 1100, CC3, NEW3, 3);
    v[0] = wr(q + 100, CC3, NEW3, 3);
    v[1] = wr(q + pgsz() + 100, CC3, NEW3, 3);
    struct ap_poke_stats a = {0}, b = {0};
    cr_assert_eq(ap_poke(w, 4, SPANS, &a), 0);
    cr_assert_eq(ap_poke(v, 2, AP_POKE_SPANS, &b), 0);
    for (size_t i = 0; i < 4; i++)
        cr_assert_arr_eq(p + i * 1100, NEW3, 3);
    cr_assert_arr_eq(q + 100, NEW3, 3);
    cr_assert_arr_eq(q + pgsz() + 100, NEW3, 3);
    cr_assert_eq(a.mprotect_writes, 1, "four spans for one page: a window");
    cr_assert_eq(a.procmem_writes, 0);
    cr_assert_eq(b.mprotect_writes, 1, "no proof: a window");
    cr_assert_eq(b.procmem_writes, 0);
    assert_rx(p);
    assert_rx(q);
}

/* Text in a shared mapping is still never written, spans or not. */
Test(poke, spans_never_write_a_shared_mapping)
{
    uint8_t *p = mmap(NULL, pgsz(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED);
    memset(p, 0xcc, pgsz());
    cr_assert_eq(mprotect(p, pgsz(), PROT_READ | PROT_EXEC), 0);
    struct ap_write w[2] = {wr(p + 8, CC3, NEW3, 3), wr(p + 40, CC3, NEW3, 3)};
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 2, SPANS, &st), 0);
    for (size_t i = 0; i < 2; i++) {
        cr_assert_eq(w[i].result, ALTPATCH_REASON_WRITE_DENIED);
        cr_assert_not(w[i].wrote);
    }
    cr_assert_arr_eq(p + 8, CC3, 3);
    cr_assert_arr_eq(p + 40, CC3, 3);
    cr_assert_eq(st.procmem_writes + st.mprotect_writes, 0);
}

/*
 * A write through /proc/self/mem that the kernel cuts short (the site's
 * second page cannot be written: a shared mapping, which it refuses to
 * copy-on-write) has its first bytes put back: the site holds its old bytes
 * whole, WRITE_DENIED, not a mix of old and new.
 */
Test(poke, procmem_write_cut_short_puts_the_site_back)
{
    if (!ap_procmem_can_write_text())
        cr_skip_test(AP_PROCMEM_DENIED);
    uint8_t *p = rx_pages(2);
    uint8_t *s = mmap(p + pgsz(), pgsz(), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    cr_assert(s == p + pgsz());
    memset(s, 0xcc, pgsz());
    cr_assert_eq(mprotect(s, pgsz(), PROT_READ | PROT_EXEC), 0);
    static const uint8_t CC8[8] = {0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc};
    static const uint8_t NEW8[8] = {0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00};
    struct ap_write w = wr(p + pgsz() - 3, CC8, NEW8, 8); /* 3 bytes private, 5 shared */
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(&w, 1, AP_POKE_PROCMEM_ONLY, &st), 0);
    cr_assert_eq(w.result, ALTPATCH_REASON_WRITE_DENIED);
    cr_assert_not(w.wrote);
    cr_assert_arr_eq(p + pgsz() - 3, CC8, 8, "the site whole as it was");
    cr_assert_eq(st.bytes, 0);
}

/*
 * A write overlapping the one before it is checked against memory with that
 * one's bytes in it, as the window's copy would (it starts a span of its
 * own, after the first is written).
 */
Test(poke, spans_check_an_overlapping_write_after_the_one_before)
{
    uint8_t *p = rx_pages(1);
    static const uint8_t NEW4[4] = {0x0f, 0x1f, 0x40, 0x00};
    static const uint8_t OLD2[3] = {0x40, 0x00, 0xcc}; /* memory once NEW4 is in */
    static const uint8_t NEW2[3] = {0x90, 0x90, 0x90};
    static const uint8_t CC4[4] = {0xcc, 0xcc, 0xcc, 0xcc};
    struct ap_write w[2] = {wr(p + 10, CC4, NEW4, 4), wr(p + 12, OLD2, NEW2, 3)};
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 2, SPANS, &st), 0);
    cr_assert(w[0].wrote && w[1].wrote);
    static const uint8_t WANT[5] = {0x0f, 0x1f, 0x90, 0x90, 0x90};
    cr_assert_arr_eq(p + 10, WANT, 5);
    cr_assert_eq(p[15], 0xcc);
    if (ap_procmem_written_text_runs())
        cr_assert_eq(st.procmem_writes, 2, "one span each: %u", st.procmem_writes);
    assert_rx(p);
}

/*
 * Two spans over a page boundary, one pwrite each: where no write lies
 * across the boundary, no more; where one does (the kernel could cut it
 * there), the signal mask around the pwrite, two system calls more.
 */
Test(poke, spans_block_signals_only_around_a_write_across_pages)
{
    if (!ap_procmem_written_text_runs())
        cr_skip_test(AP_PROCMEM_NOT_RUN);
    settle_writer(SPANS);
    uint8_t *p = rx_pages(2), *q = rx_pages(2);
    size_t pg = pgsz();
    struct ap_write w[2] = {wr(p + pg - 50, CC3, NEW3, 3), wr(p + pg + 10, CC3, NEW3, 3)};
    struct ap_write v[2] = {wr(q + pg - 1, CC3, NEW3, 3), wr(q + pg + 10, CC3, NEW3, 3)};
    struct ap_poke_stats a = {0}, b = {0};
    cr_assert_eq(ap_poke(w, 2, SPANS, &a), 0);
    cr_assert_eq(ap_poke(v, 2, SPANS, &b), 0);
    for (size_t i = 0; i < 2; i++) {
        cr_assert(w[i].wrote && v[i].wrote, "write %zu", i);
        cr_assert_arr_eq((const uint8_t *)w[i].addr, NEW3, 3);
        cr_assert_arr_eq((const uint8_t *)v[i].addr, NEW3, 3);
    }
    cr_assert_eq(a.procmem_writes, 1);
    cr_assert_eq(b.procmem_writes, 1);
    cr_assert_eq(b.syscalls, a.syscalls + 2, "no write across: %lu, one across: %lu",
                 (unsigned long)a.syscalls, (unsigned long)b.syscalls);
    assert_rx(q);
    assert_rx(q + pg);
}

/* Spans of writes the caller compared with memory (AP_POKE_CHECKED). */
#define CHECKED (SPANS | AP_POKE_CHECKED)

/*
 * The caller's word is taken: under AP_POKE_CHECKED a write in a span is
 * not compared again, so one whose memory holds neither old nor new (which
 * the caller would never hand over) is written; the same batch without the
 * flag finds the mismatch. Every other write lands alike.
 */
Test(poke, spans_take_the_callers_compared_writes_as_they_come)
{
    if (!ap_procmem_written_text_runs())
        cr_skip_test(AP_PROCMEM_NOT_RUN);
    settle_writer(SPANS);
    static const uint8_t ODD3[3] = {0x11, 0x22, 0x33};
    uint8_t *p = rx_pages(1), *q = rx_pages(1);
    struct ap_write w[4], v[4];
    for (size_t i = 0; i < 4; i++) {
        w[i] = wr(p + 16 + i * 32, CC3, NEW3, 3);
        v[i] = wr(q + 16 + i * 32, CC3, NEW3, 3);
    }
    w[2].old = v[2].old = ODD3; /* memory holds 0xcc: neither */
    struct ap_poke_stats a = {0}, b = {0};
    cr_assert_eq(ap_poke(w, 4, CHECKED, &a), 0);
    cr_assert_eq(ap_poke(v, 4, SPANS, &b), 0);
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(w[i].result, ALTPATCH_REASON_NONE, "write %zu", i);
        cr_assert(w[i].wrote, "write %zu", i);
        cr_assert_arr_eq(p + 16 + i * 32, NEW3, 3, "write %zu", i);
    }
    cr_assert_eq(a.bytes, 12);
    cr_assert_eq(a.procmem_writes, 1);
    cr_assert_eq(v[2].result, ALTPATCH_REASON_MEM_MISMATCH, "compared without the flag");
    cr_assert_arr_eq(q + 16 + 2 * 32, CC3, 3);
    cr_assert_eq(b.bytes, 9);
    cr_assert_eq(a.syscalls, b.syscalls, "%lu, %lu", (unsigned long)a.syscalls,
                 (unsigned long)b.syscalls);
    assert_rx(p);
}

/*
 * The caller's comparisons hold only where nothing of the batch was written
 * since: a write below the end of the one before it (out of order, or
 * overlapping it) and a window's first write below the end of a window
 * written before are compared again, as without the flag.
 */
Test(poke, spans_compare_again_what_the_batch_may_have_written)
{
    if (!ap_procmem_written_text_runs())
        cr_skip_test(AP_PROCMEM_NOT_RUN);
    settle_writer(SPANS);
    static const uint8_t ODD3[3] = {0x11, 0x22, 0x33};
    /* out of order in one page: the second write compared, a mismatch */
    uint8_t *p = rx_pages(1);
    struct ap_write w[2] = {wr(p + 200, CC3, NEW3, 3), wr(p + 100, ODD3, NEW3, 3)};
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, 2, CHECKED, &st), 0);
    cr_assert(w[0].wrote);
    cr_assert_arr_eq(p + 200, NEW3, 3);
    cr_assert_eq(w[1].result, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_not(w[1].wrote);
    cr_assert_arr_eq(p + 100, CC3, 3);

    /* overlapping the write before: checked with that one's bytes in it */
    uint8_t *o = rx_pages(1);
    static const uint8_t NEW4[4] = {0x0f, 0x1f, 0x40, 0x00};
    static const uint8_t STALE2[3] = {0xcc, 0xcc, 0xcc}; /* what the caller saw */
    static const uint8_t NEW2[3] = {0x90, 0x90, 0x90};
    static const uint8_t CC4[4] = {0xcc, 0xcc, 0xcc, 0xcc};
    struct ap_write u[2] = {wr(o + 10, CC4, NEW4, 4), wr(o + 12, STALE2, NEW2, 3)};
    cr_assert_eq(ap_poke(u, 2, CHECKED, &st), 0);
    cr_assert(u[0].wrote);
    cr_assert_eq(u[1].result, ALTPATCH_REASON_MEM_MISMATCH, "the stale comparison not taken");
    cr_assert_arr_eq(o + 10, NEW4, 4);
    cr_assert_eq(o[14], 0xcc);

    /* a write before it lies across a change of protection (written on
     * its own, compared); the next, in the page after, overlaps it: that
     * window's first write lies below the end of the one before */
    uint8_t *t = rx_pages(2);
    cr_assert_eq(mprotect(t + pgsz(), pgsz(), PROT_READ), 0);
    struct ap_write v[2] = {wr(t + pgsz() - 2, CC4, NEW4, 4), wr(t + pgsz(), STALE2, NEW2, 3)};
    cr_assert_eq(ap_poke(v, 2, CHECKED, &st), 0);
    cr_assert(v[0].wrote);
    cr_assert_arr_eq(t + pgsz() - 2, NEW4, 4);
    cr_assert_eq(v[1].result, ALTPATCH_REASON_MEM_MISMATCH);
    cr_assert_eq(t[pgsz() + 2], 0xcc);
}

/* More writes in one window than the spans pay for: the window. */
Test(poke, a_window_of_very_many_writes_is_opened)
{
    const size_t n = 32769, pages = (n * 4 + pgsz() - 1) / pgsz();
    uint8_t *p = rx_pages(pages);
    struct ap_write *w = calloc(n, sizeof(*w));
    cr_assert(w);
    for (size_t i = 0; i < n; i++)
        w[i] = wr(p + 4 * i, CC3, NEW3, 3);
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, n, SPANS, &st), 0);
    for (size_t i = 0; i < n; i += 4096)
        cr_assert_arr_eq(p + 4 * i, NEW3, 3);
    cr_assert_arr_eq(p + 4 * (n - 1), NEW3, 3);
    cr_assert_eq(st.bytes, 3 * n);
    cr_assert_eq(st.mprotect_writes, 1);
    cr_assert_eq(st.procmem_writes, 0);
    free(w);
}

/* Whether the page holding @p a is still a page of the page cache (pagemap bit 61: file page). */
static bool file_page(const void *a)
{
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    uint64_t e = 0;
    cr_assert_eq(pread(fd, &e, 8, (off_t)((uintptr_t)a / pgsz() * 8)), 8);
    close(fd);
    return (e >> 61) & 1;
}

/* @p pages pages of 0xcc in a private PROT_READ|PROT_EXEC mapping of a file, each read in. */
static uint8_t *file_text_pages(size_t pages)
{
    char path[] = "/tmp/poke-text-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unlink(path);
    uint8_t *buf = malloc(pages * pgsz());
    cr_assert(buf);
    memset(buf, 0xcc, pages * pgsz());
    cr_assert_eq(write(fd, buf, pages * pgsz()), (ssize_t)(pages * pgsz()));
    free(buf);
    uint8_t *p = mmap(NULL, pages * pgsz(), PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    cr_assert(p != MAP_FAILED);
    close(fd);
    for (size_t i = 0; i < pages; i++) {
        cr_assert_eq(*(volatile uint8_t *)(p + i * pgsz()), 0xcc); /* read in */
        cr_assert(file_page(p + i * pgsz()), "page %zu is the file's", i);
    }
    return p;
}

/*
 * Writes on three pages of file text: pending ones at @p first on page 0 and
 * at 16 on page 2; on page 1, at the @p nskip offsets, writes whose memory
 * holds new already. Returns the pages counted; *@p copied: whether page 1
 * stopped being the file's page (someone wrote it).
 */
static uint64_t pages_around_skipped(unsigned flags, size_t first, const size_t *skip,
                                     size_t nskip, bool *copied)
{
    uint8_t *p = file_text_pages(3);
    size_t pg = pgsz(), n = 0;
    struct ap_write w[8];
    w[n++] = wr(p + first, CC3, NEW3, 3);
    for (size_t i = 0; i < nskip; i++)
        w[n++] = wr(p + pg + skip[i], NEW3, CC3, 3);
    w[n++] = wr(p + 2 * pg + 16, CC3, NEW3, 3);
    struct ap_poke_stats st = {0};
    cr_assert_eq(ap_poke(w, n, flags, &st), 0);
    cr_assert(w[0].wrote && w[n - 1].wrote);
    for (size_t i = 1; i + 1 < n; i++)
        cr_assert(!w[i].wrote && w[i].result == ALTPATCH_REASON_NONE);
    cr_assert_arr_eq(p + first, NEW3, 3);
    cr_assert_arr_eq(p + 2 * pg + 16, NEW3, 3);
    *copied = !file_page(p + pg);
    return st.pages;
}

/*
 * A page that holds only writes already done is neither written nor
 * counted, spans or window: a span runs from its first pending write to its
 * last, and two pending writes of one span lie at most 1 KiB apart. One
 * write already done near the end of page 1, 109 bytes before the pending
 * write on page 2; and four, one every 1000 bytes across page 1, between
 * pending writes at the end of page 0 and the start of page 2.
 */
Test(poke, spans_leave_a_page_of_writes_already_done_alone)
{
    if (!ap_procmem_written_text_runs())
        cr_skip_test(AP_PROCMEM_NOT_RUN);
    static const size_t one[] = {4000}, four[] = {500, 1500, 2500, 3500};
    const struct {
        size_t first;
        const size_t *skip;
        size_t nskip;
    } cases[] = {{16, one, 1}, {0, four, 4}}; /* 0: 8 bytes before page 0 ends */
    for (size_t c = 0; c < 2; c++) {
        bool cw, cs;
        size_t first = cases[c].first ? cases[c].first : pgsz() - 8;
        uint64_t pw = pages_around_skipped(AP_POKE_SECCOMP_OFF, first, cases[c].skip,
                                           cases[c].nskip, &cw);
        uint64_t ps = pages_around_skipped(SPANS, first, cases[c].skip, cases[c].nskip, &cs);
        cr_assert_eq(pw, 2, "window, case %zu: %lu pages", c, (unsigned long)pw);
        cr_assert_not(cw, "the window wrote page 1");
        cr_assert_eq(ps, 2, "spans, case %zu: %lu pages", c, (unsigned long)ps);
        cr_assert_not(cs, "spans wrote page 1 (case %zu), which holds no pending write", c);
    }
}

/*
 * Spans refused by the kernel (a seccomp filter answering EIO to pwrite64
 * stands in for proc_mem.force_override) hand their writes to the window,
 * which counts only the pages where writes landed: here one window of four
 * writes on page x, then a group whose first write is done already and whose
 * pending write lies on its second page.
 */
Test(poke, the_window_after_refused_spans_counts_only_its_pages)
{
    if (!ap_procmem_written_text_runs())
        cr_skip_test(AP_PROCMEM_NOT_RUN);
    /* the spans' oracle asked (yes) before the filter: the spans below are tried */
    uint8_t *u = rx_pages(1);
    struct ap_write uw = wr(u + 8, CC3, NEW3, 3);
    struct ap_poke_stats ust = {0};
    cr_assert_eq(ap_poke(&uw, 1, SPANS, &ust), 0);
    cr_assert_eq(ust.procmem_writes, 1);
    settle_writer(SPANS);
    ap_seccomp_require(ap_seccomp_refuse(SYS_pwrite64, EIO));
    size_t pg = pgsz();
    uint64_t pages[2], syscalls[2];
    for (int k = 0; k < 2; k++) {
        uint8_t *x = rx_pages(4);
        cr_assert_eq(munmap(x + pg, pg), 0); /* x: page 0, q: pages 2 and 3 */
        uint8_t *q = x + 2 * pg;
        struct ap_write w[6];
        for (size_t i = 0; i < 4; i++) /* four spans on one page: a window */
            w[i] = wr(x + 1100 * i, CC3, NEW3, 3);
        w[4] = wr(q + 16, NEW3, CC3, 3);
        w[5] = wr(q + pg + 2000, CC3, NEW3, 3);
        struct ap_poke_stats st = {0};
        cr_assert_eq(ap_poke(w, 6, k ? SPANS : AP_POKE_SECCOMP_OFF, &st), 0);
        for (int i = 0; i < 6; i++)
            cr_assert(w[i].wrote == (i != 4), "write %d", i);
        cr_assert_eq(st.procmem_writes, 0);
        cr_assert_eq(st.mprotect_writes, 2, "the window of four writes, the refused span's");
        pages[k] = st.pages;
        syscalls[k] = st.syscalls;
    }
    cr_assert_eq(pages[0], 2);
    cr_assert_eq(pages[1], 2, "after refused spans: %lu pages", (unsigned long)pages[1]);
    /* the spans were tried: the refused pwrite (and the open and close of
     * /proc/self/mem) on top of the window's calls */
    cr_assert_gt(syscalls[1], syscalls[0], "%lu, %lu", (unsigned long)syscalls[1],
                 (unsigned long)syscalls[0]);
}
