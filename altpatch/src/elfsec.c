/* SPDX-License-Identifier: MIT */
/*
 * elfsec.c - one section by name, every header checked before use.
 */
#include <elf.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pure.h"

/** Largest section header table read (65280 headers of 64 bytes). */
#define AP_MAX_SHDRS 0xff00u

static bool in_file(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

/* The ELF header, checked. */
static int read_ehdr(ap_elf_read_fn rd, void *ctx, uint64_t size, Elf64_Ehdr *eh)
{
    if (size < sizeof(*eh))
        return -ENOEXEC;
    int r = rd(ctx, 0, eh, sizeof(*eh));
    if (r)
        return r;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_ident[EI_DATA] != ELFDATA2LSB || eh->e_machine != EM_X86_64)
        return -ENOEXEC;
    return 0;
}

int ap_elf_find_section(ap_elf_read_fn rd, void *ctx, uint64_t size, const char *name,
                        struct ap_elf_section *out)
{
    Elf64_Ehdr eh;
    int r = read_ehdr(rd, ctx, size, &eh);
    if (r)
        return r;
    if (eh.e_shnum == 0 || eh.e_shoff == 0)
        return -ENOENT;
    if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum > AP_MAX_SHDRS ||
        eh.e_shstrndx >= eh.e_shnum ||
        !in_file(eh.e_shoff, (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr), size))
        return -ENOEXEC;
    Elf64_Shdr *sh = malloc(eh.e_shnum * sizeof(*sh));
    if (!sh)
        return -ENOMEM;
    r = rd(ctx, eh.e_shoff, sh, eh.e_shnum * sizeof(*sh));
    const Elf64_Shdr *ss = &sh[eh.e_shstrndx];
    char *names = NULL;
    if (!r && (ss->sh_type != SHT_STRTAB || !in_file(ss->sh_offset, ss->sh_size, size) ||
               ss->sh_size == 0 || ss->sh_size > (64u << 20)))
        r = -ENOEXEC;
    if (!r && !(names = malloc(ss->sh_size)))
        r = -ENOMEM;
    if (!r)
        r = rd(ctx, ss->sh_offset, names, ss->sh_size);
    if (!r) {
        r = -ENOENT;
        size_t want = ap_strnlen(name, SIZE_MAX) + 1; /* the name and its NUL */
        for (uint32_t i = 1; i < eh.e_shnum && r == -ENOENT; i++) {
            uint32_t n = sh[i].sh_name;
            if (n >= ss->sh_size || ss->sh_size - n < want ||
                !ap_equal_small((const uint8_t *)names + n, (const uint8_t *)name, want))
                continue;
            if (sh[i].sh_type != SHT_NOBITS && !in_file(sh[i].sh_offset, sh[i].sh_size, size)) {
                r = -ENOEXEC;
                break;
            }
            *out = (struct ap_elf_section){i, sh[i].sh_type, sh[i].sh_flags, sh[i].sh_offset,
                                           sh[i].sh_size, eh.e_shoff + (uint64_t)i * sizeof(*sh)};
            r = 0;
        }
    }
    free(names);
    free(sh);
    return r;
}

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) & ~(a - 1);
}

/*
 * One walk of a segment's notes: the first altpatch note of each type of
 * @p type (want: how many, 1 or 2) into @p desc / @p descsz (NULL when
 * none). It stops when every type is found or at a malformed note.
 */
static void note_walk(const uint8_t *p, size_t size, size_t align, const uint32_t *type,
                      size_t want, const uint8_t **desc, uint32_t *descsz)
{
    size_t found = 0;
    for (size_t i = 0; i < want; i++)
        desc[i] = NULL;
    size_t off = 0;
    /* off may pass size by a last note's padding (next is bounded by size
     * rounded up): the walk ends there */
    while (found < want && off <= size && size - off >= sizeof(Elf64_Nhdr)) {
        Elf64_Nhdr nh;
        memcpy(&nh, p + off, sizeof(nh));
        size_t name = off + sizeof(nh);
        size_t d = align_up(name + nh.n_namesz, align);
        size_t next = align_up(d + nh.n_descsz, align);
        if (nh.n_namesz > size || nh.n_descsz > size || d > size ||
            next > align_up(size, align) || next <= off)
            return; /* malformed: stop, never read past the segment */
        for (size_t i = 0; i < want; i++) {
            if (!desc[i] && nh.n_type == type[i] && nh.n_namesz == sizeof(ALTPATCH_NOTE_NAME) &&
                memcmp(p + name, ALTPATCH_NOTE_NAME, sizeof(ALTPATCH_NOTE_NAME)) == 0 &&
                d + nh.n_descsz <= size) {
                desc[i] = p + d;
                descsz[i] = nh.n_descsz;
                found++;
            }
        }
        off = next;
    }
}

AP_HOT const uint8_t *ap_note_find(const uint8_t *p, size_t size, size_t align, uint32_t *descsz)
{
    static const uint32_t type[1] = {ALTPATCH_NOTE_TYPE};
    const uint8_t *d;
    note_walk(p, size, align, type, 1, &d, descsz);
    return d;
}

AP_HOT const uint8_t *ap_note_find_plan(const uint8_t *p, size_t size, size_t align, uint32_t *descsz,
                                 const uint8_t **plan, uint32_t *plansz)
{
    static const uint32_t type[2] = {ALTPATCH_NOTE_TYPE, ALTPATCH_PLAN_NOTE_TYPE};
    const uint8_t *d[2];
    uint32_t sz[2] = {0, 0};
    note_walk(p, size, align, type, 2, d, sz);
    *descsz = sz[0];
    *plan = d[0] ? d[1] : NULL; /* the plan note of the table note's segment */
    *plansz = d[0] && d[1] ? sz[1] : 0;
    return d[0];
}
