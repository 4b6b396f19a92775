/* SPDX-License-Identifier: MIT */
/**
 * @file altpatch.h
 * @brief altpatch runtime API: decide and write the best bytes for every site.
 *
 * Conventions: functions that can fail return 0 or a negative errno; options
 * structs start with `size_t sz` (set it to sizeof the struct you were compiled
 * against; unknown trailing fields must be zero); every exported symbol carries
 * ALTPATCH_API, everything else in the library is hidden.
 */
#ifndef ALTPATCH_ALTPATCH_H
#define ALTPATCH_ALTPATCH_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <altpatch/cpufeatures.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef ALTPATCH_API
#define ALTPATCH_API __attribute__((visibility("default")))
#endif

#define ALTPATCH_VERSION_MAJOR 0
#define ALTPATCH_VERSION_MINOR 1
#define ALTPATCH_VERSION_PATCH 0

/** Library version string, e.g. "0.1.0". */
ALTPATCH_API const char *altpatch_version(void);

/* ------------------------------------------------------------------------- */
/* Feature sets                                                              */
/* ------------------------------------------------------------------------- */

/**
 * An opaque set of X86_FEATURE_* ids plus the CPU vendor it describes. Used to
 * plan for the host, for a named CPU profile, or for a hand-made mask.
 */
struct altpatch_features;

/** New empty set (vendor "unknown"). NULL on ENOMEM. Free with altpatch_features_free(). */
ALTPATCH_API struct altpatch_features *altpatch_features_new(void);
/**
 * New copy of what this process can use: CPUID, XGETBV and AT_HWCAP2, vendor
 * derived synthetic bits, ALWAYS. ALTPATCH_CLEARCPUID is *not* applied here.
 */
ALTPATCH_API struct altpatch_features *altpatch_features_host(void);
/**
 * New set for a named profile: "host", "baseline" (x86-64 with no optional
 * feature), "amd-zen4", "intel-spr", "all". NULL with errno ENOENT if unknown.
 */
ALTPATCH_API struct altpatch_features *altpatch_features_profile(const char *name);
/** Names of the profiles, NULL-terminated. */
ALTPATCH_API const char *const *altpatch_features_profiles(void);
/** New copy of @p f. */
ALTPATCH_API struct altpatch_features *altpatch_features_dup(const struct altpatch_features *f);
ALTPATCH_API void altpatch_features_free(struct altpatch_features *f);
/** Add / remove one feature id. -EINVAL if @p feature is not a known id. */
ALTPATCH_API int altpatch_features_set(struct altpatch_features *f, unsigned feature);
ALTPATCH_API int altpatch_features_clear(struct altpatch_features *f, unsigned feature);
ALTPATCH_API bool altpatch_features_has(const struct altpatch_features *f, unsigned feature);
/**
 * Apply an edit list: comma-separated names, each optionally prefixed by '+'
 * (add, the default) or '-' (remove), e.g. "+rdpid,-fsgsbase". All-or-nothing:
 * on an unknown name returns -ENOENT and leaves @p f unchanged.
 */
ALTPATCH_API int altpatch_features_edit(struct altpatch_features *f, const char *edits);
/** Vendor string as CPUID spells it ("GenuineIntel", "AuthenticAMD", ...). */
ALTPATCH_API const char *altpatch_features_vendor(const struct altpatch_features *f);

/** Ids a feature set can hold: 0 .. ALTPATCH_FEATURE_BITS - 1. */
#define ALTPATCH_FEATURE_BITS 1024
/**
 * Set (@p on) or clear bit @p bit of @p f, whether or not this library names
 * that id: for sets in another numbering, such as a Linux version's
 * X86_FEATURE_* planned through altpatch_image_open_regions() with that
 * version's known ids. -EINVAL for a NULL set or @p bit >= ALTPATCH_FEATURE_BITS.
 */
ALTPATCH_API int altpatch_features_set_bit(struct altpatch_features *f, unsigned bit, bool on);
/** Bit @p bit of @p f, whatever the numbering; false for NULL or an id out of range. */
ALTPATCH_API bool altpatch_features_test_bit(const struct altpatch_features *f, unsigned bit);

