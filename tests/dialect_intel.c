/* SPDX-License-Identifier: MIT */
/* Compiled with -masm=intel (tests/dialect.cmake): the primitives' strings
 * must assemble to the same instructions in both dialects. */
#include <altpatch/primitives.h>

static long dialect_one(long x) { return x + 1; }
static long dialect_two(long x) { return x + 2; }

void *dialect_intel_fs_self(void) { return altpatch_fs_self(); }
void *dialect_intel_gs_self(void) { return altpatch_gs_self(); }
unsigned dialect_intel_getcpu(void) { return altpatch_getcpu(); }
uint64_t dialect_intel_rdtsc(void) { return altpatch_rdtsc_ordered(); }
void dialect_intel_fence(void) { altpatch_weak_fence(); }
long dialect_intel_call(long x) { return ALTPATCH_ALT_CALL(dialect_one, dialect_two, X86_FEATURE_ALWAYS, x); }
