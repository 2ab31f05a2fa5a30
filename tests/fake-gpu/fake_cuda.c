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

/* ---- arrays ---- */

static unsigned long long texel_bytes(unsigned format, unsigned channels) {
    unsigned long long b;
    switch (format) {
    case 0x01: case 0x08: b = 1; break;
    case 0x02: case 0x09: case 0x10: b = 2; break;
    case 0x03: case 0x0a: case 0x20: b = 4; break;
    default: return 0;
    }
    return channels == 1 || channels == 2 || channels == 4 ? b * channels : 0;
}

static unsigned long long shrink(size_t x, unsigned level) {
    unsigned long long v = (x ? x : 1) >> level;
    return v ? v : 1;
}

static CUresult create_array(CUarray *out, size_t w, size_t h, size_t d, unsigned format, unsigned ch,
                             unsigned flags, unsigned levels, int kind) {
    unsigned long long texel = texel_bytes(format, ch), total = 0;
    unsigned level;
    uintptr_t a = 0;
    CUresult rc;
    if (!out || !w || !texel || levels == 0 || levels > 32) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (level = 0; level < levels; level++) {
        unsigned long long depth = (flags & 1) ? (d ? d : 1) : shrink(d, level);
        total += shrink(w, level) * shrink(h, level) * depth * texel;
    }
    rc = alloc_on_device(&a, total, kind);
    if (rc == CUDA_SUCCESS) {
        *out = (CUarray)a;
    }
    return rc;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *out, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (!d) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return create_array(out, d->Width, d->Height, 0, d->Format, d->NumChannels, 0, 1, K_ARRAY);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (!d) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return create_array(out, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, 1, K_ARRAY);
}

EXPORT CUresult cuArrayDestroy(CUarray a) {
    return free_object((uintptr_t)a, K_ARRAY);
}

#ifndef FAKE_CUDA_LEGACY
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned levels) {
    if (!d) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return create_array(out, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags, levels,
                        K_MIPMAP);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    return free_object((uintptr_t)a, K_MIPMAP);
}
#endif

/* ---- pinned host memory ---- */

EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned flags) {
    void *p;
    (void)flags;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!pp || !size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (size > memory_per_device || !(p = malloc(size))) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (reg_add((uintptr_t)p, size, -1, K_HOST, NULL)) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    __atomic_fetch_add(&host_pinned, size, __ATOMIC_RELAXED);
    *pp = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size) {
    return cuMemHostAlloc(pp, size, 0);
}

