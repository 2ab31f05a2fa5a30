/* A boundary that fails part-way changes nothing: a window, trace or
 * tracker over a pushed source and a custom source whose read fails, and a
 * window over two mark groups one of which fails, keep every source's peak
 * after the failed call (the pushed source, restarted before the failure,
 * included), and the next boundary that succeeds reports the whole
 * interval. tests/tests/c_abi.rs runs it plainly, under ASan + UBSan and
 * under valgrind. */
#include <stdint.h>
#include "check.h"

#define MIB ((uint64_t)1 << 20)

static int read_fails = 0;

static int32_t flaky_read(void *user_data, uint64_t *out_bytes) {
    (void)user_data;
    if (read_fails) return 7;
    *out_bytes = 5;
    return 0;
}

/* Two marks sharing one reset, which fails while `fail` names it. */
enum { FAIL_NONE, FAIL_PEAK, FAIL_RESET, FAIL_CURRENT };
typedef struct {
    uint64_t now[2], peak[2];
    int fail;
} marks;

static int32_t mark_current(void *user_data, size_t index, uint64_t *out_bytes) {
    marks *m = user_data;
    if (m->fail == FAIL_CURRENT) return 3;
    *out_bytes = m->now[index];
    return 0;
}

static int32_t mark_peak(void *user_data, size_t index, uint64_t *out_bytes) {
    marks *m = user_data;
    if (m->fail == FAIL_PEAK) return 4;
    *out_bytes = m->peak[index];
    return 0;
}

static int32_t mark_reset(void *user_data) {
    marks *m = user_data;
    if (m->fail == FAIL_RESET) return 5;
    m->peak[0] = m->now[0];
    m->peak[1] = m->now[1];
    return 0;
}

static void set(marks *m, int i, uint64_t bytes) {
    m->now[i] = bytes;
    if (bytes > m->peak[i]) m->peak[i] = bytes;
}

static uint64_t peak_of(const memprobe_window *w, size_t i) {
    uint64_t v = 0;
    if (memprobe_window_peak(w, i, &v) != MEMPROBE_STATUS_OK) return UINT64_MAX;
    return v;
}

static void window_and_trace(void) {
    memprobe_source *pushed, *flaky;
    const memprobe_source *both[2];
    memprobe_window *w, *other;
    memprobe_trace *trace;
    memprobe_delta ended[2];
    int64_t du;
    uint64_t dp;

    OK(memprobe_source_new_pushed("alloc", &pushed));
    OK(memprobe_source_new_callback("flaky", flaky_read, NULL, &flaky));
    both[0] = pushed;
    both[1] = flaky;
    OK(memprobe_window_open((const memprobe_source *const *)&pushed, 1, &other));
    OK(memprobe_window_open(both, 2, &w));
    OK(memprobe_source_push(pushed, 600));
    OK(memprobe_source_push(pushed, 100));

    read_fails = 1;
    EXPECT(memprobe_window_reset(w, ended, 2), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(peak_of(w, 0) == 600);
    CHECK(peak_of(other, 0) == 600);
    read_fails = 0;
    OK(memprobe_window_reset(w, ended, 2));
    CHECK(ended[0].peak == 600 && ended[0].used_start == 0 && ended[0].used_end == 100);
    CHECK(peak_of(w, 0) == 100);
    CHECK(peak_of(other, 0) == 600);
    FREE_OK(memprobe_window_free(w));
    FREE_OK(memprobe_window_free(other));

    /* A trace: delta peaked 256 MiB survives a failed reset. */
    OK(memprobe_source_push(pushed, 0));
    OK(memprobe_trace_new(both, 2, NULL, MEMPROBE_TRACE_SILENT, &trace));
    OK(memprobe_source_push(pushed, 256 * MIB));
    OK(memprobe_source_push(pushed, 0));
    read_fails = 1;
    EXPECT(memprobe_trace_reset(trace), MEMPROBE_STATUS_UNAVAILABLE);
    read_fails = 0;
    OK(memprobe_trace_data(trace, 0, &du, &dp));
    CHECK(dp == 256 * MIB);
    FREE_OK(memprobe_trace_free(trace));

    FREE_OK(memprobe_source_free(pushed));
    FREE_OK(memprobe_source_free(flaky));
}

static void tracker(void) {
    memprobe_source *pushed, *flaky;
    const memprobe_source *both[2];
    memprobe_tracker *t;
    memprobe_phase_record rec;
    memprobe_delta d[2];

    OK(memprobe_source_new_pushed("alloc", &pushed));
    OK(memprobe_source_new_callback("flaky", flaky_read, NULL, &flaky));
    both[0] = pushed;
    both[1] = flaky;
    OK(memprobe_tracker_new(both, 2, &t));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
    OK(memprobe_source_push(pushed, 1100 * MIB));
    OK(memprobe_source_push(pushed, 100 * MIB));

    read_fails = 1;
    EXPECT(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, d, 2),
           MEMPROBE_STATUS_UNAVAILABLE);
    EXPECT(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, d, 2),
           MEMPROBE_STATUS_UNAVAILABLE);
    read_fails = 0;
    /* The step is still open and its record covers the whole interval. */
    OK(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, d, 2));
    CHECK(rec.index == 0);
    CHECK(d[0].peak == 1100 * MIB);
    OK(memprobe_source_push(pushed, 200 * MIB));
    read_fails = 1;
    EXPECT(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, d, 2),
           MEMPROBE_STATUS_UNAVAILABLE);
    read_fails = 0;
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, &rec, d, 2));
    CHECK(rec.index == 1 && d[0].peak == 200 * MIB);
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, &rec, d, 2));
    CHECK(d[0].peak == 1100 * MIB);
    FREE_OK(memprobe_tracker_free(t));
    FREE_OK(memprobe_source_free(pushed));
    FREE_OK(memprobe_source_free(flaky));
}

