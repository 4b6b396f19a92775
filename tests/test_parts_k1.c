/* SPDX-License-Identifier: MIT */
/*
 * test_parts.c with format-1 records (the kernel's 14-byte struct
 * alt_instr): the same sites, parts and checks, each site's records decoded
 * from a table of that format too.
 */
#define ALTPATCH_KERNEL_RECORDS
#include "test_parts.c"
