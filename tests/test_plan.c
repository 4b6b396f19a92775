/* SPDX-License-Identifier: MIT */
/*
 * The pure planner (plan.c) on hand-made views: a text region and an
 * altinstr_replacement region at made-up addresses, entries built by hand,
 * feature sets built bit by bit. Every test compares exact final bytes; every
 * refusal also checks final == orig.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ap_hex.h"
#include "plan.h"

#define TEXT 0x401000ull
#define REPL 0x402000ull
#define FEAT_UNKNOWN 1023u /* word 31, bit 31: no such feature */




/* One module: text at TEXT, replacements at REPL, entries for one site. */
struct fx {
    uint8_t text[256];
    uint8_t repl[256];
    struct ap_view v;
    struct ap_entry e[4];
    uint32_t ne;
    struct ap_site s;
    struct altpatch_features fs;
    struct ap_plan p;
    struct ap_plan plan_p;
};

static void fx_init(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    memset(f->text, 0xcc, sizeof(f->text));
    memset(f->repl, 0xcc, sizeof(f->repl));
    f->v.text[0] = (struct ap_region){TEXT, sizeof(f->text), f->text};
    f->v.ntext = 1;
    f->v.repl = (struct ap_region){REPL, sizeof(f->repl), f->repl};
}

/* Original bytes at TEXT + @off. */
static size_t put_orig(struct fx *f, size_t off, const char *h)
{
    return hex(h, f->text + off);
}

/* An entry for the site at TEXT + @site_off, replacement @h at REPL + @repl_off. */
static struct ap_entry *add_entry(struct fx *f, size_t site_off, size_t repl_off, const char *h,
                                  uint32_t ft_flags, uint8_t instrlen)
{
    struct ap_entry *e = &f->e[f->ne];

    *e = (struct ap_entry){
        .site = TEXT + site_off,
        .repl = REPL + repl_off,
        .feature = (uint16_t)(ft_flags & 0xffff),
        .flags = (uint16_t)(ft_flags >> ALT_FLAGS_SHIFT),
        .instrlen = instrlen,
        .repllen = (uint8_t)hex(h, f->repl + repl_off),
        .index = f->ne,
    };
    f->ne++;
    return e;
}

static void feat(struct fx *f, unsigned id)
{
    f->fs.word[id / 32] |= 1u << (id % 32);
}

/* Group the entries (as record.c does) and plan the single site. */
static void plan(struct fx *f, const uint8_t *orig)
{
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(f->e, f->ne, &s, &n), 0);
    cr_assert_eq(n, 1, "one site");
    f->s = s[0];
    free(s);
    ap_plan_site(&f->v, &f->s, f->e, orig, &f->fs, &f->p);
}

static void expect_chosen(struct fx *f, int chosen, const char *final)
{
    cr_assert_eq(f->p.reason, ALTPATCH_REASON_NONE, "reason %d: %s", f->p.reason, f->p.detail);
    cr_assert_eq(f->p.chosen, chosen, "chosen %d, want %d", f->p.chosen, chosen);
    cr_assert_eq(f->p.bad_entry, -1);
    cr_assert_eq(f->p.len, f->s.len);
    expect_bytes(f->p.final, f->p.len, final);
}

/* No replacement: final must be the original, byte for byte. */
static void expect_original(struct fx *f)
{
    cr_assert_eq(f->p.reason, ALTPATCH_REASON_NONE, "reason %d: %s", f->p.reason, f->p.detail);
    cr_assert_eq(f->p.chosen, -1);
    cr_assert_arr_eq(f->p.orig, f->text + (f->s.addr - TEXT), f->s.len);
    cr_assert_arr_eq(f->p.final, f->p.orig, f->s.len);
}

