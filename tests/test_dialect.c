/* SPDX-License-Identifier: MIT */
/*
 * The primitives built with -masm=intel (dialect_intel.c) compute the same
 * values as with AT&T syntax, before and after apply. Written only in AT&T,
 * `movq %fs:0, %rax` assembles under Intel syntax to a *store* into the TCB.
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>

#include "ap_isolate.h"
#include <altpatch/altpatch.h>
#include <altpatch/primitives.h>

void *dialect_intel_fs_self(void);
void *dialect_intel_gs_self(void);
unsigned dialect_intel_getcpu(void);
uint64_t dialect_intel_rdtsc(void);
void dialect_intel_fence(void);
long dialect_intel_call(long x);

struct dialect_out {
    int ok_fs[2], ok_gs[2], ok_cpu[2], ok_tsc[2], call[2];
    int apply;
};

static void run_all(struct dialect_out *o, int i)
{
    static uint64_t block[8];
    cpu_set_t set;

    CPU_ZERO(&set);
    CPU_SET((unsigned)sched_getcpu(), &set);
    sched_setaffinity(0, sizeof(set), &set);
    o->ok_fs[i] = dialect_intel_fs_self() == (void *)pthread_self();
    o->ok_gs[i] = altpatch_gs_install(block) == 0 && dialect_intel_gs_self() == (void *)block;
    o->ok_cpu[i] = (int)dialect_intel_getcpu() == sched_getcpu();
    uint64_t t0 = dialect_intel_rdtsc(), t1 = dialect_intel_rdtsc();
    o->ok_tsc[i] = t1 >= t0;
    dialect_intel_fence();
    o->call[i] = (int)dialect_intel_call(40);
}

static void body(void *out, void *ctx)
{
    struct dialect_out *o = out;
    (void)ctx;
    run_all(o, 0);
    o->apply = altpatch_apply();
    run_all(o, 1);
}

Test(dialect, intel_syntax_primitives_compute_the_same_values)
{
    struct dialect_out *o = ap_isolated(sizeof(*o), body, NULL);

    cr_assert_eq(o->apply, 0);
    for (int i = 0; i < 2; i++) {
        const char *when = i ? "after apply" : "before apply";
        cr_assert(o->ok_fs[i], "fs_self %s", when);
        cr_assert(o->ok_gs[i], "gs_self %s", when);
        cr_assert(o->ok_cpu[i], "getcpu %s", when);
        cr_assert(o->ok_tsc[i], "rdtsc_ordered %s", when);
    }
    cr_assert_eq(o->call[0], 41, "the original call reaches the first function");
    cr_assert_eq(o->call[1], 42, "ALWAYS: the patched call reaches the second");
}
