/*
 * fake_cudart.c: a scriptable stand-in for libcudart.so, for tests on
 * machines without a GPU. It exports the CUDA runtime calls memprobe uses,
 * with the real ABI, and answers from a small script (see README.md here).
 *
 * Build: cc -shared -fPIC -Wall -Wextra -Werror -o libcudart.so fake_cudart.c
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int cudaError_t;

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorUnknown = 999
};

#define MAX_DEVICES 32
#define MAX_STEPS 256

struct fake_device {
    unsigned long long total;
    unsigned long long free[MAX_STEPS];
    int n_free;
    int free_pos;
    int context; /* a context exists on this device */
    char pci_bus_id[32];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded;
static int n_devices = 1;
static cudaError_t init_error = cudaSuccess;
static unsigned long long context_bytes = 300ULL << 20;
static struct fake_device devices[MAX_DEVICES];
static int contexts_created;
static __thread int current_device;

static int parse_u64(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (errno || *end || end == s) ? -1 : 0;
}

static void set_defaults(void) {
    int i;
    for (i = 0; i < MAX_DEVICES; i++) {
        memset(&devices[i], 0, sizeof devices[i]);
        devices[i].total = 16ULL << 30;
        devices[i].free[0] = 15ULL << 30;
        devices[i].n_free = 1;
        snprintf(devices[i].pci_bus_id, sizeof devices[i].pci_bus_id, "00000000:%02X:00.0", 0x10 + i);
    }
}

static int script_line(char *line) {
    char *save = NULL;
    char *key = strtok_r(line, " \t\n", &save);
    char *tok;
    unsigned long long v;
    if (!key || key[0] == '#') {
        return 0;
    }
    if (strcmp(key, "devices") == 0 || strcmp(key, "error") == 0 || strcmp(key, "context") == 0) {
        if (!(tok = strtok_r(NULL, " \t\n", &save)) || parse_u64(tok, &v)) {
            return -1;
        }
        if (key[0] == 'd') {
            if (v > MAX_DEVICES) {
                return -1;
            }
            n_devices = (int)v;
        } else if (key[0] == 'e') {
            init_error = (cudaError_t)v;
        } else {
            context_bytes = v;
        }
        return 0;
    }
    if (strcmp(key, "device") == 0) {
        struct fake_device *d;
        if (!(tok = strtok_r(NULL, " \t\n", &save)) || parse_u64(tok, &v) || v >= MAX_DEVICES) {
            return -1;
        }
        d = &devices[v];
        if ((int)v >= n_devices) {
            n_devices = (int)v + 1;
        }
        if (!(key = strtok_r(NULL, " \t\n", &save))) {
            return -1;
        }
        if (strcmp(key, "total") == 0) {
            return (tok = strtok_r(NULL, " \t\n", &save)) ? parse_u64(tok, &d->total) : -1;
        }
        if (strcmp(key, "free") == 0) {
            d->n_free = 0;
            d->free_pos = 0;
            while ((tok = strtok_r(NULL, " \t\n", &save))) {
                if (d->n_free == MAX_STEPS || parse_u64(tok, &d->free[d->n_free++])) {
                    return -1;
                }
            }
            return d->n_free ? 0 : -1;
        }
        if (strcmp(key, "pci") == 0) {
            if (!(tok = strtok_r(NULL, " \t\n", &save))) {
                return -1;
            }
            snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "%s", tok);
            return 0;
        }
    }
    return -1;
}

/* The script: $FAKE_CUDART_SCRIPT, else fake_cudart.script next to this library. */
static cudaError_t ensure_loaded(void) {
    char path[4096];
    char line[4096];
    const char *env;
    FILE *f;
    int lineno = 0;
    cudaError_t rc;

    pthread_mutex_lock(&lock);
    if (loaded) {
        rc = loaded > 0 ? init_error : cudaErrorUnknown;
        pthread_mutex_unlock(&lock);
        return rc;
    }
    set_defaults();
    loaded = 1;
    env = getenv("FAKE_CUDART_SCRIPT");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        Dl_info info;
        const char *slash;
        path[0] = 0;
        if (dladdr((void *)&lock, &info) && info.dli_fname && (slash = strrchr(info.dli_fname, '/'))) {
            snprintf(path, sizeof path, "%.*s/fake_cudart.script", (int)(slash - info.dli_fname), info.dli_fname);
        }
    }
    f = path[0] ? fopen(path, "r") : NULL;
    if (f) {
        while (fgets(line, sizeof line, f)) {
            char copy[4096];
            lineno++;
            snprintf(copy, sizeof copy, "%s", line);
            if (script_line(line)) {
                fprintf(stderr, "fake_cudart: %s:%d: cannot parse: %s", path, lineno, copy);
                loaded = -1;
                break;
            }
        }
        fclose(f);
    }
    rc = loaded > 0 ? init_error : cudaErrorUnknown;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
    cudaError_t rc = ensure_loaded();
    if (rc != cudaSuccess) {
        return rc;
    }
    if (!count) {
        return cudaErrorInvalidValue;
    }
    if (n_devices == 0) {
        return cudaErrorNoDevice;
    }
    *count = n_devices;
    return cudaSuccess;
}

