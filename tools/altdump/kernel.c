/* SPDX-License-Identifier: MIT */
/*
 * The kernel front end (see kernel.h): version and layout of a Linux kernel
 * image's alternatives, its feature names, the feature set it sets on a CPU
 * profile, and ALT_FLAG_DIRECT_CALL. The records are decoded and planned by
 * the library (altpatch_image_open_regions with the version's layout, ids
 * and DIRECT_CALL as rules): nothing here decides a site.
 */
#include <ctype.h>
#include <elf.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "altdump.h"
#include "../common/cpuspec.h"

/* --- version and layout ---------------------------------------------------- */

void ad_kernel_set_release(struct ad_kernel *k, const char *s, size_t len, const char *source)
{
    size_t n = 0;
    while (n < len && n + 1 < sizeof(k->release) && s[n] && !isspace((unsigned char)s[n]))
        n++;
    char rel[sizeof(k->release)];
    memcpy(rel, s, n);
    rel[n] = '\0';
    int major = 0, minor = 0;
    const char *p = rel;
    if (!isdigit((unsigned char)*p))
        return;
    while (isdigit((unsigned char)*p) && major < 1000)
        major = major * 10 + (*p++ - '0');
    if (*p++ != '.' || !isdigit((unsigned char)*p))
        return;
    while (isdigit((unsigned char)*p) && minor < 1000)
        minor = minor * 10 + (*p++ - '0');
    if (major < 2 || major >= 1000 || minor >= 1000)
        return;
    k->major = major;
    k->minor = minor;
    memcpy(k->release, rel, n + 1);
    k->source = source;
}

static bool version_ge(const struct ad_kernel *k, int major, int minor)
{
    return k->major > major || (k->major == major && k->minor >= minor);
}

int ad_kernel_layout(struct ad_kernel *k, uint64_t size, char *err, size_t errsz)
{
    if (k->major) {
        bool newer = version_ge(k, 6, 3);
        k->record_size = newer ? AD_KREC_NEW : AD_KREC_OLD;
        k->layout_why = newer ? "version >= 6.3" : "version < 6.3";
    } else if (size % AD_KREC_NEW == 0 && size % AD_KREC_OLD != 0) {
        k->record_size = AD_KREC_NEW;
        k->layout_why = "no version found; size a multiple of 14 only";
    } else if (size % AD_KREC_OLD == 0 && size % AD_KREC_NEW != 0) {
        k->record_size = AD_KREC_OLD;
        k->layout_why = "no version found; size a multiple of 12 only";
    } else if (size == 0) {
        k->record_size = AD_KREC_NEW;
        k->layout_why = "no version found; empty table";
    } else {
        snprintf(err, errsz,
                 "kernel .altinstructions of %llu bytes and no kernel version in the image "
                 "(vermagic, linux_banner): cannot tell 12-byte from 14-byte records",
                 (unsigned long long)size);
        return AD_EXIT_BADINPUT;
    }
    if (size % k->record_size != 0) {
        snprintf(err, errsz,
                 "kernel .altinstructions holds %llu bytes, not a multiple of the %u-byte "
                 "record of Linux %s",
                 (unsigned long long)size, k->record_size, k->release[0] ? k->release : "?");
        return AD_EXIT_BADINPUT;
    }
    /* Numbering: the 6.1 table before 6.3, the 6.12 one from 6.3 (the record
     * size says which when the version is unknown). */
    const char *want = k->record_size == AD_KREC_NEW ? "6.12" : "6.1";
    k->tab = &ad_ktables[0];
    for (size_t i = 0; i < ad_nktables; i++)
        if (strcmp(ad_ktables[i].version, want) == 0)
            k->tab = &ad_ktables[i];
    return 0;
}

static const struct ad_kfeat *kfeat_by_id(const struct ad_ktable *t, unsigned id)
{
    for (size_t i = 0; t && i < t->n; i++)
        if (t->f[i].id == id)
            return &t->f[i];
    return NULL;
}

