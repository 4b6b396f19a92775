/* SPDX-License-Identifier: MIT */
/*
 * cpu.c -- the CPU model: which X86_FEATURE_* ids this process may use.
 *
 * One table (ap_feat_table) names every known id; names, "known", the "all"
 * profile and the masking of raw CPUID words all derive from it.
 *
 * Host detection reads CPUID into the kernel's words (see cpufeatures.h),
 * keeps only known bits, then removes what the process cannot use:
 *   - FSGSBASE unless the kernel enabled it (AT_HWCAP2 & HWCAP2_FSGSBASE);
 *     without it RDGSBASE raises SIGILL (old kernels, nofsgsbase, valgrind);
 *   - the XSAVE family unless OSXSAVE (CR4.OSXSAVE, mirrored in CPUID);
 *   - the AVX family unless XCR0 enables SSE and YMM state; AVX-512 unless
 *     it also enables opmask, ZMM_Hi256 and Hi16_ZMM; AMX unless XCR0 enables
 *     XTILECFG and XTILEDATA *and* the process holds the XTILEDATA permission
 *     (arch_prctl(ARCH_REQ_XCOMP_PERM) must come before the first query);
 *   - PKU unless OSPKE (CR4.PKE); SHSTK unless the shadow stack is enabled
 *     (arch_prctl(ARCH_SHSTK_STATUS), as seen by the detecting thread);
 *   - RDTSCP unless the instruction executes in this process, RDPID unless it
 *     executes and returns the CPU number sched_getcpu() reports (probed under
 *     a SIGILL guard, only when CPUID claims them: emulators such as valgrind
 *     claim RDTSCP without running it, and Linux maintains TSC_AUX only where
 *     it enumerates RDTSCP or RDPID).
 * System features (vmx, monitor, xsaves, ...) keep their CPUID meaning.
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
 *   - CONSTANT_TSC and NONSTOP_TSC: CPUID 0x80000007 EDX bit 8 (invariant
 *     TSC), as early_init_amd() / early_init_intel() do;
 *   - 3DNOWPREFETCH (PREFETCHW) on AMD/Hygon with LM, as init_amd() does.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "internal.h"

#ifndef HWCAP2_FSGSBASE
#define HWCAP2_FSGSBASE (1u << 1)
#endif
#ifndef ARCH_GET_XCOMP_PERM
#define ARCH_GET_XCOMP_PERM 0x1022
#endif
#ifndef ARCH_SHSTK_STATUS
#define ARCH_SHSTK_STATUS 0x5005
#endif
#define AP_ARCH_SHSTK_SHSTK 1ul /* ARCH_SHSTK_SHSTK: shadow stack enabled */

/* XCR0 state components. */
#define AP_XCR0_SSE (1ull << 1)
#define AP_XCR0_YMM (1ull << 2)
#define AP_XCR0_AVX512 ((1ull << 5) | (1ull << 6) | (1ull << 7)) /* opmask, ZMM_Hi256, Hi16_ZMM */
#define AP_XCR0_AMX ((1ull << 17) | (1ull << 18))                /* XTILECFG, XTILEDATA */
#define AP_XFEATURE_XTILEDATA 18

#define AP_FEAT_CPUINFO 1u /* the kernel prints this name in /proc/cpuinfo */

struct ap_feat {
    uint16_t id;
    uint16_t flags;
    const char *name;
};

/*
 * Every known feature, sorted by id; names as /proc/cpuinfo prints them, else
 * the lower-case macro name. F: the kernel prints the name in /proc/cpuinfo;
 * H: it does not. Expanded twice: into the table and into the id index.
 */
