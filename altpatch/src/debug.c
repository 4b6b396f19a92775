/* SPDX-License-Identifier: MIT */
/*
 * debug.c - what apply says about a site: one block per site under
 * ALTPATCH_DEBUG, in the style of the kernel's debug-alternative (feature,
 * site as symbol+offset, lengths, flags, old and final bytes), and the one
 * WARN line when a site becomes refused.
 */
#include "apply.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static void ap_hex(char *out, size_t outsz, const uint8_t *p, size_t len)
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < len && o + 4 < outsz; i++)
        o += (size_t)snprintf(out + o, outsz - o, i ? " %02x" : "%02x", p[i]);
}

/** "symbol+0xoff" (dladdr), else "module+0xoff". */
static void ap_symbolize(char *out, size_t outsz, const struct ap_module *m, uint64_t addr)
{
    Dl_info di;
    if (dladdr((void *)(uintptr_t)addr, &di) && di.dli_sname && di.dli_saddr) {
        snprintf(out, outsz, "%s+0x%lx", di.dli_sname,
                 (unsigned long)(addr - (uintptr_t)di.dli_saddr));
        return;
    }
    const char *name = m->path[0] ? m->path : program_invocation_short_name;
    const char *slash = strrchr(name, '/');
    snprintf(out, outsz, "%s+0x%lx", slash ? slash + 1 : name, (unsigned long)(addr - m->base));
}

static void ap_debug_entry(const struct ap_entry *e, const char *sym)
{
    const char *name = altpatch_feature_name(e->feature);
    ap_log(ALTPATCH_DEBUG,
           "feat: %s%u*32+%u (%s), old: (%s (0x%lx) len: %u), repl: (0x%lx, len: %u) "
           "flags: 0x%x\n",
           (e->flags & ALT_FLAG_NOT) ? "!" : "", e->feature / 32, e->feature % 32,
           name ? name : "?", sym, (unsigned long)e->site, e->instrlen, (unsigned long)e->repl,
           e->repllen, e->flags);
}

/** One block per site, in the style of the kernel's debug-alternative. */
void ap_debug_site(const struct ap_work *wk)
{
    const struct ap_site site = ap_site_get(wk->m, wk->idx), *s = &site;
    char sym[192], hex[AP_MAX_SITE * 3 + 1];
    unsigned long a = (unsigned long)s->addr;
    ap_symbolize(sym, sizeof(sym), wk->m, s->addr);
    struct ap_site_entries eb;
    const struct ap_site *es;
    const struct ap_entry *e = ap_module_site_entries(wk->m, wk->idx, &eb, &es);
    for (uint32_t k = 0; k < s->count; k++)
        ap_debug_entry(&e[es->first + k], sym);
    if (s->count > 1) {
        if (wk->chosen >= 0)
            ap_log(ALTPATCH_DEBUG, "0x%lx: chosen: entry %d of %u\n", a, wk->chosen, s->count);
        else
            ap_log(ALTPATCH_DEBUG, "0x%lx: chosen: original\n", a);
    }
    if (wk->reason)
        ap_log(ALTPATCH_DEBUG, "0x%lx: refused: %s%s%s\n", a, altpatch_strreason(wk->reason),
               wk->detail ? ": " : "", wk->detail ? wk->detail : "");
    if (!wk->orig)
        return;
    ap_hex(hex, sizeof(hex), wk->orig, s->len);
    ap_log(ALTPATCH_DEBUG, "0x%lx:   old_insn: %s\n", a, hex);
    ap_hex(hex, sizeof(hex), wk->action == AP_ACT_REFUSED ? wk->cur : wk->target, s->len);
    ap_log(ALTPATCH_DEBUG, "0x%lx: final_insn: %s\n", a, hex);
}

/** One WARN line when a site becomes refused (not again while the reason stays). */
void ap_warn_refusal(const struct ap_work *wk)
{
    const struct ap_site site = ap_site_get(wk->m, wk->idx), *s = &site;
    char sym[192];
    ap_symbolize(sym, sizeof(sym), wk->m, s->addr);
    ap_log(ALTPATCH_WARN, "site %s (0x%lx) refused: %s%s%s\n", sym, (unsigned long)s->addr,
           altpatch_strreason(wk->reason), wk->detail ? ": " : "",
           wk->detail ? wk->detail : "");
}

