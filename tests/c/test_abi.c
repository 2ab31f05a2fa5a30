/* The C ABI end to end: every entry point with good input, NULL, invalid and
 * stale handles, unknown enum values and wrong call orders. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "check.h"
#include "spike.h"

static int32_t read_counter(void *user_data, uint64_t *out) {
    *out = *(uint64_t *)user_data;
    return 0;
}

static int32_t read_fails(void *user_data, uint64_t *out) {
    (void)user_data;
    (void)out;
    return 7;
}

static char lines[4][256];
static int n_lines = 0;
static void on_line(const char *line, void *user_data) {
    (void)user_data;
    if (n_lines < 4) strncpy(lines[n_lines++], line, sizeof lines[0] - 1);
}

static void test_basics(void) {
    CHECK(strcmp(memprobe_status_name(MEMPROBE_STATUS_OK), "ok") == 0);
    CHECK(strcmp(memprobe_status_name(9999), "unknown status") == 0);
    CHECK(strlen(memprobe_version()) >= 5);
    CHECK(strncmp(memprobe_soname(), "libmemprobe.so.", 15) == 0);
    CHECK(memprobe_b2mb(3 * MIB + 5) == 3);
    /* Signed: toward zero like fastai's int(num / 2**20), INT64_MIN included. */
    CHECK(memprobe_b2mb_signed((int64_t)(3 * MIB + 5)) == 3);
    CHECK(memprobe_b2mb_signed(-(int64_t)MIB + 1) == 0);
    CHECK(memprobe_b2mb_signed(-(int64_t)MIB - 1) == -1);
    CHECK(memprobe_b2mb_signed(INT64_MIN) == -((int64_t)1 << 43));
    CHECK(memprobe_b2mb_signed(INT64_MAX) == ((int64_t)1 << 43) - 1);
    CHECK(strcmp(memprobe_status_name(MEMPROBE_STATUS_OUT_OF_MEMORY), "out of memory") == 0);
    CHECK(memprobe_last_error()[0] == '\0');
}

/* Every *_free leaves the thread's last error alone when it succeeds (a
 * finaliser may run between a failed call and memprobe_last_error), and
 * reports its own failure when it fails. */
static void test_free_keeps_last_error(void) {
    memprobe_source *p = NULL;
    memprobe_window *w = NULL;
    memprobe_trace *t = NULL;
    memprobe_tracker *k = NULL;
    const memprobe_source *srcs[1];
    char msg[256];

    OK(memprobe_source_new_pushed("p", &p));
    srcs[0] = p;
    OK(memprobe_window_open(srcs, 1, &w));
    OK(memprobe_trace_new(srcs, 1, NULL, MEMPROBE_TRACE_SILENT, &t));
    OK(memprobe_tracker_new(srcs, 1, &k));
    EXPECT(memprobe_window_peak(w, 7, NULL), MEMPROBE_STATUS_NULL_POINTER);
    snprintf(msg, sizeof msg, "%s", memprobe_last_error());
    CHECK(strstr(msg, "memprobe_window_peak") != NULL);
    FREE_OK(memprobe_window_free(w));
    FREE_OK(memprobe_trace_free(t));
    FREE_OK(memprobe_tracker_free(k));
    FREE_OK(memprobe_source_free(NULL));
    FREE_OK(memprobe_window_free(NULL));
    FREE_OK(memprobe_trace_free(NULL));
    FREE_OK(memprobe_tracker_free(NULL));
    FREE_OK(memprobe_exporter_free(NULL));
    FREE_OK(memprobe_gpu_device_free(NULL));
    FREE_OK(memprobe_mark_group_free(NULL));
    FREE_OK(memprobe_source_free(p));
    CHECK(strcmp(memprobe_last_error(), msg) == 0);
    /* A failed free reports its own error. */
    EXPECT(memprobe_source_free(p), MEMPROBE_STATUS_INVALID_HANDLE);
    CHECK(strstr(memprobe_last_error(), "memprobe_source_free") != NULL);
    /* Calls that return no status leave it alone (the header says which). */
    snprintf(msg, sizeof msg, "%s", memprobe_last_error());
    CHECK(memprobe_version()[0] != '\0');
    CHECK(memprobe_soname()[0] != '\0');
    CHECK(memprobe_b2mb(3u << 20) == 3);
    CHECK(memprobe_b2mb_signed(-(3 << 20)) == -3);
    CHECK(memprobe_status_name(MEMPROBE_STATUS_OK)[0] != '\0');
    CHECK(strcmp(memprobe_last_error(), msg) == 0);
    /* Any other successful call clears it, as before. */
    OK(memprobe_debug_live_handles(NULL, NULL, NULL, NULL));
    CHECK(memprobe_last_error()[0] == '\0');
}

