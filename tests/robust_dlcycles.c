/* SPDX-License-Identifier: MIT */
/*
 * altpatch_dlopen()/dlclose() cycles of libapfix_dl.so at a new address each
 * time (the range the last copy occupied is reserved before the next load),
 * while another thread runs sites, so every apply is live. Prints the heap in
 * use after a warm-up and at the end; fails when it grew by more than 2 MiB,
 * when a cycle gave a wrong value, or when the library was not patched.
 * Exits 77 (skipped) where the kernel refuses writes through /proc/self/mem
 * to read-only mappings: live patching writes through it.
 *
 *   robust_dlcycles [--cycles N]     (default 1000)
 */
#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <altpatch/altpatch.h>

#include "ap_live_sites.h"
#include "ap_procmem.h"

#define WARMUP 50
#define MAX_GROWTH (2u << 20)

static volatile int stop;
static volatile long runs, wrong;

static void *runner(void *p)
{
    (void)p;
    while (!stop) {
        long a = site_one(), b = site_pair();
        wrong += (a != 1 && a != 2) || (b != 11 && b != 22);
        runs++;
    }
    return NULL;
}

struct span {
    const char *name;
    uintptr_t lo, hi;
};

static int span_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct span *s = data;
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, s->name))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr, e = a + ph->p_memsz;
        if (!s->lo || a < s->lo)
            s->lo = a;
        if (e > s->hi)
            s->hi = e;
    }
    return 1;
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

int main(int argc, char **argv)
{
    long cycles = 1000;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--cycles"))
            cycles = atol(argv[i + 1]);
    if (!ap_procmem_can_write_text()) {
        printf("robust_dlcycles: skipped: live patching: " AP_PROCMEM_DENIED "\n");
        return 77;
    }
    altpatch_set_print(NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, runner, NULL))
        return 2;
    long pg = sysconf(_SC_PAGESIZE), moved = 0, bad = 0, live = 0;
    uintptr_t last = 0;
    size_t h0 = 0;
    for (long c = 0; c < cycles; c++) {
        if (c == WARMUP || (c == 0 && cycles <= WARMUP))
            h0 = heap_in_use();
        void *h = altpatch_dlopen(APFIX_DL_PATH, RTLD_NOW);
        if (!h) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        long (*call)(long) = (long (*)(long))dlsym(h, "apfix_dl_call");
        bad += !call || call(1) != 3;
        struct altpatch_stats st = {.sz = sizeof(st)};
        altpatch_get_stats(&st);
        live += st.live;
        struct span s = {"libapfix_dl", 0, 0};
        dl_iterate_phdr(span_cb, &s);
        moved += s.lo != last;
        last = s.lo;
        dlclose(h);
        /* keep the range: the next copy loads elsewhere */
        uintptr_t lo = s.lo & ~(uintptr_t)(pg - 1), hi = (s.hi + pg - 1) & ~(uintptr_t)(pg - 1);
        if (lo && mmap((void *)lo, hi - lo, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == MAP_FAILED)
            break; /* something else took it: the loader moves on anyway */
    }
    size_t h1 = heap_in_use();
    stop = 1;
    pthread_join(t, NULL);
    long growth = (long)h1 - (long)h0;
    printf("robust_dlcycles: %ld cycles, %ld at a new address, %ld live applies, heap in use "
           "%zu -> %zu bytes (%+ld), %ld site runs, %ld wrong, %ld bad calls\n",
           cycles, moved, live, h0, h1, growth, runs, wrong, bad);
    int ok = bad == 0 && wrong == 0 && growth <= (long)MAX_GROWTH && moved >= cycles / 2 &&
             live >= cycles / 2;
    printf("robust_dlcycles: %s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
