/* Process identity that survives pid reuse: (pid, start time since boot). */
#ifndef VC_PROC_H
#define VC_PROC_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Start time of pid in clock ticks since boot (/proc/<pid>/stat field 22);
 * 0 when no such process runs (gone, or a zombie whose memory is freed). */
uint64_t vc_proc_start_time(pid_t pid);

/* Whether the process that had start time start still runs as pid. */
bool vc_proc_alive(pid_t pid, uint64_t start);

#endif
