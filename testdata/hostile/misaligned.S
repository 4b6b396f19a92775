/* SPDX-License-Identifier: MIT */
/*
 * libaphost_misaligned.so: a module whose note lies (APH_NOTE ts=__start_altinstructions+1, see README.md).
 * The whole module must be refused; aph_misaligned_fn() keeps returning 1.
 */
#include "hostile.inc"

    APH_NOTE ts=__start_altinstructions+1

    APH_VALID_FN aph_misaligned_fn
    APH_VALID_FN aph_misaligned_fn2

    .section .note.GNU-stack, "", @progbits
