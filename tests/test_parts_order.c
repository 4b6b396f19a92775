/* SPDX-License-Identifier: MIT */
/*
 * test_parts.c with a write out of address order after many()'s parts: the
 * last batch, sorted and written without continuing the parts' page count,
 * writes a page a part wrote; every check of test_parts holds, the page
 * counted once.
 */
#define PARTS_OUT_OF_ORDER
#include "test_parts.c"
