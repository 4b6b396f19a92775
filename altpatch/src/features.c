/* SPDX-License-Identifier: MIT */
/*
 * features.c -- the feature table and everything that is data about it:
 * which X86_FEATURE_* ids exist and their names, feature sets, the edit
 * language ("+name,-name"), the ALTPATCH_CLEARCPUID list, the vendor rules
 * that derive synthetic bits, and the CPU profiles. Pure: no system calls;
 * the host's own set is probed by cpu.c.
 *
 * One table (ap_feat_table) names every known id; names, "known", the "all"
 * profile and the masking of raw CPUID words all derive from it.
 *
 * Synthetic bits follow the kernel's rules (arch/x86/kernel/cpu/):
 *   - ALWAYS: in every set;
 *   - APIC_MSRS_FENCE: set by common.c identify_cpu() for every vendor, then
 *     cleared by init_amd() and init_hygon(): so set unless the vendor is
 *     AuthenticAMD or HygonGenuine;
 *   - LFENCE_RDTSC: CPUID 0x80000021 EAX bit 2 ("LFENCE always serializing"),
 *     or the vendor rule when SSE2 is present: init_intel() sets it; init_amd()
 *     and init_hygon() set it after making LFENCE dispatch-serializing through
 *     MSR DE_CFG (families without that MSR already serialize on LFENCE);
 *     init_centaur() and init_zhaoxin() set it on 64-bit. Unknown vendors get
 *     only the CPUID bit.
 *   - 3DNOWPREFETCH (PREFETCHW) on AMD/Hygon with LM, as init_amd() does.
 * (CONSTANT_TSC and NONSTOP_TSC come from a CPUID bit: cpu.c.)
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pure.h"

#define AP_FEAT_CPUINFO 1u /* the kernel prints this name in /proc/cpuinfo */

struct ap_feat {
    uint16_t id;
    uint16_t flags;
    const char *name;
};

/*
 * Every known feature, in the order of <altpatch/cpufeatures.h>, the only
 * list: features.inc is generated from it at build time
 * (altpatch/gen_features.cmake) and defines AP_FEATURES(F, H) with one row
 * per feature; names as /proc/cpuinfo prints them, else the lower-case macro
 * name. F: the kernel prints the name in /proc/cpuinfo; H: it does not.
 * Expanded twice: into the table and into the id index.
 */
#include "features.inc"

#define AP_FEAT_ROW_F(x, n) {X86_FEATURE_##x, AP_FEAT_CPUINFO, n},
#define AP_FEAT_ROW_H(x, n) {X86_FEATURE_##x, 0, n},

static const struct ap_feat ap_feat_table[] = {AP_FEATURES(AP_FEAT_ROW_F, AP_FEAT_ROW_H)};

#undef AP_FEAT_ROW_F
#undef AP_FEAT_ROW_H

#define AP_NFEAT (sizeof(ap_feat_table) / sizeof(ap_feat_table[0]))
#define AP_MAX_ID (AP_NCAPWORDS * 32)

/*
 * The ids the table names, as one bitmap word per feature word:
 * features.inc's AP_KNOWN_WORDS, made by the same generator from the same
 * lines as the table (a constant: no walk of the table on a process's first
 * apply; the generator refuses a duplicate id or name). O(1) for the
 * planner, which asks for every entry of every site. The words past
 * AP_KNOWN_NWORDS are zero.
 */
_Static_assert(AP_KNOWN_NWORDS <= AP_NCAPWORDS, "feature words");
static const uint32_t ap_known_words[AP_NCAPWORDS] = {AP_KNOWN_WORDS};

#define AP_VENDOR_UNKNOWN "unknown"

/* ------------------------------------------------------------------------- */
/* Names                                                                     */
/* ------------------------------------------------------------------------- */

static const struct ap_feat *ap_feat_by_id(unsigned id)
{
    if (!ap_feature_known(id))
        return NULL;
    for (size_t i = 0; i < AP_NFEAT; i++)
        if (ap_feat_table[i].id == id)
            return &ap_feat_table[i];
    return NULL;
}

/* Case-insensitive lookup of @p len bytes at @p s. */
static const struct ap_feat *ap_feat_by_name(const char *s, size_t len)
{
    for (size_t i = 0; i < AP_NFEAT; i++) {
        const char *n = ap_feat_table[i].name;
        if (strlen(n) == len && strncasecmp(n, s, len) == 0)
            return &ap_feat_table[i];
    }
    return NULL;
}

