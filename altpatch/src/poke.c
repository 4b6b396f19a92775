/* SPDX-License-Identifier: MIT */
/*
 * The writer: makes text hold new bytes. Knows nothing of x86 beyond
 * ap_sync_core() and the system call ABI.
 *
 * A batch of (address, old, new) writes is handled in four steps:
 *
 *   1. check  the writes against memory until one is pending (memory holds
 *             old, not new). None: done, no system call at all (an
 *             idempotent apply costs nothing).
 *   2. learn  each page's protection from /proc/self/maps: one PROCMAP_QUERY
 *             ioctl per mapping a window touches (Linux 6.11+), else the
 *             whole file, read once per batch.
 *   3. group  the writes from there into windows: runs of adjacent pages with
 *             the same original protection. Pages of a shared mapping are
 *             never written (that would change a file): WRITE_DENIED.
 *   4. write  each window -- unless its text was written before (4a) --:
 *             mprotect(RW) -> for each write, check and copy ->
 *             mprotect(original), all inside ap_window_write(), which lives
 *             in its own section so that the code running while a page is not
 *             executable is never on a page being written. The check is the
 *             one of step 1, made right before the copy with every signal
 *             blocked: already new -> skipped; neither old nor new ->
 *             MEM_MISMATCH, untouched; old -> written. A window that would
 *             contain that section,
 *             or that the process may not make executable again (PR_SET_MDWE,
 *             or a seccomp filter or SELinux that may refuse RW -> RX: asked
 *             before the first window, ap_exec_restore_unsure()), or whose
 *             mprotect is denied, is written with pwrite() on
 *             /proc/self/mem instead (unless AP_POKE_NO_PROCMEM), each write
 *             checked right before its pwrite; when that fails too, its
 *             pending writes are WRITE_DENIED and memory is untouched.
 *   4a. spans (AP_POKE_SPANS: no module decided for the first time, no
 *             seccomp filter; pages readable, not writable): a window's
 *             writes go through /proc/self/mem in spans -- each write
 *             checked against memory, a copy of memory over a few nearby
 *             pending ones with their new bytes put in, one pwrite -- when that
 *             takes at most two pwrites more than the window has pages and
 *             the window holds at most AP_SPAN_WRITES_MAX writes, and this
 *             machine runs what such a write puts into text it ran before
 *             (ap_spans_selftest(), once); else the window. A pwrite the
 *             kernel cuts short has the first bytes of the write it cut put
 *             back (so has a fallback's).
 *
 * A page is never writable and executable at once. Signals are blocked while
 * windows are open: a handler could live on a page that is briefly not
 * executable. The caller guarantees a single thread (see apply.c); while
 * other threads run, live.c writes instead (int3 + membarrier). What both
 * writers share (the pending check, page counting, signal masking,
 * /proc/self/mem) is in writer.c (the pending check inline in host.h).
 */
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

/* AP_POKE_PREFAULT: windows of at least this many pages */
#define AP_PREFAULT_PAGES 4

#ifndef PR_GET_MDWE
#define PR_GET_MDWE 66
#endif
#ifndef PR_MDWE_REFUSE_EXEC_GAIN
#define PR_MDWE_REFUSE_EXEC_GAIN (1UL << 0)
#endif

/* ------------------------------------------------------------------------- */
/* The window routine: its own section, no calls, raw system calls           */
/* ------------------------------------------------------------------------- */

#if defined(__clang__)
#define AP_WINDOW_ATTRS                                                                    \
    __attribute__((section("altpatch_poke_text"), noinline, used,                         \
                   no_sanitize("address", "undefined"), no_stack_protector,                \
                   no_instrument_function))
#else
#define AP_WINDOW_ATTRS                                                                    \
    __attribute__((section("altpatch_poke_text"), noipa, used, no_sanitize_address,       \
                   no_sanitize_undefined, no_stack_protector, no_instrument_function))
#endif

/* Bounds of the window routine's section (the linker defines them). */
extern const char __start_altpatch_poke_text[] AP_HIDDEN;
extern const char __stop_altpatch_poke_text[] AP_HIDDEN;

/* Macros, not functions: inlining across sanitizer attributes is refused. */
#define AP_SYSCALL3(nr, a, b, c)                                                           \
    ({                                                                                     \
        long ret_;                                                                         \
        __asm__ __volatile__("syscall"                                                     \
                             : "=a"(ret_)                                                  \
                             : "0"((long)(nr)), "D"((long)(a)), "S"((long)(b)),             \
                               "d"((long)(c))                                              \
                             : "rcx", "r11", "memory");                                    \
        ret_;                                                                              \
    })

/* Unaligned word accesses for the window routine's copy (no library call). */
typedef uint64_t ap_u64u __attribute__((aligned(1), may_alias));
typedef uint32_t ap_u32u __attribute__((aligned(1), may_alias));
typedef uint16_t ap_u16u __attribute__((aligned(1), may_alias));

/** What a window wrote. */
struct ap_window_acc {
    uint64_t bytes;
    bool all; /* every write of the window with bytes was written */
};

/**
 * mprotect(RW) the window (@p prefault: then, when PR_GET_SECCOMP answers 0
 * there, every page of it made present and private in one
 * MADV_POPULATE_WRITE), then for every write of w[0..n)
 * the check and the copy, with every signal blocked and nothing else
 * running: memory holding
 * @c new -> skipped; holding @c old -> @c new stored with volatile word
 * stores (so the compiler cannot turn the copy into a memcpy call;
 * overlapping words store the same byte twice), wrote; holding neither ->
 * MEM_MISMATCH, untouched. Then mprotect back to @p prot. Sets every write's
 * result and wrote; *@p acc: bytes written, and whether every write was.
 * Returns 0; -errno when the first mprotect failed (nothing written, no write
 * looked at, the window's protection restored as far as it had changed);
 * +errno when the restoring mprotect failed even once retried (bytes written,
 * the window keeps PROT_READ|PROT_WRITE: the process is in trouble, the
 * caller reports it).
 */
