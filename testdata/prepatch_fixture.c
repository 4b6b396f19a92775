/* SPDX-License-Identifier: MIT */
/*
 * Fixture for pre-patched files (test_prepatch): a program with primitive
 * sites that executes none of them before its first decision, so that a copy
 * pre-patched for another CPU never runs that CPU's bytes here.
 *
 *   prepatch_fixture apply     altpatch_apply() first; then run every primitive
 *   prepatch_fixture revert    apply, then ALTPATCH_APPLY_REVERT; then run them
 *   prepatch_fixture noapply   run them at once (a file pre-patched for this CPU)
 *   prepatch_fixture dl LIB    dlopen LIB (a copy of libapfix_dl.so), apply, call
 *                              it; REVERT, call it; apply again, call it
 *   prepatch_fixture dlnoapply LIB   dlopen LIB and call it without any apply
 *   prepatch_fixture stats     "before" lines (memory before apply), then
 *                              apply: the library's messages ("log" lines),
 *                              its counters ("stats"), the site list ("state")
 *   prepatch_fixture drystats  stats after two ALTPATCH_APPLY_DRY_RUN applies:
 *                              one for the host's set with FSGSBASE toggled,
 *                              then one for the set the apply uses
 *   prepatch_fixture replaced FILE   stats, after renaming FILE over the path
 *                              it was started by (AT_EXECFN)
 *   prepatch_fixture again     apply, REVERT ("reverted" lines), apply: the
 *                              last apply's messages, counters and site list
 *   prepatch_fixture replacedagain FILE   again, after renaming FILE over
 *                              the path it was started by
 *   prepatch_fixture thread    apply with ALTPATCH_APPLY_NO_LIVE while a second
 *                              thread runs: "rc N", counters when N is 0
 *   prepatch_fixture threadrevert   the same with ALTPATCH_APPLY_REVERT as the
 *                              first call
 *   prepatch_fixture dlfifo LIB   dlopen LIB, put a FIFO at its path, apply:
 *                              "rc N", the messages, counters, LIB's site list
 *   prepatch_fixture dlgone LIB   dlopen LIB, apply (counters), put a FIFO at
 *                              its path, LIB's site list; REVERT: "rc N",
 *                              counters, call it; apply: counters, call it
 *   prepatch_fixture dllist LIB   apply, dlopen LIB, LIB's site list; apply:
 *                              counters and LIB's site list again
 *   prepatch_fixture sealed    "before" lines, then no file can be opened any
 *                              more (a seccomp filter answers open and openat
 *                              EACCES): apply (messages, counters), run the
 *                              primitives; REVERT: "rc N", counters, the site
 *                              list; run them again as decided (no "site"
 *                              lines: they open the file)
 *   prepatch_fixture sealedlist   "before" lines, no file opened from then on:
 *                              apply (messages, counters), the site list,
 *                              apply again ("again", counters), run them
 *   prepatch_fixture forklive  apply (counters); a forked child reverts
 *                              ("child reverted: ok"); with a second thread
 *                              running, a live REVERT and a live apply ("rc N",
 *                              counters each), the site list
 *   (sealed modes exit 3 with a line where no seccomp filter can be installed)
 *
 * Each run checks the primitives' values against oracles outside the
 * planner (pthread_self, sched_getcpu, the functions called), refuses to run
 * anything if an apply refused a site, then prints one line per site of its
 * own module, "site ADDR HEX" (link-time address, the bytes in memory, read
 * through the image API's site list of /proc/self/exe), and a last line
 * "prepatch_fixture MODE: ok" (exit 0) or FAIL lines (exit 1).
 */
#include <dlfcn.h>
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <link.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <altpatch/altpatch.h>
#include <altpatch/image.h>
#include <altpatch/primitives.h>

#define AP_FIXTURE_NAME "prepatch_fixture"
#include "ap_fixture_common.h"

