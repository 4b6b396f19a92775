/* SPDX-License-Identifier: MIT */
/*
 * The executable segments of a loaded object, from the loader's program
 * headers (dl_iterate_phdr): an oracle of where text lies that is not the
 * library's own view of it.
 */
#ifndef AP_EXEC_SEGS_H
#define AP_EXEC_SEGS_H

#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define AP_EXEC_SEGS_MAX 4

struct ap_exec_segs {
    char name[512]; /* the object's file name (after its last '/') */
    uintptr_t addr[AP_EXEC_SEGS_MAX];
    size_t size[AP_EXEC_SEGS_MAX];
    int n;
};

static int ap_exec_segs_cb(struct dl_phdr_info *info, size_t size, void *p)
{
    struct ap_exec_segs *s = p;
    (void)size;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    if (!slash || strcmp(slash + 1, s->name))
        return 0;
    for (int i = 0; i < info->dlpi_phnum && s->n < AP_EXEC_SEGS_MAX; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            s->addr[s->n] = info->dlpi_addr + ph->p_vaddr;
            s->size[s->n++] = ph->p_memsz;
        }
    }
    return 1;
}

/** The executable PT_LOAD segments of the loaded object named @p file (a
 * file name, no directory) into @p s; their number. */
static inline int ap_exec_segs_find(struct ap_exec_segs *s, const char *file)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%.*s", (int)sizeof(s->name) - 1, file);
    dl_iterate_phdr(ap_exec_segs_cb, s);
    return s->n;
}

/** True when [@p a, +@p len) lies inside one of @p s's segments (and len > 0). */
static inline bool ap_exec_segs_hold(const struct ap_exec_segs *s, uintptr_t a, size_t len)
{
    for (int k = 0; k < s->n; k++)
        if (len && a >= s->addr[k] && a - s->addr[k] < s->size[k] &&
            len <= s->size[k] - (a - s->addr[k]))
            return true;
    return false;
}

#endif /* AP_EXEC_SEGS_H */
