/* Eight threads each spike 64..512 MiB inside their own window over this
 * process's RSS, with an outer window over all of them (issue: under
 * valgrind, every peak once read as one baseline value). Every window must
 * hold its own thread's spike, and the outer one the largest; a spike whose
 * memory could not be mapped is a failure, never a silent skip. Run plainly,
 * under ASan and under valgrind (which serialises the threads). */
#include <pthread.h>
#include <stdint.h>
#include "check.h"
#include "spike.h"

#define THREADS 8

static memprobe_source *rss;

struct result {
    size_t mib;
    int mapped;
    memprobe_status open, measure, freed;
    memprobe_delta d;
};

static void *worker(void *arg) {
    struct result *r = (struct result *)arg;
    const memprobe_source *s[1];
    memprobe_window *w = NULL;
    s[0] = rss;
    r->open = memprobe_window_open(s, 1, &w);
    r->mapped = spike(r->mib * MIB);
    r->measure = memprobe_window_measure(w, 0, &r->d);
    r->freed = memprobe_window_free(w);
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    struct result r[THREADS];
    memprobe_window *outer = NULL;
    const memprobe_source *s[1];
    uint64_t peak = 0;
    int i, round;

    OK(memprobe_source_new_process(0, &rss));
    s[0] = rss;
    for (round = 0; round < 3; round++) {
        OK(memprobe_window_open(s, 1, &outer));
        for (i = 0; i < THREADS; i++) {
            memset(&r[i], 0, sizeof r[i]);
            r[i].mib = 64 * (size_t)(i + 1);
            CHECK(pthread_create(&t[i], NULL, worker, &r[i]) == 0);
        }
        for (i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
        for (i = 0; i < THREADS; i++) {
            uint64_t spike_bytes = r[i].mib * MIB;
            CHECK(r[i].mapped);
            CHECK(r[i].open == MEMPROBE_STATUS_OK && r[i].measure == MEMPROBE_STATUS_OK &&
                  r[i].freed == MEMPROBE_STATUS_OK);
            CHECK(r[i].d.fidelity == MEMPROBE_FIDELITY_EXACT);
            /* The spike's pages were all resident at one instant inside the
             * window: the window's peak (absolute RSS) is at least their size.
             * The kernel's mark trails by up to a few percent under
             * concurrent faults (docs/reliability.md): allow 1/8. */
            if (!(r[i].d.peak >= spike_bytes - spike_bytes / 8))
                fprintf(stderr, "round %d: thread %zu MiB: start %llu peak %llu MiB\n", round, r[i].mib,
                        (unsigned long long)(r[i].d.used_start / MIB), (unsigned long long)(r[i].d.peak / MIB));
            CHECK(r[i].d.peak >= spike_bytes - spike_bytes / 8);
        }
        OK(memprobe_window_peak(outer, 0, &peak));
        CHECK(peak >= 512 * MIB - 64 * MIB);
        FREE_OK(memprobe_window_free(outer));
    }
    FREE_OK(memprobe_source_free(rss));
    return check_summary();
}
