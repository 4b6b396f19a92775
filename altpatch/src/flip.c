/* SPDX-License-Identifier: MIT */
/*
 * flip.c - page flips: replace text pages in one mremap().
 *
 * The live writer (live.c) never writes into a page that another thread may
 * be executing. It builds the new contents of the pages in a *staging*
 * mapping of the same file at the same offset (so /proc/self/maps, perf and
 * module discovery keep seeing the file), fills it through /proc/self/mem
 * (no page is ever writable and executable, no mprotect), and moves it over
 * the live pages with mremap(MREMAP_MAYMOVE | MREMAP_FIXED). Under the mmap
 * lock the kernel unmaps the target (a TLB shootdown: every CPU running the
 * process takes an interrupt between two instructions) and moves the staging
 * pages in; a thread that faults meanwhile waits for the lock and then sees
 * the new page. So every thread executes each instruction either from the
 * old page or from the new one.
 *
 * Runs: the pages of the sites, widened to AP_FLIP_GRANULE-aligned blocks
 * and clipped to their mapping, so that the boundaries a flip leaves between
 * mappings are always the same ones: the number of mappings stays bounded
 * whatever is toggled. This file knows nothing of x86.
 */
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/** Runs are made of blocks of this many bytes (aligned), clipped to the mapping. */
#define AP_FLIP_GRANULE (64 * 1024)

/** One line of /proc/self/maps that holds a site, with the lines that continue it. */
struct ap_flip_vma {
    uintptr_t s, e;
    uint64_t off;
    int prot;
    bool priv;
    dev_t dev;
    uint64_t ino;
    char *path; /* NULL: anonymous or pseudo ([vdso], ...) */
    int fd;     /* opened on first use; -1 before, -errno when it cannot be */
};

static int ap_flip_vma_fd(struct ap_flip_vma *v, uintptr_t pgsz)
{
    if (v->fd != -1)
        return v->fd;
    v->fd = -ENOENT;
    /* Text only: readable (the pages are copied), executable, private. */
    if (!v->path || !v->priv || (v->prot & (PROT_READ | PROT_EXEC)) != (PROT_READ | PROT_EXEC))
        return v->fd;
    int fd = open(v->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return v->fd = -errno;
    struct stat st;
    /* The same file as the mapping, and long enough to back every page of it
     * (a page past the end would raise SIGBUS when read). */
    if (fstat(fd, &st) || st.st_dev != v->dev || (uint64_t)st.st_ino != v->ino ||
        v->off + (v->e - v->s) > (((uint64_t)st.st_size + pgsz - 1) & ~(uint64_t)(pgsz - 1))) {
        close(fd);
        return v->fd = -ESTALE;
    }
    return v->fd = fd;
}

/** Parse one /proc/self/maps line into @p v (path not copied). False when malformed. */
static bool ap_flip_parse(char *line, struct ap_flip_vma *v, char **path)
{
    unsigned long s, e, off, ino;
    unsigned maj, min;
    char perms[8];
    int pos = 0;
    if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &s, &e, perms, &off, &maj, &min, &ino,
               &pos) < 7 ||
        strlen(perms) < 4)
        return false;
    *v = (struct ap_flip_vma){.s = s, .e = e, .off = off, .dev = makedev(maj, min), .ino = ino,
                              .fd = -1};
    v->prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
              (perms[2] == 'x' ? PROT_EXEC : 0);
    v->priv = perms[3] == 'p';
    char *p = line + pos;
    size_t l = strlen(p);
    while (l && (p[l - 1] == '\n' || p[l - 1] == ' '))
        p[--l] = 0;
    static const char deleted[] = " (deleted)";
    bool gone = l >= sizeof(deleted) - 1 && !strcmp(p + l - (sizeof(deleted) - 1), deleted);
    *path = (ino && l && p[0] == '/' && !gone) ? p : NULL;
    return true;
}

/** Index of the first write at or after @p a among w[0..n) (sorted), or n. */
static size_t ap_flip_lower(const struct ap_write *w, size_t n, uintptr_t a)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w[mid].addr < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/** The mappings that hold a write of w[0..n) (sorted by address), from /proc/self/maps. */
static int ap_flip_vmas(struct ap_flip *f, const struct ap_write *w, size_t n)
{
    FILE *fp = fopen("/proc/self/maps", "re");
    if (!fp)
        return -errno;
    char *line = NULL;
    size_t cap = 0, vcap = 0;
    int err = 0;
    while (getline(&line, &cap, fp) > 0) {
        struct ap_flip_vma v;
        char *path;
        if (!ap_flip_parse(line, &v, &path))
            continue;
        /* The continuation of the last mapping kept (an earlier flip split
         * it): one range for the runs, so that a site across the split and
         * the blocks on both sides flip together (and the pieces merge). */
        struct ap_flip_vma *last = f->nvma ? &f->vma[f->nvma - 1] : NULL;
        if (last && last->path && path && last->e == v.s && last->dev == v.dev &&
            last->ino == v.ino && last->prot == v.prot && last->priv == v.priv &&
            last->off + (last->e - last->s) == v.off && !strcmp(last->path, path)) {
            last->e = v.e;
            continue;
        }
        size_t k = ap_flip_lower(w, n, v.s);
        if (k == n || w[k].addr >= v.e)
            continue;
        if (f->nvma == vcap) {
            size_t nc = vcap ? 2 * vcap : 8;
            struct ap_flip_vma *nv = realloc(f->vma, nc * sizeof(*nv));
            if (!nv) {
                err = -ENOMEM;
                break;
            }
            f->vma = nv, vcap = nc;
        }
        if (path && !(v.path = strdup(path))) {
            err = -ENOMEM;
            break;
        }
        f->vma[f->nvma++] = v;
    }
    free(line);
    fclose(fp);
    return err;
}

