/* Out-of-memory reports through the C ABI, the caller's trigger: a trainer
 * in an epoch and a step reports a framework's out-of-memory error; the
 * first report is written whole (file, descriptors, callback), later ones
 * are counted and settled into the file when re-armed or freed; bad input,
 * unknown bits, versioned structs and wrong call orders on every entry
 * point. The JSON files it leaves in $OOM_TEST_DIR are validated against
 * docs/oom-report.schema.json by tests/tests/c_abi.rs. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

static char dir[512];
static int callbacks = 0;
static char last_json[65536], last_summary[16384];

static void on_report(const char *json, const char *summary, void *user_data) {
    callbacks++;
    CHECK(user_data == (void *)&callbacks);
    snprintf(last_json, sizeof last_json, "%s", json);
    snprintf(last_summary, sizeof last_summary, "%s", summary);
}

static char *slurp(const char *path) {
    static char buf[65536];
    FILE *f = fopen(path, "r");
    size_t n;
    if (!f) return NULL;
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static const char *in_dir(const char *name) {
    static char paths[8][600];
    static int next = 0;
    char *p = paths[next++ % 8];
    snprintf(p, 600, "%s/%s", dir, name);
    return p;
}

static int has(const char *text, const char *needle) {
    int ok = text != NULL && strstr(text, needle) != NULL;
    if (!ok) fprintf(stderr, "missing '%s' in:\n%s\n", needle, text ? text : "(no file)");
    return ok;
}

static void options(memprobe_oom_report_options *o, uint32_t triggers, const char *path) {
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->triggers = triggers;
    o->path = path;
}

/* Every entry point with bad handles, NULL pointers, unknown bits and
 * before configuration. */
