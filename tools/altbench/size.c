/* SPDX-License-Identifier: MIT */
/*
 * Part 4: text-size overhead. Reads two builds of the same generated program
 * (with ALTERNATIVE sites / with only the original instructions) through
 * libelf and splits the difference into records, replacements, padding and
 * the per-module note.
 */
#include "bench.h"
#include "../common/berkeley.h"

#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <altpatch/alternative.h>

struct elf_sizes {
    struct berkeley_sizes b;                /* as size(1) counts them */
    uint64_t code, records, repl, note;     /* .text, the record table(s), altinstr_replacement, .note.altpatch */
    uint64_t entries;                       /* records: 12 B in altinstr_table, 14 in altinstructions */
};

static void add_section(struct elf_sizes *z, const char *name, const GElf_Shdr *sh)
{
    if (!(sh->sh_flags & SHF_ALLOC))
        return;
    berkeley_add(&z->b, sh->sh_flags, sh->sh_type, sh->sh_size);
    if (!strcmp(name, ".text"))
        z->code += sh->sh_size;
    else if (!strcmp(name, "altinstr_table"))
        z->records += sh->sh_size, z->entries += sh->sh_size / ALTPATCH_RECORD_SIZE_COMPACT;
    else if (!strcmp(name, "altinstructions"))
        z->records += sh->sh_size, z->entries += sh->sh_size / ALTPATCH_RECORD_SIZE_KERNEL;
    else if (!strcmp(name, "altinstr_replacement"))
        z->repl += sh->sh_size;
    else if (!strcmp(name, ".note.altpatch"))
        z->note += sh->sh_size;
}

/* Walk the section headers of @p path with libelf. 0, or -1 after a message. */
static int read_sizes(const char *path, struct elf_sizes *z)
{
    memset(z, 0, sizeof(*z));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "altbench size: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    Elf *e = elf_begin(fd, ELF_C_READ, NULL);
    size_t shstrndx;
    if (!e || elf_kind(e) != ELF_K_ELF || gelf_getclass(e) != ELFCLASS64) {
        fprintf(stderr, "altbench size: %s: not a 64-bit ELF file (%s)\n", path, elf_errmsg(-1));
        goto out;
    }
    if (elf_getshdrstrndx(e, &shstrndx) != 0) {
        fprintf(stderr, "altbench size: %s: elf_getshdrstrndx: %s\n", path, elf_errmsg(-1));
        goto out;
    }
    for (Elf_Scn *scn = elf_nextscn(e, NULL); scn; scn = elf_nextscn(e, scn)) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh)) {
            fprintf(stderr, "altbench size: %s: gelf_getshdr: %s\n", path, elf_errmsg(-1));
            goto out;
        }
        const char *name = elf_strptr(e, shstrndx, sh.sh_name);
        add_section(z, name ? name : "", &sh);
    }
    rc = 0;
out:
    if (e)
        elf_end(e);
    close(fd);
    return rc;
}

static void size_row(const char *what, const struct elf_sizes *z)
{
    printf("| %s | %llu | %llu | %llu | %llu |\n", what, (unsigned long long)z->b.text,
           (unsigned long long)z->b.data, (unsigned long long)z->b.bss,
           (unsigned long long)(z->b.text + z->b.data + z->b.bss));
}

static void part_row(const char *what, int64_t bytes, unsigned long sites)
{
    printf("| %s | %lld | %.2f |\n", what, (long long)bytes, (double)bytes / (double)sites);
}

int ab_mode_size(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: altbench size ALT_PROG PLAIN_PROG SITES\n");
        return 2;
    }
    char *end;
    unsigned long sites = strtoul(argv[2], &end, 0);
    if (*end || sites == 0) {
        fprintf(stderr, "altbench size: bad site count '%s'\n", argv[2]);
        return 2;
    }
    if (elf_version(EV_CURRENT) == EV_NONE) {
        fprintf(stderr, "altbench size: libelf: %s\n", elf_errmsg(-1));
        return 1;
    }
    struct elf_sizes a, p;
    if (read_sizes(argv[0], &a) || read_sizes(argv[1], &p))
        return 1;
    struct elf_sizes d = {{a.b.text - p.b.text, a.b.data - p.b.data, a.b.bss - p.b.bss}, 0, 0, 0, 0, 0};
    printf("### Text-size overhead: %lu sites\n\n", sites);
    printf("Section sizes read with libelf; columns as `size` (Berkeley) counts them: text = "
           "every allocated read-only section, so it includes the record table "
           "(`altinstr_table`, or `altinstructions` for format 1) and "
           "`altinstr_replacement`.\n\n");
    printf("| build | text | data | bss | dec |\n|---|---:|---:|---:|---:|\n");
    size_row("only the original instructions", &p);
    size_row("ALTERNATIVE sites", &a);
    size_row("difference", &d);
    int64_t pad = (int64_t)a.code - (int64_t)p.code;
    int64_t total = (int64_t)(a.records + a.repl + a.note) + pad;
    printf("\n| part | bytes | bytes per site |\n|---|---:|---:|\n");
    char what[96];
    snprintf(what, sizeof(what), "records (%.2f B per entry)",
             a.entries ? (double)a.records / (double)a.entries : 0.0);
    part_row(what, (int64_t)a.records, sites);
    part_row("replacements (`altinstr_replacement`)", (int64_t)a.repl, sites);
    part_row("padding (`.text` growth: NOPs after shorter originals)", pad, sites);
    part_row("`.note.altpatch` (once per module)", (int64_t)a.note, sites);
    part_row("**total**", total, sites);
    printf("| Linux kernel (seed): +25.7 KB for 1578 sites | 25700 | 16.29 |\n\n");
    printf("Entries: %llu (%.2f per site; ALTERNATIVE_2 sites carry two).\n\n",
           (unsigned long long)a.entries, (double)a.entries / (double)sites);
    return 0;
}
