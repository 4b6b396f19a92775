/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness over altdump's reading path: ELF (libelf) -> note ->
 * tables -> records -> sites -> the planner for two CPU profiles -> the
 * table, size and JSON views (written to /dev/null). Any crash, hang,
 * leak or sanitizer report is a bug. Build and run: docs/altdump.md.
 */
#include <stdio.h>
#include <stdlib.h>

#include "altdump.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *devnull;
static struct ad_cpu cpus[2];

static void setup(void)
{
    char err[256];
    devnull = fopen("/dev/null", "w");
    if (!devnull || ad_cpu_parse("all", &cpus[0], err, sizeof(err)) != 0 ||
        ad_cpu_parse("baseline", &cpus[1], err, sizeof(err)) != 0)
        abort();
    altpatch_set_print(NULL);
}

static void views(const struct ad_image *img, const struct ad_cpu *cpu)
{
    struct ad_plan *plans = NULL;
    struct ad_opts o = {.intel = false, .json = false, .cpu = cpu};
    if (ad_decide(img, cpu->fs, &plans) != 0)
        return;
    struct ad_size sz;
    ad_size_compute(img, plans, &sz);
    ad_print_table(devnull, img, plans, &o);
    ad_print_size(devnull, img, &sz, &o);
    ad_print_refusals(devnull, "", img, plans);
    struct ad_json j;
    o.json = true;
    o.intel = true;
    ad_json_begin(&j, devnull);
    ad_json_arr(&j, NULL);
    ad_json_image(&j, img, plans, &sz, &o);
    ad_json_end_arr(&j);
    ad_json_finish(&j);
    free(plans);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!devnull)
        setup();
    struct ad_image img;
    char err[512];
    if (ad_read_memory(data, size, "fuzz", 0, &img, err, sizeof(err)) == 0) {
        views(&img, &cpus[0]);
        views(&img, &cpus[1]);
        ad_image_free(&img);
    }
    if (ad_read_memory(data, size, "fuzz", AD_READ_ALLOW_NOALT, &img, err, sizeof(err)) == 0) {
        struct ad_size sz;
        ad_size_compute(&img, NULL, &sz);
        ad_print_compare(devnull, &img, &sz, &img, &sz);
        ad_image_free(&img);
    }
    return 0;
}