static void bad_input(memprobe_tracker *t) {
    memprobe_oom_report_options o;
    memprobe_oom_report_status st;
    memprobe_oom_report_event e;
    memprobe_tracker *forged = (memprobe_tracker *)(uintptr_t)0x4bffffff00000001ULL;
    struct {
        memprobe_oom_report_options o;
        uint64_t newer_field;
    } bigger;

    /* Before any configuration: every use is a wrong order; removing none is fine. */
    EXPECT(memprobe_tracker_report_oom(t, 0, GIB, "early"), MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(strstr(memprobe_last_error(), "no out-of-memory report") != NULL);
    EXPECT(memprobe_tracker_oom_status(t, &st), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_tracker_rearm_oom_report(t), MEMPROBE_STATUS_WRONG_ORDER);
    OK(memprobe_tracker_set_oom_report(t, NULL));

    options(&o, MEMPROBE_OOM_TRIGGER_CALLER, in_dir("never.json"));
    EXPECT(memprobe_tracker_set_oom_report(NULL, &o), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_set_oom_report(forged, &o), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_tracker_report_oom(NULL, 0, 1, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_report_oom(forged, 0, 1, NULL), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_tracker_oom_status(t, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_oom_status(forged, &st), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_tracker_rearm_oom_report(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_tracker_report_oom_event(t, NULL), MEMPROBE_STATUS_NULL_POINTER);

    o.struct_size = 8; /* an older or uninitialised struct */
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(memprobe_last_error(), "struct_size") != NULL);
    options(&o, 0, in_dir("never.json"));
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(memprobe_last_error(), "trigger") != NULL);
    options(&o, 0x10 | MEMPROBE_OOM_TRIGGER_CALLER, in_dir("never.json"));
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    options(&o, MEMPROBE_OOM_TRIGGER_CALLER, NULL);
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(memprobe_last_error(), "destination") != NULL);
    options(&o, MEMPROBE_OOM_TRIGGER_CALLER, in_dir("never.json"));
    o.keep_ended = MEMPROBE_OOM_KEEP_ENDED_MAX + 1;
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    options(&o, MEMPROBE_OOM_TRIGGER_CALLER, NULL);
    o.json_fd = 9999; /* not open */
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    o.json_fd = -7;
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    options(&o, MEMPROBE_OOM_TRIGGER_CALLER, dir); /* a directory */
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    options(&o, MEMPROBE_OOM_TRIGGER_CALLER, in_dir("missing/x.json"));
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_UNAVAILABLE);
    /* The driver's trigger needs the interposer, which is not loaded here. */
    options(&o, MEMPROBE_OOM_TRIGGER_DRIVER | MEMPROBE_OOM_TRIGGER_CALLER, in_dir("never.json"));
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(strstr(memprobe_last_error(), "LD_PRELOAD") != NULL);
    /* A newer header's bigger struct: fine when its new fields are zero. */
    memset(&bigger, 0, sizeof bigger);
    options(&bigger.o, MEMPROBE_OOM_TRIGGER_CALLER, in_dir("never.json"));
    bigger.o.struct_size = sizeof bigger;
    bigger.newer_field = 1;
    EXPECT(memprobe_tracker_set_oom_report(t, &bigger.o), MEMPROBE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(memprobe_last_error(), "newer") != NULL);
    bigger.newer_field = 0;
    OK(memprobe_tracker_set_oom_report(t, &bigger.o));
    /* Configured twice: the second is refused and the first stays. */
    options(&o, MEMPROBE_OOM_TRIGGER_CALLER, in_dir("never.json"));
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_WRONG_ORDER);
    OK(memprobe_tracker_oom_status(t, &st));
    CHECK(st.armed && st.triggers == MEMPROBE_OOM_TRIGGER_CALLER && st.reports_written == 0);

    /* The report's own arguments. */
    EXPECT(memprobe_tracker_report_oom(t, -2, GIB, NULL), MEMPROBE_STATUS_INVALID_ID);
    EXPECT(memprobe_tracker_report_oom(t, 0, GIB, "\xff\xfe"), MEMPROBE_STATUS_INVALID_ARGUMENT);
    memset(&e, 0, sizeof e);
    e.struct_size = 4;
    EXPECT(memprobe_tracker_report_oom_event(t, &e), MEMPROBE_STATUS_INVALID_ARGUMENT);
    e.struct_size = sizeof e;
    e.valid = 0x80;
    EXPECT(memprobe_tracker_report_oom_event(t, &e), MEMPROBE_STATUS_INVALID_ARGUMENT);
    e.valid = 0;
    e.n_caches = 1;
    EXPECT(memprobe_tracker_report_oom_event(t, &e), MEMPROBE_STATUS_NULL_POINTER);
    e.n_caches = 65;
    EXPECT(memprobe_tracker_report_oom_event(t, &e), MEMPROBE_STATUS_INVALID_ARGUMENT);
    e.n_caches = 0;
    e.reported_by = "";
    EXPECT(memprobe_tracker_report_oom_event(t, &e), MEMPROBE_STATUS_INVALID_ARGUMENT);
    e.reported_by = "torch\n";
    EXPECT(memprobe_tracker_report_oom_event(t, &e), MEMPROBE_STATUS_INVALID_ARGUMENT);
    OK(memprobe_tracker_oom_status(t, &st));
    CHECK(st.armed && st.triggers_seen == 0); /* none of these counted */
    OK(memprobe_tracker_set_oom_report(t, NULL));
    OK(memprobe_tracker_set_oom_report(t, NULL));
    EXPECT(memprobe_tracker_oom_status(t, &st), MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(access(in_dir("never.json"), F_OK) != 0); /* never triggered: no file */
}

