/*
 * fake_cuda.c: a stand-in for the CUDA driver (libcuda.so.1) on machines
 * without a GPU, for memprobe's interposer tests. It exports, with the real
 * ABI (cuda.h), the calls that obtain and release memory in every way the
 * interposer counts, the context and device calls around them, and
 * cuGetProcAddress(_v2) with the driver's versioned-name rules. It keeps
 * the truth the tests compare against: bytes taken per device and pinned
 * host bytes (fake_cuda_used, fake_cuda_host_pinned).
 *
 * Environment (read at cuInit):
 *   FAKE_CUDA_DEVICES   number of devices (default 2, at most 64)
 *   FAKE_CUDA_MEMORY    bytes per device (default 16 GiB); an allocation
 *                       beyond it fails with CUDA_ERROR_OUT_OF_MEMORY
 *
 * -DFAKE_CUDA_LEGACY builds an old driver: no VMM, no pools, no
 * cuGetProcAddress, no mipmapped arrays, no per-thread-stream variants.
 *
 * Build (-Bsymbolic: calls between its own functions stay inside, as in
 * the real driver, instead of reaching an interposer):
 *   cc -shared -fPIC -Wall -Wextra -Werror -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic \
 *      -o libcuda.so.1 fake_cuda.c -lpthread
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef unsigned long long cuuint64_t;
typedef struct fake_ctx *CUcontext;
typedef struct fake_pool *CUmemoryPool;
typedef struct fake_array *CUarray;
typedef struct fake_array *CUmipmappedArray;
typedef void *CUstream;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801
};

typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1, HOST = 2 */
    int id;
} CUmemLocation;

typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef struct {
    size_t Width;
    size_t Height;
    unsigned Format;
    unsigned NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    unsigned Format;
    unsigned NumChannels;
    unsigned Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    char reserved[64];
} CUipcMemHandle;

#define MAX_DEVICES 64
#define POOL_CHUNK (2ULL << 20)

struct fake_ctx {
    int dev;
};

struct fake_pool {
    int dev;
    pthread_mutex_t m;
    unsigned long long reserved, used, threshold;
    struct fake_pool *next_live;
};

struct fake_array {
    int dev;
};

static int initialized;
static int n_devices = 2;
static unsigned long long memory_per_device = 16ULL << 30;
static unsigned long long dev_used[MAX_DEVICES];
static unsigned long long host_pinned;
static struct fake_ctx primary[MAX_DEVICES];
static struct fake_pool default_pool[MAX_DEVICES];
static struct fake_pool *current_pool[MAX_DEVICES];
static __thread CUcontext current;
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
#ifndef FAKE_CUDA_LEGACY
static struct fake_pool *user_pools;
#endif

/* ---- the registry of live objects (validates every free) ---- */

enum kind { K_DEV = 1, K_HOST = 2, K_HOSTREG = 4, K_ARRAY = 8, K_MIPMAP = 16, K_VMM = 32,
            K_VMM_IMPORTED = 64, K_IPC = 128, K_ASYNC = 256 };

struct obj {
    uintptr_t key;
    unsigned long long size;
    int dev;
    int kind;
    struct fake_pool *pool;
    struct obj *next;
};

#define STRIPES 64
#define BUCKETS 1024
static struct stripe {
    pthread_mutex_t m;
    struct obj *b[BUCKETS];
} reg[STRIPES];
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

static void reg_init(void) {
    int i;
    for (i = 0; i < STRIPES; i++) {
        pthread_mutex_init(&reg[i].m, NULL);
    }
}

static unsigned long long mix(uintptr_t k) {
    unsigned long long h = (unsigned long long)k;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ULL;
    return h >> 20;
}

static int reg_add(uintptr_t key, unsigned long long size, int dev, int kind, struct fake_pool *pool) {
    unsigned long long h = mix(key);
    struct stripe *s = &reg[h % STRIPES];
    struct obj *o = malloc(sizeof *o);
    if (!o) {
        return -1;
    }
    o->key = key;
    o->size = size;
    o->dev = dev;
    o->kind = kind;
    o->pool = pool;
    pthread_mutex_lock(&s->m);
    o->next = s->b[(h / STRIPES) % BUCKETS];
    s->b[(h / STRIPES) % BUCKETS] = o;
    pthread_mutex_unlock(&s->m);
    return 0;
}

