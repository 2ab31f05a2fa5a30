/* NVML polled from native threads, for scripts/gpu-validate-torch.py.
 *
 * A Python poller thread needs the GIL between reads, and a training
 * thread that busy-waits in Python holds it (the switch interval is 5 ms),
 * so a Python poller misses the very spikes it is asked to catch. These
 * pollers never touch Python: each is a pthread that reads NVML's used
 * bytes of one device every interval and keeps the highest reading since
 * the last take. hold_ns() busy-waits in C: called through ctypes, it runs
 * with the GIL released, as a CUDA kernel or a blocking sync would.
 *
 * Built by the script: cc -shared -fPIC -O2 -o poll.so gpu-validate-nvml-poll.c -ldl -lpthread
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    unsigned long long total, free, used;
} nvml_memory; /* nvmlMemory_t (v1) */

typedef int (*init_fn)(void);
typedef int (*handle_fn)(unsigned, void **);
typedef int (*memory_fn)(void *, nvml_memory *);

struct poller {
    memory_fn memory;
    void *device;
    long long interval_ns;
    atomic_ullong high;
    atomic_llong polls, errors;
    atomic_int stop;
    pthread_t thread;
};

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void *run(void *arg) {
    struct poller *p = arg;
    long long next = now_ns();
    while (!atomic_load(&p->stop)) {
        nvml_memory m;
        if (p->memory(p->device, &m) == 0) {
            unsigned long long h = atomic_load(&p->high);
            while (m.used > h && !atomic_compare_exchange_weak(&p->high, &h, m.used)) {
            }
            atomic_fetch_add(&p->polls, 1);
        } else {
            atomic_fetch_add(&p->errors, 1);
        }
        next += p->interval_ns;
        long long wait = next - now_ns();
        if (wait > 0) {
            struct timespec t = {wait / 1000000000LL, wait % 1000000000LL};
            nanosleep(&t, NULL);
        } else {
            next = now_ns();
        }
    }
    return NULL;
}

/* A poller of NVML device `index` (NVML's numbering) from library `lib`,
 * or NULL (*why: 1 no library, 2 init failed, 3 no such device, 4 no thread). */
void *poller_start(const char *lib, unsigned index, long long interval_ns, int *why) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    init_fn init = h ? (init_fn)dlsym(h, "nvmlInit_v2") : NULL;
    handle_fn by_index = h ? (handle_fn)dlsym(h, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    memory_fn memory = h ? (memory_fn)dlsym(h, "nvmlDeviceGetMemoryInfo") : NULL;
    if (!init || !by_index || !memory) {
        *why = 1;
        return NULL;
    }
    if (init() != 0) {
        *why = 2;
        return NULL;
    }
    void *device = NULL;
    if (by_index(index, &device) != 0) {
        *why = 3;
        return NULL;
    }
    struct poller *p = calloc(1, sizeof *p);
    if (!p) {
        *why = 4;
        return NULL;
    }
    p->memory = memory;
    p->device = device;
    p->interval_ns = interval_ns;
    if (pthread_create(&p->thread, NULL, run, p) != 0) {
        free(p);
        *why = 4;
        return NULL;
    }
    *why = 0;
    return p;
}

/* The highest used bytes read since the last take (0: no reading). */
unsigned long long poller_take(void *p) { return atomic_exchange(&((struct poller *)p)->high, 0); }

long long poller_polls(void *p) { return atomic_load(&((struct poller *)p)->polls); }

long long poller_errors(void *p) { return atomic_load(&((struct poller *)p)->errors); }

void poller_stop(void *p) {
    struct poller *q = p;
    atomic_store(&q->stop, 1);
    pthread_join(q->thread, NULL);
    free(q);
}

/* Busy-waits `ns` nanoseconds (the GIL released by ctypes meanwhile). */
void hold_ns(long long ns) {
    long long end = now_ns() + ns;
    while (now_ns() < end) {
    }
}
