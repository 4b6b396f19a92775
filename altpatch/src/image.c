/* SPDX-License-Identifier: MIT */
/*
 * image.c - the public image API (<altpatch/image.h>): an ELF file's altpatch
 * sites, planned offline with the runtime's planner, and pre-patched copies.
 *
 * The file is read the way the loader and the runtime see it, through its
 * program headers: the note in a PT_NOTE segment that a PT_LOAD maps, the
 * table and the replacements inside the file-backed part of a PT_LOAD, and
 * the view built by ap_view_build() from the executable PT_LOADs, as
 * module.c builds it from the same headers in memory. Addresses are
 * link-time addresses (p_vaddr); a byte's file offset comes from the PT_LOAD
 * that maps it.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <altpatch/image.h>

#include "apply.h"

/* ------------------------------------------------------------------------- */
/* Reading                                                                   */
/* ------------------------------------------------------------------------- */

static int fail(const struct altpatch_image *img, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One WARN line naming the image; returns @p err. */
static int fail(const struct altpatch_image *img, int err, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ap_log(ALTPATCH_WARN, "%s: %s\n", img->name, msg);
    return err;
}

/* File offset of [addr, addr+n) when one PT_LOAD maps all of it from the file, else -1. */
static int64_t file_off(const struct altpatch_image *img, uint64_t addr, uint64_t n)
{
    for (size_t i = 0; i < img->nph; i++) {
        const Elf64_Phdr *p = &img->ph[i];
        if (p->p_type != PT_LOAD || addr < p->p_vaddr || addr - p->p_vaddr > p->p_filesz ||
            n > p->p_filesz - (addr - p->p_vaddr))
            continue;
        uint64_t off = p->p_offset + (addr - p->p_vaddr);
        if (off > img->len || n > img->len - off)
            return -1;
        return (int64_t)off;
    }
    return -1;
}

static const uint8_t *bytes_at(const struct altpatch_image *img, uint64_t addr, uint64_t n)
{
    int64_t off = file_off(img, addr, n);
    return off < 0 ? NULL : img->buf + off;
}

/* ELF header and program headers. */
static int read_headers(struct altpatch_image *img)
{
    Elf64_Ehdr eh;
    if (img->len < sizeof(eh) || memcmp(img->buf, ELFMAG, SELFMAG) != 0)
        return fail(img, -ENOEXEC, "not an ELF file");
    memcpy(&eh, img->buf, sizeof(eh));
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB ||
        eh.e_machine != EM_X86_64)
        return fail(img, -ENOEXEC, "not a 64-bit little-endian x86-64 ELF file");
    if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)
        return fail(img, -ENOEXEC, "not an executable or shared library (ELF type %u)",
                    (unsigned)eh.e_type);
    if (eh.e_phnum == 0 || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phoff > img->len ||
        (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr) > img->len - eh.e_phoff)
        return fail(img, -ENOEXEC, "program headers missing or outside the file");
    img->nph = eh.e_phnum;
    img->ph = malloc(img->nph * sizeof(*img->ph));
    if (!img->ph)
        return -ENOMEM;
    memcpy(img->ph, img->buf + eh.e_phoff, img->nph * sizeof(*img->ph));
    return 0;
}

