/* The deprecated C names still build and work until they go (0.3.0):
 * memprobe_oom_report is the old name of memprobe_oom_retry_result, the
 * result of memprobe_tracker_run_oom_retry. tests/tests/c_abi.rs builds this
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

    OK(memprobe_source_new_pushed("cpu", &cpu));
    srcs[0] = cpu;
    OK(memprobe_tracker_new(srcs, 1, &t));
    OK(memprobe_tracker_run_oom_retry(t, out_of_memory_once, NULL, 3, &old_name, NULL, 0));
    CHECK(new_name->succeeded && new_name->retries == 1 && tries == 2);
    CHECK(sizeof(memprobe_oom_report) == sizeof(memprobe_oom_retry_result));
    OK(memprobe_tracker_free(t));
    OK(memprobe_source_free(cpu));
    return check_summary();
}
