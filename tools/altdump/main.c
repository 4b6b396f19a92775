/* SPDX-License-Identifier: MIT */
/*
 * altdump: show the alternative sites of ELF files, decide them for any CPU
 * with the runtime's own planner, measure their size cost, and compare them
 * with a live process. See docs/altdump.1 and docs/altdump.md.
 */
#include <elf.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "altdump.h"

enum mode { MODE_TABLE, MODE_SIZE, MODE_CHECK, MODE_COMPARE, MODE_PID };

struct args {
    enum mode mode;
    const char *cpu;
    bool intel, json;
    long pid;
    char **files;
    int nfiles;
};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: altdump [OPTION...] FILE...\n"
            "       altdump --compare [OPTION...] PLAIN ALT\n"
            "       altdump --pid PID [OPTION...]\n"
            "Show the altpatch alternative sites of ELF files (executables, shared objects,\n"
            "relocatable objects) and decide each one for a CPU with the runtime's planner.\n"
            "\n"
            "  -c, --cpu=SPEC     CPU to decide for: PROFILE[,+feature,-feature...] or\n"
            "                     +feature,-feature... (edits of the host); profiles:\n"
            "                     host (default), baseline, amd-zen4, intel-spr, all\n"
            "  -M, --intel        Intel syntax (default: AT&T)\n"
            "  -s, --size         text-size cost of the alternatives\n"
            "  -C, --check        validate every site; one line per refused site\n"
            "      --compare      size(1)-style deltas of two builds: PLAIN, ALT\n"
            "  -p, --pid=PID      compare a running process's sites with the plan\n"
            "  -j, --json         machine-readable output (docs/altdump.md)\n"
            "  -h, --help         this help\n"
            "  -V, --version      version\n"
            "\n"
            "Exit status: 0 ok; 1 refused sites (or, with --pid, sites holding neither the\n"
            "original nor the planned bytes); 2 usage error; 3 bad input file; 4 internal\n"
            "error (out of memory). With several files the largest status wins.\n");
}

static int parse(int argc, char **argv, struct args *a)
{
    static const struct option opts[] = {
        {"cpu", required_argument, NULL, 'c'}, {"intel", no_argument, NULL, 'M'},
        {"size", no_argument, NULL, 's'},      {"check", no_argument, NULL, 'C'},
        {"compare", no_argument, NULL, 'D'},   {"pid", required_argument, NULL, 'p'},
        {"json", no_argument, NULL, 'j'},      {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},   {NULL, 0, NULL, 0},
    };
    int c, modes = 0;
    memset(a, 0, sizeof(*a));
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:MsCp:jhV", opts, NULL)) != -1) {
        switch (c) {
        case 'c': a->cpu = optarg; break;
        case 'M': a->intel = true; break;
        case 'j': a->json = true; break;
        case 's': a->mode = MODE_SIZE; modes++; break;
        case 'C': a->mode = MODE_CHECK; modes++; break;
        case 'D': a->mode = MODE_COMPARE; modes++; break;
        case 'p': {
            char *end;
            errno = 0;
            a->pid = strtol(optarg, &end, 10);
            if (errno || *end || a->pid <= 0) {
                fprintf(stderr, "altdump: --pid: '%s' is not a process id\n", optarg);
                return AD_EXIT_USAGE;
            }
            a->mode = MODE_PID;
            modes++;
            break;
        }
        case 'h': usage(stdout); exit(AD_EXIT_OK);
        case 'V':
            printf("altdump (altpatch) %d.%d.%d, record formats %d and %d (and %d, %d: "
                   "pre-patched)\n",
                   ALTPATCH_VERSION_MAJOR, ALTPATCH_VERSION_MINOR, ALTPATCH_VERSION_PATCH,
                   ALTPATCH_FORMAT_COMPACT, ALTPATCH_FORMAT_KERNEL, AD_FORMAT_COMPACT_PREPATCHED,
                   AD_FORMAT_PREPATCHED);
            exit(AD_EXIT_OK);
        default:
            fprintf(stderr, "altdump: unknown or incomplete option '%s' (try --help)\n",
                    argv[optind - 1]);
            return AD_EXIT_USAGE;
        }
    }
    a->files = argv + optind;
    a->nfiles = argc - optind;
    if (modes > 1) {
        fprintf(stderr, "altdump: --size, --check, --compare and --pid exclude each other\n");
        return AD_EXIT_USAGE;
    }
    if (a->mode == MODE_COMPARE && a->nfiles != 2) {
        fprintf(stderr, "altdump: --compare takes exactly two files (PLAIN ALT)\n");
        return AD_EXIT_USAGE;
    }
    if (a->mode == MODE_PID && a->nfiles != 0) {
        fprintf(stderr, "altdump: --pid takes no file arguments\n");
        return AD_EXIT_USAGE;
    }
    if (a->mode != MODE_PID && a->nfiles == 0) {
        fprintf(stderr, "altdump: no input file (try --help)\n");
        return AD_EXIT_USAGE;
    }
    return 0;
}

