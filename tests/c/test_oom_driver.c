/* Out-of-memory reports with the driver's trigger: libmemprobe_interpose.so
 * sees the fake driver (tests/fake-gpu/fake_cuda.c) fail an allocation
 * beyond the device's memory with CUDA_ERROR_OUT_OF_MEMORY and the report
 * is written on the failing thread before the error returns, unchanged, to
 * this program. tests/tests/oom_abi.rs runs it:
 *
 *   interposed   LD_PRELOAD=libmemprobe_interpose.so, the fake libcuda.so.1
 *                and a fake NVML: a trainer in an epoch and a step; one
 *                report for a burst of failures; another entry point after
 *                re-arming; a failure inside a call on the tracker (a report
 *                without the open phases, saying why); a tracker freed with
 *                the report armed (nothing written, nothing crashes)
 *   off          interposed, MEMPROBE_GPU_EXACT=off: UNAVAILABLE
 *   plain        without the interposer: UNAVAILABLE, saying how to load it
 *
 * Reports go to $OOM_TEST_DIR; oom_abi.rs validates them against
 * docs/oom-report.schema.json. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "check.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

static CUresult (*cu_init)(unsigned);
static CUresult (*cu_device_get)(int *, int);
static CUresult (*cu_primary_retain)(CUcontext *, int);
static CUresult (*cu_ctx_set_current)(CUcontext);
static CUresult (*cu_mem_alloc)(CUdeviceptr *, size_t);
static CUresult (*cu_mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
static CUresult (*cu_mem_free)(CUdeviceptr);

#define LOAD(lib, var, name)                                    \
    do {                                                        \
        void *p_ = dlsym(lib, name);                            \
        if (!p_) {                                              \
            fprintf(stderr, "dlsym %s: %s\n", name, dlerror()); \
            exit(2);                                            \
        }                                                       \
        memcpy(&(var), &p_, sizeof p_);                         \
    } while (0)

static char dir[512];
static const char *in_dir(const char *name) {
    static char paths[8][600];
    static int next = 0;
    char *p = paths[next++ % 8];
    snprintf(p, 600, "%s/%s", dir, name);
    return p;
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

static int has(const char *text, const char *needle) {
    int ok = text != NULL && strstr(text, needle) != NULL;
    if (!ok) fprintf(stderr, "missing '%s' in:\n%s\n", needle, text ? text : "(no file)");
    return ok;
}

/* What the callback saw, on the failing thread, before the error returned. */
static int callbacks = 0, file_was_there = 0;
static const char *expect_path = NULL;
static char last_summary[16384];

static void on_report(const char *json, const char *summary, void *user_data) {
    (void)user_data;
    callbacks++;
    CHECK(strstr(json, "\"format\":\"memprobe-oom-report\"") != NULL);
    /* The file is written first: it exists before the allocation returns. */
    if (expect_path && access(expect_path, F_OK) == 0) file_was_there++;
    snprintf(last_summary, sizeof last_summary, "%s", summary);
}

static void configure(memprobe_tracker *t, const char *name) {
    memprobe_oom_report_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.triggers = MEMPROBE_OOM_TRIGGER_DRIVER | MEMPROBE_OOM_TRIGGER_CALLER;
    o.path = in_dir(name);
    o.callback = on_report;
    expect_path = o.path;
    unlink(o.path);
    OK(memprobe_tracker_set_oom_report(t, &o));
}

/* A release callback that allocates more than the device holds: the
 * failure happens inside a call on the tracker, which it holds. */
static int32_t greedy_release(void *user_data) {
    CUdeviceptr p;
    (void)user_data;
    return cu_mem_alloc(&p, (size_t)(64 * GIB)) == 2 ? 0 : 1;
}

/* memprobe_gpu_origins_at_oom before any failure: OK, nothing failed; bad
 * pointers refused first. */
static void no_oom_yet(void) {
    memprobe_gpu_origin buf[2];
    size_t n = 9;
    int32_t device = 7;
    uint64_t held = 7, at = 7;
    EXPECT(memprobe_gpu_origins_at_oom(buf, 2, NULL, &device, &held, &at), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_origins_at_oom(NULL, 2, &n, &device, &held, &at), MEMPROBE_STATUS_NULL_POINTER);
    CHECK(n == 0 && device == MEMPROBE_GPU_ORIGINS_NO_OOM && held == 0 && at == 0);
    device = 7;
    OK(memprobe_gpu_origins_at_oom(buf, 2, &n, &device, &held, &at));
    CHECK(n == 0 && device == MEMPROBE_GPU_ORIGINS_NO_OOM && held == 0 && at == 0);
    OK(memprobe_gpu_origins_at_oom(NULL, 0, &n, NULL, NULL, NULL));
}

