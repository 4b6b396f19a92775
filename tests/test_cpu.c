/* SPDX-License-Identifier: MIT */
/*
 * features.c and cpu.c: kernel numbering, names, sets and edits, profiles, host detection
 * (against /proc/cpuinfo, AT_HWCAP2, XCR0, and by executing instructions the
 * host set claims), ALTPATCH_CLEARCPUID.
 */
#include <criterion/criterion.h>

#include <cpuid.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include "host.h"
#include "ap_seccomp.h"
#include "ap_step.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define AP_HAVE_VALGRIND_H 1
#endif
#endif

/* True when running under valgrind (its CPUID is synthetic; FSGSBASE unusable). */
static bool under_valgrind(void)
{
#ifdef AP_HAVE_VALGRIND_H
    return RUNNING_ON_VALGRIND != 0;
#else
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload") != NULL;
#endif
}

#if defined(__SANITIZE_ADDRESS__)
#define AP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AP_ASAN 1
#endif
#endif

#define STR_(x) #x
#define STR(x) STR_(x)

/* The value the assembler computes from the stringified macro (as ALTERNATIVE() uses it). */
#define ASM_VALUE(macro)                                                                   \
    ({                                                                                     \
        unsigned long v_;                                                                  \
        __asm__("mov $" STR(macro) ", %0" : "=r"(v_));                                    \
        v_;                                                                                \
    })

/* ------------------------------------------------------------------------- */
/* Numbering                                                                 */
/* ------------------------------------------------------------------------- */

Test(cpu, kernel_numbering)
{
    cr_assert_eq(X86_FEATURE_ALWAYS, 3 * 32 + 21);
    cr_assert_eq(X86_FEATURE_FSGSBASE, 9 * 32 + 0);
    cr_assert_eq(X86_FEATURE_RDPID, 16 * 32 + 22);
    cr_assert_eq(X86_FEATURE_RDTSCP, 1 * 32 + 27);
    cr_assert_eq(X86_FEATURE_LFENCE_RDTSC, 20 * 32 + 2);
    cr_assert_eq(X86_FEATURE_APIC_MSRS_FENCE, 11 * 32 + 27);
    cr_assert_eq(X86_FEATURE_CLFLUSHOPT, 9 * 32 + 23);
    cr_assert_eq(X86_FEATURE_CLWB, 9 * 32 + 24);
    cr_assert_eq(X86_FEATURE_SERIALIZE, 18 * 32 + 14);
    cr_assert_eq(X86_FEATURE_POPCNT, 4 * 32 + 23);
    cr_assert_eq(X86_FEATURE_AVX2, 9 * 32 + 5);
    cr_assert_eq(X86_FEATURE_AVX512F, 9 * 32 + 16);
    cr_assert_eq(X86_FEATURE_ERMS, 9 * 32 + 9);
    cr_assert_eq(X86_FEATURE_FSRM, 18 * 32 + 4);
    cr_assert_eq(X86_FEATURE_MOVDIR64B, 16 * 32 + 28);
    cr_assert_eq(X86_FEATURE_XMM2, 0 * 32 + 26);
    cr_assert_eq(X86_FEATURE_XMM4_2, 4 * 32 + 20);
    cr_assert_eq(X86_FEATURE_OSXSAVE, 4 * 32 + 27);
    cr_assert_eq(X86_FEATURE_AVX_VNNI, 12 * 32 + 4);
    cr_assert_eq(X86_FEATURE_CLZERO, 13 * 32 + 0);
    cr_assert_eq(X86_FEATURE_HYPERVISOR, 4 * 32 + 31);
    cr_assert_eq(X86_FEATURE_NONSTOP_TSC, 3 * 32 + 24);
}

Test(cpu, macros_assemble_to_their_value)
{
    cr_assert_eq(ASM_VALUE(X86_FEATURE_FSGSBASE), 288u);
    cr_assert_eq(ASM_VALUE(X86_FEATURE_RDPID), 534u);
    cr_assert_eq(ASM_VALUE(X86_FEATURE_ALWAYS), 117u);
    cr_assert_eq(ASM_VALUE(X86_FEATURE_APIC_MSRS_FENCE), 379u);
    cr_assert_eq(ASM_VALUE(X86_FEATURE_LFENCE_RDTSC), 642u);
    cr_assert_eq(ASM_VALUE(X86_FEATURE_AMX_INT8), 18u * 32 + 25);
}

/* ------------------------------------------------------------------------- */
/* Names                                                                     */
/* ------------------------------------------------------------------------- */

Test(cpu, names_round_trip_for_every_known_id)
{
    unsigned known = 0;
    for (unsigned id = 0; id < AP_NCAPWORDS * 32 + 64; id++) {
        const char *n = altpatch_feature_name(id);
        cr_assert_eq(n != NULL, ap_feature_known(id), "id %u", id);
        if (!n)
            continue;
        known++;
        cr_assert(n[0] != '\0', "id %u has an empty name", id);
        for (const char *p = n; *p; p++)
            cr_assert(!isupper((unsigned char)*p) && *p != ',' && !isspace((unsigned char)*p),
                      "name %s", n);
        cr_assert_eq(altpatch_feature_id(n), (int)id, "%s", n);
        char up[64];
        size_t i = 0;
        for (; n[i] && i < sizeof(up) - 1; i++)
            up[i] = (char)toupper((unsigned char)n[i]);
        up[i] = '\0';
        cr_assert_eq(altpatch_feature_id(up), (int)id, "%s (upper case)", up);
    }
    cr_assert_geq(known, 150u);
}

Test(cpu, names_follow_proc_cpuinfo)
{
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_XMM), "sse");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_XMM2), "sse2");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_XMM3), "pni");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_XMM4_1), "sse4_1");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_MWAIT), "monitor");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_GBPAGES), "pdpe1gb");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_FSGSBASE), "fsgsbase");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_RDPID), "rdpid");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_AVX512_VNNI), "avx512_vnni");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_AVX512F), "avx512f");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_ALWAYS), "always");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_LFENCE_RDTSC), "lfence_rdtsc");
    cr_assert_str_eq(altpatch_feature_name(X86_FEATURE_APIC_MSRS_FENCE), "apic_msrs_fence");
}

Test(cpu, unknown_names_and_ids)
{
    cr_assert_null(altpatch_feature_name(9 * 32 + 22)); /* a hole in the kernel's word 9 */
    cr_assert_null(altpatch_feature_name(AP_NCAPWORDS * 32));
    cr_assert_null(altpatch_feature_name(65535));
    cr_assert_eq(altpatch_feature_id("nosuchfeature"), -ENOENT);
    cr_assert_eq(altpatch_feature_id(""), -ENOENT);
    cr_assert_eq(altpatch_feature_id("sse2 "), -ENOENT);
    cr_assert_eq(altpatch_feature_id("288"), -ENOENT); /* names only */
    cr_assert_eq(altpatch_feature_id(NULL), -EINVAL);
    cr_assert(!ap_feature_known(9 * 32 + 22));
    cr_assert(ap_feature_known(X86_FEATURE_ALWAYS));
}

/* ------------------------------------------------------------------------- */
/* Sets and edits                                                            */
/* ------------------------------------------------------------------------- */

static unsigned count_bits(const struct altpatch_features *f)
{
    unsigned n = 0;
    for (unsigned w = 0; w < AP_NCAPWORDS; w++)
        n += (unsigned)__builtin_popcount(f->word[w]);
    return n;
}

Test(cpu, set_clear_has)
{
    struct altpatch_features *f = altpatch_features_new();
    cr_assert_not_null(f);
    cr_assert_str_eq(altpatch_features_vendor(f), "unknown");
    cr_assert_eq(count_bits(f), 0u);
    cr_assert_eq(altpatch_features_set(f, X86_FEATURE_RDPID), 0);
    cr_assert(altpatch_features_has(f, X86_FEATURE_RDPID));
    cr_assert_eq(f->word[16], 1u << 22);
    cr_assert(ap_features_test(f, X86_FEATURE_RDPID));
    cr_assert_eq(altpatch_features_set(f, 9 * 32 + 22), -EINVAL);
    cr_assert_eq(altpatch_features_set(f, 100000), -EINVAL);
    cr_assert_eq(altpatch_features_clear(f, 9 * 32 + 22), -EINVAL);
    cr_assert_eq(altpatch_features_set(NULL, X86_FEATURE_RDPID), -EINVAL);
    cr_assert_eq(count_bits(f), 1u);
    cr_assert(!ap_features_test(f, AP_NCAPWORDS * 32 + 5));
    cr_assert(!altpatch_features_has(NULL, X86_FEATURE_RDPID));

    struct altpatch_features *d = altpatch_features_dup(f);
    cr_assert_not_null(d);
    cr_assert_eq(memcmp(d, f, sizeof(*f)), 0);
    cr_assert_eq(altpatch_features_clear(d, X86_FEATURE_RDPID), 0);
    cr_assert(!altpatch_features_has(d, X86_FEATURE_RDPID));
    cr_assert(altpatch_features_has(f, X86_FEATURE_RDPID));
    altpatch_features_free(d);
    altpatch_features_free(f);
    altpatch_features_free(NULL);
}

Test(cpu, edit_applies_every_item)
{
    struct altpatch_features *f = altpatch_features_new();
    cr_assert_eq(altpatch_features_set(f, X86_FEATURE_RDPID), 0);
    cr_assert_eq(altpatch_features_edit(f, "+fsgsbase, -rdpid,AVX2,+288"), 0);
    cr_assert(altpatch_features_has(f, X86_FEATURE_FSGSBASE));
    cr_assert(altpatch_features_has(f, X86_FEATURE_AVX2));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_RDPID));
    cr_assert_eq(count_bits(f), 2u);
    cr_assert_eq(altpatch_features_edit(f, ""), 0);
    cr_assert_eq(count_bits(f), 2u);
    cr_assert_eq(altpatch_features_edit(f, "-fsgsbase,-avx2"), 0);
    cr_assert_eq(count_bits(f), 0u);
    altpatch_features_free(f);
}

