/* fork() from inside memprobe callbacks (a custom source's read function, a
 * tracker's release callback): the child's calls on other objects work, a
 * call back into the object running the callback is refused (WRONG_ORDER)
 * instead of deadlocking, and the child can exec. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static memprobe_source *cb_source;
static memprobe_tracker *busy_tracker;
static int child_status = -1;

static int child_body(void) {
    memprobe_source *p = NULL, *rss = NULL;
    memprobe_window *w = NULL;
    memprobe_sample s;
    const memprobe_source *srcs[2];
    alarm(20);
    if (memprobe_source_new_pushed("child", &p) != MEMPROBE_STATUS_OK) return 10;
    if (memprobe_source_new_process(0, &rss) != MEMPROBE_STATUS_OK) return 11;
    srcs[0] = p;
    srcs[1] = rss;
    if (memprobe_window_open(srcs, 2, &w) != MEMPROBE_STATUS_OK) return 12;
    if (memprobe_source_push(p, 77) != MEMPROBE_STATUS_OK) return 13;
    if (memprobe_source_read(rss, &s) != MEMPROBE_STATUS_OK || s.used == 0) return 14;
    if (busy_tracker != NULL) {
        /* A new tracker in the child works. */
        memprobe_tracker *t2 = NULL;
        if (memprobe_tracker_new(srcs, 1, &t2) != MEMPROBE_STATUS_OK) return 18;
        if (memprobe_tracker_begin(t2, MEMPROBE_PHASE_KIND_STEP, NULL) != MEMPROBE_STATUS_OK) return 19;
        if (memprobe_tracker_free(t2) != MEMPROBE_STATUS_OK) return 20;
    }
    /* The object whose callback is running on this thread: refused, not a deadlock. */
    if (busy_tracker == NULL && memprobe_source_read(cb_source, &s) != MEMPROBE_STATUS_WRONG_ORDER) return 15;
    if (busy_tracker != NULL &&
        memprobe_tracker_begin(busy_tracker, MEMPROBE_PHASE_KIND_STEP, NULL) != MEMPROBE_STATUS_WRONG_ORDER)
        return 17;
    if (memprobe_window_free(w) != MEMPROBE_STATUS_OK) return 16;
    memprobe_source_free(p);
    memprobe_source_free(rss);
    return 0;
}

static void fork_here(void) {
    pid_t pid = fork();
    if (pid == 0) {
        char code[32];
        snprintf(code, sizeof code, "exit %d", child_body());
        execl("/bin/sh", "sh", "-c", code, (char *)NULL);
        _exit(127);
    }
    if (pid > 0) waitpid(pid, &child_status, 0);
}

static int32_t read_and_fork(void *user_data, uint64_t *out) {
    (void)user_data;
    fork_here();
    *out = 42;
    return 0;
}

static int32_t release_and_fork(void *user_data) {
    (void)user_data;
    fork_here();
    return 0;
}

int main(void) {
    memprobe_sample s;
    memprobe_tracker *t = NULL;
    const memprobe_source *srcs[1];

    OK(memprobe_source_new_callback("forker", read_and_fork, NULL, &cb_source));
    OK(memprobe_source_read(cb_source, &s));
    CHECK(s.used == 42);
    CHECK(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0);
    if (!(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0))
        fprintf(stderr, "read callback fork: child status %#x\n", child_status);

    {
        memprobe_source *plain = NULL;
        OK(memprobe_source_new_pushed("plain", &plain));
        srcs[0] = plain;
        child_status = -1;
        OK(memprobe_tracker_new(srcs, 1, &t));
        busy_tracker = t;
        OK(memprobe_tracker_add_release(t, "forker", MEMPROBE_RELEASE_CACHE, release_and_fork, NULL));
        OK(memprobe_tracker_release_now(t, false, NULL, 0));
        FREE_OK(memprobe_source_free(plain));
    }
    CHECK(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0);
    if (!(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0))
        fprintf(stderr, "release callback fork: child status %#x\n", child_status);
    FREE_OK(memprobe_tracker_free(t));
    FREE_OK(memprobe_source_free(cb_source));
    return check_summary();
}
