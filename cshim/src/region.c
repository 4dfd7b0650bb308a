/* Creates, maps, locks and sweeps the shared account file. */
#define _GNU_SOURCE
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "proc.h"

_Static_assert(offsetof(struct vc_region, last_reap_ns) == 32, "layout");
_Static_assert(offsetof(struct vc_region, uuid) == 64, "layout");
_Static_assert(offsetof(struct vc_region, bucket) == 1728, "layout");
_Static_assert(offsetof(struct vc_region, gpu_ns) == 1856, "layout");
_Static_assert(offsetof(struct vc_region, slots) == VC_REGION_HEADER_SIZE, "layout");
_Static_assert(sizeof(struct vc_slot) == 144, "layout");
_Static_assert(sizeof(pthread_mutex_t) <= sizeof(union vc_region_lock), "layout");

/* Slots in use lie below this index (clamped: the file is writable by the container). */
static uint32_t bound(const struct vc_region *r)
{
    uint32_t b = __atomic_load_n(&r->slot_bound, __ATOMIC_ACQUIRE);
    return b < VC_REGION_SLOTS ? b : VC_REGION_SLOTS;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool init_lock(union vc_region_lock *lock)
{
    pthread_mutexattr_t attr;
    bool ok = pthread_mutexattr_init(&attr) == 0
              && pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) == 0
              && pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) == 0
              && pthread_mutex_init(&lock->mutex, &attr) == 0;
    pthread_mutexattr_destroy(&attr);
    return ok;
}

static bool init_region(struct vc_region *r)
{
    r->version = VC_REGION_VERSION;
    r->header_size = VC_REGION_HEADER_SIZE;
    r->max_devices = VC_MAX_DEVICES;
    r->max_slots = VC_REGION_SLOTS;
    r->slot_size = sizeof(struct vc_slot);
    r->uuid_size = VC_REGION_UUID_SIZE;
    if (!init_lock(&r->lock) || !init_lock(&r->context_lock))
        return false;
    /* The magic goes last: a region with it is complete. */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(r->magic, VC_REGION_MAGIC, sizeof r->magic);
    return true;
}

static const char *check_region(const struct vc_region *r)
{
    if (memcmp(r->magic, VC_REGION_MAGIC, sizeof r->magic) != 0)
        return "not a vcuda account file";
    if (r->version != VC_REGION_VERSION || r->header_size != VC_REGION_HEADER_SIZE
        || r->max_devices != VC_MAX_DEVICES || r->max_slots != VC_REGION_SLOTS
        || r->slot_size != sizeof(struct vc_slot) || r->uuid_size != VC_REGION_UUID_SIZE)
        return "account file of another layout version";
    return NULL;
}

static struct vc_region *open_private(char *err, size_t errlen)
{
    void *m = mmap(NULL, sizeof(struct vc_region), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map a private account: %s", strerror(errno));
        return NULL;
    }
    if (!init_region(m)) {
        snprintf(err, errlen, "cannot set up the account lock");
        munmap(m, sizeof(struct vc_region));
        return NULL;
    }
    return m;
}

/* Maps the file behind fd, which the caller holds under flock. */
static struct vc_region *map_file(int fd, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s is not a regular file", path);
        return NULL;
    }
    bool fresh = st.st_size == 0;
    if (fresh && ftruncate(fd, sizeof(struct vc_region)) != 0) {
        snprintf(err, errlen, "cannot size %s: %s", path, strerror(errno));
        return NULL;
    }
    if (!fresh && (size_t)st.st_size < sizeof(struct vc_region)) {
        snprintf(err, errlen, "%s: not a vcuda account file (too small)", path);
        return NULL;
    }
    struct vc_region *r =
        mmap(NULL, sizeof(struct vc_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
        return NULL;
    }
    const char *bad = fresh ? (init_region(r) ? NULL : "cannot set up the account lock")
                            : check_region(r);
    if (bad) {
        snprintf(err, errlen, "%s: %s", path, bad);
        munmap(r, sizeof(struct vc_region));
        return NULL;
    }
    return r;
}

struct vc_region *vc_region_open(const char *path, char *err, size_t errlen)
{
    if (!*path)
        return open_private(err, errlen);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) {
        /* Readable and writable by all: the container's processes may run as
         * several users. Its directory decides who else can reach it. */
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd >= 0)
            fchmod(fd, 0666);
        else if (errno == EEXIST)
            fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0) {
        snprintf(err, errlen, "cannot open account %s: %s", path, strerror(errno));
        return NULL;
    }
    /* flock only while creating: two first processes must not both initialize. */
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
        ;
    struct vc_region *r = map_file(fd, path, err, errlen);
    /* Explicitly: the mapping keeps the open file, and with it the lock, alive. */
    flock(fd, LOCK_UN);
    close(fd);
    return r;
}