static void expect_refused(struct fx *f, int reason, int bad_entry)
{
    cr_assert_eq(f->p.reason, reason, "reason %d (%s), want %d", f->p.reason, f->p.detail,
                 reason);
    cr_assert_eq(f->p.bad_entry, bad_entry, "bad_entry %d, want %d", f->p.bad_entry, bad_entry);
    cr_assert_eq(f->p.chosen, -1);
    cr_assert_arr_eq(f->p.final, f->p.orig, f->p.len, "refused: final == orig");
    cr_assert_neq(f->p.detail[0], '\0', "a refusal says why");
}

/* ------------------------------------------------------------------------- */

Test(plan, replacement_selected_and_padded)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0x10, "64 48 8b 04 25 00 00 00 00");        /* mov %fs:0,%rax */
    add_entry(&f, 0x10, 0, "f3 48 0f ae c0", X86_FEATURE_FSGSBASE, 9); /* rdfsbase %rax */
    feat(&f, X86_FEATURE_FSGSBASE);
    plan(&f, NULL);
    expect_chosen(&f, 0, "f3 48 0f ae c0 0f 1f 40 00");
    cr_assert_arr_eq(f.p.orig, f.text + 0x10, 9);
}

Test(plan, feature_absent_keeps_original)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0x10, "64 48 8b 04 25 00 00 00 00");
    add_entry(&f, 0x10, 0, "f3 48 0f ae c0", X86_FEATURE_FSGSBASE, 9);
    feat(&f, X86_FEATURE_RDPID); /* something else */
    plan(&f, NULL);
    expect_original(&f);
}

Test(plan, alt_not_and_empty_replacement)
{
    struct fx f;

    /* weak fence: mfence; lfence -> nothing where APIC_MSRS_FENCE is clear */
    fx_init(&f);
    put_orig(&f, 0, "0f ae f0 0f ae e8");
    add_entry(&f, 0, 0, "", ALT_NOT(X86_FEATURE_APIC_MSRS_FENCE), 6);
    plan(&f, NULL);
    expect_chosen(&f, 0, "66 0f 1f 44 00 00");

    feat(&f, X86_FEATURE_APIC_MSRS_FENCE);
    plan(&f, NULL);
    expect_original(&f);
}

/* rdtsc_ordered: ALTERNATIVE_2("rdtsc", "lfence; rdtsc", LFENCE_RDTSC, "rdtscp", RDTSCP) */
static void fx_rdtsc(struct fx *f)
{
    fx_init(f);
    put_orig(f, 0x20, "0f 31 90 90 90");
    add_entry(f, 0x20, 0, "0f ae e8 0f 31", X86_FEATURE_LFENCE_RDTSC, 5);
    add_entry(f, 0x20, 5, "0f 01 f9", X86_FEATURE_RDTSCP, 5);
}

Test(plan, nested_last_eligible_wins)
{
    struct fx f;

    fx_rdtsc(&f);
    feat(&f, X86_FEATURE_LFENCE_RDTSC);
    feat(&f, X86_FEATURE_RDTSCP);
    plan(&f, NULL);
    expect_chosen(&f, 1, "0f 01 f9 66 90");

    fx_rdtsc(&f);
    feat(&f, X86_FEATURE_LFENCE_RDTSC);
    plan(&f, NULL);
    expect_chosen(&f, 0, "0f ae e8 0f 31");

    fx_rdtsc(&f);
    feat(&f, X86_FEATURE_RDTSCP);
    plan(&f, NULL);
    expect_chosen(&f, 1, "0f 01 f9 66 90");
}

Test(plan, nested_none_eligible_is_byte_identical)
{
    struct fx f;

    /* the 0x90 padding of the original is NOT folded: nothing to write */
    fx_rdtsc(&f);
    plan(&f, NULL);
    expect_original(&f);
    expect_bytes(f.p.final, 5, "0f 31 90 90 90");
}