/** Lower-case name of a feature id as /proc/cpuinfo (or the kernel) spells it; NULL if unknown. */
ALTPATCH_API const char *altpatch_feature_name(unsigned feature);
/** Id of a feature name (case-insensitive); -ENOENT if unknown. */
ALTPATCH_API int altpatch_feature_id(const char *name);

/**
 * Whether this process may use @p feature: the host set minus
 * ALTPATCH_CLEARCPUID (unless AT_SECURE). False for unknown ids.
 */
ALTPATCH_API bool altpatch_cpu_has(unsigned feature);

/* ------------------------------------------------------------------------- */
/* Apply                                                                     */
/* ------------------------------------------------------------------------- */

/**
 * Patch every loaded module (the executable, its libraries, and libraries
 * dlopen'ed since the last call) for the host features. Idempotent: a second
 * call writes nothing. Thread-safe (calls are serialized). Returns 0 when every
 * module was processed, even if some sites were refused (see the stats and
 * altpatch_site_foreach()); a negative errno when apply could not run at all
 * (-EBUSY: other threads exist and live patching is not possible; -ENOMEM;
 * -EDEADLK: called from a print or site-walk callback, or from a signal
 * handler that interrupted an altpatch call on the same thread -- it returns
 * at once, takes no lock and writes nothing; -EOWNERDEAD: in a child of fork()
 * made while another thread held the library's lock). fork() in another thread waits
 * until a running call returns. With other threads running, the sites are rewritten with the live protocol
 * (docs/live.md) unless ALTPATCH_APPLY_NO_LIVE.
 * Honors ALTPATCH_OFF, ALTPATCH_CLEARCPUID and ALTPATCH_DEBUG (not when AT_SECURE).
 */
ALTPATCH_API int altpatch_apply(void);

/** Flags for altpatch_apply_opts.flags. */
enum altpatch_apply_flags {
    /**
     * Plan only: decide and report every site, write nothing. The per-site
     * states that altpatch_site_foreach() then reports are the plan (PATCHED:
     * would hold a replacement); `current` shows what memory really holds.
     */
    ALTPATCH_APPLY_DRY_RUN = 1u << 0,
    /** Write every site's original bytes back (undo). */
    ALTPATCH_APPLY_REVERT = 1u << 1,
    /** Never use mprotect windows; write through /proc/self/mem only. */
    ALTPATCH_APPLY_PROCMEM_ONLY = 1u << 2,
    /** Never use /proc/self/mem (the mprotect window only). */
    ALTPATCH_APPLY_NO_PROCMEM = 1u << 3,
    /**
     * Rewrite the sites with the live protocol (int3 + membarrier SYNC_CORE,
     * writes through /proc/self/mem) even when no other thread runs. Without
     * this flag it is used whenever other threads exist.
     */
    ALTPATCH_APPLY_LIVE = 1u << 4,
    /** When other threads run, refuse with -EBUSY instead of patching live. */
    ALTPATCH_APPLY_NO_LIVE = 1u << 5,
    /**
     * The program's seccomp filter allows every system call the live
     * protocol makes (docs/live.md lists them: membarrier, mremap,
     * process_vm_readv, rt_tgsigqueueinfo, ...): live patching is then not
     * refused under a filter. Without it, live patching under a seccomp
     * filter is refused (-EBUSY): a filter may answer an unexpected system
     * call with a signal that ends the process.
     */
    ALTPATCH_APPLY_FILTER_ALLOWS_LIVE = 1u << 6,
};

struct altpatch_apply_opts {
    size_t sz; /**< sizeof(struct altpatch_apply_opts) */
    /** Plan for this set instead of the host's; ALTPATCH_CLEARCPUID is then not applied. */
    const struct altpatch_features *features;
    unsigned flags; /**< enum altpatch_apply_flags */
    /**
     * Must be zero (-EINVAL otherwise): a later version may give these bytes a
     * meaning. Named so that `= {.sz = sizeof(o), ...}` zeroes it; as unnamed
     * tail padding compilers leave it uninitialized and it could not be checked.
     */
    unsigned reserved;
};

