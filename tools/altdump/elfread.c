/* SPDX-License-Identifier: MIT */
/*
 * The reading path: bytes of an ELF file -> struct ad_image, through libelf.
 * Every check happens before the data it guards is touched; every failure is
 * one message "what is wrong (libelf's message)" for the caller to print.
 * This is the path the fuzz harness (fuzz.c) drives.
 *
 * Relocatable objects have no addresses: their SHF_ALLOC sections are laid
 * out at fake addresses (code packed from AD_REL_BASE, then the other
 * sections page by page; see layout_rel()), undefined symbols get fake addresses above them (except
 * __start_SEC / __stop_SEC, which are the bounds of section SEC, as the
 * linker would define them), and the RELA relocations of every allocated
 * section are applied to a copy of its bytes. A site then has the same bytes
 * and the same decision as in the linked program, only at another address.
 */
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "altdump.h"

#define AD_REL_BASE 0x100000ull
#define AD_REL_ALIGN 0x1000ull
#define AD_MAX_FILE (1ull << 31)
/* .o: distance between the fake addresses of undefined symbols, so that
 * "sym+addend" (a field of a structure such as pv_ops) still names sym. */
#define AD_EXTERN_STRIDE 0x1000ull

/* What resolving the symbols of one RELA section needs. */
struct symctx {
    Elf_Data *symd, *xndx;
    size_t nsyms;
    size_t strndx;
    uint64_t *uval; /* undefined symbols' values, once computed (udone) */
    uint8_t *udone;
};

struct reader {
    struct ad_image *img;
    Elf *elf;
    char *err;
    size_t errsz;
    uint64_t extern_base; /* .o: fake addresses of undefined symbols */
    size_t sym_cached;    /* .o: the symbol table whose symctx is cached (0: none) */
    struct symctx sc;
};

__attribute__((format(printf, 2, 3))) static int fail(struct reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->errsz, fmt, ap);
    va_end(ap);
    return AD_EXIT_BADINPUT;
}

/* " (libelf's message)" when a libelf call failed, else "" (never "(no error)"). */
static const char *elfmsg(void)
{
    static char buf[256];
    int e = elf_errno();
    const char *m = e ? elf_errmsg(e) : NULL;
    if (!m || !*m)
        return "";
    snprintf(buf, sizeof(buf), " (%s)", m);
    return buf;
}

static int oom(struct reader *r)
{
    snprintf(r->err, r->errsz, "out of memory");
    return AD_EXIT_INTERNAL;
}

/* --- header ---------------------------------------------------------------- */

static int check_header(struct reader *r, GElf_Ehdr *eh)
{
    struct ad_image *img = r->img;
    if (elf_kind(r->elf) != ELF_K_ELF)
        return fail(r, "not an ELF file%s", elfmsg());
    int cls = gelf_getclass(r->elf);
    if (cls != ELFCLASS64)
        return fail(r, "not a 64-bit ELF (class %d)%s", cls, elfmsg());
    if (!gelf_getehdr(r->elf, eh))
        return fail(r, "cannot read the ELF header%s", elfmsg());
    if (eh->e_machine != EM_X86_64)
        return fail(r, "not an x86-64 ELF (e_machine %u)", (unsigned)eh->e_machine);
    if (eh->e_type != ET_EXEC && eh->e_type != ET_DYN && eh->e_type != ET_REL)
        return fail(r, "unsupported ELF type %u (want EXEC, DYN or REL)", (unsigned)eh->e_type);
    img->elf_type = eh->e_type;
    if (eh->e_shoff == 0)
        return fail(r, "no section headers (e_shoff 0)");
    uint64_t shsz = (uint64_t)eh->e_shentsize;
    if (shsz != sizeof(Elf64_Shdr))
        return fail(r, "bad section header size %llu", (unsigned long long)shsz);
    /* The header's own count first: libelf reports 0 for headers it could not read. */
    size_t shnum = eh->e_shnum;
    if (eh->e_shoff > img->len || (img->len - eh->e_shoff) / shsz < (shnum ? shnum : 1))
        return fail(r, "section headers outside the file ([0x%llx, +%llu x %llu bytes), file "
                       "size %zu)",
                    (unsigned long long)eh->e_shoff, (unsigned long long)(shnum ? shnum : 1),
                    (unsigned long long)shsz, img->len);
    if (elf_getshdrnum(r->elf, &shnum) != 0)
        return fail(r, "cannot read the section count%s", elfmsg());
    if (shnum > (img->len - eh->e_shoff) / shsz)
        return fail(r, "section headers outside the file (e_shoff 0x%llx, %zu headers, file "
                       "size %zu)",
                    (unsigned long long)eh->e_shoff, shnum, img->len);
    return 0;
}

static int read_phdrs(struct reader *r, const GElf_Ehdr *eh)
{
    struct ad_image *img = r->img;
    size_t phnum;
    if (eh->e_phoff == 0)
        return 0;
    if (elf_getphdrnum(r->elf, &phnum) != 0)
        return fail(r, "cannot read the program header count%s", elfmsg());
    if (eh->e_phoff > img->len || phnum > (img->len - eh->e_phoff) / sizeof(Elf64_Phdr))
        return fail(r, "program headers outside the file (e_phoff 0x%llx, %zu headers)",
                    (unsigned long long)eh->e_phoff, phnum);
    img->loads = calloc(phnum ? phnum : 1, sizeof(*img->loads));
    if (!img->loads)
        return oom(r);
    for (size_t i = 0; i < phnum; i++) {
        GElf_Phdr ph;
        if (!gelf_getphdr(r->elf, (int)i, &ph))
            return fail(r, "cannot read program header %zu%s", i, elfmsg());
        if (ph.p_type != PT_LOAD)
            continue;
        img->loads[img->nloads++] = (struct ad_load){ph.p_offset, ph.p_vaddr, ph.p_filesz,
                                                     ph.p_memsz};
    }
    return 0;
}

/* --- sections -------------------------------------------------------------- */

static int read_sections(struct reader *r)
{
    struct ad_image *img = r->img;
    size_t shnum, shstrndx;
    if (elf_getshdrnum(r->elf, &shnum) != 0)
        return fail(r, "cannot read the section count%s", elfmsg());
    if (elf_getshdrstrndx(r->elf, &shstrndx) != 0)
        return fail(r, "cannot read the section name table index%s", elfmsg());
    img->secs = calloc(shnum ? shnum : 1, sizeof(*img->secs));
    if (!img->secs)
        return oom(r);
    img->nsecs = shnum;
    for (size_t i = 1; i < shnum; i++) {
        Elf_Scn *scn = elf_getscn(r->elf, i);
        GElf_Shdr sh;
        if (!scn || !gelf_getshdr(scn, &sh))
            return fail(r, "cannot read section header %zu%s", i, elfmsg());
        struct ad_section *s = &img->secs[i];
        s->name = elf_strptr(r->elf, shstrndx, sh.sh_name);
        if (!s->name)
            return fail(r, "section %zu has no valid name%s", i, elfmsg());
        s->type = sh.sh_type;
        s->flags = sh.sh_flags;
        s->addr = sh.sh_addr;
        s->size = sh.sh_size;
        s->offset = sh.sh_offset;
        s->align = sh.sh_addralign;
        if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL)
            continue;
        if (sh.sh_offset > img->len || sh.sh_size > img->len - sh.sh_offset)
            return fail(r, "section %zu '%s' [0x%llx, +0x%llx) lies outside the file (size %zu)", i,
                        s->name, (unsigned long long)sh.sh_offset,
                        (unsigned long long)sh.sh_size, img->len);
        if ((sh.sh_flags & SHF_ALLOC) && sh.sh_addr + sh.sh_size < sh.sh_addr)
            return fail(r, "section %zu '%s' wraps around the address space", i, s->name);
        s->data = img->buf + sh.sh_offset;
    }
    return 0;
}

