/* The training-loop tracker through the C ABI, on pushed (scripted) sources:
 * every phase kind, nesting errors, each sink's exact output, release
 * policies, OOM retry, leak flags, and bad input on every entry point. */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "check.h"

#define MIB ((uint64_t)1 << 20)

static memprobe_source *cpu, *gpu;
static int cache_calls = 0, gc_calls = 0, records_seen = 0, oom_attempts = 0;
static uint64_t last_index = 99;

static int32_t empty_cache(void *user_data) {
    memprobe_sample s;
    (void)user_data;
    cache_calls++;
    memprobe_source_read(gpu, &s);
    memprobe_source_push(gpu, s.used - 10 * MIB);
    return 0;
}
static int32_t collect(void *user_data) {
    (void)user_data;
    gc_calls++;
    return 0;
}
static int32_t failing(void *user_data) {
    (void)user_data;
    return 3;
}
static void on_record(const memprobe_phase_record *r, const memprobe_delta *d, size_t n, void *user_data) {
    (void)user_data;
    records_seen++;
    if (r->kind == MEMPROBE_PHASE_KIND_STEP && n == 2 && d[0].kind == MEMPROBE_SOURCE_KIND_CUSTOM) last_index = r->index;
}
static int32_t oom_twice(void *user_data) {
    (void)user_data;
    return ++oom_attempts <= 2 ? MEMPROBE_STEP_OUT_OF_MEMORY : MEMPROBE_STEP_DONE;
}
static int32_t step_fails(void *user_data) {
    (void)user_data;
    return 42;
}
static int32_t always_oom(void *user_data) {
    (void)user_data;
    return MEMPROBE_STEP_OUT_OF_MEMORY;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    static char buf[16384];
    size_t n;
    if (!f) return NULL;
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void epoch(memprobe_tracker *t, uint64_t grow_cpu, uint64_t blip_cpu, uint64_t grow_gpu, uint64_t blip_gpu) {
    memprobe_sample c, g;
    memprobe_source_read(cpu, &c);
    memprobe_source_read(gpu, &g);
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_source_push(cpu, c.used + (grow_cpu + blip_cpu) * MIB));
    OK(memprobe_source_push(gpu, g.used + (grow_gpu + blip_gpu) * MIB));
    OK(memprobe_source_push(cpu, c.used + grow_cpu * MIB));
    OK(memprobe_source_push(gpu, g.used + grow_gpu * MIB));
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
}

/* A table sink whose descriptor goes bad after it was added reports the
 * write errors where the other sinks report theirs (finish_sinks, free),
 * instead of OK; two host sources get their names, not "cpu" twice. */
