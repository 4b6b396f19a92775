/* SPDX-License-Identifier: MIT */
/*
 * libaphost_inverted.so: a module whose note lies (APH_NOTE ts=__stop_altinstructions, te=__start_altinstructions, see README.md).
 * The whole module must be refused; aph_inverted_fn() keeps returning 1.
 */
#include "hostile.inc"

    APH_NOTE ts=__stop_altinstructions, te=__start_altinstructions

    APH_VALID_FN aph_inverted_fn
    APH_VALID_FN aph_inverted_fn2

    .section .note.GNU-stack, "", @progbits
