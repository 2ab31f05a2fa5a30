/*
 * tree.c: a process tree using the GPU, for `memprobe run --gpu-exact`
 * (memprobe-cli/tests/gpu_exact.rs). Everything runs on its own, no input.
 *
 *   spike MIB       holds 2 MiB on device 0, allocates MIB MiB and frees it
 *                   at once (a spike of microseconds), exits holding 2 MiB
 *   fork            parent: 4 MiB held, an 8 MiB spike (its peak: 12);
 *                   child (fork, no exec): 6 MiB on device 0 + a 1 MiB spike
 *                   (tree: 4 + 7 = 11), 5 MiB on device 1, exits holding
 *                   both; then the parent spikes 3 MiB (tree: 7) and exits
 *                   holding 4 MiB. Tree peak 12 on device 0 (the processes'
 *                   peaks sum to 19), 5 on device 1.
 *   exec            parent: 3 MiB held; child: 1 MiB, then exec of this
 *                   program as "execed": 2 MiB held + a 4 MiB spike (the
 *                   old image's 1 MiB went with it: tree 3 + 6 = 9)
 *   killed          child: 8 MiB held, killed by the parent with SIGKILL
 *   hold MIB MS     holds MIB MiB on device 0 for MS milliseconds
 *   oom MIB         holds 2 MiB on device 0, asks for MIB MiB more, which
 *                   must fail with CUDA_ERROR_OUT_OF_MEMORY (run with
 *                   FAKE_CUDA_MEMORY below it), and exits 0
 */
#include "cuda_api.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ULL << 20)

static struct api a;

static void spike(unsigned long long bytes) {
    CUdeviceptr p;
    CHECK(a.cuMemAlloc_v2(&p, (size_t)bytes));
    CHECK(a.cuMemFree_v2(p));
}

static CUdeviceptr hold(unsigned long long bytes) {
    CUdeviceptr p;
    CHECK(a.cuMemAlloc_v2(&p, (size_t)bytes));
    return p;
}

static int reap(pid_t child) {
    int status;
    if (waitpid(child, &status, 0) != child) return -1;
    return status;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    load_api(&a, "dlsym");
    CHECK(a.cuInit(0));
    use_device(&a, 0);

    if (strcmp(argv[1], "spike") == 0 && argc == 3) {
        hold(2 * MIB);
        spike(strtoull(argv[2], NULL, 0) * MIB);
        printf("pid %d\n", (int)getpid());
        return 0;
    }
    if (strcmp(argv[1], "oom") == 0 && argc == 3) {
        CUdeviceptr p;
        hold(2 * MIB);
        if (a.cuMemAlloc_v2(&p, (size_t)(strtoull(argv[2], NULL, 0) * MIB)) != 2 /* CUDA_ERROR_OUT_OF_MEMORY */)
            return 1;
        printf("pid %d\n", (int)getpid());
        return 0;
    }
    if (strcmp(argv[1], "fork") == 0) {
        pid_t child;
        int status;
        hold(4 * MIB);
        spike(8 * MIB);
        fflush(stdout);
        child = fork();
        if (child == 0) {
            hold(6 * MIB);
            spike(1 * MIB);
            use_device(&a, 1);
            hold(5 * MIB);
            printf("child %d\n", (int)getpid());
            exit(0); /* holding 11 MiB: the driver frees it */
        }
        status = reap(child);
        spike(3 * MIB);
        printf("parent %d\n", (int)getpid());
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 5;
    }
    if (strcmp(argv[1], "exec") == 0) {
        pid_t child;
        int status;
        hold(3 * MIB);
        fflush(stdout);
        child = fork();
        if (child == 0) {
            hold(1 * MIB);
            execl("/proc/self/exe", argv[0], "execed", (char *)NULL);
            _exit(6);
        }
        status = reap(child);
        printf("parent %d\n", (int)getpid());
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 5;
    }
    if (strcmp(argv[1], "execed") == 0) {
        hold(2 * MIB);
        spike(4 * MIB);
        printf("child %d\n", (int)getpid());
        return 0;
    }
    if (strcmp(argv[1], "killed") == 0) {
        int fds[2];
        char c;
        pid_t child;
        int status;
        if (pipe(fds) != 0) return 2;
        fflush(stdout);
        child = fork();
        if (child == 0) {
            hold(8 * MIB);
            printf("child %d\n", (int)getpid());
            fflush(stdout);
            if (write(fds[1], "x", 1) != 1) _exit(7);
            for (;;) pause();
        }
        if (read(fds[0], &c, 1) != 1) return 7;
        kill(child, SIGKILL);
        status = reap(child);
        printf("parent %d\n", (int)getpid());
        return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? 0 : 5;
    }
    if (strcmp(argv[1], "hold") == 0 && argc == 4) {
        long ms = strtol(argv[3], NULL, 0);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        hold(strtoull(argv[2], NULL, 0) * MIB);
        printf("pid %d\n", (int)getpid());
        fflush(stdout);
        while (nanosleep(&ts, &ts) != 0) {
        }
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