/* Every primitive; @p decided: the sites hold this CPU's plan (else the originals). */
static __attribute__((noinline)) void run(void *gs_block, int decided)
{
    altpatch_weak_fence();
    if (altpatch_fs_self() != (void *)pthread_self())
        fail("fs_self %p != pthread_self %p", altpatch_fs_self(), (void *)pthread_self());
    if (altpatch_gs_self() != gs_block)
        fail("gs_self %p != block %p", altpatch_gs_self(), gs_block);
    int cpu = sched_getcpu();
    unsigned got = altpatch_getcpu();
    if (cpu < 0 || got != (unsigned)cpu)
        fail("getcpu %u != sched_getcpu %d", got, cpu);
    uint64_t a0 = altpatch_rdtsc_ordered(), a1 = altpatch_rdtsc_ordered();
    if (a1 < a0)
        fail("rdtsc_ordered went backwards");
    long a = ALTPATCH_ALT_CALL(twice, thrice, X86_FEATURE_ALWAYS, 7);
    long b = ALTPATCH_ALT_CALL(plus10, plus20, ALT_NOT(X86_FEATURE_ALWAYS), 7);
    long c = ALTPATCH_ALT_CALL(minus1, minus2, X86_FEATURE_FSGSBASE, 7);
    long want_c = decided && altpatch_cpu_has(X86_FEATURE_FSGSBASE) ? 5 : 6;
    if (a != (decided ? 21 : 14) || b != 17 || c != want_c)
        fail("alt calls returned %ld %ld %ld, want %d 17 %ld", a, b, c, decided ? 21 : 14, want_c);
}

static int first_base(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    *(uintptr_t *)ctx = info->dlpi_addr;
    return 1; /* the main program comes first */
}

static const char *dump_word = "site";

static int dump_site(const struct altpatch_image_site *s, void *ctx)
{
    const uint8_t *mem = (const uint8_t *)(*(uintptr_t *)ctx + s->addr);
    printf("%s %llx ", dump_word, (unsigned long long)s->addr);
    for (unsigned i = 0; i < s->len; i++)
        printf("%02x", mem[i]);
    putchar('\n');
    return 0;
}

static void dump(void)
{
    uintptr_t base = 0;
    struct altpatch_image *img;
    dl_iterate_phdr(first_base, &base);
    int rc = altpatch_image_open("/proc/self/exe", NULL, &img);
    if (rc) {
        fail("altpatch_image_open(/proc/self/exe) -> %d", rc);
        return;
    }
    altpatch_image_site_foreach(img, dump_site, &base);
    altpatch_image_close(img);
}

/* dump() with lines starting with @p word instead of "site". */
static void dump_as(const char *word)
{
    dump_word = word;
    dump();
    dump_word = "site";
}

/* An apply with @p flags; false (and a FAIL line) unless every site was decided. */
static bool apply(unsigned flags)
{
    struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = flags};
    struct altpatch_stats st = {.sz = sizeof(st)};
    int rc = altpatch_apply_opts(&o);
    if (rc || altpatch_get_stats(&st)) {
        fail("altpatch_apply_opts(%#x) -> %d", flags, rc);
        return false;
    }
    if (st.sites_refused || !st.sites_seen) {
        fail("apply %#x: %llu of %llu sites refused", flags,
             (unsigned long long)st.sites_refused, (unsigned long long)st.sites_seen);
        return false;
    }
    return true;
}

/* A dry run for the host's set with FSGSBASE toggled (a set that differs in a
 * feature the records name); false (and a FAIL line) unless every site was
 * decided. */
static bool dry_other(void)
{
    struct altpatch_features *fs = altpatch_features_host();
    int id = altpatch_feature_id("fsgsbase");
    if (!fs || id < 0) {
        fail("altpatch_features_host or altpatch_feature_id");
        altpatch_features_free(fs);
        return false;
    }
    if (altpatch_features_has(fs, (unsigned)id))
        altpatch_features_clear(fs, (unsigned)id);
    else
        altpatch_features_set(fs, (unsigned)id);
    struct altpatch_apply_opts o = {.sz = sizeof(o), .features = fs,
                                    .flags = ALTPATCH_APPLY_DRY_RUN};
    struct altpatch_stats st = {.sz = sizeof(st)};
    int rc = altpatch_apply_opts(&o);
    altpatch_features_free(fs);
    if (rc || altpatch_get_stats(&st) || st.sites_refused || !st.sites_seen) {
        fail("dry run for another set -> %d", rc);
        return false;
    }
    return true;
}

/* The library's messages, each as a line "log TEXT" on stdout. */
static int log_line(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    fputs("log ", stdout);
    vprintf(fmt, ap);
    return 0;
}

