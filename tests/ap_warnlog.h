/* SPDX-License-Identifier: MIT */
/*
 * Capture the library's WARN lines (install ap_warn_capture with
 * altpatch_set_print() in the child that applies) and look for one that names
 * a module and a refusal reason.
 */
#ifndef AP_TEST_WARNLOG_H
#define AP_TEST_WARNLOG_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <altpatch/altpatch.h>

static char ap_warn_log[8192];

static inline int ap_warn_capture(enum altpatch_print_level level, const char *fmt, va_list ap)
{
    size_t n = strlen(ap_warn_log);
    if (level == ALTPATCH_WARN && n + 1 < sizeof(ap_warn_log))
        vsnprintf(ap_warn_log + n, sizeof(ap_warn_log) - n, fmt, ap);
    return 0;
}

/* Whether one captured line names @p module and the text of @p reason. */
static inline int ap_warn_logged(const char *module, int reason)
{
    const char *why = altpatch_strreason(reason);
    for (const char *line = ap_warn_log; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char one[512];
        snprintf(one, sizeof(one), "%.*s", (int)n, line);
        if (strstr(one, module) && strstr(one, why))
            return 1;
        line = end ? end + 1 : NULL;
    }
    return 0;
}

#endif /* AP_TEST_WARNLOG_H */