static void test_sources(void) {
    memprobe_source *rss = NULL, *tree = NULL, *sys = NULL, *pushed = NULL, *cb = NULL, *bad = NULL;
    memprobe_sample s;
    memprobe_source_info info;
    uint64_t counter = 42;

    EXPECT(memprobe_source_new_process(0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_process(0x80, &bad), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(bad == NULL);
    OK(memprobe_source_new_process(0, &rss));
    OK(memprobe_source_read(rss, &s));
    CHECK(s.used > MIB && s.taken_at_ns > 0 && s.valid == 0);
    OK(memprobe_source_get_info(rss, &info));
    CHECK(info.kind == MEMPROBE_SOURCE_KIND_PROCESS && info.fidelity == MEMPROBE_FIDELITY_EXACT);
    CHECK(strcmp(info.name, "rss") == 0);
    EXPECT(memprobe_source_read(rss, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_read(NULL, &s), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_get_info(NULL, &info), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_get_info(rss, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_push(rss, 5), MEMPROBE_STATUS_UNSUPPORTED);

    OK(memprobe_source_new_process_tree(&tree));
    OK(memprobe_source_read(tree, &s));
    CHECK(s.used > MIB);
    OK(memprobe_source_new_system_ram(&sys));
    OK(memprobe_source_read(sys, &s));
    CHECK((s.valid & MEMPROBE_SAMPLE_TOTAL) && (s.valid & MEMPROBE_SAMPLE_FREE) && s.total > s.used);
    EXPECT(memprobe_source_new_process_tree(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_system_ram(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_cgroup(NULL), MEMPROBE_STATUS_NULL_POINTER);
    {
        memprobe_source *cg = NULL;
        memprobe_status st = memprobe_source_new_cgroup(&cg);
        CHECK(st == MEMPROBE_STATUS_OK || st == MEMPROBE_STATUS_UNAVAILABLE);
        if (st == MEMPROBE_STATUS_OK) {
            OK(memprobe_source_read(cg, &s));
            CHECK(s.used > 0);
        } else {
            CHECK(strlen(memprobe_last_error()) > 10);
        }
        FREE_OK(memprobe_source_free(cg));
    }
    {
        memprobe_source *pss = NULL;
        EXPECT(memprobe_source_new_smaps(2, &pss), MEMPROBE_STATUS_INVALID_ARGUMENT);
        EXPECT(memprobe_source_new_smaps(MEMPROBE_SMAPS_PSS, NULL), MEMPROBE_STATUS_NULL_POINTER);
        OK(memprobe_source_new_smaps(MEMPROBE_SMAPS_USS, &pss));
        OK(memprobe_source_read(pss, &s));
        CHECK(s.used > 0);
        FREE_OK(memprobe_source_free(pss));
    }

    EXPECT(memprobe_source_new_pushed(NULL, &pushed), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_pushed("", &pushed), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_source_new_pushed("\xff\xfe", &pushed), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_source_new_pushed("alloc", NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_source_new_pushed("alloc", &pushed));
    OK(memprobe_source_push(pushed, 123));
    OK(memprobe_source_read(pushed, &s));
    CHECK(s.used == 123);
    EXPECT(memprobe_source_push(NULL, 1), MEMPROBE_STATUS_NULL_POINTER);

    EXPECT(memprobe_source_new_callback("cb", NULL, &counter, &cb), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_callback(NULL, read_counter, &counter, &cb), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_source_new_callback("cb", read_counter, &counter, &cb));
    OK(memprobe_source_read(cb, &s));
    CHECK(s.used == 42);
    {
        memprobe_source *failing = NULL;
        OK(memprobe_source_new_callback("fails", read_fails, NULL, &failing));
        EXPECT(memprobe_source_read(failing, &s), MEMPROBE_STATUS_UNAVAILABLE);
        CHECK(strstr(memprobe_last_error(), "returned 7") != NULL);
        FREE_OK(memprobe_source_free(failing));
    }

    /* Handles: free(NULL), double free, use after free, forged, wrong type. */
    FREE_OK(memprobe_source_free(NULL));
    FREE_OK(memprobe_source_free(pushed));
    EXPECT(memprobe_source_free(pushed), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_source_read(pushed, &s), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_source_read((memprobe_source *)(uintptr_t)0x1234, &s), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_source_read((memprobe_source *)&s, &s), MEMPROBE_STATUS_INVALID_HANDLE);
    {
        /* A freed handle whose slot was reused by a new source stays invalid. */
        memprobe_source *again = NULL;
        OK(memprobe_source_new_pushed("again", &again));
        EXPECT(memprobe_source_push(pushed, 1), MEMPROBE_STATUS_INVALID_HANDLE);
        OK(memprobe_source_push(again, 1));
        FREE_OK(memprobe_source_free(again));
    }
    FREE_OK(memprobe_source_free(rss));
    FREE_OK(memprobe_source_free(tree));
    FREE_OK(memprobe_source_free(sys));
    FREE_OK(memprobe_source_free(cb));
}

/* memprobe_source_read_used: the bytes alone, counted towards open windows. */
static void test_read_used(void) {
    memprobe_source *rss = NULL, *pushed = NULL, *cb = NULL, *failing = NULL;
    memprobe_window *w = NULL;
    memprobe_sample s;
    uint64_t used = 0, peak = 0, counter = 42;
    const memprobe_source *one[1];

    OK(memprobe_source_new_process(0, &rss));
    OK(memprobe_source_read_used(rss, &used));
    OK(memprobe_source_read(rss, &s));
    CHECK(used > MIB && used + SLACK > s.used && s.used + SLACK > used);
    EXPECT(memprobe_source_read_used(rss, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_read_used(NULL, &used), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_read_used((memprobe_source *)(uintptr_t)0x1234, &used),
           MEMPROBE_STATUS_INVALID_HANDLE);

    OK(memprobe_source_new_pushed("alloc", &pushed));
    OK(memprobe_source_read_used(pushed, &used));
    CHECK(used == 0);
    OK(memprobe_source_push(pushed, 77));
    OK(memprobe_source_read_used(pushed, &used));
    CHECK(used == 77);

    /* A sampled source: the value read_used saw is in the window's peak. */
    OK(memprobe_source_new_callback("cb", read_counter, &counter, &cb));
    one[0] = cb;
    OK(memprobe_window_open(one, 1, &w));
    counter = 1000;
    OK(memprobe_source_read_used(cb, &used));
    CHECK(used == 1000);
    counter = 5;
    OK(memprobe_window_peak(w, 0, &peak));
    CHECK(peak == 1000);
    /* A window handle is not a source. */
    EXPECT(memprobe_source_read_used((const memprobe_source *)w, &used), MEMPROBE_STATUS_INVALID_HANDLE);

    /* A failing read leaves the caller's value alone and says why. */
    OK(memprobe_source_new_callback("fails", read_fails, NULL, &failing));
    used = 0xdead;
    EXPECT(memprobe_source_read_used(failing, &used), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(used == 0xdead && strstr(memprobe_last_error(), "returned 7") != NULL);

    FREE_OK(memprobe_window_free(w));
    FREE_OK(memprobe_source_free(failing));
    FREE_OK(memprobe_source_free(cb));
    FREE_OK(memprobe_source_free(pushed));
    EXPECT(memprobe_source_read_used(pushed, &used), MEMPROBE_STATUS_INVALID_HANDLE);
    FREE_OK(memprobe_source_free(rss));
}

static void test_windows(void) {
    memprobe_source *rss = NULL, *p = NULL;
    memprobe_window *outer = NULL, *inner = NULL, *sibling = NULL, *bad = NULL;
    memprobe_delta d;
    uint64_t peak = 0, start;
    size_t n = 0;
    const memprobe_source *both[2];

    OK(memprobe_source_new_process(0, &rss));
    OK(memprobe_source_new_pushed("p", &p));
    both[0] = rss;
    both[1] = p;
    EXPECT(memprobe_window_open(NULL, 1, &outer), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_window_open(both, 0, &outer), MEMPROBE_STATUS_INVALID_ARGUMENT);
    /* An empty list is INVALID_ARGUMENT whether or not its pointer is NULL
     * (C++'s empty vector gives NULL). */
    EXPECT(memprobe_window_open(NULL, 0, &outer), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_window_open(both, 2, NULL), MEMPROBE_STATUS_NULL_POINTER);
    {
        const memprobe_source *with_null[2] = {rss, NULL};
        EXPECT(memprobe_window_open(with_null, 2, &bad), MEMPROBE_STATUS_NULL_POINTER);
        CHECK(bad == NULL);
    }
    OK(memprobe_window_open(both, 2, &outer));
    OK(memprobe_window_source_count(outer, &n));
    CHECK(n == 2);
    OK(memprobe_window_open(both, 1, &inner));
    OK(memprobe_window_measure(inner, 0, &d));
    start = d.used_start;
    CHECK(spike(256 * MIB));
    OK(memprobe_window_peak(inner, 0, &peak));
    CHECK(peak >= start + 256 * MIB - SLACK);
    FREE_OK(memprobe_window_free(inner));
    OK(memprobe_window_open(both, 1, &sibling));
    OK(memprobe_window_peak(sibling, 0, &peak));
    CHECK(peak < start + 128 * MIB);
    OK(memprobe_window_peak(outer, 0, &peak));
    CHECK(peak >= start + 256 * MIB - SLACK);
    OK(memprobe_window_measure(outer, 0, &d));
    CHECK(d.fidelity == MEMPROBE_FIDELITY_EXACT && d.kind == MEMPROBE_SOURCE_KIND_PROCESS);
    CHECK(d.delta_peaked >= 200 * MIB);

    /* Reset ends the interval (reported through `ended`) and starts the next. */
    {
        memprobe_delta ended[3];
        unsigned char guard[sizeof ended];
        memset(ended, 0, sizeof ended);
        OK(memprobe_window_reset(outer, ended, 1));
        CHECK(ended[0].peak >= start + 256 * MIB - SLACK && ended[0].fidelity == MEMPROBE_FIDELITY_EXACT);
        CHECK(ended[1].peak == 0); /* n_ended = 1: nothing written past it */
        /* A capacity of SIZE_MAX (or in bytes): only the window's 2 sources
         * are written, never the capacity claimed. */
        memset(ended, 0xAB, sizeof ended);
        memset(guard, 0xAB, sizeof guard);
        OK(memprobe_window_reset(outer, ended, SIZE_MAX));
        CHECK(ended[1].fidelity == MEMPROBE_FIDELITY_PUSHED);
        CHECK(memcmp(&ended[2], guard, sizeof ended[2]) == 0);
        memset(ended, 0xAB, sizeof ended);
        OK(memprobe_window_reset(outer, ended, sizeof ended));
        CHECK(memcmp(&ended[2], guard, sizeof ended[2]) == 0);
    }
    OK(memprobe_window_peak(outer, 0, &peak));
    CHECK(peak < start + 128 * MIB);

    /* Pushed values and fastai's deltas, negative used included. */
    OK(memprobe_source_push(p, 100 * MIB));
    OK(memprobe_window_reset(outer, NULL, 0));
    OK(memprobe_source_push(p, 300 * MIB));
    OK(memprobe_source_push(p, 40 * MIB));
    OK(memprobe_window_measure(outer, 1, &d));
    CHECK(d.used_start == 100 * MIB && d.used_end == 40 * MIB && d.peak == 300 * MIB);
    CHECK(d.delta_used == -(int64_t)(60 * MIB) && d.delta_peaked == 200 * MIB);
    CHECK(d.fidelity == MEMPROBE_FIDELITY_PUSHED);

    EXPECT(memprobe_window_peak(outer, 2, &peak), MEMPROBE_STATUS_INVALID_ID);
    EXPECT(memprobe_window_measure(outer, 99, &d), MEMPROBE_STATUS_INVALID_ID);
    EXPECT(memprobe_window_peak(outer, 0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_window_peak(NULL, 0, &peak), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_window_measure(NULL, 0, &d), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_window_measure(outer, 0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_window_reset(NULL, NULL, 0), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_window_source_count(outer, NULL), MEMPROBE_STATUS_NULL_POINTER);
    /* A source handle where a window handle is expected. */
    EXPECT(memprobe_window_peak((const memprobe_window *)rss, 0, &peak), MEMPROBE_STATUS_INVALID_HANDLE);

    /* Freeing the source handle keeps windows over it working. */
    FREE_OK(memprobe_source_free(p));
    OK(memprobe_window_measure(outer, 1, &d));
    FREE_OK(memprobe_window_free(outer));
    FREE_OK(memprobe_window_free(sibling));
    EXPECT(memprobe_window_free(sibling), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_window_reset(sibling, NULL, 0), MEMPROBE_STATUS_INVALID_HANDLE);
    FREE_OK(memprobe_window_free(NULL));
    FREE_OK(memprobe_source_free(rss));
}

static void test_traces(void) {
    memprobe_source *p = NULL;
    memprobe_trace *t = NULL, *d = NULL, *bad = NULL;
    int64_t used = 0;
    uint64_t peaked = 0;
    bool running = false;
    char buf[128];
    size_t needed = 0;
    memprobe_delta delta;
    const memprobe_source *srcs[1];

    OK(memprobe_source_new_pushed("gpu", &p));
    srcs[0] = p;
    OK(memprobe_source_push(p, 100 * MIB));
    EXPECT(memprobe_trace_new(srcs, 1, "foobar", 0x10, &bad), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_trace_new(NULL, 1, NULL, 0, &bad), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_new(srcs, 1, NULL, 0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    CHECK(bad == NULL);
    OK(memprobe_trace_new(srcs, 1, "foobar", 0, &t));
    OK(memprobe_trace_set_output_callback(t, on_line, NULL));
    EXPECT(memprobe_trace_set_output_callback(t, NULL, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_trace_is_running(t, &running));
    CHECK(running);
    OK(memprobe_source_push(p, 300 * MIB));
    OK(memprobe_source_push(p, 150 * MIB));
    OK(memprobe_trace_data(t, 0, &used, &peaked));
    CHECK(used == (int64_t)(50 * MIB) && peaked == 150 * MIB);
    EXPECT(memprobe_trace_data(t, 1, &used, &peaked), MEMPROBE_STATUS_INVALID_ID);
    EXPECT(memprobe_trace_data(t, 0, NULL, &peaked), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_data(t, 0, &used, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_trace_report(t, "1st try"));
    OK(memprobe_trace_report_n_reset(t, NULL));
    OK(memprobe_trace_data(t, 0, &used, &peaked));
    CHECK(used == 0 && peaked == 0);
    CHECK(n_lines == 2);
    CHECK(strcmp(lines[0], "\xe2\x96\xb3Used Peaked MB:     50    150 (foobar: 1st try)") == 0);
    CHECK(strcmp(lines[1], "\xe2\x96\xb3Used Peaked MB:     50    150 (foobar)") == 0);

    OK(memprobe_trace_format(t, "n", NULL, 0, &needed));
    CHECK(needed > 20);
    EXPECT(memprobe_trace_format(t, "n", buf, 8, &needed), MEMPROBE_STATUS_BUFFER_TOO_SMALL);
    CHECK(strlen(buf) == 7);
    /* A short buffer is cut at a character boundary: the line starts with
     * "\xe2\x96\xb3" (3 bytes), so 2 or 3 bytes of room hold "" and 4 hold
     * the whole character; nothing is written past the NUL. */
    {
        size_t room;
        for (room = 1; room <= 4; room++) {
            memset(buf, 0xAB, sizeof buf);
            EXPECT(memprobe_trace_format(t, "n", buf, room, NULL), MEMPROBE_STATUS_BUFFER_TOO_SMALL);
            CHECK(strlen(buf) == (room == 4 ? 3u : 0u));
            CHECK((unsigned char)buf[strlen(buf) + 1] == 0xAB);
        }
        CHECK(strcmp(buf, "\xe2\x96\xb3") == 0);
    }
    OK(memprobe_trace_format(t, "n", buf, sizeof buf, NULL));
    CHECK(strcmp(buf, "\xe2\x96\xb3Used Peaked MB:      0      0 (foobar: n)") == 0);
    EXPECT(memprobe_trace_format(t, "n", NULL, 5, NULL), MEMPROBE_STATUS_NULL_POINTER);

    OK(memprobe_trace_set_silent(t, true));
    OK(memprobe_trace_report(t, "silent"));
    CHECK(n_lines == 2);
    OK(memprobe_trace_set_silent(t, false));

    /* Wrong orders: double start, stop twice, reset/report_n_reset when stopped. */
    EXPECT(memprobe_trace_start(t), MEMPROBE_STATUS_WRONG_ORDER);
    OK(memprobe_source_push(p, 110 * MIB));
    OK(memprobe_trace_stop(t));
    EXPECT(memprobe_trace_stop(t), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_trace_reset(t), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_trace_report_n_reset(t, NULL), MEMPROBE_STATUS_WRONG_ORDER);
    OK(memprobe_source_push(p, 900 * MIB));
    OK(memprobe_trace_measure(t, 0, &delta));
    CHECK(delta.delta_used == (int64_t)(110 * MIB - 150 * MIB) && delta.used_end == 110 * MIB);
    OK(memprobe_trace_start(t));

    OK(memprobe_trace_new(srcs, 1, NULL, MEMPROBE_TRACE_DEFERRED | MEMPROBE_TRACE_SILENT, &d));
    EXPECT(memprobe_trace_stop(d), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_trace_data(d, 0, &used, &peaked), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_trace_report(d, NULL), MEMPROBE_STATUS_WRONG_ORDER);
    OK(memprobe_trace_start(d));
    OK(memprobe_trace_report(d, NULL));
    EXPECT(memprobe_trace_set_output_fd(d, -1), MEMPROBE_STATUS_INVALID_ARGUMENT);
    OK(memprobe_trace_set_output_fd(d, 2));

    /* NULL and stale handles on every trace call. */
    EXPECT(memprobe_trace_start(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_stop(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_reset(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_report(NULL, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_report_n_reset(NULL, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_is_running(NULL, &running), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_is_running(t, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_measure(t, 0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_set_silent(NULL, true), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_set_output_fd(NULL, 2), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_trace_format(NULL, NULL, buf, sizeof buf, NULL), MEMPROBE_STATUS_NULL_POINTER);
    FREE_OK(memprobe_trace_free(d));
    /* Report on a freed handle after a new trace took its slot. */
    {
        memprobe_trace *fresh = NULL;
        OK(memprobe_trace_new(srcs, 1, NULL, MEMPROBE_TRACE_SILENT, &fresh));
        EXPECT(memprobe_trace_report(d, NULL), MEMPROBE_STATUS_INVALID_HANDLE);
        EXPECT(memprobe_trace_free(d), MEMPROBE_STATUS_INVALID_HANDLE);
        OK(memprobe_trace_report(fresh, NULL));
        FREE_OK(memprobe_trace_free(fresh));
    }
    EXPECT(memprobe_trace_report((memprobe_trace *)p, NULL), MEMPROBE_STATUS_INVALID_HANDLE);
    FREE_OK(memprobe_trace_free(t));
    FREE_OK(memprobe_trace_free(NULL));
    FREE_OK(memprobe_source_free(p));
}

static void test_monitor(void) {
    memprobe_monitor_stats st;
    memprobe_source *cb = NULL;
    memprobe_window *w = NULL;
    uint64_t value = 10, peak = 0;
    const memprobe_source *srcs[1];
    int i;

    EXPECT(memprobe_monitor_set_interval_ns(0), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_monitor_set_interval_ns(MEMPROBE_MONITOR_MIN_INTERVAL_NS - 1), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_monitor_set_interval_ns(MEMPROBE_MONITOR_MAX_INTERVAL_NS + 1), MEMPROBE_STATUS_INVALID_ARGUMENT);
    OK(memprobe_monitor_set_interval_ns(1000000));
    EXPECT(memprobe_monitor_get_stats(NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_source_new_callback("value", read_counter, &value, &cb));
    srcs[0] = cb;
    OK(memprobe_window_open(srcs, 1, &w));
    OK(memprobe_monitor_get_stats(&st));
    CHECK(st.running && st.watched == 1 && st.interval_ns == 1000000);
    value = 5000;
    for (i = 0; i < 2000; i++) {
        uint64_t before = st.reads;
        usleep(1000);
        OK(memprobe_monitor_get_stats(&st));
        if (st.reads >= before + 3) break;
    }
    value = 20;
    OK(memprobe_window_peak(w, 0, &peak));
    CHECK(peak == 5000);
    FREE_OK(memprobe_window_free(w));
    OK(memprobe_monitor_stop());
    OK(memprobe_monitor_get_stats(&st));
    CHECK(!st.running);
    FREE_OK(memprobe_source_free(cb));
}

int main(void) {
    uint64_t s = 1, w = 1, t = 1;
    test_basics();
    test_free_keeps_last_error();
    test_sources();
    test_read_used();
    test_windows();
    test_traces();
    test_monitor();
    EXPECT(memprobe_debug_live_handles(&s, &w, &t, NULL), MEMPROBE_STATUS_OK);
    CHECK(s == 0 && w == 0 && t == 0);
    return check_summary();
}