EXPORT CUresult cuMemFreeHost(void *p) {
    return free_object((uintptr_t)p, K_HOST);
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
    struct obj o;
    (void)flags;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!p || !size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (reg_find((uintptr_t)p, K_HOST | K_HOSTREG, &o)) {
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    if (reg_add((uintptr_t)p, size, -1, K_HOSTREG, NULL)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    __atomic_fetch_add(&host_pinned, size, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostUnregister(void *p) {
    struct obj o;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!reg_take((uintptr_t)p, K_HOSTREG, &o)) {
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    __atomic_fetch_sub(&host_pinned, o.size, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

/* ---- IPC: a mapping of memory another process counts ---- */

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr dptr) {
    struct obj o;
    if (!h) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!reg_find((uintptr_t)dptr, K_DEV, &o)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &dptr, sizeof dptr);
    memcpy(h->reserved + 8, &o.size, sizeof o.size);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle h, unsigned flags) {
    unsigned long long size;
    int dev;
    uintptr_t a;
    CUresult rc = ctx_device(&dev);
    (void)flags;
    if (rc) {
        return rc;
    }
    if (!dptr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(&size, h.reserved + 8, sizeof size);
    a = new_address();
    if (!a || reg_add(a, size, dev, K_IPC, NULL)) {
        free((void *)a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    return free_object((uintptr_t)dptr, K_IPC);
}

#ifndef FAKE_CUDA_LEGACY
/* ---- virtual memory management ---- */

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    uintptr_t a;
    int dev;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!handle || !prop || !size || flags) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (prop->location.type == 2) { /* host */
        void *p = NULL;
        CUresult rc = cuMemHostAlloc(&p, size, 0);
        if (rc == CUDA_SUCCESS) {
            *handle = (uintptr_t)p;
        }
        return rc;
    }
    dev = prop->location.id;
    if (prop->location.type != 1 || dev < 0 || dev >= n_devices) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (!take_device(dev, size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a = new_address();
    if (!a || reg_add(a, size, dev, K_VMM, NULL)) {
        give_device(dev, size);
        free((void *)a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    return free_object((uintptr_t)handle, K_VMM | K_VMM_IMPORTED | K_HOST);
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
    (void)align;
    (void)addr;
    (void)flags;
    if (!ptr || !size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *ptr = (CUdeviceptr)new_address();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    (void)size;
    free((void *)(uintptr_t)ptr);
    return CUDA_SUCCESS;
}

/* Mapping takes no memory: the handle holds it. */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
    struct obj o;
    (void)ptr;
    (void)offset;
    if (flags || !reg_find((uintptr_t)handle, K_VMM | K_VMM_IMPORTED, &o) || size > o.size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    (void)ptr;
    (void)size;
    return CUDA_SUCCESS;
}

/* The shareable handle of the fake is the generic handle itself. */
EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                             unsigned long long flags) {
    struct obj o;
    (void)type;
    if (!shareable || flags || !reg_find((uintptr_t)handle, K_VMM, &o)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(shareable, &handle, sizeof handle);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle, int type) {
    struct obj o;
    uintptr_t a;
    (void)type;
    if (!handle || !reg_find((uintptr_t)os_handle, K_VMM, &o)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    a = new_address();
    if (!a || reg_add(a, o.size, o.dev, K_VMM_IMPORTED, NULL)) {
        free((void *)a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = a;
    return CUDA_SUCCESS;
}

/* ---- stream-ordered pools ---- */

static unsigned long long round_chunk(unsigned long long v) {
    return (v + POOL_CHUNK - 1) / POOL_CHUNK * POOL_CHUNK;
}

/* Gives memory back until the pool reserves max(used, keep), in chunks. */
static void pool_release_to(struct fake_pool *p, unsigned long long keep) {
    unsigned long long target = round_chunk(p->used > keep ? p->used : keep);
    if (target < p->reserved) {
        give_device(p->dev, p->reserved - target);
        p->reserved = target;
    }
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!pool || d < 0 || d >= n_devices) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pool = &default_pool[d];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!pool || d < 0 || d >= n_devices) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&pools_lock);
    *pool = current_pool[d];
    pthread_mutex_unlock(&pools_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!pool || d < 0 || d >= n_devices || pool->dev != d) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&pools_lock);
    current_pool[d] = pool;
    pthread_mutex_unlock(&pools_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    struct fake_pool *p;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!pool || !props || props->location.type != 1 || props->location.id < 0 ||
        props->location.id >= n_devices) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!(p = calloc(1, sizeof *p))) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->dev = props->location.id;
    pthread_mutex_init(&p->m, NULL);
    pthread_mutex_lock(&pools_lock);
    p->next_live = user_pools;
    user_pools = p;
    pthread_mutex_unlock(&pools_lock);
    *pool = p;
    return CUDA_SUCCESS;
}

static int pool_is_live(CUmemoryPool pool) {
    struct fake_pool *p;
    if (pool >= &default_pool[0] && pool < &default_pool[MAX_DEVICES]) {
        return 1;
    }
    for (p = user_pools; p; p = p->next_live) {
        if (p == pool) {
            return 1;
        }
    }
    return 0;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    struct fake_pool **pp;
    int d;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    pthread_mutex_lock(&pools_lock);
    for (pp = &user_pools; *pp && *pp != pool; pp = &(*pp)->next_live) {
    }
    if (!*pp) {
        pthread_mutex_unlock(&pools_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pp = pool->next_live;
    for (d = 0; d < MAX_DEVICES; d++) {
        if (current_pool[d] == pool) {
            current_pool[d] = &default_pool[d];
        }
    }
    pthread_mutex_unlock(&pools_lock);
    give_device(pool->dev, pool->reserved);
    pthread_mutex_destroy(&pool->m);
    free(pool);
    return CUDA_SUCCESS;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool p) {
    uintptr_t a;
    if (!dptr || !size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&p->m);
    if (p->reserved - p->used < size) {
        unsigned long long grow = round_chunk(size - (p->reserved - p->used));
        if (!take_device(p->dev, grow)) {
            pthread_mutex_unlock(&p->m);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        p->reserved += grow;
    }
    p->used += size;
    pthread_mutex_unlock(&p->m);
    a = new_address();
    if (!a || reg_add(a, size, p->dev, K_ASYNC, p)) {
        pthread_mutex_lock(&p->m);
        p->used -= size;
        pthread_mutex_unlock(&p->m);
        free((void *)a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    int dev;
    CUresult rc = ctx_device(&dev);
    CUmemoryPool pool;
    (void)s;
    if (rc) {
        return rc;
    }
    pthread_mutex_lock(&pools_lock);
    pool = current_pool[dev];
    pthread_mutex_unlock(&pools_lock);
    return pool_alloc(dptr, size, pool);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    CUresult rc;
    (void)s;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    pthread_mutex_lock(&pools_lock);
    rc = pool && pool_is_live(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&pools_lock);
    return rc ? rc : pool_alloc(dptr, size, pool);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    struct obj o;
    (void)s;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (reg_take((uintptr_t)dptr, K_ASYNC, &o)) {
        pthread_mutex_lock(&o.pool->m);
        o.pool->used -= o.size;
        pthread_mutex_unlock(&o.pool->m);
        free((void *)(uintptr_t)dptr);
        return CUDA_SUCCESS;
    }
    /* cuMemAlloc'd memory may be freed in stream order too. */
    return free_object((uintptr_t)dptr, K_DEV);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
    return cuMemAllocAsync(dptr, size, s);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(dptr, size, pool, s);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
    return cuMemFreeAsync(dptr, s);
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!pool) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&pool->m);
    pool_release_to(pool, keep);
    pthread_mutex_unlock(&pool->m);
    return CUDA_SUCCESS;
}

enum { ATTR_RELEASE_THRESHOLD = 4, ATTR_RESERVED_MEM_CURRENT = 5, ATTR_USED_MEM_CURRENT = 7 };

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    unsigned long long v;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!pool || !value) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&pool->m);
    v = attr == ATTR_RELEASE_THRESHOLD ? pool->threshold
        : attr == ATTR_RESERVED_MEM_CURRENT ? pool->reserved
        : attr == ATTR_USED_MEM_CURRENT ? pool->used : ~0ULL;
    pthread_mutex_unlock(&pool->m);
    if (v == ~0ULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(value, &v, sizeof v);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!pool || !value || attr != ATTR_RELEASE_THRESHOLD) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&pool->m);
    memcpy(&pool->threshold, value, sizeof pool->threshold);
    pthread_mutex_unlock(&pool->m);
    return CUDA_SUCCESS;
}
#endif /* FAKE_CUDA_LEGACY */

/* Synchronizing lets every pool give back what exceeds its release threshold
 * (the driver's behaviour; the default threshold is 0). */
static void release_all_pools(void) {
#ifndef FAKE_CUDA_LEGACY
    struct fake_pool *p;
    int d;
    pthread_mutex_lock(&pools_lock);
    for (d = 0; d < n_devices; d++) {
        pthread_mutex_lock(&default_pool[d].m);
        pool_release_to(&default_pool[d], default_pool[d].threshold);
        pthread_mutex_unlock(&default_pool[d].m);
    }
    for (p = user_pools; p; p = p->next_live) {
        pthread_mutex_lock(&p->m);
        pool_release_to(p, p->threshold);
        pthread_mutex_unlock(&p->m);
    }
    pthread_mutex_unlock(&pools_lock);
#endif
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
    (void)s;
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    release_all_pools();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    if (!initialized) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!current) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    release_all_pools();
    return CUDA_SUCCESS;
}

#ifndef FAKE_CUDA_LEGACY
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) {
    return cuStreamSynchronize(s);
}

/* ---- cuGetProcAddress: the driver's name/version/flags rules ---- */

typedef void (*fn_t)(void);

struct proc {
    const char *name;
    int since; /* the CUDA version from which `name` means `fn` */
    fn_t fn;
    fn_t ptsz; /* per-thread default stream variant, if any */
};

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status);

#define P(name, since, fn, ptsz) {name, since, (fn_t)(fn), (fn_t)(ptsz)}
/* Newest first: the first entry whose `since` the version reaches wins. */
static const struct proc procs[] = {
    P("cuInit", 2000, cuInit, NULL),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion, NULL),
    P("cuDeviceGet", 2000, cuDeviceGet, NULL),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount, NULL),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2, NULL),
    P("cuCtxCreate", 3020, cuCtxCreate_v2, NULL),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2, NULL),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent, NULL),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent, NULL),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice, NULL),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize, NULL),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain, NULL),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2, NULL),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2, NULL),
    P("cuMemAlloc", 3020, cuMemAlloc_v2, NULL),
    P("cuMemAlloc", 2000, cuMemAlloc, NULL),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2, NULL),
    P("cuMemAllocManaged", 6000, cuMemAllocManaged, NULL),
    P("cuMemFree", 3020, cuMemFree_v2, NULL),
    P("cuArrayCreate", 3020, cuArrayCreate_v2, NULL),
    P("cuArray3DCreate", 3020, cuArray3DCreate_v2, NULL),
    P("cuArrayDestroy", 2000, cuArrayDestroy, NULL),
    P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate, NULL),
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy, NULL),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc, NULL),
    P("cuMemAllocHost", 3020, cuMemAllocHost_v2, NULL),
    P("cuMemFreeHost", 2000, cuMemFreeHost, NULL),
    P("cuMemHostRegister", 6050, cuMemHostRegister_v2, NULL),
    P("cuMemHostUnregister", 4000, cuMemHostUnregister, NULL),
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle, NULL),
    P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2, NULL),
    P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle, NULL),
    P("cuMemCreate", 10020, cuMemCreate, NULL),
    P("cuMemRelease", 10020, cuMemRelease, NULL),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve, NULL),
    P("cuMemAddressFree", 10020, cuMemAddressFree, NULL),
    P("cuMemMap", 10020, cuMemMap, NULL),
    P("cuMemUnmap", 10020, cuMemUnmap, NULL),
    P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle, NULL),
    P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle, NULL),
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool, NULL),
    P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool, NULL),
    P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool, NULL),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate, NULL),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy, NULL),
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo, NULL),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute, NULL),
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute, NULL),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2, NULL),
    P("cuGetProcAddress", 11030, cuGetProcAddress, NULL),
};

enum { PROC_SUCCESS = 0, PROC_NOT_FOUND = 1, PROC_VERSION_NOT_SUFFICIENT = 2 };

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status) {
    size_t i;
    int known = 0;
    if (!symbol || !pfn) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pfn = NULL;
    for (i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, symbol) != 0) {
            continue;
        }
        known = 1;
        if (version >= procs[i].since) {
            fn_t f = (flags & 2) && procs[i].ptsz ? procs[i].ptsz : procs[i].fn;
            *pfn = (void *)f;
            if (status) {
                *status = PROC_SUCCESS;
            }
            return CUDA_SUCCESS;
        }
    }
    if (status) {
        *status = known ? PROC_VERSION_NOT_SUFFICIENT : PROC_NOT_FOUND;
    }
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
#endif /* FAKE_CUDA_LEGACY */
