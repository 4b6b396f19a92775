/* SPDX-License-Identifier: MIT */
/*
 * Naming addresses: the symbol whose [value, value+size) covers the address,
 * else the nearest preceding zero-size label. Functions win over other
 * symbols at the same address, then the longer symbol, then the name.
 */
#include <stdlib.h>
#include <string.h>

#include "altdump.h"

static int cmp_sym(const void *a, const void *b)
{
    const struct ad_symbol *x = a, *y = b;
    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    if (x->func != y->func)
        return x->func ? -1 : 1;
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    return strcmp(x->name, y->name);
}

void ad_symbols_sort(struct ad_image *img)
{
    if (img->nsyms)
        qsort(img->syms, img->nsyms, sizeof(*img->syms), cmp_sym);
}

/* Index of the first symbol with addr > @p addr. */
static size_t upper(const struct ad_image *img, uint64_t addr)
{
    size_t lo = 0, hi = img->nsyms;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (img->syms[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const struct ad_symbol *ad_symbol_at(const struct ad_image *img, uint64_t addr, uint64_t *off)
{
    size_t u = upper(img, addr);
    /* A sized symbol covering addr wins; look back over a few neighbours. */
    for (size_t i = u, steps = 0; i > 0 && steps < 64; i--, steps++) {
        const struct ad_symbol *s = &img->syms[i - 1];
        if (s->size && addr - s->addr < s->size) {
            *off = addr - s->addr;
            return s;
        }
    }
    /* Else the nearest preceding label (size 0) of the same section. */
    if (u > 0) {
        const struct ad_symbol *s = &img->syms[u - 1];
        if (!s->size && addr < s->sec_end) {
            *off = addr - s->addr;
            return s;
        }
    }
    return NULL;
}

void ad_symbolize(const struct ad_image *img, uint64_t addr, char *out, size_t outsz)
{
    uint64_t off = 0;
    const struct ad_symbol *s = ad_symbol_at(img, addr, &off);
    if (!s)
        snprintf(out, outsz, "%s", "");
    else
        snprintf(out, outsz, "%s+0x%llx", s->name, (unsigned long long)off);
}