Test(cpu, edit_is_all_or_nothing)
{
    static const char *const bad_name[] = {
        "+fsgsbase,-rdpid,bogus", "nosuch", "+avx2,+avx3", "fsgsbase,-9999", "+sse2,-+sse",
    };
    static const char *const bad_syntax[] = {
        "+fsgsbase,,-rdpid", ",avx2", "avx2,", "+", "-", " , ", "avx2,+",
    };
    struct altpatch_features *f = altpatch_features_new();
    cr_assert_eq(altpatch_features_set(f, X86_FEATURE_RDPID), 0);
    struct altpatch_features before = *f;
    for (size_t i = 0; i < sizeof(bad_name) / sizeof(bad_name[0]); i++) {
        cr_assert_eq(altpatch_features_edit(f, bad_name[i]), -ENOENT, "%s", bad_name[i]);
        cr_assert_eq(memcmp(f, &before, sizeof(before)), 0, "%s changed the set", bad_name[i]);
    }
    for (size_t i = 0; i < sizeof(bad_syntax) / sizeof(bad_syntax[0]); i++) {
        cr_assert_eq(altpatch_features_edit(f, bad_syntax[i]), -EINVAL, "'%s'", bad_syntax[i]);
        cr_assert_eq(memcmp(f, &before, sizeof(before)), 0, "%s changed the set", bad_syntax[i]);
    }
    cr_assert_eq(altpatch_features_edit(f, NULL), -EINVAL);
    cr_assert_eq(altpatch_features_edit(NULL, "avx2"), -EINVAL);
    altpatch_features_free(f);
}

/* ------------------------------------------------------------------------- */
/* Profiles                                                                  */
/* ------------------------------------------------------------------------- */

static struct altpatch_features *profile(const char *name)
{
    struct altpatch_features *f = altpatch_features_profile(name);
    cr_assert_not_null(f, "profile %s", name);
    return f;
}

Test(cpu, profile_list)
{
    const char *const *p = altpatch_features_profiles();
    static const char *const want[] = {"host", "baseline", "amd-zen4", "intel-spr", "all"};
    size_t n = 0;
    for (; p[n]; n++) {
        cr_assert_lt(n, 5u);
        cr_assert_str_eq(p[n], want[n]);
        struct altpatch_features *f = profile(p[n]);
        cr_assert(altpatch_features_has(f, X86_FEATURE_ALWAYS), "%s lacks always", p[n]);
        altpatch_features_free(f);
    }
    cr_assert_eq(n, 5u);
    errno = 0;
    cr_assert_null(altpatch_features_profile("amd-zen5"));
    cr_assert_eq(errno, ENOENT);
    errno = 0;
    cr_assert_null(altpatch_features_profile(NULL));
    cr_assert_eq(errno, EINVAL);
}

Test(cpu, profile_amd_zen4)
{
    struct altpatch_features *f = profile("amd-zen4");
    cr_assert_str_eq(altpatch_features_vendor(f), "AuthenticAMD");
    static const unsigned has[] = {
        X86_FEATURE_FSGSBASE, X86_FEATURE_RDPID,  X86_FEATURE_RDTSCP,      X86_FEATURE_AVX512F,
        X86_FEATURE_CLFLUSHOPT, X86_FEATURE_CLWB, X86_FEATURE_ERMS,        X86_FEATURE_FSRM,
        X86_FEATURE_POPCNT,   X86_FEATURE_AVX2,   X86_FEATURE_LFENCE_RDTSC, X86_FEATURE_ALWAYS,
        X86_FEATURE_CLZERO,   X86_FEATURE_XMM2,   X86_FEATURE_AVX512_BF16,  X86_FEATURE_VAES,
    };
    for (size_t i = 0; i < sizeof(has) / sizeof(has[0]); i++)
        cr_assert(altpatch_features_has(f, has[i]), "zen4 lacks %s",
                  altpatch_feature_name(has[i]));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_APIC_MSRS_FENCE));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_SERIALIZE));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_MOVDIR64B));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_AVX_VNNI));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_AMX_TILE));
    altpatch_features_free(f);
}

Test(cpu, profile_intel_spr)
{
    struct altpatch_features *f = profile("intel-spr");
    cr_assert_str_eq(altpatch_features_vendor(f), "GenuineIntel");
    static const unsigned has[] = {
        X86_FEATURE_APIC_MSRS_FENCE, X86_FEATURE_SERIALIZE, X86_FEATURE_MOVDIR64B,
        X86_FEATURE_AVX512F,         X86_FEATURE_AVX512_FP16, X86_FEATURE_AMX_TILE,
        X86_FEATURE_FSGSBASE,        X86_FEATURE_RDPID,     X86_FEATURE_LFENCE_RDTSC,
        X86_FEATURE_AVX_VNNI,        X86_FEATURE_FSRM,      X86_FEATURE_WAITPKG,
    };
    for (size_t i = 0; i < sizeof(has) / sizeof(has[0]); i++)
        cr_assert(altpatch_features_has(f, has[i]), "spr lacks %s",
                  altpatch_feature_name(has[i]));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_CLZERO));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_SSE4A));
    altpatch_features_free(f);
}

Test(cpu, profile_baseline)
{
    struct altpatch_features *f = profile("baseline");
    cr_assert_str_eq(altpatch_features_vendor(f), "unknown");
    cr_assert(altpatch_features_has(f, X86_FEATURE_XMM2));
    cr_assert(altpatch_features_has(f, X86_FEATURE_LM));
    cr_assert(altpatch_features_has(f, X86_FEATURE_CMOV));
    cr_assert(altpatch_features_has(f, X86_FEATURE_APIC_MSRS_FENCE)); /* not AMD/Hygon */
    cr_assert(!altpatch_features_has(f, X86_FEATURE_FSGSBASE));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_RDTSCP));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_LFENCE_RDTSC));
    cr_assert(!altpatch_features_has(f, X86_FEATURE_POPCNT));
    cr_assert_eq(count_bits(f), 14u); /* 12 baseline + always + apic_msrs_fence */
    altpatch_features_free(f);
}

Test(cpu, profile_all_has_everything)
{
    struct altpatch_features *f = profile("all");
    unsigned known = 0;
    for (unsigned id = 0; id < AP_NCAPWORDS * 32; id++) {
        cr_assert_eq(altpatch_features_has(f, id), ap_feature_known(id), "id %u", id);
        known += ap_feature_known(id);
    }
    cr_assert_eq(count_bits(f), known);
    altpatch_features_free(f);
}

Test(cpu, profile_host_is_host)
{
    struct altpatch_features *a = profile("host");
    struct altpatch_features *b = altpatch_features_host();
    cr_assert_not_null(b);
    cr_assert_eq(memcmp(a, b, sizeof(*a)), 0);
    cr_assert_eq(memcmp(a, ap_host_features(), sizeof(*a)), 0);
    altpatch_features_free(a);
    altpatch_features_free(b);
}

/* ------------------------------------------------------------------------- */
/* Lazy host detection: by groups of CPUID leaves                            */
/* ------------------------------------------------------------------------- */

/* Each test runs in a fresh process: nothing is read before it starts. */
Test(cpu, lazy_base_reads_no_other_leaf)
{
    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_BASE, &f);
    /* words 9/16/18/12 (leaf 7), 10 (0xd.1), 1/6 (0x80000001), 13, 17: not read */
    static const unsigned unread[] = {1, 6, 9, 10, 12, 13, 16, 17, 18};
    for (size_t i = 0; i < sizeof(unread) / sizeof(unread[0]); i++)
        cr_expect_eq(f.word[unread[i]], 0u, "word %u", unread[i]);
    /* word 20 (0x80000021): only LFENCE_RDTSC, which the vendor rule may set too */
    cr_expect_eq(f.word[20] & ~(1u << (X86_FEATURE_LFENCE_RDTSC % 32)), 0u);
    cr_expect(!altpatch_features_has(&f, X86_FEATURE_CONSTANT_TSC));
    /* what the base group decides is already the host's */
    const struct altpatch_features *h = ap_host_features();
    cr_expect_eq(f.word[0], h->word[0]);
    cr_expect_eq(f.word[4], h->word[4]);
    cr_expect_str_eq(f.vendor, h->vendor);
    for (unsigned id = 0; id < AP_NCAPWORDS * 32; id++)
        if (ap_feature_known(id) && ap_feature_leaves(id) == AP_LEAVES_BASE)
            cr_expect_eq(altpatch_features_has(&f, id), altpatch_features_has(h, id), "%u", id);
}

Test(cpu, lazy_std7_leaves_subleaf_1_unread)
{
    struct altpatch_features f, g;
    ap_host_leaves(AP_LEAVES_STD7, &f);
    cr_expect_eq(f.word[12], 0u, "leaf 7.1 is its own group");
    ap_host_leaves(AP_LEAVES_STD71, &g);
    const struct altpatch_features *h = ap_host_features();
    cr_expect_eq(g.word[12], h->word[12]);
    /* RDPID (word 16) also needs its probe (AP_LEAVES_PROBE): left out */
    uint32_t probe16 = 1u << (X86_FEATURE_RDPID % 32);
    cr_expect_eq(X86_FEATURE_RDPID / 32, 16);
    cr_expect_not(f.word[16] & probe16);
    for (unsigned w = 0; w < AP_NCAPWORDS; w++)
        if (w == 9 || w == 16 || w == 18)
            cr_expect_eq(f.word[w] & ~(w == 16 ? probe16 : 0u),
                         h->word[w] & ~(w == 16 ? probe16 : 0u), "word %u", w);
}

Test(cpu, lazy_os_facts_only_when_wanted)
{
    /* AMX and SHSTK need a fact from the kernel: left out (clear) until a
     * caller wants one of them, then the host's */
    static const unsigned ids[] = {X86_FEATURE_AMX_TILE, X86_FEATURE_AMX_INT8,
                                   X86_FEATURE_AMX_BF16, X86_FEATURE_SHSTK};
    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_STD7, &f);
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
        cr_expect_not(altpatch_features_has(&f, ids[i]), "feature %u before it is wanted", ids[i]);
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        ap_host_leaves(ap_feature_leaves(ids[i]), &f);
        cr_expect_eq(altpatch_features_has(&f, ids[i]),
                     altpatch_features_has(ap_host_features(), ids[i]), "feature %u", ids[i]);
    }
}

Test(cpu, lazy_probes_only_when_wanted)
{
    /* RDTSCP and RDPID are executed under a SIGILL guard: not before a caller
     * wants one of them (left out: clear), then the host's */
    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_STD7 | AP_LEAVES_EXT1, &f);
    cr_expect_not(altpatch_features_has(&f, X86_FEATURE_RDTSCP));
    cr_expect_not(altpatch_features_has(&f, X86_FEATURE_RDPID));
    cr_expect_eq(ap_feature_leaves(X86_FEATURE_RDPID) & AP_LEAVES_PROBE, AP_LEAVES_PROBE);
    cr_expect_eq(ap_feature_leaves(X86_FEATURE_RDTSCP) & AP_LEAVES_PROBE, AP_LEAVES_PROBE);
    ap_host_leaves(ap_feature_leaves(X86_FEATURE_RDPID), &f);
    const struct altpatch_features *h = ap_host_features();
    cr_expect_eq(altpatch_features_has(&f, X86_FEATURE_RDPID),
                 altpatch_features_has(h, X86_FEATURE_RDPID));
    ap_host_leaves(ap_feature_leaves(X86_FEATURE_RDTSCP), &f);
    cr_expect_eq(altpatch_features_has(&f, X86_FEATURE_RDTSCP),
                 altpatch_features_has(h, X86_FEATURE_RDTSCP));
}

