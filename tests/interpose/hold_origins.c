/*
 * hold_origins.c: a process that holds GPU memory from four origins at
 * once, for the views that read another process's origins (`memprobe
 * gpus`, `watch`, `serve`; memprobe-cli/tests/cli/gpu_origins_views.rs).
 * Linked with three libraries built from origin_lib.c (libfake_nccl.so,
 * libfake_cublas.so, libfake_cudnn.so) and its own copy (-DLIB=prog).
 * On device 0 it holds, in MiB: the program 6, nccl 4, cublas 3, cudnn 1;
 * prints "ready" and holds until its stdin closes.
 */
#include "cuda_api.h"

#include <unistd.h>

#define MIB (1ULL << 20)

enum { PLAIN };

int nccl_alloc(int kind, size_t bytes, uint64_t *out);
int cublas_alloc(int kind, size_t bytes, uint64_t *out);
int cudnn_alloc(int kind, size_t bytes, uint64_t *out);
int prog_alloc(int kind, size_t bytes, uint64_t *out);

static struct api a;

int main(void) {
    uint64_t p;
    char buf[64];
    load_api(&a, "linked");
    CHECK(a.cuInit(0));
    use_device(&a, 0);
    CHECK(prog_alloc(PLAIN, 6 * MIB, &p));
    CHECK(nccl_alloc(PLAIN, 4 * MIB, &p));
    CHECK(cublas_alloc(PLAIN, 3 * MIB, &p));
    CHECK(cudnn_alloc(PLAIN, 1 * MIB, &p));
    printf("ready\n");
    fflush(stdout);
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
