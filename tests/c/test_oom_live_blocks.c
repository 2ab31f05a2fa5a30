/* The framework's live-blocks table in an out-of-memory report
 * (memprobe_oom_report_event.live_blocks_json): a torch attribution record
 * is embedded as `live_blocks` and summarised (top blocks, fragmentation);
 * none, invalid JSON, another schema, a record past 256 KiB and bytes that
 * are not UTF-8 each still write the report, with `live_blocks_error`
 * saying why; a caller built with the header before the field (a smaller
 * struct_size) keeps working. The JSON lines it leaves in $OOM_TEST_DIR are
 * validated against docs/oom-report.schema.json by tests/tests/c_abi.rs. */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"

#define GIB ((uint64_t)1 << 30)

static int reports = 0;
static char *last_json = NULL, *last_summary = NULL;

static void on_report(const char *json, const char *summary, void *user_data) {
    (void)user_data;
    reports++;
    free(last_json);
    free(last_summary);
    last_json = strdup(json);
    last_summary = strdup(summary);
}

static int has(const char *text, const char *needle) {
    int ok = text != NULL && strstr(text, needle) != NULL;
    if (!ok) fprintf(stderr, "missing '%s' in:\n%s\n", needle, text ? text : "(none)");
    return ok;
}

/* The event as a caller built with the header before live_blocks_json. */
typedef struct {
    uint32_t struct_size;
    int32_t device;
    uint64_t requested_bytes;
    const char *reported_by;
    const char *detail;
    uint32_t valid;
    uint32_t n_caches;
    uint64_t device_total_bytes;
    uint64_t device_free_bytes;
    const memprobe_oom_report_cache *caches;
} event_before_live_blocks;

static const char RECORD[] =
    "{\"schema\": \"memprobe.torch_attribution/1\", \"kind\": \"oom\", \"rank\": 0,\n"
    " \"epoch\": 1, \"step\": 7, \"stage\": \"train\", \"device\": 0,\n"
    " \"peak_bytes\": null, \"requested_bytes\": 2147483648,\n"
    " \"blocks\": [{\"bytes\": 1073741824, \"stream\": 0, \"address\": 140000000,\n"
    "              \"frames\": [{\"file\": \"train.py\", \"line\": 42, \"function\": \"forward\"}],\n"
    "              \"module\": null},\n"
    "             {\"bytes\": 268435456, \"stream\": 0, \"address\": 150000000,\n"
    "              \"frames\": [], \"module\": \"Linear\"}],\n"
    " \"rest\": {\"bytes\": 4096, \"blocks\": 1},\n"
    " \"segments\": [{\"address\": 140000000, \"bytes\": 2147483648, \"allocated\": 1342177280, \"stream\": 0}],\n"
    " \"history\": {\"complete\": true, \"entries\": 3, \"lost_entries\": false}, \"cost_ms\": 1.5}";

/* Reports `e` (re-arming first after the first report) and checks that it
 * was written. */
static void report(memprobe_tracker *t, const memprobe_oom_report_event *e) {
    int before = reports;
    if (before > 0) OK(memprobe_tracker_rearm_oom_report(t));
    OK(memprobe_tracker_report_oom_event(t, e));
    CHECK(reports == before + 1);
}

static void event(memprobe_oom_report_event *e, const char *live) {
    memset(e, 0, sizeof *e);
    e->struct_size = sizeof *e;
    e->device = 0;
    e->requested_bytes = 2 * GIB;
    e->reported_by = "torch";
    e->live_blocks_json = live;
}

static void refused(memprobe_tracker *t, const char *live, const char *why) {
    memprobe_oom_report_event e;
    event(&e, live);
    report(t, &e);
    CHECK(has(last_json, "\"live_blocks\":null,\"live_blocks_error\":\""));
    CHECK(has(last_json, why));
    CHECK(has(last_summary, "  live blocks: left out (the live-blocks record"));
    CHECK(has(last_summary, "asked 2.00 GiB on GPU 0"));
}