#define AP_FEATURES(F, H)                         \
    F(FPU, "fpu")                                 \
    F(VME, "vme")                                 \
    F(DE, "de")                                   \
    F(PSE, "pse")                                 \
    F(TSC, "tsc")                                 \
    F(MSR, "msr")                                 \
    F(PAE, "pae")                                 \
    F(MCE, "mce")                                 \
    F(CX8, "cx8")                                 \
    F(APIC, "apic")                               \
    F(SEP, "sep")                                 \
    F(MTRR, "mtrr")                               \
    F(PGE, "pge")                                 \
    F(MCA, "mca")                                 \
    F(CMOV, "cmov")                               \
    F(PAT, "pat")                                 \
    F(PSE36, "pse36")                             \
    F(CLFLUSH, "clflush")                         \
    F(MMX, "mmx")                                 \
    F(FXSR, "fxsr")                               \
    F(XMM, "sse")                                 \
    F(XMM2, "sse2")                               \
    F(HT, "ht")                                   \
    F(SYSCALL, "syscall")                         \
    F(NX, "nx")                                   \
    F(MMXEXT, "mmxext")                           \
    F(FXSR_OPT, "fxsr_opt")                       \
    F(GBPAGES, "pdpe1gb")                         \
    F(RDTSCP, "rdtscp")                           \
    F(LM, "lm")                                   \
    F(3DNOWEXT, "3dnowext")                       \
    F(3DNOW, "3dnow")                             \
    F(CONSTANT_TSC, "constant_tsc")               \
    H(ALWAYS, "always")                           \
    F(NONSTOP_TSC, "nonstop_tsc")                 \
    F(XMM3, "pni")                                \
    F(PCLMULQDQ, "pclmulqdq")                     \
    F(MWAIT, "monitor")                           \
    F(VMX, "vmx")                                 \
    F(SMX, "smx")                                 \
    F(SSSE3, "ssse3")                             \
    F(FMA, "fma")                                 \
    F(CX16, "cx16")                               \
    F(PCID, "pcid")                               \
    F(XMM4_1, "sse4_1")                           \
    F(XMM4_2, "sse4_2")                           \
    F(X2APIC, "x2apic")                           \
    F(MOVBE, "movbe")                             \
    F(POPCNT, "popcnt")                           \
    F(TSC_DEADLINE_TIMER, "tsc_deadline_timer")   \
    F(AES, "aes")                                 \
    F(XSAVE, "xsave")                             \
    H(OSXSAVE, "osxsave")                         \
    F(AVX, "avx")                                 \
    F(F16C, "f16c")                               \
    F(RDRAND, "rdrand")                           \
    F(HYPERVISOR, "hypervisor")                   \
    F(LAHF_LM, "lahf_lm")                         \
    F(CMP_LEGACY, "cmp_legacy")                   \
    F(SVM, "svm")                                 \
    F(EXTAPIC, "extapic")                         \
    F(CR8_LEGACY, "cr8_legacy")                   \
    F(ABM, "abm")                                 \
    F(SSE4A, "sse4a")                             \
    F(MISALIGNSSE, "misalignsse")                 \
    F(3DNOWPREFETCH, "3dnowprefetch")             \
    F(OSVW, "osvw")                               \
    F(IBS, "ibs")                                 \
    F(XOP, "xop")                                 \
    F(SKINIT, "skinit")                           \
    F(WDT, "wdt")                                 \
    F(LWP, "lwp")                                 \
    F(FMA4, "fma4")                               \
    F(TCE, "tce")                                 \
    F(TBM, "tbm")                                 \
    F(TOPOEXT, "topoext")                         \
    F(PERFCTR_CORE, "perfctr_core")               \
    F(PERFCTR_NB, "perfctr_nb")                   \
    F(PERFCTR_LLC, "perfctr_llc")                 \
    F(MWAITX, "mwaitx")                           \
    F(FSGSBASE, "fsgsbase")                       \
    F(TSC_ADJUST, "tsc_adjust")                   \
    F(SGX, "sgx")                                 \
    F(BMI1, "bmi1")                               \
    F(HLE, "hle")                                 \
    F(AVX2, "avx2")                               \
    F(SMEP, "smep")                               \
    F(BMI2, "bmi2")                               \
    F(ERMS, "erms")                               \
    F(INVPCID, "invpcid")                         \
    F(RTM, "rtm")                                 \
    F(MPX, "mpx")                                 \
    F(AVX512F, "avx512f")                         \
    F(AVX512DQ, "avx512dq")                       \
    F(RDSEED, "rdseed")                           \
    F(ADX, "adx")                                 \
    F(SMAP, "smap")                               \
    F(AVX512IFMA, "avx512ifma")                   \
    F(CLFLUSHOPT, "clflushopt")                   \
    F(CLWB, "clwb")                               \
    F(INTEL_PT, "intel_pt")                       \
    F(AVX512PF, "avx512pf")                       \
    F(AVX512ER, "avx512er")                       \
    F(AVX512CD, "avx512cd")                       \
    F(SHA_NI, "sha_ni")                           \
    F(AVX512BW, "avx512bw")                       \
    F(AVX512VL, "avx512vl")                       \
    F(XSAVEOPT, "xsaveopt")                       \
    F(XSAVEC, "xsavec")                           \
    F(XGETBV1, "xgetbv1")                         \
    F(XSAVES, "xsaves")                           \
    H(XFD, "xfd")                                 \
    H(APIC_MSRS_FENCE, "apic_msrs_fence")         \
    H(SHA512, "sha512")                           \
    H(SM3, "sm3")                                 \
    H(SM4, "sm4")                                 \
    F(AVX_VNNI, "avx_vnni")                       \
    F(AVX512_BF16, "avx512_bf16")                 \
    H(CMPCCXADD, "cmpccxadd")                     \
    H(FZRM, "fzrm")                               \
    H(FSRS, "fsrs")                               \
    H(FSRC, "fsrc")                               \
    H(AMX_FP16, "amx_fp16")                       \
    H(AVX_IFMA, "avx_ifma")                       \
    F(CLZERO, "clzero")                           \
    F(IRPERF, "irperf")                           \
    F(XSAVEERPTR, "xsaveerptr")                   \
    F(RDPRU, "rdpru")                             \
    F(WBNOINVD, "wbnoinvd")                       \
    F(AVX512VBMI, "avx512vbmi")                   \
    F(UMIP, "umip")                               \
    F(PKU, "pku")                                 \
    F(OSPKE, "ospke")                             \
    F(WAITPKG, "waitpkg")                         \
    F(AVX512_VBMI2, "avx512_vbmi2")               \
    H(SHSTK, "shstk")                             \
    F(GFNI, "gfni")                               \
    F(VAES, "vaes")                               \
    F(VPCLMULQDQ, "vpclmulqdq")                   \
    F(AVX512_VNNI, "avx512_vnni")                 \
    F(AVX512_BITALG, "avx512_bitalg")             \
    F(TME, "tme")                                 \
    F(AVX512_VPOPCNTDQ, "avx512_vpopcntdq")       \
    F(LA57, "la57")                               \
    F(RDPID, "rdpid")                             \
    F(BUS_LOCK_DETECT, "bus_lock_detect")         \
    F(CLDEMOTE, "cldemote")                       \
    F(MOVDIRI, "movdiri")                         \
    F(MOVDIR64B, "movdir64b")                     \
    F(ENQCMD, "enqcmd")                           \
    F(OVERFLOW_RECOV, "overflow_recov")           \
    F(SUCCOR, "succor")                           \
    F(SMCA, "smca")                               \
    F(AVX512_4VNNIW, "avx512_4vnniw")             \
    F(AVX512_4FMAPS, "avx512_4fmaps")             \
    F(FSRM, "fsrm")                               \
    F(AVX512_VP2INTERSECT, "avx512_vp2intersect") \
    F(MD_CLEAR, "md_clear")                       \
    F(SERIALIZE, "serialize")                     \
    H(HYBRID_CPU, "hybrid_cpu")                   \
    F(TSXLDTRK, "tsxldtrk")                       \
    F(PCONFIG, "pconfig")                         \
    F(ARCH_LBR, "arch_lbr")                       \
    F(IBT, "ibt")                                 \
    F(AMX_BF16, "amx_bf16")                       \
    F(AVX512_FP16, "avx512_fp16")                 \
    F(AMX_TILE, "amx_tile")                       \
    F(AMX_INT8, "amx_int8")                       \
    H(NO_NESTED_DATA_BP, "no_nested_data_bp")     \
    H(LFENCE_RDTSC, "lfence_rdtsc")               \
    H(NULL_SEL_CLR_BASE, "null_sel_clr_base")     \
    H(AUTOIBRS, "autoibrs")

