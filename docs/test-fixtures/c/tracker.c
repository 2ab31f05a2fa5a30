/* docs-test fixture: a block that uses a tracker `t` over this process's
   RSS, as the README's tracker section made it. */
#include <stdio.h>
#include <string.h>
#include "memprobe.h"
/* docs-test: includes */

int main(void) {
    memprobe_source *rss;
    if (memprobe_source_new_process(0, &rss) != MEMPROBE_STATUS_OK) return 1;
    const memprobe_source *srcs[] = { rss };
    memprobe_tracker *t;
    if (memprobe_tracker_new(srcs, 1, &t) != MEMPROBE_STATUS_OK) return 1;
    /* docs-test: block */
    memprobe_tracker_free(t);
    memprobe_source_free(rss);
    return 0;
}
