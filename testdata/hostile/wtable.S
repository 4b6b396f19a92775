/* SPDX-License-Identifier: MIT */
/*
 * libaphost_wtable.so: a module whose note names a record table in writable
 * memory (.data, see README.md): a valid record of aph_wtable_fn's site, but
 * the runtime keeps no copy of a site's address and reads it from the table,
 * which must not be able to change after it was checked. The whole module
 * must be refused; aph_wtable_fn() keeps returning 1.
 */
#include "hostile.inc"

    APH_NOTE ts=aph_wtable_start, te=aph_wtable_end

    APH_VALID_FN aph_wtable_fn

    /* the same record as aph_wtable_fn_rec, in .data */
    .data
    .balign 4
aph_wtable_start:
    .long .Laph_wtable_fn_site - .
    .long .Laph_wtable_fn_repl - .
    .long APH_ALWAYS
    .byte 5
    .byte 5
aph_wtable_end:

    .section .note.GNU-stack, "", @progbits
