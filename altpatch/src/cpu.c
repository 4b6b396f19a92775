/* SPDX-License-Identifier: MIT */
/*
 * cpu.c -- this CPU: which X86_FEATURE_* ids this process may use (the
 * feature table, names and profiles are features.c's).
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
 *   - RDSEED on AMD family 0x1a unless the kernel lists it in /proc/cpuinfo
 *     (Linux clears it there unless the microcode fixes RDSEED's 16- and
 *     32-bit forms);
 *   - RDTSCP unless the instruction executes in this process, RDPID unless it
 *     executes and returns the CPU number getcpu() reports (probed under
 *     a SIGILL guard, only when CPUID claims them: emulators such as valgrind
 *     claim RDTSCP without running it, and Linux maintains TSC_AUX only where
 *     it enumerates RDTSCP or RDPID).
 * System features (vmx, monitor, xsaves, ...) keep their CPUID meaning.
 * CONSTANT_TSC and NONSTOP_TSC: CPUID 0x80000007 EDX bit 8 (invariant TSC),
 * as early_init_amd() / early_init_intel() do; the other synthetic bits are
 * derived by features.c's vendor rules (ap_derive_synthetic()).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "host.h"

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

/* ------------------------------------------------------------------------- */
/* Host detection                                                            */
/* ------------------------------------------------------------------------- */

/*
 * CPUID is read lazily, by groups of leaves (AP_LEAVES_* in host.h): under a
 * hypervisor each CPUID is an exit costing microseconds, and an apply needs
 * only the words its records reference. ap_raw holds the words read so far;
 * every derived set is computed from it by the same steps in the same order
 * (keep known bits, OS enablement, instruction probes, synthetic bits), each
 * step depending only on words of the groups read or on the base group, so a
 * bit of a group that was read is the same whichever other groups were.
 */
/* Held while ap_raw and the derived set are read or written: an ap_tlock
 * (host.h) rather than a pthread mutex, whose lock and unlock are two more
 * symbols for the dynamic linker to resolve on a process's first apply
 * (about 800 instructions each). The owner's token lets a signal handler
 * that interrupted its own thread inside ap_host_leaves() see that it would
 * wait for itself, and a fork's handlers (ap_leaves_fork_prepare()) keep the
 * lock across a fork unless the forking thread holds it already. */
AP_STATE static struct ap_tlock ap_leaves_mx;

/* Tokens (also apply.c's locks'): per thread, kept by the forking thread in
 * a child, never 0 nor with the waiters' bit. */
AP_STATE static uint32_t ap_token_next;
static __thread uint32_t ap_token_mine;

AP_HOT uint32_t ap_token(void)
{
    uint32_t t = ap_token_mine;
    while (!t)
        t = __atomic_add_fetch(&ap_token_next, 1, __ATOMIC_RELAXED) & ~AP_TLOCK_WAITERS;
    ap_token_mine = t;
    return t;
}
static __thread bool ap_leaves_fork_took;

AP_HOT bool ap_leaves_held_here(void)
{
    return ap_tlock_owner(&ap_leaves_mx) == ap_token();
}

void ap_leaves_fork_prepare(void)
{
    uint32_t me = ap_token();
    ap_leaves_fork_took = ap_tlock_owner(&ap_leaves_mx) != me;
    /* its holder takes nothing else: never waits for this thread */
    if (ap_leaves_fork_took)
        ap_tlock_lock(&ap_leaves_mx, me);
}

void ap_leaves_fork_release(void)
{
    if (ap_leaves_fork_took) {
        ap_leaves_fork_took = false;
        ap_tlock_unlock(&ap_leaves_mx);
    }
}
AP_STATE static struct altpatch_features ap_raw; /* the words of ap_raw_groups; others zero */
AP_STATE static unsigned ap_raw_groups;
AP_STATE static uint32_t ap_std_max; /* CPUID.0:EAX (base group) */
AP_STATE static uint32_t ap_ext_max; /* CPUID.80000000h:EAX, 0 when not yet read or absent */
AP_STATE static bool ap_ext_max_read;

/* The CPUID leaves of feature @p id (in word @p w). */
static unsigned ap_feature_cpuid_leaves(unsigned id, unsigned w)
{
    switch (w) {
    case 0:
    case 4:
        return AP_LEAVES_BASE;
    case 1:
    case 6:
        return AP_LEAVES_BASE | AP_LEAVES_EXT1;
    case 3: /* synthetic: vendor rules on base words, invariant TSC from 0x80000007 */
        if (id == X86_FEATURE_CONSTANT_TSC || id == X86_FEATURE_NONSTOP_TSC)
            return AP_LEAVES_BASE | AP_LEAVES_EXT7;
        return AP_LEAVES_BASE;
    case 9:
    case 16:
    case 18:
        return AP_LEAVES_BASE | AP_LEAVES_STD7;
    case 12:
        return AP_LEAVES_BASE | AP_LEAVES_STD7 | AP_LEAVES_STD71;
    case 10:
        return AP_LEAVES_BASE | AP_LEAVES_STDD;
    case 13:
        return AP_LEAVES_BASE | AP_LEAVES_EXT8;
    case 17:
        return AP_LEAVES_BASE | AP_LEAVES_EXT7;
    case 20:
        if (id == X86_FEATURE_LFENCE_RDTSC)
            return AP_LEAVES_BASE | AP_LEAVES_LFENCE;
        return AP_LEAVES_BASE | AP_LEAVES_EXT21;
    default: /* no CPUID word: nothing to read */
        return AP_LEAVES_BASE;
    }
}