/* The CPU's own answer: AMD family 0x1a (the test's CPUID, not the library's). */
static bool cpuid_amd_family_1a(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u /* "Auth" */ ||
        d != 0x69746e65u /* "enti" */ || c != 0x444d4163u /* "cAMD" */)
        return false;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return false;
    unsigned fam = (a >> 8) & 0xf;
    return fam == 0xf && fam + ((a >> 20) & 0xff) == 0x1a;
}

Test(cpu, lazy_rdseed_kernel_flags_only_when_wanted)
{
    /* RDSEED on AMD family 0x1a is the kernel's to decide (/proc/cpuinfo):
     * without that question the set leaves it out there, and only there */
    cr_expect_eq(ap_feature_leaves(X86_FEATURE_RDSEED) & AP_LEAVES_KFLAGS, AP_LEAVES_KFLAGS);
    cr_expect_eq(ap_feature_leaves(X86_FEATURE_RDRAND) & AP_LEAVES_KFLAGS, 0u);
    unsigned a, b, c, d;
    bool cpuid = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 18));
    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_STD7, &f);
    cr_expect_eq(altpatch_features_has(&f, X86_FEATURE_RDSEED), cpuid && !cpuid_amd_family_1a());
    ap_host_leaves(ap_feature_leaves(X86_FEATURE_RDSEED), &f);
    cr_expect_eq(altpatch_features_has(&f, X86_FEATURE_RDSEED),
                 altpatch_features_has(ap_host_features(), X86_FEATURE_RDSEED));
}

Test(cpu, cpuinfo_flags_line)
{
    static const char t[] = "processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                            "vmx flags\t: rdseed\nflags\t\t: fpu rdseed_x avx512f rdseed\n"
                            "bugs\t\t: sysret_ss_attrs\nflags\t\t: rdpid\n";
    size_t n = 0, len = sizeof(t) - 1;
    const char *f = ap_cpuinfo_flags(t, len, &n);
    cr_assert_not_null(f);
    cr_assert_eq(n, strlen(" fpu rdseed_x avx512f rdseed"));
    cr_assert(memcmp(f, " fpu rdseed_x avx512f rdseed", n) == 0);
    cr_assert(ap_cpuinfo_lists(t, len, "rdseed"));
    cr_assert(ap_cpuinfo_lists(t, len, "fpu"));
    cr_assert(ap_cpuinfo_lists(t, len, "avx512f"));
    cr_assert_not(ap_cpuinfo_lists(t, len, "avx512"));   /* whole words only */
    cr_assert_not(ap_cpuinfo_lists(t, len, "rdpid"));    /* the first CPU's line only */
    cr_assert_not(ap_cpuinfo_lists(t, len, "sysret_ss_attrs"));
    cr_assert_not(ap_cpuinfo_lists(t, len, ""));
    /* a flags line cut before its newline is not read */
    const char *cut = strstr(t, "rdseed\nbugs");
    cr_assert_null(ap_cpuinfo_flags(t, (size_t)(cut - t) + 3, &n));
    cr_assert_not(ap_cpuinfo_lists(t, (size_t)(cut - t) + 3, "fpu"));
    cr_assert_null(ap_cpuinfo_flags("processor\t: 0\n", 14, &n));
    cr_assert_null(ap_cpuinfo_flags("", 0, &n));
}

Test(cpu, lazy_lfence_rdtsc_agrees_with_the_host)
{
    /* decided by the vendor rule (no extended leaf read) or by 0x80000021 */
    struct altpatch_features f;
    ap_host_leaves(ap_feature_leaves(X86_FEATURE_LFENCE_RDTSC), &f);
    cr_expect_eq(altpatch_features_has(&f, X86_FEATURE_LFENCE_RDTSC),
                 altpatch_features_has(ap_host_features(), X86_FEATURE_LFENCE_RDTSC));
}

/* One group at a time, in a fresh process, in an order of its own: every bit a
 * group decides equals the full detection's, whatever was read before. */
static void lazy_groups_agree(const unsigned *order, size_t n)
{
    struct altpatch_features part[9];
    unsigned have = 0, had[9];
    for (size_t i = 0; i < n; i++) {
        ap_host_leaves(order[i], &part[i]);
        have |= order[i] | AP_LEAVES_BASE;
        had[i] = have;
    }
    const struct altpatch_features *h = ap_host_features();
    for (size_t i = 0; i < n; i++)
        for (unsigned id = 0; id < AP_NCAPWORDS * 32; id++) {
            if (!ap_feature_known(id) || (ap_feature_leaves(id) & ~had[i]))
                continue;
            cr_expect_eq(altpatch_features_has(&part[i], id), altpatch_features_has(h, id),
                         "feature %u after groups %#x", id, had[i]);
        }
}

Test(cpu, lazy_groups_ascending)
{
    static const unsigned order[] = {AP_LEAVES_STD7, AP_LEAVES_STD71, AP_LEAVES_STDD,
                                     AP_LEAVES_EXT1, AP_LEAVES_EXT7,  AP_LEAVES_EXT8,
                                     AP_LEAVES_EXT21};
    lazy_groups_agree(order, sizeof(order) / sizeof(order[0]));
}

Test(cpu, lazy_groups_descending)
{
    static const unsigned order[] = {AP_LEAVES_EXT21, AP_LEAVES_EXT8, AP_LEAVES_EXT7,
                                     AP_LEAVES_EXT1,  AP_LEAVES_STDD, AP_LEAVES_STD71,
                                     AP_LEAVES_STD7};
    lazy_groups_agree(order, sizeof(order) / sizeof(order[0]));
}

Test(cpu, lazy_cpu_has_matches_host)
{
    /* altpatch_cpu_has() reads only the leaves of the feature it is asked;
     * its answers are the effective set's (the host's less an
     * ALTPATCH_CLEARCPUID the test may run under) */
    bool has[AP_NCAPWORDS * 32];
    for (unsigned id = 0; id < AP_NCAPWORDS * 32; id++)
        has[id] = ap_feature_known(id) && altpatch_cpu_has(id); /* before the full detection */
    struct altpatch_features eff;
    ap_effective_features(&eff);
    for (unsigned id = 0; id < AP_NCAPWORDS * 32; id++)
        if (ap_feature_known(id))
            cr_expect_eq(has[id], altpatch_features_has(&eff, id), "feature %u", id);
}

/* ------------------------------------------------------------------------- */
/* Host detection                                                            */
/* ------------------------------------------------------------------------- */

/* The "flags" and "vendor_id" of the first processor in /proc/cpuinfo. */
static void read_cpuinfo(char *flags, size_t flagsz, char *vendor, size_t vendorsz)
{
    FILE *fp = fopen("/proc/cpuinfo", "r");
    cr_assert_not_null(fp, "/proc/cpuinfo");
    char *line = NULL;
    size_t cap = 0;
    flags[0] = vendor[0] = '\0';
    while (getline(&line, &cap, fp) > 0 && (!flags[0] || !vendor[0])) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        char *val = colon + 1 + (colon[1] == ' ');
        val[strcspn(val, "\n")] = '\0';
        if (!flags[0] && strncmp(line, "flags", 5) == 0)
            snprintf(flags, flagsz, " %s ", val);
        else if (!vendor[0] && strncmp(line, "vendor_id", 9) == 0)
            snprintf(vendor, vendorsz, "%s", val);
    }
    free(line);
    fclose(fp);
    cr_assert(flags[0], "no flags line in /proc/cpuinfo");
}

static bool cpuinfo_has(const char *flags, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof(pat), " %s ", name);
    return strstr(flags, pat) != NULL;
}

/*
 * Names the kernel prints exactly when CPUID (and OS enablement) says so.
 * abm and sse4a: a hypervisor may hide them from its guest's kernel while user
 * mode's CPUID still reports them and the instructions run (an AMD family 0x1a
 * guest does); where the host set claims one that /proc/cpuinfo lacks, the
 * instruction executed here is the oracle (see kernel_may_hide). erms may be
 * claimed beyond /proc/cpuinfo too (ibid.); never the other way round.
 * Not here: pdpe1gb (a paging feature no user instruction uses: the host set
 * keeps CPUID's answer, which the kernel may not print; see
 * system_features_follow_cpuid), rdtscp and rdpid (the host set holds them only
 * where they execute, so it may claim less than /proc/cpuinfo; see
 * probed_features_within_proc_cpuinfo).
 */
static const char *const cpuinfo_checked[] = {
    "fpu",      "tsc",       "cx8",        "cmov",       "clflush",    "mmx",
    "fxsr",     "sse",       "sse2",       "syscall",    "nx",         "lm",
    "pni",        "pclmulqdq",  "ssse3",      "fma",
    "cx16",     "sse4_1",    "sse4_2",     "movbe",      "popcnt",     "aes",
    "xsave",    "avx",       "f16c",       "rdrand",     "hypervisor", "lahf_lm",
    "abm",      "sse4a",     "3dnowprefetch", "fsgsbase", "bmi1",      "avx2",
    "bmi2",     "erms",      "adx",        "rdseed",     "clflushopt", "clwb",
    "sha_ni",   "avx512f",   "avx512dq",   "avx512cd",   "avx512bw",   "avx512vl",
    "avx512ifma", "avx512vbmi", "xsaveopt", "xsavec",    "xgetbv1",    "clzero",
    "wbnoinvd", "gfni",      "vaes",       "vpclmulqdq", "avx512_vnni", "avx512_bitalg",
    "avx512_vpopcntdq", "movdiri", "movdir64b", "fsrm",       "serialize",
    "avx_vnni", "avx512_bf16", "avx512_fp16", "waitpkg", "cldemote",
};

static volatile int ill_seen;
static volatile int ill_len = 2; /* the faulting instruction's length: ud2 */

static void ill_skip_ud2(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    ill_seen++;
    uc->uc_mcontext.gregs[REG_RIP] += ill_len;
}

/* LZCNT: without ABM, f3 0f bd is BSR, which gives 0 for 1 (LZCNT gives 63). */
static bool lzcnt_executes(void)
{
    uint64_t r = 0;
    __asm__ volatile(".byte 0xf3, 0x48, 0x0f, 0xbd, 0xc1" : "=a"(r) : "c"(1ull));
    return r == 63;
}

