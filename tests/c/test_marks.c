/* Exact sources over a caller's resettable marks, through the C ABI: a
 * scripted stand-in for a framework allocator (2 devices x allocated /
 * reserved bytes, one shared reset) checked to the byte through windows,
 * traces and trackers, failing callbacks, re-entry, and bad input on every
 * mark entry point; each scenario runs over a group made with
 * memprobe_mark_group_new and again over one made with
 * memprobe_mark_group_new_many (every mark read from one snapshot). */
#include <stdint.h>
#include <stdlib.h>
#include "check.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)
#define N_MARKS 4 /* index = device * 2 + (0 allocated, 1 reserved) */

/* The framework's allocator: what it holds now and its high-water marks
 * since its (one, global) reset. */
typedef struct {
    uint64_t now[N_MARKS], peak[N_MARKS];
    int32_t fail_current, fail_peak, fail_reset; /* returned when non-zero */
    int resets;
    int calls; /* callbacks made, of any kind */
    /* Re-entry: a source the current callback reads, and what it got. */
    memprobe_source *reenter;
    memprobe_mark_group *reenter_group;
    memprobe_status reenter_status, reenter_new_status;
    /* A window each callback tries to free (the one whose boundary runs
     * it), and one freed by the first callback (another window). */
    memprobe_window *reenter_window, *free_inside;
    memprobe_status reenter_window_status, free_inside_status;
} allocator;

static void set(allocator *a, int i, uint64_t bytes) {
    a->now[i] = bytes;
    if (bytes > a->peak[i]) a->peak[i] = bytes;
}

/* A temporary allocation: rises by `bytes` and falls back. */
static void spike(allocator *a, int i, uint64_t bytes) {
    uint64_t before = a->now[i];
    set(a, i, before + bytes);
    set(a, i, before);
}

static int32_t read_current(void *user_data, size_t index, uint64_t *out) {
    allocator *a = user_data;
    a->calls++;
    if (a->reenter) {
        memprobe_sample s;
        memprobe_source *src = NULL;
        a->reenter_status = memprobe_source_read(a->reenter, &s);
        a->reenter_new_status = memprobe_source_new_mark(a->reenter_group, 3, "inner", &src);
        if (src) memprobe_source_free(src);
    }
    if (a->reenter_window) a->reenter_window_status = memprobe_window_free(a->reenter_window);
    if (a->free_inside) {
        a->free_inside_status = memprobe_window_free(a->free_inside);
        a->free_inside = NULL;
    }
    if (a->fail_current) return a->fail_current;
    if (index >= N_MARKS) return -1;
    *out = a->now[index];
    return 0;
}

static int32_t read_peak(void *user_data, size_t index, uint64_t *out) {
    allocator *a = user_data;
    a->calls++;
    if (a->fail_peak) return a->fail_peak;
    if (index >= N_MARKS) return -1;
    *out = a->peak[index];
    return 0;
}

static int32_t reset_all(void *user_data) {
    allocator *a = user_data;
    int i;
    a->calls++;
    if (a->fail_reset) return a->fail_reset;
    for (i = 0; i < N_MARKS; i++) a->peak[i] = a->now[i];
    a->resets++;
    return 0;
}

/* Every requested mark from one snapshot of the allocator: one call. */
static int32_t read_many(void *user_data, uint32_t what, const size_t *indices, size_t count, uint64_t *out) {
    allocator *a = user_data;
    size_t i;
    int32_t rc = 0;
    int calls = a->calls;
    CHECK(count >= 1 && indices != NULL && out != NULL);
    for (i = 0; i < count && rc == 0; i++) {
        if (what == MEMPROBE_MARK_VALUE_CURRENT)
            rc = read_current(user_data, indices[i], &out[i]);
        else if (what == MEMPROBE_MARK_VALUE_PEAK)
            rc = read_peak(user_data, indices[i], &out[i]);
        else
            rc = -2;
    }
    a->calls = calls + 1;
    return rc;
}