/* The altpatch note, in a PT_NOTE segment that a PT_LOAD maps (as the runtime requires). */
static int read_note(struct altpatch_image *img)
{
    for (size_t i = 0; i < img->nph; i++) {
        const Elf64_Phdr *p = &img->ph[i];
        if (p->p_type != PT_NOTE || p->p_offset > img->len || p->p_filesz > img->len - p->p_offset)
            continue;
        size_t align = p->p_align == 8 ? 8 : 4;
        uint32_t descsz = 0, plansz = 0;
        const uint8_t *pd;
        const uint8_t *d =
            ap_note_find_plan(img->buf + p->p_offset, p->p_filesz, align, &descsz, &pd, &plansz);
        if (!d)
            continue;
        uint64_t rel = (uint64_t)(d - (img->buf + p->p_offset));
        int64_t off = file_off(img, p->p_vaddr + rel, descsz);
        if (off < 0 || (uint64_t)off != p->p_offset + rel)
            return fail(img, -ENOEXEC, "altpatch note not inside a loaded segment");
        img->note_off = (uint64_t)off;
        /* the plan note, in the same segment (the header puts it right after) */
        if (pd && plansz == ALTPATCH_PLAN_NOTE_SIZE) { /* another size: another layout */
            uint64_t prel = (uint64_t)(pd - (img->buf + p->p_offset));
            int64_t poff = file_off(img, p->p_vaddr + prel, plansz);
            if (poff < 0 || (uint64_t)poff != p->p_offset + prel)
                return fail(img, -ENOEXEC, "altpatch plan note not inside a loaded segment");
            img->plan_off = (uint64_t)poff;
            img->plan_addr = p->p_vaddr + prel;
            img->plansz = plansz;
            /* malformed: not used by a first apply (the file is read), as
             * one that does not hold (read_prepatched()) */
            int st = ap_plan_note_parse(pd, plansz, &img->plan_note);
            img->plan_state = st > 0   ? ALTPATCH_PLAN_NOTE_FILLED
                              : st < 0 ? ALTPATCH_PLAN_NOTE_STALE
                                       : ALTPATCH_PLAN_NOTE_EMPTY;
        }
        int r = ap_note_parse(d, descsz, p->p_vaddr + rel, &img->note);
        if (r == ALTPATCH_REASON_BAD_VERSION)
            return fail(img, -EPROTO,
                        "unsupported altpatch note (format version %u, record size %u, "
                        "descriptor %u bytes)",
                        img->note.version, img->note.record_size, descsz);
        if (r)
            return fail(img, -EBADMSG, "bad altpatch note (%s)", altpatch_strreason(r));
        return 0;
    }
    return fail(img, -ENODATA, "no altpatch tables (no altpatch note)");
}

/* Table, replacements, view, entries and sites. */
static int read_tables(struct altpatch_image *img)
{
    const struct ap_note *n = &img->note;
    uint64_t tsize = n->table_end - n->table_start, rsize = n->repl_end - n->repl_start;
    const uint8_t *table = tsize ? bytes_at(img, n->table_start, tsize) : (const uint8_t *)"";
    const uint8_t *repl = rsize ? bytes_at(img, n->repl_start, rsize) : NULL;
    if (!table || (rsize && !repl))
        return fail(img, -EBADMSG, "altpatch tables outside the file's loaded segments");
    struct ap_segment seg[AP_MAX_TEXT];
    size_t ns = 0;
    for (size_t i = 0; i < img->nph && ns < AP_MAX_TEXT; i++) {
        const Elf64_Phdr *p = &img->ph[i];
        if (p->p_type != PT_LOAD || !(p->p_flags & PF_X) || !(p->p_flags & PF_R))
            continue;
        uint64_t size = p->p_filesz < p->p_memsz ? p->p_filesz : p->p_memsz;
        const uint8_t *data = bytes_at(img, p->p_vaddr, size);
        if (data)
            seg[ns++] = (struct ap_segment){p->p_vaddr, size, data, true};
    }
    ap_view_build(&img->view, seg, ns, n->repl_start, rsize, repl);
    /* what the runtime cuts from a module's text (module.c) */
    ap_view_cut(&img->view, n->table_start, n->table_end);
    ap_view_cut(&img->view, n->desc_start, n->desc_end);
    if (img->plansz)
        ap_view_cut(&img->view, img->plan_addr, img->plan_addr + img->plansz);
    int r = ap_records_parse(table, tsize, n->table_start, n->record_size, &img->entries,
                             &img->nentries);
    if (r < 0)
        return r;
    if (r)
        return fail(img, -EBADMSG, "altpatch table refused (%s)", altpatch_strreason(r));
    return ap_sites_group(img->entries, img->nentries, &img->sites, &img->nsites);
}

