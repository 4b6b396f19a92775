/* SPDX-License-Identifier: MIT */
/*
 * features_bits.c - raw bit access to a feature set, for callers that plan
 * records in another feature numbering (a Linux version's) through the image
 * API: the set is the same bitmap, only the names differ.
 */
#include <errno.h>

#include "pure.h"

_Static_assert(ALTPATCH_FEATURE_BITS == 32 * AP_NCAPWORDS, "feature bitmap size");

ALTPATCH_API int altpatch_features_set_bit(struct altpatch_features *f, unsigned bit, bool on)
{
    if (!f || bit >= ALTPATCH_FEATURE_BITS)
        return -EINVAL;
    if (on)
        f->word[bit / 32] |= 1u << (bit % 32);
    else
        f->word[bit / 32] &= ~(1u << (bit % 32));
    return 0;
}

ALTPATCH_API bool altpatch_features_test_bit(const struct altpatch_features *f, unsigned bit)
{
    return f && bit < ALTPATCH_FEATURE_BITS && (f->word[bit / 32] >> (bit % 32) & 1u);
}
