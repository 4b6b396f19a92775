/* SPDX-License-Identifier: MIT */
/*
 * elfsec.h - finding a section by name in an ELF64 x86-64 file, through a
 * read callback so that the same checks serve a file descriptor (the
 * runtime, prepatch_load.c) and bytes in memory (the image API, image.c).
 */
#ifndef ALTPATCH_ELFSEC_H
#define ALTPATCH_ELFSEC_H

#include "internal.h"

/** Read @p len bytes at file offset @p off into @p dst: 0, or -errno (-EIO when short). */
typedef int (*ap_elf_read_fn)(void *ctx, uint64_t off, void *dst, size_t len);

/** A section header, reduced. */
struct ap_elf_section {
    uint32_t index;   /* in the section header table */
    uint32_t type;    /* SHT_* */
    uint64_t flags;   /* SHF_* */
    uint64_t offset;  /* sh_offset */
    uint64_t size;    /* sh_size */
    uint64_t hdr_off; /* file offset of the section header itself */
};

/**
 * Find the section called @p name. Checks the ELF header (64-bit,
 * little-endian, x86-64), the section header table and the section name
 * table against @p file_size before reading them. 0 (found), -ENOENT (no
 * such section, or no section headers), -ENOEXEC (not such an ELF file, or
 * headers out of bounds), -ENOMEM, or the reader's error.
 */
AP_HIDDEN int ap_elf_find_section(ap_elf_read_fn rd, void *ctx, uint64_t file_size,
                                  const char *name, struct ap_elf_section *out);

/**
 * Find the altpatch note (owner ALTPATCH_NOTE_NAME, type ALTPATCH_NOTE_TYPE)
 * among the notes of one PT_NOTE segment of @p size bytes at @p p (@p align:
 * 4 or 8). Returns its descriptor (its size in *@p descsz) or NULL. A
 * malformed note stops the search: nothing past the segment is read.
 */
AP_HIDDEN const uint8_t *ap_note_find(const uint8_t *p, size_t size, size_t align,
                                      uint32_t *descsz);

#endif /* ALTPATCH_ELFSEC_H */
