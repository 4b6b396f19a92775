/* SPDX-License-Identifier: MIT */
/*
 * Signal frames (altpatch/src/frames.c, docs/live.md "Threads in signal
 * handlers"): a thread interrupted inside a multi-instruction site by a
 * signal whose handler still runs must keep that site from being written,
 * whatever restorer the handler was installed with, however much stack it
 * uses, and on whichever stack it runs; a stack the search cannot read to its
 * end must make the answer "not located", never "no frame".
 *
 * The first tests run a thread in a loop over site_pair (11, 22 once patched,
 * 21 when a thread resumes between its instructions in the new bytes) and
 * signal it until the handler sees that it interrupted the site between its
 * two instructions (a signal that misses steps the thread there with the
 * trap flag); the handler then waits while the main thread applies.
 * The oracle is the value the interrupted call returns after release. The
 * others build frames by hand in mapped memory and ask the search directly.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <altpatch/alternative.h>
#include <altpatch/altpatch.h>

#include "ap_isolate.h"
#include "ap_live_sites.h"
#include "host.h"

/* ---- the site and its oracle ------------------------------------------------------- */

static int pair_cb(const struct altpatch_site_info *s, void *p)
{
    site_view_take(p, s, (uintptr_t)site_pair);
    return 0;
}

static void pair_snap(struct site_view *v)
{
    memset(v, 0, sizeof(*v));
    altpatch_site_foreach(pair_cb, v);
}

/* ---- a thread interrupted inside site_pair ------------------------------------------ */

enum fr_mode { FR_RAW_RESTORER, FR_DEEP, FR_ALTSTACK, FR_BEYOND, FR_NESTED };

static volatile uintptr_t pair_lo, pair_hi; /* site_pair's site */
static volatile int fr_hit, fr_parked, fr_release, fr_acks;
static volatile long fr_result, fr_bad;
static volatile enum fr_mode fr_mode;

#define FR_DEEP_BYTES (320 * 1024) /* more than the 256 KiB an earlier search read */
#define FR_ALT_BYTES (1024 * 1024)
#define FR_TRIES 5
#define FR_HIT_SECONDS 120 /* a signal between the site's instructions: how long to try */
#define FR_BEYOND_BYTES ((size_t)72 << 20) /* more than one search reads (64 MiB) */
#define FR_BEYOND_STACK ((size_t)96 << 20)

/* Waits with @p bytes of stack below the caller: sleeping (located through
 * /proc) or spinning (located by the handshake signal). */
__attribute__((noinline)) static void fr_wait_deep(size_t bytes, bool spin)
{
    volatile char big[bytes];
    for (size_t i = 0; i < bytes; i += 4096)
        big[bytes - 1 - i] = 1;
    big[0] = 1;
    fr_parked = 1;
    while (!fr_release) {
        if (spin)
            __asm__ __volatile__("pause");
        else
            usleep(1000);
    }
    big[0]++;
}

/* FR_NESTED: the second handler, on the sigaltstack, over the first one. */
static void fr_nested_handler(int sig)
{
    (void)sig;
    fr_parked = 1;
    while (!fr_release)
        usleep(1000);
}

#define FR_EFLAGS_TF 0x100ul /* the trap flag: a SIGTRAP after each instruction */

/*
 * A signal that missed the site sets the trap flag in the frame it returns
 * to (fr_handler()): the thread then runs one instruction at a time, each
 * followed by this handler, up to the instruction between the site's two.
 * There the flag is cleared and SIGUSR1 sent to the thread, held by this
 * handler's mask until its frame is gone: it interrupts the site there, as a
 * signal that landed there by chance would, however slow the build or busy
 * the machine.
 */
static void fr_step(int sig, siginfo_t *si, void *ucv)
{
    (void)sig, (void)si;
    ucontext_t *uc = ucv;
    uintptr_t rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (rip > pair_lo && rip < pair_hi) {
        uc->uc_mcontext.gregs[REG_EFL] &= ~(greg_t)FR_EFLAGS_TF;
        syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), SIGUSR1);
    }
}

