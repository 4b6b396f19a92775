/* SPDX-License-Identifier: MIT */
/*
 * A first apply writes its queue in parts (ap_part_writes writes each, in
 * address order, while the module is decided): the parts agree with one
 * batch -- every site's bytes and state, the stats, the page count -- for
 * parts of one write, of three and of the whole queue, with each site's
 * records decoded from the mapped table or read from the table pass's array
 * (ap_records_keep_max); writes denied in every part are each refused and
 * leave memory as it was; the next apply finds every site settled; the
 * applies after a first decision, which stores no plan bytes where a
 * template gives them again, start from what it left. And a site's
 * template id in two bytes. Built as test_parts_k1 with format-1
 * records; as test_parts_order with a write out of address order after the
 * parts (then a page a part wrote and the last batch writes again is
 * counted once); as test_parts_wide with a site of ten records in a table of
 * more than 4096 (every record considered; the table pass then keeps every
 * record, so the other builds are the ones whose records are decoded).
 *
 * Applying needs a single-threaded process: each body runs in a fork()ed
 * child (ap_isolate.h).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_call_site.h"
#include "ap_isolate.h"
#include "ap_mdwe.h"
#include "host.h"

#define F_KEEP X86_FEATURE_AVX512F /* never in the sets below: the original stays */

/* W: a write under every set (ALWAYS); K: no entry applies, nothing written;
 * N, L: the same with ALT_FLAG_NOT (a write when F_KEEP is absent, none
 * while ALWAYS is present). */
#define W ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", X86_FEATURE_ALWAYS) "\n\t"
#define K ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", F_KEEP) "\n\t"
#define N ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", ALT_NOT(F_KEEP)) "\n\t"
#define L ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", ALT_NOT(X86_FEATURE_ALWAYS)) "\n\t"

#ifdef PARTS_OUT_OF_ORDER
/* A write out of address order: its code lies below many() (the link puts
 * .text.hot before .text) and is never run; its record follows many()'s
 * sites' in the table, so the queue turns out of order after their parts
 * (and the module's sites are not in address order: its first decision
 * takes every check per site). */
#define LOW ".pushsection .text.hot.parts_low, \"ax\", @progbits\n" "parts_low_site:\n\t" W ".popsection\n\t"
extern const char parts_low_site[];
#else
/* Every site in address order: a first decision on the module's facts (a
 * one-record site's keep bit from its raw record where decoded). */
#define LOW ""
#endif

/* 41 sites of 5 bytes in one function that starts a page: 30 writes, 10
 * kept (their pattern puts a part's end both on a write and beside a kept
 * site), some of each with ALT_FLAG_NOT; then the write out of order and a
 * last write (W) after it in the table, on the page of many()'s parts: the
 * last batch, sorted, writes a page a part wrote before. */
__attribute__((noinline, aligned(4096))) static long many(void)
{
    long v;
    __asm__ __volatile__(W W W K W W K W N W W L W W W K W W K W
                         W N W K W W L W W W W K W N W K W W L W
                         LOW W
                         : "=a"(v));
    return v;
}

#ifdef PARTS_WIDE
/* A site of ten records (nested as ALTERNATIVE_2() nests): the last that
 * applies under {ALWAYS} is the ninth (index 8, movl $18), after the third
 * (index 2, movl $12) that the first eight alone would choose. */
#define R(o, v, f) ALTERNATIVE(o, "movl $" #v ", %%eax", f)
#define WIDE                                                                                     \
    R(R(R(R(R(R(R(R(R(R("movl $1, %%eax", 10, F_KEEP), 11, ALT_NOT(X86_FEATURE_ALWAYS)), 12,     \
                      X86_FEATURE_ALWAYS),                                                       \
                    13, F_KEEP),                                                                 \
                  14, F_KEEP),                                                                   \
                15, ALT_NOT(X86_FEATURE_ALWAYS)),                                                \
              16, F_KEEP),                                                                       \
            17, F_KEEP),                                                                         \
          18, ALT_NOT(F_KEEP)),                                                                  \
      19, F_KEEP)

__attribute__((noinline, used)) static long wide(void)
{
    long v;
    __asm__ __volatile__(WIDE : "=a"(v));
    return v;
}

/* 4100 more sites: the table holds more than 4096 records, so a first
 * apply decodes each site's records from it (unless the body raises
 * ap_records_keep_max above that), and the
 * pass keeps every record for wide()'s ten (more than AP_SITE_ENTRIES). */
__attribute__((noinline, used)) static void bulk(void)
{
    __asm__ __volatile__(".rept 4100\n\t" K ".endr" ::: "eax");
}
#endif

/* A site whose replacement (7 bytes) is longer than it (5), its record made
 * by hand (ALTERNATIVE() pads the original): the record names F_KEEP, so no
 * entry applies, yet the planner refuses the site (REPL_TOO_LONG) and memory
 * stays. A first decision that tests a record's keep bit from the raw record
 * must read its replacement length too. */
#define TOO_LONG                                                                                 \
    "771:\n\tmovl $1, %%eax\n772:\n773:\n"                                                        \
    ".pushsection altinstr_replacement,\"axR\"\n774:\n\tmovl $2, %%eax\n\tnop\n\tnop\n775:\n"     \
    ".popsection\n"                                                                              \
    ".pushsection " ALTPATCH_STR(ALTPATCH_TABLE_NAME_) ",\"a?R\"\n"                                \
    " .long 771b - .\n .long 774b - .\n" ALTPATCH_FT_(ALTPATCH_STR(F_KEEP))                     \
    " .byte 773b-771b\n .byte 775b-774b\n.popsection\n"

