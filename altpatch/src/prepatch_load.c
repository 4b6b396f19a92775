/* SPDX-License-Identifier: MIT */
/*
 * prepatch_load.c - the runtime side of pre-patched files: a module whose
 * note says version 2 (or 4) runs a profile's bytes at its sites; the
 * compiler's originals are in a non-allocated section of its file, which is
 * not mapped, so they are read from the file: for the main program
 * /proc/self/exe (the file mapped, whatever its path has become since), for a
 * library the path the loader reports.
 *
 * A file by path may not be the one mapped (replaced since it was loaded),
 * so nothing is believed before it is checked against memory: the same table
 * address and size, the same sites in the same order with the same lengths,
 * and every site in memory holding exactly the bytes the file says were
 * written there. Then the originals are taken; otherwise the module is
 * refused and runs as it is. Only a regular file is read (a FIFO or a device
 * at the path would block or answer anything).
 *
 * A module with a filled plan note (pure.h) is not read at all while its
 * sites can stay as they are: the note gives the planner version, the set
 * the file was planned for (so each site's choice: the entry that set
 * selects) and a hash of the bytes written, checked against memory when the
 * module is read. The originals are read from the file when something first
 * needs them (ap_prepatch_need()), with every check above, and the file's
 * choices must then be the note's.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "host.h"

/** Largest section of originals read (sites are at most 255 bytes each). */
#define AP_PREPATCH_MAX_READ (256u << 20)

/*
 * The file is read with direct system calls (ap_sys()) and the bytes compared
 * and copied with util.h's helpers: a process's first apply binds no C
 * library wrapper for them lazily (each binding is the dynamic linker's
 * symbol lookup).
 */