/**
 * dlopen() @p path and patch the new module at once (libraries loaded by plain
 * dlopen() are patched at the next altpatch_apply()). NULL and dlerror() on failure
 * to load; a failed patch keeps the library loaded and original (see stats).
 * From a callback or a signal handler that interrupted an altpatch call on the
 * same thread: NULL with errno EDEADLK, nothing loaded.
 */
ALTPATCH_API void *altpatch_dlopen(const char *path, int flags);

/** altpatch_apply() with options; -EINVAL for a bad @p opts (NULL means defaults). */
ALTPATCH_API int altpatch_apply_opts(const struct altpatch_apply_opts *opts);

/** Counters of the most recent apply call. */
struct altpatch_stats {
    size_t sz;              /**< set by the caller: sizeof(struct altpatch_stats) */
    uint64_t modules;       /**< modules carrying altpatch tables */
    uint64_t sites_seen;
    uint64_t sites_patched; /**< memory now holds a replacement */
    uint64_t sites_unchanged; /**< final bytes equal what memory held: nothing written */
    uint64_t sites_refused; /**< planner or writer refused: original kept */
    uint64_t bytes_written;
    uint64_t pages_written;
    uint64_t syscalls;      /**< mprotect, pwrite, open, membarrier, ... made by the writer */
    uint64_t ns;            /**< wall time of the call */
    /* Appended after the first release: read them only when sz covers them. */
    uint64_t mprotect_windows; /**< RW windows opened with mprotect() */
    uint64_t procmem_writes;   /**< pwrite()s on /proc/self/mem that landed */
    uint64_t live;             /**< 1 when the call used the live protocol (docs/live.md) */
};

/**
 * Copy the stats of the last apply into @p st (st->sz must be set). -EINVAL on a
 * bad sz; -EDEADLK from a signal handler that interrupted an altpatch call on the
 * same thread while the lock was not free; -EOWNERDEAD in a child of fork() made
 * while another thread held the library's lock.
 */
ALTPATCH_API int altpatch_get_stats(struct altpatch_stats *st);

/* ------------------------------------------------------------------------- */
/* Sites and refusal reasons                                                 */
/* ------------------------------------------------------------------------- */

/** Why a site keeps its original bytes. 0 means no refusal. */
enum altpatch_reason {
    ALTPATCH_REASON_NONE = 0,
    ALTPATCH_REASON_BAD_TABLE,         /**< table size not a multiple of the record size, table or
                                        *   replacements outside the module, table in writable memory */
    ALTPATCH_REASON_BAD_VERSION,       /**< note format version or record size unknown */
    ALTPATCH_REASON_SITE_BOUNDS,       /**< site outside the module's executable sections */
    ALTPATCH_REASON_REPL_BOUNDS,       /**< replacement outside altinstr_replacement */
    ALTPATCH_REASON_REPL_TOO_LONG,     /**< replacement longer than the site */
    ALTPATCH_REASON_EMPTY_SITE,        /**< site length 0 */
    ALTPATCH_REASON_SITE_OVERLAP,      /**< site overlaps another site */
    ALTPATCH_REASON_ORIG_UNDECODABLE,  /**< original bytes do not decode */
    ALTPATCH_REASON_ORIG_CROSSES_END,  /**< an original instruction runs past the site end */
    ALTPATCH_REASON_REPL_UNDECODABLE,  /**< replacement bytes do not decode */
    ALTPATCH_REASON_REPL_CROSSES_END,  /**< a replacement instruction runs past its end */
    ALTPATCH_REASON_UNKNOWN_FEATURE,   /**< feature id not known to this library */
    ALTPATCH_REASON_RELOC_OVERFLOW,    /**< a relative operand does not fit after moving */
    ALTPATCH_REASON_MEM_MISMATCH,      /**< memory holds neither the original nor the plan */
    ALTPATCH_REASON_WRITE_DENIED,      /**< mprotect and /proc/self/mem both failed */
    /* Live patching (docs/live.md). */
    ALTPATCH_REASON_LIVE_CALL_INSIDE,   /**< live: a call before the site end (a return address inside) */
    ALTPATCH_REASON_LIVE_THREAD_INSIDE, /**< live: a thread stayed inside the multi-instruction site */
    ALTPATCH_REASON_LIVE_NO_ANSWER,     /**< live: a thread did not answer the handshake */
    ALTPATCH_REASON_UNKNOWN_FLAGS,     /**< record flags other than ALT_FLAG_NOT (e.g. the kernel's ALT_FLAG_DIRECT_CALL) */
    ALTPATCH_REASON_LIVE_NO_FLIP,      /**< live: the site's text pages cannot be replaced (anonymous, sealed, file not openable, mremap denied) while other threads run */
    ALTPATCH_REASON_LIVE_SHORT_ENTRY,  /**< live: a multi-instruction site whose first instruction is one byte (no room for the entry barrier) */
    ALTPATCH_REASON_LIVE_REALTIME,     /**< live: a multi-instruction site while another thread runs under a real-time policy (it could spin on the entry barrier and starve the apply) */
    ALTPATCH_REASON__COUNT
};