/* Removes `key` if it is of one of `kinds`; copies it to *out. */
static int reg_take(uintptr_t key, int kinds, struct obj *out) {
    unsigned long long h = mix(key);
    struct stripe *s = &reg[h % STRIPES];
    struct obj **pp, *o;
    pthread_mutex_lock(&s->m);
    for (pp = &s->b[(h / STRIPES) % BUCKETS]; (o = *pp); pp = &o->next) {
        if (o->key == key && (o->kind & kinds)) {
            *pp = o->next;
            pthread_mutex_unlock(&s->m);
            *out = *o;
            free(o);
            return 1;
        }
    }
    pthread_mutex_unlock(&s->m);
    return 0;
}

static int reg_find(uintptr_t key, int kinds, struct obj *out) {
    unsigned long long h = mix(key);
    struct stripe *s = &reg[h % STRIPES];
    struct obj *o;
    pthread_mutex_lock(&s->m);
    for (o = s->b[(h / STRIPES) % BUCKETS]; o; o = o->next) {
        if (o->key == key && (o->kind & kinds)) {
            *out = *o;
            pthread_mutex_unlock(&s->m);
            return 1;
        }
    }
    pthread_mutex_unlock(&s->m);
    return 0;
}

/* ---- device memory ---- */

static int take_device(int dev, unsigned long long size) {
    unsigned long long used = __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED);
    do {
        if (size > memory_per_device || used > memory_per_device - size) {
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&dev_used[dev], &used, used + size, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return 1;
}

static void give_device(int dev, unsigned long long size) {
    __atomic_fetch_sub(&dev_used[dev], size, __ATOMIC_RELAXED);
}

/* A unique address for an object of the fake (never dereferenced). */
static uintptr_t new_address(void) {
    return (uintptr_t)malloc(1);
}

static CUresult ctx_device(int *dev) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!current) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    *dev = current->dev;
    return CUDA_SUCCESS;
}

