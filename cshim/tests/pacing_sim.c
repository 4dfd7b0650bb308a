/*
 * Drives the pacing logic of libvcuda.so (bucket.c, estimate.c) on a
 * simulated clock, so CI checks its arithmetic exactly, apart from any
 * driver or scheduler:
 *
 *   share PERCENT KERNEL_US SECONDS LAUNCHERS OVERSHOOT_US
 *       LAUNCHERS programs launch kernels of KERNEL_US back to back through
 *       one bucket onto a device that runs one kernel at a time. A launch
 *       waits as the shim's does; each wait oversleeps by OVERSHOOT_US, as
 *       timers do. Prints "share MIN MAX": the device's busy time over every
 *       2-second window (sliding by 10 ms), in percent.
 *   idle PERCENT KERNEL_US IDLE_MS
 *       After IDLE_MS without launches, one program launches back to back:
 *       prints "share FIRST", its share in the first 2-second window.
 *   steps PERCENT KERNEL_US WORK_MS HOST_MS SECONDS
 *       One program in steps, as a training loop: WORK_MS of KERNEL_US
 *       kernels launched back to back, a sync (it waits until the device
 *       has run them), then HOST_MS of host work with the device idle.
 *       Prints "share MEAN MAX": the device's busy time over the whole run
 *       and over its busiest 2-second window, in percent.
 *   gaps PERCENT KERNEL_US EVERY_US SECONDS
 *       One program launches a kernel of KERNEL_US every EVERY_US (the device
 *       idles between them: a launch-bound program), charged its kernel's
 *       time. Prints "waited N share S": the launches that had to wait, and
 *       the device's busy time over the whole run, in percent.
 *   debt PERCENT KERNEL_MS
 *       Prints "wait MS": how long the launch after one such kernel waits.
 *   estimate KERNEL_US NOISE_PCT STRETCHED_PCT STRETCH_US CUT_PCT SAMPLES SEED
 *       Feeds SAMPLES samples of a kernel (KERNEL_US, +-NOISE_PCT uniform),
 *       STRETCHED_PCT of them stretched by up to STRETCH_US (other work
 *       between the events) and, from the 17th on, CUT_PCT cut to a tenth
 *       to a half (a record that lost some of its own time), one a
 *       millisecond. Prints "estimate NS mean NS lowest NS": the estimate,
 *       the mean of the samples neither stretched nor cut, and the lowest
 *       estimate from the 16th sample on.
 *   shift FROM_US TO_US
 *       Feeds 50 samples of FROM_US, then samples of TO_US, one a
 *       millisecond. Prints "follows N": after how many samples of TO_US the
 *       estimate is within 3% of it (0: never, in 50).
 *   return KERNEL_US STRETCHED_US SECONDS
 *       Feeds 50 samples of KERNEL_US one a millisecond, then SECONDS of
 *       samples of STRETCHED_US one every 100 ms (a kernel seldom timed
 *       alone beside a busy neighbour: its floor rises meanwhile), then one
 *       of KERNEL_US. Prints "estimate NS".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "estimate.h"

#define MS 1000000LL
#define SLOT (10 * MS)
#define WINDOW_SLOTS 200
#define LAUNCH_NS 3000      /* CPU time of one launch call */
#define MAX_LAUNCHERS 16

static int64_t *busy;       /* busy ns per 10 ms slot */
static int64_t nslots;

/* Slots for a run of ns, all idle. */
static void make_slots(int64_t ns)
{
    nslots = ns / SLOT;
    busy = calloc((size_t)nslots, sizeof *busy);
}

/* Marks [start, end) busy in the slots. */
static void mark(int64_t start, int64_t end)
{
    for (int64_t t = start; t < end;) {
        int64_t slot = t / SLOT, next = (slot + 1) * SLOT;
        int64_t stop = end < next ? end : next;
        if (slot < nslots)
            busy[slot] += stop - t;
        t = stop;
    }
}