static void fr_handler(int sig, siginfo_t *si, void *ucv)
{
    (void)sig, (void)si;
    ucontext_t *uc = ucv;
    uintptr_t rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    fr_acks++;
    if (fr_hit || rip <= pair_lo || rip >= pair_hi) {
        /* not between the site's two instructions: stepped there (fr_step) */
        if (!fr_hit)
            uc->uc_mcontext.gregs[REG_EFL] |= (greg_t)FR_EFLAGS_TF;
        return;
    }
    fr_hit = 1;
    switch (fr_mode) {
    case FR_RAW_RESTORER:
        fr_parked = 1;
        while (!fr_release)
            usleep(1000);
        break;
    case FR_DEEP:
        fr_wait_deep(FR_DEEP_BYTES, false);
        break;
    case FR_ALTSTACK:
        fr_wait_deep(FR_DEEP_BYTES, true);
        break;
    case FR_BEYOND:
        fr_wait_deep(FR_BEYOND_BYTES, false);
        break;
    case FR_NESTED:
        raise(SIGUSR2);
        break;
    }
}

/* A restorer of our own, as a program that calls rt_sigaction directly has. */
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".type fr_own_restorer, @function\n"
        "fr_own_restorer:\n"
        "\tmovl $15, %eax\n" /* rt_sigreturn */
        "\tsyscall\n"
        "\thlt\n"
        ".size fr_own_restorer, .-fr_own_restorer\n"
        ".popsection\n");
__attribute__((visibility("hidden"))) void fr_own_restorer(void);

struct fr_kernel_sigaction {
    void (*handler)(int, siginfo_t *, void *);
    unsigned long flags;
    void (*restorer)(void);
    uint64_t mask;
};
#define FR_SA_RESTORER 0x04000000ul