/* A list item: a name, or the decimal id of a known feature (as the kernel's clearcpuid=). */
static int ap_feat_lookup_item(const char *s, size_t len)
{
    const struct ap_feat *e = ap_feat_by_name(s, len);
    if (e)
        return e->id;
    if (len == 0 || len > 5)
        return -ENOENT;
    unsigned v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -ENOENT;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    return ap_feature_known(v) ? (int)v : -ENOENT;
}

AP_HOT bool ap_feature_known(unsigned id)
{
    return id < AP_MAX_ID && (ap_known_words[id / 32] >> (id % 32) & 1u);
}

ALTPATCH_API const char *altpatch_feature_name(unsigned feature)
{
    const struct ap_feat *e = ap_feat_by_id(feature);
    return e ? e->name : NULL;
}

ALTPATCH_API int altpatch_feature_id(const char *name)
{
    if (!name)
        return -EINVAL;
    const struct ap_feat *e = ap_feat_by_name(name, strlen(name));
    return e ? e->id : -ENOENT;
}

/* ------------------------------------------------------------------------- */
/* Sets                                                                      */
/* ------------------------------------------------------------------------- */

AP_HOT bool ap_features_test(const struct altpatch_features *f, unsigned id)
{
    if (!f || id >= AP_MAX_ID)
        return false;
    return (f->word[id / 32] >> (id % 32)) & 1u;
}

AP_HOT void ap_bit_set(struct altpatch_features *f, unsigned id)
{
    f->word[id / 32] |= 1u << (id % 32);
}

AP_HOT void ap_bit_clear(struct altpatch_features *f, unsigned id)
{
    f->word[id / 32] &= ~(1u << (id % 32));
}

AP_HOT void ap_set_vendor(struct altpatch_features *f, const char *vendor)
{
    memset(f->vendor, 0, sizeof(f->vendor));
    for (size_t i = 0; i < sizeof(f->vendor) - 1 && vendor[i]; i++)
        f->vendor[i] = vendor[i];
}

void ap_features_init(struct altpatch_features *f)
{
    memset(f, 0, sizeof(*f));
    ap_set_vendor(f, AP_VENDOR_UNKNOWN);
}

/* Keep only the bits the table names. */
AP_HOT void ap_mask_known(struct altpatch_features *f)
{
    for (size_t w = 0; w < AP_NCAPWORDS; w++)
        f->word[w] &= ap_known_words[w];
}

ALTPATCH_API struct altpatch_features *altpatch_features_new(void)
{
    struct altpatch_features *f = malloc(sizeof(*f));
    if (f)
        ap_features_init(f);
    return f;
}

ALTPATCH_API struct altpatch_features *altpatch_features_dup(const struct altpatch_features *f)
{
    if (!f) {
        errno = EINVAL;
        return NULL;
    }
    struct altpatch_features *c = malloc(sizeof(*c));
    if (c)
        memcpy(c, f, sizeof(*c));
    return c;
}

ALTPATCH_API void altpatch_features_free(struct altpatch_features *f)
{
    free(f);
}

ALTPATCH_API int altpatch_features_set(struct altpatch_features *f, unsigned feature)
{
    if (!f || !ap_feature_known(feature))
        return -EINVAL;
    ap_bit_set(f, feature);
    return 0;
}

ALTPATCH_API int altpatch_features_clear(struct altpatch_features *f, unsigned feature)
{
    if (!f || !ap_feature_known(feature))
        return -EINVAL;
    ap_bit_clear(f, feature);
    return 0;
}

ALTPATCH_API bool altpatch_features_has(const struct altpatch_features *f, unsigned feature)
{
    return ap_feature_known(feature) && ap_features_test(f, feature);
}

ALTPATCH_API const char *altpatch_features_vendor(const struct altpatch_features *f)
{
    return f ? f->vendor : NULL;
}

/* Length of the item at @p s: up to the next ',' or the end. */
static size_t ap_item_len(const char *s)
{
    const char *c = strchr(s, ',');
    return c ? (size_t)(c - s) : strlen(s);
}

/* Trim blanks around [*s, *s + *len). */
static void ap_trim(const char **s, size_t *len)
{
    while (*len && (**s == ' ' || **s == '\t')) {
        (*s)++;
        (*len)--;
    }
    while (*len && ((*s)[*len - 1] == ' ' || (*s)[*len - 1] == '\t'))
        (*len)--;
}

