/* The Prometheus exporter from C: a scrape over a real socket, NULLs,
 * invalid handles, wrong order, a malformed address, a port in use. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "http_get.h"

#define MIB (1024ull * 1024ull)

static char page[1 << 16];

int main(void) {
    memprobe_exporter *e = NULL;
    uint16_t port = 0;

    /* NULL out-pointers and handles. */
    EXPECT(memprobe_exporter_start(NULL, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_port(NULL, &port), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_add_source(NULL, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_watch_tracker(NULL, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_set_rank(NULL, 0, 0, 1), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_add_gpus(NULL, 0), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_stop(NULL), MEMPROBE_STATUS_NULL_POINTER);
    FREE_OK(memprobe_exporter_free(NULL));

    /* A malformed address. */
    EXPECT(memprobe_exporter_start("localhost", &e), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_exporter_start("127.0.0.1:99999", &e), MEMPROBE_STATUS_INVALID_ARGUMENT);

    OK(memprobe_exporter_start(NULL, &e));
    EXPECT(memprobe_exporter_port(e, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_exporter_port(e, &port));
    CHECK(port != 0);

    /* The same port again: IO, saying so. */
    {
        char addr[64];
        memprobe_exporter *e2 = NULL;
        snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
        EXPECT(memprobe_exporter_start(addr, &e2), MEMPROBE_STATUS_IO);
        CHECK(strstr(memprobe_last_error(), "in use") != NULL);
    }

    memprobe_source *act = NULL;
    OK(memprobe_source_new_pushed("act", &act));
    memprobe_tracker *t = NULL;
    const memprobe_source *list[1] = {act};
    OK(memprobe_tracker_new(list, 1, &t));
    EXPECT(memprobe_exporter_add_source(e, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_exporter_watch_tracker(e, NULL), MEMPROBE_STATUS_NULL_POINTER);
    /* Handles of another type. */
    EXPECT(memprobe_exporter_add_source(e, (memprobe_source *)t), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_exporter_watch_tracker((memprobe_exporter *)t, t), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_exporter_port((memprobe_exporter *)act, &port), MEMPROBE_STATUS_INVALID_HANDLE);

    OK(memprobe_exporter_add_source(e, act));
    OK(memprobe_exporter_watch_tracker(e, t));
    OK(memprobe_exporter_set_rank(e, 3, 1, 8));
    EXPECT(memprobe_exporter_set_rank(e, 1ll << 40, -1, -1), MEMPROBE_STATUS_INVALID_ARGUMENT);
    OK(memprobe_exporter_add_gpus(e, 1));

    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
    OK(memprobe_source_push(act, 10 * MIB));
    OK(memprobe_source_push(act, 300 * MIB));
    OK(memprobe_source_push(act, 20 * MIB));
    OK(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0));

    /* The tracker and the source may go first. */
    FREE_OK(memprobe_tracker_free(t));
    FREE_OK(memprobe_source_free(act));

    CHECK(http_get(port, "/metrics", "", page, sizeof page) > 0);
    CHECK(strstr(page, "HTTP/1.1 200 OK") == page);
    CHECK(strstr(page, "memprobe_phase_peak_bytes{phase=\"step\",source=\"act\",kind=\"custom\"") != NULL);
    CHECK(strstr(page, "rank=\"3\",local_rank=\"1\",world_size=\"8\"} 314572800\n") != NULL);
    CHECK(strstr(page, "memprobe_source_used_bytes{source=\"act\"") != NULL);
    CHECK(http_get(port, "/nope", "", page, sizeof page) > 0);
    CHECK(strstr(page, "HTTP/1.1 404") == page);

    /* Wrong order: stop twice; the handle stays valid until freed. */
    OK(memprobe_exporter_stop(e));
    EXPECT(memprobe_exporter_stop(e), MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(http_get(port, "/metrics", "", page, sizeof page) < 0);
    OK(memprobe_exporter_port(e, &port));
    FREE_OK(memprobe_exporter_free(e));
    /* Freed: stale. */
    EXPECT(memprobe_exporter_free(e), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_exporter_port(e, &port), MEMPROBE_STATUS_INVALID_HANDLE);

    /* Freed while running: stops it. */
    OK(memprobe_exporter_start("127.0.0.1:0", &e));
    OK(memprobe_exporter_port(e, &port));
    FREE_OK(memprobe_exporter_free(e));
    CHECK(http_get(port, "/metrics", "", page, sizeof page) < 0);

    return check_summary();
}