Test(plan, nested_inner_entry_shorter_than_site)
{
    struct fx f;

    /* ALTERNATIVE_2("nop", "lfence", ERMS, "mov $1,%rax", FSRM): the inner
     * entry covers 3 bytes, the outer one 7; the site is 7 bytes long. */
    fx_init(&f);
    put_orig(&f, 0, "90 90 90 90 90 90 90");
    add_entry(&f, 0, 0, "0f ae e8", X86_FEATURE_ERMS, 3);
    add_entry(&f, 0, 3, "48 c7 c0 01 00 00 00", X86_FEATURE_FSRM, 7);
    feat(&f, X86_FEATURE_ERMS);
    plan(&f, NULL);
    cr_assert_eq(f.s.len, 7);
    expect_chosen(&f, 0, "0f ae e8 0f 1f 40 00");

    feat(&f, X86_FEATURE_FSRM);
    plan(&f, NULL);
    expect_chosen(&f, 1, "48 c7 c0 01 00 00 00");

    memset(&f.fs, 0, sizeof(f.fs));
    plan(&f, NULL);
    expect_original(&f);
}

Test(plan, nested_alt_not)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0, "0f 31 90 90 90");
    add_entry(&f, 0, 0, "0f ae e8 0f 31", ALT_NOT(X86_FEATURE_RDTSCP), 5);
    add_entry(&f, 0, 5, "0f 01 f9", X86_FEATURE_RDTSCP, 5);
    plan(&f, NULL);
    expect_chosen(&f, 0, "0f ae e8 0f 31");
    feat(&f, X86_FEATURE_RDTSCP);
    plan(&f, NULL);
    expect_chosen(&f, 1, "0f 01 f9 66 90");
}

Test(plan, call_rel32_relocated)
{
    struct fx f;

    /* site at TEXT+0x10: call impl_a (TEXT+0x80); replacement at REPL: call
     * impl_b (TEXT+0xa0), assembled there as rel = 0x4010a0 - 0x402005. */
    fx_init(&f);
    put_orig(&f, 0x10, "e8 6b 00 00 00");
    add_entry(&f, 0x10, 0, "e8 9b f0 ff ff", X86_FEATURE_ALWAYS, 5);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    /* at the site: 0x4010a0 - 0x401015 = 0x8b */
    expect_chosen(&f, 0, "e8 8b 00 00 00");
}

Test(plan, jmp_and_jcc_rel32_relocated)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0x10, "48 89 c7 90 90 90 90 90 90 90 90");
    /* je TEXT+0x80 ; jmp TEXT+0x90, assembled at REPL+0x40 */
    add_entry(&f, 0x10, 0x40, "0f 84 3a f0 ff ff e9 45 f0 ff ff", X86_FEATURE_ALWAYS, 11);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    /* je: 0x401080 - 0x401016 = 0x6a ; jmp: 0x401090 - 0x40101b = 0x75 */
    expect_chosen(&f, 0, "0f 84 6a 00 00 00 e9 75 00 00 00");
}

Test(plan, rip_relative_relocated)
{
    struct fx f;

    /* mov 0x4010f0(%rip),%rax assembled at REPL+0x20: 0x4010f0 - 0x402027 */
    fx_init(&f);
    put_orig(&f, 0x10, "48 c7 c0 00 00 00 00");
    add_entry(&f, 0x10, 0x20, "48 8b 05 c9 f0 ff ff", X86_FEATURE_ALWAYS, 7);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    /* at the site: 0x4010f0 - 0x401017 = 0xd9 */
    expect_chosen(&f, 0, "48 8b 05 d9 00 00 00");
}

Test(plan, jcc_rel8_inside_replacement_kept)
{
    struct fx f;

    /* jne 1f; ud2; 1:  -- the target is the end of the replacement */
    fx_init(&f);
    put_orig(&f, 0, "48 89 c7 48 89 c6 90 90");
    add_entry(&f, 0, 0, "75 02 0f 0b", X86_FEATURE_ALWAYS, 8);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_chosen(&f, 0, "75 02 0f 0b 0f 1f 40 00");
}