const struct ad_section *ad_section_by_name(const struct ad_image *img, const char *name)
{
    for (size_t i = 1; i < img->nsecs; i++)
        if (img->secs[i].name && strcmp(img->secs[i].name, name) == 0)
            return &img->secs[i];
    return NULL;
}

/* --- relocatable objects: fake layout + RELA ------------------------------- */

static uint64_t align_up(uint64_t v, uint64_t a)
{
    if (a < 2)
        return v;
    return (v + a - 1) & ~(a - 1);
}

/* altinstr_replacement, or the kernel's .altinstr_replacement. */
static bool is_repl_name(const char *name)
{
    return strcmp(name, "altinstr_replacement") == 0 ||
           strcmp(name, ".altinstr_replacement") == 0;
}

static bool is_code(const struct ad_section *s)
{
    return (s->flags & SHF_ALLOC) && (s->flags & SHF_EXECINSTR) && !is_repl_name(s->name);
}

/* Sections a linker concatenates into one table: index into AD_NJOINED arrays, or -1. */
static int joined_kind(const char *name)
{
    if (strcmp(name, "altinstructions") == 0)
        return 0;
    if (strcmp(name, "altinstr_replacement") == 0)
        return 1;
    if (strcmp(name, "altinstr_table") == 0)
        return 2;
    return -1;
}

/* Place section @p s at or after @p cur, aligned to @p align; returns its end. */
static uint64_t place(struct ad_section *s, uint64_t cur, uint64_t align)
{
    s->addr = align_up(cur, align);
    return s->addr + (s->size > (1ull << 32) ? (1ull << 32) : s->size);
}

static uint64_t capped_align(const struct ad_section *s)
{
    return s->align > AD_REL_ALIGN ? AD_REL_ALIGN : s->align;
}

/*
 * The first allocated section named like @p first (altinstructions or
 * altinstr_replacement) on a new page, then every later allocated one of that
 * name right after it at its alignment, in index order: one contiguous
 * table, as the linker makes of the copies in different section groups.
 */
static uint64_t place_joined(struct ad_image *img, size_t first, uint64_t cur)
{
    cur = place(&img->secs[first], cur, AD_REL_ALIGN);
    for (size_t j = first + 1; j < img->nsecs; j++) {
        struct ad_section *t = &img->secs[j];
        if ((t->flags & SHF_ALLOC) && strcmp(t->name, img->secs[first].name) == 0)
            cur = place(t, cur, capped_align(t));
    }
    return cur;
}

/*
 * Fake addresses for a relocatable object: first the code sections packed
 * one after the other at their alignment, in index order (as a linker
 * gathers .text and .text.* into one .text), from AD_REL_BASE; then every
 * other allocated section, each on a new page, except that all sections
 * named altinstructions (one per COMDAT group, "a?R") follow one another
 * as one table, and likewise altinstr_replacement.
 */
static void layout_rel(struct reader *r)
{
    struct ad_image *img = r->img;
    uint64_t cur = AD_REL_BASE;
    bool seen[AD_NJOINED] = {false, false, false};
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 1; i < img->nsecs; i++) {
            struct ad_section *s = &img->secs[i];
            if (!(s->flags & SHF_ALLOC) || is_code(s) != (pass == 0))
                continue;
            int k = pass == 1 ? joined_kind(s->name) : -1;
            if (k >= 0 && seen[k])
                continue; /* placed with the first of its name */
            if (k >= 0) {
                seen[k] = true;
                cur = place_joined(img, i, cur);
            } else {
                cur = place(s, cur, pass == 0 ? capped_align(s) : AD_REL_ALIGN);
            }
        }
        cur = align_up(cur, AD_REL_ALIGN);
    }
    r->extern_base = align_up(cur + AD_REL_ALIGN, AD_REL_ALIGN);
}

/* [*lo, *hi) spanned by the allocated sections named @p name; false if none. */
static bool name_span(const struct ad_image *img, const char *name, uint64_t *lo, uint64_t *hi)
{
    bool any = false;
    for (size_t i = 1; i < img->nsecs; i++) {
        const struct ad_section *s = &img->secs[i];
        if (!(s->flags & SHF_ALLOC) || strcmp(s->name, name) != 0)
            continue;
        if (!any || s->addr < *lo)
            *lo = s->addr;
        if (!any || s->addr + s->size > *hi)
            *hi = s->addr + s->size;
        any = true;
    }
    return any;
}


static int symctx_init(struct reader *r, size_t symidx, struct symctx *c)
{
    struct ad_image *img = r->img;
    Elf_Scn *scn = elf_getscn(r->elf, symidx);
    GElf_Shdr sh;
    free(c->uval);
    free(c->udone);
    memset(c, 0, sizeof(*c));
    if (img->secs[symidx].type != SHT_SYMTAB)
        return fail(r, "a relocation section does not link a symbol table (section %zu)", symidx);
    if (!scn || !gelf_getshdr(scn, &sh) || !(c->symd = elf_getdata(scn, NULL)))
        return fail(r, "cannot read the symbol table%s", elfmsg());
    c->nsyms = c->symd->d_size / sizeof(Elf64_Sym);
    c->strndx = sh.sh_link;
    c->uval = calloc(c->nsyms ? c->nsyms : 1, sizeof(*c->uval));
    c->udone = calloc(c->nsyms ? c->nsyms : 1, 1);
    if (!c->uval || !c->udone)
        return oom(r);
    for (size_t i = 1; i < img->nsecs; i++) {
        Elf_Scn *xs = elf_getscn(r->elf, i);
        GElf_Shdr xh;
        if (img->secs[i].type == SHT_SYMTAB_SHNDX && xs && gelf_getshdr(xs, &xh) &&
            xh.sh_link == symidx)
            c->xndx = elf_getdata(xs, NULL);
    }
    return 0;
}

/*
 * Address of symbol @p idx in the fake layout: section address + value for
 * defined symbols, the value for SHN_ABS, the bounds of all sections named
 * SEC for __start_SEC / __stop_SEC, and a distinct fake address for any other undefined symbol.
 */
