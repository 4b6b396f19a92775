/* SPDX-License-Identifier: MIT */
/*
 * util.c - the ground floor: the library's version, its log (through the
 * callback set by altpatch_set_print()), the environment (ignored under
 * AT_SECURE), the monotonic clock and the allocation of arrays written whole
 * (ap_malloc_filled()). Calls nothing else of the library.
 */
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>

#define AP_XSTR(x) #x
#define AP_VSTR(a, b, c) AP_XSTR(a) "." AP_XSTR(b) "." AP_XSTR(c)

const char *altpatch_version(void)
{
    return AP_VSTR(ALTPATCH_VERSION_MAJOR, ALTPATCH_VERSION_MINOR, ALTPATCH_VERSION_PATCH);
}

/* ------------------------------------------------------------------------- */
/* Environment, clock                                                        */
/* ------------------------------------------------------------------------- */

extern char **environ;

/* AT_SECURE, fixed at exec: 0 not read yet, 1 clear, 2 set. */
AP_STATE static int ap_secure;

/*
 * getenv()'s answer, read from environ here: the library's few variables are
 * asked on every apply, and one more C library function to resolve on a
 * process's first apply costs more than this loop.
 */
static bool ap_env_secure(void)
{
    int sec = __atomic_load_n(&ap_secure, __ATOMIC_RELAXED);
    if (!sec) {
        sec = getauxval(AT_SECURE) ? 2 : 1;
        __atomic_store_n(&ap_secure, sec, __ATOMIC_RELAXED);
    }
    return sec == 2;
}

/* The value of entry @p e when it is @p name=..., else NULL (no strncmp():
 * one function less for the dynamic linker to resolve). */
static inline const char *ap_env_is(const char *e, const char *name)
{
    size_t k = 0;
    while (name[k] && e[k] == name[k])
        k++;
    return !name[k] && e[k] == '=' ? e + k + 1 : NULL;
}

const char *ap_getenv(const char *name)
{
    if (ap_env_secure())
        return NULL;
    char **env = environ;
    const char c0 = name[0];
    if (!env || !c0)
        return NULL;
    for (const char *e, *v; (e = *env); env++)
        if (e[0] == c0 && (v = ap_env_is(e, name))) /* most entries: one byte read */
            return v;
    return NULL;
}

bool ap_env_on(const char *name)
{
    return ap_env_value_on(ap_getenv(name));
}

AP_HOT void ap_env_read(struct ap_env *out)
{
    *out = (struct ap_env){0};
    char **env = environ;
    if (ap_env_secure() || !env)
        return;
    /* The same answers as ap_getenv() for each name: the first entry wins. */
    for (const char *e; (e = *env); env++) {
        if (e[0] != 'A' || e[1] != 'L') /* most entries: one byte read */
            continue;
        size_t k = 0;
        while (k < 9 && e[k] == "ALTPATCH_"[k])
            k++;
        if (k < 9)
            continue;
        const char *n = e + 9, *v;
        if (!out->off && (v = ap_env_is(n, "OFF")))
            out->off = v;
        else if (!out->debug && (v = ap_env_is(n, "DEBUG")))
            out->debug = v;
        else if (!out->clearcpuid && (v = ap_env_is(n, "CLEARCPUID")))
            out->clearcpuid = v;
    }
}

AP_HOT uint64_t ap_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------- */
/* Logging                                                                   */
/* ------------------------------------------------------------------------- */

static int ap_default_print(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level != ALTPATCH_WARN && !ap_env_on("ALTPATCH_DEBUG"))
        return 0;
    return vfprintf(stderr, fmt, ap);
}

static altpatch_print_fn ap_print = ap_default_print;

AP_STATE unsigned long ap_user_calls;

/** What ap_default_print() would drop: not formatted at all. @p debug: the
 * caller's answer for ALTPATCH_DEBUG, NULL to read it (only when needed). */
static bool ap_default_drops(altpatch_print_fn fn, enum altpatch_print_level level,
                             const bool *debug)
{
    return fn == ap_default_print && level != ALTPATCH_WARN &&
           !(debug ? *debug : ap_env_on("ALTPATCH_DEBUG"));
}

