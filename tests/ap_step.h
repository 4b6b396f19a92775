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

#endif