/* By the header's name (with or without X86_FEATURE_ / X86_), or the cpuinfo name. */
static const struct ad_kfeat *kfeat_by_name(const struct ad_ktable *t, const char *s, size_t len)
{
    if (len > 12 && strncasecmp(s, "X86_FEATURE_", 12) == 0)
        s += 12, len -= 12;
    else if (len > 8 && strncasecmp(s, "X86_BUG_", 8) == 0)
        s += 4, len -= 4;
    for (size_t i = 0; t && i < t->n; i++)
        if (strlen(t->f[i].name) == len && strncasecmp(t->f[i].name, s, len) == 0)
            return &t->f[i];
    for (size_t i = 0; t && i < t->n; i++)
        if (t->f[i].cpuinfo[0] && strlen(t->f[i].cpuinfo) == len &&
            strncasecmp(t->f[i].cpuinfo, s, len) == 0)
            return &t->f[i];
    return NULL;
}

const char *ad_kernel_feature_name(const struct ad_kernel *k, unsigned id)
{
    const struct ad_kfeat *f = kfeat_by_id(k->tab, id);
    return f ? f->name : NULL;
}

/* --- records --------------------------------------------------------------- */

static int32_t rd_s32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

unsigned ad_kernel_rules(const struct ad_image *img, unsigned *known, size_t *nknown)
{
    const struct ad_ktable *t = img->kernel.tab;
    *nknown = 0;
    for (size_t i = 0; t && i < t->n; i++)
        if (t->f[i].id < ALTPATCH_FEATURE_BITS && *nknown < ALTPATCH_FEATURE_BITS)
            known[(*nknown)++] = t->f[i].id;
    return img->kernel.record_size == AD_KREC_NEW ? AD_KALT_FLAG_DIRECT_CALL : 0u;
}

/* --- CPU profiles ---------------------------------------------------------- */

/*
 * What the kernel sets on top of CPUID on each profile: a model of
 * arch/x86/kernel/cpu (common.c, intel.c, amd.c, bugs.c) for the CPUs the
 * library's profiles stand for, with the default command line. Mitigation
 * choices (RETPOLINE, RETHUNK, UNRET, IBPB_ON_VMEXIT, ...) depend on the
 * command line and the microcode: none is set here; add them with +NAME.
 * Names absent from a version's table are skipped.
 */
struct kmodel {
    const char *profile;
    const char *const *names;
};

static const char *const k_common[] = {"ALWAYS", "CPUID", "NOPL", "XTOPOLOGY", NULL};
static const char *const k_baseline[] = {
    "BUG_SPECTRE_V1", "BUG_SPECTRE_V2", "BUG_SPEC_STORE_BYPASS", NULL};
static const char *const k_zen4[] = {
    "REP_GOOD", "CONSTANT_TSC", "NONSTOP_TSC", "TSC_KNOWN_FREQ", "LFENCE_RDTSC", "ZEN", "ZEN4",
    "BUG_SYSRET_SS_ATTRS", "BUG_SPECTRE_V1",
    "BUG_SPECTRE_V2", "BUG_SPEC_STORE_BYPASS", "BUG_SRSO", NULL};
static const char *const k_spr[] = {
    "REP_GOOD", "CONSTANT_TSC", "NONSTOP_TSC", "TSC_KNOWN_FREQ", "ART", "BUG_SPECTRE_V1",
    "BUG_SPECTRE_V2", "BUG_SPEC_STORE_BYPASS", "BUG_SWAPGS", "BUG_EIBRS_PBRSB", "BUG_BHI", NULL};

static const struct kmodel k_models[] = {
    {"baseline", k_baseline},
    {"amd-zen4", k_zen4},
    {"intel-spr", k_spr},
};

static void kset(struct altpatch_features *fs, unsigned id, bool on)
{
    (void)altpatch_features_set_bit(fs, id, on); /* ids past the bitmap: not representable */
}

static void kset_names(const struct ad_ktable *t, struct altpatch_features *fs,
                       const char *const *names)
{
    for (size_t i = 0; names[i]; i++) {
        const struct ad_kfeat *f = names[i][0] ? kfeat_by_name(t, names[i], strlen(names[i]))
                                               : NULL;
        if (f)
            kset(fs, f->id, true);
    }
}

