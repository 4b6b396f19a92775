/* SPDX-License-Identifier: MIT */
/*
 * Modules: finding every loaded object's altpatch tables.
 *
 * dl_iterate_phdr() lists the executable, its libraries, the vDSO and
 * libraries dlopen'ed since. A module takes part when one of its PT_NOTE
 * segments holds the note (owner "altpatch", type ALTPATCH_NOTE_TYPE) that
 * <altpatch/alternative.h> emits; the note's self-relative offsets give the
 * table and the replacement range. Others (vDSO, libc) are ignored.
 *
 * Everything is checked against the module's own program headers before a
 * byte is read: the table and the replacement range must lie inside one of
 * its PT_LOAD segments, the table in memory the loader leaves read-only (else
 * the module is refused with BAD_TABLE), and site
 * bytes are only read when the site lies inside an executable segment (sites
 * outside are refused by the planner with SITE_BOUNDS).
 *
 * A module is identified by (path, base, phdr) and its content (table and
 * replacement bytes; after an unload, also its site bytes). The list is kept
 * across calls:
 *   - unchanged dlpi_adds/dlpi_subs counters: nothing was loaded or unloaded,
 *     the walk is skipped;
 *   - a module no longer listed (dlclose) is freed: nothing dangles;
 *   - a listed library whose table or replacement bytes differ from the
 *     hashes taken when it was first seen, or -- after any library was unloaded --
 *     whose sites hold neither their saved original nor the bytes the last
 *     apply wrote (another library, or a new build of the same file, at the
 *     same address) is read again. The main program is never unloaded, so
 *     never replaced at its address: its table and replacement bytes are
 *     not hashed.
 * Original site bytes are saved before anything is written to a module (by
 * its first apply as it reads each site, or ap_module_save() before): later
 * applies plan from them even when memory already holds a replacement.
 */
#include "host.h"

#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------- */
/* Program headers                                                           */
/* ------------------------------------------------------------------------- */

/** True when [start, end) lies inside one PT_LOAD segment (with PF_R when @p need_r). */
static bool ap_in_load(const struct dl_phdr_info *info, uint64_t start, uint64_t end)
{
    if (end < start)
        return false;
    for (size_t i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_R))
            continue;
        uint64_t s = info->dlpi_addr + ph->p_vaddr;
        if (start >= s && end <= s + ph->p_memsz)
            return true;
    }
    return false;
}

/** The view: every readable executable PT_LOAD (whole p_memsz) minus the replacement range. */
static void ap_text_regions(const struct dl_phdr_info *info, struct ap_view *v,
                            const struct ap_region *repl)
{
    struct ap_segment seg[AP_MAX_TEXT];
    size_t n = 0;
    for (size_t i = 0; i < info->dlpi_phnum && n < AP_MAX_TEXT; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || !(ph->p_flags & PF_R))
            continue;
        uint64_t s = info->dlpi_addr + ph->p_vaddr;
        seg[n++] = (struct ap_segment){s, ph->p_memsz, (const uint8_t *)(uintptr_t)s, true};
    }
    ap_view_build(v, seg, n, repl->addr, repl->size, repl->data);
}

/* ------------------------------------------------------------------------- */
/* Notes                                                                     */
/* ------------------------------------------------------------------------- */

/*
 * The module's altpatch note descriptor, or NULL: in the first PT_NOTE
 * segment that holds one. Only notes inside a PT_LOAD are read. With @p plan
 * not NULL, the plan note of that segment too, found in the same walk of its
 * notes (ap_note_find_plan()): NULL when it has none.
 */
AP_HOT static const uint8_t *ap_find_notes(const struct dl_phdr_info *info, uint32_t *descsz,
                                    const uint8_t **plan, uint32_t *plansz)
{
    for (size_t i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE)
            continue;
        size_t align = ph->p_align == 8 ? 8 : 4;
        uint64_t start = info->dlpi_addr + ph->p_vaddr;
        if (start < info->dlpi_addr || !ap_in_load(info, start, start + ph->p_filesz))
            continue; /* not mapped by the module (a broken or hostile header): never read */
        const uint8_t *p = (const uint8_t *)(uintptr_t)start;
        const uint8_t *d = plan ? ap_note_find_plan(p, ph->p_filesz, align, descsz, plan, plansz)
                                : ap_note_find(p, ph->p_filesz, align, descsz);
        if (d)
            return d;
    }
    if (plan) {
        *plan = NULL;
        *plansz = 0;
    }
    return NULL;
}