static AP_WINDOW_ATTRS long ap_window_write(uintptr_t start, size_t len, long prot,
                                            struct ap_write *w, size_t n,
                                            struct ap_window_acc *acc, unsigned *calls,
                                            bool prefault)
{
    *calls = 1;
    long r = AP_SYSCALL3(SYS_mprotect, start, len, PROT_READ | PROT_WRITE);
    if (r < 0) {
        /* mprotect is not atomic across mappings: the pages before the one it
         * refused (a sealed mapping, say) may be RW now. Every page of the
         * window had @p prot: put it back everywhere (the refused part was
         * never changed and refuses again harmlessly). */
        *calls = 2;
        (void)AP_SYSCALL3(SYS_mprotect, start, len, prot);
        return r;
    }
    unsigned extra = 0;
    if (prefault) {
        /* Every page of the window made present and private at once: what
         * the first store to each would do, a page fault apiece. Changes
         * no byte; any answer (EINVAL before Linux 5.14, ENOMEM) leaves the
         * stores to fault as before. Only without a seccomp filter (one may
         * kill the process for a call it does not expect), asked here: the
         * caller's proof may be older than a print callback of the
         * application's that installed one; here nothing else runs. */
        long sc = AP_SYSCALL3(SYS_prctl, PR_GET_SECCOMP, 0, 0);
        extra = 1;
        if (sc == 0) {
            (void)AP_SYSCALL3(SYS_madvise, start, len, AP_MADV_POPULATE_WRITE);
            extra = 2;
        }
    }
    uint64_t bytes = 0;
    bool all = true;
    for (size_t i = 0; i < n; i++) {
        uintptr_t d = w[i].addr;
        const uint8_t *nw = w[i].new, *o = w[i].old;
        size_t k = w[i].len;
        int res = ALTPATCH_REASON_NONE;
        bool wrote = false;
        if (k - 4 <= 4) { /* 4..8: two overlapping words */
            uint32_t m0 = *(const ap_u32u *)d, m1 = *(const ap_u32u *)(d + k - 4);
            uint32_t n0 = *(const ap_u32u *)nw, n1 = *(const ap_u32u *)(nw + k - 4);
            if ((m0 ^ n0) | (m1 ^ n1)) {
                if ((m0 ^ *(const ap_u32u *)o) | (m1 ^ *(const ap_u32u *)(o + k - 4))) {
                    res = ALTPATCH_REASON_MEM_MISMATCH;
                } else {
                    *(volatile ap_u32u *)d = n0;
                    *(volatile ap_u32u *)(d + k - 4) = n1;
                    wrote = true;
                }
            }
        } else if (k - 9 <= 7) { /* 9..16 */
            uint64_t m0 = *(const ap_u64u *)d, m1 = *(const ap_u64u *)(d + k - 8);
            uint64_t n0 = *(const ap_u64u *)nw, n1 = *(const ap_u64u *)(nw + k - 8);
            if ((m0 ^ n0) | (m1 ^ n1)) {
                if ((m0 ^ *(const ap_u64u *)o) | (m1 ^ *(const ap_u64u *)(o + k - 8))) {
                    res = ALTPATCH_REASON_MEM_MISMATCH;
                } else {
                    *(volatile ap_u64u *)d = n0;
                    *(volatile ap_u64u *)(d + k - 8) = n1;
                    wrote = true;
                }
            }
        } else { /* 0..3, 17..: bytes */
            const uint8_t *m = (const uint8_t *)d;
            unsigned dn = 0, dold = 0;
            for (size_t j = 0; j < k; j++) {
                dn |= (unsigned)(m[j] ^ nw[j]);
                dold |= (unsigned)(m[j] ^ o[j]);
            }
            if (dn && dold) {
                res = ALTPATCH_REASON_MEM_MISMATCH;
            } else if (dn) {
                for (size_t j = 0; j < k; j++)
                    ((volatile uint8_t *)d)[j] = nw[j];
                wrote = true;
            }
        }
        w[i].result = res;
        w[i].wrote = wrote;
        bytes += wrote ? k : 0;
        all &= wrote || !k;
    }
    acc->bytes = bytes;
    acc->all = all;
    *calls = 2 + extra;
    r = AP_SYSCALL3(SYS_mprotect, start, len, prot);
    if (r < 0) {
        *calls = 3 + extra;
        r = AP_SYSCALL3(SYS_mprotect, start, len, prot);
    }
    return -r;
}

/* ------------------------------------------------------------------------- */
/* /proc/self/maps                                                           */
/* ------------------------------------------------------------------------- */

struct ap_map {
    uintptr_t start, end;
    int prot;
    bool shared;
};

/*
 * What /proc/self/maps says, learnt one mapping at a time with PROCMAP_QUERY
 * (an ioctl on the open file: the kernel answers for one address without
 * printing every mapping as text) or, where the kernel does not know that
 * ioctl (before 6.11, or an emulator's own maps file), all at once by reading
 * the file. v: the mappings learnt so far, sorted by address, disjoint.
 */
/* Mappings kept without an allocation: a first apply asks about one or two. */
#define AP_MAPS_INLINE 4

struct ap_maps {
    struct ap_map *v;   /* inl, or an allocation once more are kept */
    size_t n, cap;
    int fd;             /* /proc/self/maps while mappings are asked one by one, else -1 */
    bool kept;          /* fd is the descriptor kept from an earlier batch (never closed) */
    bool answered;      /* a PROCMAP_QUERY was answered on fd */
    uint64_t *syscalls; /* the batch's counter */
    int err;            /* -ENOMEM once an answer could not be kept: the batch stops */
    struct ap_map inl[AP_MAPS_INLINE];
};

/* PROCMAP_QUERY (include/uapi/linux/fs.h, Linux 6.11): the layout is ABI. */
struct ap_procmap_query {
    uint64_t size;
    uint64_t query_flags;
    uint64_t query_addr;
    uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
    uint32_t dev_major, dev_minor;
    uint32_t vma_name_size, build_id_size;
    uint64_t vma_name_addr, build_id_addr;
};
#define AP_PROCMAP_QUERY _IOWR('f', 17, struct ap_procmap_query)
#define AP_PROCMAP_READABLE 0x01u
#define AP_PROCMAP_WRITABLE 0x02u
#define AP_PROCMAP_EXECUTABLE 0x04u
#define AP_PROCMAP_SHARED 0x08u

/** Read what remains of @p fd (then closed) into a NUL-terminated buffer. */
static int ap_read_fd(int fd, char **out, size_t *outlen, uint64_t *syscalls)
{
    size_t cap = 16384, len = 0;
    char *buf = malloc(cap);
    int err = buf ? 0 : -ENOMEM;
    while (!err) {
        if (cap - len < 4096) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                err = -ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        (*syscalls)++;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            err = -errno;
        else if (r == 0)
            break;
        else
            len += (size_t)r;
    }
    close(fd);
    (*syscalls)++;
    if (err) {
        free(buf);
        return err;
    }
    buf[len] = '\0';
    *out = buf;
    *outlen = len;
    return 0;
}