/* The running kernel's own flags and bugs lines of /proc/cpuinfo (first CPU). */
static void kset_cpuinfo(const struct ad_ktable *t, struct altpatch_features *fs)
{
    FILE *f = fopen("/proc/cpuinfo", "re");
    char line[8192];
    int seen = 0;
    if (!f)
        return;
    while (seen < 2 && fgets(line, sizeof(line), f)) {
        bool bugs = strncmp(line, "bugs", 4) == 0;
        if (strncmp(line, "flags", 5) != 0 && !bugs)
            continue;
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        seen++;
        for (char *tok = strtok(colon + 1, " \t\n"); tok; tok = strtok(NULL, " \t\n")) {
            /* A bug name alone could also be a feature's: look for BUG_NAME first. */
            char b[96];
            const struct ad_kfeat *k = NULL;
            if (bugs && snprintf(b, sizeof(b), "BUG_%s", tok) < (int)sizeof(b))
                k = kfeat_by_name(t, b, strlen(b));
            if (!k)
                k = kfeat_by_name(t, tok, strlen(tok));
            if (k)
                kset(fs, k->id, true);
        }
    }
    fclose(f);
}

static int kedit_pass(const struct ad_ktable *t, struct altpatch_features *fs, const char *edits,
                      char *err, size_t errsz);

/* Apply "+NAME,-NAME,..." with the kernel's names; all or nothing. */
static int kedit(const struct ad_ktable *t, struct altpatch_features *fs, const char *edits,
                 char *err, size_t errsz)
{
    /* Two passes: every name checked before any is applied. */
    for (int apply = 0; apply < 2; apply++) {
        int rc = kedit_pass(t, apply ? fs : NULL, edits, err, errsz);
        if (rc)
            return rc;
    }
    return 0;
}