/*
 * The leaves the C library read when the process started. glibc 2.33 and
 * later keep the CPUID leaves 1, 7.0, 7.1, 0xd.1 and 0x80000001/7/8 as the CPU
 * answered them, and hand them out through __x86_get_cpuid_feature_leaf()
 * (<sys/platform/x86.h>, its manual's "X86"): the same registers, without a
 * CPUID instruction, which in a virtual machine is an exit to the hypervisor
 * costing microseconds (a function call instead, resolved once). The
 * registers are the CPU's raw answer (glibc keeps what it decides usable
 * apart); test_cpu compares them with CPUID on every run. A leaf glibc did
 * not read is all zero there, and is asked with CPUID; so is leaf 0 (the
 * vendor), which is not among them, and every leaf without that header.
 */
#if defined(__has_include)
#if __has_include(<sys/platform/x86.h>)
#include <sys/platform/x86.h>
#define AP_HAVE_LIBC_LEAVES 1
#endif
#endif

AP_HOT bool ap_libc_leaf(unsigned leaf, unsigned sub, struct ap_regs *r)
{
#ifdef AP_HAVE_LIBC_LEAVES
    unsigned index;
    if (leaf == 1 && sub == 0)
        index = CPUID_INDEX_1;
    else if (leaf == 7 && sub == 0)
        index = CPUID_INDEX_7;
    else if (leaf == 7 && sub == 1)
        index = CPUID_INDEX_7_ECX_1;
    else if (leaf == 0xd && sub == 1)
        index = CPUID_INDEX_D_ECX_1;
    else if (leaf == 0x80000001u && sub == 0)
        index = CPUID_INDEX_80000001;
    else if (leaf == 0x80000007u && sub == 0)
        index = CPUID_INDEX_80000007;
    else if (leaf == 0x80000008u && sub == 0)
        index = CPUID_INDEX_80000008;
    else
        return false;
    const struct cpuid_feature *c = __x86_get_cpuid_feature_leaf(index);
    if (!c)
        return false;
    r->a = c->cpuid_array[0];
    r->b = c->cpuid_array[1];
    r->c = c->cpuid_array[2];
    r->d = c->cpuid_array[3];
    /* All zero: glibc did not read it (it skips leaf 1 and the extended
     * leaves for a vendor it does not know, and leaf 7 below its highest
     * leaf); the caller asks the CPU, which may say the same. */
    return (r->a | r->b | r->c | r->d) != 0;
#else
    (void)leaf;
    (void)sub;
    (void)r;
    return false;
#endif
}

/* Leaf @p leaf, subleaf @p sub from the C library when it has it, else CPUID. */
static struct ap_regs ap_leaf(uint32_t leaf, uint32_t sub)
{
    struct ap_regs r;
    if (ap_libc_leaf(leaf, sub, &r))
        return r;
    return ap_cpuid(leaf, sub);
}

/* Leaf 0 (vendor, highest leaf) and leaf 1 into words 0 and 4. */
/* The display family of leaf 1 (BASE group; 0 until read). */
AP_STATE static unsigned ap_family;

AP_HOT static void ap_read_base(struct altpatch_features *f)
{
    struct ap_regs r = ap_cpuid(0, 0);
    ap_std_max = r.a;
    char v[13];
    memcpy(v, &r.b, 4);
    memcpy(v + 4, &r.d, 4);
    memcpy(v + 8, &r.c, 4);
    v[12] = '\0';
    ap_set_vendor(f, v);
    if (ap_std_max >= 1) {
        r = ap_leaf(1, 0);
        f->word[0] = r.d;
        f->word[4] = r.c;
        ap_family = (r.a >> 8) & 0xf;
        if (ap_family == 0xf)
            ap_family += (r.a >> 20) & 0xff;
    }
}

/*
 * How ap_sync_core() serializes, learnt from leaf 7.0 when it is read for the
 * features, or by ap_sync_core() itself, once, from the C library's copy of
 * that leaf (else from the leaf): AP_SYNC_UNKNOWN until then.
 */
AP_STATE static int ap_sync_kind = AP_SYNC_UNKNOWN;
AP_STATE static uint32_t ap_std7_maxsub; /* CPUID.(7,0):EAX (STD7 group) */

/* How to serialize on a CPU whose leaf 7.0 answers @p c in ECX, @p d in EDX. */
static int ap_sync_kind_of(uint32_t c, uint32_t d)
{
    if (d & (1u << (X86_FEATURE_SERIALIZE % 32)))
        return AP_SYNC_SERIALIZE;
    if (c & (1u << (X86_FEATURE_SHSTK % 32)))
        return AP_SYNC_IRET_UNLESS_SHSTK; /* a thread may run on a shadow stack */
    return AP_SYNC_IRET;
}

/* Leaf 7.0 into words 9, 16, 18; how to serialize. */
static void ap_read_std7(struct altpatch_features *f)
{
    if (ap_std_max < 7)
        return;
    struct ap_regs r = ap_leaf(7, 0);
    ap_std7_maxsub = r.a;
    f->word[9] = r.b;
    f->word[16] = r.c;
    f->word[18] = r.d;
    __atomic_store_n(&ap_sync_kind, ap_sync_kind_of(r.c, r.d), __ATOMIC_RELEASE);
}

/* Leaf 7.1 into word 12 (after ap_read_std7()). */
static void ap_read_std71(struct altpatch_features *f)
{
    if (ap_std_max >= 7 && ap_std7_maxsub >= 1)
        f->word[12] = ap_leaf(7, 1).a;
}

