/*
 * origin_runtime.c: a stand-in for the CUDA runtime, built as
 * libcudart.so.12: cudaMalloc reaches the driver two frames down, as the
 * real runtime's does. The interposer must look through it to the caller.
 */
#include <stddef.h>

typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *p, size_t size);
int cuMemFree_v2(CUdeviceptr p);

__attribute__((noinline)) static int runtime_alloc(void **p, size_t size) {
    CUdeviceptr d = 0;
    int rc = cuMemAlloc_v2(&d, size);
    *p = (void *)(size_t)d;
    /* Keeps the call above from becoming a tail call (the frame stays). */
    __asm__ volatile("" ::: "memory");
    return rc;
}

__attribute__((visibility("default"))) int cudaMalloc(void **p, size_t size) {
    int rc = runtime_alloc(p, size);
    __asm__ volatile("" ::: "memory");
    return rc;
}

__attribute__((visibility("default"))) int cudaFree(void *p) {
    return cuMemFree_v2((CUdeviceptr)(size_t)p);
}
