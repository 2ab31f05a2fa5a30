/* C side of the Go callbacks: trampolines with the exact C signatures of
 * memprobe_read_fn and memprobe_line_fn, calling the exported Go functions
 * (callbacks.go). user_data carries a registry id, not a Go pointer. */
#include <stdint.h>

#include "memprobe.h"
#include "_cgo_export.h"

static int32_t read_trampoline(void *user_data, uint64_t *out_bytes) {
    return mpgoRead(user_data, out_bytes);
}

static void line_trampoline(const char *line, void *user_data) {
    mpgoLine((char *)line, user_data);
}

memprobe_status mpgo_source_new_callback(const char *name, uintptr_t id, memprobe_source **out) {
    return memprobe_source_new_callback(name, read_trampoline, (void *)id, out);
}

memprobe_status mpgo_trace_set_output_callback(memprobe_trace *trace, uintptr_t id) {
    return memprobe_trace_set_output_callback(trace, line_trampoline, (void *)id);
}

static void record_trampoline(const memprobe_phase_record *record, const memprobe_delta *deltas, size_t n,
                              void *user_data) {
    mpgoRecord((memprobe_phase_record *)record, (memprobe_delta *)deltas, n, user_data);
}

static int32_t release_trampoline(void *user_data) { return mpgoRelease(user_data); }

static int32_t step_trampoline(void *user_data) { return mpgoStep(user_data); }

memprobe_status mpgo_tracker_add_callback_sink(memprobe_tracker *tracker, uintptr_t id) {
    return memprobe_tracker_add_callback_sink(tracker, record_trampoline, (void *)id);
}

memprobe_status mpgo_tracker_add_release(memprobe_tracker *tracker, const char *name, uint32_t kind, uintptr_t id) {
    return memprobe_tracker_add_release(tracker, name, kind, release_trampoline, (void *)id);
}

memprobe_status mpgo_tracker_run_oom_retry(memprobe_tracker *tracker, uintptr_t id, uint32_t max_retries,
                                           memprobe_oom_retry_result *out, uint64_t *freed, size_t n_freed) {
    return memprobe_tracker_run_oom_retry(tracker, step_trampoline, (void *)id, max_retries, out, freed, n_freed);
}

static void oom_report_trampoline(const char *json, const char *summary, void *user_data) {
    mpgoOOMReport((char *)json, (char *)summary, user_data);
}

/* The report's callback is the trampoline, with a registry id, when id != 0. */
memprobe_status mpgo_tracker_set_oom_report(memprobe_tracker *tracker, memprobe_oom_report_options *o, uintptr_t id) {
    if (id != 0) {
        o->callback = oom_report_trampoline;
        o->user_data = (void *)id;
    }
    return memprobe_tracker_set_oom_report(tracker, o);
}

memprobe_status mpgo_gpu_set_cache_release(uintptr_t id) {
    return memprobe_gpu_set_cache_release(release_trampoline, (void *)id);
}

static int32_t mark_current_trampoline(void *user_data, size_t index, uint64_t *out_bytes) {
    return mpgoMarkCurrent(user_data, index, out_bytes);
}

static int32_t mark_peak_trampoline(void *user_data, size_t index, uint64_t *out_bytes) {
    return mpgoMarkPeak(user_data, index, out_bytes);
}

static int32_t mark_reset_trampoline(void *user_data) { return mpgoMarkReset(user_data); }

memprobe_status mpgo_mark_group_new(uintptr_t id, memprobe_mark_group **out) {
    return memprobe_mark_group_new(mark_current_trampoline, mark_peak_trampoline, mark_reset_trampoline, (void *)id,
                                   out);
}

static int32_t mark_read_many_trampoline(void *user_data, uint32_t what, const size_t *indices, size_t count,
                                         uint64_t *out_bytes) {
    return mpgoMarkReadMany(user_data, what, (size_t *)indices, count, out_bytes);
}

memprobe_status mpgo_mark_group_new_many(uintptr_t id, memprobe_mark_group **out) {
    return memprobe_mark_group_new_many(mark_read_many_trampoline, mark_reset_trampoline, (void *)id, out);
}