/* Leaf 0xd.1 into word 10. */
static void ap_read_stdd(struct altpatch_features *f)
{
    if (ap_std_max >= 0xd)
        f->word[10] = ap_leaf(0xd, 1).a;
}

/* The highest extended leaf, 0 when there are none. */
static uint32_t ap_read_ext_max(void)
{
    if (!ap_ext_max_read) {
        uint32_t max = ap_cpuid(0x80000000u, 0).a;
        ap_ext_max = (max & 0xffff0000u) == 0x80000000u ? max : 0;
        ap_ext_max_read = true;
    }
    return ap_ext_max;
}

/*
 * Extended leaves of @p group: 0x80000001/7/8/0x21 into words 1 and 6, 17
 * (+ the TSC bits of word 3), 13, 20.
 *
 * Leaf 0x80000001 is read without asking 0x80000000 first: it is where a CPU
 * says it has long mode (EDX bit 29), so every CPU running this 64-bit code
 * has it, and Linux does not boot in 64-bit mode where the highest extended
 * leaf is below it (arch/x86/kernel/verify_cpu.S checks exactly that). One
 * CPUID, one hypervisor exit, less. The other extended leaves are asked only
 * below the highest one: an Intel CPU answers a leaf above it with the data
 * of its highest basic leaf.
 */
static void ap_read_ext(struct altpatch_features *f, unsigned group)
{
    if (group == AP_LEAVES_EXT1) {
        struct ap_regs r = ap_leaf(0x80000001u, 0);
        f->word[1] = r.d;
        f->word[6] = r.c;
        return;
    }
    /* glibc read these only below the highest extended leaf: what it has
     * needs no question about that leaf */
    struct ap_regs r;
    bool libc = (group == AP_LEAVES_EXT7 && ap_libc_leaf(0x80000007u, 0, &r)) ||
                (group == AP_LEAVES_EXT8 && ap_libc_leaf(0x80000008u, 0, &r));
    uint32_t max = libc ? 0x80000008u : ap_read_ext_max();
    if (group == AP_LEAVES_EXT7 && max >= 0x80000007u) {
        if (!libc)
            r = ap_cpuid(0x80000007u, 0);
        f->word[17] = r.b;
        if (r.d & (1u << 8)) { /* invariant TSC */
            ap_bit_set(f, X86_FEATURE_CONSTANT_TSC);
            ap_bit_set(f, X86_FEATURE_NONSTOP_TSC);
        }
    }
    if (group == AP_LEAVES_EXT8 && max >= 0x80000008u)
        f->word[13] = (libc ? r : ap_cpuid(0x80000008u, 0)).b;
    if (group == AP_LEAVES_EXT21 && max >= 0x80000021u)
        f->word[20] = ap_cpuid(0x80000021u, 0).a;
}

/*
 * Whether the vendor rule alone sets LFENCE_RDTSC (Intel, AMD, Hygon,
 * Centaur, Zhaoxin with SSE2): then leaf 0x80000021 cannot change that bit
 * and is not read for it (ap_raw's base group read).
 */
static bool ap_lfence_by_vendor(void)
{
    struct altpatch_features t = ap_raw;
    t.word[X86_FEATURE_LFENCE_RDTSC / 32] = 0; /* the vendor rule only, not the CPUID bit */
    ap_mask_known(&t);
    ap_derive_synthetic(&t);
    return ap_features_test(&t, X86_FEATURE_LFENCE_RDTSC);
}

