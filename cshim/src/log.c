/* Diagnostics on stderr, filtered by VCUDA_LOG_LEVEL (off, error, warn, info, debug). */
#define _GNU_SOURCE
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int threshold = -1;

static int read_threshold(void)
{
    static const char *const names[] = {"off", "error", "warn", "info", "debug"};
    const char *value = getenv("VCUDA_LOG_LEVEL");
    for (int level = VC_LOG_OFF; value && level <= VC_LOG_DEBUG; level++)
        if (strcmp(value, names[level]) == 0)
            return level;
    return VC_LOG_ERROR;
}

void vc_log(enum vc_log_level level, const char *fmt, ...)
{
    int limit = __atomic_load_n(&threshold, __ATOMIC_RELAXED);
    if (limit < 0) {
        limit = read_threshold();
        __atomic_store_n(&threshold, limit, __ATOMIC_RELAXED);
    }
    if ((int)level > limit)
        return;
    char line[512];
    int n = snprintf(line, sizeof line, "vcuda[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    /* One write(2): lines from several processes never interleave mid-line. */
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
}
