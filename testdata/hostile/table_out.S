/* SPDX-License-Identifier: MIT */
/*
 * libaphost_table_out.so: a module whose note lies (APH_NOTE te=__stop_altinstructions+0x40000000, see README.md).
 * The whole module must be refused; aph_table_out_fn() keeps returning 1.
 */
#include "hostile.inc"

    APH_NOTE te=__stop_altinstructions+0x40000000

    APH_VALID_FN aph_table_out_fn
    APH_VALID_FN aph_table_out_fn2

    .section .note.GNU-stack, "", @progbits