static const uint8_t *ap_find_note(const struct dl_phdr_info *info, uint32_t *descsz)
{
    return ap_find_notes(info, descsz, NULL, NULL);
}

/* Whether the callback's @p size covers the loader's counters. */
static bool ap_walk_counted(size_t size)
{
    return size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(unsigned long long);
}

static bool ap_walk_unchanged(const struct dl_phdr_info *info);

/*
 * The libraries with a note (base, program headers) as the last complete
 * module walk found them, with that walk's loader counters: while the
 * counters are still those, nothing was loaded or unloaded since, so the same
 * objects are loaded and a library carries a note exactly when it is one of
 * these. The pins' walk of a later apply, before apply's lock, then needs no
 * header searched (ap_module_note_seen()). Written under apply's lock
 * (ap_modules_refresh_seen()), read without it: a sequence count, odd while
 * written; ap_noted_n above AP_NOTES_SEEN: not known.
 */
AP_STATE static unsigned ap_noted_seq;
AP_STATE static unsigned long long ap_noted_adds, ap_noted_subs;
AP_STATE static size_t ap_noted_n = AP_NOTES_SEEN + 1;
AP_STATE static struct {
    uintptr_t base;
    const void *phdr;
} ap_noted[AP_NOTES_SEEN];

/* Keep the libraries of @p list, a complete walk's under @p adds, @p subs. */
static void ap_noted_publish(const struct ap_module *list, unsigned long long adds,
                             unsigned long long subs)
{
    unsigned seq = __atomic_load_n(&ap_noted_seq, __ATOMIC_RELAXED);
    __atomic_store_n(&ap_noted_seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    size_t n = 0;
    for (const struct ap_module *m = list; m && n <= AP_NOTES_SEEN; m = m->next) {
        if (!m->path[0])
            continue; /* the main program: never pinned, never searched */
        if (n < AP_NOTES_SEEN) {
            __atomic_store_n(&ap_noted[n].base, m->base, __ATOMIC_RELAXED);
            __atomic_store_n(&ap_noted[n].phdr, m->phdr, __ATOMIC_RELAXED);
        }
        n++;
    }
    __atomic_store_n(&ap_noted_n, n, __ATOMIC_RELAXED);
    __atomic_store_n(&ap_noted_adds, adds, __ATOMIC_RELAXED);
    __atomic_store_n(&ap_noted_subs, subs, __ATOMIC_RELAXED);
    __atomic_store_n(&ap_noted_seq, seq + 2, __ATOMIC_RELEASE);
}

/* The kept libraries into @p s when they describe the counters @p adds,
 * @p subs (a consistent copy: no walk finished meanwhile). */
static bool ap_noted_read(struct ap_notes_seen *s, unsigned long long adds,
                          unsigned long long subs)
{
    unsigned seq = __atomic_load_n(&ap_noted_seq, __ATOMIC_ACQUIRE);
    size_t n = __atomic_load_n(&ap_noted_n, __ATOMIC_RELAXED);
    bool ok = !(seq & 1) && n <= AP_NOTES_SEEN &&
              __atomic_load_n(&ap_noted_adds, __ATOMIC_RELAXED) == adds &&
              __atomic_load_n(&ap_noted_subs, __ATOMIC_RELAXED) == subs;
    for (size_t i = 0; ok && i < n; i++) {
        s->noted[i].base = __atomic_load_n(&ap_noted[i].base, __ATOMIC_RELAXED);
        s->noted[i].phdr = __atomic_load_n(&ap_noted[i].phdr, __ATOMIC_RELAXED);
    }
    s->noted_n = ok ? n : 0;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return ok && __atomic_load_n(&ap_noted_seq, __ATOMIC_RELAXED) == seq;
}

AP_HOT bool ap_module_note_seen(const struct dl_phdr_info *info, size_t size, bool search,
                         struct ap_notes_seen *s)
{
    if (!s->started) {
        s->started = true;
        s->counted = ap_walk_counted(size);
        if (s->counted) {
            s->adds = info->dlpi_adds;
            s->subs = info->dlpi_subs;
            /* The kept list is up to date with these counters: the module
             * walk will stop at its first object and needs no note (a hint
             * only: a walk that finds it wrong searches the headers). */
            s->idle = ap_walk_unchanged(info);
            s->noted_known = s->idle && ap_noted_read(s, s->adds, s->subs);
        }
        s->first_main = !search && (!info->dlpi_name || !info->dlpi_name[0]);
        s->main_base = info->dlpi_addr;
        s->main_phdr = info->dlpi_phdr;
        s->main_name = info->dlpi_name;
        s->main_phnum = info->dlpi_phnum;
    }
    if (s->noted_known) {
        /* the same objects as the last complete walk's: its libraries */
        for (size_t i = 0; search && i < s->noted_n; i++)
            if (s->noted[i].base == info->dlpi_addr &&
                s->noted[i].phdr == (const void *)info->dlpi_phdr) {
                s->lib_notes++;
                return true;
            }
        return false;
    }
    uint32_t descsz = 0;
    const uint8_t *desc = search ? ap_find_note(info, &descsz) : NULL;
    if (desc && info->dlpi_name && info->dlpi_name[0])
        s->lib_notes++;
    if (s->idle)
        return desc != NULL;
    if (s->n < AP_NOTES_SEEN) {
        s->obj[s->n].base = info->dlpi_addr;
        s->obj[s->n].phdr = info->dlpi_phdr;
        s->obj[s->n].desc = desc;
        s->obj[s->n].descsz = descsz;
        s->obj[s->n].searched = search;
    }
    s->n++;
    return desc != NULL;
}

/* ------------------------------------------------------------------------- */
/* Building and freeing one module                                           */
/* ------------------------------------------------------------------------- */

static void ap_module_free(struct ap_module *m)
{
    if (!m)
        return;
    ap_mem_free(m->path);
    ap_mem_free(m->entries);
    ap_mem_free(m->sites);
    ap_mem_free(m->at);
    ap_mem_free(m->block); /* st, orig, planned */
    ap_mem_free(m->outside);
    ap_mem_free(m->warned);
    ap_mem_free(m->prepatch_res);
    ap_mem_free(m);
}

AP_HOT void ap_module_save_all(struct ap_module *m)
{
    /* Locals throughout: the byte stores below may alias any field of m. */
    const struct ap_tsite *sites = m->sites;
    struct ap_site_state *st = m->st;
    uint8_t *orig = m->orig, *planned = m->planned;
    const struct ap_table_ref t = ap_table_ref(m);
    uint32_t off = 0, first = 0;
    for (size_t i = 0, n = m->nsites; i < n; i++) {
        uint8_t len = sites[i].len;
        /* the original (host.h), no template (m->shape_gen: any) */
        ap_site_state_put(&st[i], ap_res_ok(-1), 0);
        if (!ap_site_outside(m, i))
            /* the original, and the bytes the last apply left: memory's
             * until an apply writes (a site in the text: its address) */
            ap_copy2_small(orig + off, planned + off,
                           (const uint8_t *)(uintptr_t)ap_table_site_addr(&t, first), len);
        off += len;
        first += sites[i].count;
    }
    m->shape_gen = AP_SHAPE_GEN_ANY;
    m->planned_memo = NULL; /* planned holds every site's bytes */
    m->saved = true;
}

void ap_module_fill_planned(struct ap_module *m)
{
    const struct ap_memo *memo = m->planned_memo;
    m->planned_memo = NULL;
    size_t off = 0;
    uint32_t first = 0;
    for (size_t i = 0, n = m->nsites; i < n;
         off += m->sites[i].len, first += m->sites[i].count, i++) {
        if (ap_site_outside(m, i))
            continue;
        uint8_t *p = m->planned + off;
        const uint8_t *plan = ap_module_plan_bytes(m, memo, i, first, off, p);
        if (!plan)
            plan = m->orig + off;
        if (plan != p)
            ap_copy_small(p, plan, m->sites[i].len);
    }
}

void ap_module_plan_originals(struct ap_module *m)
{
    for (size_t i = 0, off = 0; i < m->nsites; off += m->sites[i].len, i++)
        if (!ap_site_outside(m, i))
            ap_copy_small(m->planned + off, m->orig + off, m->sites[i].len);
    m->planned_memo = NULL;
}

/*
 * The sites outside the module's text (host.h: m->outside), unless the table
 * pass proved none is (text_all). 0 or -ENOMEM.
 */
static int ap_mark_outside(struct ap_module *m)
{
    if (m->text_all)
        return 0;
    struct ap_region_cursor rc = {0};
    const struct ap_table_ref t = ap_table_ref(m);
    for (size_t i = 0, n = m->nsites, first = 0; i < n; first += m->sites[i].count, i++) {
        if (ap_region_at(&rc, &m->view, ap_table_site_addr(&t, (uint32_t)first), m->sites[i].len))
            continue;
        if (!m->outside) {
            m->outside = ap_mem_calloc((n + 63) / 64, sizeof(*m->outside));
            if (!m->outside)
                return -ENOMEM;
        }
        m->outside[i / 64] |= 1ull << (i % 64);
    }
    return 0;
}

/*
 * The per-site arrays in one allocation (m->block): st (each site's result
 * and template), then the original bytes of every site (none saved for one
 * outside the text), at the offsets the table pass gave (m->at: host.h),
 * and at the same offsets the bytes the last apply left (planned). Filled by
 * ap_module_save() -- at once for a pre-patched module, else by the module's
 * first decision (apply.c), which reads every site's memory anyway, or by
 * whatever reads them before.
 */
static int ap_save_originals(struct ap_module *m, uint64_t total, const uint8_t *plan,
                             uint32_t plansz)
{
    size_t n = m->nsites;
    if (total >= AP_SITE_BYTES_MAX)
        return -ENOMEM; /* 32-bit offsets (ap_module_tables() refused more) */
    size_t head = n * sizeof(*m->st);
    size_t size = head + 2 * total;
    /* st and the originals are written by the first decision, whole; planned
     * only where a later apply needs it (host.h: planned_memo): its pages
     * are not made present here */
    uint8_t *b = ap_malloc_filled_head(size, size - total);
    if (!b)
        return -ENOMEM;
    m->block = b;
    m->site_bytes = total;
    m->st = (struct ap_site_state *)(void *)b;
    m->orig = b + head;
    m->planned = m->orig + total;
    m->shape_gen = AP_SHAPE_GEN_ANY;
    int err = ap_mark_outside(m);
    if (err)
        return err;
    /* A pre-patched file (format 2 or 4): memory holds a profile's bytes, the
     * compiler's originals are in the file (prepatch_load.c). */
    if (!ap_note_prepatched(&m->note))
        return 0;
    ap_module_save_all(m);
    /* the plan note (found with the table note, in its segment: image.c
     * reads it there too); only the main program's is used (prepatch_load.c) */
    return ap_prepatch_open(m, m->path[0] ? NULL : plan, plansz);
}

/*
 * The facts of the table pass that hold for the whole module (host.h).
 * records_plain: each record's replacement starts, as a signed number, at
 * or above repl_lo >= view.repl's start >= 0: so below 2^63, where its end
 * (at most 255 bytes on) does not wrap, and that end is at or below
 * repl_hi <= view.repl's end: it lies inside altinstr_replacement, which has
 * bytes; its flags are 0 or ALT_FLAG_NOT and its feature below
 * AP_SCAN_FEATURES (no feature_high) == 32 * AP_NCAPWORDS. The REPL_BOUNDS,
 * unknown flag and feature checks of ap_memo_keeps_original_entries() then
 * pass at every site (the length check stays per site).
 * text_all: the sites, in address order and none with a preset reason (so
 * none empty), lie in [text_lo, text_hi); the first region that holds that
 * range, with bytes, when no region before it meets the range:
 * ap_view_find() gives it for every site, so ap_region_at() gives its bytes
 * at every site.
 */
static void ap_module_facts(struct ap_module *m, const struct ap_table_scan *sc)
{
    const struct ap_region *rr = &m->view.repl;
    m->records_plain = sc->nsites && sc->flags_known && !sc->feature_high && rr->data &&
                       sc->repl_lo >= 0 && (uint64_t)sc->repl_lo >= rr->addr &&
                       rr->size <= UINT64_MAX - rr->addr && sc->repl_hi <= rr->addr + rr->size;
    m->text_all = NULL;
    if (!sc->text_span || !sc->nsites || sc->text_hi <= sc->text_lo)
        return;
    uint64_t lo = sc->text_lo, hi = sc->text_hi;
    const struct ap_region *t = ap_view_find(&m->view, lo, hi - lo);
    if (!t || !t->data)
        return;
    for (const struct ap_region *q = m->view.text; q < t; q++)
        if (q->addr < hi && (lo < q->addr || lo - q->addr < q->size))
            return; /* meets the range: it might hold some site */
    m->text_all = t;
}

/*
 * parts_apart: the range from the lowest site to the highest site end meets
 * neither the record table nor the replacement section (sites in address
 * order: the scan's text_lo/text_hi; else every site looked at). No write to
 * a site can then change a record or a replacement that a later site reads.
 */
static void ap_module_apart(struct ap_module *m, const struct ap_table_scan *sc)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    if (sc->text_span) {
        lo = sc->text_lo;
        hi = sc->text_hi;
    } else {
        struct ap_table_ref t = ap_table_ref(m);
        for (size_t i = 0, first = 0; i < sc->nsites; first += sc->sites[i].count, i++) {
            uint64_t a = ap_table_site_addr(&t, (uint32_t)first), e = a + sc->sites[i].len;
            lo = a < lo ? a : lo;
            hi = e < a ? UINT64_MAX : e > hi ? e : hi;
        }
    }
    const struct ap_note *no = &m->note;
    const struct ap_region *rr = &m->view.repl;
    m->parts_apart = hi <= lo || ((hi <= no->table_start || lo >= no->table_end) &&
                                  (hi <= rr->addr || (lo >= rr->addr && lo - rr->addr >= rr->size)));
}

