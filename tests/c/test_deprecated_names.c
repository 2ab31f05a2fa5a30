/* The deprecated C names still build and work until they go (0.3.0):
 * memprobe_oom_report is the old name of memprobe_oom_retry_result, the
 * result of memprobe_tracker_run_oom_retry; memprobe_oom_event,
 * memprobe_oom_cache and memprobe_oom_status are the old names of the OOM
 * report's memprobe_oom_report_event, _cache and _status. tests/tests/c_abi.rs builds this
 * file letting deprecation warnings through (and checks that they are
 * given); every other C test is built with them as errors. */
#include <stdint.h>
#include "check.h"

static int tries = 0;
static int32_t out_of_memory_once(void *user_data) {
    (void)user_data;
    return tries++ == 0 ? MEMPROBE_STEP_OUT_OF_MEMORY : MEMPROBE_STEP_DONE;
}

int main(void) {
    memprobe_source *cpu = NULL;
    const memprobe_source *srcs[1];
    memprobe_tracker *t = NULL;
    memprobe_oom_report old_name;
    memprobe_oom_retry_result *new_name = &old_name; /* one type, two names */
    memprobe_oom_status old_status;
    memprobe_oom_report_status *new_status = &old_status;
    memprobe_oom_event old_event;
    memprobe_oom_report_event *new_event = &old_event;
    memprobe_oom_cache old_cache;
    memprobe_oom_report_cache *new_cache = &old_cache;

    OK(memprobe_source_new_pushed("cpu", &cpu));
    srcs[0] = cpu;
    OK(memprobe_tracker_new(srcs, 1, &t));
    OK(memprobe_tracker_run_oom_retry(t, out_of_memory_once, NULL, 3, &old_name, NULL, 0));
    CHECK(new_name->succeeded && new_name->retries == 1 && tries == 2);
    CHECK(sizeof(memprobe_oom_report) == sizeof(memprobe_oom_retry_result));
    /* The report's status under its old name: no report is configured, so
     * WRONG_ORDER, and the struct is left untouched. */
    memset(&old_status, 0xab, sizeof old_status);
    EXPECT(memprobe_tracker_oom_status(t, &old_status), MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(new_status->reports_written == 0xababababababababull);
    CHECK(sizeof(*new_event) == sizeof old_event && sizeof(*new_cache) == sizeof old_cache);
    FREE_OK(memprobe_tracker_free(t));
    FREE_OK(memprobe_source_free(cpu));
    return check_summary();
}
