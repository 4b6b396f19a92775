/* SPDX-License-Identifier: MIT */
/*
 * Part 3: the apply-scaling tables, from the `key=value` lines the generated
 * programs print (apply_main.c, xray_main.c). Reads every file given ("-" is
 * stdin), so the numbers of one run end up side by side.
 *
 * Several lines for one N and phase are rounds of one interleaved run: a
 * cell is then the min / median of the rounds' minima (ns_min), and a ratio
 * against XRay also the median of the round-by-round ratios (the k-th line of
 * each, where both have as many). A single line is shown as it is: its own
 * min / median.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SC_MAX_N 16

enum { PH_COLD, PH_NOCHANGE, PH_DRYRUN, PH_REVERT, PH_WARM, PH_XFIRST, PH_XUNPATCH, PH_XWARM, PH_COUNT };

static const char *const ph_names[PH_COUNT] = {
    "altpatch:cold", "altpatch:nochange", "altpatch:dryrun", "altpatch:revert", "altpatch:warm",
    "xray:first",    "xray:unpatch",      "xray:warm",
};

struct sc_phase {
    bool have;
    double ns_min, ns_med; /* the cell: see the top of this file (sc_summarize()) */
    double *mins;          /* each line's ns_min, in the order read */
    double last_med;       /* the last line's ns_med */
    size_t nlines, cap;
    unsigned long long pages, syscalls, patched, unchanged, seen, refused, bytes;
    long long rc;
};

struct sc_row {
    unsigned long n;
    struct sc_phase ph[PH_COUNT];
};

static struct sc_row rows[SC_MAX_N];
static unsigned nrows;

static struct sc_row *row_for(unsigned long n)
{
    for (unsigned i = 0; i < nrows; i++)
        if (rows[i].n == n)
            return &rows[i];
    if (nrows == SC_MAX_N)
        return NULL;
    unsigned i = nrows++;
    while (i > 0 && rows[i - 1].n > n) { /* keep sorted by n */
        rows[i] = rows[i - 1];
        i--;
    }
    memset(&rows[i], 0, sizeof(rows[i]));
    rows[i].n = n;
    return &rows[i];
}

/* Value of "key=" in @p line, or NULL. */
static const char *val(const char *line, const char *key)
{
    size_t k = strlen(key);
    for (const char *p = line; (p = strstr(p, key)); p++)
        if ((p == line || p[-1] == ' ') && p[k] == '=')
            return p + k + 1;
    return NULL;
}

static unsigned long long num(const char *line, const char *key)
{
    const char *v = val(line, key);
    return v ? strtoull(v, NULL, 10) : 0;
}

/* One result line; returns false when it is not one. */
static bool parse_line(const char *line)
{
    bool alt = !strncmp(line, "altpatch ", 9), xr = !strncmp(line, "xray ", 5);
    const char *n = val(line, "n"), *ph = val(line, "phase");
    if ((!alt && !xr) || !n || !ph)
        return false;
    char name[64];
    snprintf(name, sizeof(name), "%s:%.*s", alt ? "altpatch" : "xray", (int)strcspn(ph, " \n"), ph);
    int p = -1;
    for (int i = 0; i < PH_COUNT; i++)
        if (!strcmp(ph_names[i], name))
            p = i;
    struct sc_row *r = row_for(strtoul(n, NULL, 10));
    if (p < 0 || !r)
        return false;
    struct sc_phase *s = &r->ph[p];
    if (s->nlines == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 32;
        double *m = realloc(s->mins, cap * sizeof(*m));
        if (!m) {
            fprintf(stderr, "altbench scaling: out of memory: a line left out\n");
            return false;
        }
        s->mins = m;
        s->cap = cap;
    }
    s->have = true;
    s->mins[s->nlines++] = (double)num(line, "ns_min");
    s->last_med = (double)num(line, "ns_med");
    s->pages = num(line, "pages");
    s->syscalls = num(line, "syscalls");
    s->patched = num(line, "patched");
    s->unchanged = num(line, "unchanged");
    s->seen = num(line, "seen");
    s->refused = num(line, "refused");
    s->bytes = num(line, "bytes");
    const char *rc = val(line, "rc");
    s->rc = rc ? strtoll(rc, NULL, 10) : 0;
    return true;
}

/* The cell of @p s: one line's own min / median, or the min / median of the
 * lines' minima. */
static int sc_summarize(struct sc_phase *s)
{
    if (!s->have)
        return 0;
    if (s->nlines == 1) {
        s->ns_min = s->mins[0];
        s->ns_med = s->last_med;
        return 0;
    }
    double *v = malloc(s->nlines * sizeof(*v));
    if (!v)
        return -1;
    memcpy(v, s->mins, s->nlines * sizeof(*v));
    struct ab_stat st = ab_stat_sort(v, s->nlines);
    s->ns_min = st.min;
    s->ns_med = st.med;
    free(v);
    return 0;
}

static int read_file(const char *path)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) {
        perror(path);
        return -1;
    }
    char line[1024];
    while (fgets(line, sizeof(line), f))
        parse_line(line);
    if (f != stdin)
        fclose(f);
    return 0;
}

/* "min / median" per unit, or "-" */
static void cell(const struct sc_phase *s, unsigned long n)
{
    if (!s->have)
        printf(" - |");
    else
        printf(" %.1f / %.1f |", s->ns_min / (double)n, s->ns_med / (double)n);
}

static void ratio_cell(const struct sc_phase *a, const struct sc_phase *x, bool goal)
{
    if (!a->have || !x->have || x->ns_med <= 0 || x->ns_min <= 0) {
        printf(" - |");
        return;
    }
    double rmin = a->ns_min / x->ns_min, rmed = a->ns_med / x->ns_med;
    printf(" %.2f / %.2f%s |", rmin, rmed,
           goal ? (rmed <= 1.0 ? " (goal met)" : " (goal <= 1.0 NOT met)") : "");
}