/* EXTRQ (66 0f 78 /0 ib ib, SSE4A) under a SIGILL guard: #UD without SSE4A. */
static bool extrq_executes(void)
{
    struct sigaction sa, prev;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = ill_skip_ud2;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGILL, &sa, &prev), 0);
    ill_seen = 0;
    ill_len = 6;
    __asm__ volatile(".byte 0x66, 0x0f, 0x78, 0xc0, 0x08, 0x00" ::: "xmm0", "memory");
    bool runs = !ill_seen;
    ill_len = 2;
    cr_assert_eq(sigaction(SIGILL, &prev, NULL), 0);
    return runs;
}

/*
 * A name the kernel may leave out while the instruction runs: the host set
 * may claim it beyond /proc/cpuinfo only where the instruction executes.
 * Returns -1 for a name the kernel prints exactly, else whether it executes.
 * erms: Linux drops it where the firmware turned fast strings off (a bit of
 * IA32_MISC_ENABLE, which user mode cannot read; some hypervisors leave it
 * off); REP MOVSB runs either way, only slower, so there is nothing to
 * execute that could tell, and the claim is allowed.
 */
static int kernel_may_hide(const char *name)
{
    if (strcmp(name, "abm") == 0)
        return lzcnt_executes();
    if (strcmp(name, "sse4a") == 0)
        return extrq_executes();
    if (strcmp(name, "erms") == 0)
        return 1;
    return -1;
}

Test(cpu, oracles_for_hidden_names_run_where_cpuid_claims)
{
    /* the oracles themselves: where CPUID claims ABM, LZCNT's answer; where
     * it claims SSE4A, EXTRQ without #UD. Not the converse: a hypervisor's
     * CPU model may mask a bit whose instruction the hardware still runs. */
    unsigned a, b, c, d;
    bool ext = __get_cpuid(0x80000001, &a, &b, &c, &d);
    if (under_valgrind())
        cr_skip_test("valgrind's CPUID is synthetic");
    if (ext && (c & (1u << 5)))
        cr_assert(lzcnt_executes(), "CPUID claims ABM, LZCNT(1) is not 63");
    if (ext && (c & (1u << 6)))
        cr_assert(extrq_executes(), "CPUID claims SSE4A, EXTRQ raised SIGILL");
}

Test(cpu, host_agrees_with_proc_cpuinfo)
{
    static char flags[8192];
    char vendor[64];
    read_cpuinfo(flags, sizeof(flags), vendor, sizeof(vendor));
    const struct altpatch_features *h = ap_host_features();
    bool vg = under_valgrind();
    if (!vg)
        cr_assert_str_eq(altpatch_features_vendor(h), vendor);
    for (size_t i = 0; i < sizeof(cpuinfo_checked) / sizeof(cpuinfo_checked[0]); i++) {
        const char *n = cpuinfo_checked[i];
        int id = altpatch_feature_id(n);
        cr_assert_geq(id, 0, "%s unknown", n);
        bool host = altpatch_features_has(h, (unsigned)id);
        bool kern = cpuinfo_has(flags, n);
        /* valgrind's CPUID is synthetic (it even reports GenuineIntel on AMD), but it
         * claims none of these names that the machine lacks */
        if (host && !kern) {
            int runs = kernel_may_hide(n);
            if (runs >= 0) {
                cr_expect(runs, "host claims %s, /proc/cpuinfo does not, and it does not execute", n);
                continue;
            }
        }
        if (vg)
            cr_expect(!host || kern, "host claims %s, /proc/cpuinfo does not", n);
        else
            cr_expect_eq(host, kern, "%s: host %d, /proc/cpuinfo %d", n, host, kern);
    }
}

/* RDTSCP and RDPID: never claimed where the kernel does not list them. */
Test(cpu, probed_features_within_proc_cpuinfo)
{
    static char flags[8192];
    char vendor[64];
    read_cpuinfo(flags, sizeof(flags), vendor, sizeof(vendor));
    const struct altpatch_features *h = ap_host_features();
    cr_assert(!altpatch_features_has(h, X86_FEATURE_RDTSCP) || cpuinfo_has(flags, "rdtscp"));
    cr_assert(!altpatch_features_has(h, X86_FEATURE_RDPID) || cpuinfo_has(flags, "rdpid"));
}

/* pdpe1gb: CPUID 0x80000001 EDX bit 26, read here without the library. */
Test(cpu, system_features_follow_cpuid)
{
    uint32_t a = 0x80000000u, b, c = 0, d;
    __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    bool gb = false;
    if (a >= 0x80000001u) {
        a = 0x80000001u, c = 0;
        __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
        gb = (d >> 26) & 1;
    }
    cr_assert_eq(altpatch_features_has(ap_host_features(), X86_FEATURE_GBPAGES), gb);
}

Test(cpu, fsgsbase_follows_hwcap2)
{
    bool has = altpatch_features_has(ap_host_features(), X86_FEATURE_FSGSBASE);
    cr_assert_eq(has, (getauxval(AT_HWCAP2) & 2) != 0);
    if (under_valgrind())
        cr_assert(!has, "valgrind cannot run rdgsbase: FSGSBASE must read as unusable");
}

/*
 * Re-run the two tests above and below that matter under valgrind (whose
 * CPUID hides FSGSBASE and whose AT_HWCAP2 lacks it): the host set must
 * claim nothing valgrind cannot execute. Skipped without valgrind in PATH.
 */
Test(cpu, host_set_under_valgrind, .timeout = 120)
{
    if (under_valgrind())
        cr_skip_test("already under valgrind");
#ifdef AP_ASAN
    cr_skip_test("AddressSanitizer build: valgrind cannot run it");
#endif
    if (system("command -v valgrind >/dev/null 2>&1") != 0)
        cr_skip_test("valgrind not installed");
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    cr_assert_gt(n, 0);
    exe[n] = '\0';
    if (strchr(exe, '\''))
        cr_skip_test("odd path %s", exe);
    char cmd[4500];
    snprintf(cmd, sizeof(cmd),
             "env -u BXFI_MAP valgrind -q --trace-children=yes --error-exitcode=1 '%s' "
             "--jobs 1 --filter 'cpu/@(fsgsbase_follows_hwcap2|claimed_instructions_execute|probed_features_within_proc_cpuinfo)' "
             "2>&1",
             exe);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char out[16384];
    size_t len = fread(out, 1, sizeof(out) - 1, p);
    out[len] = '\0';
    int st = pclose(p);
    /* valgrind 3.19 cannot read clang 14's DWARF 5 (-g): an environment limit, not a result */
    if (st != 0 && strstr(out, "Possibly corrupted debuginfo"))
        cr_skip_test("this valgrind cannot read the binary's debug info");
    cr_assert_eq(st, 0, "valgrind run failed (status %d):\n%s", st, out);
    cr_assert_not_null(strstr(out, "Tested: 3 | Passing: 3 | Failing: 0 | Crashing: 0"), "%s",
                       out);
}

Test(cpu, synthetic_bits_follow_vendor)
{
    const struct altpatch_features *h = ap_host_features();
    const char *v = altpatch_features_vendor(h);
    bool amd_like = !strcmp(v, "AuthenticAMD") || !strcmp(v, "HygonGenuine");
    cr_assert(altpatch_features_has(h, X86_FEATURE_ALWAYS));
    cr_assert_eq(altpatch_features_has(h, X86_FEATURE_APIC_MSRS_FENCE), !amd_like);
    if (amd_like || !strcmp(v, "GenuineIntel"))
        cr_assert(altpatch_features_has(h, X86_FEATURE_LFENCE_RDTSC));
    cr_assert(altpatch_features_has(h, X86_FEATURE_XMM2));
    cr_assert(altpatch_features_has(h, X86_FEATURE_LM));
}

/* Nothing but known ids ever lands in the host set. */
Test(cpu, host_holds_only_known_ids)
{
    const struct altpatch_features *h = ap_host_features();
    for (unsigned id = 0; id < AP_NCAPWORDS * 32; id++)
        if (ap_features_test(h, id))
            cr_assert(ap_feature_known(id), "unknown id %u set", id);
}

/*
 * The known set against the header it is generated from, read here line by
 * line (an oracle that is not the generator): every X86_FEATURE_ line's id is
 * known under its quoted name, no id is listed twice, and no other id is
 * known or kept by the mask.
 */
Test(cpu, known_set_is_the_header)
{
    FILE *fp = fopen(AP_CPUFEATURES_H, "r");
    cr_assert_not_null(fp, "%s", AP_CPUFEATURES_H);
    static bool listed[AP_NCAPWORDS * 32];
    char line[512];
    unsigned n = 0;
    while (fgets(line, sizeof(line), fp)) {
        if (strncmp(line, "#define X86_FEATURE_", 20) != 0)
            continue;
        char macro[64], name[64];
        unsigned w, b;
        cr_assert_eq(sscanf(line, "#define X86_FEATURE_%63s ( %u*32+ %u) /* \"%63[a-z0-9_]\"", macro,
                            &w, &b, name),
                     4, "%s", line);
        unsigned id = w * 32 + b;
        cr_assert(b < 32 && id < AP_NCAPWORDS * 32, "%s", line);
        cr_assert(!listed[id], "id %u listed twice: %s", id, line);
        listed[id] = true;
        n++;
        cr_assert(ap_feature_known(id), "X86_FEATURE_%s (%u) is not known", macro, id);
        cr_assert_str_eq(altpatch_feature_name(id), name, "X86_FEATURE_%s", macro);
        cr_assert_eq(altpatch_feature_id(name), (int)id, "%s", name);
    }
    fclose(fp);
    cr_assert_gt(n, 150u);
    struct altpatch_features f;
    ap_features_init(&f);
    memset(f.word, 0xff, sizeof(f.word));
    ap_mask_known(&f);
    for (unsigned id = 0; id < AP_NCAPWORDS * 32; id++) {
        cr_assert_eq(ap_feature_known(id), listed[id], "id %u", id);
        cr_assert_eq(ap_features_test(&f, id), listed[id], "id %u after the mask", id);
    }
    memset(f.word, 0, sizeof(f.word));
    ap_mask_known(&f);
    for (unsigned w = 0; w < AP_NCAPWORDS; w++)
        cr_assert_eq(f.word[w], 0u);
}