static void two_mark_groups(int fail) {
    marks a, b;
    memprobe_mark_group *ga, *gb;
    memprobe_source *s[4];
    memprobe_window *w, *lone;
    memprobe_delta ended[4];
    size_t i;

    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    OK(memprobe_mark_group_new(mark_current, mark_peak, mark_reset, &a, &ga));
    OK(memprobe_mark_group_new(mark_current, mark_peak, mark_reset, &b, &gb));
    OK(memprobe_source_new_mark(ga, 0, "a0", &s[0]));
    OK(memprobe_source_new_mark(ga, 1, "a1", &s[1]));
    OK(memprobe_source_new_mark(gb, 0, "b0", &s[2]));
    OK(memprobe_source_new_mark(gb, 1, "b1", &s[3]));
    OK(memprobe_window_open((const memprobe_source *const *)s, 4, &w));
    OK(memprobe_window_open((const memprobe_source *const *)&s[1], 1, &lone));
    set(&a, 0, 600);
    set(&a, 0, 100);
    set(&a, 1, 700);
    set(&a, 1, 200);
    set(&b, 0, 800);
    set(&b, 0, 0);
    set(&b, 1, 900);
    set(&b, 1, 50);

    b.fail = fail;
    EXPECT(memprobe_window_reset(w, ended, 4), MEMPROBE_STATUS_UNAVAILABLE);
    b.fail = FAIL_NONE;
    CHECK(peak_of(w, 0) == 600 && peak_of(w, 1) == 700);
    CHECK(peak_of(w, 2) == 800 && peak_of(w, 3) == 900);
    CHECK(peak_of(lone, 0) == 700);

    OK(memprobe_window_reset(w, ended, 4));
    CHECK(ended[0].peak == 600 && ended[1].peak == 700);
    CHECK(ended[2].peak == 800 && ended[3].peak == 900);
    CHECK(peak_of(w, 0) == 100 && peak_of(w, 1) == 200);
    CHECK(peak_of(w, 2) == 0 && peak_of(w, 3) == 50);
    CHECK(peak_of(lone, 0) == 700);

    FREE_OK(memprobe_window_free(lone));
    FREE_OK(memprobe_window_free(w));
    for (i = 0; i < 4; i++) FREE_OK(memprobe_source_free(s[i]));
    FREE_OK(memprobe_mark_group_free(ga));
    FREE_OK(memprobe_mark_group_free(gb));
}

int main(void) {
    window_and_trace();
    tracker();
    two_mark_groups(FAIL_PEAK);
    two_mark_groups(FAIL_RESET);
    two_mark_groups(FAIL_CURRENT);
    /* The custom source started the monitor thread: ended before exit, so
     * valgrind sees no thread's stack still held. */
    OK(memprobe_monitor_stop());
    return check_summary();
}