int ap_flip_plan(struct ap_flip *f, const struct ap_write *w, const bool *want, size_t n,
                 long *run_of)
{
    memset(f, 0, sizeof(*f));
    f->memfd = -1;
    f->pgsz = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < n; i++)
        run_of[i] = -1;
    int err = ap_flip_vmas(f, w, n);
    if (!err && !(f->run = calloc(n ? n : 1, sizeof(*f->run))))
        err = -ENOMEM;
    if (err)
        return err;
    size_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!want[i] || !w[i].len)
            continue;
        uintptr_t a = w[i].addr, e = w[i].addr + w[i].len;
        while (v < f->nvma && f->vma[v].e <= a)
            v++;
        if (v == f->nvma || f->vma[v].s > a || f->vma[v].e < e)
            continue; /* not in one mapping */
        struct ap_flip_vma *m = &f->vma[v];
        if (ap_flip_vma_fd(m, f->pgsz) < 0)
            continue;
        uintptr_t bs = a & ~(uintptr_t)(AP_FLIP_GRANULE - 1);
        uintptr_t be = (e + AP_FLIP_GRANULE - 1) & ~(uintptr_t)(AP_FLIP_GRANULE - 1);
        bs = bs < m->s ? m->s : bs;
        be = be > m->e ? m->e : be;
        struct ap_flip_run *last = f->nrun ? &f->run[f->nrun - 1] : NULL;
        if (last && last->vma == v && bs <= last->start + last->len) {
            if (be > last->start + last->len)
                last->len = be - last->start;
        } else {
            f->run[f->nrun++] = (struct ap_flip_run){.start = bs, .len = be - bs, .vma = v};
        }
        run_of[i] = (long)f->nrun - 1;
    }
    return 0;
}

int ap_flip_stage(struct ap_flip *f, size_t run, int which, struct ap_poke_stats *st)
{
    struct ap_flip_run *r = &f->run[run];
    const struct ap_flip_vma *m = &f->vma[r->vma];
    if (f->memfd < 0 && (f->memfd = ap_procmem_open()) < 0)
        return f->memfd;
    void *p = mmap(NULL, r->len, m->prot, MAP_PRIVATE, m->fd, (off_t)(m->off + (r->start - m->s)));
    st->syscalls++;
    if (p == MAP_FAILED)
        return -errno;
    r->stage[which] = p;
    /* The file's pages are what the target held before any write; copy the
     * pages that differ (written by earlier applies) from the live ones. */
    for (uintptr_t o = 0; o < r->len; o += f->pgsz) {
        if (!memcmp((const uint8_t *)p + o, (const void *)(r->start + o), f->pgsz))
            continue;
        st->syscalls++;
        int err = ap_procmem_write(f->memfd, (uintptr_t)p + o, (const uint8_t *)(r->start + o),
                                   f->pgsz);
        if (err)
            return err;
        st->procmem_writes++;
    }
    return 0;
}

int ap_flip_put(struct ap_flip *f, size_t run, int which, uintptr_t addr, const uint8_t *src,
                size_t len, struct ap_poke_stats *st)
{
    st->syscalls++;
    int err = ap_procmem_write(f->memfd, (uintptr_t)ap_flip_view(f, run, which, addr), src, len);
    if (!err)
        st->procmem_writes++;
    return err;
}

const uint8_t *ap_flip_view(const struct ap_flip *f, size_t run, int which, uintptr_t addr)
{
    const struct ap_flip_run *r = &f->run[run];
    return r->stage[which] + (addr - r->start);
}

int ap_flip_swap(struct ap_flip *f, size_t run, int which, struct ap_poke_stats *st)
{
    struct ap_flip_run *r = &f->run[run];
    /* Raw: nothing between two flips may run code of the program's. */
    long p = syscall(SYS_mremap, r->stage[which], r->len, r->len, MREMAP_MAYMOVE | MREMAP_FIXED,
                     r->start);
    st->syscalls++;
    if (p == -1)
        return -errno;
    r->stage[which] = NULL; /* moved in: it is the target now */
    return 0;
}

void ap_flip_release(struct ap_flip *f)
{
    for (size_t i = 0; i < f->nrun; i++)
        for (int k = 0; k < 2; k++)
            if (f->run[i].stage[k])
                munmap(f->run[i].stage[k], f->run[i].len);
    for (size_t i = 0; i < f->nvma; i++) {
        if (f->vma[i].fd >= 0)
            close(f->vma[i].fd);
        free(f->vma[i].path);
    }
    if (f->memfd >= 0)
        close(f->memfd);
    free(f->run);
    free(f->vma);
    memset(f, 0, sizeof(*f));
    f->memfd = -1;
}
