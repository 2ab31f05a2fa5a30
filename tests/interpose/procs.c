/*
 * procs.c: processes and threads around the interposer, driven by a test
 * that reads the counters from outside.
 *
 *   spike N BYTES     N times: wait for a line, allocate BYTES and free them
 *                     at once (a spike of microseconds), print "spiked"
 *   threads T ROUNDS  T threads allocate and free at once; each keeps
 *                     (thread+1) MiB at the end; prints the fake's truth
 *   fork              the parent keeps 4 MiB, the child (no exec) 1 MiB
 *   exec              the child execs this program ("execed"), which keeps 2 MiB
 *   hold              keeps 8 MiB and waits to be killed
 *   nocontext         allocates on a thread with no current context
 *   deepbind LIB      calls LIB (dlopen'ed RTLD_DEEPBIND, linked to libcuda)
 *   inside N          a tracker inside: N times, wait for a line, spike by
 *                     (i % 7 + 1) MiB, then take its own mark (through the
 *                     interposer's C entry points) and print "inside PEAK"
 *   next              with next.c preloaded after the interposer: its
 *                     dlsym(RTLD_NEXT) finds the real getpid
 */
#include "cuda_api.h"

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1ULL << 20)

static struct api a;
static unsigned long long rounds;

static void wait_line(void) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) {
        exit(4);
    }
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    unsigned long long i;
    CUdeviceptr keep, p[4];
    int k;
    use_device(&a, 0);
    for (i = 0; i < rounds; i++) {
        for (k = 0; k < 4; k++) {
            CHECK(a.cuMemAlloc_v2(&p[k], (size_t)(4096 * (k + 1) + id)));
        }
        for (k = 3; k >= 0; k--) {
            CHECK(a.cuMemFree_v2(p[k]));
        }
    }
    CHECK(a.cuMemAlloc_v2(&keep, (size_t)(id + 1) * MIB));
    return NULL;
}

static void *no_context(void *arg) {
    CUdeviceptr p, q;
    CUmemPoolProps props;
    CUpool pool;
    (void)arg;
    /* fails in the driver: no context; passes through uncounted */
    EXPECT_RC(201, a.cuMemAlloc_v2(&p, MIB));
    /* a pool names its device: counted without a context */
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 1;
    CHECK(a.cuMemPoolCreate(&pool, &props));
    CHECK(a.cuMemAllocFromPoolAsync(&q, 3 * MIB, pool, NULL));
    return NULL;
}

int main(int argc, char **argv) {
    CUdeviceptr p;
    if (argc < 2) {
        return 2;
    }
    load_api(&a, "dlsym");
    CHECK(a.cuInit(0));
    use_device(&a, 0);

    if (strcmp(argv[1], "spike") == 0 && argc == 4) {
        long n = atol(argv[2]), i;
        size_t bytes = (size_t)strtoull(argv[3], NULL, 0);
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        for (i = 0; i < n; i++) {
            wait_line();
            CHECK(a.cuMemAlloc_v2(&p, bytes));
            CHECK(a.cuMemFree_v2(p));
            printf("spiked\n");
            fflush(stdout);
        }
        return 0;
    }
    if (strcmp(argv[1], "threads") == 0 && argc == 4) {
        int t = atoi(argv[2]), i;
        pthread_t th[64];
        rounds = strtoull(argv[3], NULL, 0);
        if (t < 1 || t > 64) {
            return 2;
        }
        for (i = 0; i < t; i++) {
            pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
        }
        for (i = 0; i < t; i++) {
            pthread_join(th[i], NULL);
        }
        printf("truth %llu\n", a.used(0));
        fflush(stdout);
        wait_line();
        return 0;
    }
    if (strcmp(argv[1], "fork") == 0) {
        pid_t child;
        int status;
        CHECK(a.cuMemAlloc_v2(&p, 4 * MIB));
        fflush(stdout);
        child = fork();
        if (child == 0) {
            CUdeviceptr q;
            CHECK(a.cuMemAlloc_v2(&q, 1 * MIB));
            printf("child %d\n", (int)getpid());
            fflush(stdout);
            wait_line();
            _exit(0);
        }
        printf("parent %d\n", (int)getpid());
        fflush(stdout);
        waitpid(child, &status, 0);
        printf("reaped\n");
        fflush(stdout);
        wait_line();
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 5;
    }
    if (strcmp(argv[1], "exec") == 0) {
        pid_t child;
        int status;
        CHECK(a.cuMemAlloc_v2(&p, 3 * MIB));
        fflush(stdout);
        child = fork();
        if (child == 0) {
            execl("/proc/self/exe", argv[0], "execed", (char *)NULL);
            _exit(6);
        }
        printf("parent %d\n", (int)getpid());
        fflush(stdout);
        waitpid(child, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 5;
    }
    if (strcmp(argv[1], "execed") == 0) {
        CHECK(a.cuMemAlloc_v2(&p, 2 * MIB));
        printf("child %d\n", (int)getpid());
        fflush(stdout);
        wait_line();
        return 0;
    }
    if (strcmp(argv[1], "hold") == 0) {
        CHECK(a.cuMemAlloc_v2(&p, 8 * MIB));
        printf("holding %d\n", (int)getpid());
        fflush(stdout);
        for (;;) {
            pause();
        }
    }
    if (strcmp(argv[1], "nocontext") == 0) {
        pthread_t th;
        pthread_create(&th, NULL, no_context, NULL);
        pthread_join(th, NULL);
        CHECK(a.cuMemAlloc_v2(&p, MIB));
        printf("truth %llu %llu\n", a.used(0), a.used(1));
        fflush(stdout);
        wait_line();
        return 0;
    }
    if (strcmp(argv[1], "deepbind") == 0 && argc == 3) {
        void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        int (*deep_alloc)(unsigned long long);
        if (!lib) {
            fprintf(stderr, "dlopen %s: %s\n", argv[2], dlerror());
            return 2;
        }
        deep_alloc = (int (*)(unsigned long long))dlsym(lib, "deep_alloc");
        if (!deep_alloc || deep_alloc(6 * MIB) != 0) {
            return 7;
        }
        CHECK(a.cuMemAlloc_v2(&p, MIB));
        printf("truth %llu\n", a.used(0));
        fflush(stdout);
        wait_line();
        return 0;
    }
    if (strcmp(argv[1], "inside") == 0 && argc == 3) {
        long n = atol(argv[2]), i;
        int (*claim)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "memprobe_interpose_mark_claim");
        unsigned long long (*take)(int, int) =
            (unsigned long long (*)(int, int))dlsym(RTLD_DEFAULT, "memprobe_interpose_mark_take");
        int slot;
        if (!claim || !take || (slot = claim()) < 0) {
            fprintf(stderr, "no interposer mark\n");
            return 9;
        }
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        for (i = 0; i < n; i++) {
            wait_line();
            CHECK(a.cuMemAlloc_v2(&p, (size_t)(i % 7 + 1) * MIB));
            CHECK(a.cuMemFree_v2(p));
            printf("inside %llu\n", take(slot, 0));
            fflush(stdout);
        }
        return 0;
    }
    if (strcmp(argv[1], "next") == 0) {
        int (*found)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "next_found_real");
        if (!found || !found()) {
            fprintf(stderr, "dlsym(RTLD_NEXT) from the second interposer did not find libc's getpid\n");
            return 8;
        }
        CHECK(a.cuMemAlloc_v2(&p, MIB));
        printf("truth %llu\n", a.used(0));
        fflush(stdout);
        wait_line();
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
