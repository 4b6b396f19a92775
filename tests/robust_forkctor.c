/* SPDX-License-Identifier: MIT */
/*
 * A library whose constructor raises SIGUSR1: the program's handler runs on
 * the thread that loads it, inside dlopen() (test_robust: a handler that
 * forks there).
 */
#include <signal.h>

__attribute__((constructor)) static void robust_forkctor_init(void)
{
    raise(SIGUSR1);
}