Test(plan, nop_runs_not_folded_across_branch_targets)
{
    struct fx f;

    /* jne 1f; nop; 1:  + 3 bytes of padding. Folding the nop with the
     * padding would put the jne's target inside a 4-byte NOP. */
    fx_init(&f);
    put_orig(&f, 0, "48 89 c7 48 89 c6");
    add_entry(&f, 0, 0, "75 01 90", X86_FEATURE_ALWAYS, 6);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_chosen(&f, 0, "75 01 90 0f 1f 00");

    /* jne to the middle of a run of three nops: two runs folded separately */
    fx_init(&f);
    put_orig(&f, 0, "48 89 c7 90 90");
    add_entry(&f, 0, 0, "75 02 90 90 90", X86_FEATURE_ALWAYS, 5);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_chosen(&f, 0, "75 02 66 90 90");
}

Test(plan, nops_of_replacement_merge_with_padding)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0, "48 89 c7 48 89 c6 90");
    add_entry(&f, 0, 0, "0f ae e8 90 90", X86_FEATURE_ALWAYS, 7);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_chosen(&f, 0, "0f ae e8 0f 1f 40 00");
}

Test(plan, pause_in_replacement_kept)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0, "90 90 90 90 90 90");
    add_entry(&f, 0, 0, "90 f3 90 90", X86_FEATURE_ALWAYS, 6);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_chosen(&f, 0, "90 f3 90 0f 1f 00");
}

Test(plan, long_padding_jumps_over_int3)
{
    struct fx f;

    fx_init(&f);
    memset(f.text, 0x90, 20);
    add_entry(&f, 0, 0, "0f 0b", X86_FEATURE_ALWAYS, 20);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_chosen(&f, 0, "0f 0b eb 10 cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc cc");
}

Test(plan, caller_supplied_original)
{
    struct fx f;
    uint8_t saved[9];

    /* memory already holds the patch; the caller kept the original */
    fx_init(&f);
    hex("64 48 8b 04 25 00 00 00 00", saved);
    put_orig(&f, 0x10, "f3 48 0f ae c0 0f 1f 40 00");
    add_entry(&f, 0x10, 0, "f3 48 0f ae c0", X86_FEATURE_FSGSBASE, 9);
    plan(&f, saved);
    cr_assert_eq(f.p.reason, 0);
    cr_assert_eq(f.p.chosen, -1);
    cr_assert_arr_eq(f.p.orig, saved, 9);
    cr_assert_arr_eq(f.p.final, saved, 9, "final is the saved original, not memory");
}

Test(plan, second_text_region)
{
    struct fx f;
    uint8_t other[16];

    fx_init(&f);
    hex("64 48 8b 04 25 00 00 00 00", other);
    f.v.text[1] = (struct ap_region){0x600000, sizeof(other), other};
    f.v.ntext = 2;
    add_entry(&f, 0, 0, "f3 48 0f ae c0", X86_FEATURE_FSGSBASE, 9);
    f.e[0].site = 0x600000;
    feat(&f, X86_FEATURE_FSGSBASE);
    plan(&f, NULL);
    cr_assert_eq(f.p.reason, 0, "%s", f.p.detail);
    expect_bytes(f.p.final, 9, "f3 48 0f ae c0 0f 1f 40 00");
}

/* ------------------------------------------------------------------------- */
/* Refusals: one test per reason the planner produces                         */
/* ------------------------------------------------------------------------- */

/* A valid 9-byte site with one valid, eligible entry. */
static void fx_ok(struct fx *f)
{
    fx_init(f);
    put_orig(f, 0x10, "64 48 8b 04 25 00 00 00 00");
    add_entry(f, 0x10, 0, "f3 48 0f ae c0", X86_FEATURE_FSGSBASE, 9);
    feat(f, X86_FEATURE_FSGSBASE);
}

Test(refuse, preset_reasons)
{
    struct fx f;
    int reasons[] = {ALTPATCH_REASON_SITE_OVERLAP, ALTPATCH_REASON_EMPTY_SITE};

    for (size_t i = 0; i < 2; i++) {
        fx_ok(&f);
        plan(&f, NULL);
        cr_assert_eq(f.p.chosen, 0);
        f.s.reason = reasons[i];
        ap_plan_site(&f.v, &f.s, f.e, NULL, &f.fs, &f.p);
        expect_refused(&f, reasons[i], -1);
        cr_assert_arr_eq(f.p.orig, f.text + 0x10, 9);
    }
}

