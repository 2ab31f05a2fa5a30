/*
 * cuda_api.h: the driver API the interposer test programs call, as function
 * pointers filled in one of the ways a program finds the driver: dlsym on
 * dlopen("libcuda.so.1") (versioned names), cuGetProcAddress(_v2) as the
 * CUDA runtime does (base names, a CUDA version, flags), or the symbols
 * linked directly (-DLINKED, -lcuda).
 */
#ifndef MEMPROBE_TEST_CUDA_API_H
#define MEMPROBE_TEST_CUDA_API_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUhandle;
typedef void *CUcontext;
typedef void *CUpool;
typedef void *CUarray;

typedef struct {
    int type;
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
    size_t Width, Height;
    unsigned Format, NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width, Height, Depth;
    unsigned Format, NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    char reserved[64];
} CUipcMemHandle;

#define API_FUNCTIONS(X)                                                                            \
    X(cuInit, "cuInit", 2000, CUresult (*)(unsigned))                                               \
    X(cuDeviceGet, "cuDeviceGet", 2000, CUresult (*)(int *, int))                                   \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, CUresult (*)(CUcontext *, int))   \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, CUresult (*)(CUcontext))                            \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, CUresult (*)(CUcontext *, unsigned, int))                \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, CUresult (*)(CUdeviceptr *, size_t))                       \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020,                                                  \
      CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))                              \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, CUresult (*)(CUdeviceptr *, size_t, unsigned))  \
    X(cuMemFree_v2, "cuMemFree", 3020, CUresult (*)(CUdeviceptr))                                   \
    X(cuMemCreate, "cuMemCreate", 10020,                                                            \
      CUresult (*)(CUhandle *, size_t, const CUmemAllocationProp *, unsigned long long))            \
    X(cuMemRelease, "cuMemRelease", 10020, CUresult (*)(CUhandle))                                  \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020,                          \
      CUresult (*)(void *, CUhandle, int, unsigned long long))                                      \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020,                      \
      CUresult (*)(CUhandle *, void *, int))                                                        \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, CUresult (*)(CUdeviceptr *, size_t, void *))       \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020,                                    \
      CUresult (*)(CUdeviceptr *, size_t, CUpool, void *))                                          \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, CUresult (*)(CUdeviceptr, void *))                   \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, CUresult (*)(CUpool *, const CUmemPoolProps *))    \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, CUresult (*)(CUpool))                            \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, CUresult (*)(CUpool, size_t))                      \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000, CUresult (*)(void *))                       \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, CUresult (*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *)) \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020,                                                  \
      CUresult (*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))                                     \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, CUresult (*)(CUarray))                                \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000,                                       \
      CUresult (*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned))                           \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, CUresult (*)(CUarray))              \
    X(cuMemHostAlloc, "cuMemHostAlloc", 2020, CUresult (*)(void **, size_t, unsigned))              \
    X(cuMemAllocHost_v2, "cuMemAllocHost", 3020, CUresult (*)(void **, size_t))                     \
    X(cuMemFreeHost, "cuMemFreeHost", 2000, CUresult (*)(void *))                                   \
    X(cuMemHostRegister_v2, "cuMemHostRegister", 6050, CUresult (*)(void *, size_t, unsigned))      \
    X(cuMemHostUnregister, "cuMemHostUnregister", 4000, CUresult (*)(void *))                       \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, CUresult (*)(CUipcMemHandle *, CUdeviceptr))    \
    X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000,                                           \
      CUresult (*)(CUdeviceptr *, CUipcMemHandle, unsigned))                                        \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, CUresult (*)(CUdeviceptr))

struct api {
#define FIELD(sym, base, since, type) __typeof__(type) sym;
    API_FUNCTIONS(FIELD)
#undef FIELD
    unsigned long long (*used)(int);
    unsigned long long (*host_pinned)(void);
};

typedef CUresult (*get_proc_v2_t)(const char *, void **, int, unsigned long long, int *);

