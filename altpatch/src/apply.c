/* SPDX-License-Identifier: MIT */
/*
 * altpatch_apply(): orchestration, stats, logging.
 *
 *   lock -> ALTPATCH_OFF? -> threads? -> modules (module.c) -> features
 *     -> per site: plan (plan.c) -> decide against memory -> one batch of
 *        writes for every module (poke.c) -> per-site results -> stats, log
 *
 * Per site, the bytes memory must hold ("target") are the plan's final bytes,
 * the original when the site is refused, or the original for REVERT. Memory
 * is then compared:
 *   equal to target                    -> unchanged, nothing written
 *   equal to original or to the bytes
 *   the last apply left there          -> written
 *   anything else                      -> MEM_MISMATCH: someone else changed
 *                                         it; refused, nothing written
 * One global mutex serializes apply, get_stats and site_foreach.
 */
#include "internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>

static pthread_mutex_t ap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ap_module *ap_mods;    /* modules with tables, load order */
static struct altpatch_stats ap_last; /* stats of the last apply */
static bool ap_applied;              /* an apply has planned at least once */
/*
 * Where this thread is in the entry points: AP_IN_NONE outside, AP_IN_ENTRY
 * inside one without ap_lock (pins being taken or released), AP_IN_LOCKED
 * holding ap_lock (callbacks run there). A second entry on the same thread --
 * from a print or foreach callback, or from a signal handler that interrupted
 * an entry point -- is refused with -EDEADLK before it takes a lock or
 * allocates: the interrupted call may hold ap_lock, the loader's lock or
 * malloc's.
 */
enum { AP_IN_NONE, AP_IN_ENTRY, AP_IN_LOCKED };
static __thread volatile sig_atomic_t ap_in;

/* ------------------------------------------------------------------------- */
/* fork                                                                      */
/* ------------------------------------------------------------------------- */

/*
 * fork() in one thread while another runs an entry point would give a child
 * whose ap_lock is held by a thread that does not exist there: every later
 * call in the child would wait forever. So fork waits: the prepare handler
 * takes ap_lock (and then the live round's lock, in the order an apply takes
 * them) and both processes release them. A fork from inside an entry point
 * on this very thread (a callback, a signal handler) must not wait for
 * itself: it takes the lock only if it is free, and the child, whose copy of
 * this thread still runs that call, releases it when the call returns.
 */
static __thread bool ap_fork_took, ap_fork_gated;

/*
 * The pins are taken and released outside ap_lock (see ap_pins), inside the
 * loader (dl_iterate_phdr, dlopen, dlclose): a child forked meanwhile would
 * inherit the loader's locks held and hang in its first dlopen or
 * dl_iterate_phdr. Those phases pass a gate: any number of threads at once,
 * none while a fork holds it. The prepare handler waits until no thread is
 * in one, then keeps the gate's mutex across the fork, so none can start.
 */
static pthread_mutex_t ap_gate_mx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ap_gate_cv = PTHREAD_COND_INITIALIZER;
static unsigned ap_gate_in; /* threads taking or releasing pins */

static void ap_gate_enter(void)
{
    pthread_mutex_lock(&ap_gate_mx);
    ap_gate_in++;
    pthread_mutex_unlock(&ap_gate_mx);
}

static void ap_gate_leave(void)
{
    pthread_mutex_lock(&ap_gate_mx);
    if (--ap_gate_in == 0)
        pthread_cond_broadcast(&ap_gate_cv);
    pthread_mutex_unlock(&ap_gate_mx);
}

static void ap_atfork_prepare(void)
{
    if (ap_in == AP_IN_NONE) {
        pthread_mutex_lock(&ap_gate_mx);
        while (ap_gate_in)
            pthread_cond_wait(&ap_gate_cv, &ap_gate_mx);
        ap_fork_gated = true;
        pthread_mutex_lock(&ap_lock);
        ap_fork_took = true;
    } else {
        ap_fork_took = pthread_mutex_trylock(&ap_lock) == 0;
    }
    ap_live_fork_prepare();
}

static void ap_atfork_done(void)
{
    ap_live_fork_release();
    if (ap_fork_took) {
        ap_fork_took = false;
        pthread_mutex_unlock(&ap_lock);
    }
    if (ap_fork_gated) {
        ap_fork_gated = false;
        pthread_mutex_unlock(&ap_gate_mx);
    }
}

__attribute__((constructor)) static void ap_atfork_register(void)
{
    pthread_atfork(ap_atfork_prepare, ap_atfork_done, ap_atfork_done);
}

/* ------------------------------------------------------------------------- */
/* Small helpers: version, environment, clock, reasons                       */
/* ------------------------------------------------------------------------- */

#define AP_XSTR(x) #x
#define AP_VSTR(a, b, c) AP_XSTR(a) "." AP_XSTR(b) "." AP_XSTR(c)

