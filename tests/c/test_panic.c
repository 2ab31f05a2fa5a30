/* Run with MEMPROBE_TEST_PANIC_IN=memprobe_source_read: that entry point
 * panics on purpose; the panic must come back as a status, every time, and
 * the library must keep working and print nothing. */
#include "check.h"

int main(void) {
    memprobe_source *p = NULL;
    memprobe_sample s;
    int i;
    OK(memprobe_source_new_pushed("p", &p));
    for (i = 0; i < 3; i++) {
        EXPECT(memprobe_source_read(p, &s), MEMPROBE_STATUS_PANIC);
        CHECK(strstr(memprobe_last_error(), "memprobe_source_read: internal panic: panic injected") != NULL);
    }
    OK(memprobe_source_push(p, 7));
    FREE_OK(memprobe_source_free(p));
    return check_summary();
}