__attribute__((noinline, used)) static long too_long(void)
{
    long v;
    __asm__ __volatile__(TOO_LONG : "=a"(v));
    return v;
}

enum { N_SITES = 41, N_WRITES = 31, MAX_SITES = 64 };

static const uint8_t MOV1[5] = {0xb8, 1, 0, 0, 0};
static const uint8_t MOV2[5] = {0xb8, 2, 0, 0, 0};

struct site_seen {
    uintptr_t addr;
    unsigned feature, flags;
    int state, reason, chosen;
    uint8_t current[5];
};

struct run {
    int rc, rc2, mdwe;
    struct altpatch_stats st, st2;
    unsigned n;
    struct site_seen s[MAX_SITES];
    struct site_seen tl; /* too_long()'s site */
    long value, tl_value;
};

struct ctx {
    unsigned part;
    unsigned records; /* ap_records_keep_max: 0 decodes every site's records */
    bool deny; /* PR_SET_MDWE and ALTPATCH_APPLY_NO_PROCMEM: every write denied */
    bool apart; /* ap_run_block_max 0: the queue in a block of its own */
    bool foreign; /* /proc/self/mem writes text: a foreign call can be put in place */
};

static int seen_cb(const struct altpatch_site_info *si, void *p)
{
    struct run *r = p;
    uintptr_t fn = (uintptr_t)many;
    uintptr_t tl = (uintptr_t)too_long; /* its site, the next function 16 bytes on at least */
    if (si->addr >= tl && si->addr < tl + 16) {
        r->tl = (struct site_seen){.addr = si->addr, .feature = si->feature,
                                   .flags = si->flags, .state = si->state,
                                   .reason = si->reason, .chosen = si->chosen};
        if (si->current && si->len == 5)
            memcpy(r->tl.current, si->current, 5);
        return 0;
    }
    uintptr_t end = fn + 16 + 5 * N_SITES;
    if (tl > fn && tl < end)
        end = tl; /* many()'s sites only: the function after it */
#ifdef PARTS_WIDE
    if ((uintptr_t)wide > fn && (uintptr_t)wide < end)
        end = (uintptr_t)wide; /* many()'s sites only: the function after it */
#endif
    if (si->addr < fn || si->addr >= end || r->n >= MAX_SITES)
        return 0;
    struct site_seen *v = &r->s[r->n++];
    *v = (struct site_seen){.addr = si->addr, .feature = si->feature,
                            .flags = si->flags, .state = si->state,
                            .reason = si->reason, .chosen = si->chosen};
    if (si->current && si->len == 5)
        memcpy(v->current, si->current, 5);
    return 0;
}

static void get_stats(struct altpatch_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->sz = sizeof(*st);
    if (altpatch_get_stats(st))
        abort();
}

/*
 * A body's first steps: the part size and the records threshold of @p c and,
 * where every write is to be denied, MDWE set (its answer in @p mdwe) and
 * the /proc/self/mem writer refused; @p o: an apply under {ALWAYS}, whose
 * feature set is returned (for the caller to free).
 */
static struct altpatch_features *parts_begin(const struct ctx *c, int *mdwe,
                                             struct altpatch_apply_opts *o)
{
    ap_part_writes = c->part;
    ap_records_keep_max = c->records;
    if (c->apart)
        ap_run_block_max = 0;
    *o = (struct altpatch_apply_opts){.sz = sizeof(*o)};
    if (c->deny) {
        altpatch_set_print(NULL); /* the refusals are expected */
        *mdwe = ap_mdwe_set();
        o->flags = ALTPATCH_APPLY_NO_PROCMEM;
    }
    struct altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, X86_FEATURE_ALWAYS))
        abort();
    o->features = f;
    return f;
}

static void body(void *out, void *cv)
{
    struct run *r = out;
    struct altpatch_apply_opts o;
    struct altpatch_features *f = parts_begin(cv, &r->mdwe, &o);
    r->rc = altpatch_apply_opts(&o);
    get_stats(&r->st);
    altpatch_site_foreach(seen_cb, r);
    r->value = many();
    r->tl_value = too_long();
    r->rc2 = altpatch_apply_opts(&o); /* nothing left to do */
    get_stats(&r->st2);
    altpatch_features_free(f);
}

static struct run *run_parts_apart(unsigned part, unsigned records, bool deny, bool apart)
{
    struct ctx c = {part, records, deny, apart, false};
    struct run *r = ap_isolated(sizeof(*r), body, &c);
    if (deny)
        ap_mdwe_require(r->mdwe);
    cr_assert_eq(r->rc, 0, "part of %u: apply %d", part, r->rc);
    cr_assert_eq(r->rc2, 0, "part of %u: the next apply %d", part, r->rc2);
    cr_assert_eq(r->n, N_SITES, "part of %u: %u sites listed", part, r->n);
    return r;
}

static struct run *run_parts(unsigned part, unsigned records, bool deny)
{
    return run_parts_apart(part, records, deny, false);
}

/* Written under the set {ALWAYS}: W and N. */
static bool written(const struct site_seen *v)
{
    bool present = v->feature == X86_FEATURE_ALWAYS;
    return (v->flags & ALT_FLAG_NOT) ? !present : present;
}