/* The counters of the last apply: "stats written=N patched=N unchanged=N refused=N seen=N". */
static void print_stats(void)
{
    struct altpatch_stats st = {.sz = sizeof(st)};
    if (altpatch_get_stats(&st)) {
        fail("altpatch_get_stats");
        return;
    }
    printf("stats written=%llu syscalls=%llu patched=%llu unchanged=%llu refused=%llu seen=%llu\n",
           (unsigned long long)st.bytes_written, (unsigned long long)st.syscalls,
           (unsigned long long)st.sites_patched, (unsigned long long)st.sites_unchanged,
           (unsigned long long)st.sites_refused, (unsigned long long)st.sites_seen);
}

static void hex(const uint8_t *b, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        printf("%02x", b[i]);
}

struct list_ctx {
    const char *module; /* the module listed: its path, "" for the main program */
    uintptr_t base;     /* its load address */
};

static int base_of(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    struct list_ctx *l = ctx;
    if (strcmp(info->dlpi_name ? info->dlpi_name : "", l->module) != 0)
        return 0;
    l->base = info->dlpi_addr;
    return 1;
}

/* One line per site of the walk: "state ADDR STATE CHOSEN REASON CURRENT ORIGINAL"
 * (ADDR link-time). */
static int list_site(const struct altpatch_site_info *s, void *ctx)
{
    struct list_ctx *l = ctx;
    if (strcmp(s->module, l->module) != 0)
        return 0;
    printf("state %llx %d %d %d ", (unsigned long long)(s->addr - l->base), (int)s->state,
           s->chosen, s->reason);
    if (s->current)
        hex(s->current, s->len);
    putchar(' ');
    if (s->original)
        hex(s->original, s->len);
    putchar('\n');
    return 0;
}

/* The sites of module @p module ("" for the main program), as the library lists them. */
static void list_sites(const char *module)
{
    struct list_ctx l = {module, 0};
    dl_iterate_phdr(base_of, &l);
    int rc = altpatch_site_foreach(list_site, &l);
    if (rc)
        fail("altpatch_site_foreach -> %d", rc);
}

/* A thread that waits until its pipe is written. */
static void *waiter(void *arg)
{
    char c;
    while (read(*(int *)arg, &c, 1) < 0)
        ;
    return NULL;
}

/* libapfix_dl.so's two ALWAYS calls: x+1 / x+2 and x+3 / x+4 (testdata/apfix_mod.c). */
static void dl_calls(void *h, bool replaced, const char *when)
{
    long (*call)(long) = (long (*)(long))dlsym(h, "apfix_dl_call");
    long (*call2)(long) = (long (*)(long))dlsym(h, "apfix_dl_call2");
    void *(*fs)(void) = (void *(*)(void))dlsym(h, "apfix_dl_fs");
    if (!call || !call2 || !fs) {
        fail("%s: symbols missing", when);
        return;
    }
    long a = call(1), b = call2(1);
    if (a != (replaced ? 3 : 2) || b != (replaced ? 5 : 4))
        fail("%s: library calls returned %ld %ld, want %d %d", when, a, b, replaced ? 3 : 2,
             replaced ? 5 : 4);
    if (fs() != (void *)pthread_self())
        fail("%s: library fs_self %p != pthread_self", when, fs());
}

/* From now on open() and openat() fail with EACCES (everything else runs). */
static bool seal_open(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_open, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EACCES),
    };
    struct sock_fprog prog = {.len = (unsigned short)(sizeof(f) / sizeof(f[0])), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1L, 0L, 0L, 0L) ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        /* not this program's failure: the test skips (exit status 3) */
        printf("seccomp filter unavailable: %s\n", strerror(errno));
        exit(3);
    }
    return true;
}

