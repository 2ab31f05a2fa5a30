/* The process tree's PSS and USS through the C ABI: a parent touches a
 * 256 MiB buffer and forks 4 workers that only read it. Summed RSS counts
 * the buffer once per process (5 times); the tree's PSS counts it once; the
 * buffer is shared, so it is in nobody's USS. Then bad input: unknown
 * metrics, NULL, a freed handle, a window over a freed source. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

#define MIB ((uint64_t)1 << 20)
#define BUF_MIB 256
#define WORKERS 4

static pid_t workers[WORKERS];

/* A worker: reads every page of the buffer (no copy: the pages stay
 * shared), says so on the pipe, and sleeps until killed (or its parent
 * dies). Only async-signal-safe calls after fork. */
static void worker(volatile const unsigned char *buf, size_t len, int ready) {
    unsigned sum = 0;
    size_t off;
    char c = 1;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (off = 0; off < len; off += 4096) sum += buf[off];
    c = (char)(sum != 0);
    if (write(ready, &c, 1) != 1) _exit(1);
    for (;;) pause();
}

static void test_shared_pages_count_once(void) {
    size_t len = (size_t)BUF_MIB * MIB, off;
    unsigned char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int fds[2];
    int i, got = 0;
    memprobe_source *rss = NULL, *pss = NULL, *uss = NULL;
    memprobe_sample r, p, u;
    memprobe_source_info info;
    CHECK(buf != MAP_FAILED);
    if (buf == MAP_FAILED) return;
    for (off = 0; off < len; off += 4096) buf[off] = 1;
    CHECK(pipe(fds) == 0);
    for (i = 0; i < WORKERS; i++) {
        workers[i] = fork();
        if (workers[i] == 0) worker(buf, len, fds[1]);
        CHECK(workers[i] > 0);
    }
    for (i = 0; i < WORKERS; i++) {
        char c = 0;
        if (read(fds[0], &c, 1) == 1 && c == 1) got++;
    }
    CHECK(got == WORKERS);

    OK(memprobe_source_new_process_tree(&rss));
    OK(memprobe_source_new_process_tree_smaps(MEMPROBE_SMAPS_PSS, &pss));
    OK(memprobe_source_new_process_tree_smaps(MEMPROBE_SMAPS_USS, &uss));
    OK(memprobe_source_get_info(pss, &info));
    CHECK(info.kind == MEMPROBE_SOURCE_KIND_PROCESS_TREE_PSS);
    CHECK(info.fidelity == MEMPROBE_FIDELITY_SAMPLED);
    CHECK(strcmp(info.name, "tree_pss") == 0);
    OK(memprobe_source_get_info(uss, &info));
    CHECK(info.kind == MEMPROBE_SOURCE_KIND_PROCESS_TREE_USS);
    CHECK(strcmp(info.name, "tree_uss") == 0);

    OK(memprobe_source_read(rss, &r));
    OK(memprobe_source_read(pss, &p));
    OK(memprobe_source_read(uss, &u));
    /* Measurements of a real kernel (under ASan or valgrind too, whose own
     * memory is shared the same way), so the checks leave room: the four
     * extra copies summed RSS counts (4 x 256 MiB) are at least 90% absent
     * from the PSS; the PSS holds the buffer once (at least 95% of it); the
     * shared buffer is at least 90% absent from the USS. */
    CHECK(r.used >= p.used + WORKERS * BUF_MIB * MIB * 9 / 10);
    CHECK(p.used >= BUF_MIB * MIB * 95 / 100);
    CHECK(p.used >= u.used + BUF_MIB * MIB * 9 / 10);
    CHECK(u.used > 0);
    printf("tree of %d processes: summed RSS %llu MiB, PSS %llu MiB, USS %llu MiB (buffer %d MiB)\n",
           WORKERS + 1, (unsigned long long)(r.used / MIB), (unsigned long long)(p.used / MIB),
           (unsigned long long)(u.used / MIB), BUF_MIB);

    {
        /* A window over the tree's PSS: sampled, its peak at least a reading. */
        memprobe_window *w = NULL;
        const memprobe_source *list[1];
        uint64_t peak = 0;
        list[0] = pss;
        OK(memprobe_window_open(list, 1, &w));
        OK(memprobe_window_peak(w, 0, &peak));
        CHECK(peak >= BUF_MIB * MIB * 95 / 100);
        FREE_OK(memprobe_window_free(w));
    }

    /* Workers that have ended are skipped: the buffer is the parent's
     * alone, so the tree's PSS still holds it once, and its USS now too. */
    for (i = 0; i < WORKERS; i++) {
        int st;
        kill(workers[i], SIGKILL);
        waitpid(workers[i], &st, 0);
    }
    OK(memprobe_source_read(pss, &p));
    OK(memprobe_source_read(uss, &u));
    CHECK(p.used >= BUF_MIB * MIB * 95 / 100);
    CHECK(u.used >= BUF_MIB * MIB * 95 / 100);

    FREE_OK(memprobe_source_free(rss));
    FREE_OK(memprobe_source_free(pss));
    FREE_OK(memprobe_source_free(uss));
    close(fds[0]);
    close(fds[1]);
    munmap(buf, len);
}

static void test_bad_input(void) {
    memprobe_source *s = NULL, *freed = NULL;
    memprobe_sample smp;
    memprobe_window *w = NULL;
    const memprobe_source *list[1];
    EXPECT(memprobe_source_new_process_tree_smaps(2, &s), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(memprobe_last_error(), "unknown smaps metric 2") != NULL);
    CHECK(s == NULL);
    EXPECT(memprobe_source_new_process_tree_smaps(0xffffffffu, &s), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_source_new_process_tree_smaps(MEMPROBE_SMAPS_PSS, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_process_tree_smaps(MEMPROBE_SMAPS_USS, NULL), MEMPROBE_STATUS_NULL_POINTER);
    /* A freed handle: every call on it is refused, never dereferenced. */
    OK(memprobe_source_new_process_tree_smaps(MEMPROBE_SMAPS_PSS, &freed));
    FREE_OK(memprobe_source_free(freed));
    EXPECT(memprobe_source_read(freed, &smp), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_source_free(freed), MEMPROBE_STATUS_INVALID_HANDLE);
    list[0] = freed;
    EXPECT(memprobe_window_open(list, 1, &w), MEMPROBE_STATUS_INVALID_HANDLE);
    CHECK(w == NULL);
    /* Wrong order: a window's peak after the window is freed. */
    OK(memprobe_source_new_process_tree_smaps(MEMPROBE_SMAPS_USS, &s));
    list[0] = s;
    OK(memprobe_window_open(list, 1, &w));
    FREE_OK(memprobe_window_free(w));
    {
        uint64_t peak = 0;
        EXPECT(memprobe_window_peak(w, 0, &peak), MEMPROBE_STATUS_INVALID_HANDLE);
    }
    EXPECT(memprobe_source_read(s, NULL), MEMPROBE_STATUS_NULL_POINTER);
    FREE_OK(memprobe_source_free(s));
}

int main(void) {
    uint64_t s = 1, w = 1, t = 1;
    test_shared_pages_count_once();
    test_bad_input();
    /* The window started the monitor thread: stop it before exiting. */
    OK(memprobe_monitor_stop());
    EXPECT(memprobe_debug_live_handles(&s, &w, &t, NULL), MEMPROBE_STATUS_OK);
    CHECK(s == 0 && w == 0 && t == 0);
    return check_summary();
}