/* Every site as the feature set says: W and N patched and written, K and L original. */
static void assert_written(const struct run *r, unsigned part)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    unsigned w = 0;
    for (unsigned i = 0; i < r->n; i++) {
        const struct site_seen *v = &r->s[i];
        if (written(v)) {
            w++;
            cr_assert_eq(v->state, ALTPATCH_SITE_PATCHED, "part of %u: site %u", part, i);
            cr_assert_arr_eq(v->current, MOV2, 5, "part of %u: site %u written", part, i);
        } else {
            cr_assert_eq(v->state, ALTPATCH_SITE_ORIGINAL, "part of %u: site %u", part, i);
            cr_assert_arr_eq(v->current, MOV1, 5, "part of %u: site %u kept", part, i);
        }
    }
    cr_assert_eq(w, N_WRITES);
    cr_assert_eq(r->value, 2, "the last site (a write) runs its replacement");
    cr_assert_eq(r->s[0].addr / pg, r->s[N_SITES - 1].addr / pg, "many()'s sites on one page");
    cr_assert_geq(r->st.sites_patched, N_WRITES);
    /* too_long(): refused, memory as it was, whatever part or records */
    cr_assert_eq(r->tl.state, ALTPATCH_SITE_REFUSED, "part of %u: the site too short", part);
    cr_assert_eq(r->tl.reason, ALTPATCH_REASON_REPL_TOO_LONG);
    cr_assert_arr_eq(r->tl.current, MOV1, 5);
    cr_assert_eq(r->tl_value, 1, "its original runs");
    cr_assert_eq(r->st.sites_refused, 1, "part of %u: too_long() alone refused", part);
    cr_assert_geq(r->st.bytes_written, 5 * N_WRITES);
    /* the next apply: every module settled, nothing written */
    cr_assert_eq(r->st2.bytes_written, 0, "part of %u: the next apply wrote", part);
    cr_assert_eq(r->st2.sites_refused, 1);
    cr_assert_eq(r->st2.sites_patched, r->st.sites_patched);
}

/* Records decoded from the table (0) or read from the table pass's array. */
static const unsigned records[] = {0, 1u << 20};

Test(parts, parts_of_one_three_and_all_agree)
{
#ifdef PARTS_OUT_OF_ORDER
    /* the layout the write out of order needs (GNU ld's default script) */
    if ((uintptr_t)parts_low_site >= (uintptr_t)many)
        cr_skip_test("the link did not put .text.hot below many() (GNU ld does)");
#endif
    struct run *all = run_parts(1u << 20, 1u << 20, false);
    assert_written(all, 1u << 20);
    static const unsigned parts[] = {1, 2, 3, 7, 1u << 20};
    for (size_t q = 0; q < 2 * sizeof(parts) / sizeof(parts[0]); q++) {
        size_t k = q / 2;
        struct run *r = run_parts(parts[k], records[q % 2], false);
        assert_written(r, parts[k]);
        cr_assert_eq(r->st.sites_seen, all->st.sites_seen);
        cr_assert_eq(r->st.sites_patched, all->st.sites_patched);
        cr_assert_eq(r->st.sites_unchanged, all->st.sites_unchanged);
        cr_assert_eq(r->st.bytes_written, all->st.bytes_written);
        cr_assert_eq(r->st.pages_written, all->st.pages_written,
                     "part of %u: a page two parts write is counted once", parts[k]);
        /* one window per part at least: the parts were written apart */
        cr_assert_geq(r->st.mprotect_windows + r->st.procmem_writes,
                      parts[k] == 1 ? N_WRITES / 2 : parts[k] < N_WRITES ? 2 : 1, "part of %u",
                      parts[k]);
        for (unsigned i = 0; i < r->n; i++) {
            cr_assert_eq(r->s[i].addr, all->s[i].addr);
            cr_assert_eq(r->s[i].state, all->s[i].state);
            cr_assert_eq(r->s[i].chosen, all->s[i].chosen);
        }
    }
}

/* The queue in a block of its own (a run whose buffers together pass
 * ap_run_block_max), in parts and whole: the same sites, bytes and stats. */
Test(parts, a_queue_apart_agrees)
{
#ifdef PARTS_OUT_OF_ORDER
    if ((uintptr_t)parts_low_site >= (uintptr_t)many)
        cr_skip_test("the link did not put .text.hot below many() (GNU ld does)");
#endif
    struct run *all = run_parts(1u << 20, 1u << 20, false);
    static const unsigned parts[] = {3, 1u << 20};
    for (size_t q = 0; q < 2 * sizeof(parts) / sizeof(parts[0]); q++) {
        size_t k = q / 2;
        struct run *r = run_parts_apart(parts[k], records[q % 2], false, true);
        assert_written(r, parts[k]);
        cr_assert_eq(r->st.sites_seen, all->st.sites_seen);
        cr_assert_eq(r->st.sites_patched, all->st.sites_patched);
        cr_assert_eq(r->st.bytes_written, all->st.bytes_written);
        cr_assert_eq(r->st.pages_written, all->st.pages_written);
        for (unsigned i = 0; i < r->n; i++) {
            cr_assert_eq(r->s[i].state, all->s[i].state);
            cr_assert_eq(r->s[i].chosen, all->s[i].chosen);
        }
    }
}

