/* SPDX-License-Identifier: MIT */
/*
 * berkeley.c - size(1)'s Berkeley rule (binutils: SEC_CODE or SEC_READONLY
 * -> text, else SEC_LOAD -> data, else bss), in section header terms.
 */
#include "berkeley.h"

#include <elf.h>

void berkeley_add(struct berkeley_sizes *z, uint64_t flags, uint32_t type, uint64_t size)
{
    if (!(flags & SHF_ALLOC))
        return;
    if ((flags & SHF_EXECINSTR) || !(flags & SHF_WRITE))
        z->text += size;
    else if (type == SHT_NOBITS)
        z->bss += size;
    else
        z->data += size;
}
