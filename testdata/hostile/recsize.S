/* SPDX-License-Identifier: MIT */
/*
 * libaphost_recsize.so: a module whose note lies (APH_NOTE recsize=16, see README.md).
 * The whole module must be refused; aph_recsize_fn() keeps returning 1.
 */
#include "hostile.inc"

    APH_NOTE recsize=16

    APH_VALID_FN aph_recsize_fn
    APH_VALID_FN aph_recsize_fn2

    .section .note.GNU-stack, "", @progbits