#define AP_FEAT_ROW_F(x, n) {X86_FEATURE_##x, AP_FEAT_CPUINFO, n},
#define AP_FEAT_ROW_H(x, n) {X86_FEATURE_##x, 0, n},
#define AP_KNOWN(x, n) [X86_FEATURE_##x] = true,

static const struct ap_feat ap_feat_table[] = {AP_FEATURES(AP_FEAT_ROW_F, AP_FEAT_ROW_H)};

#define AP_NFEAT (sizeof(ap_feat_table) / sizeof(ap_feat_table[0]))
#define AP_MAX_ID (AP_NCAPWORDS * 32)

/* ap_feat_known_tab[id]: id is in the table. O(1) for the planner, which asks
 * for every entry of every site. A duplicate id fails to compile
 * (-Woverride-init / -Winitializer-overrides under -Werror). */
static const bool ap_feat_known_tab[AP_MAX_ID] = {AP_FEATURES(AP_KNOWN, AP_KNOWN)};

#undef AP_FEAT_ROW_F
#undef AP_FEAT_ROW_H
#undef AP_KNOWN

#define AP_VENDOR_UNKNOWN "unknown"

/* ------------------------------------------------------------------------- */
/* Names                                                                     */
/* ------------------------------------------------------------------------- */

static const struct ap_feat *ap_feat_by_id(unsigned id)
{
    if (id >= AP_MAX_ID || !ap_feat_known_tab[id])
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

bool ap_feature_known(unsigned id)
{
    return id < AP_MAX_ID && ap_feat_known_tab[id];
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

bool ap_features_test(const struct altpatch_features *f, unsigned id)
{
    if (!f || id >= AP_MAX_ID)
        return false;
    return (f->word[id / 32] >> (id % 32)) & 1u;
}

static void ap_bit_set(struct altpatch_features *f, unsigned id)
{
    f->word[id / 32] |= 1u << (id % 32);
}

static void ap_bit_clear(struct altpatch_features *f, unsigned id)
{
    f->word[id / 32] &= ~(1u << (id % 32));
}

static void ap_set_vendor(struct altpatch_features *f, const char *vendor)
{
    memset(f->vendor, 0, sizeof(f->vendor));
    strncpy(f->vendor, vendor, sizeof(f->vendor) - 1);
}

static void ap_features_init(struct altpatch_features *f)
{
    memset(f, 0, sizeof(*f));
    ap_set_vendor(f, AP_VENDOR_UNKNOWN);
}

/* Keep only the bits the table names. */
static void ap_mask_known(struct altpatch_features *f)
{
    struct altpatch_features m;
    memset(m.word, 0, sizeof(m.word));
    for (size_t i = 0; i < AP_NFEAT; i++)
        if (ap_features_test(f, ap_feat_table[i].id))
            ap_bit_set(&m, ap_feat_table[i].id);
    memcpy(f->word, m.word, sizeof(m.word));
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

static bool ap_vendor_is(const struct altpatch_features *f, const char *v)
{
    return strcmp(f->vendor, v) == 0;
}

static bool ap_vendor_amd_like(const struct altpatch_features *f)
{
    return ap_vendor_is(f, "AuthenticAMD") || ap_vendor_is(f, "HygonGenuine");
}

static bool ap_vendor_lfence_rule(const struct altpatch_features *f)
{
    static const char *const v[] = {"GenuineIntel", "AuthenticAMD", "HygonGenuine",
                                    "CentaurHauls", "  Shanghai  "};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        if (ap_vendor_is(f, v[i]))
            return true;
    return false;
}

/* Derive ALWAYS, APIC_MSRS_FENCE, LFENCE_RDTSC, 3DNOWPREFETCH from vendor and CPUID bits. */
static void ap_derive_synthetic(struct altpatch_features *f)
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
/* Host detection                                                            */
/* ------------------------------------------------------------------------- */

struct ap_regs {
    uint32_t a, b, c, d;
};

static struct ap_regs ap_cpuid(uint32_t leaf, uint32_t sub)
{
    struct ap_regs r;
    __asm__ volatile("cpuid" : "=a"(r.a), "=b"(r.b), "=c"(r.c), "=d"(r.d) : "a"(leaf), "c"(sub));
    return r;
}

void ap_sync_core(void)
{
    uint32_t a = 0, b, c = 0, d;
    __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d) : : "memory");
}

static uint64_t ap_xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Standard leaves 0, 1, 7.0, 7.1, 0xd.1 into words 0, 4, 9, 16, 18, 12, 10. */
static void ap_read_std_leaves(struct altpatch_features *f)
{
    struct ap_regs r = ap_cpuid(0, 0);
    uint32_t max = r.a;
    char v[13];
    memcpy(v, &r.b, 4);
    memcpy(v + 4, &r.d, 4);
    memcpy(v + 8, &r.c, 4);
    v[12] = '\0';
    ap_set_vendor(f, v);
    if (max >= 1) {
        r = ap_cpuid(1, 0);
        f->word[0] = r.d;
        f->word[4] = r.c;
    }
    if (max >= 7) {
        r = ap_cpuid(7, 0);
        uint32_t maxsub = r.a;
        f->word[9] = r.b;
        f->word[16] = r.c;
        f->word[18] = r.d;
        if (maxsub >= 1)
            f->word[12] = ap_cpuid(7, 1).a;
    }
    if (max >= 0xd)
        f->word[10] = ap_cpuid(0xd, 1).a;
}

/* Extended leaves 0x80000001/7/8/0x21 into words 1, 6, 17, 13, 20 (+ TSC bits of word 3). */
static void ap_read_ext_leaves(struct altpatch_features *f)
{
    uint32_t max = ap_cpuid(0x80000000u, 0).a;
    if ((max & 0xffff0000u) != 0x80000000u)
        return;
    if (max >= 0x80000001u) {
        struct ap_regs r = ap_cpuid(0x80000001u, 0);
        f->word[1] = r.d;
        f->word[6] = r.c;
    }
    if (max >= 0x80000007u) {
        struct ap_regs r = ap_cpuid(0x80000007u, 0);
        f->word[17] = r.b;
        if (r.d & (1u << 8)) { /* invariant TSC */
            ap_bit_set(f, X86_FEATURE_CONSTANT_TSC);
            ap_bit_set(f, X86_FEATURE_NONSTOP_TSC);
        }
    }
    if (max >= 0x80000008u)
        f->word[13] = ap_cpuid(0x80000008u, 0).b;
    if (max >= 0x80000021u)
        f->word[20] = ap_cpuid(0x80000021u, 0).a;
}

static const uint16_t ap_xsave_family[] = {
    X86_FEATURE_XSAVE, X86_FEATURE_XSAVEOPT, X86_FEATURE_XSAVEC, X86_FEATURE_XGETBV1,
    X86_FEATURE_XSAVES, X86_FEATURE_XFD,
};

/* Need XCR0 SSE|YMM. */
static const uint16_t ap_avx_family[] = {
    X86_FEATURE_AVX,    X86_FEATURE_AVX2,     X86_FEATURE_FMA,        X86_FEATURE_F16C,
    X86_FEATURE_FMA4,   X86_FEATURE_XOP,      X86_FEATURE_VAES,       X86_FEATURE_VPCLMULQDQ,
    X86_FEATURE_AVX_VNNI, X86_FEATURE_AVX_IFMA, X86_FEATURE_SHA512,   X86_FEATURE_SM3,
    X86_FEATURE_SM4,
};

/* Need XCR0 SSE|YMM|opmask|ZMM_Hi256|Hi16_ZMM. */
static const uint16_t ap_avx512_family[] = {
    X86_FEATURE_AVX512F,       X86_FEATURE_AVX512DQ,         X86_FEATURE_AVX512IFMA,
    X86_FEATURE_AVX512PF,      X86_FEATURE_AVX512ER,         X86_FEATURE_AVX512CD,
    X86_FEATURE_AVX512BW,      X86_FEATURE_AVX512VL,         X86_FEATURE_AVX512VBMI,
    X86_FEATURE_AVX512_VBMI2,  X86_FEATURE_AVX512_VNNI,      X86_FEATURE_AVX512_BITALG,
    X86_FEATURE_AVX512_VPOPCNTDQ, X86_FEATURE_AVX512_4VNNIW, X86_FEATURE_AVX512_4FMAPS,
    X86_FEATURE_AVX512_VP2INTERSECT, X86_FEATURE_AVX512_BF16, X86_FEATURE_AVX512_FP16,
};

/* Need XCR0 XTILECFG|XTILEDATA and the XTILEDATA permission. */
static const uint16_t ap_amx_family[] = {
    X86_FEATURE_AMX_TILE, X86_FEATURE_AMX_INT8, X86_FEATURE_AMX_BF16, X86_FEATURE_AMX_FP16,
};

static void ap_clear_list(struct altpatch_features *f, const uint16_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ap_bit_clear(f, ids[i]);
}

#define AP_CLEAR_ALL(f, arr) ap_clear_list((f), (arr), sizeof(arr) / sizeof((arr)[0]))

static bool ap_amx_permitted(void)
{
    unsigned long perm = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) != 0)
        return false;
    return (perm >> AP_XFEATURE_XTILEDATA) & 1u;
}