static int sym_value(struct reader *r, struct symctx *c, size_t idx, uint64_t *out)
{
    struct ad_image *img = r->img;
    GElf_Sym sym;
    Elf32_Word xshndx = 0;
    if (idx >= c->nsyms)
        return fail(r, "relocation uses symbol %zu of %zu", idx, c->nsyms);
    if (!gelf_getsymshndx(c->symd, c->xndx, (int)idx, &sym, &xshndx))
        return fail(r, "cannot read symbol %zu%s", idx, elfmsg());
    size_t shndx = sym.st_shndx == SHN_XINDEX ? xshndx : sym.st_shndx;
    if (sym.st_shndx == SHN_ABS) {
        *out = sym.st_value;
        return 0;
    }
    if (sym.st_shndx != SHN_UNDEF && sym.st_shndx != SHN_COMMON) {
        if (shndx >= img->nsecs)
            return fail(r, "symbol %zu refers to section %zu of %zu", idx, shndx, img->nsecs);
        *out = img->secs[shndx].addr + sym.st_value;
        return 0;
    }
    if (c->udone[idx]) { /* a walk of the sections once per symbol, not per relocation */
        *out = c->uval[idx];
        return 0;
    }
    const char *name = elf_strptr(r->elf, c->strndx, sym.st_name);
    bool start = name && strncmp(name, "__start_", 8) == 0;
    uint64_t lo = 0, hi = 0;
    if (name && (start || strncmp(name, "__stop_", 7) == 0) &&
        name_span(img, name + (start ? 8 : 7), &lo, &hi))
        *out = start ? lo : hi;
    else
        *out = r->extern_base + AD_EXTERN_STRIDE * (uint64_t)idx;
    c->uval[idx] = *out;
    c->udone[idx] = 1;
    return 0;
}

