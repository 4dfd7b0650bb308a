/* The pacer's side of the bucket: charging GPU time to a device, waiting for it. */
#define _GNU_SOURCE
#include "pacer_state.h"

#include <time.h>

#include "bucket.h"
#include "setup.h"

void pacer_nap(int64_t ns)
{
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    nanosleep(&ts, NULL);
}

void pacer_charge(int device, int64_t now, int64_t gpu_ns)
{
    struct vc_region *r = vc_region();
    vc_bucket_charge(&r->bucket[device], now, gpu_ns, vc_limits()->cores);
    __atomic_add_fetch(&r->gpu_ns[device], (uint64_t)gpu_ns, __ATOMIC_RELAXED);
}

/* Waits, holding no lock, for the wait ns the device's bucket asked of a
 * launch, and until it lets the launch through. */
void pacer_wait(int device, int64_t wait)
{
    int64_t *bucket = &vc_region()->bucket[device];
    int64_t began = vc_clock_ns(), now;
    do {
        /* Other launches and corrections move the bucket meanwhile: look again now and then. */
        pacer_nap(wait < NAP_NS ? wait : NAP_NS);
        now = vc_clock_ns();
    } while ((wait = vc_bucket_wait(bucket, now)) > 0);
    __atomic_add_fetch(&pacer.tally.waits, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&pacer.tally.waited_ns, now - began, __ATOMIC_RELAXED);
}