/* The vendor rules match the whole vendor string: not a prefix, not a longer one. */
Test(cpu, synthetic_bits_need_the_exact_vendor)
{
    static const struct {
        const char *vendor;
        bool amd_like, lfence_rule;
    } cases[] = {
        {"AuthenticAMD", true, true},     {"HygonGenuine", true, true},
        {"GenuineIntel", false, true},    {"CentaurHauls", false, true},
        {"  Shanghai  ", false, true},    {"AuthenticAM", false, false},
        {"AuthenticAMDx", false, false},  {"authenticAMD", false, false},
        {"GenuineIntelXYZ", false, false}, {"", false, false},
        {"unknown", false, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct altpatch_features f;
        ap_features_init(&f);
        ap_set_vendor(&f, cases[i].vendor);
        ap_bit_set(&f, X86_FEATURE_XMM2);
        ap_bit_set(&f, X86_FEATURE_LM);
        ap_derive_synthetic(&f);
        const char *v = cases[i].vendor;
        cr_expect(ap_features_test(&f, X86_FEATURE_ALWAYS), "%s", v);
        cr_expect_eq(ap_features_test(&f, X86_FEATURE_APIC_MSRS_FENCE), !cases[i].amd_like,
                     "'%s'", v);
        cr_expect_eq(ap_features_test(&f, X86_FEATURE_3DNOWPREFETCH), cases[i].amd_like, "'%s'",
                     v);
        cr_expect_eq(ap_features_test(&f, X86_FEATURE_LFENCE_RDTSC), cases[i].lfence_rule,
                     "'%s'", v);
    }
}

/* The program's own action for @sig: ill_skip_ud2 with SIGUSR2 in its mask;
 * @before receives it as the kernel reports it. */
static void own_action_install(int sig, struct sigaction *before)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = ill_skip_ud2;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    cr_assert_eq(sigaction(sig, &sa, NULL), 0);
    cr_assert_eq(sigaction(sig, NULL, before), 0);
}

/* @sig's action is still the one own_action_install() set: handler, flags, mask. */
static void own_action_expect(int sig, const struct sigaction *before)
{
    struct sigaction after;
    cr_assert_eq(sigaction(sig, NULL, &after), 0);
    cr_assert_eq((void *)after.sa_sigaction, (void *)ill_skip_ud2, "signal %d", sig);
    cr_assert_eq(after.sa_flags, before->sa_flags, "signal %d", sig);
    cr_assert(sigismember(&after.sa_mask, SIGUSR2), "signal %d", sig);
    cr_assert_not(sigismember(&after.sa_mask, SIGUSR1), "signal %d", sig);
}

/*
 * The probes' SIGILL guard leaves the program's own SIGILL action exactly as
 * it was (handler, flags, mask), and that action still runs and returns
 * through its own restorer afterwards.
 */
Test(cpu, probe_guard_restores_the_sigill_action)
{
    struct sigaction before;
    own_action_install(SIGILL, &before);

    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_ALL, &f); /* runs the probes where CPUID claims RDTSCP or RDPID */

    own_action_expect(SIGILL, &before);
    ill_seen = 0;
    __asm__ volatile("ud2" ::: "memory");
    __asm__ volatile("ud2" ::: "memory");
    cr_assert_eq(ill_seen, 2);
}

/* The oracle for RDTSCP: CPUID claims it and the instruction runs here under
 * the test's own SIGILL guard (SIGILL unblocked meanwhile; the previous
 * action and mask put back). */
static bool rdtscp_runs_here(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000001, &a, &b, &c, &d) || !(d & (1u << 27)))
        return false;
    struct sigaction sa, prev;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = ill_skip_ud2;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigset_t ill, old;
    sigemptyset(&ill);
    sigaddset(&ill, SIGILL);
    cr_assert_eq(sigaction(SIGILL, &sa, &prev), 0);
    cr_assert_eq(sigprocmask(SIG_UNBLOCK, &ill, &old), 0);
    ill_seen = 0;
    ill_len = 3; /* rdtscp: 0f 01 f9 */
    __asm__ volatile(".byte 0x0f, 0x01, 0xf9" ::: "eax", "ecx", "edx", "memory");
    bool runs = !ill_seen;
    cr_assert_eq(sigprocmask(SIG_SETMASK, &old, NULL), 0);
    cr_assert_eq(sigaction(SIGILL, &prev, NULL), 0);
    return runs;
}

/* Whether CPUID (read here) claims RDTSCP or RDPID: the probe's instructions. */
static bool cpuid_claims_rdtscp_or_rdpid(void)
{
    unsigned a, b, c, d;
    bool tscp = __get_cpuid(0x80000001, &a, &b, &c, &d) && (d & (1u << 27));
    bool pid = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 22));
    return tscp || pid;
}

/* Block @p sig and raise it: pending, as a program that deferred it leaves it. */
static void leave_pending(int sig)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    cr_assert_eq(sigprocmask(SIG_BLOCK, &set, NULL), 0);
    cr_assert_eq(raise(sig), 0);
}

/* @p sig (leave_pending()) is still pending and blocked; then dropped and unblocked. */
static void expect_pending_then_drop(int sig)
{
    sigset_t set, mask, pend;
    cr_assert_eq(sigpending(&pend), 0);
    cr_assert(sigismember(&pend, sig), "the program's signal %d is still pending", sig);
    cr_assert_eq(sigprocmask(SIG_BLOCK, NULL, &mask), 0);
    cr_assert(sigismember(&mask, sig), "and still blocked");
    signal(sig, SIG_IGN); /* drop it */
    sigemptyset(&set);
    sigaddset(&set, sig);
    cr_assert_eq(sigprocmask(SIG_UNBLOCK, &set, NULL), 0);
    signal(sig, SIG_DFL);
}

/*
 * An answer given while the probe could not run was not kept: asked again
 * now, RDTSCP is what the oracle says, in the internal set and the public one.
 */
static void expect_asked_again(void)
{
    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_ALL, &f);
    bool runs = rdtscp_runs_here();
    cr_assert_eq(altpatch_features_has(&f, X86_FEATURE_RDTSCP), runs,
                 "asked again: RDTSCP claimed %d, executes %d",
                 altpatch_features_has(&f, X86_FEATURE_RDTSCP), runs);
    struct altpatch_features *h = altpatch_features_host();
    cr_assert_not_null(h);
    cr_assert_eq(altpatch_features_has(h, X86_FEATURE_RDTSCP), runs);
    altpatch_features_free(h);
}

/*
 * A SIGILL the program blocked and left pending: the probe does not unblock
 * it (it would be delivered at once, to the program's action: the default
 * kills), the signal stays pending and blocked, neither instruction is
 * claimed. Where CPUID claims neither, nothing is probed either way and the
 * test proves nothing: skipped.
 */
Test(cpu, pending_blocked_sigill_is_left_alone)
{
    if (!cpuid_claims_rdtscp_or_rdpid())
        cr_skip_test("CPUID claims neither RDTSCP nor RDPID: no probe to keep from running");
    leave_pending(SIGILL);
    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_ALL, &f);
    cr_assert_not(altpatch_features_has(&f, X86_FEATURE_RDTSCP));
    cr_assert_not(altpatch_features_has(&f, X86_FEATURE_RDPID));
    expect_pending_then_drop(SIGILL);
    expect_asked_again();
}

/*
 * RDTSCP faults with SIGSEGV, not SIGILL, where the process asked for
 * PR_TSC_SIGSEGV. The probe's guard takes that fault too: with the test
 * switch the RDTSCP probe executes HLT (privileged: #GP, SIGSEGV, on every
 * x86-64 CPU) whatever CPUID claims, so this runs the guard everywhere. The
 * process lives, RDTSCP is not claimed, and the program's SIGSEGV action is
 * exactly what it was and still runs.
 */
Test(cpu, probe_guard_takes_a_sigsegv_fault)
{
    struct sigaction before;
    own_action_install(SIGSEGV, &before);

    ap_probe_hlt_test = AP_PROBE_TEST_HLT;
    ill_seen = 0;
    ill_len = 1; /* were the program's action to take the probe's fault, it would skip the HLT */
    struct altpatch_features f;
    cr_assert(ap_host_leaves(AP_LEAVES_ALL, &f));
    ap_probe_hlt_test = 0;
    cr_assert_eq(ill_seen, 0, "the probe's fault went to the guard, not to the program");
    cr_assert_not(altpatch_features_has(&f, X86_FEATURE_RDTSCP),
                  "the probe faulted: RDTSCP is not claimed");

    own_action_expect(SIGSEGV, &before);
    ill_seen = 0;
    ill_len = 1; /* hlt: f4 */
    __asm__ volatile("hlt" ::: "memory");
    ill_len = 2;
    cr_assert_eq(ill_seen, 1, "the program's own SIGSEGV action runs after the probe");
}

/* The same with SIGSEGV blocked by the program: the fault would kill a
 * process whose signal is blocked, so the probe unblocks it meanwhile and
 * puts the program's mask back. */
Test(cpu, probe_guard_unblocks_sigsegv_meanwhile)
{
    sigset_t segv, mask;
    sigemptyset(&segv);
    sigaddset(&segv, SIGSEGV);
    cr_assert_eq(sigprocmask(SIG_BLOCK, &segv, NULL), 0);
    struct sigaction before, now;
    cr_assert_eq(sigaction(SIGSEGV, NULL, &before), 0);
    ap_probe_hlt_test = AP_PROBE_TEST_HLT;
    struct altpatch_features f;
    cr_assert(ap_host_leaves(AP_LEAVES_ALL, &f));
    ap_probe_hlt_test = 0;
    cr_assert_not(altpatch_features_has(&f, X86_FEATURE_RDTSCP));
    cr_assert_eq(sigprocmask(SIG_BLOCK, NULL, &mask), 0);
    cr_assert(sigismember(&mask, SIGSEGV), "the program's mask is put back");
    cr_assert_eq(sigaction(SIGSEGV, NULL, &now), 0);
    cr_assert_eq((void *)now.sa_handler, (void *)before.sa_handler, "the action is put back");
    cr_assert_eq(now.sa_flags, before.sa_flags);
}

/*
 * A fault that is not the probe's while the guard holds (another thread's,
 * in a runtime that takes SIGSEGV on purpose): the test switch makes a HLT
 * outside the probe fault first. It goes to the program's own action, which
 * is back in place exactly; the probe whose guard went down does not run,
 * and its answer is not kept: asked again, RDTSCP is what the oracle says.
 */
Test(cpu, probe_guard_hands_a_foreign_fault_back)
{
    struct sigaction before;
    own_action_install(SIGSEGV, &before);
    ap_probe_hlt_test = AP_PROBE_TEST_FOREIGN;
    ill_seen = 0;
    ill_len = 1; /* the program's action skips the foreign HLT */
    struct altpatch_features f;
    cr_assert(ap_host_leaves(AP_LEAVES_ALL, &f));
    ap_probe_hlt_test = 0;
    ill_len = 2;
    cr_assert_eq(ill_seen, 1, "the foreign fault reached the program's action, once");
    cr_assert_not(altpatch_features_has(&f, X86_FEATURE_RDTSCP),
                  "no answer while the guard was down: not claimed");
    own_action_expect(SIGSEGV, &before);

    ap_host_leaves(AP_LEAVES_ALL, &f);
    bool runs = rdtscp_runs_here();
    cr_assert_eq(altpatch_features_has(&f, X86_FEATURE_RDTSCP), runs,
                 "asked again: RDTSCP claimed %d, executes %d",
                 altpatch_features_has(&f, X86_FEATURE_RDTSCP), runs);
}

