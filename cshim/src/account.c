/* Charges and credits this process's slot in the shared account. */
#define _GNU_SOURCE
#include "account.h"

#include <unistd.h>

#include "log.h"
#include "proc.h"
#include "setup.h"

/* This process's slot; read and written with the account lock held. */
static struct vc_slot *own;

static struct vc_slot *own_slot(struct vc_region *r)
{
    if (!own) {
        pid_t pid = getpid();
        own = vc_region_claim(r, pid, vc_proc_start_time(pid));
        if (!own)
            vc_log(VC_LOG_ERROR, "the account has no free slot: allocations are refused");
    }
    return own;
}

/* Whether bytes more on dev keep both bounds of vc_account_reserve; r->lock held. */
static bool fits(struct vc_region *r, int dev, int partner, uint64_t bytes, uint64_t own_limit,
                 uint64_t limit)
{
    uint64_t own = vc_region_used(r, dev);
    uint64_t together = own + (partner >= 0 ? vc_region_used(r, partner) : 0);
    return bytes <= own_limit && own <= own_limit - bytes && bytes <= limit
           && together <= limit - bytes;
}

bool vc_account_reserve(int dev, int partner, uint64_t bytes, uint64_t own_limit, uint64_t limit)
{
    if (dev < 0)
        return bytes == 0;
    struct vc_region *r = vc_region();
    int cancel;
    if (!vc_region_lock(r, &r->lock, &cancel))
        return false;
    struct vc_slot *slot = own_slot(r);
    bool ok = slot && fits(r, dev, partner, bytes, own_limit, limit);
    if (slot && !ok) {
        vc_region_reap(r);
        ok = fits(r, dev, partner, bytes, own_limit, limit);
    }
    if (ok)
        slot->used[dev] += bytes;
    else
        vc_log(VC_LOG_INFO, "refused %llu bytes on %s: %llu of %llu in use there, %llu of %llu "
               "in all", (unsigned long long)bytes, r->uuid[dev],
               (unsigned long long)vc_region_used(r, dev), (unsigned long long)own_limit,
               (unsigned long long)(vc_region_used(r, dev)
                                    + (partner >= 0 ? vc_region_used(r, partner) : 0)),
               (unsigned long long)limit);
    vc_region_unlock(&r->lock, cancel);
    return ok;
}

void vc_account_add(int dev, int64_t delta)
{
    struct vc_region *r = vc_region();
    int cancel;
    if (dev < 0 || delta == 0 || !vc_region_lock(r, &r->lock, &cancel))
        return;
    struct vc_slot *slot = own_slot(r);
    if (slot) {
        uint64_t held = slot->used[dev];
        slot->used[dev] = delta < 0 && (uint64_t)-delta > held ? 0 : held + (uint64_t)delta;
    }
    vc_region_unlock(&r->lock, cancel);
}

uint64_t vc_account_used(int dev)
{
    struct vc_region *r = vc_region();
    int cancel;
    if (dev < 0 || !vc_region_lock(r, &r->lock, &cancel))
        return 0;
    vc_region_reap_stale(r);
    uint64_t used = vc_region_used(r, dev);
    vc_region_unlock(&r->lock, cancel);
    return used;
}

unsigned vc_account_processes(int dev, struct vc_account_process *out, unsigned max)
{
    struct vc_region *r = vc_region();
    int cancel;
    if (dev < 0 || !vc_region_lock(r, &r->lock, &cancel))
        return 0;
    vc_region_reap_stale(r);
    unsigned n = 0;
    for (uint32_t i = 0; i < r->slot_bound && i < VC_REGION_SLOTS; i++) {
        const struct vc_slot *s = &r->slots[i];
        if (s->pid != 0 && s->used[dev] != 0 && n++ < max)
            out[n - 1] = (struct vc_account_process){s->pid, s->used[dev]};
    }
    vc_region_unlock(&r->lock, cancel);
    return n;
}

void vc_account_forked(void) { own = NULL; }

/* At exit the driver frees this process's memory: free its slot at once rather
 * than when someone notices the process is gone. Another thread may hold the
 * lock while exit runs, so only wait a moment for it. */
__attribute__((destructor)) static void leave(void)
{
    struct vc_region *r = vc_region();
    int cancel;
    if (!own || !vc_region_lock_within(r, &r->lock, &cancel, 100))
        return;
    if (own && own->pid == getpid())
        vc_region_free_slot(own);
    own = NULL;
    vc_region_unlock(&r->lock, cancel);
}
