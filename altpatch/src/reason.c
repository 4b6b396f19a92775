/* SPDX-License-Identifier: MIT */
/*
 * reason.c - the sentence for every ALTPATCH_REASON_* (altpatch_strreason()).
 */
#include "util.h"

static const char *const ap_reason_text[ALTPATCH_REASON__COUNT] = {
    [ALTPATCH_REASON_NONE] = "no refusal",
    [ALTPATCH_REASON_BAD_TABLE] = "bad record table",
    [ALTPATCH_REASON_BAD_VERSION] = "unknown record format version",
    [ALTPATCH_REASON_SITE_BOUNDS] = "site outside the module's executable sections",
    [ALTPATCH_REASON_REPL_BOUNDS] = "replacement outside altinstr_replacement",
    [ALTPATCH_REASON_REPL_TOO_LONG] = "replacement longer than the site",
    [ALTPATCH_REASON_EMPTY_SITE] = "empty site",
    [ALTPATCH_REASON_SITE_OVERLAP] = "site overlaps another site",
    [ALTPATCH_REASON_ORIG_UNDECODABLE] = "original instruction does not decode",
    [ALTPATCH_REASON_ORIG_CROSSES_END] = "original instruction runs past the site end",
    [ALTPATCH_REASON_REPL_UNDECODABLE] = "replacement instruction does not decode",
    [ALTPATCH_REASON_REPL_CROSSES_END] = "replacement instruction runs past its end",
    [ALTPATCH_REASON_UNKNOWN_FEATURE] = "unknown feature id",
    [ALTPATCH_REASON_RELOC_OVERFLOW] = "relative operand does not fit after relocation",
    [ALTPATCH_REASON_MEM_MISMATCH] = "memory holds neither the original nor the planned bytes",
    [ALTPATCH_REASON_WRITE_DENIED] = "write denied (mprotect and /proc/self/mem)",
    [ALTPATCH_REASON_LIVE_CALL_INSIDE] = "not live-patchable: a call inside the site",
    [ALTPATCH_REASON_LIVE_THREAD_INSIDE] = "live: a thread stayed inside the site",
    [ALTPATCH_REASON_LIVE_NO_ANSWER] = "live: a thread did not answer the handshake",
    [ALTPATCH_REASON_UNKNOWN_FLAGS] = "unknown record flags",
    [ALTPATCH_REASON_LIVE_NO_FLIP] = "live: the text pages cannot be replaced",
    [ALTPATCH_REASON_LIVE_SHORT_ENTRY] =
        "not live-patchable: the first instruction is one byte (no room for the entry barrier)",
    [ALTPATCH_REASON_LIVE_REALTIME] =
        "live: a real-time thread could spin on the entry barrier and starve the apply",
};

const char *altpatch_strreason(int reason)
{
    if (reason < 0 || reason >= ALTPATCH_REASON__COUNT || !ap_reason_text[reason])
        return "unknown reason";
    return ap_reason_text[reason];
}
