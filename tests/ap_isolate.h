/* SPDX-License-Identifier: MIT */
/*
 * Run a test body in a fork()ed, single-threaded child.
 *
 * A Criterion 2.4 test body runs in a process with two threads (the test and
 * Criterion's IPC thread), and altpatch_apply() refuses to patch while other
 * threads run (-EBUSY). A fork()ed child has only the calling thread, so tests
 * that apply run their body there. The child must not call cr_assert*() (the
 * IPC thread does not exist in it): it fills a result block in shared memory
 * and the parent asserts on it. Patching in the child never changes the
 * parent's memory (private mappings are copied on write).
 */
#ifndef AP_TEST_ISOLATE_H
#define AP_TEST_ISOLATE_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* 1 in a build with a sanitizer (its runtime owns malloc, madvise and the
 * cost of fork()). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define AP_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                      \
    __has_feature(memory_sanitizer)
#define AP_SANITIZED 1
#endif
#endif
#ifndef AP_SANITIZED
#define AP_SANITIZED 0
#endif

/** Body run in the child: @p out is a zeroed shared block, @p ctx is passed through. */
typedef void (*ap_isolated_fn)(void *out, void *ctx);

/**
 * Fork, run @p fn(out, ctx) in the child, wait, and assert (in the caller) that
 * the child exited with status 0. Returns the shared block of @p size bytes
 * the child filled (never unmapped: tests are short-lived processes).
 */
static inline void *ap_isolated(size_t size, ap_isolated_fn fn, void *ctx)
{
    void *out = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    cr_assert(out != MAP_FAILED, "mmap shared result");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork");
    if (pid == 0) {
        fn(out, ctx);
        fflush(stdout);
        fflush(stderr);
        _exit(0);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid, "waitpid");
    cr_assert(WIFEXITED(status), "isolated child died (signal %d)",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cr_assert_eq(WEXITSTATUS(status), 0, "isolated child exit status %d", WEXITSTATUS(status));
    return out;
}

#endif /* AP_TEST_ISOLATE_H */