bool vc_region_lock(struct vc_region *r, union vc_region_lock *lock, int *cancel_state)
{
    return vc_region_lock_within(r, lock, cancel_state, -1);
}

bool vc_region_lock_within(struct vc_region *r, union vc_region_lock *lock, int *cancel_state,
                           int ms)
{
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, cancel_state);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_nsec += (long)(ms % 1000) * 1000000;
    deadline.tv_sec += ms / 1000 + deadline.tv_nsec / 1000000000;
    deadline.tv_nsec %= 1000000000;
    int rc = ms < 0 ? pthread_mutex_lock(&lock->mutex)
                    : pthread_mutex_timedlock(&lock->mutex, &deadline);
    if (rc == EOWNERDEAD) {
        /* The holder died inside: every store it made is whole, so sweeping
         * its slot (now dead) is all the repair needed. */
        rc = pthread_mutex_consistent(&lock->mutex);
        vc_log(VC_LOG_INFO, "a process died holding the account lock; its slot is freed");
        if (rc == 0 && lock == &r->lock)
            vc_region_reap(r);
    }
    if (rc != 0 && rc != ETIMEDOUT)
        vc_log(VC_LOG_ERROR, "account lock unusable: %s", strerror(rc));
    if (rc != 0) {
        pthread_setcancelstate(*cancel_state, NULL);
        return false;
    }
    return true;
}

void vc_region_unlock(union vc_region_lock *lock, int cancel_state)
{
    pthread_mutex_unlock(&lock->mutex);
    pthread_setcancelstate(cancel_state, NULL);
}

int vc_region_device(struct vc_region *r, const char *uuid)
{
    uint32_t n = r->ndevices;
    for (uint32_t i = 0; i < n && i < VC_MAX_DEVICES; i++)
        if (strncmp(r->uuid[i], uuid, VC_REGION_UUID_SIZE) == 0)
            return (int)i;
    if (n >= VC_MAX_DEVICES)
        return -1;
    snprintf(r->uuid[n], VC_REGION_UUID_SIZE, "%s", uuid);
    __atomic_store_n(&r->ndevices, n + 1, __ATOMIC_RELEASE);
    return (int)n;
}

void vc_region_free_slot(struct vc_slot *s)
{
    memset(s->used, 0, sizeof s->used);
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
}

struct vc_slot *vc_region_claim(struct vc_region *r, int32_t pid, uint64_t start)
{
    struct vc_slot *slot = NULL;
    for (int pass = 0; pass < 2 && !slot; pass++) {
        if (pass == 1)
            vc_region_reap(r);
        for (uint32_t i = 0; i < VC_REGION_SLOTS; i++) {
            struct vc_slot *s = &r->slots[i];
            if (i >= bound(r)) {
                slot = slot ? slot : s;
                break;
            }
            /* A slot with this pid is stale: an earlier program this process
             * exec'd from, or a dead process whose pid was reused. */
            if (s->pid == pid) {
                slot = s;
                break;
            }
            if (!slot && s->pid == 0)
                slot = s;
        }
    }
    if (!slot)
        return NULL;
    memset(slot->used, 0, sizeof slot->used);
    slot->start_time = start;
    __atomic_store_n(&slot->pid, pid, __ATOMIC_RELEASE);
    uint32_t index = (uint32_t)(slot - r->slots);
    if (index >= r->slot_bound)
        __atomic_store_n(&r->slot_bound, index + 1, __ATOMIC_RELEASE);
    return slot;
}

uint64_t vc_region_used(const struct vc_region *r, int dev)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < bound(r); i++)
        if (r->slots[i].pid != 0)
            sum += r->slots[i].used[dev];
    return sum;
}

void vc_region_reap(struct vc_region *r)
{
    for (uint32_t i = 0; i < bound(r); i++) {
        struct vc_slot *s = &r->slots[i];
        if (s->pid != 0 && !vc_proc_alive(s->pid, s->start_time)) {
            vc_log(VC_LOG_INFO, "freed the account slot of process %d, which is gone", s->pid);
            vc_region_free_slot(s);
        }
    }
    r->last_reap_ns = now_ns();
}

void vc_region_reap_stale(struct vc_region *r)
{
    if (now_ns() - r->last_reap_ns >= 1000000000)
        vc_region_reap(r);
}
