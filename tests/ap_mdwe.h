/* SPDX-License-Identifier: MIT */
/*
 * PR_SET_MDWE (memory-deny-write-execute: mprotect may not give execute
 * permission back) in the tests that deny every write with it, and the
 * valgrind check those tests skip on: valgrind maps the code it translates,
 * which MDWE forbids. A body sets MDWE in its fork()ed child
 * (ap_mdwe_set()); the test skips before it under valgrind
 * (ap_mdwe_skip_under_valgrind()) and after it where the kernel has no MDWE
 * (ap_mdwe_require(); ap_mdwe_missing() for a case of a loop). Any other
 * failure to set it fails the test.
 */
#ifndef AP_TEST_MDWE_H
#define AP_TEST_MDWE_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#endif
#ifndef PR_MDWE_REFUSE_EXEC_GAIN
#define PR_MDWE_REFUSE_EXEC_GAIN (1UL << 0)
#endif

/** True under valgrind: its preloaded core is in LD_PRELOAD. */
static inline bool ap_under_valgrind(void)
{
    const char *pre = getenv("LD_PRELOAD");
    return pre && strstr(pre, "vgpreload");
}

/** Refuse execute permission after write for this process: 0 or -errno. */
static inline int ap_mdwe_set(void)
{
    return prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0L, 0L, 0L) ? -errno : 0;
}

/** Skip the test under valgrind (call before the body sets MDWE). */
static inline void ap_mdwe_skip_under_valgrind(void)
{
    if (ap_under_valgrind())
        cr_skip_test("PR_SET_MDWE would stop valgrind's own code generation");
}

/** With the body's ap_mdwe_set() result @p set: true where the kernel has no
 * MDWE (-EINVAL); false where it was set; any other answer fails the test. */
static inline bool ap_mdwe_missing(int set)
{
    if (set == -EINVAL)
        return true;
    cr_assert_eq(set, 0, "PR_SET_MDWE: %s", strerror(-set));
    return false;
}

/** With the body's ap_mdwe_set() result @p set: skip where the kernel has no
 * MDWE, else it must have been set. */
static inline void ap_mdwe_require(int set)
{
    if (ap_mdwe_missing(set))
        cr_skip_test("kernel without PR_SET_MDWE");
}

#endif /* AP_TEST_MDWE_H */
