/* Reads /proc/<pid>/stat to tell a live process from a dead one or a reused pid. */
#define _GNU_SOURCE
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define UNKNOWN UINT64_MAX

/* Start time, 0 when gone or a zombie, UNKNOWN when /proc cannot tell. */
static uint64_t stat_start_time(pid_t pid)
{
    char path[32], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return (errno == ENOENT || errno == ESRCH) && access("/proc/self/stat", R_OK) == 0 ? 0 : UNKNOWN;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return n == 0 || errno == ESRCH ? 0 : UNKNOWN;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: skip past the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return UNKNOWN;
    char state = p[2];
    if (state == 'Z' || state == 'X' || state == 'x')
        return 0;
    p += 2;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return UNKNOWN;
        p++;
    }
    return strtoull(p, NULL, 10);
}

uint64_t vc_proc_start_time(pid_t pid)
{
    uint64_t start = stat_start_time(pid);
    return start == UNKNOWN ? 0 : start;
}

bool vc_proc_alive(pid_t pid, uint64_t start)
{
    uint64_t now = stat_start_time(pid);
    /* Without a readable /proc, fall back to whether the pid exists at all. */
    if (now == UNKNOWN)
        return kill(pid, 0) == 0 || errno != ESRCH;
    return now != 0 && now == start;
}