/* The originals: the file's bytes at every site inside the text. */
int ap_image_take_originals(struct altpatch_image *img)
{
    size_t total = 0;
    for (size_t i = 0; i < img->nsites; i++)
        total += img->sites[i].len;
    img->orig = malloc(total ? total : 1);
    img->final = malloc(total ? total : 1);
    img->orig_off = malloc((img->nsites ? img->nsites : 1) * sizeof(*img->orig_off));
    img->plan = calloc(img->nsites ? img->nsites : 1, sizeof(*img->plan));
    if (!img->orig || !img->final || !img->orig_off || !img->plan)
        return -ENOMEM;
    size_t off = 0;
    for (size_t i = 0; i < img->nsites; i++) {
        const struct ap_site *s = &img->sites[i];
        const uint8_t *b = s->len ? ap_view_text(&img->view, s->addr, s->len) : NULL;
        img->orig_off[i] = b ? off : AP_NO_ORIG;
        img->plan[i] = (struct ap_image_plan){s->reason, -1, -1, NULL};
        if (b) {
            memcpy(img->orig + off, b, s->len);
            off += s->len;
        }
    }
    return 0;
}

struct mem_src {
    const uint8_t *buf;
    size_t len;
};

static int mem_read(void *ctx, uint64_t off, void *dst, size_t len)
{
    const struct mem_src *m = ctx;
    if (off > m->len || len > m->len - off)
        return -EIO;
    memcpy(dst, m->buf + off, len);
    return 0;
}

/* ap_plan_note_check()'s reading of the image's sites. */
AP_HOT static int note_pick(void *ctx, size_t i, const struct altpatch_features *fs)
{
    const struct altpatch_image *img = ctx;
    if (img->orig_off[i] == AP_NO_ORIG)
        return AP_NOTE_OUTSIDE;
    return ap_plan_pick(&img->view, &img->sites[i], img->entries, fs);
}

/* Check the filled plan note against the section's record @p p and the
 * bytes the file's sites hold; NULL when it holds, else why not. */
static const char *note_mismatch(struct altpatch_image *img, const struct ap_prepatch *p)
{
    size_t total = 0;
    for (size_t i = 0; i < img->nsites; i++)
        total += img->sites[i].len;
    /* every site inside the text (else refused before the hash): img->orig
     * is their bytes, concatenated */
    struct ap_plan_note_sites s = {
        .nsites = img->nsites,
        .table_size = p->table_size,
        .bytes = img->orig,
        .nbytes = total,
        .rec = p,
        .pick = note_pick,
        .ctx = img,
    };
    return ap_plan_note_check(&img->plan_note, &s);
}

/* Check a pre-patched file's record against the file and take its originals. */
static int read_prepatched(struct altpatch_image *img)
{
    struct ap_prepatch p;
    struct ap_prepatch_site ps;
    if (!img->has_origsec)
        return fail(img, -EBADMSG, "format version %u (pre-patched) without a %s section",
                    img->note.version, AP_PREPATCH_SECTION);
    if (img->origsec.type == SHT_NOBITS ||
        ap_prepatch_parse(img->buf + img->origsec.offset, img->origsec.size, &p))
        return fail(img, -EBADMSG, "malformed %s section", AP_PREPATCH_SECTION);
    if (p.table_addr != img->note.table_start ||
        p.table_size != img->note.table_end - img->note.table_start || p.nsites != img->nsites)
        return fail(img, -EBADMSG, "%s describes another table", AP_PREPATCH_SECTION);
    /* the plan note is what a first apply believes where it says what the
     * section says and hashes the bytes the sites hold; else it is stale (an
     * older writer pre-patched the copy again and left it, or forged), and a
     * first apply reads the file as without it */
    if (img->plan_state == ALTPATCH_PLAN_NOTE_FILLED && note_mismatch(img, &p))
        img->plan_state = ALTPATCH_PLAN_NOTE_STALE;
    size_t pos = 0;
    for (size_t i = 0; i < img->nsites; i++) {
        const struct ap_site *s = &img->sites[i];
        if (ap_prepatch_next(&p, &pos, &ps) || ps.addr != s->addr || ps.len != s->len)
            return fail(img, -EBADMSG, "%s: site %zu is not the table's", AP_PREPATCH_SECTION, i);
        if (img->orig_off[i] == AP_NO_ORIG)
            continue;
        uint8_t *o = img->orig + img->orig_off[i];
        if (memcmp(o, ps.written, ps.len) != 0)
            return fail(img, -EBADMSG,
                        "site 0x%llx does not hold the bytes %s says were written there",
                        (unsigned long long)s->addr, AP_PREPATCH_SECTION);
        memcpy(o, ps.orig, ps.len);
    }
    img->prepatched = true;
    memcpy(img->profile, p.profile, sizeof(img->profile));
    img->planner = p.planner;
    img->pfs = p.fs;
    return 0;
}