/* Read the groups of @p groups not read yet into ap_raw (ap_leaves_mx held). */
static void ap_read_leaves(unsigned groups)
{
    groups |= AP_LEAVES_BASE; /* vendor and leaf 1 feed every derivation */
    if (groups & AP_LEAVES_STD71)
        groups |= AP_LEAVES_STD7; /* the highest subleaf of leaf 7 */
    if (groups & AP_LEAVES_LFENCE) {
        if (!(ap_raw_groups & AP_LEAVES_BASE)) {
            ap_read_base(&ap_raw);
            ap_raw_groups |= AP_LEAVES_BASE;
        }
        if (!ap_lfence_by_vendor())
            groups |= AP_LEAVES_EXT21;
    }
    unsigned todo = groups & ~ap_raw_groups & AP_LEAVES_CPUID;
    if (!todo)
        return;
    if (todo & AP_LEAVES_BASE)
        ap_read_base(&ap_raw);
    if (todo & AP_LEAVES_STD7)
        ap_read_std7(&ap_raw);
    if (todo & AP_LEAVES_STD71)
        ap_read_std71(&ap_raw);
    if (todo & AP_LEAVES_STDD)
        ap_read_stdd(&ap_raw);
    static const unsigned ext[] = {AP_LEAVES_EXT1, AP_LEAVES_EXT7, AP_LEAVES_EXT8,
                                   AP_LEAVES_EXT21};
    for (size_t i = 0; i < sizeof(ext) / sizeof(ext[0]); i++)
        if (todo & ext[i])
            ap_read_ext(&ap_raw, ext[i]);
    ap_raw_groups |= todo;
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

/* Facts asked of the kernel or learnt by a probe, once each and only when a
 * set read so far holds the bit they decide (-1: not asked yet). */
AP_STATE static int ap_amx_perm = -1, ap_shstk_on = -1, ap_rdtscp_ok = -1, ap_rdpid_ok = -1;
AP_STATE static int ap_rdseed_listed = -1;

/*
 * Whether the kernel lists @p name among the first CPU's flags in
 * /proc/cpuinfo: its own verdict on a feature it may clear although CPUID
 * claims it. false where the file cannot be read (a sandbox without /proc):
 * the feature is then left out, which is never wrong, only conservative.
 */
static bool ap_kernel_lists(const char *name)
{
    static char buf[16384]; /* the first CPU's block; under ap_leaves_mx */
    long fd = ap_sys(SYS_openat, AT_FDCWD, (long)"/proc/cpuinfo", O_RDONLY | O_CLOEXEC, 0, 0);
    if (fd < 0)
        return false;
    size_t len = 0;
    for (;;) {
        long n = ap_sys(SYS_read, fd, (long)(buf + len), (long)(sizeof(buf) - len), 0, 0);
        if (n == -EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        size_t flen;
        if (len == sizeof(buf) || ap_cpuinfo_flags(buf, len, &flen))
            break; /* the first flags line is whole */
    }
    ap_sys(SYS_close, fd, 0, 0, 0, 0);
    return ap_cpuinfo_lists(buf, len, name);
}

/*
 * RDSEED on AMD family 0x1a: the kernel clears it unless the microcode is
 * one it knows fixes RDSEED's 16- and 32-bit forms (they may report success
 * with a zero value), which userspace cannot read cheaply: ask the kernel,
 * once, only where CPUID claims RDSEED on such a CPU and a caller wants it.
 */
static bool ap_rdseed_usable(unsigned asked)
{
    if (!(asked & AP_LEAVES_KFLAGS))
        return false;
    if (ap_rdseed_listed < 0)
        ap_rdseed_listed = ap_kernel_lists("rdseed");
    return ap_rdseed_listed;
}

static bool ap_amx_permitted(void)
{
    if (ap_amx_perm < 0) {
        unsigned long perm = 0;
        ap_amx_perm = ap_sys(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, (long)&perm, 0, 0, 0) == 0 &&
                      ((perm >> AP_XFEATURE_XTILEDATA) & 1u);
    }
    return ap_amx_perm;
}

static bool ap_shstk_enabled(void)
{
    if (ap_shstk_on < 0) {
        unsigned long st = 0;
        ap_shstk_on = ap_sys(SYS_arch_prctl, ARCH_SHSTK_STATUS, (long)&st, 0, 0, 0) == 0 &&
                      (st & AP_ARCH_SHSTK_SHSTK);
    }
    return ap_shstk_on;
}

static bool ap_in_list(unsigned id, const uint16_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

AP_HOT unsigned ap_feature_leaves(unsigned id)
{
    unsigned os = 0; /* what the OS is asked for this feature */
    if (ap_in_list(id, ap_amx_family, sizeof(ap_amx_family) / sizeof(ap_amx_family[0])))
        os = AP_LEAVES_XCOMP;
    else if (id == X86_FEATURE_SHSTK)
        os = AP_LEAVES_SHSTK;
    else if (id == X86_FEATURE_RDTSCP || id == X86_FEATURE_RDPID)
        os = AP_LEAVES_PROBE;
    else if (id == X86_FEATURE_RDSEED)
        os = AP_LEAVES_KFLAGS;
    return os | ap_feature_cpuid_leaves(id, id / 32);
}

static bool ap_any_set(const struct altpatch_features *f, const uint16_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ap_features_test(f, ids[i]))
            return true;
    return false;
}

/*
 * Remove what CPUID reports but the OS does not let this process use. The
 * two facts asked of the kernel (AMX permission, shadow stack) are asked only
 * once a caller wanted a feature they decide (@p asked: AP_LEAVES_XCOMP,
 * AP_LEAVES_SHSTK); until then those features are left out (clear), which
 * is never wrong, only conservative.
 */
static void ap_apply_os_enablement(struct altpatch_features *f, unsigned asked)
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
    if (ap_any_set(f, ap_amx_family, sizeof(ap_amx_family) / sizeof(ap_amx_family[0])) &&
        ((xcr0 & AP_XCR0_AMX) != AP_XCR0_AMX || !(asked & AP_LEAVES_XCOMP) ||
         !ap_amx_permitted()))
        AP_CLEAR_ALL(f, ap_amx_family);
    if (!ap_features_test(f, X86_FEATURE_OSPKE))
        ap_bit_clear(f, X86_FEATURE_PKU); /* RDPKRU/WRPKRU need CR4.PKE */
    if (ap_features_test(f, X86_FEATURE_SHSTK) &&
        (!(asked & AP_LEAVES_SHSTK) || !ap_shstk_enabled()))
        ap_bit_clear(f, X86_FEATURE_SHSTK);
    if (ap_features_test(f, X86_FEATURE_RDSEED) && ap_family == 0x1a &&
        strcmp(f->vendor, "AuthenticAMD") == 0 && !ap_rdseed_usable(asked))
        ap_bit_clear(f, X86_FEATURE_RDSEED);
}

/*
 * Instructions whose CPUID bit is not enough: valgrind's synthetic CPUID
 * claims RDTSCP on machines where its translator raises SIGILL for it, a
 * process that asked for prctl(PR_SET_TSC, PR_TSC_SIGSEGV) (a record-and-
 * replay tool's tracee, a sandbox hiding the clock) takes a SIGSEGV for every
 * RDTSC and RDTSCP (CR4.TSD: #GP), and RDPID is only worth its name where
 * Linux keeps TSC_AUX equal to this CPU's number. Each is executed once
 * under a guard, only when a caller wants one of them (AP_LEAVES_PROBE: until
 * then both are left out, clear) and CPUID claims it (no CPUID exit): SIGILL
 * for both, SIGSEGV too while RDTSCP runs (RDPID is not subject to TSD).
 * The guard is a process-wide action per signal held for the few
 * instructions of the probe; such a signal elsewhere meanwhile (another
 * thread's fault: routine in a runtime that takes SIGSEGV on purpose) takes
 * the guard down and is handed back to the previous action (the faulting
 * instruction runs again under it). So the program's action is read before
 * the guard replaces it (one rt_sigaction call more per signal: one call
 * that swaps them writes the old action out only after the new one is in
 * place, and a fault in between would find nothing to hand back to), and an
 * instruction is probed only while its guards still hold; a probe whose
 * guard was taken down leaves its answer unknown, to be asked again.
 */
AP_STATE static const void *volatile ap_probe_at;     /* the probed instruction */
AP_STATE static const void *volatile ap_probe_resume; /* the instruction after it */
AP_STATE static volatile sig_atomic_t ap_probe_ill;

/*
 * The guard is set and taken down with the rt_sigaction system call itself
 * (the C library's sigaction() would be one more symbol for the dynamic
 * linker to resolve on a process's first apply): the kernel's struct
 * sigaction on x86-64, and a restorer of our own that makes the
 * rt_sigreturn call the kernel expects when a handler returns (the same
 * bytes as the C library's, which debuggers and unwinders recognise as a
 * signal frame). The previous action is read and put back in the kernel's
 * form, exactly as it was.
 */
struct ap_ksigaction {
    void *handler;
    unsigned long flags;
    void (*restorer)(void);
    uint64_t mask; /* one bit per signal: the kernel's sigset on x86-64 */
};
#define AP_SA_RESTORER 0x04000000ul
#define AP_STR_(x) #x
#define AP_STR(x) AP_STR_(x)

/*
 * The restorer is named __restore_rt, as the C library's is, and kept local to
 * this object (no clash with the C library's, nothing exported): debuggers
 * recognise a signal frame by that name (gdb also by these bytes when a frame
 * has no name), so a backtrace through the probe's handler shows "<signal
 * handler called>" and goes on into the interrupted code.
 */
extern void ap_probe_restorer(void) __asm__("__restore_rt") __attribute__((visibility("hidden")));
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".type __restore_rt, @function\n"
        "__restore_rt:\n"
        "\tmovq $" AP_STR(SYS_rt_sigreturn) ", %rax\n" /* 48 c7 c0 0f 00 00 00 */
        "\tsyscall\n"
        "\tud2\n"
        ".size __restore_rt, . - __restore_rt\n"
        ".popsection");

