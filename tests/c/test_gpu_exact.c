/* memprobe_source_new_gpu_exact: exact GPU peaks from the driver-API
 * interposer (libmemprobe_interpose.so), against the fake driver of
 * tests/fake-gpu/fake_cuda.c. tests/tests/gpu_exact_abi.rs runs it:
 *
 *   interposed   with LD_PRELOAD=libmemprobe_interpose.so and the fake
 *                libcuda.so.1 on LD_LIBRARY_PATH: a spike of microseconds is
 *                the exact peak of every window open across it, in every
 *                try; nested and sibling windows are independent; the
 *                source's info, reads, bad input and wrong order; a
 *                child forked with the source and a window open gets marks
 *                of its own: its boundaries never reset the parent's peak
 *                and its windows see its own allocations
 *   off          interposed, with MEMPROBE_GPU_EXACT=off: UNAVAILABLE
 *   plain        without the interposer: UNAVAILABLE, saying how to load it
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

#define MIB ((uint64_t)1 << 20)
#define TRIES 200

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

/* The driver API, found as a program finds it: dlsym on libcuda.so.1 (the
 * interposer answers these lookups with its counting wrappers). */
static CUresult (*cu_init)(unsigned);
static CUresult (*cu_device_get)(int *, int);
static CUresult (*cu_primary_retain)(CUcontext *, int);
static CUresult (*cu_ctx_set_current)(CUcontext);
static CUresult (*cu_mem_alloc)(CUdeviceptr *, size_t);
static CUresult (*cu_mem_free)(CUdeviceptr);

/* The conversion from a data pointer to a function pointer, as POSIX allows. */
#define LOAD(lib, var, name)                                \
    do {                                                    \
        void *p_ = dlsym(lib, name);                        \
        if (!p_) {                                          \
            fprintf(stderr, "dlsym %s: %s\n", name, dlerror()); \
            exit(2);                                        \
        }                                                   \
        memcpy(&(var), &p_, sizeof p_);                     \
    } while (0)

static void use_device(void *lib, int dev) {
    int d;
    CUcontext ctx;
    if (cu_device_get == NULL) {
        LOAD(lib, cu_init, "cuInit");
        LOAD(lib, cu_device_get, "cuDeviceGet");
        LOAD(lib, cu_primary_retain, "cuDevicePrimaryCtxRetain");
        LOAD(lib, cu_ctx_set_current, "cuCtxSetCurrent");
        LOAD(lib, cu_mem_alloc, "cuMemAlloc_v2");
        LOAD(lib, cu_mem_free, "cuMemFree_v2");
        CHECK(cu_init(0) == 0);
    }
    CHECK(cu_device_get(&d, dev) == 0);
    CHECK(cu_primary_retain(&ctx, d) == 0);
    CHECK(cu_ctx_set_current(ctx) == 0);
}

/* Allocates `bytes` and frees them at once: held for microseconds. */
static int spike(uint64_t bytes) {
    CUdeviceptr p;
    if (cu_mem_alloc(&p, (size_t)bytes) != 0) return 0;
    return cu_mem_free(p) == 0;
}

static uint64_t peak_of(const memprobe_window *w) {
    uint64_t v = 0;
    if (memprobe_window_peak(w, 0, &v) != MEMPROBE_STATUS_OK) return UINT64_MAX;
    return v;
}

static int error_has(const char *needle) { return strstr(memprobe_last_error(), needle) != NULL; }