/* Faults HLT until told to stop; the program's action skips each. */
static volatile int hammer_stop;

static void *hammer_hlt(void *arg)
{
    (void)arg;
    while (!hammer_stop)
        __asm__ volatile("hlt" ::: "memory");
    return NULL;
}

/*
 * The same with a real second thread that faults all the time (its SIGSEGVs
 * handled by the program's action) while the first derives the set with the
 * RDTSCP probe faulting (HLT under the test switch), in 64 fresh processes:
 * each lives, never claims RDTSCP (the probe's fault reached its guard, or
 * the guard went down and the probe did not run), and ends with the
 * program's action in place (a derivation that found an earlier guard not
 * yet taken down by the other thread's handler read it as the program's
 * action, and that handler put the guard back for good: a hang).
 */
Test(cpu, probe_guard_beside_a_faulting_thread)
{
    if (under_valgrind())
        cr_skip_test("valgrind serialises the threads");
    for (int round = 0; round < 64; round++) {
        pid_t pid = fork();
        cr_assert_neq(pid, -1);
        if (pid == 0) {
            struct sigaction sa, now;
            memset(&sa, 0, sizeof(sa));
            sa.sa_sigaction = ill_skip_ud2;
            sa.sa_flags = SA_SIGINFO;
            sigemptyset(&sa.sa_mask);
            ill_len = 1;
            if (sigaction(SIGSEGV, &sa, NULL) != 0)
                _exit(2);
            /* a guard left in place for good re-runs the thread's HLT
             * forever: the join would never return */
            alarm(20);
            pthread_t t;
            if (pthread_create(&t, NULL, hammer_hlt, NULL) != 0)
                _exit(3);
            while (!ill_seen)
                sched_yield();
            ap_probe_hlt_test = AP_PROBE_TEST_HLT;
            bool claimed = false;
            for (int i = 0; i < 8; i++) {
                struct altpatch_features f;
                ap_host_leaves(AP_LEAVES_ALL, &f);
                claimed |= altpatch_features_has(&f, X86_FEATURE_RDTSCP);
            }
            hammer_stop = 1;
            pthread_join(t, NULL);
            if (sigaction(SIGSEGV, NULL, &now) != 0 || now.sa_sigaction != ill_skip_ud2)
                _exit(4);
            _exit(claimed ? 5 : 0);
        }
        int st = 0;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(WIFEXITED(st), "round %d: the child was killed by signal %d%s", round,
                  WTERMSIG(st),
                  WTERMSIG(st) == SIGALRM ? " (the faulting thread never got its action back)"
                                          : "");
        cr_assert_eq(WEXITSTATUS(st), 0,
                     "round %d: child status %d (4: the program's action lost, 5: RDTSCP claimed)",
                     round, WEXITSTATUS(st));
    }
}

/*
 * A SIGSEGV the program blocked and left pending: the RDTSCP probe (HLT
 * under the test switch, so that it runs on any machine) would unblock it
 * and the guard would take it, so nothing is probed; the signal stays
 * pending and blocked, and the answer is not kept.
 */
Test(cpu, pending_blocked_sigsegv_is_left_alone)
{
    leave_pending(SIGSEGV);
    ap_probe_hlt_test = AP_PROBE_TEST_HLT;
    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_ALL, &f);
    ap_probe_hlt_test = 0;
    cr_assert_not(altpatch_features_has(&f, X86_FEATURE_RDTSCP));
    expect_pending_then_drop(SIGSEGV);
    expect_asked_again();
}

/*
 * A process that asked for PR_TSC_SIGSEGV: the first derivation of the set
 * (which probes RDTSCP where CPUID claims it) does not end it, and RDTSCP is
 * not claimed (it faults there). In a child: under that mode the clock of the
 * vDSO faults too, which the test runner uses.
 */
Test(cpu, probe_survives_pr_tsc_sigsegv)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000001, &a, &b, &c, &d) || !(d & (1u << 27)))
        cr_skip_test("CPUID does not claim RDTSCP: no probe of it (probe_guard_takes_a_sigsegv_fault "
                     "runs the guard everywhere)");
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        if (prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0) != 0)
            _exit(3);
        struct altpatch_features f;
        if (!ap_host_leaves(AP_LEAVES_ALL, &f))
            _exit(4);
        _exit(altpatch_features_has(&f, X86_FEATURE_RDTSCP) ? 5 : 0);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "the child was killed by signal %d", WTERMSIG(st));
    if (WEXITSTATUS(st) == 3)
        cr_skip_test("prctl(PR_SET_TSC) refused here");
    cr_assert_eq(WEXITSTATUS(st), 0, "child status %d (4: no set, 5: RDTSCP claimed)",
                 WEXITSTATUS(st));
}

/* The probe's guard set (rt_sigaction for SIGILL), counted by a seccomp trap. */
static volatile int guard_sets;

static void count_sigsys(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    guard_sets++;
    uc->uc_mcontext.gregs[REG_RAX] = -EPERM; /* the probe then claims neither */
}

/*
 * A clear list naming both RDTSCP and RDPID: the effective set an apply
 * derives for records referencing them runs no probe (no rt_sigaction for
 * SIGILL); a list naming RDTSCP alone does, wherever CPUID claims either
 * instruction (CPUID read here). In a child: a seccomp filter traps the
 * probe's rt_sigaction(SIGILL) and the child's SIGSYS handler counts it.
 * Where CPUID claims neither, no list runs the probe: skipped.
 */
Test(cpu, clear_list_naming_both_runs_no_probe)
{
    if (under_valgrind())
        cr_skip_test("valgrind handles the client's rt_sigaction itself");
    if (!cpuid_claims_rdtscp_or_rdpid())
        cr_skip_test("CPUID claims neither RDTSCP nor RDPID: no list runs the probe");
    unsigned a, b, c, d;
    bool tscp = __get_cpuid(0x80000001, &a, &b, &c, &d) && (d & (1u << 27));
    bool pid = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 22));
    pid_t ch = fork();
    cr_assert_neq(ch, -1);
    if (ch == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = count_sigsys;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGSYS, &sa, NULL))
            _exit(100);
        struct sock_filter flt[] = {
            AP_SECCOMP_PROLOGUE,
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rt_sigaction, 0, 3),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SIGILL, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        int set = AP_SECCOMP_INSTALL(flt);
        if (set)
            _exit(ap_seccomp_absent(set) ? 99 : 101);
        unsigned groups = ap_feature_leaves(X86_FEATURE_RDTSCP) |
                          ap_feature_leaves(X86_FEATURE_RDPID);
        struct altpatch_features f;
        ap_effective_leaves_cleared(groups, "rdtscp, rdpid", &f);
        if (altpatch_features_has(&f, X86_FEATURE_RDTSCP) ||
            altpatch_features_has(&f, X86_FEATURE_RDPID))
            _exit(102);
        int both = guard_sets;
        ap_effective_leaves_cleared(groups, "rdtscp", &f);
        int one = guard_sets - both;
        _exit((both ? 10 : 0) + (one ? 1 : 0));
    }
    int st = 0;
    cr_assert_eq(waitpid(ch, &st, 0), ch);
    cr_assert(WIFEXITED(st), "child status %#x", st);
    int code = WEXITSTATUS(st);
    if (code == 99)
        cr_skip_test("seccomp filters cannot be installed here");
    cr_assert_lt(code, 100, "child failed at step %d", code);
    cr_assert_eq(code / 10, 0, "the probe ran for a list clearing both");
    cr_assert_eq(code % 10, 1,
                 "probe %s with RDTSCP only cleared (CPUID: RDTSCP %d, RDPID %d)",
                 code % 10 ? "ran" : "did not run", tscp, pid);
}

/*
 * A SIGILL the program blocked, none pending: the probe still runs (with
 * SIGILL unblocked while it does), RDTSCP is claimed exactly where CPUID
 * claims it and the instruction runs under the test's own SIGILL guard, and
 * the program's mask holds SIGILL blocked again afterwards.
 */
Test(cpu, blocked_sigill_is_probed_and_blocked_again)
{
    sigset_t ill, mask, pend;
    sigemptyset(&ill);
    sigaddset(&ill, SIGILL);
    cr_assert_eq(sigprocmask(SIG_BLOCK, &ill, NULL), 0);
    struct altpatch_features f;
    ap_host_leaves(AP_LEAVES_ALL, &f);
    cr_assert_eq(sigprocmask(SIG_BLOCK, NULL, &mask), 0);
    cr_assert(sigismember(&mask, SIGILL), "SIGILL blocked again");
    cr_assert_eq(sigpending(&pend), 0);
    cr_assert_not(sigismember(&pend, SIGILL));
    /* the oracle: CPUID's claim, and rdtscp executed here under a guard */
    unsigned a, b, c, d;
    bool claimed = __get_cpuid(0x80000001, &a, &b, &c, &d) && (d & (1u << 27));
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = ill_skip_ud2;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGILL, &sa, NULL), 0);
    cr_assert_eq(sigprocmask(SIG_UNBLOCK, &ill, NULL), 0);
    ill_seen = 0;
    ill_len = 3; /* rdtscp: 0f 01 f9 */
    if (claimed)
        __asm__ volatile(".byte 0x0f, 0x01, 0xf9" ::: "eax", "ecx", "edx", "memory");
    bool runs = claimed && !ill_seen;
    cr_assert_eq(altpatch_features_has(&f, X86_FEATURE_RDTSCP), runs,
                 "RDTSCP claimed %d, CPUID %d, executes %d",
                 altpatch_features_has(&f, X86_FEATURE_RDTSCP), claimed, runs);
}

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

Test(cpu, avx_family_needs_xcr0)
{
    const struct altpatch_features *h = ap_host_features();
    if (!altpatch_features_has(h, X86_FEATURE_OSXSAVE)) {
        cr_assert(!altpatch_features_has(h, X86_FEATURE_AVX));
        cr_assert(!altpatch_features_has(h, X86_FEATURE_AVX2));
        cr_assert(!altpatch_features_has(h, X86_FEATURE_AVX512F));
        return;
    }
    uint64_t xcr0 = xgetbv0();
    if (altpatch_features_has(h, X86_FEATURE_AVX) || altpatch_features_has(h, X86_FEATURE_AVX2))
        cr_assert_eq(xcr0 & 6, 6u);
    if (altpatch_features_has(h, X86_FEATURE_AVX512F))
        cr_assert_eq(xcr0 & 0xe6, 0xe6u);
    if (altpatch_features_has(h, X86_FEATURE_AMX_TILE))
        cr_assert_eq(xcr0 & 0x60000, 0x60000u);
    if (altpatch_features_has(h, X86_FEATURE_PKU))
        cr_assert(altpatch_features_has(h, X86_FEATURE_OSPKE));
}

