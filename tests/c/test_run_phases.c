/* A training loop for `memprobe run`: EPOCHS epochs of STEPS steps (each
 * step ended by memprobe_tracker_next), an evaluation stream after each
 * epoch, a "checkpoint" custom phase at the end, optionally one forked
 * worker holding 48 MiB (a DataLoader worker), and a 256 MiB spike in
 * epoch 1, step 5: the tracker's step 13.
 *
 *   test_run_phases [STEP_MS [WORKER]]      (defaults: 2 ms, no worker)
 *
 * tests/tests/run_phases.rs runs it under `memprobe run` and checks that
 * the summary, the JSON and the chart show its phases and the spike's
 * step. tests/tests/c_abi.rs runs it alone (plainly, under ASan and
 * valgrind) with MEMPROBE_RUN_CHANNEL naming a socket that does not exist:
 * the tracker's calls must all succeed, and the program must not print. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "spike.h"

#define EPOCHS 3
#define STEPS 8
#define SPIKE_EPOCH 1
#define SPIKE_STEP 5
#define SPIKE_MIB 256
#define WORKER_MIB 48

static void sleep_ms(long ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

/* A worker holding WORKER_MIB until killed; only system calls after fork. */
static pid_t start_worker(void) {
    pid_t w = fork();
    if (w == 0) {
        size_t n = (size_t)WORKER_MIB << 20, i;
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
            for (i = 0; i < n; i += 4096) ((volatile char *)p)[i] = 1;
        }
        for (;;) pause();
    }
    return w;
}

int main(int argc, char **argv) {
    long step_ms = argc > 1 ? atol(argv[1]) : 2;
    int worker = argc > 2 ? atoi(argv[2]) : 0;
    memprobe_source *rss = NULL;
    memprobe_tracker *t = NULL;
    memprobe_phase_record rec;
    memprobe_delta d[1];
    pid_t w = -1;
    int e, s;

    OK(memprobe_source_new_process(0, &rss));
    {
        const memprobe_source *sources[1];
        sources[0] = rss;
        OK(memprobe_tracker_new(sources, 1, &t));
    }
    if (worker) {
        w = start_worker();
        CHECK(w > 0);
    }
    for (e = 0; e < EPOCHS; e++) {
        OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
        OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
        for (s = 0; s < STEPS; s++) {
            int spiked = e == SPIKE_EPOCH && s == SPIKE_STEP;
            sleep_ms(step_ms);
            if (spiked) CHECK(spike((size_t)SPIKE_MIB << 20));
            if (s + 1 < STEPS) {
                OK(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, d, 1));
            } else {
                OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, d, 1));
            }
            CHECK(rec.kind == MEMPROBE_PHASE_KIND_STEP && rec.depth == 1);
            CHECK(rec.index == (uint64_t)(e * STEPS + s));
            if (spiked) {
                CHECK(rec.index == SPIKE_EPOCH * STEPS + SPIKE_STEP);
                CHECK(d[0].peak + SLACK >= d[0].used_start + ((uint64_t)SPIKE_MIB << 20));
            }
        }
        OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, &rec, d, 1));
        CHECK(rec.index == (uint64_t)e && rec.depth == 0);
        OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STREAM, NULL));
        sleep_ms(2 * step_ms);
        OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STREAM, NULL, &rec, d, 1));
    }
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_CUSTOM, "checkpoint"));
    sleep_ms(step_ms);
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_CUSTOM, "checkpoint", &rec, d, 1));
    CHECK(strcmp(rec.name, "checkpoint") == 0);
    if (w > 0) {
        int st;
        kill(w, SIGKILL);
        CHECK(waitpid(w, &st, 0) == w);
    }
    FREE_OK(memprobe_tracker_free(t));
    FREE_OK(memprobe_source_free(rss));
    return check_summary();
}