static void put_le(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Field width and PC-relativity of a relocation type; width 0: not applied. */
static size_t rela_kind(unsigned type, bool *pcrel)
{
    *pcrel = type == R_X86_64_PC32 || type == R_X86_64_PLT32 || type == R_X86_64_PC64;
    switch (type) {
    case R_X86_64_PC32: case R_X86_64_PLT32: case R_X86_64_32: case R_X86_64_32S: return 4;
    case R_X86_64_64: case R_X86_64_PC64: return 8;
    default: return 0; /* NONE, GOT and TLS forms: the field keeps its assembled value */
    }
}

/* Make section @p t's bytes a private copy that relocations may change. */
static int own_copy(struct reader *r, struct ad_section *t)
{
    if (t->copy)
        return 0;
    t->copy = malloc(t->size ? t->size : 1);
    if (!t->copy)
        return oom(r);
    memcpy(t->copy, t->data, t->size);
    t->data = t->copy;
    return 0;
}

/*
 * The one rule for relocation sections: altdump applies those of an object
 * (ET_REL) of type SHT_RELA whose target section is loaded (SHF_ALLOC).
 * Every other non-loaded one -- of debugging information or other unloaded
 * sections, of an executable or library, SHT_REL -- is neither applied nor
 * read from the file (read_parts()); a loaded one (.rela.dyn, .rela.plt of an
 * executable or library) is read, not applied.
 */
static bool rel_applied(unsigned elf_type, uint32_t type, uint64_t target_flags)
{
    return elf_type == ET_REL && type == SHT_RELA && (target_flags & SHF_ALLOC);
}

/* Apply one RELA section to the copy of its target section:  S + A (- P). */
static int apply_rela(struct reader *r, size_t relidx)
{
    struct ad_image *img = r->img;
    struct ad_section *rs = &img->secs[relidx];
    Elf_Scn *scn = elf_getscn(r->elf, relidx);
    GElf_Shdr sh;
    if (!scn || !gelf_getshdr(scn, &sh))
        return fail(r, "cannot read section header %zu%s", relidx, elfmsg());
    if (sh.sh_info == 0 || sh.sh_info >= img->nsecs || sh.sh_link == 0 ||
        sh.sh_link >= img->nsecs)
        return fail(r, "relocation section '%s' has bad links (info %u, link %u)", rs->name,
                    (unsigned)sh.sh_info, (unsigned)sh.sh_link);
    struct ad_section *t = &img->secs[sh.sh_info];
    if (!rel_applied(img->elf_type, sh.sh_type, t->flags) || !t->data)
        return 0; /* debug info and the like: not needed */
    /* One walk of the sections per symbol table, not per relocation section. */
    struct symctx *c = &r->sc;
    Elf_Data *rd = elf_getdata(scn, NULL);
    int rc = 0;
    if (r->sym_cached != sh.sh_link) {
        r->sym_cached = 0;
        rc = symctx_init(r, sh.sh_link, c);
        if (!rc)
            r->sym_cached = sh.sh_link;
    }
    if (!rc && !rd)
        rc = fail(r, "cannot read relocations of '%s'%s", t->name, elfmsg());
    if (!rc)
        rc = own_copy(r, t);
    size_t nrel = rd ? rd->d_size / sizeof(Elf64_Rela) : 0;
    for (size_t i = 0; !rc && i < nrel; i++) {
        GElf_Rela ra;
        bool pcrel;
        uint64_t s = 0;
        if (!gelf_getrela(rd, (int)i, &ra))
            return fail(r, "cannot read relocation %zu of '%s'%s", i, rs->name, elfmsg());
        size_t width = rela_kind((unsigned)GELF_R_TYPE(ra.r_info), &pcrel);
        if (!width)
            continue;
        if (ra.r_offset > t->size || width > t->size - ra.r_offset)
            return fail(r, "relocation %zu of '%s' at 0x%llx lies outside the section (size 0x%llx)",
                        i, rs->name, (unsigned long long)ra.r_offset,
                        (unsigned long long)t->size);
        rc = sym_value(r, c, GELF_R_SYM(ra.r_info), &s);
        uint64_t v = s + (uint64_t)ra.r_addend - (pcrel ? t->addr + ra.r_offset : 0);
        if (!rc)
            put_le(t->copy + ra.r_offset, v, width);
    }
    return rc;
}

/*
 * After relocation: one buffer holding every (relocated) section named like
 * joined kind @p k, at the span the layout gave them, gaps 0 (table) or int3
 * (replacements). Only needed when there are several such sections.
 */
static int join_sections(struct reader *r, int k)
{
    static const char *const names[AD_NJOINED] = {"altinstructions", "altinstr_replacement",
                                                  "altinstr_table"};
    struct ad_image *img = r->img;
    uint64_t lo = 0, hi = 0;
    size_t count = 0;
    for (size_t i = 1; i < img->nsecs; i++) {
        const struct ad_section *s = &img->secs[i];
        if (!(s->flags & SHF_ALLOC) || strcmp(s->name, names[k]) != 0)
            continue;
        if (!s->data)
            return fail(r, "section %zu '%s' has no contents", i, s->name);
        count++;
    }
    if (count < 2 || !name_span(img, names[k], &lo, &hi))
        return 0;
    if (hi < lo || hi - lo > img->len)
        return fail(r, "the %zu '%s' sections span 0x%llx bytes, more than the file", count,
                    names[k], (unsigned long long)(hi - lo));
    uint8_t *m = malloc(hi - lo ? hi - lo : 1);
    if (!m)
        return oom(r);
    memset(m, k == 1 ? 0xcc : 0, hi - lo);
    for (size_t i = 1; i < img->nsecs; i++) {
        const struct ad_section *s = &img->secs[i];
        if ((s->flags & SHF_ALLOC) && strcmp(s->name, names[k]) == 0)
            memcpy(m + (s->addr - lo), s->data, s->size);
    }
    img->joined_buf[k] = m;
    img->joined[k] = (struct ad_region){lo, hi - lo, m};
    return 0;
}

static int relocate_rel(struct reader *r)
{
    layout_rel(r);
    for (size_t i = 1; i < r->img->nsecs; i++) {
        if (r->img->secs[i].type != SHT_RELA)
            continue;
        int rc = apply_rela(r, i);
        if (rc) {
            free(r->sc.uval);
            free(r->sc.udone);
            return rc;
        }
    }
    free(r->sc.uval);
    free(r->sc.udone);
    memset(&r->sc, 0, sizeof(r->sc));
    int rc = 0;
    for (int k = 0; k < AD_NJOINED && !rc; k++)
        rc = join_sections(r, k);
    return rc;
}

/* --- note, tables, view ---------------------------------------------------- */

/*
 * Bytes of [addr, addr+len) if they lie inside one joined table (.o with
 * several altinstructions / altinstr_replacement sections) or inside one
 * allocated section with contents.
 */
const uint8_t *ad_bytes_at(const struct ad_image *img, uint64_t addr, uint64_t len)
{
    for (int k = 0; k < AD_NJOINED; k++) {
        const struct ad_region *j = &img->joined[k];
        if (j->data && addr >= j->addr && addr - j->addr <= j->size &&
            len <= j->size - (addr - j->addr))
            return j->data + (addr - j->addr);
    }
    for (size_t i = 1; i < img->nsecs; i++) {
        const struct ad_section *s = &img->secs[i];
        if (!(s->flags & SHF_ALLOC) || !s->data)
            continue;
        if (addr >= s->addr && addr - s->addr <= s->size && len <= s->size - (addr - s->addr))
            return s->data + (addr - s->addr);
    }
    return NULL;
}

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A self-relative s32 at @p p, which lies at address @p at. */
static uint64_t rd_selfrel(const uint8_t *p, uint64_t at)
{
    return at + (uint64_t)(int64_t)(int32_t)rd_u32(p);
}

/*
 * The note descriptor (docs/format.md): u32 version, u32 record size, then
 * four self-relative s32: table start and end, replacements start and end.
 * Versions 1 and 2 (pre-patched) share it. ALTPATCH_REASON_NONE,
 * BAD_VERSION (another format) or BAD_TABLE (reversed bounds).
 */
static int note_parse(const uint8_t *d, size_t descsz, uint64_t at, struct ad_note *n)
{
    memset(n, 0, sizeof(*n));
    if (descsz < 8)
        return ALTPATCH_REASON_BAD_VERSION;
    n->version = rd_u32(d);
    n->record_size = rd_u32(d + 4);
    bool kernel = n->version == ALTPATCH_FORMAT_KERNEL || n->version == AD_FORMAT_PREPATCHED;
    bool compact = n->version == ALTPATCH_FORMAT_COMPACT ||
                   n->version == AD_FORMAT_COMPACT_PREPATCHED;
    if (!(kernel && n->record_size == ALTPATCH_RECORD_SIZE_KERNEL) &&
        !(compact && n->record_size == ALTPATCH_RECORD_SIZE_COMPACT))
        return ALTPATCH_REASON_BAD_VERSION;
    if (descsz != 24)
        return ALTPATCH_REASON_BAD_VERSION;
    n->table_start = rd_selfrel(d + 8, at + 8);
    n->table_end = rd_selfrel(d + 12, at + 12);
    n->repl_start = rd_selfrel(d + 16, at + 16);
    n->repl_end = rd_selfrel(d + 20, at + 20);
    if (n->table_end < n->table_start || n->repl_end < n->repl_start)
        return ALTPATCH_REASON_BAD_TABLE;
    return ALTPATCH_REASON_NONE;
}

/* Look for the altpatch note in the SHT_NOTE section @p ns; *found says whether it is there. */
static int read_note(struct reader *r, const struct ad_section *ns, bool *found)
{
    struct ad_image *img = r->img;
    Elf_Scn *scn = elf_getscn(r->elf, (size_t)(ns - img->secs));
    Elf_Data *d = scn ? elf_getdata(scn, NULL) : NULL;
    *found = false;
    if (!d)
        return fail(r, "cannot read note section '%s'%s", ns->name, elfmsg());
    size_t off = 0, name_off, desc_off;
    GElf_Nhdr nh;
    while (off < d->d_size && (off = gelf_getnote(d, off, &nh, &name_off, &desc_off)) > 0) {
        if (nh.n_type != ALTPATCH_NOTE_TYPE || nh.n_namesz != sizeof(ALTPATCH_NOTE_NAME) ||
            memcmp((const char *)d->d_buf + name_off, ALTPATCH_NOTE_NAME, nh.n_namesz) != 0)
            continue;
        *found = true;
        img->note_size = ns->size;
        /* The descriptor as relocated (for .o) lives in ns->data at the same offset. */
        if (desc_off > ns->size || nh.n_descsz > ns->size - desc_off)
            return fail(r, "altpatch note descriptor outside its section");
        int rc = note_parse(ns->data + desc_off, nh.n_descsz, ns->addr + desc_off, &img->note);
        if (rc == ALTPATCH_REASON_BAD_VERSION)
            return fail(r, "unsupported altpatch note (format version %u, record size %u, "
                           "descriptor %u bytes; this altdump reads versions %d and %d, record "
                           "sizes %d and %d)",
                        img->note.version, img->note.record_size, (unsigned)nh.n_descsz,
                        ALTPATCH_FORMAT_COMPACT, ALTPATCH_FORMAT_KERNEL,
                        ALTPATCH_RECORD_SIZE_COMPACT, ALTPATCH_RECORD_SIZE_KERNEL);
        if (rc != ALTPATCH_REASON_NONE)
            return fail(r, "bad altpatch note (%s)", altpatch_strreason(rc));
        return 0;
    }
    return 0;
}

/* The altpatch note, in whichever note section the link put it (.note.altpatch first). */
static int find_note(struct reader *r, bool *found)
{
    struct ad_image *img = r->img;
    const struct ad_section *named = ad_section_by_name(img, ".note.altpatch");
    *found = false;
    if (named && named->type == SHT_NOTE && named->data) {
        int rc = read_note(r, named, found);
        if (rc || *found)
            return rc;
    }
    for (size_t i = 1; i < img->nsecs; i++) {
        const struct ad_section *s = &img->secs[i];
        if (s == named || s->type != SHT_NOTE || !s->data || !(s->flags & SHF_ALLOC))
            continue;
        int rc = read_note(r, s, found);
        if (rc || *found)
            return rc;
    }
    return 0;
}

static int find_tables(struct reader *r)
{
    struct ad_image *img = r->img;
    struct ad_note *n = &img->note;
    if (n->table_end < n->table_start || n->repl_end < n->repl_start)
        return fail(r, "altpatch note has reversed bounds (table 0x%llx..0x%llx, replacement "
                       "0x%llx..0x%llx)",
                    (unsigned long long)n->table_start, (unsigned long long)n->table_end,
                    (unsigned long long)n->repl_start, (unsigned long long)n->repl_end);
    img->table_addr = n->table_start;
    img->table_size = n->table_end - n->table_start;
    img->table = img->table_size ? ad_bytes_at(img, n->table_start, img->table_size)
                                 : (const uint8_t *)"";
    if (!img->table)
        return fail(r, "altinstructions [0x%llx, 0x%llx) named by the note lies outside the "
                       "file's sections",
                    (unsigned long long)n->table_start, (unsigned long long)n->table_end);
    uint64_t rlen = n->repl_end - n->repl_start;
    const uint8_t *repl = rlen ? ad_bytes_at(img, n->repl_start, rlen) : NULL;
    if (rlen && !repl)
        return fail(r, "altinstr_replacement [0x%llx, 0x%llx) named by the note lies outside "
                       "the file's sections",
                    (unsigned long long)n->repl_start, (unsigned long long)n->repl_end);
    img->repl = (struct ad_region){n->repl_start, rlen, repl};
    return 0;
}

static int cmp_region(const void *a, const void *b)
{
    const struct ad_region *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/*
 * More executable sections than a view holds (ALTPATCH_IMAGE_MAX_TEXT; a .o
 * built with -ffunction-sections): one region spanning all of them, gaps
 * filled with int3. Sites in a gap then decode as int3 and are refused by the planner.
 */
static int merge_all(struct reader *r, struct ad_region *reg, size_t *n)
{
    uint64_t lo = reg[0].addr, hi = 0;
    for (size_t i = 0; i < *n; i++)
        if (reg[i].addr + reg[i].size > hi)
            hi = reg[i].addr + reg[i].size;
    /* The gaps are filled (and copied again by the library): never more
     * than the file holds, whatever the addresses (or a .o's SHT_NOBITS
     * code section) say. */
    if (hi - lo > (1ull << 30) || hi - lo > r->img->len + (uint64_t)*n * AD_REL_ALIGN)
        return fail(r, "executable sections span 0x%llx bytes, more than the file's %zu; cannot "
                       "inspect", (unsigned long long)(hi - lo), r->img->len);
    uint8_t *m = malloc(hi - lo ? hi - lo : 1);
    if (!m)
        return oom(r);
    memset(m, 0xcc, hi - lo);
    for (size_t i = 0; i < *n; i++)
        memcpy(m + (reg[i].addr - lo), reg[i].data, reg[i].size);
    r->img->merged = m;
    reg[0] = (struct ad_region){lo, hi - lo, m};
    *n = 1;
    return 0;
}

static int build_view(struct reader *r)
{
    struct ad_image *img = r->img;
    struct ad_region *reg = calloc(img->nsecs ? img->nsecs : 1, sizeof(*reg));
    size_t n = 0;
    if (!reg)
        return oom(r);
    for (size_t i = 1; i < img->nsecs; i++) {
        const struct ad_section *s = &img->secs[i];
        if ((s->flags & (SHF_ALLOC | SHF_EXECINSTR)) != (SHF_ALLOC | SHF_EXECINSTR) || !s->data ||
            s->size == 0 || is_repl_name(s->name))
            continue;
        reg[n++] = (struct ad_region){s->addr, s->size, s->data};
    }
    qsort(reg, n, sizeof(*reg), cmp_region);
    int rc = n > ALTPATCH_IMAGE_MAX_TEXT ? merge_all(r, reg, &n) : 0;
    if (!rc) {
        memcpy(img->text, reg, n * sizeof(*reg));
        img->ntext = n;
    }
    free(reg);
    return rc;
}

/* --- symbols --------------------------------------------------------------- */

/* A name printed in the one-line messages and the table: no control bytes
 * (a newline would forge a line, an escape sequence drive the terminal). */
static bool printable_name(const char *n)
{
    for (const unsigned char *p = (const unsigned char *)n; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

static int read_symbols(struct reader *r)
{
    struct ad_image *img = r->img;
    size_t symidx = 0;
    for (size_t i = 1; i < img->nsecs && !symidx; i++)
        if (img->secs[i].type == SHT_SYMTAB)
            symidx = i;
    for (size_t i = 1; i < img->nsecs && !symidx; i++)
        if (img->secs[i].type == SHT_DYNSYM)
            symidx = i;
    if (!symidx)
        return 0;
    Elf_Scn *scn = elf_getscn(r->elf, symidx);
    GElf_Shdr sh;
    Elf_Data *d = scn && gelf_getshdr(scn, &sh) ? elf_getdata(scn, NULL) : NULL;
    if (!d)
        return fail(r, "cannot read the symbol table%s", elfmsg());
    size_t n = d->d_size / sizeof(Elf64_Sym);
    img->syms = calloc(n ? n : 1, sizeof(*img->syms));
    if (!img->syms)
        return oom(r);
    for (size_t i = 1; i < n; i++) {
        GElf_Sym s;
        if (!gelf_getsym(d, (int)i, &s))
            return fail(r, "cannot read symbol %zu%s", i, elfmsg());
        int t = GELF_ST_TYPE(s.st_info);
        if (t != STT_FUNC && t != STT_OBJECT && t != STT_NOTYPE && t != STT_GNU_IFUNC)
            continue;
        if (s.st_shndx == SHN_UNDEF && img->elf_type == ET_REL && r->extern_base) {
            /* The fake address sym_value() gives it: names call targets such as BUG_func. */
            const char *name = elf_strptr(r->elf, sh.sh_link, s.st_name);
            if (name && *name && printable_name(name) && strncmp(name, "__start_", 8) != 0 &&
                strncmp(name, "__stop_", 7) != 0) {
                uint64_t a = r->extern_base + AD_EXTERN_STRIDE * (uint64_t)i;
                img->syms[img->nsyms++] =
                    (struct ad_symbol){a, 0, a + AD_EXTERN_STRIDE, name, false};
            }
            continue;
        }
        if (s.st_shndx == SHN_UNDEF || s.st_shndx >= SHN_LORESERVE || s.st_shndx >= img->nsecs)
            continue;
        const char *name = elf_strptr(r->elf, sh.sh_link, s.st_name);
        if (!name || !*name || (name[0] == '.' && name[1] == 'L') || !printable_name(name))
            continue;
        if (t == STT_OBJECT && strcmp(name, "linux_banner") == 0 && img->elf_type != ET_REL)
            img->banner_addr = s.st_value; /* a kernel's version string (kernel.c) */
        if (!(img->secs[s.st_shndx].flags & SHF_ALLOC))
            continue; /* sites and operands name allocated bytes only */
        uint64_t addr = s.st_value;
        if (img->elf_type == ET_REL)
            addr += img->secs[s.st_shndx].addr;
        const struct ad_section *sec = &img->secs[s.st_shndx];
        img->syms[img->nsyms++] = (struct ad_symbol){addr, s.st_size, sec->addr + sec->size, name,
                                                     t == STT_FUNC || t == STT_GNU_IFUNC};
    }
    ad_symbols_sort(img);
    return 0;
}

/* --- records and sites: the library's image of the tables ----------------- */

static char *lib_msg;
static size_t lib_msgsz;

/* The library's WARN line about the tables, kept as the reader's message. */
static int lib_capture(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level == ALTPATCH_WARN && lib_msg && !lib_msg[0])
        vsnprintf(lib_msg, lib_msgsz, fmt, ap);
    return 0;
}

/* Make the library's "NAME: what\n" just "what". */
void ad_strip_msg(char *m, const char *name)
{
    size_t n = strlen(name), len = strlen(m);
    if (len && m[len - 1] == '\n')
        m[--len] = '\0';
    if (strncmp(m, "altpatch: ", 10) == 0) { /* the library's prefix on every message */
        memmove(m, m + 10, len - 9);
        len -= 10;
    }
    if (strncmp(m, name, n) == 0 && m[n] == ':' && m[n + 1] == ' ')
        memmove(m, m + n + 2, len - n - 1);
}

struct load {
    struct ad_image *img;
    size_t entry, off;
};

/* Bytes of every site inside the text (the originals' total). */
static int count_bytes(const struct altpatch_image_site *s, void *ctx)
{
    if (s->original)
        *(size_t *)ctx += s->len;
    return 0;
}

static int load_site(const struct altpatch_image_site *s, void *ctx)
{
    struct load *l = ctx;
    struct ad_image *img = l->img;
    struct ad_site *st = &img->sites[s->index];
    *st = (struct ad_site){s->addr, (uint32_t)l->entry, s->entries, (uint8_t)s->len, s->reason,
                           NULL};
    if (s->original) {
        memcpy(img->origs + l->off, s->original, s->len);
        st->orig = img->origs + l->off;
        l->off += s->len;
    }
    for (unsigned k = 0; k < s->entries; k++) {
        struct altpatch_image_entry e = {.sz = sizeof(e)};
        if (altpatch_image_site_entry(img->ai, s->index, k, &e) != 0)
            return -EIO;
        img->entries[l->entry++] = (struct ad_entry){
            .site = s->addr,
            .repl = e.repl_addr,
            .feature = (uint16_t)e.feature,
            .flags = (uint16_t)e.flags,
            .instrlen = (uint8_t)e.instrlen,
            .repllen = (uint8_t)e.repl_len,
            .index = e.index,
        };
    }
    return 0;
}

/*
 * Hand the table, the replacements and the text regions to the library
 * (altpatch_image_open_regions: the view built as the runtime builds it,
 * the records decoded and grouped into sites), then take the sites, their
 * entries and original bytes back for printing.
 */
static int open_tables(struct reader *r, unsigned layout, const unsigned *known, size_t nknown,
                       unsigned flags)
{
    struct ad_image *img = r->img;
    struct altpatch_image_region text[ALTPATCH_IMAGE_MAX_TEXT];
    for (size_t i = 0; i < img->ntext; i++)
        text[i] = (struct altpatch_image_region){img->text[i].addr, img->text[i].size,
                                                 img->text[i].data};
    struct altpatch_image_regions d = {
        .sz = sizeof(d),
        .name = img->file,
        .layout = layout,
        .table = {img->table_addr, img->table_size, img->table},
        .repl = {img->repl.addr, img->repl.size, img->repl.data},
        .text = text,
        .ntext = img->ntext,
        .known = known,
        .nknown = nknown,
        .flags = flags,
    };
    r->err[0] = '\0';
    lib_msg = r->err;
    lib_msgsz = r->errsz;
    altpatch_print_fn prev = altpatch_set_print(lib_capture);
    int rc = altpatch_image_open_regions(&d, &img->ai);
    altpatch_set_print(prev);
    lib_msg = NULL;
    if (rc == -ENOMEM)
        return oom(r);
    if (rc) {
        ad_strip_msg(r->err, img->file);
        if (!r->err[0])
            snprintf(r->err, r->errsz, "cannot decode the records (%s)", strerror(-rc));
        return AD_EXIT_BADINPUT;
    }
    r->err[0] = '\0';
    struct altpatch_image_info info = {.sz = sizeof(info)};
    if (altpatch_image_get_info(img->ai, &info) != 0)
        return oom(r);
    size_t total = 0;
    img->nentries = info.entries;
    img->nsites = info.sites;
    img->entries = calloc(info.entries ? info.entries : 1, sizeof(*img->entries));
    img->sites = calloc(info.sites ? info.sites : 1, sizeof(*img->sites));
    altpatch_image_site_foreach(img->ai, count_bytes, &total);
    img->origs = malloc(total ? total : 1);
    if (!img->entries || !img->sites || !img->origs)
        return oom(r);
    struct load l = {img, 0, 0};
    if (altpatch_image_site_foreach(img->ai, load_site, &l) != 0)
        return oom(r);
    return 0;
}

static int read_records(struct reader *r)
{
    struct ad_image *img = r->img;
    bool compact = img->note.record_size == ALTPATCH_RECORD_SIZE_COMPACT;
    if (img->table_size % img->note.record_size)
        return fail(r, "%s holds %zu bytes, not a multiple of the %u-byte record",
                    compact ? "altinstr_table" : "altinstructions", img->table_size,
                    img->note.record_size);
    return open_tables(r, compact ? ALTPATCH_LAYOUT_COMPACT : ALTPATCH_LAYOUT_ALTPATCH, NULL, 0,
                       0);
}

/* --- Linux kernel images and modules --------------------------------------- */

/* The kernel release: vermagic= of .modinfo (modules), else linux_banner. */
static void kernel_version(struct ad_image *img)
{
    struct ad_kernel *k = &img->kernel;
    const struct ad_section *mi = ad_section_by_name(img, ".modinfo");
    if (mi && mi->data) {
        const char *p = (const char *)mi->data, *end = p + mi->size;
        while (p < end) {
            size_t n = strnlen(p, (size_t)(end - p));
            if (n > 9 && strncmp(p, "vermagic=", 9) == 0) {
                ad_kernel_set_release(k, p + 9, n - 9, "vermagic");
                return;
            }
            p += n + 1;
        }
    }
    static const char tag[] = "Linux version ";
    const size_t want = sizeof(tag) - 1 + 64;
    for (size_t len = want; img->banner_addr && len > sizeof(tag); len /= 2) {
        const char *b = (const char *)ad_bytes_at(img, img->banner_addr, len);
        if (b && strncmp(b, tag, sizeof(tag) - 1) == 0) {
            ad_kernel_set_release(k, b + sizeof(tag) - 1, len - (sizeof(tag) - 1),
                                  "linux_banner");
            return;
        }
    }
}

/*
 * A kernel's tables: .altinstructions (relocated for a module) holds the
 * records, .altinstr_replacement the replacements; layout and numbering
 * follow the version found in the image (kernel.c).
 */
static int read_kernel(struct reader *r)
{
    struct ad_image *img = r->img;
    const struct ad_section *t = ad_section_by_name(img, ".altinstructions");
    const struct ad_section *rp = ad_section_by_name(img, ".altinstr_replacement");
    img->kernel.on = true;
    img->kernel.module = img->elf_type == ET_REL;
    if (!t->data)
        return fail(r, "kernel .altinstructions has no contents");
    if (rp && !rp->data)
        return fail(r, "kernel .altinstr_replacement has no contents");
    kernel_version(img);
    int rc = ad_kernel_layout(&img->kernel, t->size, r->err, r->errsz);
    if (rc)
        return rc;
    img->table_addr = t->addr;
    img->table_size = t->size;
    img->table = t->data;
    if (rp)
        img->repl = (struct ad_region){rp->addr, rp->size, rp->data};
    rc = build_view(r);
    if (rc)
        return rc;
    unsigned *known = calloc(ALTPATCH_FEATURE_BITS, sizeof(*known));
    size_t nknown = 0;
    if (!known)
        return oom(r);
    unsigned flags = ad_kernel_rules(img, known, &nknown);
    rc = open_tables(r, img->kernel.record_size == AD_KREC_NEW ? ALTPATCH_LAYOUT_ALTPATCH
                                                               : ALTPATCH_LAYOUT_LINUX_12,
                     known, nknown, flags);
    free(known);
    return rc;
}

/* --- entry points ---------------------------------------------------------- */

static int read_all(struct reader *r, unsigned flags)
{
    struct ad_image *img = r->img;
    GElf_Ehdr eh;
    int rc = check_header(r, &eh);
    if (!rc)
        rc = read_phdrs(r, &eh);
    if (!rc)
        rc = read_sections(r);
    if (!rc && img->elf_type == ET_REL)
        rc = relocate_rel(r);
    if (!rc)
        rc = read_symbols(r);
    if (rc)
        return rc;
    bool found;
    rc = find_note(r, &found);
    if (rc)
        return rc;
    if (!found && ad_section_by_name(img, ".altinstructions")) {
        rc = read_kernel(r);
        if (!rc)
            img->has_alt = true;
        return rc;
    }
    if (!found) {
        const char *t = ad_section_by_name(img, "altinstr_table") ? "altinstr_table"
                        : ad_section_by_name(img, "altinstructions") ? "altinstructions"
                                                                      : NULL;
        if (t) /* tables without their note: broken, also where none are needed (--compare) */
            return fail(r, "has %s but no altpatch note (the runtime would ignore it)", t);
        if (flags & AD_READ_ALLOW_NOALT)
            return 0;
        return fail(r, "no altpatch tables (no .note.altpatch note, no kernel .altinstructions)");
    }
    if (!rc)
        rc = find_tables(r);
    if (!rc)
        rc = build_view(r);
    /* A pre-patched file: its originals go back into the text first. */
    if (!rc && (img->note.version == AD_FORMAT_PREPATCHED ||
                img->note.version == AD_FORMAT_COMPACT_PREPATCHED))
        rc = ad_prepatched_read(img, r->err, r->errsz);
    if (!rc)
        rc = read_records(r);
    if (!rc && img->prepatched)
        rc = ad_prepatched_match(img, r->err, r->errsz);
    if (!rc)
        img->has_alt = true;
    return rc;
}

/*
 * The end of both entry points: unless @p rc already failed, parse the
 * image's bytes (img->buf, @p len of them) through libelf. On a failure the
 * image is freed; its file name @p name stays for the caller's message.
 */
static int read_image(struct reader *r, int rc, size_t len, unsigned flags, const char *name)
{
    struct ad_image *img = r->img;
    if (!rc) {
        img->len = len;
        (void)elf_errno();
        r->elf = elf_memory((char *)img->buf, len);
        img->elf = r->elf;
        rc = r->elf ? read_all(r, flags) : fail(r, "not an ELF file%s", elfmsg());
    }
    if (rc)
        ad_image_free(img);
    img->file = name;
    return rc;
}

int ad_read_memory(const void *buf, size_t len, const char *name, unsigned flags,
                   struct ad_image *img, char *err, size_t errsz)
{
    struct reader r = {.img = img, .err = err, .errsz = errsz};
    memset(img, 0, sizeof(*img));
    img->file = name;
    if (elf_version(EV_CURRENT) == EV_NONE)
        return fail(&r, "libelf is too old%s", elfmsg());
    if (len == 0)
        return fail(&r, "empty file");
    img->buf = malloc(len);
    if (!img->buf)
        return oom(&r);
    memcpy(img->buf, buf, len);
    return read_image(&r, 0, len, flags, name);
}

/* [off, off + len) of the file into the same bytes of @p buf: 0, or an errno
 * (ENODATA: the file ended first -- it was truncated while read). */
static int pread_at(int fd, uint8_t *buf, uint64_t off, uint64_t len)
{
    for (uint64_t got = 0; got < len;) {
        ssize_t k = pread(fd, buf + off + got, (size_t)(len - got), (off_t)(off + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? errno : ENODATA;
        got += (uint64_t)k;
    }
    return 0;
}

/* True when [off, off + len) lies inside a file of @p size bytes. */
static bool in_file(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

/* True when section @p i of @p sh is debugging information (not loaded, named
 * .debug* or .zdebug* in @p names, @p nlen bytes): not read. */
static bool is_debug(const Elf64_Shdr *sh, size_t i, const char *names, size_t nlen)
{
    size_t room = sh[i].sh_name < nlen ? nlen - sh[i].sh_name : 0;
    const char *n = room ? names + sh[i].sh_name : "";
    return !(sh[i].sh_flags & SHF_ALLOC) && ((room >= 6 && memcmp(n, ".debug", 6) == 0) ||
                                             (room >= 7 && memcmp(n, ".zdebug", 7) == 0));
}

/*
 * Read the parts of the file (of @p size bytes, into @p buf as large) that
 * altdump and libelf look at: the ELF, program and section headers, what the
 * program headers load, and every section but the debugging information and
 * the unloaded relocations altdump does not apply (rel_applied(): a vmlinux's
 * .debug_*, .rela.debug_* and .rela.text are most of it).
 * The other bytes stay unread (zeros): pages never written cost no memory.
 * A file whose headers do not say where its parts
 * are is read whole (libelf and the checks then say what is wrong).
 * 0, or an errno as pread_at().
 */
static int read_parts(int fd, uint8_t *buf, uint64_t size)
{
    Elf64_Ehdr eh;
    if (size < sizeof(eh))
        return pread_at(fd, buf, 0, size);
    int e = pread_at(fd, buf, 0, sizeof(eh));
    if (e)
        return e;
    memcpy(&eh, buf, sizeof(eh));
    uint64_t phlen = (uint64_t)eh.e_phnum * eh.e_phentsize;
    uint64_t shlen = (uint64_t)eh.e_shnum * eh.e_shentsize;
    /* Not an ELF64 little-endian file: refused on its header alone (a data
     * file mapped by a process, --pid), nothing more read. */
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] != ELFDATA2LSB)
        return 0;
    if (eh.e_shnum == 0 || eh.e_shstrndx == SHN_XINDEX ||
        eh.e_shstrndx >= eh.e_shnum || eh.e_shentsize != sizeof(Elf64_Shdr) ||
        (eh.e_phnum && eh.e_phentsize != sizeof(Elf64_Phdr)) ||
        !in_file(eh.e_phoff, phlen, size) || !in_file(eh.e_shoff, shlen, size) ||
        eh.e_shoff % 8 || eh.e_phoff % 8)
        return pread_at(fd, buf, 0, size);
    if ((e = pread_at(fd, buf, eh.e_phoff, phlen)) || (e = pread_at(fd, buf, eh.e_shoff, shlen)))
        return e;
    /* The headers and the section names as first read, in memory of their
     * own: a later read of a range that covers them (a file changed while
     * read) overwrites the buffer's copy, never what this loop uses. */
    Elf64_Phdr *ph = malloc(phlen ? phlen : 1);
    Elf64_Shdr *sh = malloc(shlen);
    char *names = NULL;
    if (!ph || !sh) {
        e = ENOMEM;
        goto out;
    }
    memcpy(ph, buf + eh.e_phoff, phlen);
    memcpy(sh, buf + eh.e_shoff, shlen);
    const Elf64_Shdr str = sh[eh.e_shstrndx];
    size_t nlen = str.sh_type != SHT_NOBITS && in_file(str.sh_offset, str.sh_size, size)
                      ? (size_t)str.sh_size
                      : 0;
    if (nlen) {
        if ((e = pread_at(fd, buf, str.sh_offset, nlen)))
            goto out;
        if (!(names = malloc(nlen))) {
            e = ENOMEM;
            goto out;
        }
        memcpy(names, buf + str.sh_offset, nlen);
    }
    for (size_t i = 0; i < eh.e_phnum; i++)
        if ((ph[i].p_type == PT_LOAD || ph[i].p_type == PT_NOTE) &&
            in_file(ph[i].p_offset, ph[i].p_filesz, size) &&
            (e = pread_at(fd, buf, ph[i].p_offset, ph[i].p_filesz)))
            goto out;
    for (size_t i = 1; i < eh.e_shnum; i++) {
        if (sh[i].sh_type == SHT_NOBITS || !in_file(sh[i].sh_offset, sh[i].sh_size, size))
            continue; /* nothing in the file, or refused by the section checks */
        if (is_debug(sh, i, names, nlen))
            continue;
        /* Relocation sections that are not loaded and not applied (a vmlinux
         * linked with --emit-relocs has hundreds of MB of them). */
        if ((sh[i].sh_type == SHT_RELA || sh[i].sh_type == SHT_REL) &&
            !(sh[i].sh_flags & SHF_ALLOC) &&
            !(sh[i].sh_info < eh.e_shnum &&
              rel_applied(eh.e_type, sh[i].sh_type, sh[sh[i].sh_info].sh_flags)))
            continue;
        if ((e = pread_at(fd, buf, sh[i].sh_offset, sh[i].sh_size)))
            goto out;
    }
out:
    free(ph);
    free(sh);
    free(names);
    return e;
}

int ad_read_file(const char *path, unsigned flags, struct ad_image *img, char *err,
                 size_t errsz)
{
    struct reader r = {.img = img, .err = err, .errsz = errsz};
    struct stat st, fst;
    memset(img, 0, sizeof(*img));
    img->file = path;
    /* Type first, by name: opening a FIFO or a terminal could block. */
    if (stat(path, &st) != 0)
        return fail(&r, "cannot open (%s)", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fail(&r, "not a regular file (%s)",
                    S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                    : S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode)
                    ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket" : "not a file");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return fail(&r, "cannot open (%s)", strerror(errno));
    if (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode) || fst.st_ino != st.st_ino ||
        fst.st_dev != st.st_dev) {
        close(fd);
        return fail(&r, "not a regular file (changed while opening)");
    }
    if ((uint64_t)fst.st_size > AD_MAX_FILE) {
        close(fd);
        return fail(&r, "larger than 2 GiB");
    }
    if (fst.st_size == 0) {
        close(fd);
        return fail(&r, "empty file");
    }
    if (elf_version(EV_CURRENT) == EV_NONE) {
        close(fd);
        return fail(&r, "libelf is too old%s", elfmsg());
    }
    /* Read, not mapped: a file truncated under a mapping turns the reads of
     * its lost pages into SIGBUS; a copy in memory stays what was opened.
     * The copy is writable: a pre-patched file gets its originals put back
     * into these bytes (prepatched.c). Zeroed: the bytes left unread (debug
     * sections) read as zeros, the same every run; a large calloc() gets
     * fresh pages, which cost no memory until written. */
    size_t n = (size_t)fst.st_size;
    img->buf = calloc(n, 1);
    if (!img->buf) {
        close(fd);
        return oom(&r);
    }
    int rerr = read_parts(fd, img->buf, n);
    close(fd);
    int rc = rerr == ENODATA ? fail(&r, "truncated while read (%zu bytes when opened)", n)
             : rerr          ? fail(&r, "cannot read (%s)", strerror(rerr))
                             : 0;
    return read_image(&r, rc, n, flags, path);
}

void ad_image_free(struct ad_image *img)
{
    if (img->elf)
        elf_end(img->elf);
    for (size_t i = 0; img->secs && i < img->nsecs; i++)
        free(img->secs[i].copy);
    free(img->secs);
    free(img->loads);
    free(img->merged);
    for (int k = 0; k < AD_NJOINED; k++)
        free(img->joined_buf[k]);
    free(img->entries);
    free(img->sites);
    free(img->origs);
    altpatch_image_close(img->ai);
    free(img->syms);
    free(img->pp_written);
    free(img->pp_off);
    free(img->pp_addr);
    free(img->pp_len);
    altpatch_features_free(img->pp_fs);
    free(img->buf);
    memset(img, 0, sizeof(*img));
}