static int worst(int a, int b)
{
    return a > b ? a : b;
}

/*
 * Records of the other format than the note's (objects built with and
 * without ALTPATCH_KERNEL_RECORDS linked together): the runtime reads only
 * the note's table, so those sites keep their original bytes. One warning
 * line; true when there are such records.
 */
static bool other_format_records(const struct ad_image *img, const char *file)
{
    if (!img->has_alt || img->kernel.on)
        return false;
    bool compact = img->note.record_size == ALTPATCH_RECORD_SIZE_COMPACT;
    const char *other = compact ? "altinstructions" : "altinstr_table";
    uint64_t bytes = 0;
    for (size_t i = 1; i < img->nsecs; i++)
        if ((img->secs[i].flags & SHF_ALLOC) && strcmp(img->secs[i].name, other) == 0)
            bytes += img->secs[i].size;
    if (!bytes)
        return false;
    fprintf(stderr,
            "altdump: %s: also has %llu bytes of format-%d records in %s that its note (format "
            "%u) does not describe: the runtime leaves those sites unpatched\n",
            file, (unsigned long long)bytes,
            compact ? ALTPATCH_FORMAT_KERNEL : ALTPATCH_FORMAT_COMPACT, other, img->note.version);
    return true;
}

/* One file in table, size or check mode. */
static int one_file(const struct args *a, const struct ad_opts *o, const char *file,
                    struct ad_json *j)
{
    struct ad_image img;
    char err[512];
    int rc = ad_read_file(file, 0, &img, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "altdump: %s: %s\n", file, err);
        return rc;
    }
    struct ad_plan *plans = NULL;
    rc = ad_decide_cpu(&img, o->cpu, &plans, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "altdump: %s: %s\n", file,
                rc == AD_EXIT_INTERNAL ? "out of memory" : err);
        ad_image_free(&img);
        return rc;
    }
    struct ad_size sz;
    ad_size_compute(&img, plans, &sz);
    size_t refused = ad_count_refused(&img, plans);
    size_t mismatched = 0;
    bool other = other_format_records(&img, file);
    if (a->mode == MODE_CHECK && img.prepatched) {
        mismatched = ad_prepatched_check(o->json ? stderr : stdout, &img);
        if (mismatched == (size_t)-1) {
            fprintf(stderr, "altdump: %s: out of memory\n", file);
            free(plans);
            ad_image_free(&img);
            return AD_EXIT_INTERNAL;
        }
    }
    if (o->json)
        ad_json_image(j, &img, plans, a->mode == MODE_SIZE ? &sz : NULL, o);
    else if (a->mode == MODE_TABLE)
        ad_print_table(stdout, &img, plans, o);
    else if (a->mode == MODE_SIZE)
        ad_print_size(stdout, &img, &sz, o);
    if (a->mode == MODE_CHECK && !o->json) {
        ad_print_refusals(stdout, "", &img, plans);
        if (other)
            ; /* warned above: not ok */
        else if (!refused && !mismatched && img.prepatched)
            printf("%s: ok, %zu sites, %zu records, pre-patched for %s\n", file, img.nsites,
                   img.nentries, img.pp_profile);
        else if (!refused && !mismatched)
            printf("%s: ok, %zu sites, %zu records\n", file, img.nsites, img.nentries);
    } else if (refused) {
        fflush(stdout);
        ad_print_refusals(stderr, "altdump: ", &img, plans);
    }
    free(plans);
    ad_image_free(&img);
    if (a->mode == MODE_CHECK && other)
        return AD_EXIT_REFUSED;
    return refused || mismatched ? AD_EXIT_REFUSED : AD_EXIT_OK;
}

