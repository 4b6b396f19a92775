/* SPDX-License-Identifier: MIT */
/*
 * move_note IN OUT ADDR: copy the ELF file IN to OUT with the p_vaddr of every
 * PT_NOTE program header set to ADDR (nothing else changes), through libelf.
 * Builds fixtures whose note segment lies outside the loaded segments, as a
 * hostile or broken file could (tests/test_badnote.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int copy_file(const char *in, const char *out)
{
    FILE *f = fopen(in, "rb"), *g = fopen(out, "wb");
    int err = !f || !g;
    char buf[65536];
    size_t n;
    while (!err && (n = fread(buf, 1, sizeof(buf), f)) > 0)
        err = fwrite(buf, 1, n, g) != n;
    if (f && ferror(f))
        err = 1;
    if (f)
        fclose(f);
    if (g && fclose(g))
        err = 1;
    return err ? -1 : 0;
}

static int move_notes(int fd, unsigned long long addr)
{
    Elf *e = elf_begin(fd, ELF_C_RDWR, NULL);
    size_t n = 0;
    int moved = 0;
    if (!e || elf_getphdrnum(e, &n) != 0)
        return -1;
    elf_flagelf(e, ELF_C_SET, ELF_F_LAYOUT); /* keep every offset as it is */
    for (size_t i = 0; i < n; i++) {
        GElf_Phdr ph;
        if (!gelf_getphdr(e, (int)i, &ph))
            return -1;
        if (ph.p_type != PT_NOTE)
            continue;
        ph.p_vaddr = addr;
        if (!gelf_update_phdr(e, (int)i, &ph))
            return -1;
        moved++;
    }
    int ok = moved > 0 && elf_update(e, ELF_C_WRITE) >= 0;
    elf_end(e);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s IN OUT ADDR\n", argv[0]);
        return 2;
    }
    if (elf_version(EV_CURRENT) == EV_NONE || copy_file(argv[1], argv[2])) {
        fprintf(stderr, "move_note: cannot copy %s to %s\n", argv[1], argv[2]);
        return 1;
    }
    int fd = open(argv[2], O_RDWR);
    if (fd < 0 || move_notes(fd, strtoull(argv[3], NULL, 0))) {
        fprintf(stderr, "move_note: %s: %s\n", argv[2], fd < 0 ? strerror(errno) : elf_errmsg(-1));
        return 1;
    }
    close(fd);
    return 0;
}