/* Which constructor make_group uses. */
static int use_many;

static memprobe_status new_group(allocator *a, memprobe_mark_group **g) {
    return use_many ? memprobe_mark_group_new_many(read_many, reset_all, a, g)
                    : memprobe_mark_group_new(read_current, read_peak, reset_all, a, g);
}

static const char *const NAMES[N_MARKS] = {"alloc:0", "reserved:0", "alloc:1", "reserved:1"};

/* A group over `a` with one source per mark. */
static memprobe_mark_group *make_group(allocator *a, memprobe_source *src[N_MARKS]) {
    memprobe_mark_group *g = NULL;
    int i;
    OK(new_group(a, &g));
    for (i = 0; i < N_MARKS; i++) {
        src[i] = NULL;
        OK(memprobe_source_new_mark(g, (size_t)i, NAMES[i], &src[i]));
    }
    return g;
}

static void free_group(memprobe_mark_group *g, memprobe_source *src[N_MARKS]) {
    int i;
    for (i = 0; i < N_MARKS; i++) FREE_OK(memprobe_source_free(src[i]));
    FREE_OK(memprobe_mark_group_free(g));
}

static uint64_t peak_of(const memprobe_window *w, size_t i) {
    uint64_t p = 0;
    OK(memprobe_window_peak(w, i, &p));
    return p;
}

static void test_spike_is_the_peak_to_the_byte(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS];
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_window *w = NULL;
    memprobe_source_info info;
    memprobe_delta d;
    memprobe_sample s;

    OK(memprobe_source_get_info(src[0], &info));
    CHECK(info.kind == MEMPROBE_SOURCE_KIND_CUSTOM);
    CHECK(info.fidelity == MEMPROBE_FIDELITY_EXACT);
    CHECK(strcmp(info.name, "alloc:0") == 0);

    set(&a, 0, 100 * MIB);
    set(&a, 0, 300 * MIB); /* before the window: not its peak */
    set(&a, 0, 100 * MIB);
    OK(memprobe_source_read(src[0], &s));
    CHECK(s.used == 100 * MIB);
    OK(memprobe_window_open((const memprobe_source *const *)src, 1, &w));
    spike(&a, 0, 2 * GIB + 7);
    set(&a, 0, 100 * MIB + 4096);
    CHECK(peak_of(w, 0) == 100 * MIB + 2 * GIB + 7);
    OK(memprobe_window_measure(w, 0, &d));
    CHECK(d.used_start == 100 * MIB);
    CHECK(d.used_end == 100 * MIB + 4096);
    CHECK(d.peak == 100 * MIB + 2 * GIB + 7);
    CHECK(d.delta_used == 4096);
    CHECK(d.delta_peaked == 2 * GIB + 7 - 4096);
    CHECK(d.kind == MEMPROBE_SOURCE_KIND_CUSTOM && d.fidelity == MEMPROBE_FIDELITY_EXACT);
    /* The next interval starts fresh: the spike is behind it. */
    OK(memprobe_window_reset(w, &d, 1));
    CHECK(d.peak == 100 * MIB + 2 * GIB + 7);
    CHECK(peak_of(w, 0) == 100 * MIB + 4096);
    spike(&a, 0, 1);
    CHECK(peak_of(w, 0) == 100 * MIB + 4097);
    FREE_OK(memprobe_window_free(w));
    free_group(g, src);
}