const char *altpatch_version(void)
{
    return AP_VSTR(ALTPATCH_VERSION_MAJOR, ALTPATCH_VERSION_MINOR, ALTPATCH_VERSION_PATCH);
}

const char *ap_getenv(const char *name)
{
    if (getauxval(AT_SECURE))
        return NULL;
    return getenv(name);
}

/** An environment switch: set, non-empty and not "0". */
static bool ap_env_on(const char *name)
{
    const char *v = ap_getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

uint64_t ap_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *const ap_reason_text[ALTPATCH_REASON__COUNT] = {
    [ALTPATCH_REASON_NONE] = "no refusal",
    [ALTPATCH_REASON_BAD_TABLE] = "bad record table",
    [ALTPATCH_REASON_BAD_VERSION] = "unknown record format version",
    [ALTPATCH_REASON_SITE_BOUNDS] = "site outside the module's executable sections",
    [ALTPATCH_REASON_REPL_BOUNDS] = "replacement outside altinstr_replacement",
    [ALTPATCH_REASON_REPL_TOO_LONG] = "replacement longer than the site",
    [ALTPATCH_REASON_EMPTY_SITE] = "empty site",
    [ALTPATCH_REASON_SITE_OVERLAP] = "site overlaps another site",
    [ALTPATCH_REASON_ORIG_UNDECODABLE] = "original instruction does not decode",
    [ALTPATCH_REASON_ORIG_CROSSES_END] = "original instruction runs past the site end",
    [ALTPATCH_REASON_REPL_UNDECODABLE] = "replacement instruction does not decode",
    [ALTPATCH_REASON_REPL_CROSSES_END] = "replacement instruction runs past its end",
    [ALTPATCH_REASON_UNKNOWN_FEATURE] = "unknown feature id",
    [ALTPATCH_REASON_RELOC_OVERFLOW] = "relative operand does not fit after relocation",
    [ALTPATCH_REASON_MEM_MISMATCH] = "memory holds neither the original nor the planned bytes",
    [ALTPATCH_REASON_WRITE_DENIED] = "write denied (mprotect and /proc/self/mem)",
    /* live: begin */
    [ALTPATCH_REASON_LIVE_CALL_INSIDE] = "not live-patchable: a call inside the site",
    [ALTPATCH_REASON_LIVE_THREAD_INSIDE] = "live: a thread stayed inside the site",
    [ALTPATCH_REASON_LIVE_NO_ANSWER] = "live: a thread did not answer the handshake",
    /* live: end */
    [ALTPATCH_REASON_UNKNOWN_FLAGS] = "unknown record flags",
};

const char *altpatch_strreason(int reason)
{
    if (reason < 0 || reason >= ALTPATCH_REASON__COUNT || !ap_reason_text[reason])
        return "unknown reason";
    return ap_reason_text[reason];
}

/* ------------------------------------------------------------------------- */
/* Logging                                                                   */
/* ------------------------------------------------------------------------- */

static int ap_default_print(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level != ALTPATCH_WARN && !ap_env_on("ALTPATCH_DEBUG"))
        return 0;
    return vfprintf(stderr, fmt, ap);
}

static altpatch_print_fn ap_print = ap_default_print;

altpatch_print_fn altpatch_set_print(altpatch_print_fn fn)
{
    return __atomic_exchange_n(&ap_print, fn, __ATOMIC_ACQ_REL);
}