static void *fr_worker(void *arg)
{
    (void)arg;
    if (fr_mode == FR_ALTSTACK || fr_mode == FR_NESTED) {
        stack_t ss = {.ss_size = FR_ALT_BYTES};
        ss.ss_sp = mmap(NULL, FR_ALT_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
        if (ss.ss_sp == MAP_FAILED || sigaltstack(&ss, NULL))
            _exit(5);
    }
    for (;;) {
        long v = site_pair();
        if (v != 11 && v != 22)
            fr_bad++;
        if (fr_hit) {
            fr_result = v; /* the call the handler interrupted (it returned after release) */
            return NULL;
        }
    }
}

struct fr_res {
    int rc, rc2, hit;
    long result, bad, after, one;
    int tries, kept_bad; /* applies under the handler; how many wrote the site */
    struct site_view v, v2;
};

static void fr_body(void *out, void *ctx)
{
    struct fr_res *r = out;
    fr_mode = (enum fr_mode)(intptr_t)ctx;
    altpatch_set_print(NULL);
    /* The site's original bytes in site_pair: mov $1, %eax; add $10, %eax. */
    static const uint8_t orig[] = {0xb8, 0x01, 0x00, 0x00, 0x00, 0x83, 0xc0, 0x0a};
    const uint8_t *fn = (const uint8_t *)(uintptr_t)site_pair;
    for (int i = 0; i < 64 && !pair_lo; i++)
        if (!memcmp(fn + i, orig, sizeof(orig)))
            pair_lo = (uintptr_t)(fn + i), pair_hi = pair_lo + sizeof(orig);
    if (!pair_lo)
        _exit(3);

    if (fr_mode == FR_RAW_RESTORER) {
        struct fr_kernel_sigaction k = {.handler = fr_handler,
                                        .flags = SA_SIGINFO | FR_SA_RESTORER,
                                        .restorer = fr_own_restorer};
        if (syscall(SYS_rt_sigaction, SIGUSR1, &k, NULL, sizeof(k.mask)))
            _exit(4);
    } else {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = fr_handler;
        sa.sa_flags = SA_SIGINFO | (fr_mode == FR_ALTSTACK ? SA_ONSTACK : 0);
        sigaction(SIGUSR1, &sa, NULL);
        sa.sa_handler = fr_nested_handler;
        sa.sa_flags = SA_ONSTACK;
        sigaction(SIGUSR2, &sa, NULL);
    }
    struct sigaction step;
    memset(&step, 0, sizeof(step));
    step.sa_sigaction = fr_step;
    step.sa_flags = SA_SIGINFO;
    sigemptyset(&step.sa_mask);
    sigaddset(&step.sa_mask, SIGUSR1);
    if (sigaction(SIGTRAP, &step, NULL))
        _exit(4);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (fr_mode == FR_BEYOND)
        pthread_attr_setstacksize(&attr, FR_BEYOND_STACK);
    if (pthread_create(&t, &attr, fr_worker, NULL))
        _exit(3);
    /* Signals until one lands between the site's two instructions (the
     * first that misses steps the thread there: fr_step), for at most
     * FR_HIT_SECONDS. */
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; !fr_hit; i++) {
        int acks = fr_acks;
        pthread_kill(t, SIGUSR1);
        while (fr_acks == acks && !fr_hit)
            sched_yield();
        if (!(i & 1023)) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - t0.tv_sec >= FR_HIT_SECONDS)
                break;
        }
    }
    r->hit = fr_hit;
    if (!fr_hit)
        _exit(6);
    while (!fr_parked)
        sched_yield();
    if (fr_mode == FR_RAW_RESTORER) {
        /* The action changes while the handler runs: no sigaction() shows the
         * restorer its frame returns to any more. */
        signal(SIGUSR1, SIG_IGN);
    }
    usleep(20000);
    /* A thread that gets no CPU for the whole handshake (a loaded machine)
     * makes the site refused as not answering: the site is kept either way;
     * apply again until the thread was located (a few tries at most). */
    for (r->tries = 0; r->tries < FR_TRIES; r->tries++) {
        struct site_view v;
        int rc = altpatch_apply();
        pair_snap(&v);
        if (rc)
            r->rc = rc;
        if (v.state != ALTPATCH_SITE_REFUSED || memcmp(v.cur, v.orig, v.len))
            r->kept_bad++;
        r->v = v;
        if (v.reason != ALTPATCH_REASON_LIVE_NO_ANSWER || fr_mode == FR_BEYOND)
            break;
    }
    fr_release = 1;
    pthread_join(t, NULL);
    r->result = fr_result;
    r->bad = fr_bad;
    r->rc2 = altpatch_apply();
    pair_snap(&r->v2);
    r->after = site_pair();
    r->one = site_one();
}

static void fr_check(const struct fr_res *r)
{
    cr_assert_eq(r->hit, 1);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->kept_bad, 0, "the site under the handler is kept, its original bytes in");
    cr_assert_eq(r->v.state, ALTPATCH_SITE_REFUSED);
    cr_assert_eq(r->v.reason, ALTPATCH_REASON_LIVE_THREAD_INSIDE,
                 "reason %d (%s) after %d applies", r->v.reason, altpatch_strreason(r->v.reason),
                 r->tries + 1);
    cr_assert_eq(r->result, 11, "the interrupted call finished in the old bytes (21 = torn)");
    cr_assert_eq(r->bad, 0);
    cr_assert_eq(r->rc2, 0);
    cr_assert_eq(r->v2.state, ALTPATCH_SITE_PATCHED, "written once the handler returned");
    cr_assert_eq(r->after, 22);
    cr_assert_eq(r->one, 2, "single-instruction sites are written under any handler");
}

/* Raw rt_sigaction with a restorer of its own, which no sigaction() shows by the time of the apply. */
Test(frames, handler_with_an_unknown_restorer_keeps_the_site)
{
    fr_check(ap_isolated(sizeof(struct fr_res), fr_body, (void *)(intptr_t)FR_RAW_RESTORER));
}

/* The handler sleeps 320 KiB below its frame (located through /proc). */
Test(frames, handler_deep_in_its_stack_keeps_the_site)
{
    fr_check(ap_isolated(sizeof(struct fr_res), fr_body, (void *)(intptr_t)FR_DEEP));
}