Test(parts, writes_denied_in_every_part_are_each_refused)
{
    ap_mdwe_skip_under_valgrind();
    static const unsigned parts[] = {1, 3, 1u << 20};
    for (size_t q = 0; q < 2 * sizeof(parts) / sizeof(parts[0]); q++) {
        size_t k = q / 2;
        struct run *r = run_parts(parts[k], records[q % 2], true);
        unsigned refused = 0;
        for (unsigned i = 0; i < r->n; i++) {
            const struct site_seen *v = &r->s[i];
            cr_assert_arr_eq(v->current, MOV1, 5, "part of %u: site %u untouched", parts[k], i);
            if (!written(v)) {
                cr_assert_eq(v->state, ALTPATCH_SITE_ORIGINAL);
                continue;
            }
            refused++;
            cr_assert_eq(v->state, ALTPATCH_SITE_REFUSED, "part of %u: site %u", parts[k], i);
            cr_assert_eq(v->reason, ALTPATCH_REASON_WRITE_DENIED);
        }
        cr_assert_eq(refused, N_WRITES);
        cr_assert_eq(r->value, 1, "the original runs");
        cr_assert_eq(r->st.bytes_written, 0);
        cr_assert_geq(r->st.sites_refused, N_WRITES);
        cr_assert_eq(r->st.sites_refused + r->st.sites_unchanged, r->st.sites_seen);
    }
}

/* Parts made equal: as many as parts of ap_part_writes need, none longer. */
Test(parts, parts_made_equal)
{
    unsigned saved = ap_part_writes;
    ap_part_writes = 4096;
    cr_assert_eq(ap_part_size(0), 1);
    cr_assert_eq(ap_part_size(1), 1);
    cr_assert_eq(ap_part_size(4096), 4096);
    cr_assert_eq(ap_part_size(4097), 2049, "two parts: %zu", ap_part_size(4097));
    cr_assert_eq(ap_part_size(10000), 3334, "three parts: %zu", ap_part_size(10000));
    cr_assert_eq(ap_part_size(100000), 4000, "25 parts: %zu", ap_part_size(100000));
    for (size_t n = 1; n < 40000; n += 997) {
        size_t p = ap_part_size(n), parts = (n + 4095) / 4096;
        cr_assert_leq(p, 4096);
        cr_assert_eq((n + p - 1) / p, parts, "%zu sites: parts of %zu", n, p);
    }
    ap_part_writes = 3;
    cr_assert_eq(ap_part_size(7), 3, "parts of 3, 2, 2 at most 3: %zu", ap_part_size(7));
    ap_part_writes = 0;
    cr_assert_eq(ap_part_size(5), 1);
    ap_part_writes = saved;
}

/* A site's template id is kept in two bytes: one that does not fit is not
 * remembered (0: looked up again), the original's has a value of its own. */
Test(parts, template_ids_in_two_bytes)
{
    cr_assert_eq(ap_shape_load(ap_shape_store(AP_SHAPE_ORIGINAL)), AP_SHAPE_ORIGINAL);
    cr_assert_eq(ap_shape_store(AP_SHAPE_ORIGINAL), AP_SHAPE_ORIGINAL16);
    cr_assert_eq(ap_shape_load(ap_shape_store(0)), 0);
    cr_assert_eq(ap_shape_load(ap_shape_store(1)), 1);
    cr_assert_eq(ap_shape_load(ap_shape_store(AP_SHAPE_ORIGINAL16 - 1)), AP_SHAPE_ORIGINAL16 - 1);
    cr_assert_eq(ap_shape_store(AP_SHAPE_ORIGINAL16), 0);
    cr_assert_eq(ap_shape_store(70000), 0);
}

/* Where each site's original is kept (host.h: ap_orig_off()): after the sites
 * before it, in every group of AP_SITE_GROUP sites, as ap_orig_off() finds
 * it from the group's offset; each holds what memory held. */
Test(parts, each_site_s_bytes_follow_the_last_site_s)
{
    struct ap_module *list = NULL;
    cr_assert_eq(ap_modules_refresh(&list), 0);
    struct ap_module *m = list;
    while (m && m->path[0])
        m = m->next;
    cr_assert_not_null(m, "the test program's module");
    cr_assert_geq(m->nsites, 3 * AP_SITE_GROUP, "%zu sites", m->nsites);
    ap_module_save(m);
    size_t off = 0;
    for (size_t i = 0; i < m->nsites; off += m->sites[i].len, i++) {
        cr_assert_not(ap_site_outside(m, i), "site %zu", i);
        cr_assert_eq(ap_orig_off(m, i), off, "site %zu: offset %zu, not %zu", i, ap_orig_off(m, i),
                     off);
        cr_assert_arr_eq(m->orig + off, (const void *)(uintptr_t)ap_site_addr(m, i),
                         m->sites[i].len, "site %zu: its original", i);
    }
    cr_assert_eq(off, m->site_bytes);
    ap_modules_free(list);
}

/* Sites whose replacement is a call, relocated to each site (a template
 * with a rel32 field, instantiated per site): C written under {ALWAYS}, D
 * kept. Never run: their bytes are what is checked. */