/* memprobe_gpu_origins_at_oom after a failure on `device` holding `held`
 * bytes, all of them the program's. */
static void origins_at_oom(int32_t want_device, uint64_t want_held) {
    memprobe_gpu_origin buf[4];
    size_t n = 0;
    int32_t device = 99;
    uint64_t held = 0, at = 0;
    OK(memprobe_gpu_origins_at_oom(NULL, 0, &n, NULL, NULL, NULL));
    CHECK(n == 1);
    memset(buf, 0, sizeof buf);
    OK(memprobe_gpu_origins_at_oom(buf, 4, &n, &device, &held, &at));
    CHECK(n == 1 && device == want_device && held == want_held && at > 0);
    CHECK(buf[0].bytes == want_held && buf[0].is_program == 1);
    CHECK(strstr(buf[0].library, "test_oom_driver") != NULL);
    CHECK(buf[1].bytes == 0); /* entries past the count are untouched */
}

static void interposed(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    memprobe_source *exact = NULL, *alloc = NULL;
    memprobe_tracker *t = NULL, *t2 = NULL;
    memprobe_oom_report_status st;
    CUcontext ctx;
    CUdeviceptr base, p;
    int d, i;
    char *report;

    if (!lib) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
    LOAD(lib, cu_init, "cuInit");
    LOAD(lib, cu_device_get, "cuDeviceGet");
    LOAD(lib, cu_primary_retain, "cuDevicePrimaryCtxRetain");
    LOAD(lib, cu_ctx_set_current, "cuCtxSetCurrent");
    LOAD(lib, cu_mem_alloc, "cuMemAlloc_v2");
    LOAD(lib, cu_mem_alloc_managed, "cuMemAllocManaged");
    LOAD(lib, cu_mem_free, "cuMemFree_v2");
    CHECK(cu_init(0) == 0);
    CHECK(cu_device_get(&d, 0) == 0);
    CHECK(cu_primary_retain(&ctx, d) == 0);
    CHECK(cu_ctx_set_current(ctx) == 0);

    OK(memprobe_source_new_gpu_exact(0, &exact));
    OK(memprobe_source_new_pushed("batch", &alloc));
    {
        const memprobe_source *both[2];
        both[0] = exact;
        both[1] = alloc;
        OK(memprobe_tracker_new(both, 2, &t));
    }
    configure(t, "driver.json");
    no_oom_yet();

    /* The trainer: 1 GiB of weights, then steps with 2 GiB activations. */
    CHECK(cu_mem_alloc(&base, (size_t)GIB) == 0);
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_EPOCH, NULL));
    OK(memprobe_tracker_begin(t, MEMPROBE_PHASE_KIND_STEP, NULL));
    for (i = 0; i < 4; i++) {
        CHECK(cu_mem_alloc(&p, (size_t)(2 * GIB)) == 0);
        OK(memprobe_source_push(alloc, (uint64_t)i));
        CHECK(cu_mem_free(p) == 0);
        OK(memprobe_tracker_next(t, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0));
    }
    /* Step 4 holds 5 GiB, then asks for 12 GiB more on a 16 GiB device. */
    CHECK(cu_mem_alloc(&p, (size_t)(5 * GIB)) == 0);
    CHECK(callbacks == 0);
    {
        CUdeviceptr q = 0;
        CUresult rc = cu_mem_alloc(&q, (size_t)(12 * GIB));
        CHECK(rc == 2); /* the driver's error, unchanged */
        CHECK(q == 0);
    }
    CHECK(callbacks == 1 && file_was_there == 1);
    /* The framework retries: a burst of failures, one report. */
    for (i = 0; i < 50; i++) {
        CUdeviceptr q;
        CHECK(cu_mem_alloc(&q, (size_t)(12 * GIB)) == 2);
    }
    CHECK(callbacks == 1);
    OK(memprobe_tracker_oom_status(t, &st));
    CHECK(!st.armed && st.reports_written == 1 && st.later_triggers >= 50);
    CHECK(st.triggers == (MEMPROBE_OOM_TRIGGER_DRIVER | MEMPROBE_OOM_TRIGGER_CALLER));
    report = slurp(in_dir("driver.json"));
    CHECK(has(report, "\"trigger\":\"driver\",\"location\":\"device\",\"device\":0,\"requested_bytes\":12884901888,\"reported_by\":\"cuMemAlloc_v2\""));
    CHECK(has(report, "\"driver_oom_failures\":1"));
    CHECK(has(report, "\"kind\":\"step\",\"name\":\"step\",\"index\":4,\"depth\":1"));
    /* The open step's exact peak so far: 1 GiB + 5 GiB held. */
    CHECK(has(report, "\"name\":\"gpu_exact:0\",\"kind\":\"gpu_exact\",\"fidelity\":\"exact\",\"used_start\":1073741824,\"used_now\":6442450944,\"peak\":6442450944"));
    /* An ended step: 1 GiB + the 2 GiB spike, exact. */
    CHECK(has(report, "\"used_start\":1073741824,\"used_end\":1073741824,\"peak\":3221225472"));
    CHECK(has(report, "\"driver_counts\":{\"available\":true,\"reason\":null,\"devices\":[{\"device\":0,\"held_bytes\":6442450944"));
    CHECK(has(report, "\"gpus\":{\"available\":true"));
    CHECK(has(report, "\"this_process\":true"));
    CHECK(has(last_summary, "cuMemAlloc_v2 asked 12.0 GiB on GPU 0 (driver trigger)"));
    CHECK(has(last_summary, "this process holds 6.00 GiB through the driver"));
    /* What held the device when it failed: the program's 6 GiB, copied
     * inside the failing call. */
    CHECK(has(report, "\"held_by_origin\":{\"available\":true,\"reason\":null,\"basis\":\"at_failure\",\"location\":\"device\",\"device\":0,"));
    CHECK(has(report, "\"held_bytes\":6442450944,\"origins\":[{\"name\":\"the program\","));
    CHECK(has(report, "\"program\":true,\"bytes\":6442450944}],\"stacks\":[{\"frames\":[\"test_oom_driver"));
    /* Two call sites of the program, two paths: the 5 GiB, then the base. */
    CHECK(has(report, "\"bytes\":5368709120},{\"frames\":[\"test_oom_driver"));
    CHECK(has(report, "\"bytes\":1073741824}],\"context_and_unseen_bytes\":"));
    CHECK(has(last_summary, "held on GPU 0 when it failed: 6.00 GiB: the program 6.00 GiB; CUDA context and unseen"));
    CHECK(has(last_summary, "\n    5.00 GiB test_oom_driver"));
    CHECK(has(last_summary, "\n    1.00 GiB test_oom_driver"));
    origins_at_oom(0, 6 * GIB);
    CHECK(cu_mem_free(p) == 0);

    /* Re-armed: another entry point. */
    OK(memprobe_tracker_rearm_oom_report(t));
    CHECK(has(slurp(in_dir("driver.json")), "\"later_triggers\":{\"count\":"));
    expect_path = in_dir("driver.json");
    {
        CUdeviceptr q = 0;
        CHECK(cu_mem_alloc_managed(&q, (size_t)(20 * GIB), 1) == 2);
    }
    CHECK(callbacks == 2);
    report = slurp(in_dir("driver.json"));
    CHECK(has(report, "\"reported_by\":\"cuMemAllocManaged\""));
    CHECK(has(report, "\"reports_before\":1"));

    /* A failure inside a call on the tracker (its release callback): the
     * report is written without the open phases, and says why. */
    OK(memprobe_tracker_set_oom_report(t, NULL));
    configure(t, "busy.json");
    OK(memprobe_tracker_add_release(t, "greedy", MEMPROBE_RELEASE_CACHE, greedy_release, NULL));
    OK(memprobe_tracker_release_now(t, false, NULL, 0));
    CHECK(callbacks == 3);
    report = slurp(in_dir("busy.json"));
    CHECK(has(report, "\"open_phases\":{\"available\":false,\"reason\":\"not measured: the allocation failed inside a call on this tracker"));
    CHECK(has(report, "\"ended_phases\":{\"kept\":8"));
    CHECK(has(report, "\"requested_bytes\":68719476736"));

    /* The caller's trigger works beside the driver's. */
    OK(memprobe_tracker_set_oom_report(t, NULL));
    configure(t, "caller.json");
    OK(memprobe_tracker_report_oom(t, 0, GIB, "caller beside the driver"));
    CHECK(callbacks == 4);
    CHECK(has(slurp(in_dir("caller.json")), "\"trigger\":\"caller\""));
    /* A caller's report reads what is live now, and says so. */
    CHECK(has(slurp(in_dir("caller.json")), "\"basis\":\"at_report\",\"location\":\"device\",\"device\":0,"));
    CHECK(has(last_summary, "held on GPU 0 at the report: 1.00 GiB: the program 1.00 GiB"));

    /* A second tracker armed on the driver, freed: the next failure writes
     * nothing for it and returns its error unchanged. */
    {
        const memprobe_source *one = alloc;
        memprobe_oom_report_options o;
        OK(memprobe_tracker_new(&one, 1, &t2));
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.triggers = MEMPROBE_OOM_TRIGGER_DRIVER;
        o.path = in_dir("freed.json");
        unlink(o.path);
        OK(memprobe_tracker_set_oom_report(t2, &o));
        /* Driver reports only: the caller's are refused. */
        EXPECT(memprobe_tracker_report_oom(t2, 0, 1, NULL), MEMPROBE_STATUS_WRONG_ORDER);
        FREE_OK(memprobe_tracker_free(t2));
    }
    OK(memprobe_tracker_set_oom_report(t, NULL));
    {
        CUdeviceptr q = 0;
        CHECK(cu_mem_alloc(&q, (size_t)(40 * GIB)) == 2);
    }
    CHECK(access(in_dir("freed.json"), F_OK) != 0);
    CHECK(callbacks == 4); /* nothing new */

    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_STEP, NULL, NULL, NULL, 0));
    OK(memprobe_tracker_end(t, MEMPROBE_PHASE_KIND_EPOCH, NULL, NULL, NULL, 0));
    FREE_OK(memprobe_tracker_free(t));
    CHECK(cu_mem_free(base) == 0);
    FREE_OK(memprobe_source_free(exact));
    FREE_OK(memprobe_source_free(alloc));
    dlclose(lib);
}