/* Records of a table whose first apply reads them kept in an array (host.h). */
unsigned ap_records_keep_max = 384;
uint64_t ap_site_bytes_max = AP_SITE_BYTES_MAX;

/**
 * True when [start, end) lies in memory the loader leaves read-only: a
 * PT_LOAD segment without PF_W, or a PT_GNU_RELRO range (read-only once
 * relocated). A module keeps no copy of its sites' addresses but reads them
 * from its table (ap_site_addr()), so the table must not change after it
 * was checked; one in writable memory could.
 */
static bool ap_in_fixed(const struct dl_phdr_info *info, uint64_t start, uint64_t end)
{
    for (size_t i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        bool fixed = (ph->p_type == PT_LOAD && !(ph->p_flags & PF_W)) ||
                     ph->p_type == PT_GNU_RELRO;
        uint64_t s = info->dlpi_addr + ph->p_vaddr;
        if (fixed && start >= s && end <= s + ph->p_memsz)
            return true;
    }
    return false;
}

/** Decode the table and group it into sites (the module is refused on a bad table). */
AP_HOT static int ap_module_tables(struct ap_module *m, const struct dl_phdr_info *info,
                            const uint8_t *plan, uint32_t plansz)
{
    const struct ap_note *n = &m->note;
    if (n->table_end < n->table_start || n->repl_end < n->repl_start ||
        !ap_in_load(info, n->table_start, n->table_end) ||
        !ap_in_load(info, n->repl_start, n->repl_end) ||
        (n->table_end > n->table_start && !ap_in_fixed(info, n->table_start, n->table_end))) {
        m->reason = ALTPATCH_REASON_BAD_TABLE;
        return 0;
    }
    struct ap_region repl = {n->repl_start, n->repl_end - n->repl_start,
                             (const uint8_t *)(uintptr_t)n->repl_start};
    ap_text_regions(info, &m->view, &repl);
    /* No site may rewrite what the library reads as its own (a layout that
     * makes it executable: ld -z noseparate-code): the table, which every
     * apply reads its sites' addresses from, the note and the plan note. */
    ap_view_cut(&m->view, n->table_start, n->table_end);
    ap_view_cut(&m->view, n->desc_start, n->desc_end);
    if (plan)
        ap_view_cut(&m->view, (uint64_t)(uintptr_t)plan, (uint64_t)(uintptr_t)plan + plansz);
    const uint8_t *table = (const uint8_t *)(uintptr_t)n->table_start;
    m->table_size = n->table_end - n->table_start;
    m->table_read = true;
    /* The hashes recognise another library loaded at the same address after
     * an unload; the main program is never unloaded (ap_content_unchanged). */
    bool main_program = !m->path[0];
    if (!main_program)
        m->repl_hash = ap_bytes_hash(m->view.repl.data, m->view.repl.size);
    /* One pass: sites, their preset reasons, the module-wide facts, the
     * features named and the table's hash; the entries too for a table of
     * at most ap_records_keep_max records (the first apply reads them, then
     * they are dropped). A larger table's records stay in the mapped table:
     * a site decodes its own when they are read (its first decision too),
     * unless some site has more than a small buffer holds: then a second
     * pass keeps them all (ap_module_drop_entries). */
    struct ap_table_scan sc;
    bool keep = m->table_size / n->record_size <= ap_records_keep_max;
    int r = ap_table_scan(table, m->table_size, n->table_start, n->record_size,
                          (keep ? AP_SCAN_ENTRIES : AP_SCAN_FACTS) |
                              (main_program ? 0 : AP_SCAN_HASH),
                          &sc);
    m->table_hash = sc.hash;
    if (r < 0)
        return r;
    if (r != ALTPATCH_REASON_NONE) {
        m->reason = r;
        return 0;
    }
    if (!keep && sc.max_count > AP_SITE_ENTRIES) {
        ap_mem_free(sc.sites);
        ap_mem_free(sc.at);
        uint64_t hash = sc.hash;
        r = ap_table_scan(table, m->table_size, n->table_start, n->record_size, AP_SCAN_ENTRIES,
                          &sc);
        if (r < 0)
            return r;
        sc.hash = hash;
    }
    if (sc.site_bytes >= ap_site_bytes_max) {
        /* more bytes of sites than the originals' offsets reach (host.h):
         * this module is refused, the apply of the others goes on */
        ap_mem_free(sc.sites);
        ap_mem_free(sc.at);
        ap_mem_free(sc.entries);
        m->reason = ALTPATCH_REASON_BAD_TABLE;
        return 0;
    }
    m->entries = sc.entries;
    m->nentries = m->table_size / n->record_size; /* the records, kept or not */
    m->sites = sc.sites;
    m->at = sc.at;
    m->nsites = sc.nsites;
    /* The CPUID leaf groups: once per distinct feature. */
    m->leaves = AP_LEAVES_BASE;
    for (size_t w = 0; w < AP_SCAN_FEATURES / 64 && m->leaves != AP_LEAVES_ALL; w++)
        for (uint64_t bits = sc.features[w]; bits; bits &= bits - 1)
            m->leaves |= ap_feature_leaves((unsigned)(w * 64 + (unsigned)__builtin_ctzll(bits)));
    if (sc.feature_high)
        m->leaves |= ap_feature_leaves(sc.feature_high);
    m->entries_keep = sc.max_count > AP_SITE_ENTRIES;
    ap_module_facts(m, &sc);
    ap_module_apart(m, &sc);
    return ap_save_originals(m, sc.site_bytes, plan, plansz);
}