AP_PLAIN_PATH static int ap_maps_add(struct ap_maps *m, const struct ap_map *e)
{
    if (m->n == m->cap) {
        size_t cap = m->cap > AP_MAPS_INLINE ? m->cap * 2 : 64;
        struct ap_map *v;
        if (m->v == m->inl) {
            v = malloc(cap * sizeof(*v));
            if (v)
                ap_copy_small((uint8_t *)v, (const uint8_t *)m->inl, m->n * sizeof(*v));
        } else {
            v = realloc(m->v, cap * sizeof(*v));
        }
        if (!v)
            return -ENOMEM;
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = *e;
    return 0;
}

/**
 * The hexadecimal number (1 to 16 digits, no prefix, no sign) at @p s into
 * *@p v and its end into *@p end; false when there is none or it is longer.
 * (strtoull() costs several times more: locale, bases, signs, overflow.)
 */
static bool ap_hex(const char *s, uintptr_t *v, const char **end)
{
    uint64_t x = 0;
    int n = 0;
    for (;; s++, n++) {
        unsigned c = (unsigned char)*s, d;
        if (c - '0' < 10u)
            d = c - '0';
        else if ((c | 0x20u) - 'a' < 6u)
            d = (c | 0x20u) - 'a' + 10;
        else
            break;
        if (n == 16)
            return false;
        x = x << 4 | d;
    }
    *v = (uintptr_t)x;
    *end = s;
    return n > 0;
}

/** Parse one "start-end perms ..." line; false if malformed. */
static bool ap_maps_line(const char *line, struct ap_map *e)
{
    const char *end;
    if (!ap_hex(line, &e->start, &end) || *end != '-')
        return false;
    if (!ap_hex(end + 1, &e->end, &end) || *end != ' ' || ap_strnlen(end, 5) < 5)
        return false;
    const char *p = end + 1;
    e->prot = (p[0] == 'r' ? PROT_READ : 0) | (p[1] == 'w' ? PROT_WRITE : 0) |
              (p[2] == 'x' ? PROT_EXEC : 0);
    e->shared = p[3] == 's';
    return e->end > e->start;
}

/*
 * The /proc/self/maps descriptor of an earlier batch, kept where the kernel
 * answers PROCMAP_QUERY: opening the file walks /proc and costs more than the
 * rest of a small batch's questions. It is used again only when it is still
 * this process's (a child of fork() inherits it, and it describes the
 * parent: the fork page below tells, getpid() until it is mapped or where it
 * is refused) and still the file it was (fstat(): the program may have closed
 * it and the number may name another file now). A child of fork() closes the
 * copy it inherited in the library's fork handler (ap_maps_after_fork(), from
 * apply.c), where no batch can be using it (the prepare handler held the
 * lock), and only while the number still names the file the library opened
 * (fstat() device and inode, close-on-exec): a program that closed it and
 * opened a file of its own under that number keeps its file. Where the handler could
 * not hold the lock (a fork from a signal handler on the thread in a batch,
 * or while another thread held it), and in a child that ran no handler (a raw
 * clone()), the copy is forgotten, never closed on a guess: separate opens of
 * /proc/self/maps share one inode, so the program's own may pass any identity
 * check. Callers of ap_poke() are serialized (apply.c's lock).
 */
AP_STATE static int ap_maps_kept_fd = -1;
AP_STATE static long ap_maps_kept_pid;
AP_STATE static dev_t ap_maps_kept_dev;
AP_STATE static ino_t ap_maps_kept_ino;

/*
 * Instead of getpid(): a page of its own whose first byte the process that
 * kept the descriptor set to 1, and which every child of fork() however
 * made (fork(), _Fork(), a raw clone() without CLONE_VM) finds zero-filled
 * (MADV_WIPEONFORK, Linux 4.14; the kernel keeps the advice for the
 * child's copy). A clone() that shares the address space shares the page
 * and the mappings the descriptor describes. It also tells a child in a new
 * PID namespace, whose pid may equal its parent's. Mapped by the first
 * batch that uses the kept descriptor again (getpid() said it is this
 * process's), so that a process that applies once maps nothing; NULL until
 * then, and for good where the kernel refuses the advice (getpid() then; a
 * page the kernel could not give now is asked for again next batch).
 * Only a kept descriptor gets one, so only a kernel that answers
 * PROCMAP_QUERY (Linux 6.11) and PR_GET_SECCOMP: an emulator that answers
 * every madvise() with success without doing it (qemu-user 7) answers
 * neither.
 */
AP_STATE static volatile uint8_t *ap_maps_token;
AP_STATE static bool ap_maps_token_refused;

#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18
#endif

/**
 * Map ap_maps_token, set: where no seccomp filter runs, asked right before
 * (a filter installed since the caller's proof, by a print callback say,
 * may kill the process for a call it does not expect; under one getpid()
 * stays). Three system calls, four where the advice fails. Only a kernel
 * that does not know the advice (EINVAL) refuses it for good; out of memory
 * for the page or the advice, the next batch asks again.
 */
static void ap_maps_token_make(uint64_t *syscalls, uintptr_t pgsz)
{
    if (ap_seccomp_mode(syscalls) != 0)
        return; /* asked again by the next batch, unless the mode is kept */
    void *p = mmap(NULL, pgsz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    (*syscalls)++;
    if (p == MAP_FAILED)
        return;
    long r = ap_sys(SYS_madvise, (long)p, (long)pgsz, MADV_WIPEONFORK, 0, 0);
    (*syscalls)++;
    if (r != 0) {
        munmap(p, pgsz);
        (*syscalls)++;
        ap_maps_token_refused = r == -EINVAL;
        return;
    }
    volatile uint8_t *t = p;
    *t = 1;
    ap_maps_token = t;
}

static void ap_maps_open_file(struct ap_maps *m)
{
    long fd = ap_sys(SYS_openat, AT_FDCWD, (long)"/proc/self/maps", O_RDONLY | O_CLOEXEC, 0, 0);
    (*m->syscalls)++;
    m->fd = fd < 0 ? -1 : (int)fd;
    m->kept = false;
}

/** Read the whole file from m->fd (which is closed, unless kept: then from a fresh one) into m->v. */
static int ap_maps_read_all(struct ap_maps *m)
{
    char *buf = NULL;
    size_t len = 0;
    if (m->kept) {
        /* its offset is shared with every copy of it: read a fresh one. The
         * kept one is closed, not forgotten, when it is still the library's
         * own (the kernel stopped answering on it, or the caller wants the
         * file); in a child whose fork handler forgot it, it is left alone. */
        if (ap_maps_kept_fd == m->fd) {
            ap_sys(SYS_close, m->fd, 0, 0, 0, 0);
            (*m->syscalls)++;
        }
        ap_maps_kept_fd = -1;
        ap_maps_open_file(m);
        if (m->fd < 0)
            return -EIO;
    }
    int fd = m->fd;
    m->fd = -1;
    m->n = 0;
    int err = ap_read_fd(fd, &buf, &len, m->syscalls);
    if (err)
        return err;
    for (char *line = buf; !err && line < buf + len;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        struct ap_map e;
        if (ap_maps_line(line, &e))
            err = ap_maps_add(m, &e);
        line = nl ? nl + 1 : buf + len;
    }
    free(buf);
    return err;
}

/** Open /proc/self/maps for ap_maps_find(). 0 or -errno (then nothing is known). */
static int ap_maps_open(struct ap_maps *m, uint64_t *syscalls, uintptr_t pgsz)
{
    m->v = m->inl; /* the fields one by one: the inline array needs no clearing */
    m->n = 0;
    m->cap = AP_MAPS_INLINE;
    m->fd = -1;
    m->kept = m->answered = false;
    m->syscalls = syscalls;
    m->err = 0;
    if (ap_maps_kept_fd >= 0) {
        struct stat st;
        volatile uint8_t *token = ap_maps_token;
        bool mine;
        if (token) {
            mine = *token != 0; /* zero: a child of fork() */
        } else {
            mine = ap_sys(SYS_getpid, 0, 0, 0, 0, 0) == ap_maps_kept_pid;
            (*syscalls)++;
        }
        long r = ap_sys(SYS_fstat, ap_maps_kept_fd, (long)&st, 0, 0, 0);
        (*syscalls)++;
        bool same = r == 0 && st.st_dev == ap_maps_kept_dev && st.st_ino == ap_maps_kept_ino;
        if (same && mine) {
            if (!token && !ap_maps_token_refused)
                ap_maps_token_make(syscalls, pgsz);
            m->fd = ap_maps_kept_fd;
            m->kept = true;
            return 0;
        }
        ap_maps_kept_fd = -1; /* not this process's, or not the file: forgotten */
    }
    ap_maps_open_file(m);
    return m->fd < 0 ? -EIO : 0;
}

void ap_maps_after_fork(bool close_kept)
{
    /* the number may name another file by now: the program closed the
     * library's and opened its own (a daemon's clean-up after start-up);
     * that one is left open -- unless it is another open of the same maps
     * file, which no identity check tells apart (docs/runtime.md) */
    if (ap_maps_kept_fd >= 0 && close_kept) {
        struct stat st;
        long fl = ap_sys(SYS_fcntl, ap_maps_kept_fd, F_GETFD, 0, 0, 0);
        if (fl >= 0 && (fl & FD_CLOEXEC) &&
            ap_sys(SYS_fstat, ap_maps_kept_fd, (long)&st, 0, 0, 0) == 0 &&
            st.st_dev == ap_maps_kept_dev && st.st_ino == ap_maps_kept_ino)
            ap_sys(SYS_close, ap_maps_kept_fd, 0, 0, 0, 0);
    }
    ap_maps_kept_fd = -1;
}

static void ap_maps_close(struct ap_maps *m)
{
    if (m->fd >= 0 && !m->kept) {
        struct stat st;
        if (m->answered && ap_sys(SYS_fstat, m->fd, (long)&st, 0, 0, 0) == 0) {
            if (ap_maps_token) {
                *ap_maps_token = 1; /* a child of fork() keeping its own */
            } else {
                ap_maps_kept_pid = ap_sys(SYS_getpid, 0, 0, 0, 0, 0);
                (*m->syscalls)++;
            }
            ap_maps_kept_dev = st.st_dev;
            ap_maps_kept_ino = st.st_ino;
            ap_maps_kept_fd = m->fd; /* asked again next batch */
        } else {
            ap_sys(SYS_close, m->fd, 0, 0, 0, 0);
        }
        (*m->syscalls)++;
    }
    if (m->v != m->inl)
        free(m->v);
    m->v = NULL;
    m->n = m->cap = 0;
    m->fd = -1;
}

/** Index of the first learnt mapping that ends above @p addr (m->n if none). */
static size_t ap_maps_index(const struct ap_maps *m, uintptr_t addr)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (addr >= m->v[mid].end)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/**
 * Ask the kernel for the mapping holding @p addr and insert it at index @p at
 * (clipped to the mappings learnt before it, which stay as they were). 1:
 * m->v[at] holds it; 0: nothing is mapped there, or no memory to keep the
 * answer (unknown is never guessed); -ENOTTY: the kernel does not answer
 * this query (unknown ioctl, or an answer not understood).
 */
static int ap_maps_query(struct ap_maps *m, uintptr_t addr, size_t at)
{
    struct ap_procmap_query q;
    memset(&q, 0, sizeof(q));
    q.size = sizeof(q);
    q.query_addr = addr;
    long r = ap_sys(SYS_ioctl, m->fd, (long)AP_PROCMAP_QUERY, (long)&q, 0, 0);
    (*m->syscalls)++;
    if (r == -ENOENT)
        return 0;
    if (r != 0 || q.vma_end <= q.vma_start || addr < q.vma_start || addr >= q.vma_end)
        return -ENOTTY;
    m->answered = true;
    struct ap_map e = {
        .start = (uintptr_t)q.vma_start,
        .end = (uintptr_t)q.vma_end,
        .prot = ((q.vma_flags & AP_PROCMAP_READABLE) ? PROT_READ : 0) |
                ((q.vma_flags & AP_PROCMAP_WRITABLE) ? PROT_WRITE : 0) |
                ((q.vma_flags & AP_PROCMAP_EXECUTABLE) ? PROT_EXEC : 0),
        .shared = (q.vma_flags & AP_PROCMAP_SHARED) != 0,
    };
    if (at > 0 && e.start < m->v[at - 1].end)
        e.start = m->v[at - 1].end;
    if (at < m->n && e.end > m->v[at].start)
        e.end = m->v[at].start;
    if (ap_maps_add(m, &e) < 0) {
        m->err = -ENOMEM;
        return 0;
    }
    if (at + 1 < m->n) /* else appended: nothing to move (and no call made) */
        memmove(&m->v[at + 1], &m->v[at], (m->n - 1 - at) * sizeof(*m->v));
    m->v[at] = e;
    return 1;
}

/** The mapping containing @p addr, or NULL (unmapped, or unknown). */
static const struct ap_map *ap_maps_find(struct ap_maps *m, uintptr_t addr)
{
    size_t i = ap_maps_index(m, addr);
    if (i < m->n && addr >= m->v[i].start)
        return &m->v[i];
    if (m->fd < 0)
        return NULL;
    int r = ap_maps_query(m, addr, i);
    if (r > 0)
        return &m->v[i];
    if (r == 0)
        return NULL;
    int err = ap_maps_read_all(m); /* closes m->fd; the file's answer replaces the queries' */
    if (err == -ENOMEM)
        m->err = err;
    if (err)
        return NULL;
    i = ap_maps_index(m, addr);
    return i < m->n && addr >= m->v[i].start ? &m->v[i] : NULL;
}

/** ap_maps_prot(): pages not all mapped, or with different protections. */
#define AP_PROT_MIXED (-1)
/** ap_maps_prot(): a page is a shared mapping: writing would change a file. */
#define AP_PROT_SHARED (-2)

/**
 * Protection of every page of [start, end) if they are all mapped privately
 * with one protection, else AP_PROT_MIXED or AP_PROT_SHARED.
 */
AP_PLAIN_PATH static int ap_maps_prot(struct ap_maps *m, uintptr_t start, uintptr_t end)
{
    int prot = AP_PROT_MIXED;
    for (uintptr_t a = start; a < end;) {
        const struct ap_map *e = ap_maps_find(m, a);
        if (e && e->shared)
            return AP_PROT_SHARED;
        if (!e || (prot >= 0 && e->prot != prot))
            return AP_PROT_MIXED;
        prot = e->prot;
        a = e->end;
    }
    return prot;
}

/* ------------------------------------------------------------------------- */
/* The batch                                                                 */
/* ------------------------------------------------------------------------- */

struct ap_batch {
    struct ap_write *w;
    size_t n;
    unsigned flags;
    struct ap_poke_stats *st;
    uintptr_t pgsz;
    struct ap_maps maps;
    bool maps_ok;
    int mdwe;         /* this process may not make a page executable again: 1 yes,
                       * -1 no, 0 not asked yet (asked before the first window) */
    int exec_probe;   /* 0 not asked yet; 1 RW -> probe_prot may be refused; -1 allowed */
    int probe_prot;
    int memfd;        /* /proc/self/mem, opened on first use; -1 / -errno */
    bool memfd_tried;
    bool wrote_any;
    uintptr_t torn_at; /* the first site left part written (ap_unland()), or 0 */
    bool spans_off;    /* a span's pwrite wrote nothing: windows for the rest */
    uintptr_t group_end; /* the highest end of the windows written so far (ap_write_all()) */
    uintptr_t pg_done; /* end of the last page counted in st->pages (address order) */
    size_t run_at;     /* AP_POKE_NOT_RUNS: the first of st->runs that may still meet a page */
    size_t stop;       /* the walk stopped (-ENOMEM) before w[stop] */
};

static uintptr_t ap_pg_down(const struct ap_batch *b, uintptr_t a)
{
    return a & ~(b->pgsz - 1);
}

static uintptr_t ap_pg_up(const struct ap_batch *b, uintptr_t a)
{
    return (a + b->pgsz - 1) & ~(b->pgsz - 1);
}

/* Pages of [s, e) in the runs earlier batches counted (AP_POKE_NOT_RUNS):
 * this batch's ranges come in address order, so do the runs they meet. */
static uint64_t ap_runs_met(struct ap_batch *b, uintptr_t s, uintptr_t e)
{
    const struct ap_page_run *ru = b->st->runs;
    size_t k = b->run_at, n = b->st->nruns;
    uint64_t met = 0;
    while (k < n && ru[k].end <= s)
        k++;
    b->run_at = k;
    for (; k < n && ru[k].start < e; k++) {
        uintptr_t lo = ru[k].start > s ? ru[k].start : s;
        uintptr_t hi = ru[k].end < e ? ru[k].end : e;
        met += (hi - lo) / b->pgsz;
    }
    return met;
}

/* [s, e) counted (AP_POKE_RUNS): joined to the last run when it follows it. */
static void ap_runs_add(struct ap_poke_stats *st, uintptr_t s, uintptr_t e)
{
    if (st->nruns && st->runs[st->nruns - 1].end == s) {
        st->runs[st->nruns - 1].end = e;
        return;
    }
    if (st->nruns == st->runs_cap) {
        size_t cap = st->runs_cap ? 2 * st->runs_cap : 16;
        struct ap_page_run *t = realloc(st->runs, cap * sizeof(*t));
        if (!t)
            return; /* its pages may be counted again (host.h) */
        st->runs = t;
        st->runs_cap = cap;
    }
    st->runs[st->nruns++] = (struct ap_page_run){s, e};
}

/** Count the pages of [s, e) (page-aligned) not counted yet: writes come in address order. */
AP_PLAIN_PATH static void ap_count_pages(struct ap_batch *b, uintptr_t s, uintptr_t e)
{
    if (s < b->pg_done)
        s = b->pg_done;
    if (e > s) {
        uint64_t np = (e - s) / b->pgsz;
        if (b->flags & AP_POKE_NOT_RUNS)
            np -= ap_runs_met(b, s, e);
        b->st->pages += np;
        if (b->flags & AP_POKE_RUNS)
            ap_runs_add(b->st, s, e);
    }
    if (e > b->pg_done)
        b->pg_done = e;
}

static int ap_memfd(struct ap_batch *b)
{
    if (!b->memfd_tried) {
        b->memfd_tried = true;
        b->memfd = ap_procmem_open();
        b->st->syscalls++;
    }
    return b->memfd;
}

/** True when [addr, addr + len), @p len > 0 (a pending write), lies on two
 * pages or more (a write the kernel can cut). */
static bool ap_crosses_page(uintptr_t pgsz, uintptr_t addr, size_t len)
{
    return ((addr ^ (addr + len - 1)) & ~(pgsz - 1)) != 0;
}

/** @p w (pending, memory held old) landed whole: counted. */
static void ap_landed(struct ap_batch *b, struct ap_write *w)
{
    w->wrote = true;
    b->wrote_any = true;
    ap_count_pages(b, ap_pg_down(b, w->addr), ap_pg_up(b, w->addr + w->len));
    b->st->bytes += w->len;
}

/**
 * A pwrite through /proc/self/mem that was to write @p w (pending) stopped at
 * @p done (the kernel writes page by page: a page it could not write ends the
 * call, the bytes before it written). The write's bytes before @p done are
 * put back to @c old: memory holds old again, pending. 0, or
 * -ENOTRECOVERABLE when that was refused too: the site holds part of each
 * (result WRITE_DENIED, not pending; said after the batch).
 */
static int ap_unland(struct ap_batch *b, int fd, struct ap_write *w, uintptr_t done)
{
    if (done <= w->addr)
        return 0;
    long r = ap_procmem_pwrite(fd, w->addr, w->old, done - w->addr);
    b->st->syscalls++;
    if (r == (long)(done - w->addr))
        return 0;
    w->result = ALTPATCH_REASON_WRITE_DENIED;
    if (!b->torn_at)
        b->torn_at = w->addr; /* said after the batch (ap_poke()) */
    return -ENOTRECOVERABLE;
}

/** Write one pending write through /proc/self/mem; sets its result. 0 or -ENOTRECOVERABLE. */
static int ap_write_procmem(struct ap_batch *b, struct ap_write *w)
{
    int fd = (b->flags & AP_POKE_NO_PROCMEM) ? -EPERM : ap_memfd(b);
    long r = fd;
    /* a write across a page boundary may be cut there: no handler runs it
     * half written (as in ap_span_flush()) */
    bool crosses = ap_crosses_page(b->pgsz, w->addr, w->len);
    uint64_t saved = 0;
    if (fd >= 0 && crosses) {
        ap_signals_block(AP_SIGNALS_ALL, &saved);
        b->st->syscalls += 2;
    }
    if (fd >= 0) {
        r = ap_procmem_pwrite(fd, w->addr, w->new, w->len);
        b->st->syscalls++;
    }
    int err = 0;
    if (r == (long)w->len) {
        ap_landed(b, w);
        b->st->procmem_writes++;
    } else {
        err = r > 0 ? ap_unland(b, fd, w, w->addr + (uintptr_t)r) : 0;
        w->result = ALTPATCH_REASON_WRITE_DENIED;
    }
    if (fd >= 0 && crosses)
        ap_signals_restore(&saved);
    return err;
}

/*
 * Spans (AP_POKE_SPANS): text written before is likely private and present
 * already, so an mprotect pair costs far more than the stores it allows (a
 * warm apply of 1,000 sites on two pages: 26.7 us in a window, 17.7 us in one
 * span, docs/benchmarks.md); a pwrite through /proc/self/mem of a span -- a copy
 * of memory from the first pending write to the last of a few nearby ones,
 * the new bytes put in -- writes them all in one system call, nothing made
 * writable or not executable. The bytes between the writes are written back
 * as they were read a moment before, with a single thread running (the
 * caller's proof) and nothing called in between.
 */
/* nearby: the next pending write starts at most this far past the span's
 * end (less than a page: every page of a span holds a pending write's byte) */
#define AP_SPAN_GAP 1024u
/* the most bytes one span (its buffer) holds */
#define AP_SPAN_MAX (64u * 1024u)
/* A window of more writes is opened: the span loop's check, mark and copy
 * cost more per write than the window routine's check and store (~1.2 ns
 * on the KVM guest of docs/benchmarks.md: 100,000 writes over 162 pages,
 * 523 us in spans with this limit removed against 400 us in the window),
 * which is paid back from some 40,000 writes in one window. */
#define AP_SPAN_WRITES_MAX 32768u

/** A span: the pending writes among w[first..end) (marked: wrote), their bytes [wlo, whi). */
struct ap_span {
    uintptr_t wlo, whi;
    uint64_t bytes; /* the pending writes' lengths */
    size_t first;   /* its first pending write */
    size_t end;     /* past its last write */
    bool crosses;   /* a pending write crosses a page boundary */
};

/**
 * Write span @p sp: memory [wlo, whi) copied into @p buf, the pending
 * writes' new bytes put in, one pwrite. Returns sp->end when each landed,
 * else the first write left to the window (the first not written whole: its
 * first bytes put back -- or, where that failed, the one after it, *@p err
 * -ENOTRECOVERABLE).
 */
static size_t ap_span_flush(struct ap_batch *b, int fd, const struct ap_span *sp, uint8_t *buf,
                            int *err)
{
    struct ap_write *w = b->w;
    const uintptr_t wlo = sp->wlo; /* copies: the byte stores below may alias */
    const size_t len = sp->whi - wlo, k = sp->end;
    const bool crosses = sp->crosses;
    memcpy(buf, (const void *)wlo, len);
    for (size_t i = sp->first; i < k; i++)
        if (w[i].wrote)
            ap_copy_small(buf + (w[i].addr - wlo), w[i].new, w[i].len);
    /* The kernel writes page by page and stops at a page it cannot write
     * (no memory for its copy): only a write across a page boundary can be
     * cut. Where the span holds one, signals are blocked until it is whole,
     * written or put back: a handler must not run it half written. */
    uint64_t saved = 0;
    if (crosses) {
        ap_signals_block(AP_SIGNALS_ALL, &saved);
        b->st->syscalls += 2;
    }
    long r = ap_procmem_pwrite(fd, wlo, buf, len);
    b->st->syscalls++;
    if (r == (long)len) {
        if (crosses)
            ap_signals_restore(&saved);
        /* every page of [wlo, whi) holds a pending write's byte: two of
         * them are at most AP_SPAN_GAP apart */
        b->st->procmem_writes++;
        b->st->bytes += sp->bytes;
        b->wrote_any = true;
        ap_count_pages(b, ap_pg_down(b, wlo), ap_pg_up(b, wlo + len));
        return k;
    }
    uintptr_t done = wlo + (uintptr_t)(r > 0 ? r : 0);
    if (r <= 0)
        b->spans_off = true; /* refused (a kernel that forbids it): not asked again */
    size_t resume = k;
    bool landed = false;
    for (size_t i = sp->first; i < k; i++) {
        if (!w[i].wrote)
            continue;
        w[i].wrote = false;
        if (w[i].addr + w[i].len <= done) {
            ap_landed(b, &w[i]);
            landed = true;
        } else if (resume == k) {
            resume = i;
            int e = ap_unland(b, fd, &w[i], done);
            if (e) {
                *err = e;
                resume = i + 1;
            }
        }
    }
    if (crosses)
        ap_signals_restore(&saved);
    if (landed)
        b->st->procmem_writes++;
    return resume;
}

/**
 * Write spans sp[from..to) in order. Returns @p last when each landed, else
 * the first write left to the window (the writes the spans after it marked
 * are unmarked: the window checks them again).
 */
static size_t ap_spans_flush(struct ap_batch *b, int fd, const struct ap_span *sp, size_t from,
                             size_t to, uint8_t *buf, size_t last, int *err)
{
    for (size_t s = from; s < to; s++) {
        size_t resume = ap_span_flush(b, fd, &sp[s], buf, err);
        if (resume != sp[s].end) {
            for (size_t i = resume; i < last; i++)
                b->w[i].wrote = false;
            return resume;
        }
    }
    return last;
}

/*
 * Whether this machine runs what a pwrite through /proc/self/mem puts into
 * text it has run before: 0 not asked yet, 1 it does, -1 not (or not known).
 * An emulator that translates code may go on running its old translation:
 * valgrind checks file-backed code for changes only with --smc-check=all
 * (an mprotect window is seen: it drops its translations when a page loses
 * PROT_EXEC), qemu-user write-protects the pages it translated and never
 * sees a kernel write. Asked once per process, where spans are first
 * wanted; the answer is the machine's.
 */
AP_STATE static int ap_spans_run;

/**
 * The oracle: the first page of the program's own file mapped private and
 * executable (file-backed, as text is) gets a function returning 1 through
 * @p fd, is called, gets one returning 2, is called again. True when it
 * returned 2. First the descriptor must read at that address what the page
 * holds (under an emulator whose guest addresses are not the host's, as
 * qemu-user's with a guest base, a write there would land in other memory:
 * nothing is written), and each function is called only once the page shows
 * it. Anything that fails says no: the window is used (out of descriptors or
 * memory for the question, only this time).
 */
static bool ap_spans_selftest(struct ap_batch *b, int fd)
{
    int known = __atomic_load_n(&ap_spans_run, __ATOMIC_RELAXED);
    if (known)
        return known > 0;
    uint8_t one[AP_SELFTEST_FN_LEN], two[AP_SELFTEST_FN_LEN], seen[256];
    ap_selftest_fn(one, 1);
    ap_selftest_fn(two, 2);
    bool runs = false, transient = false;
    long exe = ap_sys(SYS_openat, AT_FDCWD, (long)"/proc/self/exe", O_RDONLY | O_CLOEXEC, 0, 0);
    b->st->syscalls++;
    transient = exe == -EMFILE || exe == -ENFILE || exe == -ENOMEM;
    if (exe >= 0) {
        uint8_t *p = mmap(NULL, b->pgsz, PROT_READ | PROT_EXEC, MAP_PRIVATE, (int)exe, 0);
        transient = p == MAP_FAILED && (errno == ENOMEM || errno == EAGAIN);
        ap_sys(SYS_close, exe, 0, 0, 0, 0);
        b->st->syscalls += 2;
        size_t n = b->pgsz < sizeof(seen) ? b->pgsz : sizeof(seen);
        if (p != MAP_FAILED) {
            long (*fn)(void) = (long (*)(void))(uintptr_t)p;
            long r = ap_sys(SYS_pread64, fd, (long)seen, (long)n, (long)(uintptr_t)p, 0);
            b->st->syscalls++;
            bool same = r == (long)n && ap_equal_small(seen, p, n);
            if (same) {
                r = ap_procmem_pwrite(fd, (uintptr_t)p, one, sizeof(one));
                b->st->syscalls++;
            }
            if (same && r == (long)sizeof(one) && ap_equal_small(p, one, sizeof(one))) {
                ap_sync_core();
                if (fn() == 1) {
                    r = ap_procmem_pwrite(fd, (uintptr_t)p, two, sizeof(two));
                    b->st->syscalls++;
                    if (r == (long)sizeof(two) && ap_equal_small(p, two, sizeof(two))) {
                        ap_sync_core();
                        runs = fn() == 2;
                    }
                }
            }
            munmap(p, b->pgsz);
            b->st->syscalls++;
        }
    }
    /* out of descriptors or memory for the question: asked again next time */
    if (!transient)
        __atomic_store_n(&ap_spans_run, runs ? 1 : -1, __ATOMIC_RELAXED);
    return runs;
}

/**
 * Write the writes of w[first..last) (one window's: one private mapping,
 * readable, not writable, one protection) in spans: each write checked
 * against memory (a write that meets the pending bytes of the open span
 * after the spans so far are written); a pending one joins the open span
 * when it starts at or past the span's end, at most AP_SPAN_GAP past it,
 * and the span stays within AP_SPAN_MAX. The spans are found first and
 * written after: taken when the pending writes need at most the window's
 * pages plus two spans (spread wider, they are the window's case, and
 * nothing was written) and are at most AP_SPAN_WRITES_MAX; where spans were
 * written already (a write met the open span's bytes), the writes past that
 * budget go to the window. Returns the first write left to the window
 * (@p last: none; @p first: spans not taken), *@p err -ENOTRECOVERABLE when
 * a site was left part written.
 */
static __attribute__((noinline)) size_t ap_write_spans(struct ap_batch *b, size_t first,
                                                       size_t last, uintptr_t start,
                                                       uintptr_t end, int *err)
{
    struct ap_write *w = b->w;
    while (first < last && !w[first].len)
        ap_write_pending(&w[first++]); /* nothing to write: the outputs only */
    /* refused in this batch, or this machine keeps old translations */
    if (first == last || b->spans_off || last - first > AP_SPAN_WRITES_MAX ||
        __atomic_load_n(&ap_spans_run, __ATOMIC_RELAXED) < 0)
        return first;
    int fd = ap_memfd(b);
    if (fd < 0 || !ap_spans_selftest(b, fd))
        return first;
    size_t room = end - start < AP_SPAN_MAX ? end - start : AP_SPAN_MAX;
    size_t budget = (end - start) / b->pgsz + 2;
    struct ap_span *sp = malloc((budget + 1) * sizeof(*sp) + room);
    if (!sp)
        return first;
    uint8_t *buf = (uint8_t *)(sp + budget + 1);
    const uintptr_t pgsz = b->pgsz; /* a copy: the byte stores below may alias */
    size_t ns = 0, done = 0, k; /* spans found, spans written */
    /* The open span, in locals until it is closed into sp[ns] (a write's
     * result is a byte store, which could alias a span's fields): its bytes
     * [wlo, whi), which may not reach past lim. None open: wlo and whi are
     * AP_SPAN_NONE, so that a write meets no span and starts one. */
#define AP_SPAN_NONE UINTPTR_MAX
    uintptr_t wlo = AP_SPAN_NONE, whi = AP_SPAN_NONE, lim = 0;
    uint64_t bytes = 0;
    size_t sfirst = 0;
    bool crosses = false;
    /* compared by the caller (AP_POKE_CHECKED): pending as they come, until
     * one lies below the end of the one before (out of order, or overlapping
     * it: memory the caller saw may have been written since); not where the
     * first lies below the end of a window before (written already) */
    bool checked = (b->flags & AP_POKE_CHECKED) && w[first].addr >= b->group_end;
#define AP_SPAN_CLOSE(at)                                                                  \
    (sp[ns++] = (struct ap_span){wlo, whi, bytes, sfirst, (at), crosses},                 \
     wlo = whi = AP_SPAN_NONE)
    for (k = first; k < last; k++) {
        const uintptr_t a = w[k].addr, len = w[k].len, e = a + len;
        if (a < whi && whi != AP_SPAN_NONE) {
            checked = false;
            if (e > wlo) {
                /* memory there changes with the open span: the spans so
                 * far written first, this write checked after */
                AP_SPAN_CLOSE(k);
                size_t resume = ap_spans_flush(b, fd, sp, done, ns, buf, k, err);
                done = ns;
                if (resume != k) {
                    k = resume;
                    break;
                }
            }
        }
        if (checked) {
            w[k].result = ALTPATCH_REASON_NONE;
            if (!len) {
                w[k].wrote = false; /* nothing to write: the outputs only */
                continue;
            }
        } else if (!ap_write_pending(&w[k])) {
            continue;
        }
        /* none open, or this write below its end, too far past it, or
         * making it longer than a span may be: a new span */
        if (a < whi || a > whi + AP_SPAN_GAP || e > lim) {
            if (whi != AP_SPAN_NONE)
                AP_SPAN_CLOSE(k);
            if (ns == budget) {
                if (!done) {
                    /* spread wider than the window's pages: the window's
                     * case, nothing written */
                    for (size_t i = first; i < k; i++)
                        w[i].wrote = false;
                    free(sp);
                    return first;
                }
                k = ap_spans_flush(b, fd, sp, done, ns, buf, k, err);
                done = ns;
                break; /* w[k] and the rest to the window */
            }
            wlo = a;
            lim = a + room;
            bytes = 0;
            sfirst = k;
            crosses = false;
        }
        w[k].wrote = true; /* pending: landed or not, ap_span_flush() */
        bytes += len;
        whi = e;
        crosses |= ap_crosses_page(pgsz, a, len); /* pending: len > 0 */
    }
    if (k == last) {
        if (whi != AP_SPAN_NONE)
            AP_SPAN_CLOSE(last);
        k = ap_spans_flush(b, fd, sp, done, ns, buf, last, err);
    }
#undef AP_SPAN_CLOSE
#undef AP_SPAN_NONE
    free(sp);
    return k;
}

/** True when [start, end) shares a page with the window routine's section. */
static bool ap_overlaps_self(const struct ap_batch *b, uintptr_t start, uintptr_t end)
{
    uintptr_t s = ap_pg_down(b, (uintptr_t)__start_altpatch_poke_text);
    uintptr_t e = ap_pg_up(b, (uintptr_t)__stop_altpatch_poke_text);
    return start < e && s < end;
}

/**
 * Write the pending writes of w[first..last) through one mprotect window over
 * [start, end). Returns 0 (written), -errno when mprotect was denied (nothing
 * written: the caller may fall back), or -ENOTRECOVERABLE when the original
 * protection could not be restored (written, window left RW).
 */
static int ap_write_window(struct ap_batch *b, size_t first, size_t last, uintptr_t start,
                           uintptr_t end, int prot)
{
    struct ap_window_acc acc = {0};
    uint64_t saved = 0;
    ap_signals_block(AP_SIGNALS_ALL, &saved);
    unsigned calls = 0;
    /* windows of AP_PREFAULT_PAGES and more have their pages made private
     * in one MADV_POPULATE_WRITE (ap_window_write()); in a smaller one each
     * page's copy-on-write fault costs about what the call would (the call
     * is paid once, a fault per page) */
    bool prefault = (b->flags & (AP_POKE_PREFAULT | AP_POKE_SECCOMP_OFF)) ==
                        (AP_POKE_PREFAULT | AP_POKE_SECCOMP_OFF) &&
                    end - start >= AP_PREFAULT_PAGES * b->pgsz;
    long r = ap_window_write(start, end - start, prot, b->w + first, last - first, &acc,
                             &calls, prefault);
    ap_signals_restore(&saved);
    b->st->syscalls += calls + 2;
    if (r < 0)
        return (int)r;
    b->st->bytes += acc.bytes;
    b->wrote_any |= acc.bytes > 0;
    b->st->mprotect_writes++; /* windows opened */
    if (acc.all) { /* every page of the window holds a write */
        ap_count_pages(b, start, end);
    } else {
        for (size_t i = first; i < last; i++)
            if (b->w[i].wrote)
                ap_count_pages(b, ap_pg_down(b, b->w[i].addr),
                               ap_pg_up(b, b->w[i].addr + b->w[i].len));
    }
    return r > 0 ? -ENOTRECOVERABLE : 0;
}

/* lsm_list_modules() (Linux 6.8, include/uapi/linux/lsm.h): the syscall and SELinux's id. */
#define AP_SYS_LSM_LIST_MODULES 461
#define AP_LSM_ID_SELINUX 101

/*
 * Whether SELinux is among the security modules this kernel runs: 0 not asked
 * yet, -1 not, 1 it is, 2 the kernel cannot say (before Linux 6.8: -ENOSYS);
 * kept for the process. The list is made while the kernel boots and never
 * changes after (security/security.c: lsm_idlist[] is __ro_after_init, filled
 * by the __init security_add_hooks(); SELinux cannot be switched on later,
 * and since Linux 6.4 not off either). "Listed" says nothing about now: a
 * policy may be loaded, enforcing switched, later. A missing label on
 * /proc/self/maps cannot be kept instead: SELinux answers -EOPNOTSUPP too
 * until its policy is loaded (security/selinux/hooks.c,
 * selinux_inode_getsecurity()), and a process may live through that.
 */
AP_STATE static int ap_selinux_listed;

/**
 * Ask the kernel's list of security modules once (@p unfiltered: seccomp mode
 * 0 known now, so an unknown system call cannot be fatal). True when SELinux
 * is not among them.
 */
static bool ap_selinux_absent(struct ap_batch *b, bool unfiltered)
{
    int listed = __atomic_load_n(&ap_selinux_listed, __ATOMIC_RELAXED);
    if (listed || !unfiltered)
        return listed < 0;
    uint64_t ids[32];
    uint32_t size = sizeof(ids);
    long n = ap_sys(AP_SYS_LSM_LIST_MODULES, (long)ids, (long)&size, 0, 0, 0);
    b->st->syscalls++;
    /* No filter answers: an error is the kernel's (an older one: -ENOSYS;
     * more modules than there are ids: -E2BIG), and it answers so again. */
    listed = n < 0 || n > 32 ? 2 : -1;
    for (long i = 0; i < n && i < 32; i++)
        if (ids[i] == AP_LSM_ID_SELINUX)
            listed = 1;
    __atomic_store_n(&ap_selinux_listed, listed, __ATOMIC_RELAXED);
    return listed < 0;
}

/**
 * True when SELinux is enforcing (it may refuse execmod: RX on a modified
 * file page). A kernel that does not run SELinux says so once for the
 * process (ap_selinux_absent()). Where SELinux runs (a policy loaded), every
 * inode carries its label: /proc/self/maps, open already, without one means
 * it does not, which one fgetxattr() says without a path walk through /sys
 * (several times dearer on a process's first call). Otherwise
 * /sys/fs/selinux/enforce is read.
 */
static bool ap_selinux_enforcing(struct ap_batch *b, bool unfiltered)
{
    if (ap_selinux_absent(b, unfiltered))
        return false;
    if (b->maps.fd >= 0) {
        long n = ap_sys(SYS_fgetxattr, b->maps.fd, (long)"security.selinux", 0, 0, 0);
        b->st->syscalls++;
        if (n == -EOPNOTSUPP || n == -ENODATA)
            return false;
    }
    char c = '0';
    int fd = open("/sys/fs/selinux/enforce", O_RDONLY | O_CLOEXEC);
    b->st->syscalls++;
    if (fd < 0)
        return false;
    ssize_t r = read(fd, &c, 1);
    close(fd);
    b->st->syscalls += 2;
    return r == 1 && c != '0';
}

/**
 * Whether making a page executable again after RW may be refused, learnt
 * before any window opens (a refusal then would leave text writable and not
 * executable: the next call into it is a SIGSEGV). Under a seccomp filter
 * (or when the mode cannot be read) the filter itself is asked, on a scratch
 * page: RW, one store, then @p prot, exactly the calls a window makes. Under
 * SELinux enforcing, execmod may refuse for a modified file page what the
 * scratch page passed: assumed refused.
 */
static bool ap_exec_restore_unsure(struct ap_batch *b, int prot)
{
    if (b->exec_probe && b->probe_prot == prot)
        return b->exec_probe > 0;
    bool unsure = false;
    long sc = 0; /* AP_POKE_SECCOMP_OFF: the caller read 0 a moment ago */
    if (!(b->flags & AP_POKE_SECCOMP_OFF))
        sc = ap_seccomp_mode(&b->st->syscalls);
    if (sc != 0) {
        void *p = mmap(NULL, b->pgsz, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        b->st->syscalls++;
        unsure = p == MAP_FAILED;
        if (!unsure) {
            unsure = mprotect(p, b->pgsz, PROT_READ | PROT_WRITE) != 0;
            if (!unsure) {
                *(volatile uint8_t *)p = 0xc3;
                unsure = mprotect(p, b->pgsz, prot) != 0;
            }
            munmap(p, b->pgsz);
            b->st->syscalls += 3;
        }
    }
    if (!unsure)
        unsure = ap_selinux_enforcing(b, sc == 0);
    b->exec_probe = unsure ? 1 : -1;
    b->probe_prot = prot;
    return unsure;
}

/*
 * The kernel does not know PR_GET_MDWE (before Linux 6.3: -EINVAL): kept for
 * the process, it cannot learn it while running. Kept only from an answer
 * given without a seccomp filter (a filter may answer -EINVAL itself, and
 * filters are per thread while MDWE is per process). Any other answer is
 * asked every time: MDWE may be set later, and once set it stays set, but
 * PR_MDWE_NO_INHERIT takes it from a child after fork().
 */
AP_STATE static bool ap_mdwe_unknown;

static bool ap_mdwe_active(struct ap_poke_stats *st, bool unfiltered)
{
    if (__atomic_load_n(&ap_mdwe_unknown, __ATOMIC_RELAXED))
        return false;
    long r = ap_sys(SYS_prctl, PR_GET_MDWE, 0, 0, 0, 0);
    st->syscalls++;
    if (r == -EINVAL && unfiltered)
        __atomic_store_n(&ap_mdwe_unknown, true, __ATOMIC_RELAXED);
    return r > 0 && (r & PR_MDWE_REFUSE_EXEC_GAIN);
}

/** ap_mdwe_active(), asked once per batch, before its first window. */
static bool ap_batch_mdwe(struct ap_batch *b)
{
    if (!b->mdwe)
        b->mdwe = ap_mdwe_active(b->st, b->flags & AP_POKE_SECCOMP_OFF) ? 1 : -1;
    return b->mdwe > 0;
}

/** True when a window must be written through /proc/self/mem. */
static bool ap_window_needs_procmem(struct ap_batch *b, uintptr_t start, uintptr_t end, int prot)
{
    if (b->flags & AP_POKE_PROCMEM_ONLY)
        return true;
    if (prot < 0)
        return true; /* unknown (maps unreadable) or mixed protection: never guess */
    if ((prot & PROT_EXEC) && ap_batch_mdwe(b))
        return true; /* RW would succeed, RX again would be refused */
    if (ap_overlaps_self(b, start, end))
        return true;
    /* RW may pass and RX again be refused (seccomp, SELinux execmod) */
    return (prot & PROT_EXEC) && ap_exec_restore_unsure(b, prot);
}

/** Write the pending writes of w[first..last) (one window) by whatever works. */
static int ap_write_group(struct ap_batch *b, size_t first, size_t last, uintptr_t start,
                          uintptr_t end, int prot)
{
    if (prot == AP_PROT_SHARED) {
        /* Text in a shared mapping belongs to a file: never write through. */
        for (size_t i = first; i < last; i++)
            if (ap_write_pending(&b->w[i]))
                b->w[i].result = ALTPATCH_REASON_WRITE_DENIED;
        return 0;
    }
    int ret = 0;
    /* A span is read from memory, its gaps too, and written back a moment
     * later without signals blocked: pages of one known protection only
     * (not AP_PROT_MIXED: unknown, or partly unmapped), readable, and not
     * writable (nothing but a writer of text, the library or a debugger,
     * stores there: a signal handler's store into a gap cannot be undone). */
    if ((b->flags & (AP_POKE_SPANS | AP_POKE_SECCOMP_OFF | AP_POKE_NO_PROCMEM)) ==
            (AP_POKE_SPANS | AP_POKE_SECCOMP_OFF) &&
        prot >= 0 && (prot & (PROT_READ | PROT_WRITE)) == PROT_READ) {
        size_t rest = ap_write_spans(b, first, last, start, end, &ret);
        if (rest == last)
            return ret;
        /* the window over the pages from the rest's first write on (each
         * holds a write of the rest: the group's writes come in address
         * order, its pages adjacent), so that it counts no page of the
         * writes before */
        size_t at = rest;
        for (; at < last && !b->w[at].len; at++)
            ap_write_pending(&b->w[at]); /* nothing to write: the outputs only */
        if (at == last)
            return ret;
        if (rest != first)
            start = ap_pg_down(b, b->w[at].addr);
        first = at;
    }
    if (!ap_window_needs_procmem(b, start, end, prot)) {
        int err = ap_write_window(b, first, last, start, end, prot);
        if (err == 0 || err == -ENOTRECOVERABLE)
            return ret ? ret : err;
    }
    for (size_t i = first; i < last; i++) /* checked right before each pwrite */
        if (ap_write_pending(&b->w[i])) {
            int err = ap_write_procmem(b, &b->w[i]);
            if (err && !ret)
                ret = err;
        }
    return ret;
}

/**
 * Steps 3 and 4: walk the writes from the first pending one in address
 * order, growing a window while the next write's pages touch it and share its
 * protection. Each write is checked against memory where it is written (in
 * the window routine, or right before its pwrite), not here. Returns 0, the
 * first error, or -ENOMEM with b->stop at the first write not handled.
 */
static int ap_write_all(struct ap_batch *b, size_t first)
{
    struct ap_write *w = b->w;
    const size_t n = b->n;
    const uintptr_t mask = b->pgsz - 1;
    int ret = 0;
    size_t i = first;
    while (i < n) {
        if (!w[i].len) {
            ap_write_pending(&w[i]); /* nothing to write: the outputs only */
            i++;
            continue;
        }
        uintptr_t start = w[i].addr & ~mask;
        uintptr_t end = (w[i].addr + w[i].len + mask) & ~mask;
        int prot = b->maps_ok ? ap_maps_prot(&b->maps, start, end) : AP_PROT_MIXED;
        size_t j = i + 1;
        /* end is page-aligned: a write starts on a page past the window when
         * it starts at or above end + one page, and reaches past the window
         * when its last byte is at or above end */
        uintptr_t past = end + mask + 1;
        for (; j < n && prot >= 0; j++) {
            uintptr_t a = w[j].addr, k = w[j].len;
            if (!k)
                continue;
            if (a >= past)
                break;
            if (a + k > end) {
                uintptr_t e = (a + k + mask) & ~mask;
                if (ap_maps_prot(&b->maps, end, e) != prot)
                    break;
                end = e;
                past = end + mask + 1;
            }
        }
        if (b->maps.err) {
            b->stop = i; /* out of memory: stop (ap_poke() reports the rest) */
            return b->maps.err;
        }
        if (prot < 0)
            j = i + 1;
        int err = ap_write_group(b, i, j, start, end, prot);
        if (err && !ret)
            ret = err;
        if (end > b->group_end)
            b->group_end = end;
        i = j;
    }
    return ret;
}

AP_PLAIN_PATH int ap_poke(struct ap_write *w, size_t n, unsigned flags, struct ap_poke_stats *st)
{
    struct ap_poke_stats dummy = {0};
    struct ap_batch b = {
        .w = w, .n = n, .flags = flags, .st = st ? st : &dummy, .memfd = -1,
        .pgsz = (uintptr_t)getauxval(AT_PAGESZ),
    };
    if (flags & AP_POKE_CONTINUE)
        b.pg_done = b.st->pg_done;
    if (!b.pgsz)
        b.pgsz = (uintptr_t)sysconf(_SC_PAGESIZE);
    /* step 1 until a write is pending: none, no system call at all */
    size_t first = 0;
    while (first < n && !ap_write_pending(&w[first]))
        first++;
    if (first == n)
        return 0;
    int ret = 0;
    b.maps.fd = -1;
    if (!(flags & AP_POKE_PROCMEM_ONLY)) {
        b.maps_ok = ap_maps_open(&b.maps, &b.st->syscalls, b.pgsz) == 0;
        if (b.maps_ok && (flags & AP_POKE_MAPS_FILE)) {
            int err = ap_maps_read_all(&b.maps);
            b.maps_ok = err == 0;
            if (err == -ENOMEM)
                ret = err;
        }
    }
    b.stop = first;
    if (!ret)
        ret = ap_write_all(&b, first);
    if (ret == -ENOMEM) /* stopped early: the rest not written */
        for (size_t i = b.stop; i < n; i++)
            if (ap_write_pending(&w[i]))
                w[i].result = ALTPATCH_REASON_WRITE_DENIED;
    if (b.memfd >= 0) {
        close(b.memfd);
        b.st->syscalls++;
    }
    ap_maps_close(&b.maps);
    b.st->pg_done = b.pg_done;
    if (b.wrote_any)
        ap_sync_core();
    /* said after the batch: the print callback may be user code, which must
     * not run between the batch's windows (the proof of a single thread was
     * taken before it) */
    if (b.exec_probe > 0)
        ap_log(ALTPATCH_DEBUG, "RW -> RX may be refused here: text written through "
                               "/proc/self/mem\n");
    if (b.torn_at)
        ap_log(ALTPATCH_WARN, "site at %#lx: part written through /proc/self/mem and not put "
                              "back\n", (unsigned long)b.torn_at);
    return ret;
}