/* Apply one edit item ("name", "+name", "-name") to @p f. */
static int ap_edit_item(struct altpatch_features *f, const char *s, size_t len)
{
    bool add = true;
    ap_trim(&s, &len);
    if (len && (*s == '+' || *s == '-')) {
        add = *s == '+';
        s++;
        len--;
        ap_trim(&s, &len);
    }
    if (len == 0)
        return -EINVAL;
    int id = ap_feat_lookup_item(s, len);
    if (id < 0)
        return id;
    if (add)
        ap_bit_set(f, (unsigned)id);
    else
        ap_bit_clear(f, (unsigned)id);
    return 0;
}

ALTPATCH_API int altpatch_features_edit(struct altpatch_features *f, const char *edits)
{
    if (!f || !edits)
        return -EINVAL;
    if (*edits == '\0')
        return 0;
    struct altpatch_features tmp = *f;
    for (const char *s = edits;;) {
        size_t len = ap_item_len(s);
        int err = ap_edit_item(&tmp, s, len);
        if (err)
            return err;
        if (s[len] == '\0')
            break;
        s += len + 1;
    }
    *f = tmp;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Synthetic bits (vendor rules, see the comment at the top)                 */
/* ------------------------------------------------------------------------- */

/*
 * Every vendor string CPUID leaf 0 gives is 12 characters: equal when the 12
 * and the terminator match (as strcmp() would say), compared as three words
 * (fixed-size copies the compiler makes inline: no call into the C library).
 */
_Static_assert(sizeof(((struct altpatch_features *)0)->vendor) >= 13, "vendor holds 12 + NUL");

static bool ap_vendor_is(const struct altpatch_features *f, const char v[13])
{
    uint64_t a8, b8;
    uint32_t a4, b4;

    memcpy(&a8, f->vendor, 8);
    memcpy(&b8, v, 8);
    memcpy(&a4, f->vendor + 8, 4);
    memcpy(&b4, v + 8, 4);
    return a8 == b8 && a4 == b4 && f->vendor[12] == v[12];
}

static bool ap_vendor_amd_like(const struct altpatch_features *f)
{
    return ap_vendor_is(f, "AuthenticAMD") || ap_vendor_is(f, "HygonGenuine");
}

static bool ap_vendor_lfence_rule(const struct altpatch_features *f)
{
    static const char v[][13] = {"GenuineIntel", "AuthenticAMD", "HygonGenuine",
                                 "CentaurHauls", "  Shanghai  "};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        if (ap_vendor_is(f, v[i]))
            return true;
    return false;
}

/* Derive ALWAYS, APIC_MSRS_FENCE, LFENCE_RDTSC, 3DNOWPREFETCH from vendor and CPUID bits. */
AP_HOT void ap_derive_synthetic(struct altpatch_features *f)
{
    ap_bit_set(f, X86_FEATURE_ALWAYS);
    if (ap_vendor_amd_like(f))
        ap_bit_clear(f, X86_FEATURE_APIC_MSRS_FENCE);
    else
        ap_bit_set(f, X86_FEATURE_APIC_MSRS_FENCE);
    if (ap_vendor_lfence_rule(f) && ap_features_test(f, X86_FEATURE_XMM2))
        ap_bit_set(f, X86_FEATURE_LFENCE_RDTSC);
    if (ap_vendor_amd_like(f) && ap_features_test(f, X86_FEATURE_LM))
        ap_bit_set(f, X86_FEATURE_3DNOWPREFETCH);
}

/* ------------------------------------------------------------------------- */
/* ALTPATCH_CLEARCPUID                                                       */
/* ------------------------------------------------------------------------- */

/* Clear each listed name (never ALWAYS); warn about unknown ones and ALWAYS when @p warn. */
int ap_clear_names(struct altpatch_features *f, const char *list, bool warn)
{
    int n = 0;
    for (const char *s = list; s && *s;) {
        size_t len = ap_item_len(s);
        const char *item = s;
        size_t ilen = len;
        ap_trim(&item, &ilen);
        if (ilen) {
            int id = ap_feat_lookup_item(item, ilen);
            if (id == X86_FEATURE_ALWAYS) {
                /* ALWAYS is in every set: an ALT_NOT(ALWAYS) site is never patched. */
                if (warn)
                    ap_log(ALTPATCH_WARN,
                           "ALTPATCH_CLEARCPUID: '%.*s' cannot be cleared (ALWAYS is in every "
                           "feature set), ignored\n",
                           (int)ilen, item);
            } else if (id >= 0) {
                ap_bit_clear(f, (unsigned)id);
                n++;
            } else if (warn) {
                ap_log(ALTPATCH_WARN, "ALTPATCH_CLEARCPUID: unknown feature '%.*s' ignored\n",
                       (int)ilen, item);
            }
        }
        s += len;
        if (*s == ',')
            s++;
    }
    return n;
}

int ap_clearcpuid(struct altpatch_features *f, const char *list)
{
    if (!f)
        return 0;
    return ap_clear_names(f, list, true);
}

/* ------------------------------------------------------------------------- */
/* The kernel's own flags (/proc/cpuinfo text)                               */
/* ------------------------------------------------------------------------- */

const char *ap_cpuinfo_flags(const char *text, size_t len, size_t *n)
{
    static const char key[] = "flags";
    for (size_t at = 0; at + sizeof(key) - 1 <= len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        if (!nl)
            return NULL; /* this line is not whole */
        size_t end = (size_t)(nl - text);
        if (memcmp(text + at, key, sizeof(key) - 1) == 0) {
            size_t i = at + sizeof(key) - 1;
            while (i < end && (text[i] == ' ' || text[i] == '\t'))
                i++;
            if (i < end && text[i] == ':') {
                *n = end - (i + 1);
                return text + i + 1;
            }
        }
        at = end + 1;
    }
    return NULL;
}

bool ap_cpuinfo_lists(const char *text, size_t len, const char *name)
{
    size_t n = 0, k = strlen(name);
    const char *f = ap_cpuinfo_flags(text, len, &n);
    for (size_t i = 0; f && k && i + k <= n; i++)
        if ((i == 0 || f[i - 1] == ' ') && memcmp(f + i, name, k) == 0 &&
            (i + k == n || f[i + k] == ' '))
            return true;
    return false;
}

/* ------------------------------------------------------------------------- */
/* Profiles                                                                  */
/* ------------------------------------------------------------------------- */

#define X(f) X86_FEATURE_##f

/* x86-64 baseline (psABI level v1): nothing optional. */
static const uint16_t ap_prof_baseline[] = {
    X(FPU), X(TSC), X(CX8), X(CMOV), X(CLFLUSH), X(MMX), X(FXSR), X(XMM), X(XMM2),
    X(SYSCALL), X(NX), X(LM),
};

/* Common x86 base of the two server profiles. */
#define AP_PROF_COMMON                                                                    \
    X(FPU), X(VME), X(DE), X(PSE), X(TSC), X(MSR), X(PAE), X(MCE), X(CX8), X(APIC),        \
    X(SEP), X(MTRR), X(PGE), X(MCA), X(CMOV), X(PAT), X(PSE36), X(CLFLUSH), X(MMX),        \
    X(FXSR), X(XMM), X(XMM2), X(HT), X(SYSCALL), X(NX), X(GBPAGES), X(RDTSCP), X(LM),      \
    X(CONSTANT_TSC), X(NONSTOP_TSC), X(XMM3), X(PCLMULQDQ), X(MWAIT), X(SSSE3), X(FMA),    \
    X(CX16), X(PCID), X(XMM4_1), X(XMM4_2), X(X2APIC), X(MOVBE), X(POPCNT), X(AES),        \
    X(XSAVE), X(OSXSAVE), X(AVX), X(F16C), X(RDRAND), X(LAHF_LM), X(ABM),                  \
    X(3DNOWPREFETCH), X(FSGSBASE), X(BMI1), X(AVX2), X(SMEP), X(BMI2), X(ERMS),            \
    X(INVPCID), X(AVX512F), X(AVX512DQ), X(RDSEED), X(ADX), X(SMAP), X(AVX512IFMA),        \
    X(CLFLUSHOPT), X(CLWB), X(AVX512CD), X(SHA_NI), X(AVX512BW), X(AVX512VL),              \
    X(XSAVEOPT), X(XSAVEC), X(XGETBV1), X(XSAVES), X(AVX512_BF16), X(WBNOINVD),            \
    X(AVX512VBMI), X(UMIP), X(PKU), X(OSPKE), X(AVX512_VBMI2), X(GFNI), X(VAES),           \
    X(VPCLMULQDQ), X(AVX512_VNNI), X(AVX512_BITALG), X(AVX512_VPOPCNTDQ), X(LA57),         \
    X(RDPID), X(FSRM)

/* AMD EPYC 9004 "Genoa" (Zen 4), as its /proc/cpuinfo lists; no SERIALIZE, MOVDIR64B, AVX-VNNI. */
static const uint16_t ap_prof_zen4[] = {
    AP_PROF_COMMON,
    X(MMXEXT), X(FXSR_OPT), X(CMP_LEGACY), X(SVM), X(EXTAPIC), X(CR8_LEGACY), X(SSE4A),
    X(MISALIGNSSE), X(OSVW), X(IBS), X(SKINIT), X(WDT), X(TCE), X(TOPOEXT),
    X(PERFCTR_CORE), X(PERFCTR_NB), X(PERFCTR_LLC), X(MWAITX), X(CLZERO), X(IRPERF),
    X(XSAVEERPTR), X(RDPRU), X(OVERFLOW_RECOV), X(SUCCOR), X(SMCA), X(NO_NESTED_DATA_BP),
    X(LFENCE_RDTSC), X(NULL_SEL_CLR_BASE), X(AUTOIBRS),
};

/* Intel Xeon 4th gen "Sapphire Rapids". */
static const uint16_t ap_prof_spr[] = {
    AP_PROF_COMMON,
    X(VMX), X(SMX), X(TSC_DEADLINE_TIMER), X(TSC_ADJUST), X(INTEL_PT), X(XFD), X(AVX_VNNI),
    X(FZRM), X(FSRS), X(FSRC), X(WAITPKG), X(SHSTK), X(TME), X(BUS_LOCK_DETECT),
    X(CLDEMOTE), X(MOVDIRI), X(MOVDIR64B), X(ENQCMD), X(MD_CLEAR), X(SERIALIZE),
    X(TSXLDTRK), X(PCONFIG), X(ARCH_LBR), X(IBT), X(AMX_BF16), X(AVX512_FP16),
    X(AMX_TILE), X(AMX_INT8),
};

#undef X
#undef AP_PROF_COMMON

struct ap_profile {
    const char *name;
    const char *vendor;
    const uint16_t *ids; /* NULL: special (host, all) */
    size_t n;
};

#define AP_PROFILE(name, vendor, arr) { name, vendor, arr, sizeof(arr) / sizeof((arr)[0]) }

static const struct ap_profile ap_profiles[] = {
    { "host", NULL, NULL, 0 },
    AP_PROFILE("baseline", AP_VENDOR_UNKNOWN, ap_prof_baseline),
    AP_PROFILE("amd-zen4", "AuthenticAMD", ap_prof_zen4),
    AP_PROFILE("intel-spr", "GenuineIntel", ap_prof_spr),
    { "all", AP_VENDOR_UNKNOWN, NULL, 0 },
};

#define AP_NPROFILES (sizeof(ap_profiles) / sizeof(ap_profiles[0]))

static const char *const ap_profile_names[AP_NPROFILES + 1] = {
    "host", "baseline", "amd-zen4", "intel-spr", "all", NULL,
};

_Static_assert(AP_NPROFILES == 5, "keep ap_profile_names in step with ap_profiles");

ALTPATCH_API const char *const *altpatch_features_profiles(void)
{
    return ap_profile_names;
}

/* Fill @p f for profile @p p (not "host"). */
static void ap_profile_fill_one(const struct ap_profile *p, struct altpatch_features *f)
{
    ap_features_init(f);
    ap_set_vendor(f, p->vendor);
    if (!p->ids) {
        for (size_t i = 0; i < AP_NFEAT; i++)
            ap_bit_set(f, ap_feat_table[i].id);
        return;
    }
    for (size_t i = 0; i < p->n; i++)
        ap_bit_set(f, p->ids[i]);
    ap_derive_synthetic(f);
}

int ap_profile_fill(const char *name, struct altpatch_features *f)
{
    for (size_t i = 0; i < AP_NPROFILES; i++) {
        const struct ap_profile *p = &ap_profiles[i];
        if (strcasecmp(p->name, name) != 0)
            continue;
        if (!p->vendor)
            return AP_PROFILE_HOST;
        ap_profile_fill_one(p, f);
        return 0;
    }
    return -ENOENT;
}