static int fd_read(void *ctx, uint64_t off, void *dst, size_t len)
{
    long fd = *(long *)ctx;
    uint8_t *p = dst;
    while (len) {
        long n = ap_sys(SYS_pread64, fd, (long)p, (long)len, (long)off, 0);
        if (n == -EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? (int)n : -EIO;
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

/* The section of originals of the file @p path, malloc'ed: 0, -ENOMEM, or
 * another -errno with *@p why. */
static int read_section(const char *path, uint8_t **buf, size_t *len, const char **why)
{
    long fd = ap_sys(SYS_openat, AT_FDCWD, (long)path,
                     O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0, 0);
    if (fd < 0) {
        *why = strerror((int)-fd);
        return (int)fd;
    }
    struct stat st;
    struct ap_elf_section sec;
    int r = (int)ap_sys(SYS_fstat, fd, (long)&st, 0, 0, 0);
    if (r)
        *why = strerror(-r);
    else if (!S_ISREG(st.st_mode))
        *why = "not a regular file", r = -EINVAL;
    else if ((r = ap_elf_find_section(fd_read, &fd, (uint64_t)st.st_size, AP_PREPATCH_SECTION,
                                      &sec)))
        *why = r == -ENOENT ? "no " AP_PREPATCH_SECTION " section" : strerror(-r);
    else if (sec.type == SHT_NOBITS || sec.size > AP_PREPATCH_MAX_READ)
        *why = "unusable " AP_PREPATCH_SECTION " section", r = -ENOEXEC;
    else if (!(*buf = malloc(sec.size ? sec.size : 1)))
        r = -ENOMEM;
    else if ((r = fd_read(&fd, sec.offset, *buf, sec.size))) {
        *why = strerror(-r);
        free(*buf);
        *buf = NULL;
    } else {
        *len = sec.size;
    }
    ap_sys(SYS_close, fd, 0, 0, 0, 0);
    return r;
}

/* Check the record against the module; NULL when it matches, else why not. */
static const char *mismatch(const struct ap_module *m, const struct ap_prepatch *p)
{
    if (p->table_addr + m->base != m->note.table_start || p->table_size != m->table_size)
        return "its table is not the one in memory";
    if (p->nsites != m->nsites)
        return "its number of sites differs";
    size_t pos = 0;
    struct ap_prepatch_site ps;
    const struct ap_table_ref t = ap_table_ref(m);
    size_t off = 0;
    uint32_t first = 0;
    for (size_t i = 0; i < m->nsites; off += m->sites[i].len, first += m->sites[i].count, i++) {
        if (ap_prepatch_next(p, &pos, &ps) || ps.addr + m->base != ap_table_site_addr(&t, first) ||
            ps.len != m->sites[i].len)
            return "its sites are not the ones in memory";
        if (!ap_site_outside(m, i) && !ap_equal_small(m->orig + off, ps.written, ps.len))
            return "memory does not hold the bytes it says were written";
    }
    return NULL;
}

/* The path the module's file is read by: the main program's is the file
 * mapped, not the path it was started by (which may name another file by
 * now). */
static const char *file_path(const struct ap_module *m)
{
    return m->path[0] ? m->path : "/proc/self/exe";
}

/*
 * The section of @p m's file (*@p path: file_path()), parsed and checked
 * against @p m: 0 with *@p buf (malloc'ed) and @p p, -ENOMEM, or 1 with
 * *@p why.
 */
static int load_checked(const struct ap_module *m, const char **path, uint8_t **buf,
                        struct ap_prepatch *p, const char **why)
{
    size_t len = 0;
    *buf = NULL;
    *why = NULL;
    *path = file_path(m);
    int r = read_section(*path, buf, &len, why);
    if (r == -ENOMEM)
        return r;
    if (!r) /* else read_section() said why */
        *why = ap_prepatch_parse(*buf, len, p) ? "malformed " AP_PREPATCH_SECTION " section"
                                               : mismatch(m, p);
    if (!*why)
        return 0;
    free(*buf);
    *buf = NULL;
    return 1;
}

/* Forget a module's file choices (and the copy a dry run kept). */
static void ap_prepatch_drop(struct ap_module *m)
{
    m->prepatch_choices = false;
    m->prepatch_agreed = false;
    free(m->prepatch_res);
    m->prepatch_res = NULL;
}

/*
 * Take the originals of the checked record @p p, and the file's choices as
 * the sites' results: a site list before the module's first apply shows what
 * memory holds. A choice that names no entry of its site, or a site outside
 * the text, keeps every result at the original (the module is then planned).
 */
static void take_file(struct ap_module *m, const struct ap_prepatch *p)
{
    size_t pos = 0;
    struct ap_prepatch_site ps;
    bool choices = true;
    for (size_t i = 0; i < m->nsites && ap_prepatch_next(p, &pos, &ps) == 0; i++) {
        size_t off = ap_orig_off(m, i);
        if (off == AP_NO_ORIG) {
            choices = false;
            continue;
        }
        ap_copy_small(m->orig + off, ps.orig, ps.len);
        if (ps.chosen < -1 || (ps.chosen >= 0 && (uint32_t)ps.chosen >= m->sites[i].count))
            choices = false;
        else
            m->st[i].res = ap_res_ok(ps.chosen);
    }
    if (!choices)
        for (size_t i = 0; i < m->nsites; i++)
            m->st[i].res = ap_res_ok(-1);
    m->prepatch_choices = choices;
    m->prepatch_planner = p->planner == AP_PREPATCH_PLANNER;
}

int ap_prepatch_originals(struct ap_module *m)
{
    const char *path, *why;
    uint8_t *buf;
    struct ap_prepatch p;
    int r = load_checked(m, &path, &buf, &p, &why);
    if (r < 0)
        return r;
    if (r) {
        ap_log(ALTPATCH_WARN, "%s: pre-patched file: originals not usable: %s\n", path, why);
        m->reason = ALTPATCH_REASON_BAD_TABLE;
        return 0;
    }
    take_file(m, &p);
    free(buf);
    return 0;
}

/* ap_plan_note_check()'s reading of the module's sites (struct note_sites). */
struct note_sites {
    struct ap_module *m;
    bool keep; /* each site's selection kept as its result */
};

AP_HOT static int note_pick(void *ctx, size_t i, const struct altpatch_features *fs)
{
    struct note_sites *ns = ctx;
    struct ap_module *m = ns->m;
    if (ap_orig_off(m, i) == AP_NO_ORIG)
        return AP_NOTE_OUTSIDE;
    struct ap_site_entries eb;
    const struct ap_site *es;
    const struct ap_entry *ents = ap_module_site_entries(m, i, &eb, &es);
    int pick = ap_plan_pick(&m->view, es, ents, fs);
    if (ns->keep && pick >= -1)
        m->st[i].res = ap_res_ok(pick);
    return pick;
}

/*
 * Check the filled plan note @p pn against the module, and against the
 * file's record @p p when not NULL (else memory's bytes, keeping each site's
 * selection as its result); NULL when it holds, else why not.
 */
static const char *note_mismatch(struct ap_module *m, const struct ap_plan_note *pn,
                                 const struct ap_prepatch *p)
{
    struct note_sites ns = {m, !p};
    /* the writer fills it only when every site lies in the text: then
     * m->orig is every site's bytes, concatenated in table order */
    struct ap_plan_note_sites s = {
        .nsites = m->nsites,
        .table_size = m->table_size,
        .bytes = p ? NULL : m->orig,
        .nbytes = m->site_bytes,
        .rec = p,
        .pick = note_pick,
        .ctx = &ns,
    };
    return ap_plan_note_check(pn, &s);
}

AP_HOT int ap_prepatch_open(struct ap_module *m, const uint8_t *plan, uint32_t plansz)
{
    /* Only the main program's file is reached whatever happens after it is
     * loaded (/proc/self/exe names the file mapped): a library's path may
     * name nothing, or another file, by the time its originals are needed
     * (a relative path after chdir(), an upgrade, a seccomp filter), so its
     * file is read now, as without a note. */
    if (m->path[0])
        return ap_prepatch_originals(m);
    struct ap_plan_note pn;
    int state = plan ? ap_plan_note_parse(plan, plansz, &pn) : 0;
    if (state == 0) /* no note, or left empty by the writer: the file says */
        return ap_prepatch_originals(m);
    const char *why = state < 0 ? "malformed" : note_mismatch(m, &pn, NULL);
    if (why) {
        /* stale (an older writer pre-patched the copy again and left it), or
         * forged: as if empty, the file says */
        for (size_t i = 0; i < m->nsites; i++)
            m->st[i].res = ap_res_ok(-1);
        ap_log(ALTPATCH_INFO, "main program: pre-patched file: plan note not used (%s): "
                              "the file is read\n", why);
        return ap_prepatch_originals(m);
    }
    m->plan_note = plan;
    m->orig_in_file = true;
    m->prepatch_choices = true;
    m->prepatch_planner = pn.planner == AP_PREPATCH_PLANNER;
    return 0;
}

/* Whether the file's record @p p names the plan note's choices and planner. */
static const char *note_disagrees(struct ap_module *m, const struct ap_prepatch *p)
{
    struct ap_plan_note pn;
    if (ap_plan_note_parse(m->plan_note, ALTPATCH_PLAN_NOTE_SIZE, &pn) != 1)
        return "it changed";
    return note_mismatch(m, &pn, p);
}

int ap_prepatch_need(struct ap_module *m, bool refuse)
{
    if (!m->orig_in_file)
        return 0;
    const char *path, *why;
    uint8_t *buf;
    struct ap_prepatch p;
    int r = load_checked(m, &path, &buf, &p, &why);
    if (r < 0)
        return r; /* -ENOMEM: asked again next time */
    if (r) {
        /* memory still holds the note's plan, and orig memory's bytes
         * (never listed as originals while orig_in_file holds) */
        ap_log(refuse ? ALTPATCH_WARN : ALTPATCH_INFO,
               "%s: pre-patched file: originals not usable: %s\n", path, why);
        if (refuse)
            m->reason = ALTPATCH_REASON_BAD_TABLE;
        return 0;
    }
    m->orig_in_file = false;
    why = note_disagrees(m, &p);
    if (why && m->prepatch_choices) {
        /* no apply has used the note's choices yet: the file checked against
         * memory is believed, its originals and its choices, as without a
         * note (planned unless they are the applied set's) */
        ap_log(ALTPATCH_INFO, "%s: pre-patched file: plan note not used (%s)\n", path, why);
        ap_prepatch_drop(m);
        m->settled_gen = 0;
        take_file(m, &p);
    } else {
        /* an apply settled the module from the note (memory held what it
         * hashes): the results are that apply's; the originals are the
         * file's, as a file whose choices are not usable gives them */
        if (why)
            ap_log(ALTPATCH_INFO, "%s: pre-patched file: its record is not its plan note's (%s)\n",
                   path, why);
        size_t pos = 0;
        struct ap_prepatch_site ps;
        for (size_t i = 0; i < m->nsites && ap_prepatch_next(&p, &pos, &ps) == 0; i++)
            if (!ap_site_outside(m, i)) /* none saved outside the text */
                ap_copy_small(m->orig + ap_orig_off(m, i), ps.orig, ps.len);
    }
    free(buf);
    return 0;
}

AP_HOT bool ap_prepatch_agrees(struct ap_module *m, const struct altpatch_features *fs)
{
    /* another planner's bytes (other padding or folding): this library's
     * plan is made and compared with memory (apply.c) */
    if (!m->prepatch_choices || !m->prepatch_planner || m->reason || m->left_orig)
        return false;
    if (m->prepatch_agreed)
        return true;
    ap_module_planned(m);
    size_t patched = 0;
    const struct ap_site_result *file = m->prepatch_res; /* NULL: the results hold them */
    for (size_t i = 0; i < m->nsites; i++) {
        struct ap_site_entries eb;
        const struct ap_site *es;
        const struct ap_entry *ents = ap_module_site_entries(m, i, &eb, &es);
        int want = ap_plan_pick(&m->view, es, ents, fs);
        int had = ap_res_chosen(file ? &file[i] : &m->st[i].res);
        size_t off = ap_orig_off(m, i);
        /* the original selected: the file kept it (memory holds planned) */
        if (want != had || off == AP_NO_ORIG ||
            (want < 0 && !ap_equal_small(m->planned + off, m->orig + off, m->sites[i].len)))
            return false;
        patched += want >= 0;
    }
    if (m->prepatch_res) {
        /* the plan is the file's choices: the results hold them again (a dry run
         * under another set had left its plan there) */
        for (size_t i = 0; i < m->nsites; i++)
            m->st[i].res = m->prepatch_res[i];
        free(m->prepatch_res);
        m->prepatch_res = NULL;
    }
    m->settled_patched = patched;
    m->prepatch_agreed = true;
    return true;
}


AP_HOT bool ap_prepatch_settle(struct ap_module *m, const struct altpatch_features *fs)
{
    bool ok = ap_prepatch_agrees(m, fs);
    ap_prepatch_drop(m);
    return ok;
}

bool ap_prepatch_look(struct ap_module *m, const struct altpatch_features *fs)
{
    if (ap_prepatch_agrees(m, fs))
        return true;
    if (m->prepatch_choices && !m->prepatch_planner)
        ap_prepatch_drop(m); /* another planner's bytes: never settled on */
    else if (m->prepatch_choices && !m->prepatch_res) {
        m->prepatch_res = malloc(m->nsites * sizeof(*m->prepatch_res));
        if (m->prepatch_res)
            for (size_t i = 0; i < m->nsites; i++)
                m->prepatch_res[i] = m->st[i].res;
        else
            ap_prepatch_drop(m); /* decided site by site from now on */
    }
    return false;
}