static void bad_input(void) {
    memprobe_source *s = (memprobe_source *)(uintptr_t)0x1234;
    EXPECT(memprobe_source_new_gpu_exact(0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_gpu_exact(64, &s), MEMPROBE_STATUS_INVALID_ID);
    CHECK(s == (memprobe_source *)(uintptr_t)0x1234); /* untouched on failure */
    EXPECT(memprobe_source_new_gpu_exact(UINT32_MAX, &s), MEMPROBE_STATUS_INVALID_ID);
}

/* A source and a window made before fork: the child's boundaries and the
 * child freeing the source leave the parent's mark alone (its 7 MiB peak
 * stays), and the child's windows see the child's own allocations. */
static void fork_keeps_the_parents_marks(void *lib) {
    memprobe_source *src = NULL;
    memprobe_window *w = NULL, *kept = NULL;
    memprobe_delta ended;
    memprobe_sample sample;
    pid_t pid;
    int status = -1;

    use_device(lib, 0);
    OK(memprobe_source_new_gpu_exact(0, &src));
    OK(memprobe_window_open((const memprobe_source *const *)&src, 1, &w));
    OK(memprobe_window_open((const memprobe_source *const *)&src, 1, &kept));
    CHECK(spike(7 * MIB));
    CHECK(peak_of(w) == 7 * MIB);
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        memprobe_window *mine = NULL;
        CUdeviceptr held;
        int before = check_failed;
        use_device(lib, 0);
        /* The inherited window's boundary and a new window: the child's. */
        OK(memprobe_window_reset(w, &ended, 1));
        OK(memprobe_window_open((const memprobe_source *const *)&src, 1, &mine));
        CHECK(cu_mem_alloc(&held, (size_t)(2 * MIB)) == 0);
        CHECK(spike(3 * MIB));
        OK(memprobe_source_read(src, &sample));
        CHECK(sample.used == 2 * MIB);
        CHECK(peak_of(mine) == 5 * MIB);
        CHECK(peak_of(w) == 5 * MIB);
        OK(memprobe_window_reset(mine, &ended, 1));
        CHECK(ended.peak == 5 * MIB && ended.used_start == 0 && ended.used_end == 2 * MIB);
        CHECK(cu_mem_free(held) == 0);
        FREE_OK(memprobe_window_free(mine));
        FREE_OK(memprobe_window_free(w));
        FREE_OK(memprobe_window_free(kept));
        FREE_OK(memprobe_source_free(src));
        _exit(check_failed == before ? 0 : 1);
    }
    CHECK(pid > 0);
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's peaks, and its counts, are as the child found them. */
    CHECK(peak_of(w) == 7 * MIB);
    CHECK(peak_of(kept) == 7 * MIB);
    OK(memprobe_source_read(src, &sample));
    CHECK(sample.used == 0);
    OK(memprobe_window_reset(w, &ended, 1));
    CHECK(ended.peak == 7 * MIB);
    /* The parent's mark still counts (the child gave back only its own). */
    CHECK(spike(1 * MIB));
    CHECK(peak_of(w) == 1 * MIB);
    CHECK(peak_of(kept) == 7 * MIB);
    FREE_OK(memprobe_window_free(w));
    FREE_OK(memprobe_window_free(kept));
    FREE_OK(memprobe_source_free(src));
}

