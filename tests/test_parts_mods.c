/* SPDX-License-Identifier: MIT */
/*
 * A first apply decides the module with the most records first, so that
 * its writes go out in parts in address order: here the test program, whose
 * records are decoded from its table (more than ap_records_keep_max), with
 * a small library loaded above it whose records are kept in an array. Were
 * the library decided first, every write of the program would come below
 * its writes, out of address order: none would be written in a part, all of
 * them would wait for the sort. Every site of both is checked, and a part
 * of one write each means one window (or /proc/self/mem write) per write
 * of the program.
 *
 * Applying needs a single-threaded process: each body runs in a fork()ed
 * child (ap_isolate.h).
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_apply_one.h"
#include "ap_isolate.h"
#include "host.h"

/* W: a write under the set below (ALWAYS). W2: a site of two records whose
 * first does not apply (AVX512F is not in the set) and whose second does:
 * its records decoded, it is not decided by its first record's keep bit. */
#define W ALTERNATIVE("movl $1, %%eax", "movl $2, %%eax", X86_FEATURE_ALWAYS) "\n\t"
#define W4 W W W W
#define W2                                                                                     \
    ALTERNATIVE_2("movl $1, %%eax", "movl $3, %%eax", X86_FEATURE_AVX512F, "movl $2, %%eax",    \
                  X86_FEATURE_ALWAYS)                                                          \
    "\n\t"

enum { N_WRITES = 26, LIB_RECORDS = 4 /* libapfix_dl.so */ };

__attribute__((noinline)) static long writes26(void)
{
    long v;
    __asm__ __volatile__(W4 W4 W4 W2 W4 W4 W4 W2 : "=a"(v));
    return v;
}

struct run {
    int rc, loaded, plain;
    struct altpatch_stats st;
    unsigned seen, patched;
    long value, lib_value;
    uintptr_t lib_site, prog_site;
};

static int seen_cb(const struct altpatch_site_info *si, void *p)
{
    struct run *r = p;
    uintptr_t fn = (uintptr_t)writes26;
    if (si->addr < fn || si->addr >= fn + 16 + 5 * N_WRITES)
        return 0;
    r->seen++;
    r->prog_site = si->addr;
    if (si->state == ALTPATCH_SITE_PATCHED && si->len == 5 && si->current &&
        !memcmp(si->current, "\xb8\x02\x00\x00\x00", 5))
        r->patched++;
    return 0;
}

typedef long (*call_fn)(long);

static void body(void *out, void *ctx)
{
    (void)ctx;
    struct run *r = out;
    void *h = dlopen(APFIX_DL_PATH, RTLD_NOW);
    call_fn call = h ? (call_fn)dlsym(h, "apfix_dl_call") : NULL;
    if (!call)
        return;
    r->loaded = 1;
    r->lib_site = (uintptr_t)call;
    ap_part_writes = 1;
    ap_records_keep_max = LIB_RECORDS; /* the library's kept, the program's decoded */
    /* the premise of the raw keep test: the program's records decoded, its
     * module-wide facts proved (a list of this test's own, then dropped) */
    struct ap_module *list = NULL;
    if (ap_modules_refresh(&list))
        abort();
    for (struct ap_module *m = list; m; m = m->next)
        if (!m->path[0])
            r->plain = m->records_plain && m->text_all && !m->entries;
    ap_modules_free(list);
    r->rc = ap_apply_one(X86_FEATURE_ALWAYS, &r->st);
    altpatch_site_foreach(seen_cb, r);
    r->value = writes26();
    r->lib_value = call(1);
}

Test(parts_mods, the_largest_table_is_decided_first_and_written_in_parts)
{
    struct run *r = ap_isolated(sizeof(*r), body, NULL);
    cr_assert(r->loaded, "dlopen %s", APFIX_DL_PATH);
    cr_assert(r->lib_site > r->prog_site, "premise: the library lies above the program");
    cr_assert(r->plain, "premise: the program's records decoded, its facts proved");
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->seen, N_WRITES);
    cr_assert_eq(r->patched, N_WRITES, "every site of the program holds its replacement");
    cr_assert_eq(r->value, 2);
    cr_assert_eq(r->lib_value, 3, "the library's ALT_CALL site calls its replacement");
    cr_assert_eq(r->st.sites_refused, 0);
    /* a part of one write: a window each (the program's writes share one or
     * two pages, so one batch would open one or two); a writer that goes
     * through /proc/self/mem for every write (SELinux, MDWE, a filter) shows
     * nothing of the parts */
    if (!r->st.mprotect_windows)
        cr_skip_test("every write went through /proc/self/mem (%llu)",
                     (unsigned long long)r->st.procmem_writes);
    cr_assert_geq(r->st.mprotect_windows + r->st.procmem_writes, N_WRITES,
                  "%llu windows, %llu /proc/self/mem writes: the program's writes were not "
                  "written in parts",
                  (unsigned long long)r->st.mprotect_windows,
                  (unsigned long long)r->st.procmem_writes);
}