/* Allocates `size` bytes of `kind` on the current device, at a new address. */
static CUresult alloc_on_device(uintptr_t *out, unsigned long long size, int kind) {
    int dev;
    uintptr_t a;
    CUresult rc = ctx_device(&dev);
    if (rc) {
        return rc;
    }
    if (!out || size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!take_device(dev, size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a = new_address();
    if (!a || reg_add(a, size, dev, kind, NULL)) {
        give_device(dev, size);
        free((void *)a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = a;
    return CUDA_SUCCESS;
}

static CUresult free_object(uintptr_t key, int kinds) {
    struct obj o;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!reg_take(key, kinds, &o)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (o.kind & (K_DEV | K_ARRAY | K_MIPMAP | K_VMM)) {
        give_device(o.dev, o.size);
    } else if (o.kind & K_HOST) {
        __atomic_fetch_sub(&host_pinned, o.size, __ATOMIC_RELAXED);
        free((void *)key);
        return CUDA_SUCCESS;
    } else if (o.kind & K_HOSTREG) {
        __atomic_fetch_sub(&host_pinned, o.size, __ATOMIC_RELAXED);
        return CUDA_SUCCESS;
    }
    free((void *)key);
    return CUDA_SUCCESS;
}

/* ---- test hooks (not CUDA) ---- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemFree_v2(CUdeviceptr dptr);

EXPORT unsigned long long fake_cuda_used(int dev) {
    return dev >= 0 && dev < MAX_DEVICES ? __atomic_load_n(&dev_used[dev], __ATOMIC_RELAXED) : 0;
}

EXPORT unsigned long long fake_cuda_host_pinned(void) {
    return __atomic_load_n(&host_pinned, __ATOMIC_RELAXED);
}

/* The fake's own cuMemAlloc_v2 / cuMemFree_v2, past any interposer (a
 * benchmark's baseline). */
EXPORT void *fake_cuda_function(const char *name) {
    if (name && strcmp(name, "cuMemAlloc_v2") == 0) {
        return (void *)cuMemAlloc_v2;
    }
    if (name && strcmp(name, "cuMemFree_v2") == 0) {
        return (void *)cuMemFree_v2;
    }
    return NULL;
}

/* ---- initialization, devices, contexts ---- */

EXPORT CUresult cuInit(unsigned flags) {
    const char *e;
    int i;
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_once(&reg_once, reg_init);
    if (__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) {
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&pools_lock);
    if (!initialized) {
        if ((e = getenv("FAKE_CUDA_DEVICES")) && *e) {
            n_devices = atoi(e);
            if (n_devices < 0 || n_devices > MAX_DEVICES) {
                n_devices = 0;
            }
        }
        if ((e = getenv("FAKE_CUDA_MEMORY")) && *e) {
            memory_per_device = strtoull(e, NULL, 0);
        }
        for (i = 0; i < MAX_DEVICES; i++) {
            primary[i].dev = i;
            default_pool[i].dev = i;
            pthread_mutex_init(&default_pool[i].m, NULL);
            current_pool[i] = &default_pool[i];
        }
        __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&pools_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *v = 12040;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!n) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *n = n_devices;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!d) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (ordinal < 0 || ordinal >= n_devices) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!bytes || d < 0 || d >= n_devices) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *bytes = memory_per_device;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice d) {
    (void)flags;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!ctx) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (d < 0 || d >= n_devices) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *ctx = malloc(sizeof **ctx);
    if (!*ctx) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*ctx)->dev = d;
    current = *ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if (!ctx) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (current == ctx) {
        current = NULL;
    }
    if (ctx < &primary[0] || ctx >= &primary[MAX_DEVICES]) {
        free(ctx);
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!ctx) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (d < 0 || d >= n_devices) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *ctx = &primary[d];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    return d >= 0 && d < n_devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!ctx) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *ctx = current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (!d) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return ctx_device(d);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    int dev;
    CUresult rc = ctx_device(&dev);
    if (rc) {
        return rc;
    }
    if (!free_bytes || !total) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *total = memory_per_device;
    *free_bytes = memory_per_device - fake_cuda_used(dev);
    return CUDA_SUCCESS;
}

/* ---- plain, pitched, managed ---- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    uintptr_t a = 0;
    CUresult rc = alloc_on_device(dptr ? &a : NULL, size, K_DEV);
    if (rc == CUDA_SUCCESS) {
        *dptr = a;
    }
    return rc;
}

/* The 32-bit entry point of before CUDA 3.2: not supported here, and never
 * to be wrapped with the 64-bit signature. */
EXPORT CUresult cuMemAlloc(unsigned *dptr, unsigned size) {
    (void)dptr;
    (void)size;
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned elem) {
    uintptr_t a = 0;
    size_t p;
    CUresult rc;
    if (!pitch || (elem != 4 && elem != 8 && elem != 16)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    p = (width + 511) / 512 * 512;
    rc = alloc_on_device(dptr ? &a : NULL, (unsigned long long)p * height, K_DEV);
    if (rc == CUDA_SUCCESS) {
        *dptr = a;
        *pitch = p;
    }
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags) {
    uintptr_t a = 0;
    CUresult rc;
    if (flags != 1 && flags != 2) { /* CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST */
        return CUDA_ERROR_INVALID_VALUE;
    }
    rc = alloc_on_device(dptr ? &a : NULL, size, K_DEV);
    if (rc == CUDA_SUCCESS) {
        *dptr = a;
    }
    return rc;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    return free_object((uintptr_t)dptr, K_DEV);
}

/* The rest of the driver, one file per family of calls. */
#include "fake_cuda/arrays.c.inc"
#include "fake_cuda/host.c.inc"
#include "fake_cuda/vmm.c.inc"
#include "fake_cuda/pools.c.inc"
#include "fake_cuda/proc_address.c.inc"