static bool ap_shstk_enabled(void)
{
    unsigned long st = 0;
    if (syscall(SYS_arch_prctl, ARCH_SHSTK_STATUS, &st) != 0)
        return false;
    return st & AP_ARCH_SHSTK_SHSTK;
}

/* Remove what CPUID reports but the OS does not let this process use. */
static void ap_apply_os_enablement(struct altpatch_features *f)
{
    if (!(getauxval(AT_HWCAP2) & HWCAP2_FSGSBASE))
        ap_bit_clear(f, X86_FEATURE_FSGSBASE);
    uint64_t xcr0 = 0;
    if (ap_features_test(f, X86_FEATURE_OSXSAVE))
        xcr0 = ap_xgetbv0();
    else
        AP_CLEAR_ALL(f, ap_xsave_family);
    uint64_t ymm = AP_XCR0_SSE | AP_XCR0_YMM;
    if ((xcr0 & ymm) != ymm)
        AP_CLEAR_ALL(f, ap_avx_family);
    if ((xcr0 & (ymm | AP_XCR0_AVX512)) != (ymm | AP_XCR0_AVX512))
        AP_CLEAR_ALL(f, ap_avx512_family);
    if ((xcr0 & AP_XCR0_AMX) != AP_XCR0_AMX || !ap_amx_permitted())
        AP_CLEAR_ALL(f, ap_amx_family);
    if (!ap_features_test(f, X86_FEATURE_OSPKE))
        ap_bit_clear(f, X86_FEATURE_PKU); /* RDPKRU/WRPKRU need CR4.PKE */
    if (!ap_shstk_enabled())
        ap_bit_clear(f, X86_FEATURE_SHSTK);
}