static void test_table_sink_errors_and_labels(void) {
    memprobe_source *rss = NULL, *tree = NULL;
    const memprobe_source *two[2];
    memprobe_tracker *k = NULL;
    int fds[2];
    char text[512];
    ssize_t n;

    OK(memprobe_source_new_process(0, &rss));
    OK(memprobe_source_new_process_tree(&tree));
    two[0] = rss;
    two[1] = tree;
    OK(memprobe_tracker_new(two, 2, &k));
    CHECK(pipe(fds) == 0);
    OK(memprobe_tracker_add_table_sink(k, MEMPROBE_PHASE_KIND_EPOCH, fds[1]));
    OK(memprobe_tracker_begin(k, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_end(k, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    n = read(fds[0], text, sizeof text - 1);
    CHECK(n > 0);
    text[n > 0 ? n : 0] = 0;
    CHECK(strncmp(text, "epoch  rss used  peak  tree used  peak\n", 39) == 0);
    CHECK(strstr(text, "cpu") == NULL);
    OK(memprobe_tracker_finish_sinks(k));

    /* The descriptor closed under the sink: the error surfaces at finish. */
    OK(memprobe_tracker_add_table_sink(k, MEMPROBE_PHASE_KIND_EPOCH, fds[1]));
    close(fds[1]);
    OK(memprobe_tracker_begin(k, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_end(k, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    EXPECT(memprobe_tracker_finish_sinks(k), MEMPROBE_STATUS_IO);
    CHECK(strstr(memprobe_last_error(), "table sink") != NULL);
    /* Reported once: the sinks were detached. */
    OK(memprobe_tracker_finish_sinks(k));

    /* ... or at free, when finish_sinks was not called. */
    CHECK(pipe(fds) == 0);
    OK(memprobe_tracker_add_table_sink(k, MEMPROBE_PHASE_KIND_EPOCH, fds[1]));
    close(fds[0]); /* no reader: the write fails with EPIPE */
    OK(memprobe_tracker_begin(k, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_end(k, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    EXPECT(memprobe_tracker_free(k), MEMPROBE_STATUS_IO);
    close(fds[1]);
    FREE_OK(memprobe_source_free(rss));
    FREE_OK(memprobe_source_free(tree));
    /* The tree is sampled, so the monitor thread started; stop it, or a
     * leak checker reports the live thread's stack as possibly lost. */
    OK(memprobe_monitor_stop());
}

/* A table on fd 1 comes after what the program printed before it, though
 * stdout is fully buffered (rows used to land first), and numbers epochs
 * from 0 as the summary and the JSON do. */
static void test_table_rows_follow_buffered_stdout(void) {
    char path[] = "/tmp/memprobe-table-order-XXXXXX";
    memprobe_source *mem = NULL;
    memprobe_tracker *k = NULL;
    int file = mkstemp(path), saved;
    char *text;

    CHECK(file >= 0);
    fflush(stdout);
    saved = dup(1);
    CHECK(saved >= 0 && dup2(file, 1) == 1);
    setvbuf(stdout, NULL, _IOFBF, 8192);
    OK(memprobe_source_new_pushed("mem", &mem));
    OK(memprobe_tracker_new((const memprobe_source *const *)&mem, 1, &k));
    OK(memprobe_tracker_add_table_sink(k, MEMPROBE_PHASE_KIND_EPOCH, 1));
    printf("before\n");
    OK(memprobe_tracker_begin(k, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_end(k, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    printf("after\n");
    fflush(stdout);
    CHECK(dup2(saved, 1) == 1);
    close(saved);
    close(file);
    setvbuf(stdout, NULL, _IOLBF, 0);
    text = slurp(path);
    CHECK(text != NULL && strcmp(text, "before\n"
                                       "epoch  mem used  peak\n"
                                       "    0         0     0\n"
                                       "after\n") == 0);
    unlink(path);
    FREE_OK(memprobe_tracker_free(k));
    FREE_OK(memprobe_source_free(mem));
}

int main(void) {
    memprobe_tracker *t = NULL;
    const memprobe_source *srcs[2];
    memprobe_phase_record rec;
    memprobe_delta d[2];
    char dir[] = "/tmp/memprobe-tracker-XXXXXX", jsonl[128], csv[128], table[128];
    int table_fd, k;
    uint64_t fired = 0, freed[2] = {0, 0};
    bool flagged = true;
    uint32_t streak = 99;
    int64_t growth = 0;
    memprobe_oom_retry_result oom;
    char *text;

    signal(SIGPIPE, SIG_IGN); /* a table sink writing to a pipe with no reader */
    CHECK(mkdtemp(dir) != NULL);
    snprintf(jsonl, sizeof jsonl, "%s/run.jsonl", dir);
    snprintf(csv, sizeof csv, "%s/run.csv", dir);
    snprintf(table, sizeof table, "%s/table.txt", dir);
    OK(memprobe_source_new_pushed("cpu", &cpu));
    OK(memprobe_source_new_pushed("gpu0", &gpu));
    OK(memprobe_source_push(cpu, 500 * MIB));
    OK(memprobe_source_push(gpu, 1000 * MIB));
    srcs[0] = cpu;
    srcs[1] = gpu;

    EXPECT(memprobe_tracker_new(NULL, 2, &t), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_new(srcs, 0, &t), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(t == NULL); /* *out untouched on failure */
    EXPECT(memprobe_tracker_new(srcs, 2, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_tracker_new(srcs, 2, &t));

    /* Sinks, with bad input first. */
    table_fd = open(table, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(table_fd >= 0);
    EXPECT(memprobe_tracker_add_table_sink(t, 9, table_fd), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_add_table_sink(t, MEMPROBE_PHASE_KIND_EPOCH, -1), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_add_table_sink(NULL, MEMPROBE_PHASE_KIND_EPOCH, table_fd), MEMPROBE_STATUS_NULL_POINTER);
    {
        /* A descriptor that cannot be written is refused when it is given. */
        int ro = open(table, O_RDONLY);
        CHECK(ro >= 0);
        EXPECT(memprobe_tracker_add_table_sink(t, MEMPROBE_PHASE_KIND_EPOCH, ro), MEMPROBE_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(memprobe_last_error(), "reading only") != NULL);
        close(ro);
        EXPECT(memprobe_tracker_add_table_sink(t, MEMPROBE_PHASE_KIND_EPOCH, ro), MEMPROBE_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(memprobe_last_error(), "not an open file descriptor") != NULL);
    }
    OK(memprobe_tracker_add_table_sink(t, MEMPROBE_PHASE_KIND_EPOCH, table_fd));
    EXPECT(memprobe_tracker_add_jsonl_sink(t, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_add_jsonl_sink(t, "/nonexistent-dir/x.jsonl"), MEMPROBE_STATUS_UNAVAILABLE);
    OK(memprobe_tracker_add_jsonl_sink(t, jsonl));
    EXPECT(memprobe_tracker_add_csv_sink(t, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_tracker_add_csv_sink(t, csv));
    EXPECT(memprobe_tracker_add_callback_sink(t, NULL, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_tracker_add_callback_sink(t, on_record, NULL));

    /* Every phase kind, nested; records through the out-pointers. */
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STREAM, NULL));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EXPERIENCE, NULL));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_CUSTOM, "eval-forward"));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
    OK(memprobe_source_push(gpu, 1300 * MIB));
    OK(memprobe_source_push(gpu, 1000 * MIB));
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, d, 2));
    CHECK(rec.kind == MEMPROBE_PHASE_KIND_STEP && rec.depth == 3 && rec.index == 0 && rec.n_sources == 2);
    CHECK(strcmp(rec.name, "step") == 0 && rec.duration_ns == rec.ended_at_ns - rec.started_at_ns);
    CHECK(d[1].peak == 1300 * MIB && d[1].delta_peaked == 300 * MIB && d[1].fidelity == MEMPROBE_FIDELITY_PUSHED);
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_CUSTOM, "eval-forward", &rec, NULL, 0));
    CHECK(strcmp(rec.name, "eval-forward") == 0 && rec.kind == MEMPROBE_PHASE_KIND_CUSTOM);
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EXPERIENCE, NULL, NULL, d, 1));
    CHECK(d[0].kind == MEMPROBE_SOURCE_KIND_CUSTOM);
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STREAM, NULL, &rec, d, 2));
    CHECK(d[1].peak == 1300 * MIB);

    /* Nesting errors, unknown kinds, names: an error and nothing changes. */
    EXPECT(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0), MEMPROBE_STATUS_WRONG_ORDER);
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
    EXPECT(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0), MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(strstr(memprobe_last_error(), "innermost open phase is step") != NULL);
    EXPECT(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_tracker_begin(t, 7, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_CUSTOM, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, "named"), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_end(t, 7, NULL, NULL, NULL, 0), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_tracker_begin(NULL, MEMPROBE_PHASE_KIND_STEP, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_end(NULL, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_next(NULL, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, NULL, 0));
    CHECK(rec.index == 1);
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));

    /* Two scripted epochs for the sinks (fastai's PeakMemMetric example). */
    epoch(t, 0, 2, 80, 6220);
    epoch(t, 0, 2, 2, 914);
    OK(memprobe_tracker_finish_sinks(t));
    text = slurp(table);
    CHECK(text != NULL && strcmp(text,
                                 "epoch  cpu used  peak  gpu0 used  peak\n"
                                 "    0         0     0          0     0\n"
                                 "    1         0     2         80  6220\n"
                                 "    2         0     2          2   914\n") == 0);
    text = slurp(jsonl);
    CHECK(text != NULL && strstr(text, "{\"label\":\"step\",\"phase\":{\"kind\":\"step\",\"name\":\"step\",\"index\":0,\"depth\":3}") == text);
    CHECK(text != NULL && strstr(text, "\"name\":\"gpu0\",\"kind\":\"custom\",\"fidelity\":\"pushed\",\"used_start\":1048576000,\"used_end\":1048576000,\"peak\":1363148800,\"delta_used\":0,\"delta_peaked\":314572800}") != NULL);
    text = slurp(csv);
    CHECK(text != NULL && strncmp(text, "label,phase,index,depth,started_at_ns,", 38) == 0);
    CHECK(records_seen == 8 && last_index == 1);

    /* Release policies: (index + 1) % N, GC on request, thresholds, now. */
    EXPECT(memprobe_tracker_add_release(t, "x", 5, empty_cache, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_add_release(t, NULL, MEMPROBE_RELEASE_CACHE, empty_cache, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_add_release(t, "x", MEMPROBE_RELEASE_CACHE, NULL, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_tracker_add_release(t, "empty_cache", MEMPROBE_RELEASE_CACHE, empty_cache, NULL));
    OK(memprobe_tracker_add_release(t, "gc", MEMPROBE_RELEASE_GC, collect, NULL));
    EXPECT(memprobe_tracker_release_every(t, MEMPROBE_PHASE_KIND_STEP, 0, false), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_release_every(t, MEMPROBE_PHASE_KIND_STREAM, 2, false), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_tracker_release_every(t, 11, 2, false), MEMPROBE_STATUS_INVALID_ARGUMENT);
    OK(memprobe_tracker_release_every(t, MEMPROBE_PHASE_KIND_STEP, 3, false));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
    for (k = 2; k < 10; k++) { /* step indexes 2..9 (0 and 1 ended above) */
        OK(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, NULL, 0));
        CHECK(rec.index == (uint64_t)k);
        CHECK(rec.n_releases == ((k + 1) % 3 == 0 ? 1u : 0u));
        if (rec.n_releases) CHECK(rec.released_bytes == 10 * MIB);
    }
    CHECK(cache_calls == 3 && gc_calls == 0); /* indexes 2, 5, 8 */
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0));
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    OK(memprobe_tracker_releases_fired(t, &fired));
    CHECK(fired == 3);
    EXPECT(memprobe_tracker_releases_fired(t, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_tracker_release_now(t, true, freed, 2));
    CHECK(gc_calls == 1 && freed[0] == 0 && freed[1] == 10 * MIB);
    EXPECT(memprobe_tracker_release_below_free(t, 2, 1, false), MEMPROBE_STATUS_INVALID_ID);
    {
        /* Threshold on system RAM: free < 2^63 always fires. */
        memprobe_source *sys = NULL;
        memprobe_tracker *t2 = NULL;
        const memprobe_source *one[1];
        OK(memprobe_source_new_system_ram(&sys));
        one[0] = sys;
        OK(memprobe_tracker_new(one, 1, &t2));
        OK(memprobe_tracker_add_release(t2, "empty_cache", MEMPROBE_RELEASE_CACHE, collect, NULL));
        FREE_OK(memprobe_tracker_release_below_free(t2, 0, (uint64_t)1 << 63, false));
        OK(memprobe_tracker_begin(t2, MEMPROBE_PHASE_KIND_STEP, NULL));
        OK(memprobe_tracker_end(t2, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, NULL, 0));
        CHECK(rec.n_releases == 1);
        OK(memprobe_tracker_add_release(t2, "failing", MEMPROBE_RELEASE_CACHE, failing, NULL));
        EXPECT(memprobe_tracker_release_now(t2, false, NULL, 0), MEMPROBE_STATUS_UNAVAILABLE);
        CHECK(strstr(memprobe_last_error(), "failing: ") != NULL);
        FREE_OK(memprobe_tracker_free(t2));
        FREE_OK(memprobe_source_free(sys));
    }

    /* OOM recovery. */
    EXPECT(memprobe_tracker_run_oom_retry(t, oom_twice, NULL, 5, NULL, NULL, 0), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_run_oom_retry(t, NULL, NULL, 5, &oom, NULL, 0), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_tracker_run_oom_retry(t, oom_twice, NULL, 5, &oom, freed, 2));
    CHECK(oom.succeeded && oom.retries == 2 && oom.freed_bytes == 20 * MIB && freed[1] == 20 * MIB);
    /* Every try out of memory: its own status (a caller checking only the
     * status sees it), and the report still written. */
    memset(&oom, 0xAB, sizeof oom);
    EXPECT(memprobe_tracker_run_oom_retry(t, always_oom, NULL, 1, &oom, NULL, 0), MEMPROBE_STATUS_OUT_OF_MEMORY);
    CHECK(!oom.succeeded && oom.retries == 1);
    CHECK(strstr(memprobe_last_error(), "still ran out of memory after 1 retries") != NULL);
    EXPECT(memprobe_tracker_run_oom_retry(t, always_oom, NULL, 0, &oom, NULL, 0), MEMPROBE_STATUS_OUT_OF_MEMORY);
    CHECK(!oom.succeeded && oom.retries == 0);
    /* freed[] with a capacity of SIZE_MAX: only the 2 sources written. */
    {
        uint64_t f3[3] = {7, 7, 7};
        oom_attempts = 0;
        OK(memprobe_tracker_run_oom_retry(t, oom_twice, NULL, 5, &oom, f3, SIZE_MAX));
        CHECK(f3[1] == 20 * MIB && f3[2] == 7);
        f3[2] = 7;
        OK(memprobe_tracker_release_now(t, false, f3, SIZE_MAX));
        CHECK(f3[1] == 10 * MIB && f3[2] == 7);
    }
    EXPECT(memprobe_tracker_run_oom_retry(t, step_fails, NULL, 1, &oom, NULL, 0), MEMPROBE_STATUS_UNAVAILABLE);

    /* Leak trend: on after 2 growing epochs, off after a flat one. */
    EXPECT(memprobe_tracker_leak_status(t, 5, &flagged, NULL, NULL), MEMPROBE_STATUS_INVALID_ID);
    OK(memprobe_tracker_set_leak_policy(t, MIB, 2));
    epoch(t, 5, 0, 0, 0);
    epoch(t, 5, 0, 0, 0);
    OK(memprobe_tracker_leak_status(t, 0, &flagged, &streak, &growth));
    CHECK(!flagged && streak == 1 && growth == (int64_t)(5 * MIB));
    epoch(t, 5, 0, 0, 0);
    OK(memprobe_tracker_leak_status(t, 0, &flagged, &streak, NULL));
    CHECK(flagged && streak == 2);
    OK(memprobe_tracker_leak_status(t, 1, &flagged, NULL, NULL));
    CHECK(!flagged);
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, &rec, NULL, 0));
    CHECK(rec.leak_flags == 0);
    OK(memprobe_tracker_leak_status(t, 0, &flagged, NULL, NULL));
    CHECK(!flagged);
    OK(memprobe_tracker_set_leak_policy(t, 0, 0));

    test_table_sink_errors_and_labels();
    test_table_rows_follow_buffered_stdout();

    /* Handles: stale, forged, wrong type; free(NULL). */
    FREE_OK(memprobe_tracker_free(t));
    EXPECT(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_tracker_free(t), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_tracker_finish_sinks((memprobe_tracker *)cpu), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_tracker_set_leak_policy((memprobe_tracker *)(uintptr_t)77, 1, 1), MEMPROBE_STATUS_INVALID_HANDLE);
    FREE_OK(memprobe_tracker_free(NULL));
    close(table_fd);
    unlink(table);
    unlink(jsonl);
    unlink(csv);
    rmdir(dir);
    FREE_OK(memprobe_source_free(cpu));
    FREE_OK(memprobe_source_free(gpu));
    return check_summary();
}
