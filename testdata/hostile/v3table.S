/* SPDX-License-Identifier: MIT */
/*
 * libaphost_v3table.so: a module whose note lies (APH_NOTE version=3
 * recsize=12 over two 14-byte records, see README.md): 28 bytes are not whole
 * 12-byte records. The whole module must be refused; aph_v3table_fn() keeps
 * returning 1.
 */
#include "hostile.inc"

    APH_NOTE version=3, recsize=12

    APH_VALID_FN aph_v3table_fn
    APH_VALID_FN aph_v3table_fn2

    .section .note.GNU-stack, "", @progbits