/*
 * Instructions whose CPUID bit is not enough: valgrind's synthetic CPUID
 * claims RDTSCP on machines where its translator raises SIGILL for it, and
 * RDPID is only worth its name where Linux keeps TSC_AUX equal to this CPU's
 * number. Each is executed once under a SIGILL guard when the host set is
 * detected, and only when CPUID claims it (no CPUID exit, three system calls).
 * The guard is a process-wide SIGILL action held for the few instructions of
 * the probe; a SIGILL elsewhere meanwhile is handed back to the previous
 * action (the faulting instruction runs again under it).
 */
static const void *volatile ap_probe_at;     /* the probed instruction */
static const void *volatile ap_probe_resume; /* the instruction after it */
static volatile sig_atomic_t ap_probe_ill;
static struct sigaction ap_probe_prev;

static void ap_probe_sigill(int sig, siginfo_t *si, void *ucv)
{
    ucontext_t *uc = ucv;
    const void *rip = (const void *)(uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (si->si_code > 0 && ap_probe_at && rip == ap_probe_at) {
        ap_probe_ill = 1;
        uc->uc_mcontext.gregs[REG_RIP] = (greg_t)(uintptr_t)ap_probe_resume;
        return;
    }
    sigaction(SIGILL, &ap_probe_prev, NULL);
    if (si->si_code <= 0)
        raise(sig); /* sent, not raised by an instruction: deliver it after we return */
}

/* The two probe sequences: record the instruction's address and the resume
 * address, then run it. */
#define AP_PROBE_ASM_(insn)                                                                \
    "leaq 1f(%%rip), %%rsi\n\tmovq %%rsi, %[at]\n\t"                                       \
    "leaq 2f(%%rip), %%rsi\n\tmovq %%rsi, %[re]\n\t"                                       \
    "1: " insn "\n2:"

static uint64_t ap_exec_rdpid(void)
{
    uint64_t v = ~0ull;
    __asm__ volatile(AP_PROBE_ASM_("rdpid %%rcx")
                     : [at] "=m"(ap_probe_at), [re] "=m"(ap_probe_resume), "+c"(v)
                     :
                     : "rsi", "memory");
    return v;
}

static uint32_t ap_exec_rdtscp(void)
{
    uint32_t a, d, c = ~0u;
    __asm__ volatile(AP_PROBE_ASM_("rdtscp")
                     : [at] "=m"(ap_probe_at), [re] "=m"(ap_probe_resume), "=a"(a), "=d"(d),
                       "+c"(c)
                     :
                     : "rsi", "memory");
    return c;
}

/* RDPID counts when it executes and TSC_AUX holds the number sched_getcpu()
 * reports (a few tries, in case the thread migrates in between). */
static bool ap_rdpid_usable(void)
{
    for (int i = 0; i < 4; i++) {
        uint64_t a = ap_exec_rdpid();
        if (ap_probe_ill)
            return false;
        int cpu = sched_getcpu();
        uint64_t b = ap_exec_rdpid();
        if (cpu >= 0 && a == b && (a & 0xfff) == (uint64_t)cpu)
            return true;
    }
    return false;
}

static void ap_probe_instructions(struct altpatch_features *f)
{
    bool tscp = ap_features_test(f, X86_FEATURE_RDTSCP);
    bool pid = ap_features_test(f, X86_FEATURE_RDPID);
    if (!tscp && !pid)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = ap_probe_sigill;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigset_t ill, old;
    sigemptyset(&ill);
    sigaddset(&ill, SIGILL);
    if (sigaction(SIGILL, &sa, &ap_probe_prev) != 0) {
        ap_bit_clear(f, X86_FEATURE_RDTSCP); /* cannot tell: claim neither */
        ap_bit_clear(f, X86_FEATURE_RDPID);
        return;
    }
    /* a blocked SIGILL raised by an instruction would kill the process */
    if (pthread_sigmask(SIG_UNBLOCK, &ill, &old) != 0) {
        ap_bit_clear(f, X86_FEATURE_RDTSCP);
        ap_bit_clear(f, X86_FEATURE_RDPID);
    } else {
        if (tscp) {
            ap_probe_ill = 0;
            (void)ap_exec_rdtscp();
            if (ap_probe_ill)
                ap_bit_clear(f, X86_FEATURE_RDTSCP);
        }
        if (pid) {
            ap_probe_ill = 0;
            if (!ap_rdpid_usable())
                ap_bit_clear(f, X86_FEATURE_RDPID);
        }
        if (sigismember(&old, SIGILL) == 1)
            pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    ap_probe_at = NULL;
    sigaction(SIGILL, &ap_probe_prev, NULL);
}

static struct altpatch_features ap_host;
static pthread_once_t ap_host_once = PTHREAD_ONCE_INIT;

static void ap_host_detect(void)
{
    struct altpatch_features f;
    ap_features_init(&f);
    ap_read_std_leaves(&f);
    ap_read_ext_leaves(&f);
    ap_mask_known(&f);
    ap_apply_os_enablement(&f);
    ap_probe_instructions(&f);
    ap_derive_synthetic(&f);
    ap_host = f;
}

const struct altpatch_features *ap_host_features(void)
{
    pthread_once(&ap_host_once, ap_host_detect);
    return &ap_host;
}

ALTPATCH_API struct altpatch_features *altpatch_features_host(void)
{
    return altpatch_features_dup(ap_host_features());
}

/* ------------------------------------------------------------------------- */
/* ALTPATCH_CLEARCPUID                                                       */
/* ------------------------------------------------------------------------- */

/* Clear each listed name (never ALWAYS); warn about unknown ones and ALWAYS when @p warn. */
static int ap_clear_names(struct altpatch_features *f, const char *list, bool warn)
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

void ap_effective_features(struct altpatch_features *out)
{
    *out = *ap_host_features();
    const char *list = ap_getenv("ALTPATCH_CLEARCPUID");
    if (list)
        ap_clearcpuid(out, list);
}

ALTPATCH_API bool altpatch_cpu_has(unsigned feature)
{
    if (!ap_feature_known(feature))
        return false;
    struct altpatch_features f = *ap_host_features();
    const char *list = ap_getenv("ALTPATCH_CLEARCPUID");
    if (list)
        ap_clear_names(&f, list, false); /* apply warns; a query stays quiet */
    return ap_features_test(&f, feature);
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
static void ap_profile_fill(const struct ap_profile *p, struct altpatch_features *f)
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

ALTPATCH_API struct altpatch_features *altpatch_features_profile(const char *name)
{
    if (!name) {
        errno = EINVAL;
        return NULL;
    }
    for (size_t i = 0; i < AP_NPROFILES; i++) {
        const struct ap_profile *p = &ap_profiles[i];
        if (strcasecmp(p->name, name) != 0)
            continue;
        if (!p->vendor)
            return altpatch_features_host();
        struct altpatch_features *f = malloc(sizeof(*f));
        if (f)
            ap_profile_fill(p, f);
        return f;
    }
    errno = ENOENT;
    return NULL;
}