Test(refuse, empty_site)
{
    struct fx f;

    fx_init(&f);
    add_entry(&f, 0x10, 0, "", X86_FEATURE_ALWAYS, 0);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_EMPTY_SITE, -1);
}

Test(refuse, site_bounds)
{
    struct fx f;

    fx_ok(&f);
    f.e[0].site = TEXT - 1;
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_SITE_BOUNDS, -1);

    fx_ok(&f);
    f.e[0].site = TEXT + sizeof(f.text) - 8; /* last byte one past the end */
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_SITE_BOUNDS, -1);

    fx_ok(&f);
    f.e[0].site = UINT64_MAX - 3; /* wraps */
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_SITE_BOUNDS, -1);

    fx_ok(&f);
    f.v.text[0].data = NULL; /* no bytes and no saved original */
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_SITE_BOUNDS, -1);
}

Test(refuse, site_at_the_very_end_is_fine)
{
    struct fx f;

    fx_ok(&f);
    put_orig(&f, sizeof(f.text) - 9, "64 48 8b 04 25 00 00 00 00");
    f.e[0].site = TEXT + sizeof(f.text) - 9;
    plan(&f, NULL);
    expect_chosen(&f, 0, "f3 48 0f ae c0 0f 1f 40 00");
}

Test(refuse, orig_undecodable)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0, "90 06 90 90 90");
    add_entry(&f, 0, 0, "0f 01 f9", X86_FEATURE_ALWAYS, 5);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_ORIG_UNDECODABLE, -1);
    expect_bytes(f.p.final, 5, "90 06 90 90 90");
}

Test(refuse, orig_crosses_end)
{
    struct fx f;

    /* a call cut by the site end: the text goes on, the site does not */
    fx_init(&f);
    put_orig(&f, 0, "90 e8 00 00 00 00");
    add_entry(&f, 0, 0, "0f 01 f9", X86_FEATURE_ALWAYS, 4);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_ORIG_CROSSES_END, -1);
    expect_bytes(f.p.final, 4, "90 e8 00 00");
}

Test(refuse, unknown_feature)
{
    struct fx f;

    cr_assert_not(ap_feature_known(FEAT_UNKNOWN));
    fx_ok(&f);
    f.e[0].feature = FEAT_UNKNOWN;
    feat(&f, FEAT_UNKNOWN);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_UNKNOWN_FEATURE, 0);
}

Test(refuse, repl_too_long)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0, "0f 31 90 90");
    add_entry(&f, 0, 0, "0f ae e8 0f 31", X86_FEATURE_ALWAYS, 4);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_TOO_LONG, 0);
}

Test(refuse, repl_bounds)
{
    struct fx f;

    fx_ok(&f);
    f.e[0].repl = REPL - 1;
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_BOUNDS, 0);

    fx_ok(&f);
    f.e[0].repl = REPL + sizeof(f.repl) - 4; /* 5 bytes, 4 left */
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_BOUNDS, 0);

    fx_ok(&f);
    f.e[0].repl = TEXT + 0x10; /* in the text, not in altinstr_replacement */
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_BOUNDS, 0);

    fx_ok(&f);
    f.v.repl.data = NULL;
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_BOUNDS, 0);
}

Test(refuse, repl_undecodable)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0, "0f 31 90 90");
    add_entry(&f, 0, 0, "90 06", X86_FEATURE_ALWAYS, 4);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_UNDECODABLE, 0);
}

Test(refuse, repl_crosses_end)
{
    struct fx f;

    fx_init(&f);
    put_orig(&f, 0, "0f 31 90 90");
    add_entry(&f, 0, 0, "90 e8 00", X86_FEATURE_ALWAYS, 4);
    f.repl[3] = 0; /* the bytes after the replacement would complete it */
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_CROSSES_END, 0);
}

