/* This process's share of the container's memory account, per device. */
#ifndef VC_ACCOUNT_H
#define VC_ACCOUNT_H

#include <stdbool.h>
#include <stdint.h>

/* Device index -1 is a refused device: nothing is charged there, and only
 * nothing fits. */

/* Adds bytes to entry dev if the container then holds at most own_limit there
 * and at most limit there and in entry partner together (-1: no partner; a
 * device's entries of device and host memory share its limit). Dead
 * processes are swept first when it would not fit. */
bool vc_account_reserve(int dev, int partner, uint64_t bytes, uint64_t own_limit, uint64_t limit);

/* Adds delta (negative: gives back) without a check. */
void vc_account_add(int dev, int64_t delta);

/* Bytes the whole container holds on dev; sweeps dead processes at most once a second. */
uint64_t vc_account_used(int dev);

/* A process of the container and the bytes it holds on a device. */
struct vc_account_process {
    int32_t pid;
    uint64_t bytes;
};

/* The container's processes that hold memory on dev (at most max of them
 * into out), after the same sweep as vc_account_used; returns how many
 * there are. Their bytes add up to what vc_account_used gives. */
unsigned vc_account_processes(int dev, struct vc_account_process *out, unsigned max);

/* In a forked child: the parent's slot is not ours. */
void vc_account_forked(void);

#endif