static void interposed(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    memprobe_source *dev0 = NULL, *dev1 = NULL, *again = NULL;
    memprobe_source_info info;
    memprobe_sample sample;
    memprobe_window *outer = NULL, *inner = NULL, *sibling = NULL, *other = NULL;
    memprobe_delta ended;
    CUdeviceptr base;
    int i, caught_inner = 0, caught_outer = 0, caught_sibling = 0;
    uint64_t biggest = 0;

    if (!lib) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
    use_device(lib, 0);
    bad_input();

    OK(memprobe_source_new_gpu_exact(0, &dev0));
    OK(memprobe_source_new_gpu_exact(1, &dev1));
    OK(memprobe_source_get_info(dev0, &info));
    CHECK(info.kind == MEMPROBE_SOURCE_KIND_GPU_EXACT);
    CHECK(info.fidelity == MEMPROBE_FIDELITY_EXACT);
    CHECK(strcmp(info.name, "gpu_exact:0") == 0);

    /* A base held through the whole test: reads and peaks are absolute. */
    CHECK(cu_mem_alloc(&base, (size_t)(3 * MIB)) == 0);
    OK(memprobe_source_read(dev0, &sample));
    CHECK(sample.used == 3 * MIB);
    OK(memprobe_source_read(dev1, &sample));
    CHECK(sample.used == 0);

    /* Short spikes: the inner window is reset after each, the outer never;
     * a sibling over its own source is reset every other try. */
    OK(memprobe_source_new_gpu_exact(0, &again));
    OK(memprobe_window_open((const memprobe_source *const *)&dev0, 1, &outer));
    OK(memprobe_window_open((const memprobe_source *const *)&dev0, 1, &inner));
    OK(memprobe_window_open((const memprobe_source *const *)&again, 1, &sibling));
    for (i = 0; i < TRIES; i++) {
        uint64_t bytes = (uint64_t)(i % 13 + 1) * MIB;
        uint64_t sib_expect;
        if (bytes > biggest) biggest = bytes;
        CHECK(spike(bytes));
        if (peak_of(inner) == 3 * MIB + bytes) caught_inner++;
        OK(memprobe_window_reset(inner, &ended, 1));
        CHECK(ended.peak == 3 * MIB + bytes);
        CHECK(ended.used_start == 3 * MIB && ended.used_end == 3 * MIB);
        CHECK(ended.delta_used == 0 && ended.delta_peaked == bytes);
        /* The inner window restarted from what is held now. */
        CHECK(peak_of(inner) == 3 * MIB);
        if (peak_of(outer) == 3 * MIB + biggest) caught_outer++;
        /* The sibling saw this spike and, on odd tries, the one before. */
        sib_expect = bytes;
        if (i % 2 == 1) {
            uint64_t prev = (uint64_t)((i - 1) % 13 + 1) * MIB;
            if (prev > sib_expect) sib_expect = prev;
        }
        if (peak_of(sibling) == 3 * MIB + sib_expect) caught_sibling++;
        if (i % 2 == 1) OK(memprobe_window_reset(sibling, NULL, 0));
    }
    printf("caught inner %d/%d outer %d/%d sibling %d/%d\n", caught_inner, TRIES, caught_outer,
           TRIES, caught_sibling, TRIES);
    CHECK(caught_inner == TRIES);
    CHECK(caught_outer == TRIES);
    CHECK(caught_sibling == TRIES);

    /* Device 1 is counted apart: a spike there is not device 0's. */
    OK(memprobe_window_open((const memprobe_source *const *)&dev1, 1, &other));
    use_device(lib, 1);
    CHECK(spike(5 * MIB));
    use_device(lib, 0);
    CHECK(peak_of(other) == 5 * MIB);
    CHECK(peak_of(outer) == 3 * MIB + biggest);
    FREE_OK(memprobe_window_free(other));

    /* Wrong order: a window over a freed source, reads of a freed handle. */
    FREE_OK(memprobe_window_free(sibling));
    FREE_OK(memprobe_source_free(again));
    EXPECT(memprobe_window_open((const memprobe_source *const *)&again, 1, &sibling),
           MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_source_read(again, &sample), MEMPROBE_STATUS_INVALID_HANDLE);
    /* The open windows over dev0 go on after another source of it went. */
    CHECK(spike(20 * MIB));
    CHECK(peak_of(outer) == 23 * MIB);
    CHECK(peak_of(inner) == 23 * MIB);

    FREE_OK(memprobe_window_free(inner));
    FREE_OK(memprobe_window_free(outer));
    CHECK(cu_mem_free(base) == 0);
    OK(memprobe_source_read(dev0, &sample));
    CHECK(sample.used == 0);
    FREE_OK(memprobe_source_free(dev0));
    FREE_OK(memprobe_source_free(dev1));
    FREE_OK(memprobe_source_free(NULL));
    fork_keeps_the_parents_marks(lib);
    dlclose(lib);
}

static void unavailable(const char *why) {
    memprobe_source *s = NULL;
    bad_input();
    EXPECT(memprobe_source_new_gpu_exact(0, &s), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(s == NULL);
    CHECK(error_has(why));
    CHECK(error_has("memprobe run --gpu-exact"));
    CHECK(error_has("LD_PRELOAD"));
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    if (strcmp(argv[1], "interposed") == 0) {
        interposed();
    } else if (strcmp(argv[1], "off") == 0) {
        unavailable("MEMPROBE_GPU_EXACT=off");
    } else if (strcmp(argv[1], "plain") == 0) {
        unavailable("not loaded");
    } else {
        return 2;
    }
    return check_summary();
}
