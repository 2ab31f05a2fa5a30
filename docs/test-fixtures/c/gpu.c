/* docs-test fixture: a block of GPU calls, with the release callback it
   registers. Without a GPU every reading answers zeros and
   MEMPROBE_STATUS_UNAVAILABLE, which the block does not check. */
#include <stdint.h>
#include "memprobe.h"
/* docs-test: includes */

static int32_t empty_cache(void *user_data) { /* memprobe_release_fn */
    (void)user_data;
    return 0;
}

int main(void) {
    /* docs-test: block */
    return 0;
}
