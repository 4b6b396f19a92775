/* SPDX-License-Identifier: MIT */
/*
 * A plugin built four times with the same layout and different bytes, to be
 * reloaded at the same path and address (test_robust):
 *   v1: original `movl $1`, replacement `movl $2`
 *   v2: original `movl $1`, replacement `movl $3`   (only the replacement differs)
 *   v3: original `movl $7`, replacement `movl $3`   (only the original differs from v2)
 *   v4: as v3 under ALT_NOT(ALWAYS), which never applies (only the table differs)
 * reload_value() returns what the site holds: the replacement once patched.
 */
#include <altpatch/alternative.h>

#define RP_STR_(x) #x
#define RP_STR(x) RP_STR_(x)

#ifdef RELOAD_NEVER
#define RP_FEATURE ALT_NOT(X86_FEATURE_ALWAYS)
#else
#define RP_FEATURE X86_FEATURE_ALWAYS
#endif

__attribute__((visibility("default"))) long reload_value(void)
{
    long v;
    __asm__ __volatile__(ALTERNATIVE("movl $" RP_STR(RELOAD_ORIG) ", %%eax",
                                     "movl $" RP_STR(RELOAD_REPL) ", %%eax", RP_FEATURE)
                         : "=a"(v));
    return v;
}
