/* The time a context spent without the device: another process's time slices. */
#define _GNU_SOURCE
#include "pacer_state.h"

#include "bucket.h"
#include "driver.h"

/* Beside a busy neighbour the device runs one process's time slice at a
 * time, and a kernel of this context that another's slice preempts ends
 * that much later: its record spans the slice (3.4 ms kernels of a training
 * step were charged 8.2 ms beside a matmul on an H100, two 2.4 ms slices
 * each). The thread sees those slices with a probe, an event on the
 * context's own idle stream. While the context has the device the probe
 * completes some us after it is recorded, whatever its kernels do; during
 * another process's slice it completes only as the slice ends. So from
 * where the probe was recorded on the timeline to where it completed, the
 * context was away from the device, and nothing of its own ran there.
 * Recorded once a round, one at a time, it sees each slice from the first
 * round within it, and misses up to a round of each: beside a busy
 * neighbour the thread's rounds come four times as often (BESIDE_TICK_NS). */

/* Ring position i of c's away spans, newest last. */
static struct span *span_at(struct vc_pacer_context *c, uint32_t i) { return &c->away[i % AWAYS]; }

/* Adds the span from..to, after the newest one (clipped to start past it). */
static void add_span(struct vc_pacer_context *c, int64_t from, int64_t to)
{
    struct span *last = c->naway ? span_at(c, c->naway - 1) : NULL;
    if (last && from < last->to)
        from = last->to;
    if (to - from < AWAY_MIN_NS)
        return;
    *span_at(c, c->naway++) = (struct span){.from = from, .to = to};
    pacer.slice_found = vc_clock_ns();
    pacer.tally.slices++;
    pacer.tally.away_ns += to - from;
}

/* Reads c's probe, if one was recorded: once complete, where it was
 * recorded and where it completed on c's timeline. */
static void read_probe(struct vc_pacer_context *c)
{
    struct probe *p = &c->probe;
    const struct ref *ref;
    if (!p->pending || !pacer_event_done(c, p->event, p->generation, &ref))
        return;
    p->pending = false;
    int64_t done = ref ? pacer_event_at(ref, p->event) : -1;
    if (done >= 0)
        add_span(c, pacer_clock_at(ref, p->recorded), done);
}

void pacer_probe(struct vc_pacer_context *c)
{
    if (!c->own || c->broken)
        return;
    read_probe(c);
    if (c->probe.pending || c->complete < 0)
        return;
    if (vc_real_cuEventRecord(c->probe.event, c->own) != CUDA_SUCCESS)
        return;
    /* Read after the call returns: a thread descheduled in it places the
     * probe late, which can only shorten the span it finds. */
    c->probe = (struct probe){.event = c->probe.event, .pending = true,
                              .generation = c->complete, .recorded = vc_clock_ns()};
}

int64_t pacer_away(struct vc_pacer_context *c, int64_t from, int64_t to)
{
    int64_t away = 0;
    uint32_t kept = c->naway < AWAYS ? c->naway : AWAYS;
    for (uint32_t i = 0; i < kept; i++) {
        const struct span *s = span_at(c, c->naway - 1 - i);
        if (s->to <= from)
            break;   /* older ones end before it too */
        int64_t a = s->from > from ? s->from : from, b = s->to < to ? s->to : to;
        if (b > a)
            away += b - a;
    }
    return away;
}
