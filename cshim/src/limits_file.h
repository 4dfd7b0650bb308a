/* The limits file (format in cshim/README.md): parsing and finding the one that applies. */
#ifndef VC_LIMITS_FILE_H
#define VC_LIMITS_FILE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define VC_MAX_DEVICES 16
#define VC_UUID_LEN 96
#define VC_LIMITS_CONTAINER_PATH "/etc/vcuda/limits"
#define VC_LIMITS_ENV "VCUDA_LIMITS_FILE"

struct vc_limits {
    uint64_t memory;                            /* bytes per listed device */
    uint64_t virtual_memory;                    /* of memory, bytes that may live in host memory */
    unsigned cores;                             /* percent of each device's time, 1..100 */
    unsigned ndevices;                          /* 0: every visible device */
    char devices[VC_MAX_DEVICES][VC_UUID_LEN];  /* UUIDs, as NVML prints them */
    char account[PATH_MAX];                     /* shared account file; empty: private */
};

/* Parses text of len bytes. Returns 0, or -1 with a one-line reason in err. */
int vc_limits_parse(const char *text, size_t len, struct vc_limits *out, char *err, size_t errlen);

enum vc_limits_source { VC_LIMITS_NONE, VC_LIMITS_FOUND, VC_LIMITS_BROKEN };

/* Reads /etc/vcuda/limits if it exists, else the file named by VCUDA_LIMITS_FILE.
 * NONE: neither is there; BROKEN: one is there but unusable (reason in err). */
enum vc_limits_source vc_limits_load(struct vc_limits *out, char *path, size_t pathlen, char *err,
                                     size_t errlen);

#endif