static void test_nested_and_sibling_windows(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS];
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_window *epoch = NULL, *step = NULL, *eval = NULL;
    int i;

    set(&a, 0, 10 * MIB);
    OK(memprobe_window_open((const memprobe_source *const *)src, 1, &epoch));
    for (i = 1; i <= 3; i++) {
        OK(memprobe_window_open((const memprobe_source *const *)src, 1, &step));
        spike(&a, 0, (uint64_t)i * 100 * MIB);
        /* A nested window opened inside the step sees only what follows. */
        OK(memprobe_window_open((const memprobe_source *const *)src, 1, &eval));
        spike(&a, 0, (uint64_t)i * MIB);
        CHECK(peak_of(eval, 0) == 10 * MIB + (uint64_t)i * MIB);
        FREE_OK(memprobe_window_free(eval));
        /* Siblings: each step has its own spike, not the previous one's. */
        CHECK(peak_of(step, 0) == 10 * MIB + (uint64_t)i * 100 * MIB);
        FREE_OK(memprobe_window_free(step));
    }
    CHECK(peak_of(epoch, 0) == 310 * MIB);
    FREE_OK(memprobe_window_free(epoch));
    free_group(g, src);
}

static void test_shared_reset_keeps_other_peaks(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS];
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_window *all = NULL, *res0 = NULL, *w = NULL;
    int i, resets;

    for (i = 0; i < N_MARKS; i++) set(&a, i, (uint64_t)(i + 1) * MIB);
    OK(memprobe_window_open((const memprobe_source *const *)src, N_MARKS, &all));
    OK(memprobe_window_open((const memprobe_source *const *)&src[1], 1, &res0));
    spike(&a, 1, 900 * MIB); /* the cache grows and is emptied */
    spike(&a, 3, 700 * MIB);
    resets = a.resets;
    /* Boundaries through the allocated sources reset every mark... */
    for (i = 0; i < 5; i++) {
        OK(memprobe_window_open((const memprobe_source *const *)&src[i % 2 ? 2 : 0], 1, &w));
        spike(&a, i % 2 ? 2 : 0, 50 * MIB);
        FREE_OK(memprobe_window_free(w));
    }
    CHECK(a.resets > resets);
    CHECK(a.peak[1] == 2 * MIB && a.peak[3] == 4 * MIB); /* the framework's own marks are gone */
    /* ...yet the reserved peaks survive in the windows over them. */
    CHECK(peak_of(res0, 0) == 902 * MIB);
    CHECK(peak_of(all, 0) == 51 * MIB);
    CHECK(peak_of(all, 1) == 902 * MIB);
    CHECK(peak_of(all, 2) == 53 * MIB);
    CHECK(peak_of(all, 3) == 704 * MIB);
    /* A reset through a reserved source keeps the allocated peaks too. */
    spike(&a, 0, 77 * MIB);
    OK(memprobe_window_reset(res0, NULL, 0));
    CHECK(peak_of(all, 0) == 78 * MIB);
    FREE_OK(memprobe_window_free(res0));
    FREE_OK(memprobe_window_free(all));
    free_group(g, src);
}

typedef struct {
    int n;
    memprobe_phase_record rec[8];
    memprobe_delta d[8][N_MARKS];
} records;

static void on_record(const memprobe_phase_record *r, const memprobe_delta *d, size_t n, void *user_data) {
    records *rs = user_data;
    if (rs->n < 8 && n == N_MARKS) {
        rs->rec[rs->n] = *r;
        memcpy(rs->d[rs->n], d, sizeof rs->d[0]);
        rs->n++;
    }
}