static void windows(int64_t from_slot, double *min, double *max)
{
    *min = 1e9;
    *max = 0;
    for (int64_t first = from_slot; first + WINDOW_SLOTS <= nslots; first++) {
        int64_t sum = 0;
        for (int64_t i = first; i < first + WINDOW_SLOTS; i++)
            sum += busy[i];
        double share = 100.0 * (double)sum / (double)(WINDOW_SLOTS * SLOT);
        *min = share < *min ? share : *min;
        *max = share > *max ? share : *max;
    }
}

/* One launch of a kernel at now through the bucket: the wait the bucket asks
 * first (nothing launched), or 0 once the kernel is queued on the device. */
static int64_t launch(unsigned percent, int64_t kernel, int64_t now, int64_t *device_free,
                      int64_t *bucket)
{
    int64_t wait = vc_bucket_wait(bucket, now);
    if (wait > 0)
        return wait;
    vc_bucket_charge(bucket, now, kernel, percent);
    int64_t begin = now > *device_free ? now : *device_free;
    *device_free = begin + kernel;
    mark(begin, *device_free);
    return 0;
}

/* Launchers (each its own clock) share one bucket and one device from start to end. */
static void simulate(unsigned percent, int64_t kernel, int launchers, int64_t overshoot,
                     int64_t start, int64_t end, int64_t *bucket)
{
    int64_t clock[MAX_LAUNCHERS], device_free = start;
    for (int i = 0; i < launchers; i++)
        clock[i] = start + i * LAUNCH_NS / launchers;
    for (;;) {
        int who = 0;
        for (int i = 1; i < launchers; i++)
            who = clock[i] < clock[who] ? i : who;
        int64_t now = clock[who];
        if (now >= end)
            return;
        int64_t wait = launch(percent, kernel, now, &device_free, bucket);
        clock[who] = wait > 0 ? now + wait + overshoot : now + LAUNCH_NS;
    }
}

/* One program in steps until end: kernels launched back to back until a
 * step's work is queued, a wait until the device has run them (a sync),
 * then host work with the device idle. */
static void steps(unsigned percent, int64_t kernel, int64_t work, int64_t host, int64_t end,
                  int64_t *bucket)
{
    int64_t now = 0, device_free = 0;
    while (now < end) {
        for (int64_t queued = 0; queued < work && now < end;) {
            int64_t wait = launch(percent, kernel, now, &device_free, bucket);
            now += wait > 0 ? wait : LAUNCH_NS;
            queued += wait > 0 ? 0 : kernel;
        }
        now = (now > device_free ? now : device_free) + host;
    }
}

static uint64_t rng = 88172645463325252ULL;

