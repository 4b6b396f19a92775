/* SPDX-License-Identifier: MIT */
/*
 * test_parts.c with a site of ten records in a table of 4152: the table pass
 * reads the table again to keep every record (more than a site's decoding
 * buffer holds), and the site's ninth record is chosen, whether the records
 * would be decoded (ap_records_keep_max 4096, below the table's size) or kept.
 */
#define PARTS_WIDE
#include "test_parts.c"