__attribute__((noinline, used)) long parts_one(void)
{
    return 1;
}
__attribute__((noinline, used)) long parts_two(void)
{
    return 2;
}
__attribute__((noinline, used)) long parts_three(void)
{
    return 3;
}
#define C ALTERNATIVE("call parts_one", "call parts_two", X86_FEATURE_ALWAYS) "\n\t"
#define D ALTERNATIVE("call parts_one", "call parts_two", ALT_NOT(X86_FEATURE_ALWAYS)) "\n\t"
extern const char parts_calls_begin[], parts_calls_end[];
__attribute__((noinline, used)) static void calls(void)
{
    __asm__ __volatile__(".globl parts_calls_begin\nparts_calls_begin:\n\t" C D C C D C C D C
                         ".globl parts_calls_end\nparts_calls_end:\n\t" ::
                             : "memory");
}

/* FOREIGN_AT: a C site after the first (its template known: instantiated
 * where the site's final bytes are kept) */
enum { N_CALLS = 9, FOREIGN_AT = 3 };
static const char CALLS[] = "CDCCDCCDC";

struct calls_run {
    int rc, rc2, rc_rev, mdwe;
    unsigned n, n_rev;
    uintptr_t addr[N_CALLS];
    int state[N_CALLS], reason[N_CALLS];
    uint8_t current[N_CALLS][5];
    /* denied: after the plan's bytes put at call site FOREIGN_AT by another
     * writer, and a revert */
    int state_rev[N_CALLS], reason_rev[N_CALLS];
    uint8_t current_rev[N_CALLS][5];
    uint64_t written, written2, refused;
};

/* sites seen by calls_cb(): the first apply's, or the revert's (rev) */
struct calls_walk {
    struct calls_run *r;
    bool rev;
};

static int calls_cb(const struct altpatch_site_info *si, void *p)
{
    struct calls_walk *cw = p;
    struct calls_run *r = cw->r;
    unsigned *n = cw->rev ? &r->n_rev : &r->n;
    if (si->addr < (uintptr_t)parts_calls_begin || si->addr >= (uintptr_t)parts_calls_end ||
        *n >= N_CALLS || si->len != 5 || !si->current)
        return 0;
    if (cw->rev) {
        r->state_rev[*n] = si->state;
        r->reason_rev[*n] = si->reason;
        memcpy(r->current_rev[*n], si->current, 5);
    } else {
        r->addr[*n] = si->addr;
        r->state[*n] = si->state;
        r->reason[*n] = si->reason;
        memcpy(r->current[*n], si->current, 5);
    }
    (*n)++;
    return 0;
}

static void calls_body(void *out, void *cv)
{
    struct calls_run *r = out;
    const struct ctx *c = cv;
    struct altpatch_apply_opts o;
    struct altpatch_features *f = parts_begin(c, &r->mdwe, &o);
    struct altpatch_apply_opts rev = o;
    rev.flags |= ALTPATCH_APPLY_REVERT;
    struct altpatch_stats st;
    r->rc = altpatch_apply_opts(&o);
    get_stats(&st);
    r->written = st.bytes_written;
    r->refused = st.sites_refused;
    struct calls_walk cw = {r, false};
    altpatch_site_foreach(calls_cb, &cw);
    if (c->deny && c->foreign && r->n > 0) {
        /* what the library keeps for each site is now its original: the
         * plan's bytes put at a call site by another writer are foreign to a
         * revert (refused, left), not what it wrote */
        ap_put_call(r->addr[FOREIGN_AT], (void *)parts_two);
        r->rc_rev = altpatch_apply_opts(&rev);
        cw.rev = true;
        altpatch_site_foreach(calls_cb, &cw);
    }
    r->rc2 = altpatch_apply_opts(&o); /* nothing left to do */
    get_stats(&st);
    r->written2 = st.bytes_written;
    altpatch_features_free(f);
}

/* A first decision instantiates each call site's template where the site's
 * final bytes are kept and queues them from there: in parts of any size
 * each site holds its own call, the next apply finds them settled, and a
 * write denied leaves the original in memory and in what the library
 * keeps (refused, then still refused and unwritten by the next apply). */
