/* SPDX-License-Identifier: MIT */
/*
 * berkeley.h - size(1)'s Berkeley rule, shared by the tools (altdump --size,
 * altbench size): which column an allocated section counts in.
 */
#ifndef TOOLS_BERKELEY_H
#define TOOLS_BERKELEY_H

#include <stdint.h>

/** The three columns of size(1) (Berkeley format). */
struct berkeley_sizes {
    uint64_t text, data, bss;
};

/**
 * Count one section header (sh_flags @p flags, sh_type @p type, sh_size
 * @p size) as size(1) does: only SHF_ALLOC sections count; executable or
 * read-only ones are text; of the writable rest, SHT_NOBITS is bss and the
 * others are data.
 */
void berkeley_add(struct berkeley_sizes *z, uint64_t flags, uint32_t type, uint64_t size);

#endif /* TOOLS_BERKELEY_H */
