/* SPDX-License-Identifier: MIT */
/*
 * Hex helpers for the byte-buffer tests: write expected bytes as "0f 1f 00",
 * compare with what the code produced, and show both on failure.
 */
#ifndef AP_TEST_HEX_H
#define AP_TEST_HEX_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* "0f 1f 00" -> bytes; returns the count. */
static inline size_t hex(const char *s, uint8_t *out)
{
    size_t n = 0;
    unsigned v;
    int used;

    while (sscanf(s, " %2x%n", &v, &used) == 1) {
        out[n++] = (uint8_t)v;
        s += used;
    }
    return n;
}

/* bytes -> "0f 1f 00" into @out (3 chars a byte). */
static inline void to_hex(const uint8_t *b, size_t n, char *out)
{
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        sprintf(out + strlen(out), i ? " %02x" : "%02x", b[i]);
}

/* Assert that @got (len bytes) equals the hex string @want, showing both. */
static inline void expect_bytes(const uint8_t *got, size_t len, const char *want)
{
    uint8_t w[512];
    char gs[1600], ws[1600];
    size_t wn = hex(want, w);

    to_hex(got, len, gs);
    to_hex(w, wn, ws);
    cr_assert_eq(wn, len, "length: got %zu want %zu (%s vs %s)", len, wn, gs, ws);
    cr_assert_str_eq(gs, ws);
}

#endif /* AP_TEST_HEX_H */