/** Stable English text for a reason; "unknown reason" outside the enum. */
ALTPATCH_API const char *altpatch_strreason(int reason);

enum altpatch_site_state {
    ALTPATCH_SITE_ORIGINAL = 0, /**< no entry eligible: original kept */
    ALTPATCH_SITE_PATCHED = 1,  /**< a replacement was selected and is in memory (after a dry run: would be) */
    ALTPATCH_SITE_REFUSED = 2,  /**< see reason */
};

/** One site as the last apply left it. Pointers are valid during the callback only. */
struct altpatch_site_info {
    const char *module;      /**< path of the module ("" for the main program) */
    uintptr_t addr;          /**< runtime address of the site */
    unsigned len;            /**< site length (bytes) */
    unsigned entries;        /**< number of records for this site (nested ALTERNATIVE_n) */
    int chosen;              /**< index of the selected entry, -1 for the original */
    unsigned feature;        /**< feature id of the selected entry (or of the first) */
    unsigned flags;          /**< record flags of that entry (ALT_FLAG_NOT, ...) */
    enum altpatch_site_state state;
    int reason;              /**< enum altpatch_reason */
    const uint8_t *original; /**< @c len original bytes */
    const uint8_t *current;  /**< @c len bytes now in memory */
};

/** Return non-zero from the callback to stop the walk. */
typedef int (*altpatch_site_fn)(const struct altpatch_site_info *site, void *ctx);
/**
 * Walk every site known to the last apply, module by module in load order.
 * Returns the callback's non-zero value, 0 at the end, -ENODATA before any apply,
 * -EDEADLK from a callback or a signal handler that interrupted an altpatch call,
 * -EOWNERDEAD in a child of fork() made while another thread held the library's lock.
 */
ALTPATCH_API int altpatch_site_foreach(altpatch_site_fn fn, void *ctx);

/* ------------------------------------------------------------------------- */
/* Logging                                                                   */
/* ------------------------------------------------------------------------- */

enum altpatch_print_level {
    ALTPATCH_WARN,  /**< something was refused or ignored */
    ALTPATCH_INFO,
    ALTPATCH_DEBUG, /**< per-site blocks (ALTPATCH_DEBUG=1) */
};

typedef int (*altpatch_print_fn)(enum altpatch_print_level level, const char *fmt, va_list ap);
/**
 * Route the library's messages to @p fn (NULL silences them). Returns the
 * previous callback. The default prints WARN to stderr, and DEBUG as well when
 * ALTPATCH_DEBUG=1. The callback runs during an apply, before its writes; if
 * it starts a thread, the apply asks again before its next write and patches
 * live or returns -EBUSY, with no non-live write made after the callback.
 */
ALTPATCH_API altpatch_print_fn altpatch_set_print(altpatch_print_fn fn);

#ifdef __cplusplus
}
#endif

#endif /* ALTPATCH_ALTPATCH_H */