/* The median of the round-by-round ratios a / x (the k-th line of each) and
 * their range, where both have the same number of lines. */
static void round_ratio_cell(const struct sc_phase *a, const struct sc_phase *x)
{
    size_t n = a->nlines;
    double *v = a->have && x->have && n && x->nlines == n ? malloc(n * sizeof(*v)) : NULL;
    if (!v) {
        printf(" - |");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (x->mins[i] > 0)
            v[k++] = a->mins[i] / x->mins[i];
    if (k) {
        struct ab_stat st = ab_stat_sort(v, k); /* its range is then v[0] .. v[k - 1] */
        printf(" %.2f (%.2f-%.2f) |", st.med, v[0], v[k - 1]);
    } else
        printf(" - |");
    free(v);
}

static void print_apply_table(void)
{
    printf("### altpatch_apply() cost by site count (ns per site, min / median; several "
           "rounds: min / median of the rounds' minima)\n\n");
    printf("*cold*: first apply of a fresh process (a fork()ed child per repetition: module "
           "discovery, copy of the original bytes, plan, write). *warm*: apply after a revert. "
           "*no change*: apply when every site already holds its final bytes (the cost of "
           "deciding alone). *dry run*: plan only. Pages and syscalls are the writer's, for "
           "the cold apply.\n\n");
    printf("| sites | cold | warm | no change | dry run | revert | sites patched | pages "
           "written | syscalls | bytes written |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (unsigned i = 0; i < nrows; i++) {
        const struct sc_row *r = &rows[i];
        const struct sc_phase *c = &r->ph[PH_COLD];
        if (!c->have)
            continue;
        printf("| %lu |", r->n);
        static const int order[] = {PH_COLD, PH_WARM, PH_NOCHANGE, PH_DRYRUN, PH_REVERT};
        for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++)
            cell(&r->ph[order[k]], r->n);
        printf(" %llu of %llu%s | %llu | %llu | %llu |\n", c->patched, c->seen,
               c->refused ? " (some refused!)" : "", c->pages, c->syscalls, c->bytes);
    }
    printf("\n");
}

static void print_xray_table(void)
{
    printf("### Against LLVM XRay (altpatch ns/site / XRay ns/function, min / median; several "
           "rounds: min / median of the rounds' minima)\n\n");
    printf("| N | altpatch cold ns/site | XRay first __xray_patch ns/fn | ratio cold/first "
           "(goal <= 1.0) | cold/first round by round, median (range) | altpatch warm ns/site | "
           "XRay warm ns/fn | ratio warm/warm | XRay __xray_unpatch ns/fn |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (unsigned i = 0; i < nrows; i++) {
        const struct sc_row *r = &rows[i];
        if (!r->ph[PH_COLD].have && !r->ph[PH_XFIRST].have)
            continue;
        bool goal = r->n >= 10000;
        printf("| %lu |", r->n);
        cell(&r->ph[PH_COLD], r->n);
        cell(&r->ph[PH_XFIRST], r->n);
        ratio_cell(&r->ph[PH_COLD], &r->ph[PH_XFIRST], goal);
        round_ratio_cell(&r->ph[PH_COLD], &r->ph[PH_XFIRST]);
        cell(&r->ph[PH_WARM], r->n);
        cell(&r->ph[PH_XWARM], r->n);
        ratio_cell(&r->ph[PH_WARM], &r->ph[PH_XWARM], false);
        cell(&r->ph[PH_XUNPATCH], r->n);
        printf("\n");
    }
    printf("\n");
}

static void print_linearity(void)
{
    printf("### Growth (total time ratio between consecutive N divided by the N ratio, from the "
           "minima / from the medians; 1.00 = linear)\n\n| from | to | altpatch cold | altpatch warm | altpatch no change "
           "| XRay first | XRay warm |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (unsigned i = 1; i < nrows; i++) {
        const struct sc_row *a = &rows[i - 1], *b = &rows[i];
        double k = (double)b->n / (double)a->n;
        printf("| %lu | %lu |", a->n, b->n);
        static const int ph[] = {PH_COLD, PH_WARM, PH_NOCHANGE, PH_XFIRST, PH_XWARM};
        for (size_t j = 0; j < sizeof(ph) / sizeof(ph[0]); j++) {
            const struct sc_phase *x = &a->ph[ph[j]], *y = &b->ph[ph[j]];
            if (x->have && y->have && x->ns_med > 0 && x->ns_min > 0)
                printf(" %.2f / %.2f |", y->ns_min / x->ns_min / k, y->ns_med / x->ns_med / k);
            else
                printf(" - |");
        }
        printf("\n");
    }
    printf("\n");
}

int ab_mode_scaling(int argc, char **argv)
{
    if (argc < 1) {
        fprintf(stderr, "usage: altbench scaling RESULT_FILE... ('-' = stdin)\n");
        return 2;
    }
    for (int i = 0; i < argc; i++)
        if (read_file(argv[i]) < 0)
            return 1;
    if (nrows == 0) {
        fprintf(stderr, "altbench scaling: no result lines found\n");
        return 1;
    }
    for (unsigned i = 0; i < nrows; i++)
        for (int p = 0; p < PH_COUNT; p++)
            if (sc_summarize(&rows[i].ph[p]) < 0) {
                fprintf(stderr, "altbench scaling: out of memory\n");
                return 1;
            }
    print_apply_table();
    print_xray_table();
    if (nrows > 1)
        print_linearity();
    return 0;
}
