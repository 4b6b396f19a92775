/* SPDX-License-Identifier: MIT */
/*
 * libaphost_repl_out.so: a module whose note lies (APH_NOTE rs=__start_altinstr_replacement-0x40000000, see README.md).
 * The whole module must be refused; aph_repl_out_fn() keeps returning 1.
 */
#include "hostile.inc"

    APH_NOTE rs=__start_altinstr_replacement-0x40000000

    APH_VALID_FN aph_repl_out_fn
    APH_VALID_FN aph_repl_out_fn2

    .section .note.GNU-stack, "", @progbits
