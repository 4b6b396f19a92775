/* SPDX-License-Identifier: MIT */
/*
 * What the fixture programs share: failure reporting and the callees of
 * their ALTPATCH_ALT_CALL sites. Define AP_FIXTURE_NAME (a string: what a
 * FAIL line starts with) before including it.
 */
#ifndef AP_FIXTURE_COMMON_H
#define AP_FIXTURE_COMMON_H

#include <stdarg.h>
#include <stdio.h>

static int failures;

/* Print "NAME: FAIL <message>" and count it. */
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s: FAIL ", AP_FIXTURE_NAME);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    failures++;
}

/* The callees: each site calls the first of a pair and, patched, the second. */
static long twice(long x) { return 2 * x; }
static long thrice(long x) { return 3 * x; }
static long plus10(long x) { return x + 10; }
static long plus20(long x) { return x + 20; }
static long minus1(long x) { return x - 1; }
static long minus2(long x) { return x - 2; }

#endif /* AP_FIXTURE_COMMON_H */
