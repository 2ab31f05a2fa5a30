/*
 * stacks.c: call paths for `MEMPROBE_GPU_ORIGINS=stacks[:N]`
 * (memprobe-interpose/reader/tests/stacks.rs). One origin, the NCCL-like
 * library (origin_lib.c as libfake_nccl.so), reached by two paths of the
 * program (path_a, path_b), and the program's own allocation (its copy of
 * origin_lib.c, -DLIB=prog). Built with -rdynamic so dladdr names the
 * program's functions. Stops at checkpoints ("at LABEL") until the test,
 * reading the region from another process, answers.
 *
 *   held   path_a 3 MiB via nccl, path_b 5 MiB via nccl, the program 2 MiB
 *   freed  path_b's 5 MiB freed (the peak, 10 MiB, keeps its paths)
 *   oom    an allocation of 1 TiB via path_a failed (what was live then)
 */
#include "cuda_api.h"

#include <unistd.h>

#define MIB (1ULL << 20)

enum { PLAIN };

int nccl_alloc(int kind, size_t bytes, uint64_t *out);
int nccl_free(int kind, uint64_t what);
int prog_alloc(int kind, size_t bytes, uint64_t *out);

static struct api a;

static void at(const char *label) {
    char c;
    printf("at %s\n", label);
    fflush(stdout);
    if (read(0, &c, 1) != 1) {
        exit(4);
    }
}

/* Two callers of the same library function: two paths, one origin. */
__attribute__((noinline)) int path_a(size_t bytes, uint64_t *out) {
    int rc = nccl_alloc(PLAIN, bytes, out);
    __asm__ volatile("" ::: "memory"); /* not a tail call: path_a stays on the stack */
    return rc;
}

__attribute__((noinline)) int path_b(size_t bytes, uint64_t *out) {
    int rc = nccl_alloc(PLAIN, bytes, out);
    __asm__ volatile("" ::: "memory");
    return rc;
}

int main(void) {
    uint64_t pa, pb, pp, big;
    load_api(&a, "linked");
    CHECK(a.cuInit(0));
    use_device(&a, 0);
    CHECK(path_a(3 * MIB, &pa));
    CHECK(path_b(5 * MIB, &pb));
    CHECK(prog_alloc(PLAIN, 2 * MIB, &pp));
    at("held");
    CHECK(nccl_free(PLAIN, pb));
    at("freed");
    if (path_a((size_t)1 << 40, &big) != 2) {
        fprintf(stderr, "1 TiB did not fail with out of memory\n");
        return 5;
    }
    at("oom");
    printf("done\n");
    fflush(stdout);
    return 0;
}
