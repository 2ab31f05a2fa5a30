/* fork() while the monitor thread runs and another thread hammers memprobe:
 * the child's calls complete (no deadlock) and its readings are its own. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "spike.h"

static volatile int stop_hammer = 0;
static uint64_t value = 1;

static int32_t read_value(void *user_data, uint64_t *out) {
    *out = *(uint64_t *)user_data;
    return 0;
}

static void *hammer(void *arg) {
    memprobe_source *rss = (memprobe_source *)arg;
    const memprobe_source *srcs[1];
    srcs[0] = rss;
    while (!stop_hammer) {
        memprobe_window *w = NULL;
        memprobe_sample s;
        if (memprobe_window_open(srcs, 1, &w) == MEMPROBE_STATUS_OK) {
            memprobe_source_read(rss, &s);
            memprobe_window_free(w);
        }
    }
    return NULL;
}

static int child_body(memprobe_source *rss, memprobe_source *cb) {
    memprobe_window *w = NULL;
    memprobe_delta d;
    memprobe_monitor_stats st;
    uint64_t peak = 0;
    const memprobe_source *srcs[2];
    srcs[0] = rss;
    srcs[1] = cb;
    alarm(20); /* a deadlock kills the child instead of hanging the test */
    if (memprobe_window_open(srcs, 2, &w) != MEMPROBE_STATUS_OK) return 10;
    if (memprobe_window_measure(w, 0, &d) != MEMPROBE_STATUS_OK) return 11;
    if (!spike(64 * MIB)) return 16;
    if (memprobe_window_peak(w, 0, &peak) != MEMPROBE_STATUS_OK) return 12;
    if (peak < d.used_start + 64 * MIB - SLACK) return 13;
    if (memprobe_monitor_get_stats(&st) != MEMPROBE_STATUS_OK || !st.running) return 14;
    if (memprobe_window_free(w) != MEMPROBE_STATUS_OK) return 15;
    /* The child's own monitor thread: stop it before _exit. */
    if (memprobe_monitor_stop() != MEMPROBE_STATUS_OK) {
        fprintf(stderr, "child: %s\n", memprobe_last_error());
        return 16;
    }
    return 0;
}

int main(void) {
    memprobe_source *rss = NULL, *cb = NULL;
    memprobe_window *w = NULL;
    pthread_t th;
    int i, hammering;
    const memprobe_source *srcs[2];

    OK(memprobe_source_new_process(0, &rss));
    OK(memprobe_source_new_callback("value", read_value, &value, &cb));
    OK(memprobe_monitor_set_interval_ns(200000));
    srcs[0] = rss;
    srcs[1] = cb;
    OK(memprobe_window_open(srcs, 2, &w)); /* starts the monitor thread */
    /* GCC 12's libasan does not lock its allocator around fork(): a child that
     * allocates can deadlock on a lock another parent thread held. Under ASan
     * (MEMPROBE_FORK_NO_HAMMER=1) the fork is tested without that thread; the
     * plain and valgrind runs keep it. */
    hammering = getenv("MEMPROBE_FORK_NO_HAMMER") == NULL;
    if (hammering) CHECK(pthread_create(&th, NULL, hammer, rss) == 0);
    for (i = 0; i < 50; i++) {
        int status = 0;
        pid_t pid = fork();
        if (pid == 0) {
            /* End by exec: it also tests fork+exec, and it discards the image
             * without valgrind leak-checking copies of blocks that belong to
             * threads existing only in the parent. */
            char code[32];
            snprintf(code, sizeof code, "exit %d", child_body(rss, cb));
            execl("/bin/sh", "sh", "-c", code, (char *)NULL);
            _exit(127);
        }
        CHECK(pid > 0);
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            fprintf(stderr, "fork %d: child status %#x\n", i, status);
            break;
        }
    }
    stop_hammer = 1;
    if (hammering) pthread_join(th, NULL);
    FREE_OK(memprobe_window_free(w));
    OK(memprobe_monitor_stop());
    FREE_OK(memprobe_source_free(rss));
    FREE_OK(memprobe_source_free(cb));
    return check_summary();
}