altpatch_print_fn altpatch_set_print(altpatch_print_fn fn)
{
    return __atomic_exchange_n(&ap_print, fn, __ATOMIC_ACQ_REL);
}

static void ap_vlog(altpatch_print_fn fn, enum altpatch_print_level level, const char *fmt,
                    va_list ap);

AP_HOT static void ap_log_v(const bool *debug, enum altpatch_print_level level, const char *fmt,
                     va_list ap)
{
    altpatch_print_fn fn = __atomic_load_n(&ap_print, __ATOMIC_ACQUIRE);
    if (fn && !ap_default_drops(fn, level, debug))
        ap_vlog(fn, level, fmt, ap);
}

void ap_log(enum altpatch_print_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ap_log_v(NULL, level, fmt, ap);
    va_end(ap);
}

AP_HOT void ap_log_env(bool debug, enum altpatch_print_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ap_log_v(&debug, level, fmt, ap);
    va_end(ap);
}

static void ap_vlog(altpatch_print_fn fn, enum altpatch_print_level level, const char *fmt,
                    va_list ap)
{
    /* Every message starts with "altpatch: ", whatever the callback. */
    char prefixed[256];
    const char *f = fmt;
    if (snprintf(prefixed, sizeof(prefixed), "altpatch: %s", fmt) < (int)sizeof(prefixed))
        f = prefixed;
    if (fn != ap_default_print)
        __atomic_fetch_add(&ap_user_calls, 1, __ATOMIC_RELAXED); /* before: new once it runs */
    fn(level, f, ap);
}

/*
 * A fresh block from malloc() is pages the kernel has not given yet: every
 * first write to one is a page fault (an exception, then a zeroed page
 * charged to the memory cgroup). In a KVM guest the exception is most of
 * that cost; MADV_POPULATE_WRITE (Linux 5.14) makes the whole range present
 * in one call (in a KVM guest about 0.9 us a page against 1.3-1.6 us a
 * fault, from 16 pages up). A block below AP_FILL_MIN is not worth the
 * system call; a kernel without the advice answers EINVAL and the pages fault
 * as before.
 */

AP_STATE static bool ap_fill_on;
/* ap_user_calls when the proof was taken (this thread then ran without a
 * seccomp filter, alone) */
AP_STATE static unsigned long ap_fill_calls;
/* ap_fill_ask()'s proof, not asked yet (NULL once asked, or none) */
AP_STATE static bool (*ap_fill_prove)(void);

AP_HOT void ap_fill_allow(bool on)
{
    ap_fill_on = on;
    ap_fill_calls = ap_user_calls_now();
    ap_fill_prove = NULL;
}

AP_HOT void ap_fill_ask(bool (*prove)(void))
{
    ap_fill_on = false;
    ap_fill_prove = prove;
}

AP_HOT void *ap_malloc_filled_head(size_t size, size_t head)
{
    void *p = ap_mem_alloc(size);
    if (head > size)
        head = size;
    if (!p || head < AP_FILL_MIN)
        return p;
    if (ap_fill_prove) {
        bool (*prove)(void) = ap_fill_prove;
        ap_fill_prove = NULL; /* asked once */
        ap_fill_calls = ap_user_calls_now();
        ap_fill_on = prove();
    }
    uintptr_t pg = 4096, a = ((uintptr_t)p + pg - 1) & ~(pg - 1);
    uintptr_t e = ((uintptr_t)p + head) & ~(pg - 1);
    if (!ap_fill_on || e <= a)
        return p;
    /* A print callback of the application's called since the proof may
     * have installed a seccomp filter (one may kill the process for the
     * advice), or started a thread that installs one at any time: no more
     * advice until the next proof, and no question either (an answer would
     * be old by the next system call). Without such a call, the proof holds
     * as the writer's does (AP_POKE_SECCOMP_OFF): the process was alone and
     * ran none of its code since. A direct system call: a first apply binds
     * no madvise(). */
    if (ap_user_calls_now() != ap_fill_calls) {
        ap_fill_on = false;
        return p;
    }
    ap_sys(SYS_madvise, (long)a, (long)(e - a), AP_MADV_POPULATE_WRITE, 0, 0);
    return p;
}

AP_HOT void *ap_malloc_filled(size_t size)
{
    return ap_malloc_filled_head(size, size);
}