static int image_load(struct altpatch_image *img)
{
    int r = read_headers(img);
    if (!r)
        r = read_note(img);
    if (!r)
        r = read_tables(img);
    if (!r)
        r = ap_image_take_originals(img);
    if (r)
        return r;
    struct mem_src src = {img->buf, img->len};
    r = ap_elf_find_section(mem_read, &src, img->len, AP_PREPATCH_SECTION, &img->origsec);
    if (r == -ENOMEM)
        return r;
    img->has_origsec = r == 0;
    if (ap_note_prepatched(&img->note))
        return read_prepatched(img);
    /* a plain file's filled note is never read by a first apply */
    if (img->plan_state == ALTPATCH_PLAN_NOTE_FILLED)
        img->plan_state = ALTPATCH_PLAN_NOTE_STALE;
    return 0;
}

static bool opts_ok(const struct altpatch_image_opts *o)
{
    if (!o)
        return true;
    if (o->sz < offsetof(struct altpatch_image_opts, name) + sizeof(o->name))
        return false;
    if (o->sz >= offsetof(struct altpatch_image_opts, reserved) + sizeof(o->reserved) &&
        o->reserved)
        return false;
    /* Fields this library does not know must be zero. */
    for (size_t i = sizeof(*o); i < o->sz; i++)
        if (((const uint8_t *)o)[i])
            return false;
    return true;
}

static const char *opt_name(const struct altpatch_image_opts *o)
{
    return o && o->sz >= offsetof(struct altpatch_image_opts, name) + sizeof(o->name) ? o->name
                                                                                      : NULL;
}

/* Take @p buf (malloc'ed, owned from now on) and open it. */
static int image_new(uint8_t *buf, size_t len, const char *name, unsigned mode,
                     struct altpatch_image **out)
{
    struct altpatch_image *img = calloc(1, sizeof(*img));
    if (!img || !(img->name = strdup(name))) {
        free(img);
        free(buf);
        return -ENOMEM;
    }
    img->buf = buf;
    img->len = len;
    img->mode = mode;
    int r = image_load(img);
    if (r) {
        altpatch_image_close(img);
        return r;
    }
    *out = img;
    return 0;
}

ALTPATCH_API int altpatch_image_open_mem(const void *buf, size_t len,
                                         const struct altpatch_image_opts *opts,
                                         struct altpatch_image **out)
{
    if (!out || (!buf && len) || !opts_ok(opts))
        return -EINVAL;
    *out = NULL;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return -ENOMEM;
    if (len)
        memcpy(copy, buf, len);
    const char *name = opt_name(opts);
    return image_new(copy, len, name ? name : "image", 0755, out);
}