void ap_log(enum altpatch_print_level level, const char *fmt, ...)
{
    altpatch_print_fn fn = __atomic_load_n(&ap_print, __ATOMIC_ACQUIRE);
    if (!fn)
        return;
    /* Every message starts with "altpatch: ", whatever the callback. */
    char prefixed[256];
    const char *f = fmt;
    if (snprintf(prefixed, sizeof(prefixed), "altpatch: %s", fmt) < (int)sizeof(prefixed))
        f = prefixed;
    va_list ap;
    va_start(ap, fmt);
    fn(level, f, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------- */
/* Threads                                                                   */
/* ------------------------------------------------------------------------- */

/** Threads of this process (/proc/self/task entries), or -1 when unknown. */
static long ap_count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    long n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------------- */
/* Pinning modules                                                           */
/* ------------------------------------------------------------------------- */

/*
 * The module list describes what dl_iterate_phdr() saw; once the walk returns
 * another thread may dlclose() a library and unmap its site and replacement
 * bytes. Every loaded library is therefore pinned with dlopen(path,
 * RTLD_NOLOAD) for the duration of an apply or a site walk, and released at
 * the end; a module of the list that is not pinned (unloaded meanwhile, or a
 * new copy at another address, or loaded after the pins were taken) is
 * skipped this time. The main program (empty path) cannot be unloaded. A
 * library loaded with dlmopen() into another namespace is not found by name
 * and is skipped too.
 *
 * The pins are taken BEFORE ap_lock and released AFTER it: dlopen() takes the
 * loader's lock, which a thread running a library constructor holds; if that
 * constructor calls altpatch_apply() while we held ap_lock and waited for the
 * loader, both would wait forever.
 */
struct ap_pins {
    void **h;
    uintptr_t *base;
    char **name;
    size_t n, cap;
};

static int ap_pins_collect(struct dl_phdr_info *info, size_t size, void *data)
{
    struct ap_pins *p = data;
    (void)size;
    if (!info->dlpi_name || !info->dlpi_name[0])
        return 0;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 32;
        char **nn = realloc(p->name, cap * sizeof(*nn));
        if (!nn)
            return 1;
        p->name = nn;
        p->cap = cap;
    }
    if (!(p->name[p->n] = strdup(info->dlpi_name)))
        return 1;
    p->n++;
    return 0;
}

/** Pin every loaded library (never called with ap_lock held). */
static void ap_pins_take(struct ap_pins *p)
{
    ap_gate_enter(); /* see ap_gate_mx */
    *p = (struct ap_pins){0};
    dl_iterate_phdr(ap_pins_collect, p); /* dlopen() is not allowed inside the walk */
    p->h = calloc(p->n ? p->n : 1, sizeof(*p->h));
    p->base = calloc(p->n ? p->n : 1, sizeof(*p->base));
    for (size_t i = 0; p->h && p->base && i < p->n; i++) {
        void *h = dlopen(p->name[i], RTLD_NOLOAD | RTLD_LAZY);
        struct link_map *lm = NULL;
        if (h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm) {
            p->h[i] = h;
            p->base[i] = lm->l_addr;
        } else if (h) {
            dlclose(h);
        }
    }
    ap_gate_leave();
}

/** Release the pins (a library dlclose'd meanwhile is unmapped here). */
static void ap_pins_release(struct ap_pins *p)
{
    ap_gate_enter();
    for (size_t i = 0; i < p->n; i++) {
        if (p->h && p->h[i])
            dlclose(p->h[i]);
        free(p->name[i]);
    }
    free(p->h);
    free(p->base);
    free(p->name);
    *p = (struct ap_pins){0};
    ap_gate_leave();
}

/** Mark the modules of @p list that @p p does not pin as gone (skipped). */
static void ap_pin(struct ap_module *list, const struct ap_pins *p)
{
    for (struct ap_module *m = list; m; m = m->next) {
        m->pin = NULL;
        m->gone = m->path[0] != '\0';
        for (size_t i = 0; m->gone && p->h && i < p->n; i++) {
            if (p->h[i] && p->base[i] == m->base && strcmp(p->name[i], m->path) == 0) {
                m->pin = p->h[i];
                m->gone = false;
            }
        }
        if (m->gone)
            ap_log(ALTPATCH_DEBUG, "%s: unloaded or loaded while applying: skipped\n",
                   m->path);
    }
}

/** Forget the pins held by the list (ap_pins_release() drops them). */
static void ap_unpin(struct ap_module *list)
{
    for (struct ap_module *m = list; m; m = m->next)
        m->pin = NULL;
}

/* ------------------------------------------------------------------------- */
/* Deciding one site                                                         */
/* ------------------------------------------------------------------------- */

enum ap_action { AP_ACT_UNCHANGED, AP_ACT_WRITE, AP_ACT_REFUSED };

/** One site of one apply (kept small: applies of 10^5..10^6 sites keep them all). */
struct ap_work {
    struct ap_module *m;
    size_t idx;
    const uint8_t *orig;    /* saved original, NULL when outside the text */
    const uint8_t *cur;     /* live memory, NULL when outside the text */
    const uint8_t *old;     /* what memory holds, for the writer */
    uint8_t *target;        /* the bytes memory must hold (in the run's arena) */
    char *detail;           /* the planner's detail of a refusal (malloc'ed), or NULL */
    int chosen;             /* entry memory will hold; -1 = original */
    int reason;             /* refusal, or NONE */
    enum ap_action action;
};

/**
 * The plan of site @p i: from the module's cache when it holds one for this
 * feature set, else from the planner (and then cached if accepted). Fills
 * out->reason, chosen and detail; returns the final bytes (valid while @p out
 * and the module live).
 */
static const uint8_t *ap_plan_cached(struct ap_module *m, size_t i,
                                     const struct altpatch_features *fs, struct ap_memo *memo,
                                     struct ap_plan *out)
{
    size_t off = m->orig_off[i];
    const uint8_t *orig = off != AP_NO_ORIG ? m->orig + off : NULL;
    if (orig && m->cache_chosen[i] != AP_NOT_CACHED) {
        out->reason = ALTPATCH_REASON_NONE;
        out->chosen = m->cache_chosen[i];
        out->detail[0] = '\0';
        return m->cache_final + off;
    }
    /* perf: the planner through this apply's memo (memo.c): identical sites planned once */
    ap_memo_plan(memo, &m->view, &m->sites[i], m->entries, orig, fs, out);
    if (orig && out->reason == ALTPATCH_REASON_NONE) {
        m->cache_chosen[i] = (int32_t)out->chosen;
        memcpy(m->cache_final + off, out->final, m->sites[i].len);
    }
    return out->final;
}

/** Forget a module's cached plans unless they were made for @p fs. */
static void ap_cache_check(struct ap_module *m, const struct altpatch_features *fs)
{
    if (m->cache_valid && memcmp(&m->cache_fs, fs, sizeof(*fs)) == 0)
        return;
    for (size_t i = 0; i < m->nsites; i++)
        m->cache_chosen[i] = AP_NOT_CACHED;
    m->cache_fs = *fs;
    m->cache_valid = true;
}

static void ap_decide(struct ap_work *wk, const struct altpatch_features *fs,
                      struct ap_memo *memo, unsigned flags)
{
    struct ap_module *m = wk->m;
    const struct ap_site *s = &m->sites[wk->idx];
    size_t off = m->orig_off[wk->idx];
    struct ap_plan plan;
    wk->orig = off != AP_NO_ORIG ? m->orig + off : NULL;
    wk->cur = s->len ? ap_view_text(&m->view, s->addr, s->len) : NULL;
    const uint8_t *final = ap_plan_cached(m, wk->idx, fs, memo, &plan);
    if (plan.reason && plan.detail[0])
        wk->detail = strndup(plan.detail, sizeof(plan.detail));
    wk->reason = m->reason ? m->reason : plan.reason;
    wk->chosen = wk->reason || (flags & ALTPATCH_APPLY_REVERT) ? -1 : plan.chosen;
    if (!wk->orig || !wk->cur) {
        if (!wk->reason)
            wk->reason = ALTPATCH_REASON_SITE_BOUNDS;
        wk->chosen = -1;
        wk->action = AP_ACT_REFUSED;
        return;
    }
    memcpy(wk->target, wk->chosen >= 0 ? final : wk->orig, s->len);
    const uint8_t *planned = m->planned + off;
    if (memcmp(wk->cur, wk->target, s->len) == 0) {
        wk->action = wk->reason ? AP_ACT_REFUSED : AP_ACT_UNCHANGED;
    } else if (memcmp(wk->cur, wk->orig, s->len) == 0 ||
               memcmp(wk->cur, planned, s->len) == 0) {
        wk->old = memcmp(wk->cur, wk->orig, s->len) == 0 ? wk->orig : planned;
        wk->action = AP_ACT_WRITE;
    } else {
        wk->reason = ALTPATCH_REASON_MEM_MISMATCH;
        wk->chosen = -1;
        wk->action = AP_ACT_REFUSED;
    }
}

/* ------------------------------------------------------------------------- */
/* Debug output                                                              */
/* ------------------------------------------------------------------------- */

static void ap_hex(char *out, size_t outsz, const uint8_t *p, size_t len)
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < len && o + 4 < outsz; i++)
        o += (size_t)snprintf(out + o, outsz - o, i ? " %02x" : "%02x", p[i]);
}

