/* docs-test fixture: app.c for the install section's build lines — reads
   this process's RSS through the installed library. */
#include <inttypes.h>
#include <stdio.h>
#include "memprobe.h"

int main(void) {
    memprobe_source *rss;
    memprobe_sample s;
    if (memprobe_source_new_process(0, &rss) != MEMPROBE_STATUS_OK) return 1;
    if (memprobe_source_read(rss, &s) != MEMPROBE_STATUS_OK) return 1;
    printf("rss %" PRIu64 " bytes\n", s.used);
    memprobe_source_free(rss);
    return 0;
}