/* The program's actions, read before the guard replaces them: SIGILL's,
 * and SIGSEGV's where the RDTSCP probe runs. A held flag is set once its
 * action is read and before the guard goes in, and cleared when the guard
 * is taken down (by the probe, or by the handler for a signal that is not
 * the probe's). */
AP_STATE static struct ap_ksigaction ap_probe_prev, ap_probe_prev_segv;
AP_STATE static volatile sig_atomic_t ap_probe_ill_held, ap_probe_segv_held;

/*
 * Test switch: the RDTSCP probe runs HLT instead (privileged: #GP, SIGSEGV,
 * on every x86-64 CPU, as RDTSCP under PR_TSC_SIGSEGV), whatever CPUID
 * claims, so that the SIGSEGV guard is exercised on any machine; with
 * AP_PROBE_TEST_FOREIGN a HLT that is not the probe's faults first.
 */
AP_STATE int ap_probe_hlt_test;

static long ap_ksigaction(int sig, const struct ap_ksigaction *act, struct ap_ksigaction *old)
{
    return ap_sys(SYS_rt_sigaction, sig, (long)act, (long)old, sizeof(uint64_t), 0);
}

static void ap_probe_sigill(int sig, siginfo_t *si, void *ucv)
{
    ucontext_t *uc = ucv;
    const void *rip = (const void *)(uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (si->si_code > 0 && ap_probe_at && rip == ap_probe_at) {
        ap_probe_ill = 1;
        uc->uc_mcontext.gregs[REG_RIP] = (greg_t)(uintptr_t)ap_probe_resume;
        return;
    }
    /* not the probe's: the guard goes down (the action read before it went
     * in; another thread's handler may have put it back already: the same
     * action again) */
    if (sig == SIGSEGV) {
        ap_probe_segv_held = 0;
        ap_ksigaction(SIGSEGV, &ap_probe_prev_segv, NULL);
    } else {
        ap_probe_ill_held = 0;
        ap_ksigaction(SIGILL, &ap_probe_prev, NULL);
    }
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
    if (__builtin_expect(ap_probe_hlt_test, 0)) {
        __asm__ volatile(AP_PROBE_ASM_("hlt")
                         : [at] "=m"(ap_probe_at), [re] "=m"(ap_probe_resume)
                         :
                         : "rsi", "memory");
        return c;
    }
    __asm__ volatile(AP_PROBE_ASM_("rdtscp")
                     : [at] "=m"(ap_probe_at), [re] "=m"(ap_probe_resume), "=a"(a), "=d"(d),
                       "+c"(c)
                     :
                     : "rsi", "memory");
    return c;
}

/* RDPID counts when it executes and TSC_AUX holds the number the kernel
 * reports (getcpu; a few tries, in case the thread migrates in between).
 * 1 or 0; -1 when the SIGILL guard was taken down before an execution. */
static int ap_rdpid_usable(void)
{
    for (int i = 0; i < 4; i++) {
        if (!ap_probe_ill_held)
            return -1;
        uint64_t a = ap_exec_rdpid();
        if (ap_probe_ill)
            return 0;
        unsigned cpu = 0;
        long r = ap_sys(SYS_getcpu, (long)&cpu, 0, 0, 0, 0);
        if (!ap_probe_ill_held)
            return -1;
        uint64_t b = ap_exec_rdpid();
        if (ap_probe_ill)
            return 0;
        if (r == 0 && a == b && (a & 0xfff) == (uint64_t)cpu)
            return ap_probe_ill_held ? 1 : -1;
    }
    return ap_probe_ill_held ? 0 : -1;
}

/* What ap_guard_set() did. */
enum { AP_GUARD_FAILED, AP_GUARD_SET, AP_GUARD_BUSY };

/*
 * The program's action for @sig read into @prev, then the guard @sa put in
 * its place; *@held set in between. AP_GUARD_FAILED (nothing changed, *@held
 * clear) when either call fails. AP_GUARD_BUSY (nothing changed) when the
 * action read is the guard itself: a signal that was not a probe's reached
 * an earlier guard, in another thread, whose handler has not put the
 * program's action back yet. Reading the guard as the program's action
 * would make that handler put the guard back for good: every later SIGSEGV
 * of the program's would go to a handler that re-runs the faulting
 * instruction, forever.
 */
static int ap_guard_set(int sig, const struct ap_ksigaction *sa, struct ap_ksigaction *prev,
                        volatile sig_atomic_t *held)
{
    struct ap_ksigaction cur;
    if (ap_ksigaction(sig, NULL, &cur) != 0)
        return AP_GUARD_FAILED;
    if (cur.handler == sa->handler)
        return AP_GUARD_BUSY;
    *prev = cur;
    *held = 1;
    if (ap_ksigaction(sig, sa, NULL) == 0)
        return AP_GUARD_SET;
    *held = 0;
    return AP_GUARD_FAILED;
}

/* The guard for @sig taken down: the program's action put back, unless a
 * signal that was not the probe's did so already (then the program may have
 * set another since, which stays). */
static void ap_guard_drop(int sig, const struct ap_ksigaction *prev, volatile sig_atomic_t *held)
{
    if (*held) {
        *held = 0;
        ap_ksigaction(sig, prev, NULL);
    }
}

/* Run the probes not run yet for what @p f claims; sets ap_rdtscp_ok /
 * ap_rdpid_ok. false when a pending SIGILL (or, for RDTSCP, SIGSEGV) kept
 * them from running, or a signal that was not the probe's took a guard
 * down: those answers stay unknown (-1), to be asked again by a later
 * derivation. */
static bool ap_run_probes(const struct altpatch_features *f)
{
    bool tscp = ap_rdtscp_ok < 0 &&
                (ap_features_test(f, X86_FEATURE_RDTSCP) || ap_probe_hlt_test);
    bool pid = ap_rdpid_ok < 0 && ap_features_test(f, X86_FEATURE_RDPID);
    if (!tscp && !pid)
        return true;
    /* SA_ONSTACK: a thread that overflows its stack while the guard holds
     * gets the handler on its alternate stack, where the program's own would
     * have run (without one, the kernel could not deliver and would kill) */
    struct ap_ksigaction sa = {
        .handler = (void *)ap_probe_sigill,
        .flags = SA_SIGINFO | SA_ONSTACK | AP_SA_RESTORER,
        .restorer = ap_probe_restorer,
        .mask = 0,
    };
    /* the kernel's sigset: one bit per signal, signal s is bit s - 1 */
    uint64_t ill = 1ull << (SIGILL - 1), segv = 1ull << (SIGSEGV - 1), old = 0;
    int ill_guard = ap_guard_set(SIGILL, &sa, &ap_probe_prev, &ap_probe_ill_held);
    if (ill_guard == AP_GUARD_BUSY)
        return false; /* claim neither now, ask again later */
    if (ill_guard == AP_GUARD_FAILED) {
        /* cannot tell: claim neither */
        if (tscp)
            ap_rdtscp_ok = 0;
        if (pid)
            ap_rdpid_ok = 0;
        return true;
    }
    /* RDTSCP faults with SIGSEGV under PR_TSC_SIGSEGV (PR_GET_TSC would
     * answer too, but a seccomp filter may kill for a prctl() it does not
     * expect; rt_sigaction is the guard's call either way). Without that
     * guard RDTSCP is not executed and not claimed. */
    int segv_set =
        tscp ? ap_guard_set(SIGSEGV, &sa, &ap_probe_prev_segv, &ap_probe_segv_held) : 0;
    bool segv_guard = segv_set == AP_GUARD_SET;
    uint64_t guarded = ill | (segv_guard ? segv : 0);
    /* a guard taken down before its probe's answer, or not set for an
     * earlier one's (AP_GUARD_BUSY): asked again later */
    bool lost = segv_set == AP_GUARD_BUSY;
    /* A blocked SIGILL or SIGSEGV raised by an instruction would kill the
     * process: the probe runs with both unblocked. Where the program does not
     * block them (the usual case: one system call, which asks for the mask
     * alone) none can be pending either -- it would have been delivered
     * already. A signal the program blocked and left pending would be
     * delivered to the probe's handler the moment it is unblocked, and put
     * back to the program's action -- the default, often: the process would
     * die. Then nothing is probed and neither instruction is claimed this
     * time; the answer is not kept (a later derivation, once the program has
     * taken its signal, probes). */
    bool held = ap_sys(SYS_rt_sigprocmask, SIG_BLOCK, 0, (long)&old, sizeof(old), 0) != 0;
    if (!held && (old & guarded)) {
        uint64_t pending = 0;
        held = ap_sys(SYS_rt_sigpending, (long)&pending, sizeof(pending), 0, 0, 0) != 0 ||
               (pending & guarded) ||
               ap_sys(SYS_rt_sigprocmask, SIG_UNBLOCK, (long)&guarded, 0, sizeof(guarded), 0) !=
                   0;
    }
    if (!held) {
        if (tscp && segv_guard) {
            if (__builtin_expect(ap_probe_hlt_test == AP_PROBE_TEST_FOREIGN, 0))
                __asm__ volatile("hlt" ::: "memory");
            ap_probe_ill = 0;
            /* executed only while both guards hold, and trusted only if they
             * held throughout: a fault of either kind means not usable */
            bool ran = ap_probe_ill_held && ap_probe_segv_held;
            if (ran)
                (void)ap_exec_rdtscp();
            if (ran && ap_probe_ill_held && ap_probe_segv_held)
                ap_rdtscp_ok = !ap_probe_ill;
            else
                lost = true;
            /* RDPID is not subject to TSD: SIGSEGV is the program's again */
            ap_guard_drop(SIGSEGV, &ap_probe_prev_segv, &ap_probe_segv_held);
        } else if (tscp && segv_set != AP_GUARD_BUSY) {
            ap_rdtscp_ok = 0;
        }
        if (pid) {
            ap_probe_ill = 0;
            int ok = ap_rdpid_usable();
            if (ok < 0)
                lost = true;
            else
                ap_rdpid_ok = ok;
        }
        if (old & guarded)
            ap_sys(SYS_rt_sigprocmask, SIG_SETMASK, (long)&old, 0, sizeof(old), 0);
    }
    ap_probe_at = NULL;
    if (segv_guard)
        ap_guard_drop(SIGSEGV, &ap_probe_prev_segv, &ap_probe_segv_held);
    ap_guard_drop(SIGILL, &ap_probe_prev, &ap_probe_ill_held);
    return !held && !lost;
}

/* false when a probe could not run (ap_run_probes()): @p f claims neither
 * unknown instruction, and is not to be kept as the derived set. */
static bool ap_probe_instructions(struct altpatch_features *f, unsigned asked)
{
    if (!(asked & AP_LEAVES_PROBE)) {
        ap_bit_clear(f, X86_FEATURE_RDTSCP);
        ap_bit_clear(f, X86_FEATURE_RDPID);
        return true;
    }
    bool answered = ap_run_probes(f);
    if (ap_features_test(f, X86_FEATURE_RDTSCP) && ap_rdtscp_ok != 1)
        ap_bit_clear(f, X86_FEATURE_RDTSCP);
    if (ap_features_test(f, X86_FEATURE_RDPID) && ap_rdpid_ok != 1)
        ap_bit_clear(f, X86_FEATURE_RDPID);
    return answered;
}

/* The facts asked of the OS so far (AP_LEAVES_XCOMP, AP_LEAVES_SHSTK, AP_LEAVES_PROBE,
 * AP_LEAVES_KFLAGS). */
AP_STATE static unsigned ap_os_asked;

/* The set derived last, and the leaves read and facts asked it was derived
 * from: what follows from them is fixed for the process (the OS's answers
 * and the probes are asked once), so the same leaves and facts give the
 * same set without deriving it again (an apply after the first). */
AP_STATE static struct altpatch_features ap_derived;
AP_STATE static unsigned ap_derived_raw, ap_derived_os;
AP_STATE static bool ap_derived_any;

AP_HOT bool ap_host_leaves(unsigned groups, struct altpatch_features *out)
{
    uint32_t me = ap_token();
    if (ap_tlock_owner(&ap_leaves_mx) == me) {
        /* a signal handler that interrupted this thread in here */
        memset(out, 0, sizeof(*out));
        return false;
    }
    ap_tlock_lock(&ap_leaves_mx, me);
    ap_read_leaves(groups);
    ap_os_asked |= groups & (AP_LEAVES_XCOMP | AP_LEAVES_SHSTK | AP_LEAVES_PROBE | AP_LEAVES_KFLAGS);
    if (!ap_derived_any || ap_derived_raw != ap_raw_groups || ap_derived_os != ap_os_asked) {
        struct altpatch_features f = ap_raw;
        ap_mask_known(&f);
        ap_apply_os_enablement(&f, ap_os_asked);
        bool answered = ap_probe_instructions(&f, ap_os_asked);
        ap_derive_synthetic(&f);
        ap_derived = f;
        ap_derived_raw = ap_raw_groups;
        ap_derived_os = ap_os_asked;
        ap_derived_any = answered; /* not kept while a probe is unanswered */
    }
    *out = ap_derived;
    ap_tlock_unlock(&ap_leaves_mx);
    return true;
}

/*
 * The kernel's sync_core() serializes with SERIALIZE where the CPU has it and
 * otherwise with an IRET to self, because CPUID exits to the hypervisor in a
 * guest (1-6 us there, against well under one for the others). The same
 * choice here; IRET is left out on a thread running with a shadow stack (it
 * would expect a shadow-stack frame that nobody pushed), which is asked
 * (arch_prctl, this thread) only where CPUID claims shadow stacks. Which one
 * is known once leaf 7.0 was read for the features; where it was not (an
 * apply of a given feature set, or of records that name no feature of that
 * leaf) the C library's copy of the leaf tells, without an exit, and
 * without that copy (a C library that keeps none) leaves 0 and 7 are read
 * once: two exits for the process instead of one at every writing apply.
 */
int ap_sync_how(void)
{
    return __atomic_load_n(&ap_sync_kind, __ATOMIC_ACQUIRE);
}

AP_PLAIN_PATH void ap_sync_core(void)
{
    int kind = __atomic_load_n(&ap_sync_kind, __ATOMIC_ACQUIRE);
    if (kind == AP_SYNC_UNKNOWN) {
        struct ap_regs r = {0, 0, 0, 0};
        if (!ap_libc_leaf(7, 0, &r) && ap_cpuid(0, 0).a >= 7)
            r = ap_cpuid(7, 0); /* no copy (another C library): the leaf, once */
        kind = ap_sync_kind_of(r.c, r.d);
        __atomic_store_n(&ap_sync_kind, kind, __ATOMIC_RELEASE);
    }
    switch (kind) {
    case AP_SYNC_SERIALIZE:
        ap_serialize_insn();
        return;
    case AP_SYNC_IRET_UNLESS_SHSTK: {
        unsigned long st = 0;
        if (ap_sys(SYS_arch_prctl, ARCH_SHSTK_STATUS, (long)&st, 0, 0, 0) != 0 ||
            !(st & AP_ARCH_SHSTK_SHSTK)) {
            ap_serialize_iret();
            return;
        }
        break;
    }
    case AP_SYNC_IRET:
        ap_serialize_iret();
        return;
    default:
        break;
    }
    ap_serialize_cpuid();
}

AP_STATE static struct altpatch_features ap_host;
AP_STATE static pthread_once_t ap_host_once = PTHREAD_ONCE_INIT;

static void ap_host_detect(void)
{
    (void)ap_host_leaves(AP_LEAVES_ALL, &ap_host); /* empty only inside a query of this thread */
}

const struct altpatch_features *ap_host_features(void)
{
    pthread_once(&ap_host_once, ap_host_detect);
    return &ap_host;
}

ALTPATCH_API struct altpatch_features *altpatch_features_host(void)
{
    struct altpatch_features f;
    if (!ap_host_leaves(AP_LEAVES_ALL, &f)) { /* derived once, unless a probe was unanswered */
        errno = EDEADLK; /* from a signal handler that interrupted this thread's own query */
        return NULL;
    }
    return altpatch_features_dup(&f);
}

/* ------------------------------------------------------------------------- */
/* ALTPATCH_CLEARCPUID                                                       */
/* ------------------------------------------------------------------------- */

void ap_effective_features(struct altpatch_features *out)
{
    ap_effective_leaves_cleared(AP_LEAVES_ALL, ap_getenv("ALTPATCH_CLEARCPUID"), out);
}

/* Whether the clear list @p list (not NULL) names @p id. */
static bool ap_list_clears(const char *list, unsigned id)
{
    struct altpatch_features t;
    memset(&t, 0, sizeof(t));
    ap_bit_set(&t, id);
    ap_clear_names(&t, list, false);
    return !ap_features_test(&t, id);
}

AP_HOT void ap_effective_leaves_cleared(unsigned groups, const char *list,
                                 struct altpatch_features *out)
{
    /* The probe decides RDTSCP and RDPID only: where the list clears both it
     * is not run (a SIGILL guard, its system calls and a getcpu for bits
     * cleared right after). */
    if (list && (groups & AP_LEAVES_PROBE) && ap_list_clears(list, X86_FEATURE_RDTSCP) &&
        ap_list_clears(list, X86_FEATURE_RDPID))
        groups &= ~AP_LEAVES_PROBE;
    if (list && (groups & AP_LEAVES_KFLAGS) && ap_list_clears(list, X86_FEATURE_RDSEED))
        groups &= ~AP_LEAVES_KFLAGS; /* nor is /proc/cpuinfo read for RDSEED */
    (void)ap_host_leaves(groups, out); /* apply: never inside a query (ap_reentered()) */
    if (list)
        ap_clearcpuid(out, list);
}

ALTPATCH_API bool altpatch_cpu_has(unsigned feature)
{
    if (!ap_feature_known(feature))
        return false;
    const char *list = ap_getenv("ALTPATCH_CLEARCPUID");
    if (list && ap_list_clears(list, feature))
        return false; /* nothing asked (RDTSCP, RDPID: no probe) */
    struct altpatch_features f;
    if (!ap_host_leaves(ap_feature_leaves(feature), &f))
        return false; /* a signal handler that interrupted this thread's own query: unknown */
    return ap_features_test(&f, feature); /* apply warns of the list; a query stays quiet */
}

/* ------------------------------------------------------------------------- */
/* Profiles (features.c, and "host": this CPU)                                */
/* ------------------------------------------------------------------------- */

ALTPATCH_API struct altpatch_features *altpatch_features_profile(const char *name)
{
    if (!name) {
        errno = EINVAL;
        return NULL;
    }
    struct altpatch_features f;
    int r = ap_profile_fill(name, &f);
    if (r < 0) {
        errno = -r;
        return NULL;
    }
    if (r == AP_PROFILE_HOST)
        return altpatch_features_host();
    return altpatch_features_dup(&f);
}