static int files_mode(const struct args *a, const struct ad_opts *o)
{
    struct ad_json j;
    int rc = 0;
    if (o->json) {
        ad_json_begin(&j, stdout);
        ad_json_obj(&j, NULL);
        ad_json_uint(&j, "altdump_schema", 1);
        ad_json_str(&j, "mode", a->mode == MODE_SIZE ? "size" : a->mode == MODE_CHECK ? "check" : "table");
        ad_json_cpu(&j, o->cpu);
        ad_json_arr(&j, "files");
    }
    for (int i = 0; i < a->nfiles; i++) {
        if (!o->json && a->mode != MODE_CHECK && i)
            printf("\n");
        rc = worst(rc, one_file(a, o, a->files[i], &j));
    }
    if (o->json) {
        ad_json_end_arr(&j);
        ad_json_int(&j, "exit", rc);
        ad_json_end_obj(&j);
        ad_json_finish(&j);
    }
    return rc;
}

static int compare_mode(const struct args *a, const struct ad_opts *o)
{
    struct ad_image img[2];
    struct ad_plan *plans[2] = {NULL, NULL};
    struct ad_size sz[2];
    char err[512];
    int rc = 0;
    memset(img, 0, sizeof(img));
    for (int i = 0; i < 2 && !rc; i++) {
        rc = ad_read_file(a->files[i], AD_READ_ALLOW_NOALT, &img[i], err, sizeof(err));
        if (rc)
            fprintf(stderr, "altdump: %s: %s\n", a->files[i], err);
        else if (img[i].has_alt &&
                 (rc = ad_decide_cpu(&img[i], o->cpu, &plans[i], err, sizeof(err))) != 0)
            fprintf(stderr, "altdump: %s: %s\n", a->files[i],
                    rc == AD_EXIT_INTERNAL ? "out of memory" : err);
        if (!rc)
            ad_size_compute(&img[i], plans[i], &sz[i]);
    }
    if (!rc && o->json) {
        struct ad_json j;
        ad_json_begin(&j, stdout);
        ad_json_obj(&j, NULL);
        ad_json_uint(&j, "altdump_schema", 1);
        ad_json_str(&j, "mode", "compare");
        ad_json_compare(&j, &img[0], &sz[0], &img[1], &sz[1]);
        ad_json_end_obj(&j);
        ad_json_finish(&j);
    } else if (!rc) {
        ad_print_compare(stdout, &img[0], &sz[0], &img[1], &sz[1]);
    }
    for (int i = 0; i < 2; i++) {
        free(plans[i]);
        ad_image_free(&img[i]);
    }
    return rc;
}

int main(int argc, char **argv)
{
    struct args a;
    int rc = parse(argc, argv, &a);
    if (rc)
        return rc;
    struct ad_cpu cpu;
    char err[512];
    rc = ad_cpu_parse(a.cpu, &cpu, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "altdump: --cpu: %s\n", err);
        return rc;
    }
    if (a.mode == MODE_PID && cpu.edit_err[0]) {
        fprintf(stderr, "altdump: %s\n", cpu.edit_err);
        ad_cpu_free(&cpu);
        return AD_EXIT_USAGE;
    }
    altpatch_set_print(NULL); /* the library's own warnings would repeat ours */
    struct ad_opts o = {.intel = a.intel, .json = a.json, .cpu = &cpu};
    switch (a.mode) {
    case MODE_COMPARE: rc = compare_mode(&a, &o); break;
    case MODE_PID: rc = ad_pid_report(a.pid, &o); break;
    default: rc = files_mode(&a, &o); break;
    }
    ad_cpu_free(&cpu);
    if (fflush(stdout) != 0 && rc == 0)
        rc = AD_EXIT_INTERNAL;
    return rc;
}
