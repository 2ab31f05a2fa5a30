/* Where an out-of-memory report (and any output to a caller's descriptor)
 * goes: a path ending in '/' or naming a directory is refused when the
 * report is configured; a descriptor that is a pipe whose reader is gone
 * fails the write with MEMPROBE_STATUS_IO instead of killing this program
 * with SIGPIPE (left at its default disposition here, as in most C
 * programs); memprobe_tracker_run_oom_retry that runs out of retries writes
 * the armed report. Needs $OOM_TEST_DIR (tests/tests/c_abi.rs sets it). */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"

static char dir[512];

static const char *in_dir(const char *name) {
    static char paths[4][600];
    static int next = 0;
    char *p = paths[next++ % 4];
    snprintf(p, 600, "%s/%s", dir, name);
    return p;
}

static int error_has(const char *needle) {
    int ok = strstr(memprobe_last_error(), needle) != NULL;
    if (!ok) fprintf(stderr, "missing '%s' in '%s'\n", needle, memprobe_last_error());
    return ok;
}

static void options(memprobe_oom_report_options *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->triggers = MEMPROBE_OOM_TRIGGER_CALLER;
    o->path = path;
}

/* A pipe whose read end is closed: every write raises SIGPIPE / EPIPE. */
static int broken_pipe(void) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    close(fds[0]);
    return fds[1];
}

static int sigpipe_pending(void) {
    sigset_t set;
    sigpending(&set);
    return sigismember(&set, SIGPIPE);
}

static void paths(memprobe_tracker *t) {
    memprobe_oom_report_options o;
    memprobe_oom_report_status st;
    options(&o, in_dir("not-yet/"));
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(error_has("ends with '/'"));
    options(&o, in_dir("not-yet/."));
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    options(&o, dir);
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(error_has("is a directory"));
    /* Nothing configured by the refused calls. */
    EXPECT(memprobe_tracker_oom_status(t, &st), MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(access(in_dir("not-yet"), F_OK) != 0);
}

static void pipe_without_reader(memprobe_tracker *t, memprobe_source *alloc) {
    memprobe_oom_report_options o;
    memprobe_oom_report_status st;
    memprobe_trace *trace;
    int fd = broken_pipe();
    CHECK(fd > 2);
    options(&o, in_dir("piped.json"));
    o.summary_fd = fd;
    OK(memprobe_tracker_set_oom_report(t, &o));
    EXPECT(memprobe_tracker_report_oom(t, 0, 1 << 20, "CUDA out of memory"), MEMPROBE_STATUS_IO);
    CHECK(error_has("summary"));
    CHECK(!sigpipe_pending());
    /* The file destination was written all the same, and the failure kept. */
    CHECK(access(in_dir("piped.json"), F_OK) == 0);
    OK(memprobe_tracker_oom_status(t, &st));
    CHECK(st.reports_written == 1 && st.last_write_status == MEMPROBE_STATUS_IO);
    OK(memprobe_tracker_set_oom_report(t, NULL));

    /* A trace printing to it, and a table sink. */
    OK(memprobe_trace_new((const memprobe_source *const *)&alloc, 1, NULL, 0, &trace));
    OK(memprobe_trace_set_output_fd(trace, fd));
    EXPECT(memprobe_trace_report(trace, "x"), MEMPROBE_STATUS_IO);
    CHECK(!sigpipe_pending());
    FREE_OK(memprobe_trace_free(trace));
    OK(memprobe_tracker_add_table_sink(t, MEMPROBE_PHASE_KIND_EPOCH, fd));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    EXPECT(memprobe_tracker_finish_sinks(t), MEMPROBE_STATUS_IO);
    CHECK(!sigpipe_pending());
    close(fd);
}

static int tries = 0;
static int32_t always_oom(void *user_data) {
    (void)user_data;
    tries++;
    return MEMPROBE_STEP_OUT_OF_MEMORY;
}

static void retries_exhausted(memprobe_tracker *t) {
    memprobe_oom_report_options o;
    memprobe_oom_retry_result r;
    memprobe_oom_report_status st;
    FILE *f;
    char buf[65536];
    size_t n;
    unlink(in_dir("retry.json"));
    options(&o, in_dir("retry.json"));
    OK(memprobe_tracker_set_oom_report(t, &o));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
    EXPECT(memprobe_tracker_run_oom_retry(t, always_oom, NULL, 2, &r, NULL, 0),
           MEMPROBE_STATUS_OUT_OF_MEMORY);
    CHECK(tries == 3 && !r.succeeded && r.retries == 2);
    OK(memprobe_tracker_oom_status(t, &st));
    CHECK(st.reports_written == 1 && st.triggers_seen == 1 && !st.armed);
    f = fopen(in_dir("retry.json"), "r");
    CHECK(f != NULL);
    if (f) {
        n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        CHECK(strstr(buf, "\"reported_by\":\"run_oom_retry\"") != NULL);
        CHECK(strstr(buf, "after 2 retries") != NULL);
        CHECK(strstr(buf, "\"kind\":\"step\"") != NULL);
    }
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0));
    OK(memprobe_tracker_set_oom_report(t, NULL));
}

int main(void) {
    memprobe_source *alloc;
    memprobe_tracker *t;
    const char *env = getenv("OOM_TEST_DIR");
    if (!env) {
        fprintf(stderr, "OOM_TEST_DIR is not set\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", env);
    mkdir(dir, 0700);
    signal(SIGPIPE, SIG_DFL);

    OK(memprobe_source_new_pushed("torch_alloc:0", &alloc));
    OK(memprobe_tracker_new((const memprobe_source *const *)&alloc, 1, &t));
    paths(t);
    retries_exhausted(t);
    pipe_without_reader(t, alloc);
    FREE_OK(memprobe_tracker_free(t));
    FREE_OK(memprobe_source_free(alloc));
    return check_summary();
}