int main(void) {
    memprobe_source *alloc, *rss;
    memprobe_tracker *t;
    memprobe_oom_report_options o;
    memprobe_oom_report_status st;
    memprobe_oom_report_event e;
    memprobe_oom_report_cache caches[2];
    const char *env = getenv("OOM_TEST_DIR");
    const char *report = NULL;
    int json_fd, summary_fd, i;
    uint64_t handles_before, handles_after;

    if (!env) {
        fprintf(stderr, "OOM_TEST_DIR is not set\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", env);
    mkdir(dir, 0700);
    unlink(in_dir("report.json"));
    unlink(in_dir("event.json"));
    OK(memprobe_debug_live_handles(NULL, NULL, NULL, &handles_before));

    OK(memprobe_source_new_pushed("torch_alloc:0", &alloc));
    OK(memprobe_source_new_process(0, &rss));
    {
        const memprobe_source *both[2];
        both[0] = alloc;
        both[1] = rss;
        OK(memprobe_tracker_new(both, 2, &t));
    }
    bad_input(t);

    /* The trainer: a JSON file, the JSON and the summary on descriptors, a
     * callback; the last three ended phases kept. */
    json_fd = open(in_dir("report.fd.json"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    summary_fd = open(in_dir("summary.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(json_fd > 2 && summary_fd > 2);
    options(&o, MEMPROBE_OOM_TRIGGER_CALLER, in_dir("report.json"));
    o.json_fd = json_fd;
    o.summary_fd = summary_fd;
    o.callback = on_report;
    o.user_data = &callbacks;
    o.keep_ended = 3;
    OK(memprobe_tracker_set_oom_report(t, &o));
    OK(memprobe_tracker_oom_status(t, &st));
    CHECK(st.armed && st.reports_written == 0 && st.last_write_status == MEMPROBE_STATUS_OK);

    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
    for (i = 0; i < 5; i++) {
        OK(memprobe_source_push(alloc, (uint64_t)(i + 1) * GIB));
        OK(memprobe_source_push(alloc, 512 * MIB));
        OK(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0));
    }
    /* Step 5 grows to 70 GiB, then asks for 20 GiB more and fails. */
    OK(memprobe_source_push(alloc, 70 * GIB));
    OK(memprobe_tracker_report_oom(t, 0, 20 * GIB,
                                   "c10::OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"));
    CHECK(callbacks == 1);
    /* A framework retrying: a burst, counted, not written. */
    for (i = 0; i < 100; i++) OK(memprobe_tracker_report_oom(t, 0, 20 * GIB, "retry"));
    CHECK(callbacks == 1);
    OK(memprobe_tracker_oom_status(t, &st));
    CHECK(!st.armed && st.reports_written == 1 && st.triggers_seen == 101 && st.later_triggers == 100);

    report = slurp(in_dir("report.json"));
    CHECK(has(report, "\"format\":\"memprobe-oom-report\""));
    CHECK(has(report, "\"trigger\":\"caller\",\"location\":\"device\",\"device\":0,\"requested_bytes\":21474836480"));
    CHECK(has(report, "\"reported_by\":\"caller\",\"detail\":\"c10::OutOfMemoryError: CUDA out of memory."));
    CHECK(has(report, "\"kind\":\"epoch\",\"name\":\"epoch\",\"index\":0,\"depth\":0"));
    CHECK(has(report, "\"kind\":\"step\",\"name\":\"step\",\"index\":5,\"depth\":1"));
    /* The open step's peak so far, from 512 MiB to 70 GiB. */
    CHECK(has(report, "\"name\":\"torch_alloc:0\",\"kind\":\"custom\",\"fidelity\":\"pushed\",\"used_start\":536870912,\"used_now\":75161927680,\"peak\":75161927680"));
    /* The last three ended steps (2, 3, 4), each with its peak. */
    CHECK(has(report, "\"kept\":3,\"ended_total\":5"));
    CHECK(has(report, "\"index\":4,") && has(report, "\"peak\":5368709120"));
    CHECK(strstr(report, "\"peak\":1073741824,") == NULL);
    CHECK(has(report, "\"later_triggers\":{\"count\":0,\"last\":null}"));
    CHECK(has(last_json, "\"reports_before\":0"));
    CHECK(has(slurp(in_dir("report.fd.json")), "\"format\":\"memprobe-oom-report\""));
    CHECK(has(last_summary, "memprobe: out-of-memory report"));
    CHECK(has(last_summary, "caller asked 20.0 GiB on GPU 0 (caller trigger)"));
    CHECK(has(last_summary, "step #5"));
    CHECK(has(slurp(in_dir("summary.txt")), "open phases (outermost first)"));

    /* Re-armed: the file is settled with the burst, then a framework's
     * report with its cache figures replaces it. */
    OK(memprobe_tracker_rearm_oom_report(t));
    CHECK(has(slurp(in_dir("report.json")), "\"later_triggers\":{\"count\":100,\"last\":{\"trigger\":\"caller\""));
    CHECK(has(slurp(in_dir("report.json")), "\"detail\":\"retry\""));
    memset(&e, 0, sizeof e);
    memset(caches, 0, sizeof caches);
    e.struct_size = sizeof e;
    e.device = 1;
    e.requested_bytes = 3 * GIB;
    e.reported_by = "torch";
    e.detail = "CUDA out of memory. Tried to allocate 3.00 GiB";
    e.valid = MEMPROBE_OOM_EVENT_DEVICE_TOTAL | MEMPROBE_OOM_EVENT_DEVICE_FREE;
    e.device_total_bytes = 80 * GIB;
    e.device_free_bytes = 100 * MIB;
    caches[0].device = 1;
    caches[0].valid = MEMPROBE_OOM_CACHE_RESERVED | MEMPROBE_OOM_CACHE_ALLOCATED | MEMPROBE_OOM_CACHE_RELEASABLE;
    caches[0].reserved_bytes = 78 * GIB;
    caches[0].allocated_bytes = 70 * GIB;
    caches[0].releasable_bytes = 2 * GIB;
    caches[1].device = 0;
    caches[1].valid = MEMPROBE_OOM_CACHE_RESERVED | MEMPROBE_OOM_CACHE_ALLOCATED;
    caches[1].reserved_bytes = 4 * GIB;
    caches[1].allocated_bytes = 3 * GIB;
    e.caches = caches;
    e.n_caches = 2;
    OK(memprobe_tracker_report_oom_event(t, &e));
    CHECK(callbacks == 2);
    report = slurp(in_dir("report.json"));
    CHECK(has(report, "\"reported_by\":\"torch\""));
    CHECK(has(report, "\"device_total_bytes\":85899345920,\"device_free_bytes\":104857600"));
    CHECK(has(report, "{\"device\":1,\"framework\":\"torch\",\"reserved_bytes\":83751862272,\"allocated_bytes\":75161927680,\"releasable_bytes\":2147483648"));
    CHECK(has(report, "{\"device\":0,\"framework\":\"torch\",\"reserved_bytes\":4294967296,\"allocated_bytes\":3221225472,\"releasable_bytes\":null"));
    CHECK(has(report, "\"reports_before\":1"));
    CHECK(has(last_summary, "releasing caches on GPU 1: 2.00 GiB (torch)"));
    CHECK(has(last_summary, "releasing caches on GPU 0: unknown (torch holds 1073741824 bytes"));
    OK(memprobe_tracker_report_oom(t, -1, 0, NULL)); /* counted in the file at free */

    /* A second tracker with a report armed and never triggered, freed. */
    {
        memprobe_tracker *t2;
        const memprobe_source *one = alloc;
        OK(memprobe_tracker_new(&one, 1, &t2));
        options(&o, MEMPROBE_OOM_TRIGGER_CALLER, in_dir("armed.json"));
        OK(memprobe_tracker_set_oom_report(t2, &o));
        FREE_OK(memprobe_tracker_free(t2));
        CHECK(access(in_dir("armed.json"), F_OK) != 0);
        EXPECT(memprobe_tracker_report_oom(t2, 0, 1, NULL), MEMPROBE_STATUS_INVALID_HANDLE);
        EXPECT(memprobe_tracker_oom_status(t2, &st), MEMPROBE_STATUS_INVALID_HANDLE);
    }

    /* The epoch goes on; freeing the tracker settles the counted trigger. */
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0));
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    FREE_OK(memprobe_tracker_free(t));
    report = slurp(in_dir("report.json"));
    CHECK(has(report, "\"later_triggers\":{\"count\":1,\"last\":{\"trigger\":\"caller\",\"location\":\"unknown\",\"device\":null,\"requested_bytes\":null"));
    CHECK(callbacks == 2); /* a settled file is not sent to the other destinations */
    close(json_fd);
    close(summary_fd);
    FREE_OK(memprobe_source_free(alloc));
    FREE_OK(memprobe_source_free(rss));
    OK(memprobe_debug_live_handles(NULL, NULL, NULL, &handles_after));
    CHECK(handles_after == handles_before);
    {
        /* Nothing left behind but the reports: no temporary file. */
        DIR *d = opendir(dir);
        struct dirent *ent;
        CHECK(d != NULL);
        while (d && (ent = readdir(d)) != NULL) CHECK(strstr(ent->d_name, ".tmp-") == NULL);
        if (d) closedir(d);
    }
    return check_summary();
}
