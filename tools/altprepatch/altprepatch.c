/* SPDX-License-Identifier: MIT */
/*
 * altprepatch: write a copy of an executable or shared library whose
 * altpatch sites already hold the plan for one CPU profile (record format
 * version 4, or 2 for a format-1 input), for hosts where text cannot be written at run time and for a
 * start-up without patching. See docs/man/altprepatch.1.
 *
 * Built on the public API only (<altpatch/image.h>), like any user's tool.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <altpatch/altpatch.h>
#include <altpatch/image.h>

#include "../common/cpuspec.h"

/** Exit codes (as altdump's; docs/man/altprepatch.1). */
enum {
    EXIT_OK_ = 0,
    EXIT_USAGE = 2,
    EXIT_BADINPUT = 3, /* bad input file, or the output cannot be written */
    EXIT_INTERNAL = 4, /* out of memory */
};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: altprepatch --cpu=SPEC [OPTION...] INPUT OUTPUT\n"
            "Write a copy of INPUT (an executable or shared library built with\n"
            "<altpatch/alternative.h>) whose sites already hold the plan for the CPU SPEC.\n"
            "The copy keeps the original bytes: altpatch_apply() still adapts it to the\n"
            "CPU it runs on, and ALTPATCH_APPLY_REVERT restores the compiler's bytes.\n"
            "\n"
            "  -c, --cpu=SPEC     CPU to plan for (required): PROFILE[,+feature,-feature...]\n"
            "                     or +feature,-feature... (edits of the host); profiles:\n"
            "                     host, baseline, amd-zen4, intel-spr, all\n"
            "  -q, --quiet        no summary line\n"
            "  -h, --help         this help\n"
            "  -V, --version      version\n"
            "\n"
            "Exit status: 0 written; 2 usage error (unknown option or profile); 3 bad input\n"
            "file, or OUTPUT cannot be written (then no OUTPUT is left behind); 4 internal\n"
            "error (out of memory).\n");
}

/* The library's last message, printed by the tool as its one error line. */
static char last_msg[512];

static int capture(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    if (level != ALTPATCH_WARN)
        return 0;
    int n = vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
    static const char lib[] = "altpatch: "; /* the library names itself; the tool does */
    if (strncmp(last_msg, lib, sizeof(lib) - 1) == 0)
        memmove(last_msg, last_msg + sizeof(lib) - 1, strlen(last_msg) - (sizeof(lib) - 2));
    size_t len = strlen(last_msg);
    while (len && last_msg[len - 1] == '\n')
        last_msg[--len] = '\0';
    return n;
}

/* Features for SPEC (as altdump --cpu reads it); NULL and a message on error. */
static struct altpatch_features *cpu_spec(const char *spec, char *err, size_t errsz)
{
    char name[64];
    const char *edits;
    struct altpatch_features *fs =
        cpuspec_split(spec, name, sizeof(name), &edits) ? NULL : altpatch_features_profile(name);
    if (!fs) {
        cpuspec_unknown(name, err, errsz);
        return NULL;
    }
    if (edits && *edits) {
        int rc = altpatch_features_edit(fs, edits);
        if (rc) {
            snprintf(err, errsz, "bad feature edit list '%s' (%s)", edits,
                     rc == -ENOENT ? "unknown feature name" : strerror(-rc));
            altpatch_features_free(fs);
            return NULL;
        }
    }
    return fs;
}

struct counts {
    unsigned sites, replaced, refused;
};

static int count_site(const struct altpatch_image_site *s, void *ctx)
{
    struct counts *c = ctx;
    c->sites++;
    c->replaced += s->chosen >= 0;
    c->refused += s->reason != 0;
    return 0;
}

static int fail_lib(const char *what, int rc)
{
    if (last_msg[0])
        fprintf(stderr, "altprepatch: %s\n", last_msg);
    else
        fprintf(stderr, "altprepatch: %s: %s\n", what, strerror(-rc));
    return rc == -ENOMEM ? EXIT_INTERNAL : EXIT_BADINPUT;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"cpu", required_argument, NULL, 'c'}, {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},      {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    const char *spec = NULL;
    bool quiet = false;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "c:qhV", opts, NULL)) != -1) {
        switch (c) {
        case 'c': spec = optarg; break;
        case 'q': quiet = true; break;
        case 'h': usage(stdout); return EXIT_OK_;
        case 'V':
            printf("altprepatch (altpatch) %s, writes record format 4 (2 from format-1 input)\n",
                   altpatch_version());
            return EXIT_OK_;
        default:
            fprintf(stderr, "altprepatch: unknown or incomplete option '%s' (try --help)\n",
                    argv[optind - 1]);
            return EXIT_USAGE;
        }
    }
    if (!spec || !*spec) {
        fprintf(stderr, "altprepatch: --cpu is required (try --help)\n");
        return EXIT_USAGE;
    }
    if (argc - optind != 2) {
        fprintf(stderr, "altprepatch: expected INPUT and OUTPUT (try --help)\n");
        return EXIT_USAGE;
    }
    const char *in = argv[optind], *out = argv[optind + 1];
    if (strlen(spec) >= 64) {
        fprintf(stderr, "altprepatch: --cpu: argument too long (at most 63 bytes)\n");
        return EXIT_USAGE;
    }
    char err[384];
    struct altpatch_features *fs = cpu_spec(spec, err, sizeof(err));
    if (!fs) {
        fprintf(stderr, "altprepatch: --cpu: %s\n", err);
        return EXIT_USAGE;
    }
    altpatch_set_print(capture);
    struct altpatch_image *img = NULL;
    int rc = altpatch_image_open(in, NULL, &img);
    if (!rc)
        rc = altpatch_image_plan(img, fs);
    int status = EXIT_OK_;
    if (rc) {
        status = fail_lib(in, rc);
    } else {
        struct altpatch_image_write_opts wo = {.sz = sizeof(wo), .profile = spec};
        rc = altpatch_image_write(img, out, &wo);
        if (rc)
            status = fail_lib(out, rc);
    }
    if (!status && !quiet) {
        struct counts n = {0, 0, 0};
        altpatch_image_site_foreach(img, count_site, &n);
        /* the copy's plan note, as a reader finds it */
        struct altpatch_image *oi = NULL;
        struct altpatch_image_info info = {.sz = sizeof(info)};
        unsigned note = ALTPATCH_PLAN_NOTE_NONE;
        if (altpatch_image_open(out, NULL, &oi) == 0 && altpatch_image_get_info(oi, &info) == 0)
            note = info.plan_note;
        altpatch_image_close(oi);
        printf("%s: %u sites, %u hold a replacement for %s, %u refused (original kept); %s\n",
               out, n.sites, n.replaced, spec, n.refused,
               note == ALTPATCH_PLAN_NOTE_FILLED
                   ? "plan note filled (a main program's first apply that selects the same entries opens no file)"
               : note == ALTPATCH_PLAN_NOTE_EMPTY
                   ? "plan note left empty (not every site holds its selection: the first apply "
                     "reads the file)"
                   : "no plan note (built without it: the first apply reads the file)");
    }
    altpatch_image_close(img);
    altpatch_features_free(fs);
    return status;
}