/* The handler runs on a sigaltstack, spins 320 KiB below its frame (located by the handshake signal). */
Test(frames, handler_on_a_sigaltstack_keeps_the_site)
{
    fr_check(ap_isolated(sizeof(struct fr_res), fr_body, (void *)(intptr_t)FR_ALTSTACK));
}

/* A handler on the sigaltstack sleeps over a handler on the thread stack that
 * interrupted the site: the search follows the first frame onto the thread stack. */
Test(frames, nested_handlers_on_two_stacks_keep_the_site)
{
    fr_check(ap_isolated(sizeof(struct fr_res), fr_body, (void *)(intptr_t)FR_NESTED));
}

/* The handler sleeps 72 MiB below its frame, further than a search reads: the
 * thread is not located (no silent "no frame"), so the site is kept as for a
 * thread that does not answer. */
Test(frames, handler_beyond_the_search_limit_keeps_the_site)
{
    struct fr_res *r = ap_isolated(sizeof(*r), fr_body, (void *)(intptr_t)FR_BEYOND);
    cr_assert_eq(r->hit, 1);
    cr_assert_eq(r->rc, 0);
    cr_assert_eq(r->kept_bad, 0, "the site under the handler is kept, its original bytes in");
    cr_assert_eq(r->v.reason, ALTPATCH_REASON_LIVE_NO_ANSWER, "reason %d (%s)", r->v.reason,
                 altpatch_strreason(r->v.reason));
    cr_assert_eq(r->result, 11, "the interrupted call finished in the old bytes (21 = torn)");
    cr_assert_eq(r->bad, 0);
    cr_assert_eq(r->v2.state, ALTPATCH_SITE_PATCHED, "written once the handler returned");
    cr_assert_eq(r->after, 22);
    cr_assert_eq(r->one, 2);
}

/* ---- the search on frames built by hand -------------------------------------------- */

#define FAKE_RIP ((uintptr_t)0x5a5a5a5a10)

static bool fake_inside(uintptr_t rip)
{
    return rip == FAKE_RIP;
}

/* An anonymous mapping of @p size bytes followed by a PROT_NONE page. */
static uint8_t *fake_stack(size_t size)
{
    uint8_t *p = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                      MAP_NORESERVE, -1, 0);
    cr_assert(p != MAP_FAILED);
    cr_assert_eq(mprotect(p + size, 4096, PROT_NONE), 0);
    return p;
}

/* A kernel-shaped rt_sigframe whose xsave area would start at @p fp (64-byte
 * aligned): returns the frame's address (fp - 456, as the kernel computes it). */
static uintptr_t fake_frame(uintptr_t fp, uint64_t rip, uint64_t rsp)
{
    uint64_t *w = (uint64_t *)(fp - 456);
    memset(w, 0, 440);
    w[0] = 0x1234567;                     /* pretcode: no restorer anybody installed */
    w[168 / 8] = rsp;                     /* uc_mcontext.rsp */
    w[176 / 8] = rip;                     /* uc_mcontext.rip */
    w[192 / 8] = 0x2b000000000033ull;     /* ss 0x2b, fs 0, gs 0, cs 0x33 */
    w[232 / 8] = fp;                      /* uc_mcontext.fpstate */
    return (uintptr_t)w;
}

Test(frames, search_recognises_a_frame_by_its_shape)
{
    ap_frames_init();
    uint8_t *s = fake_stack(1 << 20);
    uintptr_t top = (uintptr_t)s + (1 << 20);
    uintptr_t f = fake_frame(top - 4096, FAKE_RIP, top - 64);
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)s, fake_inside), FAKE_RIP);
    cr_assert_eq(ap_frames_where_task(0x1000, f, fake_inside), FAKE_RIP, "sp at the frame");
    cr_assert_eq(ap_frames_where_task(0x1000, f + 8, fake_inside), 0x1000, "frame below sp: dead");
    /* Each part of the shape counts. */
    ((uint64_t *)f)[232 / 8] += 64;
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)s, fake_inside), FAKE_RIP,
                 "xsave area a little higher");
    ((uint64_t *)f)[232 / 8] = top - 4096 + 8;
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)s, fake_inside), 0x1000,
                 "fpstate not 64-byte aligned: no frame");
    ((uint64_t *)f)[232 / 8] = top - 4096;
    ((uint64_t *)f)[192 / 8] = 0x2b000000000023ull;
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)s, fake_inside), 0x1000,
                 "32-bit code segment: no frame");
    ((uint64_t *)f)[192 / 8] = 0x33;
    ((uint64_t *)f)[2] = 1;
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)s, fake_inside), FAKE_RIP,
                 "uc_link (which sigreturn ignores) and ss do not matter");
    munmap(s, (1 << 20) + 4096);
}