/* One pass of kedit(): with @p fs NULL only the names are checked. */
static int kedit_pass(const struct ad_ktable *t, struct altpatch_features *fs, const char *edits,
                      char *err, size_t errsz)
{
    const char *p = edits;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        bool on = true;
        const char *name = p;
        size_t nlen = len;
        if (len && (p[0] == '+' || p[0] == '-')) {
            on = p[0] == '+';
            name++, nlen--;
        }
        const struct ad_kfeat *f = nlen ? kfeat_by_name(t, name, nlen) : NULL;
        if (!f) {
            snprintf(err, errsz, "--cpu: '%.*s' is no X86_FEATURE or X86_BUG name of Linux %s",
                     (int)(nlen > 64 ? 64 : nlen), name, t->version);
            return AD_EXIT_USAGE;
        }
        if (fs)
            kset(fs, f->id, on);
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

int ad_kernel_cpu(const struct ad_image *img, const char *spec, struct altpatch_features **out,
                  char *err, size_t errsz)
{
    const struct ad_ktable *t = img->kernel.tab;
    char name[128];
    const char *edits;
    *out = NULL;
    struct altpatch_features *base =
        cpuspec_split(spec, name, sizeof(name), &edits) ? NULL : altpatch_features_profile(name);
    if (!base) {
        cpuspec_unknown(name, err, errsz);
        return AD_EXIT_USAGE;
    }
    /* The profile's vendor, none of its bits: the kernel numbers them its own way. */
    struct altpatch_features *fs = altpatch_features_dup(base);
    if (!fs) {
        altpatch_features_free(base);
        return AD_EXIT_INTERNAL;
    }
    for (unsigned id = 0; id < ALTPATCH_FEATURE_BITS; id++)
        kset(fs, id, false);
    if (strcmp(name, "all") == 0) {
        for (size_t i = 0; i < t->n; i++)
            kset(fs, t->f[i].id, true);
    } else {
        /* The CPUID features of the profile, carried over by name. */
        for (unsigned id = 0; id < ALTPATCH_FEATURE_BITS; id++) {
            const char *ln = altpatch_features_test_bit(base, id) ? altpatch_feature_name(id) : NULL;
            const struct ad_kfeat *f = ln ? kfeat_by_name(t, ln, strlen(ln)) : NULL;
            if (f)
                kset(fs, f->id, true);
        }
        kset_names(t, fs, k_common);
        if (strcmp(name, "host") == 0)
            kset_cpuinfo(t, fs);
        for (size_t i = 0; i < sizeof(k_models) / sizeof(k_models[0]); i++)
            if (strcmp(name, k_models[i].profile) == 0)
                kset_names(t, fs, k_models[i].names);
    }
    altpatch_features_free(base);
    int rc = edits && *edits ? kedit(t, fs, edits, err, errsz) : 0;
    if (rc) {
        altpatch_features_free(fs);
        return rc;
    }
    *out = fs;
    return 0;
}

/* --- ALT_FLAG_DIRECT_CALL -------------------------------------------------- */

/*
 * The kernel (alt_replace_call, 6.10 on) takes such an entry only for an
 * original "call *disp32(%rip)" (ff 15, 6 bytes) and a replacement
 * "call BUG_func": it reads the 8-byte function pointer the original calls
 * through and writes "call TARGET; nop" (a zero pointer stays BUG_func; a
 * pointer to nop_func leaves no call at all: the site becomes NOPs). The
 * pointer's value in the image is its static initialiser (pv_ops: the native
 * functions); a Xen PV guest changes it before alternatives run.
 */
/* x86's 6-byte NOP (66 0f 1f 44 00 00), what the kernel writes over a call to nop_func. */
static const uint8_t k_nop6[6] = {0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00};

void ad_kernel_direct_calls(const struct ad_image *img, struct ad_plan *plans)
{
    for (size_t i = 0; i < img->nsites; i++) {
        struct ad_plan *p = &plans[i];
        const struct ad_site *s = &img->sites[i];
        if (p->reason != ALTPATCH_REASON_NONE || p->chosen < 0)
            continue;
        const struct ad_entry *e = &img->entries[s->first + (unsigned)p->chosen];
        if (!(e->flags & AD_KALT_FLAG_DIRECT_CALL))
            continue;
        if (p->len != 6 || p->orig[0] != 0xff || p->orig[1] != 0x15 || e->repllen != 5) {
            snprintf(p->detail, sizeof(p->detail),
                     "direct call: original is not call *disp32(%%rip) or replacement not a "
                     "5-byte call (the kernel stops here)");
            continue;
        }
        uint64_t slot = s->addr + 6 + (uint64_t)(int64_t)rd_s32(p->orig + 2);
        const uint8_t *v = ad_bytes_at(img, slot, 8);
        uint64_t target = 0;
        for (int k = 7; v && k >= 0; k--)
            target = target << 8 | v[k];
        int64_t rel = (int64_t)(target - (s->addr + 5));
        if (!v || target == 0 || img->elf_type == ET_REL || rel != (int32_t)rel) {
            /* Shown as the original: the indirect call reaches what the kernel's direct
             * call will. */
            char ssym[64];
            ad_symbol_ref(img, slot, ssym, sizeof(ssym));
            memcpy(p->final, p->orig, p->len);
            snprintf(p->detail, sizeof(p->detail),
                     "direct call via *0x%llx%.64s: target decided at boot (final shows the "
                     "indirect call)",
                     (unsigned long long)slot, ssym);
            continue;
        }
        char sym[64], ssym[64];
        uint64_t off = 1;
        const struct ad_symbol *ts = ad_symbol_at(img, target, &off);
        if (ts && off == 0 && strcmp(ts->name, "nop_func") == 0) {
            /* alt_replace_call returns length 0 for nop_func: the site becomes NOPs */
            memcpy(p->final, k_nop6, sizeof(k_nop6)); /* p->len is 6, checked above */
            ad_symbol_ref(img, slot, ssym, sizeof(ssym));
            snprintf(p->detail, sizeof(p->detail),
                     "direct call via *0x%llx%.40s: nop_func, the call becomes NOPs",
                     (unsigned long long)slot, ssym);
            continue;
        }
        p->final[0] = 0xe8;
        for (int k = 0; k < 4; k++)
            p->final[1 + k] = (uint8_t)((uint64_t)rel >> (8 * k));
        p->final[5] = 0x90;
        ad_symbol_ref(img, target, sym, sizeof(sym));
        ad_symbol_ref(img, slot, ssym, sizeof(ssym));
        snprintf(p->detail, sizeof(p->detail), "direct call via *0x%llx%.40s: 0x%llx%.64s",
                 (unsigned long long)slot, ssym, (unsigned long long)target, sym);
    }
}
