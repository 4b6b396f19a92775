/* SPDX-License-Identifier: MIT */
/*
 * Expected bytes of the <altpatch/primitives.h> sites, shared by the fixture
 * programs (testdata/fixture.c, the module fixtures) and the tests.
 *
 * A site is recognised by its original bytes (the primitives use fixed
 * registers, so they are exact); its expected final bytes follow from a
 * feature predicate. ALTPATCH_ALT_CALL sites are recognised by their call
 * target, through a table of (old, new, ft_flags) the caller supplies.
 * Every encoding is written out in hex here on purpose: the tests must not
 * compute them with the code they test.
 */
#ifndef AP_EXPECT_H
#define AP_EXPECT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <altpatch/altpatch.h>
#include <altpatch/primitives.h>

/** Kinds of primitive sites. */
enum apx_kind {
    APX_UNKNOWN = 0,
    APX_FENCE,
    APX_FS,
    APX_GS,
    APX_GETCPU,
    APX_TSC,
    APX_CALL,
    APX__COUNT
};

static const char *const apx_kind_names[APX__COUNT] = {
    "unknown", "weak_fence", "fs_self", "gs_self", "getcpu", "rdtsc_ordered", "alt_call",
};

/* Original bytes. */
static const uint8_t apx_fence_orig[] = {0x0f, 0xae, 0xf0, 0x0f, 0xae, 0xe8};
static const uint8_t apx_fs_orig[] = {0x64, 0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00};
static const uint8_t apx_gs_orig[] = {0x65, 0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00};
static const uint8_t apx_getcpu_orig[] = {0xb9, 0xff, 0xff, 0xff, 0xff};
static const uint8_t apx_tsc_orig[] = {0x0f, 0x31, 0x90, 0x90, 0x90};

/* Replacements as they must appear at the site (replacement + NOP fill). */
static const uint8_t apx_fence_nop6[] = {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00};
static const uint8_t apx_rdfsbase[] = {0xf3, 0x48, 0x0f, 0xae, 0xc0, 0x0f, 0x1f, 0x40, 0x00};
static const uint8_t apx_rdgsbase[] = {0xf3, 0x48, 0x0f, 0xae, 0xc8, 0x0f, 0x1f, 0x40, 0x00};
static const uint8_t apx_rdpid[] = {0xf3, 0x0f, 0xc7, 0xf9, 0x90};
static const uint8_t apx_lfence_rdtsc[] = {0x0f, 0xae, 0xe8, 0x0f, 0x31};
static const uint8_t apx_rdtscp_nop2[] = {0x0f, 0x01, 0xf9, 0x66, 0x90};

/** Longest primitive site. */
#define AP_EXPECT_MAX 16

/** One ALTPATCH_ALT_CALL pair as the program wrote it. */
struct apx_call {
    uintptr_t oldfn, newfn;
    unsigned ft_flags; /* feature | ALT_NOT flag << 16 */
};

/** Feature predicate: is @p feature usable in the set the site was planned for? */
typedef bool (*apx_has_fn)(unsigned feature, void *ctx);

static inline bool apx_cond(apx_has_fn has, void *ctx, unsigned ft_flags)
{
    bool present = has(ft_flags & 0xffff, ctx);
    return ((ft_flags >> ALT_FLAGS_SHIFT) & ALT_FLAG_NOT) ? !present : present;
}

static inline uintptr_t apx_call_target(uintptr_t addr, const uint8_t *b)
{
    int32_t rel;
    memcpy(&rel, b + 1, 4);
    return addr + 5 + (intptr_t)rel;
}

/**
 * Recognise the site @p s (by its original bytes) and write the bytes it must
 * hold under @p has into @p out (s->len bytes). Returns its kind, APX_UNKNOWN
 * for a site that is no primitive (out untouched).
 */
static inline enum apx_kind apx_expect(const struct altpatch_site_info *s, apx_has_fn has,
                                       void *ctx, const struct apx_call *calls, size_t ncalls,
                                       uint8_t *out)
{
#define APX_IS(arr) (s->len == sizeof(arr) && memcmp(s->original, arr, sizeof(arr)) == 0)
#define APX_PUT(arr) memcpy(out, arr, sizeof(arr))
    if (APX_IS(apx_fence_orig)) {
        if (apx_cond(has, ctx, ALT_NOT(X86_FEATURE_APIC_MSRS_FENCE)))
            APX_PUT(apx_fence_nop6);
        else
            APX_PUT(apx_fence_orig);
        return APX_FENCE;
    }
    if (APX_IS(apx_fs_orig) || APX_IS(apx_gs_orig)) {
        bool fs = s->original[0] == 0x64;
        if (has(X86_FEATURE_FSGSBASE, ctx)) {
            if (fs)
                APX_PUT(apx_rdfsbase);
            else
                APX_PUT(apx_rdgsbase);
        } else {
            memcpy(out, s->original, s->len);
        }
        return fs ? APX_FS : APX_GS;
    }
    if (APX_IS(apx_getcpu_orig)) {
        if (has(X86_FEATURE_RDPID, ctx))
            APX_PUT(apx_rdpid);
        else
            APX_PUT(apx_getcpu_orig);
        return APX_GETCPU;
    }
    if (APX_IS(apx_tsc_orig) && s->entries == 2) {
        if (has(X86_FEATURE_RDTSCP, ctx))
            APX_PUT(apx_rdtscp_nop2);
        else if (has(X86_FEATURE_LFENCE_RDTSC, ctx))
            APX_PUT(apx_lfence_rdtsc);
        else
            APX_PUT(apx_tsc_orig);
        return APX_TSC;
    }
    if (s->len == 5 && s->original[0] == 0xe8) {
        uintptr_t target = apx_call_target(s->addr, s->original);
        for (size_t i = 0; i < ncalls; i++) {
            if (calls[i].oldfn != target)
                continue;
            uintptr_t dst = apx_cond(has, ctx, calls[i].ft_flags) ? calls[i].newfn : target;
            int32_t rel = (int32_t)(dst - (s->addr + 5));
            out[0] = 0xe8;
            memcpy(out + 1, &rel, 4);
            return APX_CALL;
        }
    }
    return APX_UNKNOWN;
#undef APX_IS
#undef APX_PUT
}

/** Hex of @p n bytes into @p buf ("0f ae f0"). */
static inline const char *apx_hex(const uint8_t *b, size_t n, char *buf, size_t bufsz)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o + 4 <= bufsz; i++)
        o += (size_t)snprintf(buf + o, bufsz - o, i ? " %02x" : "%02x", b[i]);
    return buf;
}

/** Feature predicate over an altpatch_features set (ctx). */
static inline bool apx_has_set(unsigned feature, void *ctx)
{
    return altpatch_features_has((const struct altpatch_features *)ctx, feature);
}

/** Feature predicate of the running process (altpatch_cpu_has, ctx unused). */
static inline bool apx_has_host(unsigned feature, void *ctx)
{
    (void)ctx;
    return altpatch_cpu_has(feature);
}

#endif /* AP_EXPECT_H */