static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    int64_t bucket = 0;
    if (!strcmp(what, "share") && argc == 7) {
        int64_t seconds = atoll(argv[4]);
        make_slots(seconds * 1000 * MS);
        simulate((unsigned)atoi(argv[2]), atoll(argv[3]) * 1000, atoi(argv[5]),
                 atoll(argv[6]) * 1000, 0, seconds * 1000 * MS, &bucket);
        double min, max;
        windows(0, &min, &max);
        printf("share %.2f %.2f\n", min, max);
        return 0;
    }
    if (!strcmp(what, "idle") && argc == 5) {
        int64_t idle = atoll(argv[4]) * MS;
        make_slots(idle + 2000 * MS);
        bucket = 0;   /* last used long before */
        simulate((unsigned)atoi(argv[2]), atoll(argv[3]) * 1000, 1, 0, idle, idle + 2000 * MS,
                 &bucket);
        double min, max;
        windows(idle / SLOT, &min, &max);
        printf("share %.2f\n", max);
        return 0;
    }
    if (!strcmp(what, "steps") && argc == 7) {
        int64_t seconds = atoll(argv[6]), total = 0;
        make_slots(seconds * 1000 * MS);
        steps((unsigned)atoi(argv[2]), atoll(argv[3]) * 1000, atoll(argv[4]) * MS,
              atoll(argv[5]) * MS, seconds * 1000 * MS, &bucket);
        for (int64_t i = 0; i < nslots; i++)
            total += busy[i];
        double min, max;
        windows(0, &min, &max);
        printf("share %.2f %.2f\n", 100.0 * (double)total / (double)(nslots * SLOT), max);
        return 0;
    }
    if (!strcmp(what, "gaps") && argc == 6) {
        int64_t kernel = atoll(argv[3]) * 1000, every = atoll(argv[4]) * 1000;
        int64_t end = atoll(argv[5]) * 1000 * MS, busy_ns = 0, now = 0;
        long waited = 0;
        for (int64_t next = 0;; next += every) {
            now = now > next ? now : next;
            int64_t wait = vc_bucket_wait(&bucket, now);
            waited += wait > 0;
            if ((now += wait) >= end)
                break;
            vc_bucket_charge(&bucket, now, kernel, (unsigned)atoi(argv[2]));
            busy_ns += kernel;   /* the device is idle when it comes: it runs at once */
            now += LAUNCH_NS;
        }
        printf("waited %ld share %.2f\n", waited, 100.0 * (double)busy_ns / (double)end);
        return 0;
    }
    if (!strcmp(what, "debt") && argc == 4) {
        int64_t now = 1000 * 1000 * MS;
        bucket = now;
        vc_bucket_charge(&bucket, now, atoll(argv[3]) * MS, (unsigned)atoi(argv[2]));
        printf("wait %.3f\n", (double)vc_bucket_wait(&bucket, now) / MS);
        return 0;
    }
    if (!strcmp(what, "estimate") && argc == 9) {
        double kernel = atof(argv[2]) * 1000, noise = atof(argv[3]) / 100;
        double stretched = atof(argv[4]) / 100, stretch = atof(argv[5]) * 1000;
        double cut = atof(argv[6]) / 100;
        int samples = atoi(argv[7]);
        rng += (uint64_t)atoll(argv[8]);
        struct vc_estimate e = {0};
        double clean = 0;
        int nclean = 0;
        int64_t lowest = INT64_MAX;
        for (int i = 0; i < samples; i++) {
            double ns = kernel * (1 + noise * (2 * uniform() - 1)), draw = uniform();
            if (draw < stretched) {
                ns += stretch * uniform();
            } else if (draw < stretched + cut && i >= VC_ESTIMATE_SAMPLES) {
                ns *= 0.1 + 0.4 * uniform();
            } else {
                clean += ns;
                nclean++;
            }
            /* One launch a millisecond. */
            vc_estimate_add(&e, (int64_t)ns, i * MS);
            if (i + 1 >= VC_ESTIMATE_SAMPLES && e.ns < lowest)
                lowest = e.ns;
        }
        printf("estimate %lld mean %.0f lowest %lld\n", (long long)e.ns,
               nclean ? clean / nclean : 0.0, (long long)lowest);
        return 0;
    }
    if (!strcmp(what, "shift") && argc == 4) {
        int64_t from = atoll(argv[2]) * 1000, to = atoll(argv[3]) * 1000;
        struct vc_estimate e = {0};
        int i = 0, follows = 0;
        for (; i < 50; i++)
            vc_estimate_add(&e, from, i * MS);
        for (int n = 1; n <= 50 && !follows; n++, i++) {
            vc_estimate_add(&e, to, i * MS);
            if (e.ns * 100 >= to * 97 && e.ns * 100 <= to * 103)
                follows = n;
        }
        printf("follows %d\n", follows);
        return 0;
    }
    if (!strcmp(what, "return") && argc == 5) {
        int64_t kernel = atoll(argv[2]) * 1000, stretched = atoll(argv[3]) * 1000;
        int64_t now = 0, until = 50 * MS + (int64_t)(atof(argv[4]) * 1000) * MS;
        struct vc_estimate e = {0};
        for (; now < 50 * MS; now += MS)
            vc_estimate_add(&e, kernel, now);
        for (; now < until; now += 100 * MS)
            vc_estimate_add(&e, stretched, now);
        vc_estimate_add(&e, kernel, now);
        printf("estimate %lld\n", (long long)e.ns);
        return 0;
    }
    fprintf(stderr, "usage: pacing_sim share|idle|gaps|debt|estimate|shift|return ... (see the source)\n");
    return 2;
}