static void test_tracker_per_step_and_epoch(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS];
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_tracker *t = NULL;
    records rs = {0};
    memprobe_delta d[N_MARKS];
    memprobe_phase_record r;
    int e;

    OK(memprobe_tracker_new((const memprobe_source *const *)src, N_MARKS, &t));
    OK(memprobe_tracker_add_callback_sink(t, on_record, &rs));
    set(&a, 0, 8 * MIB);
    set(&a, 1, 16 * MIB);
    for (e = 0; e < 2; e++) {
        OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
        OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
        spike(&a, 0, 2 * GIB); /* the one big step */
        OK(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_STEP, NULL, &r, d, N_MARKS));
        CHECK(r.kind == MEMPROBE_PHASE_KIND_STEP && d[0].peak == 8 * MIB + 2 * GIB);
        spike(&a, 1, 3 * MIB); /* a small one on the reserved mark */
        OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, &r, d, N_MARKS));
        CHECK(d[0].peak == 8 * MIB);
        CHECK(d[1].peak == 19 * MIB);
        OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, &r, d, N_MARKS));
        CHECK(r.kind == MEMPROBE_PHASE_KIND_EPOCH && r.index == (uint64_t)e);
        CHECK(d[0].peak == 8 * MIB + 2 * GIB);
        CHECK(d[1].peak == 19 * MIB);
        CHECK(d[0].fidelity == MEMPROBE_FIDELITY_EXACT);
    }
    CHECK(rs.n == 6);
    if (rs.n == 6) {
        CHECK(rs.rec[0].kind == MEMPROBE_PHASE_KIND_STEP && rs.d[0][0].peak == 8 * MIB + 2 * GIB);
        CHECK(rs.rec[1].kind == MEMPROBE_PHASE_KIND_STEP && rs.d[1][0].peak == 8 * MIB);
        CHECK(rs.d[1][1].peak == 19 * MIB && rs.d[0][1].peak == 16 * MIB);
        CHECK(rs.rec[2].kind == MEMPROBE_PHASE_KIND_EPOCH && rs.d[2][0].peak == 8 * MIB + 2 * GIB);
        CHECK(rs.rec[5].kind == MEMPROBE_PHASE_KIND_EPOCH && rs.d[5][1].peak == 19 * MIB);
        CHECK(rs.d[5][0].delta_peaked == 2 * GIB);
    }
    FREE_OK(memprobe_tracker_free(t));
    free_group(g, src);
}

static char line[256];
static void on_line(const char *l, void *user_data) {
    (void)user_data;
    snprintf(line, sizeof line, "%s", l);
}

static void test_trace_report_line(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS];
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_trace *tr = NULL;
    int64_t used = 0;
    uint64_t peaked = 0;

    set(&a, 0, 64 * MIB);
    OK(memprobe_trace_new((const memprobe_source *const *)src, 1, "torch", 0, &tr));
    OK(memprobe_trace_set_output_callback(tr, on_line, NULL));
    set(&a, 0, 114 * MIB);
    spike(&a, 0, 150 * MIB);
    OK(memprobe_trace_data(tr, 0, &used, &peaked));
    CHECK(used == (int64_t)(50 * MIB) && peaked == 150 * MIB);
    OK(memprobe_trace_report(tr, "step"));
    CHECK(strcmp(line, "\xe2\x96\xb3Used Peaked MB:     50    150 (torch: step)") == 0);
    FREE_OK(memprobe_trace_free(tr));
    free_group(g, src);
}

