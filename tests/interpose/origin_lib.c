/*
 * origin_lib.c: a library that obtains GPU memory through the driver it is
 * linked to (-lcuda), in every way the interposer counts, for the origin
 * tests. Built as two libraries, an NCCL-like and a cuBLAS-like one
 * (-DLIB=nccl / -DLIB=cublas, each its own soname), and into the test
 * program itself (-DLIB=prog): each allocation's origin is the copy of
 * this code that asked for it.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef LIB
#error "build with -DLIB=name"
#endif
#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUhandle;
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

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size);
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemCreate(CUhandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUhandle h);
CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags);
CUresult cuMemAllocHost_v2(void **p, size_t size);
CUresult cuMemFreeHost(void *p);
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, void *stream);
CUresult cuMemFreeAsync(CUdeviceptr p, void *stream);
CUresult cuStreamSynchronize(void *stream);
CUresult cuCtxGetDevice(int *dev);
/* The CUDA-runtime-like library of origin_runtime.c. */
int cudaMalloc(void **p, size_t size);
int cudaFree(void *p);

/* Kinds of allocation, as the test names them. */
enum { PLAIN, MANAGED, VMM, PINNED, HOST_ALLOC, POOL, RUNTIME };

/* Obtains `bytes` of kind `kind`; writes what frees it to *out; 0 on success. */
EXPORT int CAT(LIB, alloc)(int kind, size_t bytes, uint64_t *out) {
    CUdeviceptr p = 0;
    CUhandle h = 0;
    void *hp = NULL;
    CUmemAllocationProp prop;
    int rc, dev = 0;

    switch (kind) {
    case PLAIN:
        rc = cuMemAlloc_v2(&p, bytes);
        *out = p;
        return rc;
    case MANAGED:
        rc = cuMemAllocManaged(&p, bytes, 1);
        *out = p;
        return rc;
    case VMM:
        if ((rc = cuCtxGetDevice(&dev)) != 0) {
            return rc;
        }
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location.type = 1;
        prop.location.id = dev;
        rc = cuMemCreate(&h, bytes, &prop, 0);
        *out = h;
        return rc;
    case PINNED:
        rc = cuMemHostAlloc(&hp, bytes, 0);
        *out = (uint64_t)(uintptr_t)hp;
        return rc;
    case HOST_ALLOC:
        rc = cuMemAllocHost_v2(&hp, bytes);
        *out = (uint64_t)(uintptr_t)hp;
        return rc;
    case POOL:
        rc = cuMemAllocAsync(&p, bytes, NULL);
        *out = p;
        return rc;
    case RUNTIME:
        rc = cudaMalloc(&hp, bytes);
        *out = (uint64_t)(uintptr_t)hp;
        return rc;
    }
    return -1;
}

/* Gives back what CAT(LIB, alloc) of kind `kind` returned. */
EXPORT int CAT(LIB, free)(int kind, uint64_t what) {
    int rc;
    switch (kind) {
    case PLAIN:
    case MANAGED:
        return cuMemFree_v2(what);
    case VMM:
        return cuMemRelease(what);
    case PINNED:
    case HOST_ALLOC:
        return cuMemFreeHost((void *)(uintptr_t)what);
    case POOL:
        rc = cuMemFreeAsync(what, NULL);
        return rc ? rc : cuStreamSynchronize(NULL);
    case RUNTIME:
        return cudaFree((void *)(uintptr_t)what);
    }
    return -1;
}
