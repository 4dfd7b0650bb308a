/*
 * Test double of the driver, for CI machines without a GPU: the devices' state
 * that every process sees (like one physical GPU), kept in a file mapped by
 * the fake libcuda.so.1 and libnvidia-ml.so.1.
 *
 * VCUDA_FAKE_STATE   path of the state file (created on first use)
 * VCUDA_FAKE_GPUS    memory of each device in MiB, comma separated (default 16384)
 * VCUDA_FAKE_CONTEXT_MIB  memory a context takes (default 96)
 *
 * Every process's kernels run on the devices one at a time (fake_gpu.c), on
 * a timeline that all processes share.
 */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#include <stdbool.h>
#include <stdint.h>

#define FAKE_MAX_DEVICES 8
#define FAKE_MAX_PROCS 256
#define FAKE_INTERVALS 64

struct fake_proc {
    int32_t pid;
    uint32_t pad;
    uint64_t start;
    uint64_t used[FAKE_MAX_DEVICES];
};

/* What a device runs when (CLOCK_MONOTONIC ns): the latest kernels, in order. */
struct fake_timeline {
    int32_t lock;                /* a spin lock, held for a few instructions */
    uint32_t next;
    int64_t busy_until;
    struct {
        int64_t start, end;
        int32_t pid, pad;
    } kernel[FAKE_INTERVALS];
};

struct fake_state {
    uint32_t ready;
    uint32_t ndevices;
    uint64_t total[FAKE_MAX_DEVICES];
    struct fake_timeline timeline[FAKE_MAX_DEVICES];
    unsigned char uuid[FAKE_MAX_DEVICES][16];
    struct fake_proc procs[FAKE_MAX_PROCS];
};

/* The shared state; NULL (with a message on stderr) if it cannot be set up. */
struct fake_state *fake_state(void);

/* This process's usage entry (claimed on first use, again after fork). */
struct fake_proc *fake_self(void);

/* Whether the process of an entry still runs. */
bool fake_proc_live(const struct fake_proc *p);

/* Bytes held on physical device dev by live processes. */
uint64_t fake_used(int dev);

/* The device's UUID as NVML prints it. */
void fake_uuid_string(int dev, char *out, unsigned len);

#endif
