/*
 * Single-stepping the calling thread with the trap flag (EFLAGS.TF): each
 * instruction after ap_step_on() raises SIGTRAP until ap_step_off(), or until
 * a SIGTRAP handler clears the flag in the interrupted context
 * (ap_step_stop()). Used by the tests that act at every instruction of an
 * entry point (fork from a handler, calls from a handler).
 */
#ifndef AP_STEP_H
#define AP_STEP_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucontext.h>

#define AP_STEP_TF 0x100

static inline void ap_step_on(void)
{
    __asm__ volatile("pushfq\n\torq $0x100, (%%rsp)\n\tpopfq" ::: "memory", "cc");
}

static inline void ap_step_off(void)
{
    __asm__ volatile("pushfq\n\tandq $~0x100, (%%rsp)\n\tpopfq" ::: "memory", "cc");
}

/* From a SIGTRAP handler: no more steps once the interrupted code resumes. */
static inline void ap_step_stop(ucontext_t *uc)
{
    uc->uc_mcontext.gregs[REG_EFL] &= ~(greg_t)AP_STEP_TF;
}

/*
 * The instructions a stepped run has met: remember @p ip in @p seen, a table
 * of @p slots addresses (a power of two; 0: an empty slot); true if it was
 * there before (or the table is full), else it is added and *@p distinct
 * counted. A test that forks at every step only up to a point forks after
 * it at the first run of each instruction.
 */
static inline bool ap_step_seen_before(uintptr_t *seen, size_t slots, uintptr_t ip,
                                       int *distinct)
{
    size_t h = (size_t)((ip * 0x9e3779b97f4a7c15ull) >> 50) & (slots - 1);
    for (size_t n = 0; n < slots; n++, h = (h + 1) & (slots - 1)) {
        if (seen[h] == ip)
            return true;
        if (!seen[h]) {
            seen[h] = ip;
            ++*distinct;
            return false;
        }
    }
    return true;
}

#endif