static int dl_mode(const char *mode, const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fail("dlopen %s: %s", lib, dlerror());
        return 1;
    }
    if (strcmp(mode, "dlnoapply") == 0) {
        dl_calls(h, true, "without apply");
    } else if (strcmp(mode, "dlfifo") == 0) {
        /* the file at the library's path replaced by a FIFO nobody writes:
         * reading it would block; the library keeps what memory holds */
        altpatch_set_print(log_line);
        if (unlink(lib) != 0 || mkfifo(lib, 0600) != 0) {
            fail("a FIFO at %s", lib);
            return 1;
        }
        struct altpatch_apply_opts o = {.sz = sizeof(o)};
        int rc = altpatch_apply_opts(&o);
        printf("rc %d\n", rc);
        print_stats();
        list_sites(lib);
        unlink(lib);
        if (rc == 0) /* the pre-patched library keeps its bytes: replaced */
            dl_calls(h, true, "after apply");
    } else if (strcmp(mode, "dlgone") == 0) {
        /* applied while its file is at its path; then the file replaced by a
         * FIFO nobody writes (reading it would block): the site list, a
         * REVERT and the apply after it need nothing from the path */
        altpatch_set_print(log_line);
        if (!apply(0))
            return 1;
        print_stats();
        if (unlink(lib) != 0 || mkfifo(lib, 0600) != 0) {
            fail("a FIFO at %s", lib);
            return 1;
        }
        list_sites(lib);
        struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_REVERT};
        int rc = altpatch_apply_opts(&o);
        printf("rc %d\n", rc);
        print_stats();
        if (rc == 0)
            dl_calls(h, false, "after revert");
        if (!apply(0))
            return 1;
        print_stats();
        unlink(lib);
        dl_calls(h, true, "after apply");
    } else if (strcmp(mode, "dllist") == 0) {
        /* loaded after the last apply: listed as memory holds it, then applied */
        list_sites(lib);
        printf("applied\n");
        if (!apply(0))
            return 1;
        print_stats();
        list_sites(lib);
        dl_calls(h, true, "after apply");
    } else {
        if (!apply(0))
            return 1;
        dl_calls(h, true, "after apply");
        if (!apply(ALTPATCH_APPLY_REVERT))
            return 1;
        dl_calls(h, false, "after revert");
        if (!apply(0))
            return 1;
        dl_calls(h, true, "after apply again");
    }
    printf("prepatch_fixture %s: %s\n", mode, failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    static void *gs_block[8];
    const char *mode = argc > 1 ? argv[1] : "";
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        fail("sched_setaffinity");
    if (altpatch_gs_install(gs_block) != 0)
        fail("altpatch_gs_install");
    if (strcmp(mode, "dllist") == 0 && argc > 2) {
        altpatch_set_print(log_line);
        if (!apply(0))
            return 1;
    }
    if ((strcmp(mode, "dl") == 0 || strcmp(mode, "dlnoapply") == 0 ||
         strcmp(mode, "dllist") == 0 || strcmp(mode, "dlfifo") == 0 ||
         strcmp(mode, "dlgone") == 0) && argc > 2)
        return dl_mode(mode, argv[2]);
    if (strcmp(mode, "apply") == 0) {
        if (!apply(0))
            return 1;
        run(gs_block, 1);
    } else if (strcmp(mode, "revert") == 0) {
        if (!apply(0) || !apply(ALTPATCH_APPLY_REVERT))
            return 1;
        run(gs_block, 0);
    } else if (strcmp(mode, "noapply") == 0) {
        run(gs_block, 1);
    } else if (strcmp(mode, "stats") == 0 || strcmp(mode, "drystats") == 0 ||
               (strcmp(mode, "replaced") == 0 && argc > 2)) {
        /* memory before, the apply's messages and counters, the site list;
         * "replaced": its file replaced first by FILE (renamed over the path
         * it was started by), as an update does to a running program;
         * "drystats": a dry run first (its messages not printed) */
        if (mode[0] == 'r' && rename(argv[2], (const char *)getauxval(AT_EXECFN)) != 0) {
            fail("rename %s over the start path", argv[2]);
            return 1;
        }
        if (mode[0] == 'd' && (!dry_other() || !apply(ALTPATCH_APPLY_DRY_RUN)))
            return 1;
        altpatch_set_print(log_line);
        dump_as("before");
        if (!apply(0))
            return 1;
        print_stats();
        list_sites("");
        run(gs_block, 1);
    } else if (strcmp(mode, "forklive") == 0) {
        /* apply; a child forked then reverts ("child reverted: ok"); then,
         * with a second thread running, a live REVERT ("rc N", counters)
         * and a live apply ("rc N", counters) */
        altpatch_set_print(log_line);
        if (!apply(0))
            return 1;
        print_stats();
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_REVERT};
            int rc = altpatch_apply_opts(&o);
            if (rc)
                fail("child: revert -> %d", rc);
            else
                run(gs_block, 0);
            printf("child reverted: %s\n", failures ? "FAIL" : "ok");
            fflush(stdout);
            _exit(failures ? 1 : 0);
        }
        int wst = 0;
        if (pid < 0 || waitpid(pid, &wst, 0) != pid || !WIFEXITED(wst) || WEXITSTATUS(wst))
            fail("the child");
        run(gs_block, 1); /* the parent's sites: as applied */
        static int fds[2];
        pthread_t t;
        if (pipe(fds) || pthread_create(&t, NULL, waiter, &fds[0])) {
            fail("pipe or pthread_create");
            return 1;
        }
        for (int k = 0; k < 2; k++) {
            struct altpatch_apply_opts o = {
                .sz = sizeof(o),
                .flags = ALTPATCH_APPLY_LIVE | (k ? 0 : ALTPATCH_APPLY_REVERT)};
            int rc = altpatch_apply_opts(&o);
            if (rc == -EBUSY && k == 0) {
                /* live patching impossible here (docs/live.md): refused
                 * before anything is decided */
                printf("live unavailable\n");
                break;
            }
            printf("rc %d\n", rc);
            print_stats();
            if (rc == 0)
                run(gs_block, k);
            else
                fail("live %s -> %d", k ? "apply" : "revert", rc);
        }
        if (write(fds[1], "x", 1) != 1 || pthread_join(t, NULL))
            fail("the waiting thread");
        list_sites("");
    } else if (strcmp(mode, "sealed") == 0 || strcmp(mode, "sealedlist") == 0) {
        /* open() and openat() refused from before the first apply on.
         * sealed: the apply, then a REVERT (which needs the file) and the
         * site list; sealedlist: the apply, the site list (which would read
         * the file), the apply again */
        bool listing = mode[6] == 'l';
        altpatch_set_print(log_line);
        dump_as("before");
        fflush(stdout);
        if (!seal_open() || !apply(0))
            return 1;
        print_stats();
        if (listing) {
            list_sites("");
            if (!apply(0))
                return 1;
            printf("again\n");
            print_stats();
        } else {
            run(gs_block, 1);
            struct altpatch_apply_opts o = {.sz = sizeof(o), .flags = ALTPATCH_APPLY_REVERT};
            int rc = altpatch_apply_opts(&o);
            printf("rc %d\n", rc);
            print_stats();
            list_sites("");
        }
        run(gs_block, 1); /* what the sites hold: this CPU's plan */
        printf("prepatch_fixture %s: %s\n", mode, failures ? "FAIL" : "ok");
        return failures ? 1 : 0;
    } else if (strcmp(mode, "thread") == 0 || strcmp(mode, "threadrevert") == 0) {
        /* an apply (or a REVERT) refused to patch live while another thread
         * runs: its return value ("rc N"), then counters when it returned 0 */
        bool revert = mode[6] == 'r';
        altpatch_set_print(log_line);
        static int fds[2];
        pthread_t t;
        if (pipe(fds) || pthread_create(&t, NULL, waiter, &fds[0])) {
            fail("pipe or pthread_create");
            return 1;
        }
        struct altpatch_apply_opts o = {
            .sz = sizeof(o),
            .flags = ALTPATCH_APPLY_NO_LIVE | (revert ? ALTPATCH_APPLY_REVERT : 0)};
        int rc = altpatch_apply_opts(&o);
        printf("rc %d\n", rc);
        if (rc == 0)
            print_stats();
        if (write(fds[1], "x", 1) != 1 || pthread_join(t, NULL))
            fail("the waiting thread");
        if (rc == 0) /* else memory may hold another CPU's bytes: nothing runs */
            run(gs_block, !revert);
    } else if (strcmp(mode, "again") == 0 ||
               (strcmp(mode, "replacedagain") == 0 && argc > 2)) {
        /* apply, revert, apply: the last apply's counters; "replacedagain":
         * its file replaced first by FILE */
        if (mode[0] == 'r' && rename(argv[2], (const char *)getauxval(AT_EXECFN)) != 0) {
            fail("rename %s over the start path", argv[2]);
            return 1;
        }
        altpatch_set_print(log_line);
        if (!apply(0) || !apply(ALTPATCH_APPLY_REVERT))
            return 1;
        dump_as("reverted");
        if (!apply(0))
            return 1;
        print_stats();
        list_sites("");
        run(gs_block, 1);
    } else {
        fail("usage: prepatch_fixture apply|revert|noapply|stats|drystats|again|thread|"
             "threadrevert|sealed|sealedlist|forklive | "
             "replaced|replacedagain FILE | dl|dlnoapply|dllist|dlfifo|dlgone LIB");
        return 2;
    }
    dump();
    printf("prepatch_fixture %s: %s\n", mode, failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}