/** "symbol+0xoff" (dladdr), else "module+0xoff". */
static void ap_symbolize(char *out, size_t outsz, const struct ap_module *m, uint64_t addr)
{
    Dl_info di;
    if (dladdr((void *)(uintptr_t)addr, &di) && di.dli_sname && di.dli_saddr) {
        snprintf(out, outsz, "%s+0x%lx", di.dli_sname,
                 (unsigned long)(addr - (uintptr_t)di.dli_saddr));
        return;
    }
    const char *name = m->path[0] ? m->path : program_invocation_short_name;
    const char *slash = strrchr(name, '/');
    snprintf(out, outsz, "%s+0x%lx", slash ? slash + 1 : name, (unsigned long)(addr - m->base));
}

static void ap_debug_entry(const struct ap_entry *e, const char *sym)
{
    const char *name = altpatch_feature_name(e->feature);
    ap_log(ALTPATCH_DEBUG,
           "feat: %s%u*32+%u (%s), old: (%s (0x%lx) len: %u), repl: (0x%lx, len: %u) "
           "flags: 0x%x\n",
           (e->flags & ALT_FLAG_NOT) ? "!" : "", e->feature / 32, e->feature % 32,
           name ? name : "?", sym, (unsigned long)e->site, e->instrlen, (unsigned long)e->repl,
           e->repllen, e->flags);
}