EXPORT cudaError_t cudaSetDevice(int device) {
    cudaError_t rc = ensure_loaded();
    if (rc != cudaSuccess) {
        return rc;
    }
    if (n_devices == 0) {
        return cudaErrorNoDevice;
    }
    if (device < 0 || device >= n_devices) {
        return cudaErrorInvalidDevice;
    }
    current_device = device;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int *device) {
    cudaError_t rc = ensure_loaded();
    if (rc != cudaSuccess) {
        return rc;
    }
    if (!device) {
        return cudaErrorInvalidValue;
    }
    if (n_devices == 0) {
        return cudaErrorNoDevice;
    }
    *device = current_device;
    return cudaSuccess;
}

/* Creates the primary context of the current device if there is none; lock held. */
static struct fake_device *context_locked(void) {
    struct fake_device *d = &devices[current_device];
    if (!d->context) {
        d->context = 1;
        contexts_created++;
    }
    return d;
}

EXPORT cudaError_t cudaFree(void *ptr) {
    cudaError_t rc = ensure_loaded();
    if (rc != cudaSuccess) {
        return rc;
    }
    if (n_devices == 0) {
        return cudaErrorNoDevice;
    }
    pthread_mutex_lock(&lock);
    context_locked();
    pthread_mutex_unlock(&lock);
    return ptr ? cudaErrorInvalidValue : cudaSuccess;
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    struct fake_device *d;
    unsigned long long free_now;
    cudaError_t rc = ensure_loaded();
    if (rc != cudaSuccess) {
        return rc;
    }
    if (n_devices == 0) {
        return cudaErrorNoDevice;
    }
    if (!free_bytes || !total_bytes) {
        return cudaErrorInvalidValue;
    }
    pthread_mutex_lock(&lock);
    d = context_locked();
    free_now = d->free[d->free_pos];
    if (d->free_pos + 1 < d->n_free) {
        d->free_pos++;
    }
    /* The context itself takes memory, as a real one does. */
    free_now = free_now > context_bytes ? free_now - context_bytes : 0;
    *free_bytes = (size_t)free_now;
    *total_bytes = (size_t)d->total;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceGetPCIBusId(char *pci_bus_id, int len, int device) {
    cudaError_t rc = ensure_loaded();
    if (rc != cudaSuccess) {
        return rc;
    }
    if (device < 0 || device >= n_devices) {
        return cudaErrorInvalidDevice;
    }
    if (!pci_bus_id || len <= 0) {
        return cudaErrorInvalidValue;
    }
    snprintf(pci_bus_id, (size_t)len, "%s", devices[device].pci_bus_id);
    return cudaSuccess;
}

EXPORT cudaError_t cudaRuntimeGetVersion(int *version) {
    if (!version) {
        return cudaErrorInvalidValue;
    }
    *version = 12040;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDriverGetVersion(int *version) {
    if (!version) {
        return cudaErrorInvalidValue;
    }
    *version = init_error == cudaErrorInsufficientDriver ? 0 : 12040;
    return cudaSuccess;
}

EXPORT const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
        return "cudaErrorInitializationError";
    case cudaErrorInsufficientDriver:
        return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    default:
        return "cudaErrorUnknown";
    }
}

EXPORT const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    default:
        return cudaGetErrorName(error);
    }
}

/* Test hook (not CUDA): how many primary contexts were created. */
EXPORT int fake_cudart_contexts(void) {
    int n;
    pthread_mutex_lock(&lock);
    n = contexts_created;
    pthread_mutex_unlock(&lock);
    return n;
}
