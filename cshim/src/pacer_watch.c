/* The watch: lets a held stream go when the launch that holds it does not. */
#define _GNU_SOURCE
#include "pacer_state.h"

#include "bucket.h"

bool pacer_holding(const struct vc_pacer_context *c)
{
    return (int32_t)(c->held - __atomic_load_n(pacer_flag(c), __ATOMIC_ACQUIRE)) > 0;
}

/* The watch is woken only when it sleeps: waking it at each hold, on an H100
 * VM, took the launching thread off its CPU for tens of us at times. */
void pacer_hold(struct vc_pacer_context *c, uint32_t value, int64_t now)
{
    c->held = value;
    c->held_at = now;
    pacer.last_hold = now;
    if (pacer.watch_asleep)
        pthread_cond_signal(&pacer.held);
}

/* A stream held longer than HOLD_STALE_NS is let go: its timing is spoiled,
 * not its work. Its holder may be stuck in a driver call (a launch call that
 * blocks until the stream runs), and so may the pacing thread: on an H100, a
 * program's cuStreamCreate spun under the driver's lock until a held stream
 * ran, and the next driver call of the thread that held it waited for that
 * lock. So this thread calls no driver, and holds the lock only to look. */
static void *watch(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&pacer.lock);
    while (!pacer.stopping) {
        int64_t now = vc_clock_ns();
        bool held = false;
        for (int i = 0; i < MAX_CONTEXTS; i++) {
            struct vc_pacer_context *c = &pacer.contexts[i];
            if (!c->ctx || !pacer_holding(c))
                continue;
            if (now - c->held_at > HOLD_STALE_NS)
                pacer_release(pacer_flag(c), c->held);
            else
                held = true;
        }
        /* While streams are held often, it looks every HOLD_STALE_NS unasked:
         * a hold is let go 1-2 ms after it was made, not 1. */
        if (!held && now - pacer.last_hold > HOLDING_NS) {
            pacer.watch_asleep = true;
            pthread_cond_wait(&pacer.held, &pacer.lock);
            pacer.watch_asleep = false;
            continue;
        }
        pthread_mutex_unlock(&pacer.lock);
        pacer_nap(HOLD_STALE_NS);
        pthread_mutex_lock(&pacer.lock);
    }
    pthread_mutex_unlock(&pacer.lock);
    return NULL;
}

bool pacer_start_watch(void)
{
    pthread_t thread;
    if (pthread_create(&thread, NULL, watch, NULL) != 0)
        return false;
    pthread_setname_np(thread, "vcuda-watch");
    pthread_detach(thread);
    return true;
}