Test(parts, relocated_calls_in_every_part)
{
    bool valgrind = ap_under_valgrind();
    static const unsigned parts[] = {1, 2, 1u << 20};
    /* q: the part, the writes denied or not, the records decoded or kept;
     * then parts of 2 again with the queue in a block of its own
     * (ap_run_block_max 0) */
    size_t np = sizeof(parts) / sizeof(parts[0]);
    for (size_t q = 0; q < 4 * np + 4; q++) {
        size_t k = q / 4 < np ? q / 4 : 1;
        /* the foreign call is written through /proc/self/mem: where the
         * kernel refuses that, the revert after it is not tried */
        struct ctx c = {parts[k], records[q % 2], (q / 2) % 2 == 1, q >= 4 * np,
                        ap_procmem_can_write_text() != 0};
        if (c.deny && valgrind)
            continue; /* PR_SET_MDWE would stop valgrind's own code generation */
        struct calls_run *r = ap_isolated(sizeof(*r), calls_body, &c);
        if (c.deny && ap_mdwe_missing(r->mdwe))
            continue; /* a kernel without PR_SET_MDWE */
        cr_assert_eq(r->rc, 0, "part of %u: apply %d", c.part, r->rc);
        cr_assert_eq(r->rc2, 0, "part of %u: the next apply %d", c.part, r->rc2);
        cr_assert_eq(r->n, N_CALLS, "part of %u: %u call sites", c.part, r->n);
        unsigned w = 0;
        for (unsigned i = 0; i < N_CALLS; i++) {
            uint8_t one[5], two[5];
            ap_call_bytes(one, r->addr[i], (void *)parts_one);
            ap_call_bytes(two, r->addr[i], (void *)parts_two);
            if (CALLS[i] == 'D') {
                cr_assert_eq(r->state[i], ALTPATCH_SITE_ORIGINAL, "part of %u: site %u", c.part,
                             i);
                cr_assert_arr_eq(r->current[i], one, 5, "part of %u: site %u kept", c.part, i);
            } else if (c.deny) {
                cr_assert_eq(r->state[i], ALTPATCH_SITE_REFUSED, "part of %u: site %u", c.part, i);
                cr_assert_eq(r->reason[i], ALTPATCH_REASON_WRITE_DENIED);
                cr_assert_arr_eq(r->current[i], one, 5, "part of %u: site %u untouched", c.part,
                                 i);
            } else {
                w++;
                cr_assert_eq(r->state[i], ALTPATCH_SITE_PATCHED, "part of %u: site %u", c.part,
                             i);
                cr_assert_arr_eq(r->current[i], two, 5, "part of %u: site %u calls its own "
                                 "relocated target", c.part, i);
            }
        }
        if (c.deny) {
            cr_assert_eq(r->written, 0);
            cr_assert_geq(r->refused, 6);
        }
        if (c.deny && !c.foreign) {
            cr_assert_eq(r->n_rev, 0, "no revert tried");
        } else if (c.deny) {
            cr_assert_eq(r->rc_rev, 0);
            cr_assert_eq(r->n_rev, N_CALLS);
            uint8_t one[5], two[5];
            for (unsigned i = 0; i < N_CALLS; i++) {
                ap_call_bytes(one, r->addr[i], (void *)parts_one);
                ap_call_bytes(two, r->addr[i], (void *)parts_two);
                if (i != FOREIGN_AT) {
                    cr_assert_eq(r->state_rev[i], ALTPATCH_SITE_ORIGINAL, "part of %u: site %u",
                                 c.part, i);
                    cr_assert_arr_eq(r->current_rev[i], one, 5, "part of %u: site %u", c.part, i);
                    continue;
                }
                cr_assert_eq(r->state_rev[i], ALTPATCH_SITE_REFUSED, "part of %u", c.part);
                cr_assert_eq(r->reason_rev[i], ALTPATCH_REASON_MEM_MISMATCH,
                             "part of %u: the plan's bytes, not written by an apply: reason %d",
                             c.part, r->reason_rev[i]);
                cr_assert_arr_eq(r->current_rev[i], two, 5, "part of %u: left as found", c.part);
            }
        } else {
            cr_assert_eq(w, 6);
            cr_assert_geq(r->written, 5 * 6);
        }
        cr_assert_eq(r->written2, 0, "part of %u: the next apply wrote", c.part);
    }
}

/* The call sites after each step of calls_seq_body(). */
enum { SEQ_STEPS = 5 };
struct calls_seq {
    int rc[SEQ_STEPS];
    unsigned n[SEQ_STEPS];
    uint64_t written[SEQ_STEPS];
    int state[SEQ_STEPS][N_CALLS], reason[SEQ_STEPS][N_CALLS];
    uint8_t current[SEQ_STEPS][N_CALLS][5];
    uintptr_t addr[N_CALLS];
};

static int seq_cb(const struct altpatch_site_info *si, void *p)
{
    struct calls_seq *r = ((void **)p)[0];
    unsigned k = *(unsigned *)((void **)p)[1];
    unsigned *n = &r->n[k];
    if (si->addr < (uintptr_t)parts_calls_begin || si->addr >= (uintptr_t)parts_calls_end ||
        *n >= N_CALLS || si->len != 5 || !si->current)
        return 0;
    r->addr[*n] = si->addr;
    r->state[k][*n] = si->state;
    r->reason[k][*n] = si->reason;
    memcpy(r->current[k][*n], si->current, 5);
    (*n)++;
    return 0;
}

/* The steps of a sequence: an apply under {ALWAYS} (A), under no feature
 * (B: another generation of templates, the C sites go back to their
 * originals and the D sites take their calls), a revert (R); F: a call to
 * parts_three put at call site FOREIGN_AT by another writer, then A. */
struct seq_ctx {
    struct ctx c;
    char steps[SEQ_STEPS + 1];
};

static void calls_seq_body(void *out, void *cv)
{
    struct calls_seq *r = out;
    const struct seq_ctx *sc = cv;
    struct altpatch_apply_opts o;
    int mdwe;
    struct altpatch_features *f = parts_begin(&sc->c, &mdwe, &o);
    struct altpatch_features *none = altpatch_features_new();
    if (!none)
        abort();
    struct altpatch_apply_opts other = o, rev = o;
    other.features = none;
    rev.flags |= ALTPATCH_APPLY_REVERT;
    for (unsigned k = 0; k < SEQ_STEPS; k++) {
        struct altpatch_stats st;
        char step = sc->steps[k];
        if (step == 'F' && r->n[k - 1] == N_CALLS)
            ap_put_call(r->addr[FOREIGN_AT], (void *)parts_three);
        r->rc[k] = altpatch_apply_opts(step == 'B' ? &other : step == 'R' ? &rev : &o);
        get_stats(&st); /* this apply's */
        r->written[k] = st.bytes_written;
        void *arg[2] = {r, &k};
        altpatch_site_foreach(seq_cb, arg);
    }
    altpatch_features_free(none);
    altpatch_features_free(f);
}

