/*
 * origins.c: GPU memory obtained by three origins (an NCCL-like library, a
 * cuBLAS-like one, the program itself; see origin_lib.c), directly and
 * through a CUDA-runtime-like library, in every way the interposer counts,
 * on two devices, from threads and from a forked child. Stops at
 * checkpoints ("at LABEL DEV0 DEV1 HOST", the fake driver's truth) until
 * the test, reading the origins from another process, answers.
 */
#include "cuda_api.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1ULL << 20)
#define THREADS 4
#define ROUNDS 200

enum { PLAIN, MANAGED, VMM, PINNED, HOST_ALLOC, POOL, RUNTIME };

int nccl_alloc(int kind, size_t bytes, uint64_t *out);
int nccl_free(int kind, uint64_t what);
int cublas_alloc(int kind, size_t bytes, uint64_t *out);
int cublas_free(int kind, uint64_t what);
int prog_alloc(int kind, size_t bytes, uint64_t *out);
int prog_free(int kind, uint64_t what);

static struct api a;

/* Allocates and frees from the cuBLAS-like library; returns what it kept. */
static void *thread_main(void *arg) {
    uint64_t *kept = malloc(ROUNDS / 4 * sizeof *kept);
    uint64_t p;
    int i, n = 0;
    (void)arg;
    if (!kept) {
        exit(5);
    }
    use_device(&a, 0);
    for (i = 0; i < ROUNDS; i++) {
        CHECK(cublas_alloc(PLAIN, 64 << 10, &p));
        if (i % 4 == 0) {
            kept[n++] = p;
        } else {
            CHECK(cublas_free(PLAIN, p));
        }
    }
    return kept;
}

/*
 * Code no library holds, as a JIT makes it: an anonymous executable page
 * that calls cuMemAlloc_v2(dptr, bytes) and returns its result. dladdr
 * cannot place it and the unwinder finds no tables for it; the origin must
 * still be counted, by its address. x86_64 only (NULL elsewhere).
 */
typedef CUresult (*jit_alloc_t)(CUdeviceptr *, size_t);
static jit_alloc_t make_jit(void *target) {
#if defined(__x86_64__)
    unsigned char code[] = {
        0x48, 0x83, 0xec, 0x08,                         /* sub rsp, 8 */
        0x48, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0,             /* mov rax, target */
        0xff, 0xd0,                                     /* call rax */
        0x48, 0x83, 0xc4, 0x08,                         /* add rsp, 8 */
        0xc3,                                           /* ret */
    };
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        return NULL;
    }
    memcpy(code + 6, &target, sizeof target);
    memcpy(page, code, sizeof code);
    if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0) {
        return NULL;
    }
    return (jit_alloc_t)page;
#else
    (void)target;
    return NULL;
#endif
}

int main(void) {
    uint64_t pp, nv, np, cp, big, man, pool, pin, hostp, rp, rn, child_p;
    pthread_t th[THREADS];
    uint64_t *kept[THREADS];
    pid_t child;
    int i, j, st;

    load_api(&a, "linked");
    CHECK(a.cuInit(0));
    use_device(&a, 0);
    checkpoint(&a, "start");

    CHECK(prog_alloc(PLAIN, 1 * MIB, &pp));
    checkpoint(&a, "prog-plain");
    CHECK(nccl_alloc(VMM, 4 * MIB, &nv));
    CHECK(nccl_alloc(PLAIN, 2 * MIB, &np));
    checkpoint(&a, "nccl");
    CHECK(cublas_alloc(PLAIN, 8 * MIB, &cp));
    checkpoint(&a, "peak1");
    CHECK(cublas_free(PLAIN, cp));
    CHECK(nccl_alloc(PLAIN, 10 * MIB, &big));
    checkpoint(&a, "peak2");
    CHECK(nccl_free(PLAIN, big));
    /* cuBLAS-like asks for more than the device has: what was live then. */
    EXPECT_RC(2, cublas_alloc(PLAIN, 1ULL << 50, &big));
    checkpoint(&a, "after-peak2");

    use_device(&a, 1);
    CHECK(cublas_alloc(MANAGED, 3 * MIB, &man));
    checkpoint(&a, "dev1");
    CHECK(cublas_free(MANAGED, man));
    use_device(&a, 0);

    CHECK(cublas_alloc(POOL, 1 * MIB, &pool));
    checkpoint(&a, "pool");
    CHECK(cublas_free(POOL, pool));
    checkpoint(&a, "pool-freed");

    CHECK(nccl_alloc(PINNED, 3 * MIB, &pin));
    CHECK(prog_alloc(HOST_ALLOC, 1 * MIB, &hostp));
    checkpoint(&a, "pinned");
    CHECK(nccl_free(PINNED, pin));
    CHECK(prog_free(HOST_ALLOC, hostp));

    CHECK(prog_alloc(RUNTIME, 5 * MIB, &rp));
    CHECK(nccl_alloc(RUNTIME, 2 * MIB, &rn));
    checkpoint(&a, "runtime");
    CHECK(prog_free(RUNTIME, rp));
    CHECK(nccl_free(RUNTIME, rn));

    for (i = 0; i < THREADS; i++) {
        if (pthread_create(&th[i], NULL, thread_main, NULL) != 0) {
            return 5;
        }
    }
    for (i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(th[i], &r);
        kept[i] = r;
    }
    checkpoint(&a, "threads");
    for (i = 0; i < THREADS; i++) {
        for (j = 0; j < ROUNDS / 4; j++) {
            CHECK(cublas_free(PLAIN, kept[i][j]));
        }
        free(kept[i]);
    }

    {
        /* From code no library holds (where the platform allows making it). */
        jit_alloc_t jit = make_jit((void *)a.cuMemAlloc_v2);
        CUdeviceptr j = 0;
        if (jit) {
            CHECK(jit(&j, 3 * MIB));
        }
        checkpoint(&a, jit ? "jit" : "no-jit");
        if (jit) {
            CHECK(a.cuMemFree_v2(j));
        }
    }

    fflush(stdout);
    child = fork();
    if (child == 0) {
        char line[16];
        CHECK(nccl_alloc(PLAIN, 2 * MIB, &child_p));
        printf("child %d\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) {
            _exit(4);
        }
        _exit(0);
    }
    if (child < 0 || waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        return 6;
    }
    checkpoint(&a, "forked");

    CHECK(prog_free(PLAIN, pp));
    CHECK(nccl_free(VMM, nv));
    CHECK(nccl_free(PLAIN, np));
    checkpoint(&a, "end");
    printf("done\n");
    return 0;
}