Test(refuse, reloc_overflow_rel8)
{
    struct fx f;

    /* jmp rel8 to outside the replacement: 4 KiB away from the site */
    fx_init(&f);
    put_orig(&f, 0, "0f 31 90 90");
    add_entry(&f, 0, 0, "eb 10", X86_FEATURE_ALWAYS, 4);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_RELOC_OVERFLOW, 0);
    cr_assert(strstr(f.p.detail, "rel8") != NULL, "%s", f.p.detail);
}

Test(refuse, reloc_overflow_rel32_4gib)
{
    struct fx f;

    fx_init(&f);
    f.v.repl.addr = TEXT + (4ull << 30);
    put_orig(&f, 0, "e8 00 00 00 00");
    add_entry(&f, 0, 0, "e8 10 00 00 00", X86_FEATURE_ALWAYS, 5);
    f.e[0].repl = f.v.repl.addr;
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_RELOC_OVERFLOW, 0);
    cr_assert(strstr(f.p.detail, "rel32") != NULL, "%s", f.p.detail);
}

Test(refuse, does_not_depend_on_the_cpu)
{
    struct fx f;

    /* entry 0 valid and eligible, entry 1 bad but not eligible */
    fx_init(&f);
    put_orig(&f, 0, "0f 31 90 90 90");
    add_entry(&f, 0, 0, "0f ae e8 0f 31", X86_FEATURE_ALWAYS, 5);
    add_entry(&f, 0, 5, "90 06", X86_FEATURE_RDTSCP, 5);
    feat(&f, X86_FEATURE_ALWAYS);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_UNDECODABLE, 1);
    /* with no feature at all: the same refusal */
    memset(&f.fs, 0, sizeof(f.fs));
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_UNDECODABLE, 1);
}

Test(refuse, first_reason_in_check_order)
{
    struct fx f;

    /* unknown feature AND too long AND out of bounds: the feature first */
    fx_init(&f);
    put_orig(&f, 0, "0f 31 90 90");
    add_entry(&f, 0, 0, "0f ae e8 0f 31", FEAT_UNKNOWN, 4);
    f.e[0].repl = REPL - 0x100;
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_UNKNOWN_FEATURE, 0);
    /* too long AND out of bounds: too long */
    f.e[0].feature = X86_FEATURE_ALWAYS;
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_TOO_LONG, 0);
    /* undecodable after an overflowing branch: undecodable */
    fx_init(&f);
    put_orig(&f, 0, "0f 31 90 90");
    add_entry(&f, 0, 0, "eb 10 06", X86_FEATURE_ALWAYS, 4);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_REPL_UNDECODABLE, 0);
    /* a site refusal comes before any entry refusal */
    fx_init(&f);
    put_orig(&f, 0, "06 90 90 90");
    add_entry(&f, 0, 0, "90 06", FEAT_UNKNOWN, 4);
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_ORIG_UNDECODABLE, -1);
}

/* ------------------------------------------------------------------------- */

Test(view, text_lookup)
{
    uint8_t a[16], b[8];
    struct ap_view v = {0};

    v.text[0] = (struct ap_region){0x1000, sizeof(a), a};
    v.text[1] = (struct ap_region){0x2000, sizeof(b), NULL};
    v.text[2] = (struct ap_region){0x3000, sizeof(b), b};
    v.ntext = 3;
    cr_assert_eq(ap_view_text(&v, 0x1000, 16), a);
    cr_assert_eq(ap_view_text(&v, 0x1004, 4), a + 4);
    cr_assert_null(ap_view_text(&v, 0x1004, 13), "straddles the end");
    cr_assert_null(ap_view_text(&v, 0xfff, 2), "straddles the start");
    cr_assert_null(ap_view_text(&v, 0x2000, 1), "no bytes");
    cr_assert_eq(ap_view_text(&v, 0x3007, 1), b + 7);
    cr_assert_null(ap_view_text(&v, UINT64_MAX, 2), "wraps");
    v.ntext = 2;
    cr_assert_null(ap_view_text(&v, 0x3007, 1), "only ntext regions count");
}

