/*
 * tree_origins.c: what held a process tree's GPU memory at its peaks, by
 * origin, for `memprobe run --gpu-exact` (memprobe-cli/tests/gpu_origins.rs).
 * Linked with an NCCL-like library (origin_lib.c as libfake_nccl.so) and
 * its own copy of that code (-DLIB=prog): each allocation's origin is the
 * copy that asked. Device 0 throughout; sizes in MiB; every hold lasts
 * HOLD_MS (the run samples every 10 ms).
 *
 *   two        parent: 4 via libfake_nccl; child (fork): 6 from the program;
 *              both hold at once (tree 10, neither process alone), then the
 *              child exits and the parent frees
 *   two-spike  as `two`, then, both still holding, the child spikes 1 and
 *              frees it at once: the tree's peak (11) lasts microseconds
 *              with two processes holding memory
 *   epochs     one process sending its epochs over the run channel
 *              ($MEMPROBE_RUN_CHANNEL, the protocol's JSON by hand):
 *              epoch 0 holds 8 from the program; epoch 1 adds 4 from
 *              libfake_nccl (12); epoch 2 frees them, holds 8 and spikes 16
 *              from libfake_nccl for microseconds (24: the process's and
 *              the tree's peak) inside its step 0
 */
#include "cuda_api.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ULL << 20)
#define HOLD_MS 300

/* origin_lib.c's kind of a plain cuMemAlloc. */
enum { PLAIN = 0 };

int nccl_alloc(int kind, size_t bytes, uint64_t *out);
int nccl_free(int kind, uint64_t what);
int prog_alloc(int kind, size_t bytes, uint64_t *out);
int prog_free(int kind, uint64_t what);

static struct api a;

static void pause_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static uint64_t get(int nccl, unsigned long long mib) {
    uint64_t p;
    CHECK(nccl ? nccl_alloc(PLAIN, mib * MIB, &p) : prog_alloc(PLAIN, mib * MIB, &p));
    return p;
}

static void put(int nccl, uint64_t p) { CHECK(nccl ? nccl_free(PLAIN, p) : prog_free(PLAIN, p)); }

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}

/* The run channel: one datagram per message. */
static int chan = -1;
static struct sockaddr_un chan_to;
static unsigned seq;

static void send_msg(const char *json) {
    if (chan < 0) return;
    if (sendto(chan, json, strlen(json), 0, (struct sockaddr *)&chan_to, sizeof chan_to) < 0) {
        perror("sendto");
        exit(5);
    }
}

static unsigned long long epoch_begin(unsigned index) {
    char m[512];
    unsigned long long t = now_ns();
    snprintf(m, sizeof m,
             "{\"v\":1,\"ev\":\"begin\",\"pid\":%d,\"tracker\":1,\"seq\":%u,\"dropped\":0,"
             "\"kind\":\"epoch\",\"name\":\"epoch\",\"index\":%u,\"depth\":0,\"t_ns\":%llu}",
             (int)getpid(), seq++, index, t);
    send_msg(m);
    return t;
}

static void epoch_end(unsigned index, unsigned long long started) {
    char m[768];
    snprintf(m, sizeof m,
             "{\"v\":1,\"ev\":\"end\",\"pid\":%d,\"tracker\":1,\"seq\":%u,\"dropped\":0,"
             "\"kind\":\"epoch\",\"name\":\"epoch\",\"index\":%u,\"depth\":0,\"started_ns\":%llu,"
             "\"ended_ns\":%llu,\"next\":false,\"releases\":0,\"sources\":[],\"truncated\":false}",
             (int)getpid(), seq++, index, started, now_ns());
    send_msg(m);
}

/* One step around the spike, its record saying the process's exact peak
 * (as memprobe's gpu_exact source would). */
static void step(unsigned index, unsigned long long started, unsigned long long held,
                 unsigned long long peak) {
    char m[1024];
    snprintf(m, sizeof m,
             "{\"v\":1,\"ev\":\"begin\",\"pid\":%d,\"tracker\":1,\"seq\":%u,\"dropped\":0,"
             "\"kind\":\"step\",\"name\":\"step\",\"index\":%u,\"depth\":1,\"t_ns\":%llu}",
             (int)getpid(), seq++, index, started);
    send_msg(m);
    snprintf(m, sizeof m,
             "{\"v\":1,\"ev\":\"end\",\"pid\":%d,\"tracker\":1,\"seq\":%u,\"dropped\":0,"
             "\"kind\":\"step\",\"name\":\"step\",\"index\":%u,\"depth\":1,\"started_ns\":%llu,"
             "\"ended_ns\":%llu,\"next\":false,\"releases\":0,\"sources\":[{\"name\":\"gpu_exact:0\","
             "\"kind\":\"gpu_exact\",\"fidelity\":\"exact\",\"used_start\":%llu,\"used_end\":%llu,"
             "\"peak\":%llu,\"delta_used\":0,\"delta_peaked\":%llu}],\"truncated\":false}",
             (int)getpid(), seq++, index, started, now_ns(), held, held, peak, peak - held);
    send_msg(m);
}

static void open_channel(void) {
    const char *path = getenv("MEMPROBE_RUN_CHANNEL");
    if (!path || strlen(path) >= sizeof chan_to.sun_path) {
        fprintf(stderr, "no run channel\n");
        exit(3);
    }
    chan = socket(AF_UNIX, SOCK_DGRAM, 0);
    memset(&chan_to, 0, sizeof chan_to);
    chan_to.sun_family = AF_UNIX;
    strcpy(chan_to.sun_path, path);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    load_api(&a, "linked");
    CHECK(a.cuInit(0));
    use_device(&a, 0);

    if (strcmp(argv[1], "two") == 0 || strcmp(argv[1], "two-spike") == 0) {
        int fds[2];
        char c = 0;
        uint64_t mine = get(1, 4);
        if (pipe(fds) != 0) return 6;
        pid_t child = fork();
        if (child == 0) {
            use_device(&a, 0);
            uint64_t held = get(0, 6);
            /* Both hold now. */
            if (write(fds[1], &c, 1) != 1) _exit(7);
            pause_ms(HOLD_MS);
            if (strcmp(argv[1], "two-spike") == 0) {
                put(0, get(0, 1));
                pause_ms(HOLD_MS);
            }
            put(0, held);
            _exit(0);
        }
        if (read(fds[0], &c, 1) != 1) return 8;
        printf("parent %d\nchild %d\n", (int)getpid(), (int)child);
        fflush(stdout);
        int status;
        if (waitpid(child, &status, 0) != child || status != 0) return 9;
        pause_ms(50);
        put(1, mine);
        return 0;
    }
    if (strcmp(argv[1], "epochs") == 0) {
        open_channel();
        unsigned long long t = epoch_begin(0);
        uint64_t model = get(0, 8);
        pause_ms(HOLD_MS);
        epoch_end(0, t);

        t = epoch_begin(1);
        uint64_t buffers = get(1, 4);
        pause_ms(HOLD_MS);
        epoch_end(1, t);

        t = epoch_begin(2);
        put(1, buffers);
        pause_ms(HOLD_MS / 3);
        unsigned long long st = now_ns();
        put(1, get(1, 16));
        step(0, st, 8 * MIB, 24 * MIB);
        pause_ms(HOLD_MS);
        epoch_end(2, t);
        put(0, model);
        printf("pid %d\n", (int)getpid());
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