static void *host_ptr(void *arg)
{
    (void)arg;
    return (void *)ap_host_features();
}

Test(cpu, host_detected_once_across_threads)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, host_ptr, NULL), 0);
    const void *mine = ap_host_features();
    for (int i = 0; i < 4; i++) {
        void *r;
        cr_assert_eq(pthread_join(t[i], &r), 0);
        cr_assert_eq(r, mine);
    }
}

/*
 * "Usable" means usable: execute one instruction of every feature the host
 * set claims (a SIGILL fails the test). Under valgrind this also checks that
 * nothing valgrind cannot run is claimed.
 */
Test(cpu, claimed_instructions_execute)
{
    const struct altpatch_features *h = ap_host_features();
    uint64_t a = 0x0123456789abcdefull, b = 0;
    uint32_t aux = 0;
    static char line[64] __attribute__((aligned(64)));

    if (altpatch_features_has(h, X86_FEATURE_POPCNT)) {
        __asm__ volatile("popcnt %1, %0" : "=r"(b) : "r"(a));
        cr_assert_eq(b, 32u);
    }
    if (altpatch_features_has(h, X86_FEATURE_ABM)) {
        __asm__ volatile("lzcnt %1, %0" : "=r"(b) : "r"(a));
        cr_assert_eq(b, 7u);
    }
    if (altpatch_features_has(h, X86_FEATURE_BMI1)) {
        __asm__ volatile("tzcnt %1, %0" : "=r"(b) : "r"(a));
        cr_assert_eq(b, 0u);
    }
    if (altpatch_features_has(h, X86_FEATURE_MOVBE)) {
        uint64_t m = a;
        __asm__ volatile("movbe %1, %0" : "=r"(b) : "m"(m));
        cr_assert_eq(b, __builtin_bswap64(a));
    }
    /* pin, so that rdtscp and rdpid read the same CPU's TSC_AUX */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    bool pinned = sched_setaffinity(0, sizeof(one), &one) == 0;
    if (altpatch_features_has(h, X86_FEATURE_RDTSCP))
        __asm__ volatile("rdtscp" : "=a"(a), "=d"(b), "=c"(aux));
    if (altpatch_features_has(h, X86_FEATURE_RDPID)) {
        __asm__ volatile("rdpid %0" : "=r"(b));
        if (pinned && altpatch_features_has(h, X86_FEATURE_RDTSCP))
            cr_assert_eq((uint32_t)b, aux, "rdpid and rdtscp disagree on TSC_AUX");
        if (pinned) /* RDPID counts only where TSC_AUX holds the CPU number */
            cr_assert_eq(b & 0xfff, (uint64_t)sched_getcpu(), "rdpid != sched_getcpu()");
    }
    if (altpatch_features_has(h, X86_FEATURE_AVX)) {
        __asm__ volatile("vxorps %%ymm0, %%ymm0, %%ymm0\n\tvzeroupper" ::: "xmm0");
    }
    if (altpatch_features_has(h, X86_FEATURE_BMI2)) {
        __asm__ volatile("pdep %2, %1, %0" : "=r"(b) : "r"(a), "r"(0xffull));
        cr_assert_eq(b, a & 0xff);
    }
    if (altpatch_features_has(h, X86_FEATURE_ADX)) {
        uint64_t x = 1;
        __asm__ volatile("xor %%eax, %%eax\n\tadcx %1, %0" : "+r"(x) : "r"(2ull) : "rax", "cc");
        cr_assert_eq(x, 3u);
    }
    if (altpatch_features_has(h, X86_FEATURE_XMM4_2)) {
        uint32_t crc = 0;
        __asm__ volatile("crc32b %1, %0" : "+r"(crc) : "r"((uint8_t)1));
        cr_assert_neq(crc, 0u);
    }
    if (altpatch_features_has(h, X86_FEATURE_RDRAND)) {
        unsigned char ok;
        __asm__ volatile("rdrand %0\n\tsetc %1" : "=r"(b), "=qm"(ok) : : "cc");
        (void)ok;
    }
    if (altpatch_features_has(h, X86_FEATURE_RDSEED)) {
        unsigned char ok;
        __asm__ volatile("rdseed %0\n\tsetc %1" : "=r"(b), "=qm"(ok) : : "cc");
        (void)ok;
    }
    if (altpatch_features_has(h, X86_FEATURE_AES))
        __asm__ volatile("aesenc %%xmm0, %%xmm0" ::: "xmm0");
    if (altpatch_features_has(h, X86_FEATURE_PCLMULQDQ))
        __asm__ volatile("pclmulqdq $0, %%xmm0, %%xmm0" ::: "xmm0");
    if (altpatch_features_has(h, X86_FEATURE_SHA_NI))
        __asm__ volatile("sha1msg1 %%xmm0, %%xmm0" ::: "xmm0");
    if (altpatch_features_has(h, X86_FEATURE_FSGSBASE)) {
        uint64_t fs = 0;
        __asm__ volatile("rdfsbase %0" : "=r"(fs));
        cr_assert_neq(fs, 0u); /* glibc's TCB */
    }
    if (altpatch_features_has(h, X86_FEATURE_CLFLUSHOPT))
        __asm__ volatile("clflushopt %0" : "+m"(line));
    if (altpatch_features_has(h, X86_FEATURE_CLWB))
        __asm__ volatile("clwb %0" : "+m"(line));
    if (altpatch_features_has(h, X86_FEATURE_AVX2))
        __asm__ volatile("vpaddd %%ymm0, %%ymm0, %%ymm0\n\tvzeroupper" ::: "xmm0");
    if (altpatch_features_has(h, X86_FEATURE_AVX512F))
        __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\tvzeroupper" ::: "xmm0");
    if (altpatch_features_has(h, X86_FEATURE_PKU)) {
        uint32_t pkru, edx;
        __asm__ volatile("rdpkru" : "=a"(pkru), "=d"(edx) : "c"(0));
        (void)pkru;
    }
    if (altpatch_features_has(h, X86_FEATURE_SERIALIZE))
        __asm__ volatile("serialize" ::: "memory");
    if (altpatch_features_has(h, X86_FEATURE_LFENCE_RDTSC))
        __asm__ volatile("lfence\n\trdtsc" : "=a"(a), "=d"(b));
    ap_sync_core();
}

/* ------------------------------------------------------------------------- */
/* ALTPATCH_CLEARCPUID (Criterion runs each test in its own process)         */
/* ------------------------------------------------------------------------- */

static char warn_buf[1024];
static int warn_count;

static int capture(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level == ALTPATCH_WARN) {
        size_t used = strlen(warn_buf);
        vsnprintf(warn_buf + used, sizeof(warn_buf) - used, fmt, ap);
        warn_count++;
    }
    return 0;
}

Test(cpu, clearcpuid_clears_for_cpu_has)
{
    cr_assert_eq(unsetenv("ALTPATCH_CLEARCPUID"), 0);
    cr_assert(altpatch_cpu_has(X86_FEATURE_XMM2));
    cr_assert(altpatch_cpu_has(X86_FEATURE_ALWAYS));
    cr_assert(!altpatch_cpu_has(9 * 32 + 22));
    cr_assert_eq(setenv("ALTPATCH_CLEARCPUID", "sse2, ALWAYS,288", 1), 0);
    cr_assert(!altpatch_cpu_has(X86_FEATURE_XMM2));
    cr_assert(altpatch_cpu_has(X86_FEATURE_ALWAYS), "ALWAYS is in every set: never cleared");
    cr_assert(!altpatch_cpu_has(X86_FEATURE_FSGSBASE));
    cr_assert(altpatch_cpu_has(X86_FEATURE_LM));
    /* the host set itself is untouched */
    cr_assert(altpatch_features_has(ap_host_features(), X86_FEATURE_XMM2));
    cr_assert_eq(unsetenv("ALTPATCH_CLEARCPUID"), 0);
    cr_assert(altpatch_cpu_has(X86_FEATURE_XMM2));
}

Test(cpu, clearcpuid_effective_features)
{
    struct altpatch_features eff;
    cr_assert_eq(setenv("ALTPATCH_CLEARCPUID", "lm,sse", 1), 0);
    ap_effective_features(&eff);
    cr_assert(!ap_features_test(&eff, X86_FEATURE_LM));
    cr_assert(!ap_features_test(&eff, X86_FEATURE_XMM));
    cr_assert(ap_features_test(&eff, X86_FEATURE_XMM2));
    struct altpatch_features host = *ap_host_features();
    cr_assert_eq(altpatch_features_clear(&host, X86_FEATURE_LM), 0);
    cr_assert_eq(altpatch_features_clear(&host, X86_FEATURE_XMM), 0);
    cr_assert_eq(memcmp(&eff, &host, sizeof(host)), 0, "only the listed bits differ");
}

Test(cpu, clearcpuid_warns_on_unknown_names)
{
    struct altpatch_features f = *ap_host_features();
    altpatch_set_print(capture);
    warn_buf[0] = '\0';
    warn_count = 0;
    cr_assert_eq(ap_clearcpuid(&f, "sse2,frobnicate,,rdtscp, nosuch "), 2);
    cr_assert_eq(warn_count, 2, "%s", warn_buf);
    cr_assert_not_null(strstr(warn_buf, "'frobnicate'"), "%s", warn_buf);
    cr_assert_not_null(strstr(warn_buf, "'nosuch'"), "%s", warn_buf);
    cr_assert(!ap_features_test(&f, X86_FEATURE_XMM2));
    cr_assert(!ap_features_test(&f, X86_FEATURE_RDTSCP));

    /* through the environment: ap_effective_features() warns, altpatch_cpu_has() stays quiet */
    warn_buf[0] = '\0';
    warn_count = 0;
    cr_assert_eq(setenv("ALTPATCH_CLEARCPUID", "bogus1", 1), 0);
    cr_assert(altpatch_cpu_has(X86_FEATURE_XMM2));
    cr_assert_eq(warn_count, 0);
    struct altpatch_features eff;
    ap_effective_features(&eff);
    cr_assert_eq(warn_count, 1);
    cr_assert_not_null(strstr(warn_buf, "'bogus1'"), "%s", warn_buf);
    cr_assert_eq(memcmp(&eff, ap_host_features(), sizeof(eff)), 0);
    altpatch_set_print(NULL);
}