Test(eligible, present_xor_not)
{
    struct altpatch_features fs = {0};
    struct ap_entry e = {.feature = X86_FEATURE_RDPID};

    cr_assert_not(ap_entry_eligible(&e, &fs));
    e.flags = ALT_FLAG_NOT;
    cr_assert(ap_entry_eligible(&e, &fs));
    fs.word[X86_FEATURE_RDPID / 32] |= 1u << (X86_FEATURE_RDPID % 32);
    cr_assert_not(ap_entry_eligible(&e, &fs));
    e.flags = 0;
    cr_assert(ap_entry_eligible(&e, &fs));
    cr_assert_not(ap_entry_eligible(&e, NULL), "NULL set: nothing present");
}

/* ------------------------------------------------------------------------- */
/* A caller's own dialect (ap_plan_site_rules): its feature ids and flags    */
/* ------------------------------------------------------------------------- */

/* The kernel's X86_BUG_SPECTRE_V1 (22*32+15) and ALT_FLAG_DIRECT_CALL (1 << 1). */
#define K_BUG (22u * 32u + 15u)
#define K_DIRECT_CALL 2u

static void plan_rules(struct fx *f, const struct ap_plan_rules *rules)
{
    struct ap_site *s;
    size_t n;

    cr_assert_eq(ap_sites_group(f->e, f->ne, &s, &n), 0);
    cr_assert_eq(n, 1, "one site");
    f->s = s[0];
    free(s);
    ap_plan_site_rules(&f->v, &f->s, f->e, NULL, &f->fs, rules, &f->plan_p);
    f->p = f->plan_p;
}

Test(rules, caller_ids_and_flags)
{
    struct fx f;
    struct ap_plan_rules rules;

    cr_assert_not(ap_feature_known(K_BUG), "not a feature of this library");
    memset(&rules, 0, sizeof(rules));
    rules.known[K_BUG / 32] |= 1u << (K_BUG % 32);
    rules.flags = K_DIRECT_CALL;

    /* the caller's id: planned (and eligible by the set's bit) */
    fx_init(&f);
    put_orig(&f, 0, "90 90 90");
    add_entry(&f, 0, 0, "0f ae e8", K_BUG, 3); /* lfence */
    feat(&f, K_BUG);
    plan_rules(&f, &rules);
    expect_chosen(&f, 0, "0f ae e8");
    /* without the rules: unknown to this library */
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_UNKNOWN_FEATURE, 0);

    /* a flag the caller resolves: validated and planned like a plain entry */
    fx_init(&f);
    put_orig(&f, 0x10, "e8 00 00 00 00");
    add_entry(&f, 0x10, 0, "e8 10 00 00 00", (K_DIRECT_CALL << ALT_FLAGS_SHIFT) | K_BUG, 5);
    feat(&f, K_BUG);
    plan_rules(&f, &rules);
    /* call rel32 relocated from REPL to TEXT+0x10: the target REPL+0x15 stays the target */
    expect_chosen(&f, 0, "e8 00 10 00 00");
    plan(&f, NULL);
    expect_refused(&f, ALTPATCH_REASON_UNKNOWN_FEATURE, 0);
    /* a known id with a flag the caller did not declare: refused as before */
    rules.flags = 0;
    plan_rules(&f, &rules);
    expect_refused(&f, ALTPATCH_REASON_UNKNOWN_FLAGS, 0);
    /* ids the caller does not list are unknown, even this library's */
    memset(&rules, 0, sizeof(rules));
    fx_init(&f);
    put_orig(&f, 0, "64 48 8b 04 25 00 00 00 00");
    add_entry(&f, 0, 0, "f3 48 0f ae c0", X86_FEATURE_FSGSBASE, 9);
    feat(&f, X86_FEATURE_FSGSBASE);
    plan_rules(&f, &rules);
    expect_refused(&f, ALTPATCH_REASON_UNKNOWN_FEATURE, 0);
}
