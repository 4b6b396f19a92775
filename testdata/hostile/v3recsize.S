/* SPDX-License-Identifier: MIT */
/*
 * libaphost_v3recsize.so: a module whose note lies (APH_NOTE version=3
 * recsize=14, see README.md): format 3 has 12-byte records. The whole module
 * must be refused; aph_v3recsize_fn() keeps returning 1.
 */
#include "hostile.inc"

    APH_NOTE version=3, recsize=14

    APH_VALID_FN aph_v3recsize_fn
    APH_VALID_FN aph_v3recsize_fn2

    .section .note.GNU-stack, "", @progbits