/** One block per site, in the style of the kernel's debug-alternative. */
static void ap_debug_site(const struct ap_work *wk)
{
    const struct ap_site *s = &wk->m->sites[wk->idx];
    char sym[192], hex[AP_MAX_SITE * 3 + 1];
    unsigned long a = (unsigned long)s->addr;
    ap_symbolize(sym, sizeof(sym), wk->m, s->addr);
    for (uint32_t k = 0; k < s->count; k++)
        ap_debug_entry(&wk->m->entries[s->first + k], sym);
    if (s->count > 1) {
        if (wk->chosen >= 0)
            ap_log(ALTPATCH_DEBUG, "0x%lx: chosen: entry %d of %u\n", a, wk->chosen, s->count);
        else
            ap_log(ALTPATCH_DEBUG, "0x%lx: chosen: original\n", a);
    }
    if (wk->reason)
        ap_log(ALTPATCH_DEBUG, "0x%lx: refused: %s%s%s\n", a, altpatch_strreason(wk->reason),
               wk->detail ? ": " : "", wk->detail ? wk->detail : "");
    if (!wk->orig)
        return;
    ap_hex(hex, sizeof(hex), wk->orig, s->len);
    ap_log(ALTPATCH_DEBUG, "0x%lx:   old_insn: %s\n", a, hex);
    ap_hex(hex, sizeof(hex), wk->action == AP_ACT_REFUSED ? wk->cur : wk->target, s->len);
    ap_log(ALTPATCH_DEBUG, "0x%lx: final_insn: %s\n", a, hex);
}

/** One WARN line when a site becomes refused (not again while the reason stays). */
static void ap_warn_refusal(const struct ap_work *wk)
{
    const struct ap_site *s = &wk->m->sites[wk->idx];
    char sym[192];
    ap_symbolize(sym, sizeof(sym), wk->m, s->addr);
    ap_log(ALTPATCH_WARN, "site %s (0x%lx) refused: %s%s%s\n", sym, (unsigned long)s->addr,
           altpatch_strreason(wk->reason), wk->detail ? ": " : "",
           wk->detail ? wk->detail : "");
}

/* ------------------------------------------------------------------------- */
/* One apply                                                                 */
/* ------------------------------------------------------------------------- */

struct ap_run {
    struct ap_work *work;
    uint8_t *arena; /* target bytes of every site */
    size_t nwork;
    struct ap_write *writes;
    size_t *wmap; /* writes[i] belongs to work[wmap[i]] */
    size_t nwrites;
    struct ap_poke_stats pst;
};

static int ap_collect(struct ap_run *r, const struct altpatch_features *fs, unsigned flags)
{
    size_t n = 0, bytes = 0;
    for (struct ap_module *m = ap_mods; m; m = m->next) {
        if (m->gone)
            continue;
        n += m->nsites;
        for (size_t i = 0; i < m->nsites; i++)
            bytes += m->sites[i].len;
    }
    /* perf: malloc, not calloc: every item is written whole below (one pass, not two) */
    r->work = malloc((n ? n : 1) * sizeof(*r->work));
    r->arena = malloc(bytes ? bytes : 1);
    if (!r->work || !r->arena)
        return -ENOMEM;
    struct ap_memo memo; /* perf: plans of identical sites, this apply only */
    ap_memo_init(&memo, fs);
    bytes = 0;
    for (struct ap_module *m = ap_mods; m; m = m->next) {
        if (m->gone)
            continue;
        if (m->nsites)
            ap_cache_check(m, fs);
        for (size_t i = 0; i < m->nsites; i++) {
            struct ap_work *wk = &r->work[r->nwork++];
            *wk = (struct ap_work){.m = m, .idx = i, .target = r->arena + bytes};
            bytes += m->sites[i].len;
            ap_decide(wk, fs, &memo, flags);
        }
    }
    ap_memo_free(&memo);
    return 0;
}

