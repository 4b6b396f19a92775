/* SPDX-License-Identifier: MIT */
/*
 * libaphost_descsz.so: a module whose note lies (APH_NOTE descsz=20, see README.md).
 * The whole module must be refused; aph_descsz_fn() keeps returning 1.
 */
#include "hostile.inc"

    APH_NOTE descsz=20

    APH_VALID_FN aph_descsz_fn
    APH_VALID_FN aph_descsz_fn2

    .section .note.GNU-stack, "", @progbits