/* ap_getenv() reads environ itself: getenv()'s answers, names matched whole. */
Test(cpu, getenv_matches_the_c_library)
{
    cr_assert_eq(setenv("ALTPATCH_TESTVAR", "abc", 1), 0);
    cr_assert_eq(setenv("ALTPATCH_TESTVAR_LONGER", "x", 1), 0);
    cr_assert_eq(setenv("BLTPATCH_TESTVAR", "y", 1), 0);
    cr_assert_eq(setenv("ALTPATCH_EMPTY", "", 1), 0);
    static const char *const names[] = {"ALTPATCH_TESTVAR", "ALTPATCH_TESTVA", "ALTPATCH_TESTVAR_",
                                        "ALTPATCH_TESTVAR_LONGER", "ALTPATCH_EMPTY",
                                        "ALTPATCH_NOT_SET", "A", ""};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *a = ap_getenv(names[i]), *b = getauxval(AT_SECURE) ? NULL : getenv(names[i]);
        if (!names[i][0])
            b = NULL; /* an empty name is never set */
        cr_assert_eq(a == NULL, b == NULL, "'%s'", names[i]);
        if (a)
            cr_assert_str_eq(a, b, "'%s'", names[i]);
    }
    cr_assert(ap_env_on("ALTPATCH_TESTVAR"));
    cr_assert_eq(setenv("ALTPATCH_TESTVAR", "0", 1), 0);
    cr_assert_not(ap_env_on("ALTPATCH_TESTVAR"));
    cr_assert_eq(setenv("ALTPATCH_TESTVAR", "00", 1), 0);
    cr_assert(ap_env_on("ALTPATCH_TESTVAR"));
    cr_assert_not(ap_env_on("ALTPATCH_EMPTY"));
    cr_assert_eq(clearenv(), 0);
    cr_assert_null(ap_getenv("ALTPATCH_TESTVAR"));
}

/* ap_env_read(): in one pass, what ap_getenv() answers for each of apply's
 * variables, with look-alike names around them. */
static void expect_env_read(void)
{
    struct ap_env e;
    memset(&e, 0x5a, sizeof(e));
    ap_env_read(&e);
    const char *want[3] = {ap_getenv("ALTPATCH_OFF"), ap_getenv("ALTPATCH_DEBUG"),
                           ap_getenv("ALTPATCH_CLEARCPUID")};
    const char *got[3] = {e.off, e.debug, e.clearcpuid};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(got[i] == NULL, want[i] == NULL, "variable %d", i);
        if (got[i])
            cr_assert_eq(got[i], want[i], "variable %d: the same string", i);
    }
}

Test(cpu, env_read_matches_getenv)
{
    cr_assert_eq(clearenv(), 0);
    expect_env_read();
    cr_assert_eq(setenv("ALTPATCH_OFFX", "1", 1), 0);
    cr_assert_eq(setenv("ALTPATCH_DEBU", "1", 1), 0);
    cr_assert_eq(setenv("ALTPATCH_CLEARCPUI", "avx2", 1), 0);
    cr_assert_eq(setenv("ALTPATCHX_OFF", "1", 1), 0);
    cr_assert_eq(setenv("AL", "1", 1), 0);
    cr_assert_eq(setenv("A", "1", 1), 0);
    expect_env_read();
    cr_assert_eq(setenv("ALTPATCH_DEBUG", "0", 1), 0);
    expect_env_read();
    cr_assert_eq(setenv("ALTPATCH_CLEARCPUID", "fsgsbase,rdpid", 1), 0);
    cr_assert_eq(setenv("ALTPATCH_OFF", "", 1), 0);
    expect_env_read();
    struct ap_env e;
    ap_env_read(&e);
    if (!getauxval(AT_SECURE)) {
        cr_assert_str_eq(e.clearcpuid, "fsgsbase,rdpid");
        cr_assert_str_eq(e.debug, "0");
        cr_assert_str_eq(e.off, "");
        cr_assert_not(ap_env_value_on(e.debug));
        cr_assert_not(ap_env_value_on(e.off));
    }
    cr_assert_eq(setenv("ALTPATCH_OFF", "1", 1), 0);
    expect_env_read();
    cr_assert_eq(unsetenv("ALTPATCH_DEBUG"), 0);
    expect_env_read();
    cr_assert_eq(clearenv(), 0);
}

/*
 * The leaves taken from the C library (when it has them) are exactly what
 * CPUID answers here; the host set does not depend on where they came from.
 */
Test(cpu, libc_leaves_are_the_cpus_answers)
{
    /* leaf, subleaf, and the registers cpu.c reads (a, b, c, d): leaf 1's
     * EAX/EBX name the CPU the thread runs on (signature, APIC id) */
    static const struct {
        uint32_t leaf, sub;
        const char *regs;
    } leaves[] = {{1, 0, "cd"},          {7, 0, "abcd"},        {7, 1, "a"},
                  {0xd, 1, "a"},         {0x80000001u, 0, "cd"}, {0x80000007u, 0, "bd"},
                  {0x80000008u, 0, "b"}};
    /* the reference: CPUID executed here (the compiler's <cpuid.h>) */
    unsigned max, emax, x0, x1, x2;
    __cpuid(0, max, x0, x1, x2);
    __cpuid(0x80000000u, emax, x0, x1, x2);
    for (size_t i = 0; i < sizeof(leaves) / sizeof(leaves[0]); i++) {
        uint32_t l = leaves[i].leaf;
        struct ap_regs g, c;
        __cpuid_count(l, leaves[i].sub, c.a, c.b, c.c, c.d);
        if (!ap_libc_leaf(l, leaves[i].sub, &g)) {
            cr_log_info("leaf %#x.%u: not from the C library", l, leaves[i].sub);
            continue;
        }
        cr_assert_leq(l, l < 0x80000000u ? max : emax, "leaf %#x given above the highest", l);
        const uint32_t gv[4] = {g.a, g.b, g.c, g.d}, cv[4] = {c.a, c.b, c.c, c.d};
        for (const char *r = leaves[i].regs; *r; r++)
            cr_assert_eq(gv[*r - 'a'], cv[*r - 'a'], "leaf %#x.%u e%cx", l, leaves[i].sub, *r);
    }
}

/* After a write where no leaf 7 was read for the features (an apply of a
 * given feature set, records naming no feature of that leaf), the CPU is
 * serialized as leaf 7 says -- learnt once, from the C library's copy where
 * it keeps one -- and not by CPUID, an exit to the hypervisor in a guest at
 * every writing apply. The reference: CPUID executed here. */
Test(cpu, sync_core_learns_leaf_7_without_reading_the_features)
{
    cr_assert_eq(ap_sync_how(), AP_SYNC_UNKNOWN, "nothing read leaf 7 in this process yet");
    ap_sync_core();
    unsigned max, a, b, c, d;
    __cpuid(0, max, b, c, d);
    int want = AP_SYNC_IRET; /* a CPU without leaf 7 */
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        want = (d >> 14) & 1 ? AP_SYNC_SERIALIZE /* EDX[14] SERIALIZE */
               : (c >> 7) & 1 ? AP_SYNC_IRET_UNLESS_SHSTK /* ECX[7] CET_SS */
                              : AP_SYNC_IRET;
    }
    cr_assert_eq(ap_sync_how(), want, "how = %d, leaf 7 says %d", ap_sync_how(), want);
    ap_sync_core(); /* and that sequence runs */
    cr_assert_eq(ap_sync_how(), want);
}

/* ---- the CPUID leaves' lock across fork() and signal handlers ------------- */

static volatile int query_stop;

static void *query_loop(void *arg)
{
    (void)arg;
    while (!query_stop)
        (void)altpatch_cpu_has(X86_FEATURE_AVX2);
    return NULL;
}

/* One thread queries without a pause while another forks: no child may find
 * the leaves' lock held by the querying thread, which it does not have. */
Test(cpu, fork_while_another_thread_queries)
{
    bool want = altpatch_cpu_has(X86_FEATURE_AVX2);
    pthread_t t;
    query_stop = 0;
    cr_assert_eq(pthread_create(&t, NULL, query_loop, NULL), 0);
    int forks = 0, bad = 0, first_status = 0;
    for (int i = 0; i < 400 && !bad; i++) {
        pid_t c = fork();
        if (c == 0) {
            alarm(5); /* a child waiting forever on the lock: killed by SIGALRM */
            if (altpatch_cpu_has(X86_FEATURE_AVX2) != want)
                _exit(2);
            struct altpatch_features *f = altpatch_features_host();
            if (!f || altpatch_features_has(f, X86_FEATURE_AVX2) != want)
                _exit(3);
            altpatch_features_free(f);
            if (altpatch_apply() < 0)
                _exit(4);
            _exit(0);
        }
        cr_assert_gt(c, 0);
        int st;
        cr_assert_eq(waitpid(c, &st, 0), c);
        forks++;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            bad++;
            first_status = st;
        }
    }
    query_stop = 1;
    pthread_join(t, NULL);
    cr_assert_eq(bad, 0, "fork %d: child status %#x (SIGALRM %d: it hung)", forks, first_status,
                 SIGALRM);
}

/* A signal handler that interrupts its own thread's query, at every one of
 * the library's instructions (trap flag), and queries too: it must come
 * back -- with NULL and EDEADLK while the interrupted query holds the lock --
 * and the interrupted query's answer must not change. */
extern const char __executable_start[], etext[];
static volatile sig_atomic_t held_seen, answered_seen, other_err, cpu_step_on;

static void query_on_trap(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = ucv;
    uintptr_t ip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (!cpu_step_on) {
        ap_step_stop(uc);
        return;
    }
    if (ip < (uintptr_t)__executable_start || ip >= (uintptr_t)etext)
        return;
    int saved = errno;
    errno = 0;
    struct altpatch_features *f = altpatch_features_host();
    if (f) {
        answered_seen++;
        altpatch_features_free(f);
    } else if (errno == EDEADLK) {
        held_seen++;
    } else {
        other_err++;
    }
    errno = saved;
}

Test(cpu, query_from_handler_inside_own_query)
{
    bool want = altpatch_cpu_has(X86_FEATURE_AVX2);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = query_on_trap;
    sa.sa_flags = SA_SIGINFO;
    cr_assert_eq(sigaction(SIGTRAP, &sa, NULL), 0);
    alarm(20); /* a handler waiting for its own thread: killed */
    cpu_step_on = 1;
    ap_step_on();
    bool got = altpatch_cpu_has(X86_FEATURE_AVX2);
    cpu_step_on = 0;
    ap_step_off();
    alarm(0);
    cr_assert_eq(got, want);
    cr_assert_eq(other_err, 0);
    cr_assert_gt(held_seen, 0, "no step inside the lock");
    cr_assert_gt(answered_seen, 0, "no step outside the lock");
}