/* Handlers nested on one stack: each frame interrupted the handler above it. */
Test(frames, search_reads_through_nested_frames)
{
    ap_frames_init();
    enum { N = 40, SZ = 1 << 20 };
    uint8_t *s = fake_stack(SZ);
    uintptr_t top = (uintptr_t)s + SZ;
    /* Frame k (1 KiB apart, the lowest last) was interrupted just below frame k - 1. */
    uintptr_t f[N];
    for (int k = 0; k < N; k++) {
        uintptr_t fp = top - 4096 - (uintptr_t)k * 1024;
        f[k] = fake_frame(fp, 0x2000 + (uintptr_t)k, k ? f[k - 1] - 200 : top - 64);
    }
    cr_assert_eq(ap_frames_where_task(0x1000, f[N - 1] - 512, fake_inside), 0x1000,
                 "40 nested frames, none in a site: read to the end, no frame");
    ((uint64_t *)f[0])[176 / 8] = FAKE_RIP;
    cr_assert_eq(ap_frames_where_task(0x1000, f[N - 1] - 512, fake_inside), FAKE_RIP,
                 "the outermost frame was interrupted inside a site");
    munmap(s, SZ + 4096);
}

Test(frames, search_follows_frames_onto_other_stacks)
{
    ap_frames_init();
    enum { N = 6, SZ = 64 * 1024 };
    uint8_t *st[N];
    for (int i = 0; i < N; i++)
        st[i] = fake_stack(SZ);
    /* Stack i holds a frame interrupted on stack i + 1; the last one on site code. */
    for (int i = 0; i < N; i++) {
        uintptr_t top = (uintptr_t)st[i] + SZ;
        uintptr_t next = i + 1 < N ? (uintptr_t)st[i + 1] + 512 : 0x7000;
        fake_frame(top - 1024, i + 1 < N ? 0x2000 : FAKE_RIP, next);
    }
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)st[N - 4] + 512, fake_inside),
                 FAKE_RIP, "four stacks are followed");
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)st[0] + 512, fake_inside),
                 AP_WHERE_CUT, "six stacks: not located, never \"no frame\"");
    /* A frame that points at an unmapped stack: nothing there to follow. */
    fake_frame((uintptr_t)st[N - 1] + SZ - 1024, 0x2000, 0x10000);
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)st[N - 2] + 512, fake_inside), 0x1000);
    for (int i = 0; i < N; i++)
        munmap(st[i], SZ + 4096);
}

Test(frames, search_that_cannot_reach_the_end_says_so)
{
    ap_frames_init();
    size_t size = (size_t)80 << 20;
    uint8_t *s = fake_stack(size);
    uintptr_t top = (uintptr_t)s + size;
    fake_frame(top - 4096, FAKE_RIP, top - 64);
    cr_assert_eq(ap_frames_where_task(0x1000, top - (8 << 20), fake_inside), FAKE_RIP,
                 "8 MiB below the frame: found");
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)s, fake_inside), AP_WHERE_CUT,
                 "80 MiB below the frame: not located");
    memset((void *)(top - 4096 - 456), 0, 440);
    cr_assert_eq(ap_frames_where_task(0x1000, top - (8 << 20), fake_inside), 0x1000,
                 "8 MiB without a frame: read to the end, no frame");
    cr_assert_eq(ap_frames_where_task(0x1000, (uintptr_t)s, fake_inside), AP_WHERE_CUT,
                 "80 MiB without a frame: still not located");
    munmap(s, size + 4096);
}