static void unavailable(const char *why) {
    memprobe_source *s = NULL;
    memprobe_tracker *t = NULL;
    memprobe_oom_report_options o;
    memprobe_oom_report_status st;
    OK(memprobe_source_new_pushed("x", &s));
    OK(memprobe_tracker_new((const memprobe_source *const *)&s, 1, &t));
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.triggers = MEMPROBE_OOM_TRIGGER_DRIVER;
    o.path = in_dir("unavailable.json");
    EXPECT(memprobe_tracker_set_oom_report(t, &o), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(strstr(memprobe_last_error(), why) != NULL);
    CHECK(strstr(memprobe_last_error(), "LD_PRELOAD") != NULL);
    EXPECT(memprobe_tracker_oom_status(t, &st), MEMPROBE_STATUS_WRONG_ORDER); /* nothing set */
    /* The caller's trigger needs no interposer. */
    o.triggers = MEMPROBE_OOM_TRIGGER_CALLER;
    OK(memprobe_tracker_set_oom_report(t, &o));
    OK(memprobe_tracker_report_oom(t, 0, GIB, NULL));
    CHECK(has(slurp(o.path), "\"driver_counts\":{\"available\":false"));
    CHECK(has(slurp(o.path), "\"held_by_origin\":{\"available\":false"));
    {
        size_t n = 5;
        int32_t device = 5;
        EXPECT(memprobe_gpu_origins_at_oom(NULL, 0, &n, &device, NULL, NULL), MEMPROBE_STATUS_UNAVAILABLE);
        CHECK(n == 0 && device == MEMPROBE_GPU_ORIGINS_NO_OOM);
    }
    FREE_OK(memprobe_tracker_free(t));
    FREE_OK(memprobe_source_free(s));
}

int main(int argc, char **argv) {
    const char *env = getenv("OOM_TEST_DIR");
    if (argc != 2 || !env) return 2;
    snprintf(dir, sizeof dir, "%s", env);
    if (strcmp(argv[1], "interposed") == 0) {
        interposed();
    } else if (strcmp(argv[1], "off") == 0) {
        unavailable("MEMPROBE_GPU_EXACT=off");
    } else if (strcmp(argv[1], "plain") == 0) {
        unavailable("not loaded");
    } else {
        return 2;
    }
    return check_summary();
}