AP_HOT void ap_module_drop_entries(struct ap_module *m)
{
    if (m->entries_keep)
        return;
    ap_mem_free(m->entries);
    m->entries = NULL;
}

/** Build the module for @p info (which carries the note descriptor @p desc
 * and, in its segment, the plan note @p plan or NULL). */
static int ap_module_new(const struct dl_phdr_info *info, const uint8_t *desc, uint32_t descsz,
                         const uint8_t *plan, uint32_t plansz, struct ap_module **out)
{
    struct ap_module *m = ap_mem_calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    /* a copy of the path without strdup() (one more function for the dynamic
     * linker to resolve on a process's first apply) */
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    size_t len = ap_strnlen(name, SIZE_MAX);
    m->path = ap_mem_alloc(len + 1);
    if (m->path)
        ap_copy_small((uint8_t *)m->path, (const uint8_t *)name, len + 1);
    m->base = info->dlpi_addr;
    m->phdr = info->dlpi_phdr;
    m->present = true;
    int err = m->path ? 0 : -ENOMEM;
    if (!err) {
        m->reason = ap_note_parse(desc, descsz, (uint64_t)(uintptr_t)desc, &m->note);
        if (m->reason == ALTPATCH_REASON_NONE)
            err = ap_module_tables(m, info, plan, plansz);
    }
    if (err) {
        ap_module_free(m);
        return err;
    }
    if (m->reason)
        ap_log(ALTPATCH_WARN, "%s: altpatch tables refused: %s\n",
               m->path[0] ? m->path : "main program", altpatch_strreason(m->reason));
    *out = m;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Refresh                                                                   */
/* ------------------------------------------------------------------------- */

struct ap_walk {
    struct ap_module **list;
    const struct ap_notes_seen *seen; /* the notes of a walk just before (NULL: none) */
    size_t index;                     /* objects seen by this walk */
    int err;
    bool skip;      /* counters unchanged: nothing to do */
    bool first;     /* first callback of this walk */
    bool reload;    /* a library was unloaded since the last walk */
    unsigned long long adds, subs; /* the loader's counters this walk saw */
};

/* Loader counters at the last complete walk, and the list they describe. */
AP_STATE static unsigned long long ap_last_adds, ap_last_subs;
AP_STATE static struct ap_module **ap_last_list;
/* Written under apply's lock; read without it too (ap_module_note_seen's
 * hint), so every access is atomic. */
static inline struct ap_module **ap_last_list_get(void)
{
    return __atomic_load_n(&ap_last_list, __ATOMIC_RELAXED);
}

/* The loader's counters of @p info (counted) are those of the last complete walk. */
static bool ap_walk_unchanged(const struct dl_phdr_info *info)
{
    return ap_last_list_get() &&
           info->dlpi_adds == __atomic_load_n(&ap_last_adds, __ATOMIC_RELAXED) &&
           info->dlpi_subs == __atomic_load_n(&ap_last_subs, __ATOMIC_RELAXED);
}

static bool ap_same_identity(const struct ap_module *m, const struct dl_phdr_info *info)
{
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    return m->base == info->dlpi_addr && m->phdr == (const void *)info->dlpi_phdr &&
           strcmp(m->path, name) == 0;
}

/**
 * True when every site holds its saved original or the bytes the last apply
 * left (or nothing is saved yet: the first decision saves what memory holds).
 */
static bool ap_sites_unchanged(struct ap_module *m)
{
    if (!m->saved)
        return true;
    ap_module_planned(m);
    struct ap_region_cursor rc = {0}; /* the last site's region: sites come in order */
    const struct ap_table_ref t = ap_table_ref(m);
    size_t off = 0;
    uint32_t first = 0;
    for (size_t i = 0; i < m->nsites; off += m->sites[i].len, first += m->sites[i].count, i++) {
        if (ap_site_outside(m, i))
            continue;
        uint8_t len = m->sites[i].len;
        const uint8_t *cur = ap_region_at(&rc, &m->view, ap_table_site_addr(&t, first), len);
        if (!cur)
            return false;
        if (!ap_equal_small(cur, m->orig + off, len) && !ap_equal_small(cur, m->planned + off, len))
            return false;
    }
    return true;
}

/**
 * True when the module in memory is still the one first seen: the same table
 * and replacement bytes, and -- when a library may have been unloaded since
 * (@p reload: the loader's unload counter moved) -- every site holding its
 * saved original or what the last apply wrote. A file replaced on disk and
 * loaded again at the same address fails one of these and is read again.
 */
static bool ap_content_unchanged(struct ap_module *m, const struct dl_phdr_info *info,
                                 bool reload)
{
    if (!m->table_read)
        return true; /* refused before the table was read: nothing to compare */
    if (!m->path[0])
        return true; /* the main program: never unloaded, so never replaced (no hashes kept) */
    if (!ap_in_load(info, m->note.table_start, m->note.table_end) ||
        !ap_in_load(info, m->note.repl_start, m->note.repl_end))
        return false;
    if (ap_table_hash((const uint8_t *)(uintptr_t)m->note.table_start, m->table_size,
                      m->note.record_size) != m->table_hash ||
        ap_bytes_hash(m->view.repl.data, m->view.repl.size) != m->repl_hash)
        return false;
    return !reload || ap_sites_unchanged(m);
}

/** Put @p nm in the place of @p old (or at the end when @p old is NULL). */
static void ap_list_put(struct ap_module **list, struct ap_module *old, struct ap_module *nm)
{
    struct ap_module **pp = list;
    while (*pp && *pp != old)
        pp = &(*pp)->next;
    nm->next = old ? old->next : NULL;
    *pp = nm;
    ap_module_free(old);
}

AP_HOT static int ap_walk_one(struct dl_phdr_info *info, size_t size, void *data)
{
    struct ap_walk *w = data;
    size_t index = w->index++;
    if (w->first) {
        w->first = false;
        bool counted = ap_walk_counted(size);
        if (counted && ap_last_list_get() == w->list && *w->list &&
            info->dlpi_adds == __atomic_load_n(&ap_last_adds, __ATOMIC_RELAXED) &&
            info->dlpi_subs == __atomic_load_n(&ap_last_subs, __ATOMIC_RELAXED)) {
            w->skip = true;
            return 1;
        }
        /* the walk before saw these same objects only under the same counters */
        if (w->seen && !(w->seen->complete && w->seen->counted && counted &&
                         info->dlpi_adds == w->seen->adds && info->dlpi_subs == w->seen->subs))
            w->seen = NULL;
        /* Recorded only when the walk completes (ap_modules_refresh): a walk
         * that fails part way leaves modules it never reached unchecked, so
         * the next one must still see the unload and check their sites. */
        w->reload = info->dlpi_subs != __atomic_load_n(&ap_last_subs, __ATOMIC_RELAXED);
        w->adds = info->dlpi_adds;
        w->subs = info->dlpi_subs;
    }
    struct ap_module *m = *w->list;
    while (m && !ap_same_identity(m, info))
        m = m->next;
    if (m && ap_content_unchanged(m, info, w->reload)) {
        m->present = true;
        return 0;
    }
    uint32_t descsz = 0, plansz = 0;
    const uint8_t *desc, *plan = NULL;
    if (w->seen && index < AP_NOTES_SEEN && index < w->seen->n && w->seen->obj[index].searched &&
        w->seen->obj[index].base == info->dlpi_addr &&
        w->seen->obj[index].phdr == (const void *)info->dlpi_phdr) {
        desc = w->seen->obj[index].desc; /* this object, as the walk before found it */
        descsz = w->seen->obj[index].descsz;
    } else if (info->dlpi_name && info->dlpi_name[0]) {
        desc = ap_find_note(info, &descsz);
    } else { /* the main program: its plan note too (prepatch_load.c) */
        desc = ap_find_notes(info, &descsz, &plan, &plansz);
    }
    if (!desc)
        return 0;
    struct ap_module *nm;
    w->err = ap_module_new(info, desc, descsz, plan, plansz, &nm);
    if (w->err)
        return 1;
    ap_list_put(w->list, m, nm);
    return 0;
}

int ap_modules_refresh(struct ap_module **list)
{
    return ap_modules_refresh_seen(list, NULL);
}

/*
 * Whether the walk before (@p seen) stands for the module walk of an empty
 * @p list: it saw every object under the loader's counters, the first being
 * the main program, and no library with a note. Then only the main program
 * can make a module, and it is never unloaded: the module walk looks at it
 * alone, as that walk found it, without walking the loaded objects again. A
 * library loaded since has no pin (ap_pin() would skip it this time); the
 * counters this leaves for the next walk are the walk before's, so that
 * walk sees it.
 */
static bool ap_walk_main_alone(const struct ap_module *list, const struct ap_notes_seen *seen)
{
    return !list && seen && seen->complete && seen->counted && seen->first_main &&
           seen->lib_notes == 0;
}

AP_HOT int ap_modules_refresh_seen(struct ap_module **list, const struct ap_notes_seen *seen)
{
    for (struct ap_module *m = *list; m; m = m->next)
        m->present = false;
    struct ap_walk w = {.list = list, .first = true, .seen = seen};
    if (ap_walk_main_alone(*list, seen)) {
        struct dl_phdr_info info = {
            .dlpi_addr = seen->main_base,
            .dlpi_name = seen->main_name,
            .dlpi_phdr = seen->main_phdr,
            .dlpi_phnum = seen->main_phnum,
            .dlpi_adds = seen->adds,
            .dlpi_subs = seen->subs,
        };
        ap_walk_one(&info, sizeof(info), &w);
    } else {
        dl_iterate_phdr(ap_walk_one, &w);
    }
    if (w.skip) {
        for (struct ap_module *m = *list; m; m = m->next)
            m->present = true;
        return 0;
    }
    if (w.err) {
        /* walk again next time, against the last complete walk's counters */
        __atomic_store_n(&ap_last_list, NULL, __ATOMIC_RELAXED);
        return w.err;        /* keep every module: the marks are incomplete */
    }
    for (struct ap_module **pp = list; *pp;) {
        struct ap_module *m = *pp;
        if (m->present) {
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        ap_module_free(m);
    }
    ap_noted_publish(*list, w.adds, w.subs);
    __atomic_store_n(&ap_last_adds, w.adds, __ATOMIC_RELAXED);
    __atomic_store_n(&ap_last_subs, w.subs, __ATOMIC_RELAXED);
    __atomic_store_n(&ap_last_list, list, __ATOMIC_RELAXED);
    return 0;
}

void ap_modules_free(struct ap_module *list)
{
    while (list) {
        struct ap_module *next = list->next;
        ap_module_free(list);
        list = next;
    }
}