/* A first decision keeps no plan bytes where a site's template gives them
 * again (the relocated calls' included): the next apply -- under another set
 * (each call site switched from what it left), a revert, the same set --
 * and the ones after find each
 * site as it was left and write their own bytes; an apply under the same set
 * as the last writes nothing; a call put at a site by another writer after
 * the first decision is refused, not taken for what the apply left. In
 * parts of any size, the records decoded or kept. */
Test(parts, later_applies_from_a_first_decisions_templates)
{
    static const unsigned parts[] = {1, 2, 1u << 20};
    static const char *const seqs[] = {"ABRAA", "ARABA", "AABRA", "AFAAB"};
    enum { NSEQ = sizeof(seqs) / sizeof(seqs[0]) };
    bool foreign = ap_procmem_can_write_text() != 0;
    for (size_t q = 0; q < 2 * NSEQ * sizeof(parts) / sizeof(parts[0]); q++) {
        struct seq_ctx sc = {{parts[q / (2 * NSEQ)], records[q % 2], false, false, false}, ""};
        const char *seq = seqs[(q / 2) % NSEQ];
        if (strchr(seq, 'F') && !foreign)
            continue; /* the foreign call is written through /proc/self/mem */
        memcpy(sc.steps, seq, SEQ_STEPS);
        struct calls_seq *r = ap_isolated(sizeof(*r), calls_seq_body, &sc);
        bool put = false; /* the foreign call is at FOREIGN_AT */
        for (unsigned k = 0; k < SEQ_STEPS; k++) {
            char step = seq[k];
            unsigned part = sc.c.part;
            put |= step == 'F';
            cr_assert_eq(r->rc[k], 0, "%s, part of %u, step %u: apply %d", seq, part, k, r->rc[k]);
            cr_assert_eq(r->n[k], N_CALLS, "%s, part of %u, step %u: %u sites", seq, part, k,
                         r->n[k]);
            /* the program's other sites change with the set too: the bytes
             * written are checked where nothing changes (the program has a
             * refused site: never settled, every apply decides it;
             * test_parts_settled has the settled module) */
            if (k > 0 && step == seq[k - 1])
                cr_assert_eq(r->written[k], 0, "%s, part of %u, step %u: %llu bytes written",
                             seq, part, k, (unsigned long long)r->written[k]);
            for (unsigned i = 0; i < N_CALLS; i++) {
                /* the call to parts_two: C sites under A, D sites under B */
                bool two = step == 'B' ? CALLS[i] == 'D' : step != 'R' && CALLS[i] == 'C';
                uint8_t want[5];
                if (put && i == FOREIGN_AT) {
                    /* neither the original nor the plan: left as found,
                     * refused while it stays */
                    ap_call_bytes(want, r->addr[i], (void *)parts_three);
                    cr_assert_eq(r->state[k][i], ALTPATCH_SITE_REFUSED,
                                 "%s, part of %u, step %u: the foreign site", seq, part, k);
                    cr_assert_eq(r->reason[k][i], ALTPATCH_REASON_MEM_MISMATCH);
                    cr_assert_arr_eq(r->current[k][i], want, 5);
                    continue;
                }
                ap_call_bytes(want, r->addr[i], two ? (void *)parts_two : (void *)parts_one);
                cr_assert_eq(r->state[k][i], two ? ALTPATCH_SITE_PATCHED : ALTPATCH_SITE_ORIGINAL,
                             "%s, part of %u, step %u: site %u state %d", seq, part, k, i,
                             r->state[k][i]);
                cr_assert_arr_eq(r->current[k][i], want, 5, "%s, part of %u, step %u: site %u",
                                 seq, part, k, i);
            }
        }
    }
}

/* Two sites of one shape whose replacement jumps to parts_cut_tgt, one byte
 * into the second: the first site's template has a rel32 field; at the
 * second the field would point inside the site, so the template does not fit
 * there and the planner decides it (a jump of its own). Never run. */
#define CUT_ORIG_A ".byte 0x90, 0x0f, 0x1f, 0x40, 0x00"
#define CUT_ORIG_B ".byte 0x90\n.globl parts_cut_tgt\nparts_cut_tgt:\n.byte 0x0f, 0x1f, 0x40, 0x00"
extern const char parts_cut_begin[];
__attribute__((noinline, used)) static void cut_sites(void)
{
    __asm__ __volatile__(".globl parts_cut_begin\nparts_cut_begin:\n\t"
                         ALTERNATIVE(CUT_ORIG_A, "jmp parts_cut_tgt", X86_FEATURE_ALWAYS) "\n\t"
                         ALTERNATIVE(CUT_ORIG_B, "jmp parts_cut_tgt", X86_FEATURE_ALWAYS) "\n\t"
                         ::: "memory");
}

struct cut_run {
    int rc[2];
    uint8_t bytes[2][10];
    int state[2][2];
};

static int cut_cb(const struct altpatch_site_info *si, void *p)
{
    struct cut_run *r = ((void **)p)[0];
    unsigned k = *(unsigned *)((void **)p)[1];
    uintptr_t b = (uintptr_t)parts_cut_begin;
    if (si->addr == b || si->addr == b + 5)
        r->state[k][si->addr != b] = si->state;
    return 0;
}