int main(void) {
    memprobe_source *alloc;
    memprobe_tracker *t;
    memprobe_oom_report_options o;
    memprobe_oom_report_event e;
    const char *env = getenv("OOM_TEST_DIR");
    char path[600];
    char *big;
    int fd;
    size_t n;

    if (!env) {
        fprintf(stderr, "OOM_TEST_DIR is not set\n");
        return 2;
    }
    mkdir(env, 0700);
    snprintf(path, sizeof path, "%s/live.fd.json", env);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd > 2);
    OK(memprobe_source_new_pushed("torch_alloc:0", &alloc));
    {
        const memprobe_source *one = alloc;
        OK(memprobe_tracker_new(&one, 1, &t));
    }
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.triggers = MEMPROBE_OOM_TRIGGER_CALLER;
    o.json_fd = fd;
    o.callback = on_report;
    OK(memprobe_tracker_set_oom_report(t, &o));

    /* The record: embedded without its whitespace, summarised. */
    event(&e, RECORD);
    report(t, &e);
    CHECK(has(last_json, "\"live_blocks\":{\"schema\":\"memprobe.torch_attribution/1\",\"kind\":\"oom\""));
    CHECK(has(last_json, "\"requested_bytes\":2147483648,\"blocks\":[{\"bytes\":1073741824"));
    CHECK(has(last_json, "\"frames\":[{\"file\":\"train.py\",\"line\":42,\"function\":\"forward\"}]"));
    CHECK(has(last_json, "\"segments\":[{\"address\":140000000,\"bytes\":2147483648,\"allocated\":1342177280"));
    CHECK(has(last_json, "\"cost_ms\":1.5},\"live_blocks_error\":null"));
    CHECK(has(last_summary, "  live blocks (2 listed; 2.00 GiB asked):\n"));
    CHECK(has(last_summary, "  1.00 GiB train.py:42 forward\n"));
    CHECK(has(last_summary, "   256 MiB backward of Linear\n"));
    CHECK(has(last_summary, "  fragmentation: 2.00 GiB reserved in 1 segments, 1.25 GiB allocated, 768 MiB free"));

    /* None given: both keys null, no line. */
    event(&e, NULL);
    report(t, &e);
    CHECK(has(last_json, "\"live_blocks\":null,\"live_blocks_error\":null"));
    CHECK(strstr(last_summary, "live blocks") == NULL);

    /* Refused, the report written all the same. */
    refused(t, "{\"schema\":", "is not JSON: unexpected end");
    refused(t, "", "is not JSON: unexpected end");
    refused(t, "[1]", "is not a JSON object");
    refused(t, "{\"schema\":\"memprobe.torch_attribution/2\"}", "schema is \\\"memprobe.torch_attribution/2\\\"");
    refused(t, "{\"kind\":\"oom\"}", "has no \\\"schema\\\"");
    refused(t, "{\"schema\":\"\xff\"}", "is not UTF-8");
    /* A string far past the bound, read no further than the bound. */
    n = 300 * 1024;
    big = malloc(n + 1);
    CHECK(big != NULL);
    if (big) {
        memset(big, ' ', n);
        {
            static const char head[] = "{\"schema\":\"memprobe.torch_attribution/1\"}";
            memcpy(big, head, sizeof head - 1); /* without its NUL */
        }
        big[n] = 0;
        refused(t, big, "has more than the 262144 bytes allowed");
        /* Exactly at the bound: accepted (trailing whitespace is JSON). */
        big[256 * 1024] = 0;
        event(&e, big);
        report(t, &e);
        CHECK(has(last_json, "\"live_blocks\":{\"schema\":\"memprobe.torch_attribution/1\"},\"live_blocks_error\":null"));
        free(big);
    }

    /* A caller built before the field: its smaller struct is read as far
     * as it goes (on the heap, so that valgrind sees any read past it). */
    CHECK(sizeof(event_before_live_blocks) == offsetof(memprobe_oom_report_event, live_blocks_json));
    {
        event_before_live_blocks *old = calloc(1, sizeof *old);
        CHECK(old != NULL);
        if (old) {
            old->struct_size = sizeof *old;
            old->device = 0;
            old->requested_bytes = 3 * GIB;
            old->reported_by = "torch";
            old->detail = "from an older header";
            report(t, (const memprobe_oom_report_event *)old);
            CHECK(has(last_json, "\"detail\":\"from an older header\""));
            CHECK(has(last_json, "\"live_blocks\":null,\"live_blocks_error\":null"));
            /* Smaller still: refused, nothing counted. */
            old->struct_size = sizeof *old - 8;
            OK(memprobe_tracker_rearm_oom_report(t));
            EXPECT(memprobe_tracker_report_oom_event(t, (const memprobe_oom_report_event *)old),
                   MEMPROBE_STATUS_INVALID_ARGUMENT);
            CHECK(has(memprobe_last_error(), "struct_size"));
            free(old);
        }
    }
    /* A newer header's larger struct with a field set beyond ours: refused. */
    {
        struct {
            memprobe_oom_report_event e;
            uint64_t newer;
        } bigger;
        memset(&bigger, 0, sizeof bigger);
        bigger.e.struct_size = sizeof bigger;
        bigger.e.device = 0;
        bigger.newer = 1;
        EXPECT(memprobe_tracker_report_oom_event(t, &bigger.e), MEMPROBE_STATUS_INVALID_ARGUMENT);
        bigger.newer = 0;
        bigger.e.live_blocks_json = RECORD;
        OK(memprobe_tracker_report_oom_event(t, &bigger.e));
        CHECK(has(last_json, "\"live_blocks\":{\"schema\""));
    }
    /* Wrong order and bad handles with a record set. */
    event(&e, RECORD);
    EXPECT(memprobe_tracker_report_oom_event(NULL, &e), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_report_oom_event(t, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_tracker_set_oom_report(t, NULL));
    EXPECT(memprobe_tracker_report_oom_event(t, &e), MEMPROBE_STATUS_WRONG_ORDER);

    FREE_OK(memprobe_tracker_free(t));
    FREE_OK(memprobe_source_free(alloc));
    close(fd);
    free(last_json);
    free(last_summary);
    return check_summary();
}