/* How the functions are found: "dlsym", "proc" (cuGetProcAddress_v2, flags
 * 0), "proc-ptds" (per-thread default stream), "proc-v1" (cuGetProcAddress
 * of CUDA 11.3, found through cuGetProcAddress_v2 itself), or "linked". */
static void *load_api(struct api *a, const char *how) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
    memset(a, 0, sizeof *a);
    a->used = (unsigned long long (*)(int))dlsym(lib, "fake_cuda_used");
    a->host_pinned = (unsigned long long (*)(void))dlsym(lib, "fake_cuda_host_pinned");
    if (strcmp(how, "dlsym") == 0) {
#define BY_DLSYM(sym, base, since, type) a->sym = (type)dlsym(lib, #sym);
        API_FUNCTIONS(BY_DLSYM)
#undef BY_DLSYM
    } else if (strncmp(how, "proc", 4) == 0) {
        unsigned long long flags = strcmp(how, "proc-ptds") == 0 ? 2 : 0;
        get_proc_v2_t gp = (get_proc_v2_t)dlsym(lib, "cuGetProcAddress_v2");
        int status = -1;
        if (!gp) {
            fprintf(stderr, "no cuGetProcAddress_v2\n");
            exit(2);
        }
        if (strcmp(how, "proc-v1") == 0) {
            CUresult (*gp1)(const char *, void **, int, unsigned long long) = NULL;
            if (gp("cuGetProcAddress", (void **)&gp1, 11030, 0, &status) || !gp1) {
                fprintf(stderr, "cuGetProcAddress (11.3) not found\n");
                exit(2);
            }
#define BY_PROC1(sym, base, since, type) gp1(base, (void **)&a->sym, since, flags);
            API_FUNCTIONS(BY_PROC1)
#undef BY_PROC1
        } else {
            /* As the runtime: cuGetProcAddress itself through cuGetProcAddress. */
            get_proc_v2_t again = NULL;
            if (gp("cuGetProcAddress", (void **)&again, 12000, 0, &status) || !again) {
                fprintf(stderr, "cuGetProcAddress (12.0) not found\n");
                exit(2);
            }
#define BY_PROC(sym, base, since, type) again(base, (void **)&a->sym, 12040, flags, &status);
            API_FUNCTIONS(BY_PROC)
#undef BY_PROC
        }
    } else if (strcmp(how, "linked") == 0) {
#ifdef LINKED
#define LINK(sym, base, since, type) extern CUresult sym();
        API_FUNCTIONS(LINK)
#undef LINK
#define BY_LINK(sym, base, since, type) a->sym = (type)sym;
        API_FUNCTIONS(BY_LINK)
#undef BY_LINK
#else
        fprintf(stderr, "built without -DLINKED\n");
        exit(2);
#endif
    } else {
        fprintf(stderr, "unknown way %s\n", how);
        exit(2);
    }
    return lib;
}

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        CUresult rc_ = (call);                                                                      \
        if (rc_ != 0) {                                                                             \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #call, rc_);                   \
            exit(3);                                                                                \
        }                                                                                           \
    } while (0)

#define EXPECT_RC(want, call)                                                                       \
    do {                                                                                            \
        CUresult rc_ = (call);                                                                      \
        if (rc_ != (want)) {                                                                        \
            fprintf(stderr, "%s:%d: %s -> %d, want %d\n", __FILE__, __LINE__, #call, rc_, (want));  \
            exit(3);                                                                                \
        }                                                                                           \
    } while (0)

/* Tells the test what the fake holds now and waits for it to look. */
__attribute__((unused)) static void checkpoint(const struct api *a, const char *label) {
    char line[64];
    printf("at %s %llu %llu %llu\n", label, a->used(0), a->used(1), a->host_pinned());
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) {
        exit(4);
    }
}

static void use_device(const struct api *a, int dev) {
    CUcontext ctx;
    int d;
    CHECK(a->cuDeviceGet(&d, dev));
    CHECK(a->cuDevicePrimaryCtxRetain(&ctx, d));
    CHECK(a->cuCtxSetCurrent(ctx));
}

#endif
