/* SPDX-License-Identifier: MIT */
/*
 * sz-versioned options, libbpf-style: the bytes a caller's (newer, larger)
 * struct holds past the last field this library knows must be zero. A field a
 * later version adds right after `flags` sits where the struct once had tail
 * padding: that is now the named field `reserved` (zeroed by every
 * initializer, unlike padding), and a non-zero value there is refused.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stddef.h>
#include <string.h>

#include <altpatch/altpatch.h>

/* A hypothetical next version: `extra` lands in the current tail padding. */
struct opts_next {
    size_t sz;
    const struct altpatch_features *features;
    unsigned flags;
    unsigned extra;
    unsigned long more;
};

Test(opts, no_padding)
{
    cr_assert_eq(sizeof(struct altpatch_apply_opts),
                 offsetof(struct altpatch_apply_opts, reserved) + sizeof(unsigned),
                 "every byte of the options is a named field");
}

Test(opts, field_after_flags_is_checked)
{
    size_t known = offsetof(struct altpatch_apply_opts, flags) + sizeof(unsigned);
    cr_assert_eq(offsetof(struct opts_next, extra), known, "layout assumption");
    struct opts_next o;
    memset(&o, 0, sizeof(o));
    o.sz = sizeof(o);
    o.flags = ALTPATCH_APPLY_DRY_RUN;
    cr_assert_eq(altpatch_apply_opts((const void *)&o), 0, "all-zero tail is fine");
    o.extra = 0xdead;
    cr_assert_eq(altpatch_apply_opts((const void *)&o), -EINVAL,
                 "a non-zero byte right after flags");
    o.sz = offsetof(struct opts_next, extra) + 1; /* even when sz ends inside the padding */
    cr_assert_eq(altpatch_apply_opts((const void *)&o), -EINVAL);
    o.extra = 0;
    o.more = 1;
    o.sz = sizeof(o);
    cr_assert_eq(altpatch_apply_opts((const void *)&o), -EINVAL, "a non-zero later field");
}

Test(opts, reserved_must_be_zero)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_DRY_RUN};
    cr_assert_eq(altpatch_apply_opts(&o), 0);
    o.reserved = 1;
    cr_assert_eq(altpatch_apply_opts(&o), -EINVAL);
    o.sz = offsetof(struct altpatch_apply_opts, reserved); /* an older, shorter struct */
    cr_assert_eq(altpatch_apply_opts(&o), 0, "bytes past sz are not read");
}
