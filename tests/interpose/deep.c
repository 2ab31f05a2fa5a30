/*
 * deep.c: a library linked to libcuda, loaded with RTLD_DEEPBIND: its calls
 * bind to the driver before the interposer (they pass through uncounted).
 * Both direct calls and its own dlsym lookups.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size);
CUresult cuMemFree_v2(CUdeviceptr p);

__attribute__((visibility("default"))) int deep_alloc(unsigned long long bytes) {
    CUdeviceptr p, q;
    CUresult (*alloc)(CUdeviceptr *, size_t);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib || cuMemAlloc_v2(&p, (size_t)bytes) != 0) {
        return -1;
    }
    alloc = (CUresult (*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
    if (!alloc || alloc(&q, 4096) != 0 || cuMemFree_v2(q) != 0) {
        return -1;
    }
    return 0;
}