/* Read the whole file at @p path; 0 or -errno. */
static int slurp(const char *path, uint8_t **buf, size_t *len, unsigned *mode)
{
    /* O_NONBLOCK: a FIFO (or a terminal) opens at once and is refused below
     * by its type, instead of blocking until a writer comes. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -errno;
    struct stat st;
    int r = fstat(fd, &st) ? -errno : 0;
    if (!r && !S_ISREG(st.st_mode))
        r = -EINVAL;
    if (!r && (uint64_t)st.st_size > AP_IMAGE_MAX)
        r = -EFBIG;
    size_t n = r ? 0 : (size_t)st.st_size, got = 0;
    uint8_t *b = r ? NULL : malloc(n ? n : 1);
    if (!r && !b)
        r = -ENOMEM;
    while (!r && got < n) {
        ssize_t k = read(fd, b + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            r = k < 0 ? -errno : -EIO;
        else
            got += (size_t)k;
    }
    close(fd);
    if (r) {
        free(b);
        return r;
    }
    *buf = b;
    *len = n;
    *mode = (unsigned)st.st_mode & 07777;
    return 0;
}

ALTPATCH_API int altpatch_image_open(const char *path, const struct altpatch_image_opts *opts,
                                     struct altpatch_image **out)
{
    if (!out || !path || !opts_ok(opts))
        return -EINVAL;
    *out = NULL;
    const char *name = opt_name(opts);
    uint8_t *buf = NULL;
    size_t len = 0;
    unsigned mode = 0;
    int r = slurp(path, &buf, &len, &mode);
    if (r) {
        ap_log(ALTPATCH_WARN, "%s: cannot read: %s\n", name ? name : path, strerror(-r));
        return r;
    }
    return image_new(buf, len, name ? name : path, mode, out);
}

ALTPATCH_API void altpatch_image_close(struct altpatch_image *img)
{
    if (!img)
        return;
    for (size_t i = 0; img->plan && i < img->nsites; i++)
        free(img->plan[i].detail);
    free(img->plan);
    free(img->final);
    free(img->orig);
    free(img->orig_off);
    free(img->sites);
    free(img->entries);
    free(img->ph);
    free(img->rules);
    free(img->buf);
    free(img->name);
    free(img);
}

ALTPATCH_API int altpatch_image_get_info(const struct altpatch_image *img,
                                         struct altpatch_image_info *info)
{
    if (!img || !info || info->sz < offsetof(struct altpatch_image_info, planned) + sizeof(bool))
        return -EINVAL;
    size_t sz = info->sz < sizeof(*info) ? info->sz : sizeof(*info);
    /* every byte of the caller's sz defined, padding included: a field added
     * later in padding reads 0 from this library */
    struct altpatch_image_info i;
    memset(&i, 0, sizeof(i));
    i.sz = info->sz;
    i.name = img->name;
    i.format_version = img->note.version;
    i.prepatched_profile = img->prepatched ? img->profile : NULL;
    i.entries = img->nentries;
    i.sites = img->nsites;
    i.table_addr = img->note.table_start;
    i.repl_addr = img->view.repl.addr;
    i.repl_size = img->view.repl.size;
    i.planned = img->planned;
    i.prepatched_planner = img->prepatched ? img->planner : 0;
    i.plan_note = img->plan_state;
    memcpy(info, &i, sz);
    return 0;
}

ALTPATCH_API const struct altpatch_features *
altpatch_image_prepatched_features(const struct altpatch_image *img)
{
    if (!img || !img->prepatched) {
        errno = img ? ENOENT : EINVAL;
        return NULL;
    }
    return &img->pfs;
}

/* ------------------------------------------------------------------------- */
/* Planning and walking                                                      */
/* ------------------------------------------------------------------------- */

ALTPATCH_API int altpatch_image_plan(struct altpatch_image *img,
                                     const struct altpatch_features *fs)
{
    if (!img || !fs)
        return -EINVAL;
    struct ap_plan *p = malloc(sizeof(*p));
    if (!p)
        return -ENOMEM;
    int err = 0;
    img->planned = false;
    for (size_t i = 0; i < img->nsites; i++) {
        size_t off = img->orig_off[i];
        const uint8_t *orig = off != AP_NO_ORIG ? img->orig + off : NULL;
        struct ap_image_plan *ip = &img->plan[i];
        ap_plan_site_rules(&img->view, &img->sites[i], img->entries, orig, fs, img->rules, p);
        free(ip->detail);
        ip->detail = NULL;
        ip->reason = p->reason;
        ip->chosen = p->reason ? -1 : p->chosen;
        ip->bad_entry = p->reason ? p->bad_entry : -1;
        if (p->reason && p->detail[0] && !(ip->detail = strdup(p->detail)))
            err = -ENOMEM;
        if (orig)
            memcpy(img->final + off, p->reason ? orig : p->final, img->sites[i].len);
    }
    free(p);
    img->plan_fs = *fs;
    img->planned = !err;
    return err;
}