/* ctx: 'R' a revert after the first apply, 'B' an apply under no feature */
static void cut_body(void *out, void *cv)
{
    struct cut_run *r = out;
    char then = *(const char *)cv;
    struct altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, X86_FEATURE_ALWAYS))
        abort();
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = f};
    altpatch_set_print(NULL); /* the program's refused sites are expected */
    for (unsigned k = 0; k < 2; k++) {
        if (k == 1 && then == 'R')
            o.flags = ALTPATCH_APPLY_REVERT;
        else if (k == 1)
            altpatch_features_set_bit(f, X86_FEATURE_ALWAYS, false);
        r->rc[k] = altpatch_apply_opts(&o);
        /* read through volatile: the compiler may take an object it knows
         * as const for unchanged across the call */
        for (unsigned z = 0; z < 10; z++)
            r->bytes[k][z] = ((const volatile uint8_t *)parts_cut_begin)[z];
        void *arg[2] = {r, &k};
        altpatch_site_foreach(cut_cb, arg);
    }
    altpatch_features_free(f);
}

/* The planner's site after a template that did not fit it keeps the plan
 * the planner made (not the template's, which gives none there): a revert,
 * or another set, after the first apply puts both originals back. */
Test(parts, a_site_the_planner_decided_goes_back)
{
    static const uint8_t orig[10] = {0x90, 0x0f, 0x1f, 0x40, 0x00, 0x90, 0x0f, 0x1f, 0x40, 0x00};
    static const char thens[] = "RB";
    for (unsigned q = 0; q < 2; q++) {
        struct cut_run *r = ap_isolated(sizeof(*r), cut_body, (void *)&thens[q]);
        uintptr_t b = (uintptr_t)parts_cut_begin, tgt = b + 6;
        cr_assert_eq(r->rc[0], 0);
        cr_assert_eq(r->rc[1], 0, "then %c: %d", thens[q], r->rc[1]);
        for (unsigned i = 0; i < 2; i++) {
            uint8_t jmp[5] = {0xe9};
            int32_t rel = (int32_t)(tgt - (b + 5 * i + 5));
            memcpy(jmp + 1, &rel, 4);
            cr_assert_eq(r->state[0][i], ALTPATCH_SITE_PATCHED, "site %u", i);
            cr_assert_arr_eq(r->bytes[0] + 5 * i, jmp, 5, "site %u: its own jump", i);
            cr_assert_eq(r->state[1][i], ALTPATCH_SITE_ORIGINAL, "then %c: site %u state %d",
                         thens[q], i, r->state[1][i]);
        }
        cr_assert_arr_eq(r->bytes[1], orig, 10, "then %c: both originals back", thens[q]);
    }
}

#ifdef PARTS_WIDE
/* wide()'s site after a first apply, and how many sites the module has. */
struct wide_run {
    int rc;
    unsigned nsites, entries, feature, flags;
    int chosen, state, reason;
    uint8_t current[5];
    long value;
};

static int wide_cb(const struct altpatch_site_info *si, void *p)
{
    struct wide_run *r = p;
    if (si->module[0])
        return 0; /* the test program's sites only */
    r->nsites++;
    uintptr_t fn = (uintptr_t)wide; /* its site, the next function 16 bytes on at least */
    if (si->addr < fn || si->addr >= fn + 16)
        return 0;
    r->entries = si->entries;
    r->feature = si->feature;
    r->flags = si->flags;
    r->chosen = si->chosen;
    r->state = si->state;
    r->reason = si->reason;
    if (si->current && si->len == 5)
        memcpy(r->current, si->current, 5);
    return 0;
}

static void wide_body(void *out, void *cv)
{
    struct wide_run *r = out;
    ap_records_keep_max = *(const unsigned *)cv;
    struct altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, X86_FEATURE_ALWAYS))
        abort();
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = f};
    r->rc = altpatch_apply_opts(&o);
    altpatch_site_foreach(wide_cb, r);
    r->value = wide();
    altpatch_features_free(f);
}

/* A site of ten records in a table of more than 4096: every record
 * considered (the ninth chosen), decoded from the table or kept. */
Test(parts, a_site_of_ten_records_in_a_large_table)
{
    static const uint8_t MOV18[5] = {0xb8, 18, 0, 0, 0};
    static const unsigned keep_max[] = {4096, 1u << 20};
    for (size_t q = 0; q < 2; q++) {
        struct wide_run *r = ap_isolated(sizeof(*r), wide_body, (void *)&keep_max[q]);
        cr_assert_eq(r->rc, 0, "apply %d", r->rc);
        cr_assert_gt(r->nsites, 4096, "the table holds %u sites", r->nsites);
        cr_assert_eq(r->entries, 10);
        cr_assert_eq(r->state, ALTPATCH_SITE_PATCHED);
        cr_assert_eq(r->reason, ALTPATCH_REASON_NONE);
        cr_assert_eq(r->chosen, 8, "records kept up to %u: entry %d chosen", keep_max[q],
                     r->chosen);
        cr_assert_eq(r->feature, F_KEEP);
        cr_assert_eq(r->flags, ALT_FLAG_NOT);
        cr_assert_arr_eq(r->current, MOV18, 5);
        cr_assert_eq(r->value, 18, "the ninth replacement runs");
    }
}
#endif
