/* The test double's device state shared across processes, with dead processes' memory freed. */
#define _GNU_SOURCE
#include "fake_state.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proc.h"
#include "uuid.h"

static struct fake_state *state;
static struct fake_proc *self;
static pid_t self_pid;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void init_devices(struct fake_state *s)
{
    const char *gpus = getenv("VCUDA_FAKE_GPUS");
    char *end;
    for (const char *p = gpus && *gpus ? gpus : "16384"; *p && s->ndevices < FAKE_MAX_DEVICES;
         p = *end ? end + 1 : end) {
        unsigned long long mib = strtoull(p, &end, 10);
        int dev = (int)s->ndevices++;
        s->total[dev] = mib << 20;
        for (int k = 0; k < 16; k++)
            s->uuid[dev][k] = (unsigned char)(0x10 * (dev + 1) + k);
    }
}

/* A fork while another thread holds the lock must not leave it held in the child. */
static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }
static pthread_once_t fork_safe = PTHREAD_ONCE_INIT;
static void register_fork_handlers(void) { pthread_atfork(before_fork, after_fork, after_fork); }

struct fake_state *fake_state(void)
{
    pthread_once(&fork_safe, register_fork_handlers);
    pthread_mutex_lock(&lock);
    if (!state) {
        const char *path = getenv("VCUDA_FAKE_STATE");
        int fd = path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
        if (fd < 0) {
            fprintf(stderr, "fake libcuda: set VCUDA_FAKE_STATE to a writable path\n");
        } else {
            flock(fd, LOCK_EX);
            struct stat st;
            if (fstat(fd, &st) == 0 && st.st_size == 0 && ftruncate(fd, sizeof *state) != 0)
                perror("fake libcuda: ftruncate");
            void *m = mmap(NULL, sizeof *state, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) {
                state = m;
                if (!state->ready) {
                    init_devices(state);
                    state->ready = 1;
                }
            }
            flock(fd, LOCK_UN);   /* the mapping would keep it held */
            close(fd);
        }
    }
    pthread_mutex_unlock(&lock);
    return state;
}

struct fake_proc *fake_self(void)
{
    struct fake_state *s = fake_state();
    pid_t pid = getpid();
    if (!s)
        return NULL;
    pthread_mutex_lock(&lock);
    if (self_pid != pid) {
        self = NULL;
        for (int i = 0; i < FAKE_MAX_PROCS && !self; i++) {
            struct fake_proc *p = &s->procs[i];
            int32_t seen = p->pid;
            if ((seen == 0 || seen == pid || !vc_proc_alive(seen, p->start))
                && __atomic_compare_exchange_n(&p->pid, &seen, pid, false, __ATOMIC_ACQ_REL,
                                               __ATOMIC_ACQUIRE)) {
                memset(p->used, 0, sizeof p->used);
                p->start = vc_proc_start_time(pid);
                self = p;
            }
        }
        self_pid = pid;
    }
    pthread_mutex_unlock(&lock);
    return self;
}

bool fake_proc_live(const struct fake_proc *p)
{
    /* The driver frees a process's memory when it ends. */
    return p->pid && (p->pid == getpid() || vc_proc_alive(p->pid, p->start));
}

uint64_t fake_used(int dev)
{
    struct fake_state *s = fake_state();
    uint64_t sum = 0;
    for (int i = 0; s && i < FAKE_MAX_PROCS; i++)
        if (fake_proc_live(&s->procs[i]))
            sum += s->procs[i].used[dev];
    return sum;
}

void fake_uuid_string(int dev, char *out, unsigned len)
{
    vc_uuid_format(fake_state()->uuid[dev], out, len);
}
