/* Parses the limits file exactly as runtime_hook/limits_file.py renders and checks it. */
#define _GNU_SOURCE
#include "limits_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LINE 4096
#define MAX_FILE 65536
#define MAX_KEYS 64

struct field {
    const char *key;
    const char *value;
    size_t len;
};

enum { F_VERSION, F_MEMORY, F_CORES, F_DEVICES, F_ACCOUNT, F_VIRTUAL, F_COUNT };
static const char *const known[F_COUNT] = {"version", "memory",  "cores",
                                           "devices", "account", "virtual-memory"};

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\v\f", s[i]))
            return false;
    return true;
}

/* A whole number of plain digits that fits in 63 bits. */
static bool number(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 19)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return v <= INT64_MAX;
}

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_devices(const char *s, size_t n, struct vc_limits *out, char *err, size_t errlen)
{
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != ',')
            continue;
        size_t len = i - start;
        if (len > 0) {
            if (out->ndevices == VC_MAX_DEVICES)
                return fail(err, errlen, "more than %d devices listed", VC_MAX_DEVICES);
            if (len >= VC_UUID_LEN)
                return fail(err, errlen, "device UUID %.*s... is too long", 16, s + start);
            for (size_t k = start; k < i; k++)
                if (strchr("= \t#", s[k]))
                    return fail(err, errlen, "device UUID '%.*s' holds a character not allowed",
                                (int)len, s + start);
            memcpy(out->devices[out->ndevices++], s + start, len);
        }
        start = i + 1;
    }
    return 0;
}

int vc_limits_parse(const char *text, size_t len, struct vc_limits *out, char *err, size_t errlen)
{
    struct field fields[F_COUNT] = {{0}};
    struct field keys[MAX_KEYS];
    unsigned nkeys = 0;
    memset(out, 0, sizeof *out);
    if (memchr(text, '\0', len))
        return fail(err, errlen, "the file holds a NUL byte");
    unsigned number_of_line = 0;
    for (size_t pos = 0; pos < len;) {
        size_t end = pos;
        while (end < len && text[end] != '\n' && text[end] != '\r')
            end++;
        const char *line = text + pos;
        size_t n = end - pos;
        number_of_line++;
        pos = end + (end < len && text[end] == '\r' && end + 1 < len && text[end + 1] == '\n' ? 2 : 1);
        if (blank(line, n) || line[0] == '#')
            continue;
        const char *eq = memchr(line, '=', n);
        if (n > MAX_LINE || !eq)
            return fail(err, errlen, "line %u: expected key=value", number_of_line);
        size_t keylen = (size_t)(eq - line);
        for (unsigned k = 0; k < nkeys; k++)
            if (keys[k].len == keylen && memcmp(keys[k].value, line, keylen) == 0)
                return fail(err, errlen, "line %u: %.*s given twice", number_of_line, (int)keylen,
                            line);
        if (nkeys == MAX_KEYS)
            return fail(err, errlen, "line %u: more than %d keys", number_of_line, MAX_KEYS);
        keys[nkeys++] = (struct field){NULL, line, keylen};
        /* Unknown keys are ignored: newer writers may add some. */
        for (int f = 0; f < F_COUNT; f++)
            if (strlen(known[f]) == keylen && memcmp(known[f], line, keylen) == 0)
                fields[f] = (struct field){known[f], eq + 1, n - keylen - 1};
    }
    if (!fields[F_VERSION].key || fields[F_VERSION].len != 1 || fields[F_VERSION].value[0] != '1')
        return fail(err, errlen, "version must be 1");
    if (!fields[F_MEMORY].key)
        return fail(err, errlen, "memory is missing");
    uint64_t cores = 100;
    if (!number(fields[F_MEMORY].value, fields[F_MEMORY].len, &out->memory)
        || (fields[F_CORES].key && !number(fields[F_CORES].value, fields[F_CORES].len, &cores)))
        return fail(err, errlen, "memory and cores must be whole numbers");
    if (out->memory == 0)
        return fail(err, errlen, "memory must be a positive number of bytes, got 0");
    if (cores < 1 || cores > 100)
        return fail(err, errlen, "cores must be 1..100, got %llu", (unsigned long long)cores);
    out->cores = (unsigned)cores;
    if (fields[F_VIRTUAL].key
        && !number(fields[F_VIRTUAL].value, fields[F_VIRTUAL].len, &out->virtual_memory))
        return fail(err, errlen, "virtual-memory must be a whole number of bytes");
    if (out->virtual_memory >= out->memory)
        return fail(err, errlen, "virtual-memory must be less than memory (%llu), got %llu",
                    (unsigned long long)out->memory, (unsigned long long)out->virtual_memory);
    if (fields[F_DEVICES].key
        && parse_devices(fields[F_DEVICES].value, fields[F_DEVICES].len, out, err, errlen) != 0)
        return -1;
    if (fields[F_ACCOUNT].key) {
        if (fields[F_ACCOUNT].len >= sizeof out->account)
            return fail(err, errlen, "account path is too long");
        memcpy(out->account, fields[F_ACCOUNT].value, fields[F_ACCOUNT].len);
    }
    return 0;
}

/* Reads a whole small file; -1 with errno set when it cannot. */
static ssize_t read_file(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    ssize_t n;
    while (got < size && (n = read(fd, buf + got, size - got)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int saved = errno;
            close(fd);
            errno = saved;
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    if (got == size) {
        errno = EFBIG;
        return -1;
    }
    return (ssize_t)got;
}

enum vc_limits_source vc_limits_load(struct vc_limits *out, char *path, size_t pathlen, char *err,
                                     size_t errlen)
{
    static char text[MAX_FILE];
    snprintf(path, pathlen, "%s", VC_LIMITS_CONTAINER_PATH);
    ssize_t n = read_file(path, text, sizeof text);
    if (n < 0 && errno == ENOENT) {
        const char *named = getenv(VC_LIMITS_ENV);
        if (!named || !*named)
            return VC_LIMITS_NONE;
        snprintf(path, pathlen, "%s", named);
        n = read_file(path, text, sizeof text);
    }
    if (n < 0) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return VC_LIMITS_BROKEN;
    }
    char why[256];
    if (vc_limits_parse(text, (size_t)n, out, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: %s", path, why);
        return VC_LIMITS_BROKEN;
    }
    return VC_LIMITS_FOUND;
}
