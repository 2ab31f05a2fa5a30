/*
 * A C "trainer" shaped like a training loop, measured with memprobe.
 *
 * Each step keeps some memory (activations that live on), makes a short
 * spike (a temporary buffer touched and freed at once) and frees the oldest
 * kept buffer. memprobe reports the exact peak of every step (the kernel's
 * high-water mark: no polling, no missed spike), each epoch's delta used /
 * delta peaked, and a fastai GPUMemTrace-style line per epoch.
 *
 *   usage: trainer [epochs] [steps] [spike_mib] [keep_mib]
 */
/* MAP_ANONYMOUS is not in POSIX: ask glibc / musl for it here, so that a
 * copy of this file builds with any -std= (guarded: -D_GNU_SOURCE too). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memprobe.h"

#define MIB ((uint64_t)1 << 20)
#define MAX_KEPT 4

static int check(memprobe_status st, const char *what) {
    if (st != MEMPROBE_STATUS_OK) {
        fprintf(stderr, "trainer: %s: %s (%s)\n", what, memprobe_status_name(st), memprobe_last_error());
        exit(1);
    }
    return 0;
}

static char *touch_new(size_t bytes) {
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t i;
    if (p == MAP_FAILED) {
        perror("trainer: mmap");
        exit(1);
    }
    for (i = 0; i < bytes; i += 4096) p[i] = (char)i;
    return p;
}

static long arg(int argc, char **argv, int i, long dflt) {
    return argc > i ? strtol(argv[i], NULL, 10) : dflt;
}

int main(int argc, char **argv) {
    long epochs = arg(argc, argv, 1, 3), steps = arg(argc, argv, 2, 4);
    size_t spike = (size_t)arg(argc, argv, 3, 256) * MIB, keep = (size_t)arg(argc, argv, 4, 16) * MIB;
    char *kept[MAX_KEPT] = {0};
    size_t kept_size[MAX_KEPT] = {0};
    memprobe_source *rss = NULL;
    memprobe_window *step_window = NULL;
    memprobe_trace *epoch_trace = NULL;
    const memprobe_source *sources[1];
    long e, s;
    int next = 0;

    if (epochs < 1 || steps < 1 || spike == 0) {
        fprintf(stderr, "usage: trainer [epochs>=1] [steps>=1] [spike_mib>=1] [keep_mib]\n");
        return 2;
    }
    printf("memprobe %s: %ld epochs x %ld steps, %zu MiB spike per step\n", memprobe_version(), epochs, steps,
           spike / MIB);
    check(memprobe_source_new_process(0, &rss), "process source");
    sources[0] = rss;
    check(memprobe_trace_new(sources, 1, "epoch", MEMPROBE_TRACE_DEFERRED, &epoch_trace), "trace");
    /* Reports go where we say: stdout here, to keep them in order with printf. */
    check(memprobe_trace_set_output_fd(epoch_trace, 1), "trace output");
    check(memprobe_window_open(sources, 1, &step_window), "step window");

    for (e = 0; e < epochs; e++) {
        memprobe_delta epoch;
        char note[32];
        fflush(stdout);
        check(memprobe_trace_start(epoch_trace), "epoch start");
        for (s = 0; s < steps; s++) {
            memprobe_delta d;
            char *tmp;
            check(memprobe_window_reset(step_window, NULL, 0), "step begin");
            /* forward: keep activations; backward: a short spike */
            if (kept[next]) munmap(kept[next], kept_size[next]);
            kept[next] = touch_new(keep);
            kept_size[next] = keep;
            next = (next + 1) % MAX_KEPT;
            tmp = touch_new(spike);
            munmap(tmp, spike);
            check(memprobe_window_measure(step_window, 0, &d), "step end");
            printf("  epoch %ld step %ld: rss %6.1f MiB -> %6.1f MiB, exact peak %6.1f MiB (+%.1f MiB spike)\n",
                   e + 1, s + 1, (double)d.used_start / MIB, (double)d.used_end / MIB, (double)d.peak / MIB,
                   (double)(d.peak - d.used_start) / MIB);
        }
        check(memprobe_trace_measure(epoch_trace, 0, &epoch), "epoch data");
        printf("epoch %ld: delta used %+.1f MiB, delta peaked %.1f MiB, peak %.1f MiB\n", e + 1,
               (double)epoch.delta_used / MIB, (double)epoch.delta_peaked / MIB, (double)epoch.peak / MIB);
        fflush(stdout);
        snprintf(note, sizeof note, "%ld", e + 1);
        check(memprobe_trace_report(epoch_trace, note), "epoch report");
        check(memprobe_trace_stop(epoch_trace), "epoch stop");
    }

    for (next = 0; next < MAX_KEPT; next++)
        if (kept[next]) munmap(kept[next], kept_size[next]);
    check(memprobe_window_free(step_window), "free window");
    check(memprobe_trace_free(epoch_trace), "free trace");
    check(memprobe_source_free(rss), "free source");
    return 0;
}
