/* SPDX-License-Identifier: MIT */
/*
 * Prints altpatch/src/known_plans.c: the templates the planner makes for
 * the sites of every primitive (ap_every_primitive.h), one per answer
 * (the original, each entry), keyed without features and flags.
 *
 *   build/tests/known_plans_gen > altpatch/src/known_plans.c
 *
 * tests/test_known.c checks the table against the planner.
 */
#include <stdio.h>
#include <stdlib.h>

#include "ap_every_primitive.h"
#include "ap_known_walk.h"

#define MAX_PLANS 64

static struct apk_plan plans[MAX_PLANS];
static size_t nplans;

static void take(const struct ap_memo_tmpl *t)
{
    struct apk_plan k;
    apk_normal(t, &k);
    if (k.chosen > INT8_MAX) {
        fprintf(stderr, "known_plans_gen: entry %d does not fit the table\n", k.chosen);
        exit(1);
    }
    for (size_t i = 0; i < nplans; i++)
        if (plans[i].keylen == k.keylen && plans[i].len == k.len &&
            plans[i].chosen == k.chosen &&
            !memcmp(plans[i].bytes, k.bytes, 2 * k.keylen + k.len))
            return;
    if (nplans == MAX_PLANS) {
        fprintf(stderr, "known_plans_gen: more than %d templates\n", MAX_PLANS);
        exit(1);
    }
    plans[nplans++] = k;
}

int main(void)
{
    struct ap_module *list = NULL;
    if (ap_modules_refresh(&list) != 0 || !apk_main_module(list)) {
        fprintf(stderr, "known_plans_gen: this program's table not found\n");
        return 1;
    }
    struct ap_module *m = apk_main_module(list);
    ap_known_plans_off = true; /* the planner's own answers */
    for (size_t i = 0; i < m->nsites; i++) {
        struct ap_site_entries eb;
        const struct ap_site *s;
        const struct ap_entry *ents = ap_module_site_entries(m, i, &eb, &s);
        const uint8_t *orig = (const uint8_t *)(uintptr_t)s->addr;
        for (int c = -1; c < (int)s->count; c++) {
            struct altpatch_features fs;
            if (!apk_set_for(&m->view, s, ents, c, &fs))
                continue;
            struct ap_memo memo;
            struct ap_plan out;
            ap_memo_init(&memo, &fs);
            uint32_t id = ap_memo_plan(&memo, &m->view, s, ents, orig, &fs, &out);
            if (out.reason != ALTPATCH_REASON_NONE || !id) {
                fprintf(stderr, "known_plans_gen: site %zu, entry %d: not stored (%s)\n", i, c,
                        out.detail);
                return 1;
            }
            take(&memo.tmpl[id - 1]);
            ap_memo_free(&memo);
        }
    }
    ap_modules_free(list);
    printf("/* SPDX-License-Identifier: MIT */\n"
           "/*\n"
           " * The templates of the primitives' shapes (plan.h, struct ap_known_plan),\n"
           " * printed by tests/known_plans_gen.c; tests/test_known.c checks them.\n"
           " */\n"
           "#include \"plan.h\"\n\n");
    size_t at = 0, fat = 0, nf = 0;
    printf("const uint8_t ap_known_bytes[] = {");
    for (size_t i = 0; i < nplans; i++) {
        const struct apk_plan *k = &plans[i];
        size_t n = 2 * k->keylen + k->len;
        printf("\n    /* %zu: at %zu */", i, at);
        for (size_t j = 0; j < n; j++)
            printf("%s0x%02x,", j % 12 ? " " : "\n    ", k->bytes[j]);
        at += n;
        nf += k->nfields;
    }
    printf("\n};\n\nconst struct ap_memo_field ap_known_fields[] = {\n");
    for (size_t i = 0; i < nplans; i++)
        for (size_t j = 0; j < plans[i].nfields; j++) {
            const struct ap_memo_field *f = &plans[i].f[j];
            printf("    {.kpos = %u, .entry = %u, .end = %u, .pos = %u, .size = %u, "
                   ".repllen = %u}, /* %zu */\n",
                   f->kpos, f->entry, f->end, f->pos, f->size, f->repllen, i);
        }
    if (!nf)
        printf("    {0},\n");
    printf("};\n\nconst struct ap_known_plan ap_known_plans[] = {\n");
    at = 0;
    for (size_t i = 0; i < nplans; i++) {
        const struct apk_plan *k = &plans[i];
        printf("    {.at = %zu, .fields_at = %zu, .keylen = %zu, .count = %zu, .len = %zu, "
               ".nfields = %zu,\n     .chosen = %d, .relative = %s},\n",
               at, fat, k->keylen, k->count, k->len, k->nfields, k->chosen,
               k->relative ? "true" : "false");
        at += 2 * k->keylen + k->len;
        fat += k->nfields;
    }
    if (at > UINT16_MAX || fat > UINT16_MAX) {
        fprintf(stderr, "known_plans_gen: the table outgrew its 16-bit offsets\n");
        return 1;
    }
    printf("};\nconst size_t ap_known_nplans = sizeof(ap_known_plans) / sizeof(ap_known_plans[0]);\n");
    return 0;
}