static void test_failing_callbacks_leave_windows_intact(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS];
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_window *w = NULL, *other = NULL, *none = NULL;
    memprobe_sample s;
    memprobe_status err = MEMPROBE_STATUS_OK;
    char msg[256];
    uint64_t p = 0;

    set(&a, 0, 5 * MIB);
    set(&a, 1, 6 * MIB);
    OK(memprobe_window_open((const memprobe_source *const *)src, 2, &w));
    spike(&a, 0, 40 * MIB);
    spike(&a, 1, 60 * MIB);

    a.fail_peak = 7;
    EXPECT(memprobe_window_peak(w, 0, &p), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(strstr(memprobe_last_error(), "alloc:0") != NULL);
    CHECK(strstr(memprobe_last_error(), "mark 0") != NULL);
    CHECK(strstr(memprobe_last_error(), "reading the peak") != NULL);
    CHECK(strstr(memprobe_last_error(), use_many ? "read_many callback returned 7" : "peak callback returned 7") != NULL);
    a.fail_peak = 0;
    CHECK(peak_of(w, 0) == 45 * MIB);

    /* A failed reset: the boundary fails, nothing is lost. */
    a.fail_reset = -2;
    EXPECT(memprobe_window_open((const memprobe_source *const *)src, 1, &none), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(none == NULL);
    CHECK(strstr(memprobe_last_error(), "reset callback returned -2") != NULL);
    EXPECT(memprobe_window_reset(w, NULL, 0), MEMPROBE_STATUS_UNAVAILABLE);
    a.fail_reset = 0;
    CHECK(peak_of(w, 0) == 45 * MIB);
    CHECK(peak_of(w, 1) == 66 * MIB);

    /* A failed current read. */
    a.fail_current = 9;
    EXPECT(memprobe_source_read(src[2], &s), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(strstr(memprobe_last_error(), "alloc:1") != NULL && strstr(memprobe_last_error(), "mark 2") != NULL);
    CHECK(strstr(memprobe_last_error(), "reading the current value") != NULL);
    CHECK(strstr(memprobe_last_error(), use_many ? "read_many callback returned 9" : "current callback returned 9") != NULL);
    OK(memprobe_source_get_last_error(src[2], &err, msg, sizeof msg, NULL));
    CHECK(err == MEMPROBE_STATUS_UNAVAILABLE && strstr(msg, use_many ? "read_many callback returned 9" : "current callback returned 9") != NULL);
    EXPECT(memprobe_window_open((const memprobe_source *const *)&src[1], 1, &other), MEMPROBE_STATUS_UNAVAILABLE);
    a.fail_current = 0;

    /* Later windows are exact again, and the old one kept its peaks. */
    OK(memprobe_window_open((const memprobe_source *const *)&src[1], 1, &other));
    spike(&a, 1, 3 * MIB);
    CHECK(peak_of(other, 0) == 9 * MIB);
    CHECK(peak_of(w, 0) == 45 * MIB);
    CHECK(peak_of(w, 1) == 66 * MIB);
    OK(memprobe_window_reset(w, NULL, 0));
    CHECK(peak_of(w, 0) == 5 * MIB && peak_of(w, 1) == 6 * MIB);
    FREE_OK(memprobe_window_free(other));
    FREE_OK(memprobe_window_free(w));
    free_group(g, src);
}

static void test_reentry_is_wrong_order(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS];
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_sample s;
    int i;

    for (i = 0; i < 2; i++) {
        /* The same source, then another member of the group. */
        a.reenter = src[i];
        a.reenter_group = g;
        a.reenter_status = a.reenter_new_status = MEMPROBE_STATUS_OK;
        OK(memprobe_source_read(src[0], &s));
        CHECK(a.reenter_status == MEMPROBE_STATUS_WRONG_ORDER);
        CHECK(a.reenter_new_status == MEMPROBE_STATUS_WRONG_ORDER);
    }
    a.reenter = NULL;
    OK(memprobe_source_read(src[0], &s));
    free_group(g, src);
}

/* A callback of a window's boundary freeing that window is refused (the
 * window is in use on this thread) and the window goes on, its interval
 * whole; freeing another window there closes it. */
static void test_window_free_inside_its_boundary(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS], *rss = NULL;
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_window *w = NULL, *other = NULL;
    memprobe_delta d[1];
    uint64_t p = 0;
    const memprobe_source *one[1];
    const memprobe_source *proc[1];

    one[0] = src[0];
    OK(memprobe_source_new_process(0, &rss));
    proc[0] = rss;
    OK(memprobe_window_open(one, 1, &w));
    OK(memprobe_window_open(proc, 1, &other));
    set(&a, 0, 3 * MIB);
    spike(&a, 0, 5 * MIB);
    a.reenter_window = w;
    a.free_inside = other;
    a.reenter_window_status = a.free_inside_status = MEMPROBE_STATUS_OK;
    OK(memprobe_window_reset(w, d, 1));
    a.reenter_window = NULL;
    CHECK(a.reenter_window_status == MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(d[0].used_start == 0 && d[0].used_end == 3 * MIB && d[0].peak == 8 * MIB);
    CHECK(a.free_inside == NULL && a.free_inside_status == MEMPROBE_STATUS_OK);
    EXPECT(memprobe_window_peak(other, 0, &p), MEMPROBE_STATUS_INVALID_HANDLE);
    /* The window was not freed: its next interval is measured. */
    spike(&a, 0, 2 * MIB);
    OK(memprobe_window_reset(w, d, 1));
    CHECK(d[0].used_start == 3 * MIB && d[0].peak == 5 * MIB);
    FREE_OK(memprobe_window_free(w));
    EXPECT(memprobe_window_peak(w, 0, &p), MEMPROBE_STATUS_INVALID_HANDLE);
    FREE_OK(memprobe_source_free(rss));
    free_group(g, src);
}

/* A step window over one device's allocated and reserved sources: one
 * reset per boundary either way; five callbacks with one read per mark,
 * three with every mark read at once; the same peaks. */
static void test_callbacks_per_boundary(void) {
    allocator a = {0};
    memprobe_source *src[N_MARKS];
    memprobe_mark_group *g = make_group(&a, src);
    memprobe_window *step = NULL;
    memprobe_delta d[2];
    int i, calls, resets;

    set(&a, 0, 100 * MIB);
    set(&a, 1, 300 * MIB);
    OK(memprobe_window_open((const memprobe_source *const *)src, 2, &step));
    for (i = 1; i <= 20; i++) {
        spike(&a, 0, (uint64_t)i * MIB);
        spike(&a, 1, (uint64_t)i * 2 * MIB);
        calls = a.calls;
        resets = a.resets;
        OK(memprobe_window_reset(step, d, 2));
        CHECK(a.resets == resets + 1);
        /* Four sources live in the group: the other two's peaks are
         * carried too (one call each without read_many). */
        CHECK(a.calls - calls == (use_many ? 3 : 7));
        CHECK(d[0].peak == 100 * MIB + (uint64_t)i * MIB);
        CHECK(d[1].peak == 300 * MIB + (uint64_t)i * 2 * MIB);
        CHECK(d[1].used_end == 300 * MIB);
    }
    FREE_OK(memprobe_window_free(step));
    free_group(g, src);
}

static void test_bad_input_many(void) {
    allocator a = {0};
    memprobe_mark_group *g = NULL;
    memprobe_source *s = NULL;
    uint64_t v = 0;

    EXPECT(memprobe_mark_group_new_many(NULL, reset_all, &a, &g), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_mark_group_new_many(read_many, NULL, &a, &g), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_mark_group_new_many(read_many, reset_all, &a, NULL), MEMPROBE_STATUS_NULL_POINTER);
    CHECK(g == NULL);
    OK(memprobe_mark_group_new_many(read_many, reset_all, &a, &g));
    OK(memprobe_source_new_mark(g, 2, "alloc:1", &s));
    set(&a, 2, 5 * MIB);
    OK(memprobe_source_read(s, &(memprobe_sample){0}));
    /* A failing read_many: UNAVAILABLE naming the callback. */
    {
        memprobe_window *w = NULL;
        OK(memprobe_window_open((const memprobe_source *const *)&s, 1, &w));
        a.fail_peak = 9;
        EXPECT(memprobe_window_peak(w, 0, &v), MEMPROBE_STATUS_UNAVAILABLE);
        CHECK(strstr(memprobe_last_error(), "read_many") != NULL);
        a.fail_peak = 0;
        OK(memprobe_window_peak(w, 0, &v));
        CHECK(v == 5 * MIB);
        FREE_OK(memprobe_window_free(w));
    }
    FREE_OK(memprobe_source_free(s));
    FREE_OK(memprobe_mark_group_free(g));
}

static void test_bad_input(void) {
    allocator a = {0};
    memprobe_mark_group *g = NULL, *g2 = NULL;
    memprobe_source *s = NULL, *s2 = NULL, *pushed = NULL;
    memprobe_window *w = NULL;
    char long_name[80];
    uint64_t p = 0;

    /* memprobe_mark_group_new */
    EXPECT(memprobe_mark_group_new(NULL, read_peak, reset_all, &a, &g), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_mark_group_new(read_current, NULL, reset_all, &a, &g), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_mark_group_new(read_current, read_peak, NULL, &a, &g), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_mark_group_new(read_current, read_peak, reset_all, &a, NULL), MEMPROBE_STATUS_NULL_POINTER);
    CHECK(g == NULL);
    /* user_data may be NULL: it is only handed back. */
    OK(memprobe_mark_group_new(read_current, read_peak, reset_all, NULL, &g2));
    FREE_OK(memprobe_mark_group_free(g2));
    OK(memprobe_mark_group_new(read_current, read_peak, reset_all, &a, &g));

    /* memprobe_source_new_mark */
    EXPECT(memprobe_source_new_mark(NULL, 0, "x", &s), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_mark(g, 0, NULL, &s), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_mark(g, 0, "x", NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_mark(g, 0, "", &s), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_source_new_mark(g, 0, "\xff\xfe", &s), MEMPROBE_STATUS_INVALID_ARGUMENT);
    memset(long_name, 'n', 65);
    long_name[65] = 0;
    EXPECT(memprobe_source_new_mark(g, 0, long_name, &s), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_source_new_mark((const memprobe_mark_group *)(uintptr_t)0x1234, 0, "x", &s),
           MEMPROBE_STATUS_INVALID_HANDLE);
    OK(memprobe_source_new_pushed("pushed", &pushed));
    EXPECT(memprobe_source_new_mark((const memprobe_mark_group *)pushed, 0, "x", &s),
           MEMPROBE_STATUS_INVALID_HANDLE);
    CHECK(s == NULL);
    OK(memprobe_source_new_mark(g, 0, "x", &s));
    /* One source per index and group, until it is freed. */
    EXPECT(memprobe_source_new_mark(g, 0, "again", &s2), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(s2 == NULL);

    /* memprobe_mark_group_free */
    FREE_OK(memprobe_mark_group_free(NULL));
    EXPECT(memprobe_mark_group_free((memprobe_mark_group *)(uintptr_t)0x1234), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_mark_group_free((memprobe_mark_group *)pushed), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_source_free((memprobe_source *)g), MEMPROBE_STATUS_INVALID_HANDLE);

    /* The group freed first: its sources keep it (and its callbacks) alive. */
    FREE_OK(memprobe_mark_group_free(g));
    EXPECT(memprobe_mark_group_free(g), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_source_new_mark(g, 1, "y", &s2), MEMPROBE_STATUS_INVALID_HANDLE);
    set(&a, 0, 3 * MIB);
    OK(memprobe_window_open((const memprobe_source *const *)&s, 1, &w));
    spike(&a, 0, 11);
    OK(memprobe_window_peak(w, 0, &p));
    CHECK(p == 3 * MIB + 11);
    FREE_OK(memprobe_source_free(s));
    spike(&a, 0, 12);
    OK(memprobe_window_peak(w, 0, &p));
    CHECK(p == 3 * MIB + 12);
    FREE_OK(memprobe_window_free(w));
    FREE_OK(memprobe_source_free(pushed));
}

int main(void) {
    uint64_t sources = 0, windows = 0, traces = 0, trackers = 0;
    for (use_many = 0; use_many < 2; use_many++) {
        test_spike_is_the_peak_to_the_byte();
        test_nested_and_sibling_windows();
        test_shared_reset_keeps_other_peaks();
        test_tracker_per_step_and_epoch();
        test_trace_report_line();
        test_failing_callbacks_leave_windows_intact();
        test_reentry_is_wrong_order();
        test_window_free_inside_its_boundary();
        test_callbacks_per_boundary();
    }
    test_bad_input();
    test_bad_input_many();
    OK(memprobe_debug_live_handles(&sources, &windows, &traces, &trackers));
    CHECK(sources == 0 && windows == 0 && traces == 0 && trackers == 0);
    return check_summary();
}
