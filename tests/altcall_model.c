/* SPDX-License-Identifier: MIT */
/*
 * ALTPATCH_ALT_CALL under a code model given on the command line. Built with
 * -mcmodel=medium it must compile and work: the site calls the original
 * before apply and the replacement after an apply for a set holding ALWAYS
 * (exit status 0, else 1 with a message). Under -mcmodel=large it must not
 * compile, with a message that names the code model (a ctest checks it).
 * Valid C and C++.
 */
#include <stdio.h>

#include <altpatch/primitives.h>

static long model_old(long x) { return x + 10; }
static long model_new(long x) { return x + 20; }

static __attribute__((noinline)) long model_site(long x)
{
    return ALTPATCH_ALT_CALL(model_old, model_new, X86_FEATURE_ALWAYS, x);
}

int main(void)
{
    long before = model_site(1);
    struct altpatch_features *f = altpatch_features_new();
    if (!f || altpatch_features_set(f, X86_FEATURE_ALWAYS) != 0)
        return 1;
    struct altpatch_apply_opts o;
    o.sz = sizeof(o);
    o.features = f;
    o.flags = 0;
    o.reserved = 0;
    int rc = altpatch_apply_opts(&o);
    altpatch_features_free(f);
    long after = model_site(1);
    if (before != 11 || rc != 0 || after != 21) {
        fprintf(stderr, "altcall_model: before %ld (want 11), apply %d, after %ld (want 21)\n",
                before, rc, after);
        return 1;
    }
    printf("altcall_model: before 11, after 21\n");
    return 0;
}
