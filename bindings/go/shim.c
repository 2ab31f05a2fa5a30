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