ALTPATCH_API int altpatch_image_site_foreach(const struct altpatch_image *img,
                                             altpatch_image_site_fn fn, void *ctx)
{
    if (!img || !fn)
        return -EINVAL;
    for (size_t i = 0; i < img->nsites; i++) {
        const struct ap_site *s = &img->sites[i];
        size_t off = img->orig_off[i];
        bool in = off != AP_NO_ORIG;
        const struct ap_image_plan *ip = &img->plan[i];
        struct altpatch_image_site site = {
            .sz = sizeof(site),
            .index = (unsigned)i,
            .addr = s->addr,
            .len = s->len,
            .entries = s->count,
            .chosen = img->planned ? ip->chosen : -1,
            .reason = ip->reason,
            .detail = ip->detail ? ip->detail : "",
            .original = in ? img->orig + off : NULL,
            .current = in ? ap_view_text(&img->view, s->addr, s->len) : NULL,
            .final = in && img->planned ? img->final + off : NULL,
            .bad_entry = img->planned ? ip->bad_entry : -1,
        };
        int r = fn(&site, ctx);
        if (r)
            return r;
    }
    return 0;
}

ALTPATCH_API int altpatch_image_site_entry(const struct altpatch_image *img, unsigned site,
                                           unsigned k, struct altpatch_image_entry *out)
{
    if (!img || !out || out->sz < offsetof(struct altpatch_image_entry, replacement) +
                                      sizeof(out->replacement))
        return -EINVAL;
    if (site >= img->nsites || k >= img->sites[site].count)
        return -ENOENT;
    const struct ap_entry *e = &img->entries[img->sites[site].first + k];
    const struct ap_region *r = &img->view.repl;
    bool in = e->repl >= r->addr && e->repl - r->addr <= r->size &&
              e->repllen <= r->size - (e->repl - r->addr) && r->data;
    struct altpatch_image_entry v = {
        .sz = out->sz,
        .index = e->index,
        .feature = e->feature,
        .flags = e->flags,
        .instrlen = e->instrlen,
        .repl_addr = e->repl,
        .repl_len = e->repllen,
        .replacement = in ? r->data + (e->repl - r->addr) : NULL,
    };
    memcpy(out, &v, out->sz < sizeof(v) ? out->sz : sizeof(v));
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Writing a pre-patched copy                                                */
/* ------------------------------------------------------------------------- */

static size_t align8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

static bool wopts_ok(const struct altpatch_image_write_opts *o)
{
    if (!o)
        return true;
    if (o->sz < offsetof(struct altpatch_image_write_opts, mode) + sizeof(o->mode))
        return false;
    if (o->sz >= offsetof(struct altpatch_image_write_opts, reserved) + sizeof(o->reserved) &&
        o->reserved)
        return false;
    for (size_t i = sizeof(*o); i < o->sz; i++)
        if (((const uint8_t *)o)[i])
            return false;
    return o->profile == NULL || strlen(o->profile) < AP_PREPATCH_PROFILE;
}

/* The section of originals for the last plan, made for @p profile. */
static uint8_t *build_record(const struct altpatch_image *img, const char *profile,
                             const struct altpatch_features *fs, size_t *len)
{
    size_t bytes = 0;
    for (size_t i = 0; i < img->nsites; i++)
        bytes += img->sites[i].len;
    *len = ap_prepatch_size(img->nsites, bytes);
    uint8_t *b = malloc(*len);
    if (!b)
        return NULL;
    struct ap_prepatch h = {
        .nsites = (uint32_t)img->nsites,
        .planner = AP_PREPATCH_PLANNER,
        .table_addr = img->note.table_start,
        .table_size = img->note.table_end - img->note.table_start,
        .fs = *fs,
    };
    snprintf(h.profile, sizeof(h.profile), "%s", profile);
    ap_prepatch_put_header(b, &h);
    size_t pos = AP_PREPATCH_HDR;
    for (size_t i = 0; i < img->nsites; i++) {
        const struct ap_site *s = &img->sites[i];
        size_t off = img->orig_off[i];
        /* A site outside the text has no bytes in the file: both strings are
         * zeros, and nothing is written there. */
        static const uint8_t zeros[AP_MAX_SITE];
        const uint8_t *o = off != AP_NO_ORIG ? img->orig + off : zeros;
        const uint8_t *w = off != AP_NO_ORIG ? img->final + off : zeros;
        struct ap_prepatch_site ps = {s->addr, s->len, img->plan[i].chosen, o, w};
        pos += ap_prepatch_put_site(b + pos, &ps);
    }
    return b;
}

/*
 * The plan note of the copy: filled when the plan is what its set selects at
 * every site (none refused, none outside the text, the original written where
 * none is selected), which is then all a first apply needs to settle; else
 * zeros (read from the file, as without a note).
 */
static void put_plan_note(const struct altpatch_image *img, uint8_t *desc)
{
    memset(desc, 0, ALTPATCH_PLAN_NOTE_SIZE);
    size_t total = 0;
    for (size_t i = 0; i < img->nsites; i++) {
        const struct ap_site *s = &img->sites[i];
        size_t off = img->orig_off[i];
        if (off == AP_NO_ORIG || img->plan[i].reason ||
            img->plan[i].chosen != ap_plan_pick(&img->view, s, img->entries, &img->plan_fs) ||
            (img->plan[i].chosen < 0 && memcmp(img->final + off, img->orig + off, s->len)))
            return;
        total += s->len;
    }
    struct ap_plan_note pn = {
        .planner = AP_PREPATCH_PLANNER,
        .nsites = (uint32_t)img->nsites,
        .table_size = img->note.table_end - img->note.table_start,
        .hash = ap_bytes_hash(img->final, total),
        .fs = img->plan_fs,
    };
    ap_plan_note_put(desc, &pn);
}

/* Append (or move) the section of originals: returns the new file, or NULL with *err. */
static uint8_t *with_section(const struct altpatch_image *img, const uint8_t *rec, size_t reclen,
                             size_t *outlen, int *err)
{
    Elf64_Ehdr eh;
    memcpy(&eh, img->buf, sizeof(eh));
    size_t base = align8(img->len), rec_off = base;
    size_t total = rec_off + reclen, str_off = 0, sh_off = 0, strlen_new = 0;
    Elf64_Shdr ss;
    const char *name = AP_PREPATCH_SECTION;
    if (!img->has_origsec) {
        /* A new header at the end of a copy of the table, its name at the
         * end of a copy of the name table. */
        if (eh.e_shnum == 0 || eh.e_shoff == 0 || eh.e_shnum >= SHN_LORESERVE - 1 ||
            eh.e_shstrndx == SHN_UNDEF || eh.e_shstrndx >= eh.e_shnum ||
            eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > img->len ||
            (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr) > img->len - eh.e_shoff) {
            *err = fail(img, -ENOTSUP, "no usable section header table to add %s to", name);
            return NULL;
        }
        memcpy(&ss, img->buf + eh.e_shoff + (size_t)eh.e_shstrndx * sizeof(ss), sizeof(ss));
        if (ss.sh_type != SHT_STRTAB || ss.sh_offset > img->len ||
            ss.sh_size > img->len - ss.sh_offset) {
            *err = fail(img, -ENOTSUP, "section name table outside the file");
            return NULL;
        }
        /* The name goes right after the table: no header may name a byte
         * there already (a name outside the table would become the new one,
         * and the copy would not find its section again). */
        for (size_t i = 0; i < eh.e_shnum; i++) {
            Elf64_Shdr h;
            memcpy(&h, img->buf + eh.e_shoff + i * sizeof(h), sizeof(h));
            if (h.sh_name >= ss.sh_size && (i || h.sh_name)) {
                *err = fail(img, -ENOTSUP,
                            "section %zu's name lies outside the section name table", i);
                return NULL;
            }
        }
        str_off = total;
        strlen_new = ss.sh_size + strlen(name) + 1;
        sh_off = align8(str_off + strlen_new);
        total = sh_off + ((size_t)eh.e_shnum + 1) * sizeof(Elf64_Shdr);
    }
    uint8_t *out = calloc(1, total);
    if (!out) {
        *err = -ENOMEM;
        return NULL;
    }
    memcpy(out, img->buf, img->len);
    memcpy(out + rec_off, rec, reclen);
    if (img->has_origsec) {
        Elf64_Shdr sh;
        memcpy(&sh, out + img->origsec.hdr_off, sizeof(sh));
        sh.sh_type = SHT_PROGBITS;
        sh.sh_flags = 0;
        sh.sh_offset = rec_off;
        sh.sh_size = reclen;
        memcpy(out + img->origsec.hdr_off, &sh, sizeof(sh));
    } else {
        memcpy(out + str_off, img->buf + ss.sh_offset, ss.sh_size);
        memcpy(out + str_off + ss.sh_size, name, strlen(name) + 1);
        memcpy(out + sh_off, img->buf + eh.e_shoff, (size_t)eh.e_shnum * sizeof(Elf64_Shdr));
        Elf64_Shdr nss = ss, nsh = {
            .sh_name = (uint32_t)ss.sh_size,
            .sh_type = SHT_PROGBITS,
            .sh_offset = rec_off,
            .sh_size = reclen,
            .sh_addralign = 1,
        };
        nss.sh_offset = str_off;
        nss.sh_size = strlen_new;
        memcpy(out + sh_off + (size_t)eh.e_shstrndx * sizeof(nss), &nss, sizeof(nss));
        memcpy(out + sh_off + (size_t)eh.e_shnum * sizeof(nsh), &nsh, sizeof(nsh));
        eh.e_shoff = sh_off;
        eh.e_shnum++;
        memcpy(out, &eh, sizeof(eh));
    }
    *outlen = total;
    return out;
}

ALTPATCH_API int altpatch_image_write_mem(const struct altpatch_image *img,
                                          const struct altpatch_image_write_opts *opts,
                                          void **buf, size_t *len)
{
    if (!img || !buf || !len || !wopts_ok(opts))
        return -EINVAL;
    if (!img->planned)
        return fail(img, -EINVAL, "no plan to write (plan the image first)");
    if (img->regions)
        return fail(img, -ENOTSUP, "described by regions: no ELF file to write a copy of");
    const char *profile = opts && opts->profile ? opts->profile : "custom";
    size_t reclen;
    uint8_t *rec = build_record(img, profile, &img->plan_fs, &reclen);
    if (!rec)
        return -ENOMEM;
    int err = 0;
    size_t outlen = 0;
    uint8_t *out = with_section(img, rec, reclen, &outlen, &err);
    free(rec);
    if (!out)
        return err;
    for (size_t i = 0; i < img->nsites; i++) {
        size_t off = img->orig_off[i];
        if (off == AP_NO_ORIG)
            continue;
        int64_t fo = file_off(img, img->sites[i].addr, img->sites[i].len);
        if (fo >= 0)
            memcpy(out + fo, img->final + off, img->sites[i].len);
    }
    uint32_t v = ap_format_prepatched(img->note.version);
    memcpy(out + img->note_off, &v, sizeof(v));
    if (img->plan_state)
        put_plan_note(img, out + img->plan_off);
    *buf = out;
    *len = outlen;
    return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EIO;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

ALTPATCH_API int altpatch_image_write(const struct altpatch_image *img, const char *path,
                                      const struct altpatch_image_write_opts *opts)
{
    if (!img || !path || !*path || !wopts_ok(opts))
        return -EINVAL;
    void *out;
    size_t len;
    int r = altpatch_image_write_mem(img, opts, &out, &len);
    if (r)
        return r;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 8);
    if (!tmp) {
        free(out);
        return -ENOMEM;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".XXXXXX", 8);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        r = -errno;
        fail(img, r, "cannot create %s: %s", path, strerror(-r));
        free(tmp);
        free(out);
        return r;
    }
    unsigned mode = opts && opts->mode ? opts->mode : img->mode;
    r = write_all(fd, out, len);
    if (!r && fchmod(fd, (mode_t)(mode & 07777)))
        r = -errno;
    if (close(fd) && !r)
        r = -errno;
    if (!r && rename(tmp, path))
        r = -errno;
    if (r) {
        fail(img, r, "cannot write %s: %s", path, strerror(-r));
        unlink(tmp);
    }
    free(tmp);
    free(out);
    return r;
}