static int ap_cmp_write(const void *a, const void *b)
{
    const struct ap_write *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/** Build the batch (sorted by address; work order is per module, modules interleave). */
static int ap_batch(struct ap_run *r)
{
    /* perf: malloc: only the first nwrites entries are written and read */
    r->writes = malloc((r->nwork ? r->nwork : 1) * sizeof(*r->writes));
    r->wmap = malloc((r->nwork ? r->nwork : 1) * sizeof(*r->wmap));
    if (!r->writes || !r->wmap)
        return -ENOMEM;
    for (size_t i = 0; i < r->nwork; i++) {
        struct ap_work *wk = &r->work[i];
        if (wk->action != AP_ACT_WRITE)
            continue;
        /* result carries the work index through qsort */
        r->writes[r->nwrites++] = (struct ap_write){
            .addr = (uintptr_t)wk->m->sites[wk->idx].addr, .old = wk->old,
            .new = wk->target, .len = wk->m->sites[wk->idx].len, .result = (int)i};
    }
    /* perf: sites come in table order, usually sorted already: check before sorting */
    bool sorted = true;
    for (size_t i = 1; i < r->nwrites && sorted; i++)
        sorted = r->writes[i - 1].addr < r->writes[i].addr;
    if (!sorted)
        qsort(r->writes, r->nwrites, sizeof(*r->writes), ap_cmp_write);
    for (size_t i = 0; i < r->nwrites; i++)
        r->wmap[i] = (size_t)r->writes[i].result;
    return 0;
}

/** Fold the writer's per-write results back into the work items. */
static void ap_results_from_writes(struct ap_run *r)
{
    for (size_t i = 0; i < r->nwrites; i++) {
        struct ap_work *wk = &r->work[r->wmap[i]];
        if (r->writes[i].result != ALTPATCH_REASON_NONE) {
            wk->reason = r->writes[i].result;
            wk->chosen = -1;
            wk->action = AP_ACT_REFUSED;
        }
    }
}

/** Record per-site results and stats; remember written bytes unless a dry run. */
static void ap_record(struct ap_run *r, unsigned flags, struct altpatch_stats *st)
{
    bool debug = ap_env_on("ALTPATCH_DEBUG");
    for (size_t i = 0; i < r->nwork; i++) {
        struct ap_work *wk = &r->work[i];
        struct ap_module *m = wk->m;
        struct ap_site_result *res = &m->res[wk->idx];
        bool refused = wk->action == AP_ACT_REFUSED || wk->reason;
        /* One WARN per site and reason: a site that toggles between refused
         * and unchanged (REVERT, another feature set) does not warn again. */
        uint32_t bit = refused && wk->reason > 0 && wk->reason < 32 ? 1u << wk->reason : 0;
        if (refused && res->reason != wk->reason && !(res->warned & bit))
            ap_warn_refusal(wk);
        res->warned |= bit;
        res->chosen = refused ? -1 : (int32_t)wk->chosen;
        res->reason = (int16_t)wk->reason;
        res->state = refused            ? ALTPATCH_SITE_REFUSED
                     : wk->chosen >= 0 ? ALTPATCH_SITE_PATCHED
                                       : ALTPATCH_SITE_ORIGINAL;
        st->sites_seen++;
        st->sites_refused += refused;
        st->sites_patched += res->state == ALTPATCH_SITE_PATCHED;
        st->sites_unchanged += !refused && wk->action == AP_ACT_UNCHANGED;
        if (!(flags & ALTPATCH_APPLY_DRY_RUN) && !refused)
            memcpy(m->planned + m->orig_off[wk->idx], wk->target, m->sites[wk->idx].len);
        if (debug)
            ap_debug_site(wk);
    }
    for (struct ap_module *m = ap_mods; m; m = m->next)
        st->modules += !m->gone;
    st->bytes_written = r->pst.bytes;
    st->pages_written = r->pst.pages;
    st->syscalls = r->pst.syscalls;
    st->mprotect_windows = r->pst.mprotect_writes; /* live */
    st->procmem_writes = r->pst.procmem_writes;    /* live */
}

static int ap_run_locked(const struct altpatch_features *fs, unsigned flags, bool live,
                         const struct ap_pins *pins, struct altpatch_stats *st)
{
    struct ap_run r = {0};
    int err = ap_modules_refresh(&ap_mods);
    if (!err)
        ap_pin(ap_mods, pins);
    if (!err)
        err = ap_collect(&r, fs, flags);
    if (!err)
        err = ap_batch(&r);
    if (!err && !(flags & ALTPATCH_APPLY_DRY_RUN) && r.nwrites) {
        unsigned pf = ((flags & ALTPATCH_APPLY_PROCMEM_ONLY) ? AP_POKE_PROCMEM_ONLY : 0) |
                      ((flags & ALTPATCH_APPLY_NO_PROCMEM) ? AP_POKE_NO_PROCMEM : 0);
        /* live: other threads may run the sites (docs/live.md) */
        err = live ? ap_live_poke(r.writes, r.nwrites, &r.pst)
                   : ap_poke(r.writes, r.nwrites, pf, &r.pst);
        st->live = live;
        ap_results_from_writes(&r);
        if (err)
            ap_log(ALTPATCH_WARN, "writer stopped: %s\n", strerror(-err));
    }
    if (r.work && (!err || r.nwrites)) {
        ap_record(&r, flags, st);
        ap_applied = true;
    }
    ap_unpin(ap_mods);
    for (size_t i = 0; i < r.nwork; i++)
        free(r.work[i].detail);
    free(r.work);
    free(r.arena);
    free(r.writes);
    free(r.wmap);
    return err;
}

/* ------------------------------------------------------------------------- */
/* Public entry points                                                       */
/* ------------------------------------------------------------------------- */

#define AP_APPLY_FLAGS                                                                     \
    (ALTPATCH_APPLY_DRY_RUN | ALTPATCH_APPLY_REVERT | ALTPATCH_APPLY_PROCMEM_ONLY |        \
     ALTPATCH_APPLY_NO_PROCMEM | ALTPATCH_APPLY_LIVE | ALTPATCH_APPLY_NO_LIVE)

/** libbpf-style check: sz covers at least the sz field; unknown tail bytes are zero. */
static bool ap_opts_valid(const void *opts, size_t sz, size_t known)
{
    if (sz < sizeof(size_t))
        return false;
    for (size_t i = known; i < sz; i++)
        if (((const uint8_t *)opts)[i])
            return false;
    return true;
}

/**
 * Copy the fields the caller's struct has; the rest stay defaults (zero).
 * The struct has no padding (`reserved` fills what was its tail padding), so
 * every byte past the known fields, `reserved` included, must be zero.
 */
static int ap_read_opts(const struct altpatch_apply_opts *in, struct altpatch_apply_opts *out)
{
    memset(out, 0, sizeof(*out));
    if (!in)
        return 0;
    if (!ap_opts_valid(in, in->sz, sizeof(*in)))
        return -EINVAL;
    memcpy(out, in, in->sz < sizeof(*out) ? in->sz : sizeof(*out));
    if (out->reserved || (out->flags & ~(unsigned)AP_APPLY_FLAGS))
        return -EINVAL;
    if ((out->flags & ALTPATCH_APPLY_PROCMEM_ONLY) && (out->flags & ALTPATCH_APPLY_NO_PROCMEM))
        return -EINVAL;
    /* live: the live protocol writes through /proc/self/mem only */
    if ((out->flags & ALTPATCH_APPLY_LIVE) &&
        (out->flags & (ALTPATCH_APPLY_NO_LIVE | ALTPATCH_APPLY_NO_PROCMEM)))
        return -EINVAL;
    return 0;
}

/**
 * Whether the writes must use the live protocol (*live): asked for, or other
 * threads run (live: docs/live.md). 0, or -EBUSY when other threads run and
 * live patching is refused (ALTPATCH_APPLY_NO_LIVE) or not possible.
 */
static int ap_check_threads(unsigned flags, bool *live)
{
    *live = false;
    if (flags & ALTPATCH_APPLY_DRY_RUN)
        return 0;
    long n = ap_count_threads();
    if (n <= 1 && !(flags & ALTPATCH_APPLY_LIVE))
        return 0; /* unknown (no /proc): the writer needs /proc too and will refuse */
    const char *why = "ALTPATCH_APPLY_NO_LIVE";
    if (!(flags & (ALTPATCH_APPLY_NO_LIVE | ALTPATCH_APPLY_NO_PROCMEM)) && !ap_live_ready(&why)) {
        *live = true;
        return 0;
    }
    if (flags & ALTPATCH_APPLY_NO_PROCMEM)
        why = "ALTPATCH_APPLY_NO_PROCMEM (live patching writes through /proc/self/mem)";
    ap_log(ALTPATCH_WARN,
           "%ld threads running: call altpatch_apply() before starting threads "
           "(live patching: %s)\n",
           n, why);
    return -EBUSY;
}

int altpatch_apply_opts(const struct altpatch_apply_opts *opts)
{
    struct altpatch_apply_opts o;
    int err = ap_read_opts(opts, &o);
    if (err)
        return err;
    if (ap_in != AP_IN_NONE)
        return -EDEADLK; /* from a callback, or a signal handler that interrupted a call */
    ap_in = AP_IN_ENTRY;
    struct ap_pins pins;
    ap_pins_take(&pins); /* before ap_lock: see ap_pins */
    pthread_mutex_lock(&ap_lock);
    ap_in = AP_IN_LOCKED;
    uint64_t t0 = ap_now_ns();
    bool live = false; /* live */
    struct altpatch_stats st = {.sz = sizeof(st)};
    if (ap_env_on("ALTPATCH_OFF")) {
        ap_log(ALTPATCH_INFO, "ALTPATCH_OFF is set: nothing patched\n");
    } else if (!(err = ap_check_threads(o.flags, &live))) {
        struct altpatch_features host;
        if (!o.features)
            ap_effective_features(&host);
        err = ap_run_locked(o.features ? o.features : &host, o.flags, live, &pins, &st);
    }
    if (err != -EBUSY) {
        st.ns = ap_now_ns() - t0;
        ap_last = st;
        ap_log(ALTPATCH_INFO,
               "%lu modules, %lu sites: %lu patched, %lu unchanged, %lu refused; %lu bytes in "
               "%lu pages, %lu syscalls, %lu ns%s\n",
               (unsigned long)st.modules, (unsigned long)st.sites_seen,
               (unsigned long)st.sites_patched, (unsigned long)st.sites_unchanged,
               (unsigned long)st.sites_refused, (unsigned long)st.bytes_written,
               (unsigned long)st.pages_written, (unsigned long)st.syscalls,
               (unsigned long)st.ns, (o.flags & ALTPATCH_APPLY_DRY_RUN) ? " (dry run)" : "");
    }
    ap_in = AP_IN_ENTRY;
    pthread_mutex_unlock(&ap_lock);
    ap_pins_release(&pins);
    ap_in = AP_IN_NONE;
    return err;
}

int altpatch_apply(void)
{
    return altpatch_apply_opts(NULL);
}

void *altpatch_dlopen(const char *path, int flags)
{
    if (ap_in != AP_IN_NONE) {
        /* From a callback or a signal handler that interrupted a call: the
         * interrupted code may hold the loader's lock or malloc's. */
        errno = EDEADLK;
        return NULL;
    }
    ap_gate_enter(); /* a fork waits: no child with the loader's locks held */
    void *h = dlopen(path, flags);
    ap_gate_leave();
    if (!h)
        return NULL;
    int err = altpatch_apply();
    if (err)
        ap_log(ALTPATCH_WARN, "%s: loaded, not patched: %s\n", path ? path : "(main)",
               strerror(-err));
    return h;
}

int altpatch_get_stats(struct altpatch_stats *st)
{
    if (!st || st->sz < sizeof(size_t))
        return -EINVAL;
    size_t sz = st->sz;
    /* From a callback (or a handler that interrupted one of our calls while
     * it held ap_lock): the lock is already ours. From a handler that
     * interrupted a call around its lock: take it only if it is free. */
    bool lock = ap_in != AP_IN_LOCKED;
    if (ap_in == AP_IN_ENTRY) {
        if (pthread_mutex_trylock(&ap_lock))
            return -EDEADLK;
    } else if (lock) {
        pthread_mutex_lock(&ap_lock);
    }
    struct altpatch_stats cp = ap_last;
    if (lock)
        pthread_mutex_unlock(&ap_lock);
    cp.sz = sz;
    memcpy(st, &cp, sz < sizeof(cp) ? sz : sizeof(cp));
    if (sz > sizeof(cp))
        memset((uint8_t *)st + sizeof(cp), 0, sz - sizeof(cp));
    return 0;
}

/** Fill @p info for site @p i of @p m. */
static void ap_site_info(const struct ap_module *m, size_t i, struct altpatch_site_info *info)
{
    const struct ap_site *s = &m->sites[i];
    const struct ap_site_result *res = &m->res[i];
    const struct ap_entry *e = &m->entries[s->first + (res->chosen >= 0 ? res->chosen : 0)];
    size_t off = m->orig_off[i];
    *info = (struct altpatch_site_info){
        .module = m->path,
        .addr = (uintptr_t)s->addr,
        .len = s->len,
        .entries = s->count,
        .chosen = res->chosen,
        .feature = e->feature,
        .flags = e->flags,
        .state = (enum altpatch_site_state)res->state,
        .reason = res->reason,
        .original = off != AP_NO_ORIG ? m->orig + off : NULL,
        .current = off != AP_NO_ORIG ? (const uint8_t *)(uintptr_t)s->addr : NULL,
    };
}

int altpatch_site_foreach(altpatch_site_fn fn, void *ctx)
{
    if (!fn)
        return -EINVAL;
    if (ap_in != AP_IN_NONE)
        return -EDEADLK;
    ap_in = AP_IN_ENTRY;
    struct ap_pins pins;
    ap_pins_take(&pins); /* before ap_lock: see ap_pins */
    pthread_mutex_lock(&ap_lock);
    ap_in = AP_IN_LOCKED;
    /* Drop modules dlclose'd since the last apply (their memory is gone); a
     * module loaded since is listed with its original bytes, as memory holds. */
    int ret = ap_applied ? ap_modules_refresh(&ap_mods) : -ENODATA;
    if (!ret)
        ap_pin(ap_mods, &pins); /* the callback may read info.current */
    for (struct ap_module *m = ap_mods; m && !ret; m = m->next) {
        for (size_t i = 0; i < m->nsites && !ret && !m->gone; i++) {
            struct altpatch_site_info info;
            ap_site_info(m, i, &info);
            ret = fn(&info, ctx);
        }
    }
    ap_unpin(ap_mods);
    ap_in = AP_IN_ENTRY;
    pthread_mutex_unlock(&ap_lock);
    ap_pins_release(&pins);
    ap_in = AP_IN_NONE;
    return ret;
}
