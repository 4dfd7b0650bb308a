/* An open-addressing hash table of charged allocations, keyed by kind and handle. */
#define _GNU_SOURCE
#include "track.h"

#include <stdlib.h>

#include "account.h"
#include "log.h"
#include "setup.h"

struct entry {
    uint64_t key;
    enum vc_kind kind;        /* 0: empty */
    struct vc_charge charge;
};

static struct entry *table;
static size_t capacity, count;

static size_t home(enum vc_kind kind, uint64_t key)
{
    uint64_t h = (key ^ ((uint64_t)kind << 60)) * 0x9e3779b97f4a7c15ULL;
    return (size_t)(h ^ (h >> 29)) & (capacity - 1);
}

static struct entry *find(enum vc_kind kind, uint64_t key)
{
    for (size_t i = home(kind, key);; i = (i + 1) & (capacity - 1)) {
        struct entry *e = &table[i];
        if (!e->kind || (e->kind == kind && e->key == key))
            return e;
    }
}

static bool grow(void)
{
    size_t old_capacity = capacity;
    struct entry *old = table;
    struct entry *bigger = calloc(capacity ? capacity * 2 : 256, sizeof *bigger);
    if (!bigger)
        return false;
    table = bigger;
    capacity = capacity ? capacity * 2 : 256;
    for (size_t i = 0; i < old_capacity; i++)
        if (old[i].kind)
            *find(old[i].kind, old[i].key) = old[i];
    free(old);
    return true;
}

/* Removes e, shifting later entries of its probe run back so none is lost. */
static void remove_entry(struct entry *e)
{
    size_t hole = (size_t)(e - table);
    for (size_t i = (hole + 1) & (capacity - 1); table[i].kind; i = (i + 1) & (capacity - 1)) {
        size_t want = home(table[i].kind, table[i].key);
        /* Move entry i into the hole unless its home lies cyclically in (hole, i]. */
        if (((i - want) & (capacity - 1)) >= ((i - hole) & (capacity - 1))) {
            table[hole] = table[i];
            hole = i;
        }
    }
    table[hole].kind = 0;
    count--;
}

void vc_track_add(enum vc_kind kind, uint64_t key, struct vc_charge charge)
{
    pthread_mutex_lock(&vc_local_lock);
    if ((count + 1) * 2 > capacity && !grow() && count + 1 >= capacity) {
        pthread_mutex_unlock(&vc_local_lock);
        /* The charge stays on the account: counting too much is the safe side. */
        vc_log(VC_LOG_ERROR, "out of host memory to track an allocation");
        return;
    }
    struct entry *e = find(kind, key);
    if (!e->kind)
        count++;
    *e = (struct entry){key, kind, charge};
    pthread_mutex_unlock(&vc_local_lock);
}

bool vc_track_take(enum vc_kind kind, uint64_t key, struct vc_charge *charge)
{
    bool found = false;
    pthread_mutex_lock(&vc_local_lock);
    if (capacity) {
        struct entry *e = find(kind, key);
        if (e->kind) {
            *charge = e->charge;
            remove_entry(e);
            found = true;
        }
    }
    pthread_mutex_unlock(&vc_local_lock);
    return found;
}

bool vc_track_adjust(enum vc_kind kind, uint64_t key, int64_t bytes, int holds,
                     struct vc_charge *now)
{
    bool found = false;
    pthread_mutex_lock(&vc_local_lock);
    struct entry *e = capacity ? find(kind, key) : NULL;
    if (e && e->kind) {
        e->charge.bytes += (uint64_t)bytes;
        e->charge.holds += (unsigned)holds;
        *now = e->charge;
        if (holds && !e->charge.holds)
            remove_entry(e);
        found = true;
    }
    pthread_mutex_unlock(&vc_local_lock);
    return found;
}

void vc_track_drop_context(CUcontext context)
{
    pthread_mutex_lock(&vc_local_lock);
    for (size_t i = 0; i < capacity;) {
        struct entry *e = &table[i];
        if (e->kind && e->charge.context == context) {
            vc_account_add(vc_charge_entry(&e->charge), -(int64_t)e->charge.bytes);
            remove_entry(e);   /* may shift a later entry into i: look at i again */
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&vc_local_lock);
}

void vc_track_forked(void)
{
    free(table);
    table = NULL;
    capacity = count = 0;
}
