/* The GPU part of the C ABI against the fake NVML / CUDA runtime libraries of
 * tests/fake-gpu. The GPUs are opened once per process, so each scenario is a
 * separate run with its own environment and fake script, chosen by argv[1]
 * (tests/tests/gpu_abi.rs writes the scripts and sets the environment):
 *
 *   nogpu <none|absent|partial|nodriver|badenv|zero>   zeros + a status
 *   one          one device: every call, NULL for every pointer, handles,
 *                the cache-release callback, preload, sources
 *   eight        eight devices: all readings, buffers, max free, handles
 *   trace        a trace over host + GPU reports both
 *   visible <expected>   CUDA_VISIBLE_DEVICES mapping ("3,1", "m" = the MIG
 *                instance, "-" = none visible)
 *   lost         a GPU lost while the monitor polls it
 *   spike        a 5 ms GPU spike caught at a 1 ms monitor interval
 *   configure    memprobe_gpu_configure before and after first use
 *   cudart       the CUDA runtime backend
 *   fork         fork() while the monitor polls a GPU: the child's GPU calls work
 */
#include <dlfcn.h>
#include <sys/wait.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "spike.h"

#define GIB ((uint64_t)1 << 30)

/* --- helpers ------------------------------------------------------------- */

static void poison(void *p, size_t n) { memset(p, 0xAB, n); }

/* Whether memprobe left poisoned bytes untouched. */
static int is_poisoned(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++)
        if (b[i] != 0xAB) return 0;
    return 1;
}

static int mem_is_zero(const memprobe_gpu_memory *m) {
    return m->total == 0 && m->free == 0 && m->used == 0 && m->reserved == 0 && m->valid == 0 &&
           m->taken_at_ns == 0 && m->read_ns == 0;
}

static int info_is_zero(const memprobe_gpu_info *i) {
    memprobe_gpu_info zero;
    memset(&zero, 0, sizeof zero);
    return memcmp(i, &zero, sizeof zero) == 0;
}

static int error_has(const char *needle) { return strstr(memprobe_last_error(), needle) != NULL; }

/* A function of an already loaded fake library (the instance memprobe uses). */
static void *fake_symbol(const char *env, const char *name) {
    const char *path = getenv(env);
    void *h, *sym;
    if (!path) return NULL;
    h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return NULL;
    sym = dlsym(h, name);
    dlclose(h); /* memprobe keeps it loaded */
    return sym;
}

/* fake_nvml_calls(what): how often the fake NVML answered a query; -1 if unknown. */
static long long nvml_calls(const char *what) {
    long long (*f)(const char *);
    void *p = fake_symbol("MEMPROBE_NVML_LIBRARY", "fake_nvml_calls");
    if (!p) return -1;
    memcpy(&f, &p, sizeof f);
    return f(what);
}

static int cudart_contexts(void) {
    int (*f)(void);
    void *p = fake_symbol("MEMPROBE_CUDART_LIBRARY", "fake_cudart_contexts");
    if (!p) return -1;
    memcpy(&f, &p, sizeof f);
    return f();
}

static void sleep_ms(long ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

/* The cache-release callback: counts calls, records the fake's memory-query
 * count at the time of the call, fails when asked. */
struct release_state {
    int calls;
    long long queries_at_call;
    int32_t fail_with;
    int read_inside; /* read GPU memory from inside the callback */
    int reenter;     /* make a *_no_cache reading from inside the callback */
    memprobe_status inside_status;
    char inside_error[256];
};

static int32_t on_release(void *user_data) {
    struct release_state *st = (struct release_state *)user_data;
    st->calls++;
    st->queries_at_call = nvml_calls("memory_v2");
    if (st->read_inside) {
        uint64_t used = 0;
        st->inside_status = memprobe_gpu_mem_get_used(&used);
    }
    if (st->reenter) {
        uint64_t v = 0;
        /* Would call this callback again, without bound: WRONG_ORDER instead. */
        st->inside_status = st->reenter == 1 ? memprobe_gpu_mem_get_used_no_cache(&v)
                                             : memprobe_gpu_mem_get_free_no_cache(&v);
        snprintf(st->inside_error, sizeof st->inside_error, "%s", memprobe_last_error());
    }
    return st->fail_with;
}

/* --- no GPU: zeros plus a status ----------------------------------------- */

static void scenario_nogpu(const char *variant) {
    memprobe_status want = MEMPROBE_STATUS_UNAVAILABLE;
    const char *why = "";
    int zero_devices = strcmp(variant, "zero") == 0;
    uint32_t n = 99, backend = 99, cur = 99;
    memprobe_gpu_info info;
    memprobe_gpu_memory m, all[4];
    uint64_t v;
    int64_t id = 5;
    size_t count = 99;
    memprobe_gpu_device *dev = NULL;
    memprobe_source *src = NULL;
    struct release_state rel;

    memset(&rel, 0, sizeof rel);
    if (strcmp(variant, "none") == 0) {
        why = "disabled";
    } else if (strcmp(variant, "absent") == 0) {
        why = "/nonexistent/libnvidia-ml.so.1";
    } else if (strcmp(variant, "partial") == 0) {
        why = "nvmlInit_v2";
    } else if (strcmp(variant, "nodriver") == 0) {
        why = "NVML_ERROR_DRIVER_NOT_LOADED";
    } else if (strcmp(variant, "badenv") == 0) {
        want = MEMPROBE_STATUS_INVALID_ARGUMENT;
        why = "rocm";
    } else if (zero_devices) {
        why = "NVML reports no GPU";
    } else {
        CHECK(!"unknown nogpu variant");
    }

    if (zero_devices) {
        OK(memprobe_gpu_count(&n));
    } else {
        EXPECT(memprobe_gpu_count(&n), want);
        CHECK(error_has(why));
    }
    CHECK(n == 0);
    OK(memprobe_gpu_get_backend(&backend));
    CHECK(backend == (zero_devices ? MEMPROBE_GPU_BACKEND_NVML : MEMPROBE_GPU_BACKEND_NONE));

    poison(&info, sizeof info);
    EXPECT(memprobe_gpu_get_info(0, &info), want);
    CHECK(info_is_zero(&info) && error_has(why));

    poison(&m, sizeof m);
    EXPECT(memprobe_gpu_mem_get(MEMPROBE_GPU_CURRENT_DEVICE, &m), want);
    CHECK(mem_is_zero(&m) && error_has(why));
    poison(&m, sizeof m);
    EXPECT(memprobe_gpu_mem_get(0, &m), want);
    CHECK(mem_is_zero(&m));
    /* A malformed id is an invalid id whether or not there is a GPU. */
    poison(&m, sizeof m);
    EXPECT(memprobe_gpu_mem_get(-2, &m), MEMPROBE_STATUS_INVALID_ID);
    CHECK(mem_is_zero(&m));

    /* Only the entries filled are written (none here): not the capacity
     * claimed, nor a capacity given in bytes, nor SIZE_MAX. */
    poison(all, sizeof all);
    EXPECT(memprobe_gpu_mem_get_all(all, 4, &count), want);
    CHECK(count == 0 && is_poisoned(all, sizeof all));
    EXPECT(memprobe_gpu_mem_get_all(all, SIZE_MAX, &count), want);
    CHECK(count == 0 && is_poisoned(all, sizeof all));
    count = 99;
    EXPECT(memprobe_gpu_mem_get_all(NULL, 0, &count), want);
    CHECK(count == 0);

    v = 123;
    EXPECT(memprobe_gpu_mem_get_free(&v), want);
    CHECK(v == 0);
    v = 123;
    EXPECT(memprobe_gpu_mem_get_used(&v), want);
    CHECK(v == 0);
    /* The *_no_cache readings call the release callback first, GPU or not. */
    OK(memprobe_gpu_set_cache_release(on_release, &rel));
    v = 123;
    EXPECT(memprobe_gpu_mem_get_free_no_cache(&v), want);
    CHECK(v == 0 && rel.calls == 1);
    v = 123;
    EXPECT(memprobe_gpu_mem_get_used_no_cache(&v), want);
    CHECK(v == 0 && rel.calls == 2);
    /* Re-entry from the callback is refused, GPU or not. */
    rel.reenter = 1;
    EXPECT(memprobe_gpu_mem_get_used_no_cache(&v), want);
    CHECK(rel.calls == 3 && rel.inside_status == MEMPROBE_STATUS_WRONG_ORDER);
    rel.reenter = 0;
    OK(memprobe_gpu_set_cache_release(NULL, NULL));

    v = 123;
    EXPECT(memprobe_gpu_with_max_free_mem(&id, &v), want);
    CHECK(id == MEMPROBE_GPU_NO_DEVICE && v == 0 && error_has(why));

    if (zero_devices) {
        OK(memprobe_gpu_get_current_device(&cur));
    } else {
        EXPECT(memprobe_gpu_get_current_device(&cur), want);
    }
    CHECK(cur == 0);
    EXPECT(memprobe_gpu_set_current_device(0), want);
    EXPECT(memprobe_gpu_preload(), want);

    EXPECT(memprobe_gpu_device_open(0, &dev), want);
    CHECK(dev == NULL);
    EXPECT(memprobe_source_new_gpu_device(0, &src), want);
    CHECK(src == NULL && error_has(why));
    EXPECT(memprobe_source_new_gpu_process(0, &src), want);
    CHECK(src == NULL);

    /* Too late to configure; unknown backends are rejected first. */
    EXPECT(memprobe_gpu_configure(MEMPROBE_GPU_BACKEND_NVML, NULL, NULL), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_gpu_configure(4, NULL, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
}

/* --- one device: every call ---------------------------------------------- */

static void check_nulls(void) {
    memprobe_gpu_device *dev = NULL;
    memprobe_gpu_memory m;
    uint64_t v;
    int64_t id;
    size_t count;

    EXPECT(memprobe_gpu_get_backend(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_count(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_get_info(0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_mem_get(0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_mem_get_all(&m, 1, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_mem_get_all(NULL, 1, &count), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_mem_get_free(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_mem_get_used(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_mem_get_free_no_cache(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_mem_get_used_no_cache(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_with_max_free_mem(NULL, &v), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_with_max_free_mem(&id, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_get_current_device(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_device_open(0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_mem_get_used_fast(NULL, &v), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_device_mem_get(NULL, &m), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_device_process_used(NULL, &v), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_debug_live_devices(NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_gpu_device(0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_new_gpu_process(0, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_gpu_device_open(0, &dev));
    EXPECT(memprobe_gpu_mem_get_used_fast(dev, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_device_mem_get(dev, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_gpu_device_process_used(dev, NULL), MEMPROBE_STATUS_NULL_POINTER);
    FREE_OK(memprobe_gpu_device_free(dev));
    FREE_OK(memprobe_gpu_device_free(NULL));
}

static void check_cache_release(void) {
    struct release_state rel;
    uint64_t used = 0, free_bytes = 0, plain_used = 0;
    long long before;

    memset(&rel, 0, sizeof rel);
    OK(memprobe_gpu_mem_get_used(&plain_used));
    /* No callback: the *_no_cache readings just read. */
    OK(memprobe_gpu_mem_get_used_no_cache(&used));
    CHECK(used == plain_used);

    OK(memprobe_gpu_set_cache_release(on_release, &rel));
    before = nvml_calls("memory_v2");
    CHECK(before > 0);
    OK(memprobe_gpu_mem_get_used_no_cache(&used));
    /* Called once, before the driver query. */
    CHECK(rel.calls == 1 && rel.queries_at_call == before);
    CHECK(nvml_calls("memory_v2") == before + 1);
    CHECK(used == plain_used);
    before = nvml_calls("memory_v2");
    OK(memprobe_gpu_mem_get_free_no_cache(&free_bytes));
    CHECK(rel.calls == 2 && rel.queries_at_call == before && free_bytes > 0);

    /* The callback may call memprobe. */
    rel.read_inside = 1;
    OK(memprobe_gpu_mem_get_used_no_cache(&used));
    CHECK(rel.calls == 3 && rel.inside_status == MEMPROBE_STATUS_OK);
    rel.read_inside = 0;

    /* ... but a *_no_cache reading inside it is WRONG_ORDER, as every other
     * callback re-entry: called once, no recursion; the outer reading works. */
    rel.reenter = 1;
    OK(memprobe_gpu_mem_get_used_no_cache(&used));
    CHECK(rel.calls == 4 && rel.inside_status == MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(strstr(rel.inside_error, "inside the cache-release callback") != NULL);
    CHECK(used == plain_used);
    rel.reenter = 2;
    OK(memprobe_gpu_mem_get_free_no_cache(&free_bytes));
    CHECK(rel.calls == 5 && rel.inside_status == MEMPROBE_STATUS_WRONG_ORDER);
    rel.reenter = 0;
    /* And the flag is cleared once the callback returns. */
    OK(memprobe_gpu_mem_get_used_no_cache(&used));
    CHECK(rel.calls == 6);
    rel.calls = 3;

    /* A failing callback: 0, an error status, and no driver query. */
    rel.fail_with = 3;
    before = nvml_calls("memory_v2");
    used = 77;
    EXPECT(memprobe_gpu_mem_get_used_no_cache(&used), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(used == 0 && error_has("cache-release callback returned 3"));
    free_bytes = 77;
    EXPECT(memprobe_gpu_mem_get_free_no_cache(&free_bytes), MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(free_bytes == 0 && rel.calls == 5);
    CHECK(nvml_calls("memory_v2") == before);
    /* The plain readings never call it. */
    OK(memprobe_gpu_mem_get_used(&used));
    CHECK(rel.calls == 5);

    /* NULL removes it. */
    OK(memprobe_gpu_set_cache_release(NULL, &rel));
    OK(memprobe_gpu_mem_get_used_no_cache(&used));
    CHECK(rel.calls == 5 && used == plain_used);
}

static void check_devices_one(void) {
    memprobe_gpu_device *dev = NULL, *other = NULL, *bad = NULL;
    memprobe_gpu_memory m;
    memprobe_source *src = NULL;
    uint64_t v = 0, live = 99;

    EXPECT(memprobe_gpu_device_open(1, &bad), MEMPROBE_STATUS_INVALID_ID);
    CHECK(bad == NULL);
    OK(memprobe_gpu_device_open(0, &dev));
    CHECK(dev != NULL);
    OK(memprobe_gpu_mem_get_used_fast(dev, &v));
    CHECK(v == 10 * GIB);
    OK(memprobe_gpu_device_mem_get(dev, &m));
    CHECK(m.used == 10 * GIB && m.total == 80 * GIB && m.reserved == GIB / 2);
    CHECK(m.valid == (MEMPROBE_GPU_MEMORY_READ | MEMPROBE_GPU_MEMORY_RESERVED));
    OK(memprobe_gpu_device_process_used(dev, &v));
    CHECK(v == 3 * GIB);

    /* Two handles to one device are independent. */
    OK(memprobe_gpu_device_open(0, &other));
    OK(memprobe_gpu_debug_live_devices(&live));
    CHECK(live == 2);
    FREE_OK(memprobe_gpu_device_free(other));

    /* Stale, double-freed, forged and wrongly typed handles. */
    FREE_OK(memprobe_gpu_device_free(dev));
    v = 5;
    EXPECT(memprobe_gpu_mem_get_used_fast(dev, &v), MEMPROBE_STATUS_INVALID_HANDLE);
    CHECK(v == 0);
    EXPECT(memprobe_gpu_device_free(dev), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_gpu_device_mem_get(dev, &m), MEMPROBE_STATUS_INVALID_HANDLE);
    CHECK(mem_is_zero(&m));
    EXPECT(memprobe_gpu_device_process_used(dev, &v), MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_gpu_mem_get_used_fast((const memprobe_gpu_device *)(uintptr_t)0x4711, &v),
           MEMPROBE_STATUS_INVALID_HANDLE);
    EXPECT(memprobe_gpu_mem_get_used_fast((const memprobe_gpu_device *)&v, &v), MEMPROBE_STATUS_INVALID_HANDLE);
    OK(memprobe_source_new_gpu_device(0, &src));
    EXPECT(memprobe_gpu_mem_get_used_fast((const memprobe_gpu_device *)src, &v), MEMPROBE_STATUS_INVALID_HANDLE);
    {
        /* A freed handle whose slot was reused stays invalid; and a device
         * handle is no source. */
        memprobe_gpu_device *again = NULL;
        memprobe_sample s;
        OK(memprobe_gpu_device_open(0, &again));
        EXPECT(memprobe_gpu_mem_get_used_fast(dev, &v), MEMPROBE_STATUS_INVALID_HANDLE);
        OK(memprobe_gpu_mem_get_used_fast(again, &v));
        EXPECT(memprobe_source_read((const memprobe_source *)again, &s), MEMPROBE_STATUS_INVALID_HANDLE);
        FREE_OK(memprobe_gpu_device_free(again));
    }
    FREE_OK(memprobe_source_free(src));
    OK(memprobe_gpu_debug_live_devices(&live));
    CHECK(live == 0);
}

static void check_sources_one(void) {
    memprobe_source *dev = NULL, *proc = NULL, *bad = NULL;
    memprobe_source_info info;
    memprobe_sample s;
    memprobe_status last = MEMPROBE_STATUS_PANIC;
    char buf[64];
    size_t needed = 99;

    EXPECT(memprobe_source_new_gpu_device(1, &bad), MEMPROBE_STATUS_INVALID_ID);
    EXPECT(memprobe_source_new_gpu_process(1, &bad), MEMPROBE_STATUS_INVALID_ID);
    CHECK(bad == NULL);
    OK(memprobe_source_new_gpu_device(0, &dev));
    OK(memprobe_source_get_info(dev, &info));
    CHECK(info.kind == MEMPROBE_SOURCE_KIND_GPU_DEVICE && info.fidelity == MEMPROBE_FIDELITY_SAMPLED);
    CHECK(strcmp(info.name, "gpu0") == 0);
    OK(memprobe_source_read(dev, &s));
    CHECK(s.used == 10 * GIB && s.total == 80 * GIB && s.reserved == GIB / 2);
    CHECK(s.free == 80 * GIB - 10 * GIB - GIB / 2);
    CHECK(s.valid == (MEMPROBE_SAMPLE_TOTAL | MEMPROBE_SAMPLE_FREE | MEMPROBE_SAMPLE_RESERVED));
    CHECK(s.taken_at_ns > 0);
    EXPECT(memprobe_source_push(dev, 1), MEMPROBE_STATUS_UNSUPPORTED);

    OK(memprobe_source_new_gpu_process(0, &proc));
    OK(memprobe_source_get_info(proc, &info));
    CHECK(info.kind == MEMPROBE_SOURCE_KIND_GPU_PROCESS && info.fidelity == MEMPROBE_FIDELITY_SAMPLED);
    CHECK(strcmp(info.name, "gpu0.proc") == 0);
    OK(memprobe_source_read(proc, &s));
    CHECK(s.used == 3 * GIB && s.total == 80 * GIB && s.valid == MEMPROBE_SAMPLE_TOTAL);

    /* A healthy source has no last error. */
    OK(memprobe_source_get_last_error(dev, &last, buf, sizeof buf, &needed));
    CHECK(last == MEMPROBE_STATUS_OK && buf[0] == '\0' && needed == 1);
    EXPECT(memprobe_source_get_last_error(dev, NULL, buf, sizeof buf, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_get_last_error(NULL, &last, buf, sizeof buf, NULL), MEMPROBE_STATUS_NULL_POINTER);
    EXPECT(memprobe_source_get_last_error(dev, &last, NULL, 4, NULL), MEMPROBE_STATUS_NULL_POINTER);
    OK(memprobe_source_get_last_error(dev, &last, NULL, 0, NULL));

    FREE_OK(memprobe_source_free(dev));
    FREE_OK(memprobe_source_free(proc));
    EXPECT(memprobe_source_read(dev, &s), MEMPROBE_STATUS_INVALID_HANDLE);
}

static void scenario_one(void) {
    uint32_t n = 0, backend = 0, cur = 9;
    memprobe_gpu_info info;
    memprobe_gpu_memory m, cur_m, all[2];
    uint64_t v = 0, free_bytes = 0;
    int64_t id = 9;
    size_t count = 0;

    OK(memprobe_gpu_count(&n));
    CHECK(n == 1);
    OK(memprobe_gpu_get_backend(&backend));
    CHECK(backend == MEMPROBE_GPU_BACKEND_NVML);

    poison(&info, sizeof info);
    OK(memprobe_gpu_get_info(0, &info));
    CHECK(info.id == 0 && info.backend == MEMPROBE_GPU_BACKEND_NVML && info.nvml_index == 0);
    CHECK(info.valid == (MEMPROBE_GPU_INFO_NAME | MEMPROBE_GPU_INFO_UUID | MEMPROBE_GPU_INFO_NVML_INDEX));
    CHECK(strcmp(info.name, "NVIDIA H100 80GB HBM3") == 0);
    CHECK(strcmp(info.uuid, "GPU-5f8a1c2e-0000-4000-8000-00000000abcd") == 0);
    CHECK(info.pci_bus_id[0] == '\0');
    poison(&info, sizeof info);
    EXPECT(memprobe_gpu_get_info(1, &info), MEMPROBE_STATUS_INVALID_ID);
    CHECK(info_is_zero(&info) && error_has("no GPU 1"));

    poison(&m, sizeof m);
    OK(memprobe_gpu_mem_get(0, &m));
    CHECK(m.total == 80 * GIB && m.used == 10 * GIB && m.reserved == GIB / 2);
    CHECK(m.free == m.total - m.used - m.reserved);
    CHECK(m.valid == (MEMPROBE_GPU_MEMORY_READ | MEMPROBE_GPU_MEMORY_RESERVED));
    CHECK(m.taken_at_ns > 0 && m.read_ns < 1000000000ULL);
    OK(memprobe_gpu_mem_get(MEMPROBE_GPU_CURRENT_DEVICE, &cur_m));
    CHECK(cur_m.used == m.used && cur_m.total == m.total);
    {
        const int64_t bad_ids[] = {1, 7, -2, INT64_MIN, (int64_t)UINT32_MAX + 1};
        size_t i;
        for (i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
            poison(&m, sizeof m);
            EXPECT(memprobe_gpu_mem_get(bad_ids[i], &m), MEMPROBE_STATUS_INVALID_ID);
            CHECK(mem_is_zero(&m));
        }
    }

    OK(memprobe_gpu_mem_get_all(NULL, 0, &count));
    CHECK(count == 1);
    poison(all, sizeof all);
    OK(memprobe_gpu_mem_get_all(all, 2, &count));
    CHECK(count == 1 && all[0].used == 10 * GIB && is_poisoned(&all[1], sizeof all[1]));
    /* A capacity in bytes instead of entries: still only the one entry. */
    poison(all, sizeof all);
    OK(memprobe_gpu_mem_get_all(all, sizeof all, &count));
    CHECK(count == 1 && all[0].used == 10 * GIB && is_poisoned(&all[1], sizeof all[1]));

    FREE_OK(memprobe_gpu_mem_get_free(&free_bytes));
    CHECK(free_bytes == cur_m.free);
    OK(memprobe_gpu_mem_get_used(&v));
    CHECK(v == 10 * GIB);
    OK(memprobe_gpu_with_max_free_mem(&id, &v));
    CHECK(id == 0 && v == cur_m.free);

    OK(memprobe_gpu_get_current_device(&cur));
    CHECK(cur == 0);
    EXPECT(memprobe_gpu_set_current_device(1), MEMPROBE_STATUS_INVALID_ID);
    CHECK(error_has("no GPU 1"));
    OK(memprobe_gpu_set_current_device(0));

    check_nulls();
    check_cache_release();
    check_devices_one();
    check_sources_one();

    /* preload: a CUDA context through the (fake) runtime, even under NVML. */
    CHECK(cudart_contexts() == -1); /* not loaded yet */
    OK(memprobe_gpu_preload());
    CHECK(cudart_contexts() == 1);

    /* Configuring is for before the first use. */
    EXPECT(memprobe_gpu_configure(MEMPROBE_GPU_BACKEND_AUTO, NULL, NULL), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_gpu_configure(77, NULL, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
}

/* --- eight devices ------------------------------------------------------- */

/* Device i uses (i + 1) GiB, except device 3 (512 MiB): it has the most free. */
static uint64_t eight_used(int i) { return i == 3 ? GIB / 2 : (uint64_t)(i + 1) * GIB; }

static void scenario_eight(void) {
    uint32_t n = 0;
    int i;
    memprobe_gpu_info info;
    memprobe_gpu_memory all[9], m;
    memprobe_gpu_device *devs[8];
    memprobe_source *srcs[9];
    memprobe_window *w = NULL;
    size_t count = 0;
    int64_t id = -5;
    uint64_t v = 0, peak = 0, live = 9;

    OK(memprobe_gpu_count(&n));
    CHECK(n == 8);
    for (i = 0; i < 8; i++) {
        char name[32];
        OK(memprobe_gpu_get_info((uint32_t)i, &info));
        snprintf(name, sizeof name, "Fake GPU %d", i);
        CHECK(info.id == (uint32_t)i && info.nvml_index == (uint32_t)i && strcmp(info.name, name) == 0);
        CHECK(strncmp(info.uuid, "GPU-", 4) == 0);
    }
    EXPECT(memprobe_gpu_get_info(8, &info), MEMPROBE_STATUS_INVALID_ID);
    EXPECT(memprobe_gpu_mem_get(8, &m), MEMPROBE_STATUS_INVALID_ID);
    CHECK(mem_is_zero(&m) && error_has("sees 8"));

    poison(all, sizeof all);
    OK(memprobe_gpu_mem_get_all(all, 9, &count));
    CHECK(count == 8);
    for (i = 0; i < 8; i++) {
        CHECK(all[i].used == eight_used(i) && all[i].total == 16 * GIB);
        CHECK(all[i].valid == (MEMPROBE_GPU_MEMORY_READ | MEMPROBE_GPU_MEMORY_RESERVED));
    }
    CHECK(is_poisoned(&all[8], sizeof all[8]));
    /* SIZE_MAX or a byte count as the capacity: 8 entries written, no more. */
    poison(all, sizeof all);
    OK(memprobe_gpu_mem_get_all(all, SIZE_MAX, &count));
    CHECK(count == 8 && all[7].used == eight_used(7) && is_poisoned(&all[8], sizeof all[8]));
    poison(all, sizeof all);
    OK(memprobe_gpu_mem_get_all(all, sizeof all, &count));
    CHECK(count == 8 && all[7].used == eight_used(7) && is_poisoned(&all[8], sizeof all[8]));
    /* Too small: what fits, the count, BUFFER_TOO_SMALL; nothing past capacity. */
    poison(all, sizeof all);
    count = 0;
    EXPECT(memprobe_gpu_mem_get_all(all, 3, &count), MEMPROBE_STATUS_BUFFER_TOO_SMALL);
    CHECK(count == 8 && all[0].used == eight_used(0) && all[2].used == eight_used(2));
    CHECK(all[3].valid == 0xABABABABu && error_has("8 GPUs"));
    OK(memprobe_gpu_mem_get_all(NULL, 0, &count));
    CHECK(count == 8);

    OK(memprobe_gpu_with_max_free_mem(&id, &v));
    CHECK(id == 3 && v == 16 * GIB - GIB / 2);

    OK(memprobe_gpu_set_current_device(7));
    OK(memprobe_gpu_mem_get(MEMPROBE_GPU_CURRENT_DEVICE, &m));
    CHECK(m.used == eight_used(7));
    OK(memprobe_gpu_mem_get_used(&v));
    CHECK(v == eight_used(7));
    FREE_OK(memprobe_gpu_mem_get_free(&v));
    CHECK(v == 16 * GIB - eight_used(7));
    EXPECT(memprobe_gpu_set_current_device(8), MEMPROBE_STATUS_INVALID_ID);
    OK(memprobe_gpu_set_current_device(0));

    for (i = 0; i < 8; i++) {
        OK(memprobe_gpu_device_open((uint32_t)i, &devs[i]));
    }
    OK(memprobe_gpu_debug_live_devices(&live));
    CHECK(live == 8);
    for (i = 0; i < 8; i++) {
        OK(memprobe_gpu_mem_get_used_fast(devs[i], &v));
        CHECK(v == eight_used(i));
        FREE_OK(memprobe_gpu_device_free(devs[i]));
    }

    /* One window over the host and all eight GPUs; the monitor polls them. */
    OK(memprobe_source_new_process(0, &srcs[0]));
    for (i = 0; i < 8; i++) OK(memprobe_source_new_gpu_device((uint32_t)i, &srcs[i + 1]));
    OK(memprobe_window_open((const memprobe_source *const *)srcs, 9, &w));
    {
        memprobe_monitor_stats st;
        OK(memprobe_monitor_get_stats(&st));
        CHECK(st.running && st.watched == 8);
    }
    for (i = 0; i < 8; i++) {
        OK(memprobe_window_peak(w, (size_t)i + 1, &peak));
        CHECK(peak == eight_used(i));
    }
    FREE_OK(memprobe_window_free(w));
    for (i = 0; i < 9; i++) FREE_OK(memprobe_source_free(srcs[i]));
    OK(memprobe_monitor_stop());
}

/* --- a trace over host + GPU ------------------------------------------------ */

static void scenario_trace(void) {
    memprobe_source *rss = NULL, *gpu = NULL;
    const memprobe_source *srcs[2];
    memprobe_trace *t = NULL;
    memprobe_delta d;
    char line[256];
    int64_t used = 0;
    uint64_t peaked = 0;

    OK(memprobe_monitor_set_interval_ns(1000000));
    OK(memprobe_source_new_process(0, &rss));
    /* The script answers 1 GiB to the first query of gpu0, 3 GiB after. */
    OK(memprobe_source_new_gpu_device(0, &gpu));
    srcs[0] = rss;
    srcs[1] = gpu;
    OK(memprobe_trace_new(srcs, 2, "train", MEMPROBE_TRACE_SILENT, &t));
    CHECK(spike(64 * MIB));
    OK(memprobe_trace_data(t, 1, &used, &peaked));
    CHECK(used == (int64_t)(2 * GIB) && peaked == 0);
    OK(memprobe_trace_measure(t, 0, &d));
    CHECK(d.kind == MEMPROBE_SOURCE_KIND_PROCESS && d.peak >= d.used_start + 64 * MIB - SLACK);
    OK(memprobe_trace_measure(t, 1, &d));
    CHECK(d.kind == MEMPROBE_SOURCE_KIND_GPU_DEVICE && d.fidelity == MEMPROBE_FIDELITY_SAMPLED);
    CHECK(d.used_start == GIB && d.used_end == 3 * GIB && d.peak == 3 * GIB);
    OK(memprobe_trace_format(t, "epoch 1", line, sizeof line, NULL));
    /* fastai's line, one group per source. */
    {
        const char *prefix = "\xe2\x96\xb3Used Peaked MB: rss ";
        const char *gpu_group = " | gpu0  2,048      0 (train: epoch 1)";
        size_t n = strlen(line), g = strlen(gpu_group);
        CHECK(strncmp(line, prefix, strlen(prefix)) == 0);
        CHECK(n > g && strcmp(line + n - g, gpu_group) == 0);
        if (n <= g || strcmp(line + n - g, gpu_group) != 0) fprintf(stderr, "line: %s\n", line);
    }
    FREE_OK(memprobe_trace_free(t));
    FREE_OK(memprobe_source_free(rss));
    FREE_OK(memprobe_source_free(gpu));
    OK(memprobe_monitor_stop());
}

/* --- CUDA_VISIBLE_DEVICES ------------------------------------------------- */

/* The script: physical device k uses (k + 1) GiB; the MIG instance 7 GiB. */
static void scenario_visible(const char *expected) {
    uint32_t n = 99, want = 0;
    int i;
    memprobe_gpu_info info;
    memprobe_gpu_memory m;
    const char *p;

    if (strcmp(expected, "-") == 0) {
        OK(memprobe_gpu_count(&n));
        CHECK(n == 0);
        EXPECT(memprobe_gpu_mem_get(0, &m), MEMPROBE_STATUS_UNAVAILABLE);
        CHECK(mem_is_zero(&m) && error_has("CUDA_VISIBLE_DEVICES"));
        return;
    }
    for (p = expected; *p; p++) want += *p != ',';
    OK(memprobe_gpu_count(&n));
    CHECK(n == want);
    for (i = 0, p = expected; *p; p++) {
        if (*p == ',') continue;
        OK(memprobe_gpu_get_info((uint32_t)i, &info));
        OK(memprobe_gpu_mem_get(i, &m));
        CHECK(info.id == (uint32_t)i);
        if (*p == 'm') {
            CHECK(strncmp(info.uuid, "MIG-", 4) == 0);
            CHECK(!(info.valid & MEMPROBE_GPU_INFO_NVML_INDEX));
            CHECK(m.used == 7 * GIB);
        } else {
            uint32_t k = (uint32_t)(*p - '0');
            CHECK((info.valid & MEMPROBE_GPU_INFO_NVML_INDEX) && info.nvml_index == k);
            CHECK(m.used == (uint64_t)(k + 1) * GIB);
        }
        i++;
    }
    EXPECT(memprobe_gpu_mem_get(i, &m), MEMPROBE_STATUS_INVALID_ID);
}

/* --- a GPU lost while the monitor polls ------------------------------------ */

static void scenario_lost(void) {
    memprobe_source *tree = NULL, *rss = NULL, *gpu = NULL;
    const memprobe_source *srcs[3];
    memprobe_window *w = NULL;
    memprobe_gpu_device *dev = NULL;
    memprobe_monitor_stats st;
    memprobe_delta d;
    memprobe_sample s;
    memprobe_gpu_memory all[2];
    memprobe_status last = MEMPROBE_STATUS_OK;
    char msg[256];
    uint64_t peak = 0, v = 9, errors_at_loss, reads_at_loss;
    int64_t id = -5;
    size_t count = 0;
    int i;

    OK(memprobe_monitor_set_interval_ns(1000000));
    OK(memprobe_gpu_device_open(0, &dev));
    OK(memprobe_source_new_process_tree(&tree)); /* sampled: the monitor polls it */
    OK(memprobe_source_new_process(0, &rss));    /* exact */
    OK(memprobe_source_new_gpu_device(0, &gpu)); /* the script loses it at its 30th query */
    srcs[0] = tree;
    srcs[1] = rss;
    srcs[2] = gpu;
    OK(memprobe_window_open(srcs, 3, &w));
    for (i = 0; i < 5000; i++) {
        OK(memprobe_monitor_get_stats(&st));
        if (st.errors > 0) break;
        sleep_ms(1);
    }
    CHECK(st.errors > 0);
    errors_at_loss = st.errors;
    reads_at_loss = st.reads;

    /* The GPU source says so, through reads and its last error. */
    OK(memprobe_source_get_last_error(gpu, &last, msg, sizeof msg, NULL));
    CHECK(last == MEMPROBE_STATUS_GPU_LOST && strstr(msg, "NVML_ERROR_GPU_IS_LOST") != NULL);
    EXPECT(memprobe_source_read(gpu, &s), MEMPROBE_STATUS_GPU_LOST);
    CHECK(error_has("GPU_IS_LOST"));
    EXPECT(memprobe_window_peak(w, 2, &peak), MEMPROBE_STATUS_GPU_LOST);
    EXPECT(memprobe_window_measure(w, 2, &d), MEMPROBE_STATUS_GPU_LOST);

    /* The host readings of the same window go on. */
    OK(memprobe_window_measure(w, 1, &d));
    CHECK(spike(64 * MIB));
    OK(memprobe_window_peak(w, 1, &peak));
    CHECK(peak >= d.used_start + 64 * MIB - SLACK);
    for (i = 0; i < 5000; i++) {
        OK(memprobe_monitor_get_stats(&st));
        if (st.reads >= reads_at_loss + 5 && st.errors >= errors_at_loss + 5) break;
        sleep_ms(1);
    }
    CHECK(st.reads >= reads_at_loss + 5);   /* the tree source is still polled */
    CHECK(st.errors >= errors_at_loss + 5); /* and so is the lost GPU, failing */
    OK(memprobe_window_peak(w, 0, &peak));
    CHECK(peak > 0);
    OK(memprobe_window_measure(w, 0, &d));

    /* fastai's readings: zeros plus GPU_LOST; the other device still counts. */
    v = 9;
    EXPECT(memprobe_gpu_mem_get_used_fast(dev, &v), MEMPROBE_STATUS_GPU_LOST);
    CHECK(v == 0);
    EXPECT(memprobe_gpu_mem_get(0, &all[0]), MEMPROBE_STATUS_GPU_LOST);
    CHECK(mem_is_zero(&all[0]));
    EXPECT(memprobe_gpu_mem_get_all(all, 2, &count), MEMPROBE_STATUS_GPU_LOST);
    CHECK(count == 2 && mem_is_zero(&all[0]) && all[1].used == GIB);
    EXPECT(memprobe_gpu_with_max_free_mem(&id, &v), MEMPROBE_STATUS_GPU_LOST);
    CHECK(id == 1 && v == 15 * GIB);

    FREE_OK(memprobe_window_free(w));
    FREE_OK(memprobe_gpu_device_free(dev));
    FREE_OK(memprobe_source_free(tree));
    FREE_OK(memprobe_source_free(rss));
    FREE_OK(memprobe_source_free(gpu));
    OK(memprobe_monitor_stop());
}

/* --- a 5 ms spike at a 1 ms monitor interval -------------------------------- */

static void scenario_spike(void) {
    memprobe_source *gpu = NULL;
    const memprobe_source *srcs[1];
    memprobe_window *w = NULL;
    memprobe_monitor_stats st;
    uint64_t peak = 0;
    int i;

    OK(memprobe_monitor_set_interval_ns(1000000));
    /* The script: 1 GiB, and 3 GiB for 5 ms of every 100 ms. */
    OK(memprobe_source_new_gpu_device(0, &gpu));
    srcs[0] = gpu;
    OK(memprobe_window_open(srcs, 1, &w));
    OK(memprobe_monitor_get_stats(&st));
    CHECK(st.running && st.watched == 1 && st.interval_ns == 1000000);
    for (i = 0; i < 100 && peak < 3 * GIB; i++) {
        sleep_ms(50);
        OK(memprobe_window_peak(w, 0, &peak));
    }
    CHECK(peak == 3 * GIB);
    FREE_OK(memprobe_window_free(w));
    FREE_OK(memprobe_source_free(gpu));
    OK(memprobe_monitor_stop());
}

/* --- configure -------------------------------------------------------------- */

static void scenario_configure(void) {
    const char *nvml = getenv("MEMPROBE_TEST_NVML");
    uint32_t n = 0, backend = 99;

    CHECK(nvml != NULL);
    EXPECT(memprobe_gpu_configure(4, NULL, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_gpu_configure(0xFFFFFFFFu, NULL, NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_gpu_configure(MEMPROBE_GPU_BACKEND_NVML, "\xff\xfe", NULL), MEMPROBE_STATUS_INVALID_ARGUMENT);
    EXPECT(memprobe_gpu_configure(MEMPROBE_GPU_BACKEND_NVML, NULL, "\xff"), MEMPROBE_STATUS_INVALID_ARGUMENT);
    /* An explicit backend that cannot load: UNAVAILABLE, and nothing is set. */
    EXPECT(memprobe_gpu_configure(MEMPROBE_GPU_BACKEND_NVML, "/nonexistent/libnvidia-ml.so.1", NULL),
           MEMPROBE_STATUS_UNAVAILABLE);
    CHECK(error_has("/nonexistent/libnvidia-ml.so.1"));
    /* The environment says MEMPROBE_GPU_BACKEND=rocm: configure overrides it. */
    OK(memprobe_gpu_configure(MEMPROBE_GPU_BACKEND_NVML, nvml, NULL));
    OK(memprobe_gpu_get_backend(&backend));
    CHECK(backend == MEMPROBE_GPU_BACKEND_NVML);
    OK(memprobe_gpu_count(&n));
    CHECK(n == 2);
    EXPECT(memprobe_gpu_configure(MEMPROBE_GPU_BACKEND_NVML, nvml, NULL), MEMPROBE_STATUS_WRONG_ORDER);
    EXPECT(memprobe_gpu_configure(MEMPROBE_GPU_BACKEND_NONE, NULL, NULL), MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(error_has("already open"));
    OK(memprobe_gpu_count(&n));
    CHECK(n == 2);
}

/* --- the CUDA runtime backend ---------------------------------------------- */

static void scenario_cudart(void) {
    uint32_t n = 0, backend = 0, cur = 9;
    memprobe_gpu_info info;
    memprobe_gpu_memory m;
    memprobe_gpu_device *dev = NULL;
    memprobe_source *src = NULL;
    uint64_t v = 9;

    OK(memprobe_gpu_count(&n));
    CHECK(n == 2);
    OK(memprobe_gpu_get_backend(&backend));
    CHECK(backend == MEMPROBE_GPU_BACKEND_CUDART);
    OK(memprobe_gpu_get_info(1, &info));
    CHECK(info.backend == MEMPROBE_GPU_BACKEND_CUDART && info.valid == MEMPROBE_GPU_INFO_PCI_BUS_ID);
    CHECK(strcmp(info.pci_bus_id, "00000000:3B:00.0") == 0 && info.name[0] == '\0');
    OK(memprobe_gpu_mem_get(1, &m));
    CHECK(m.total == 16 * GIB && m.used == m.total - m.free && m.valid == MEMPROBE_GPU_MEMORY_READ);
    CHECK(m.reserved == 0);
    OK(memprobe_gpu_set_current_device(1));
    OK(memprobe_gpu_get_current_device(&cur));
    CHECK(cur == 1);
    OK(memprobe_gpu_device_open(0, &dev));
    EXPECT(memprobe_gpu_device_process_used(dev, &v), MEMPROBE_STATUS_UNSUPPORTED);
    CHECK(v == 0);
    FREE_OK(memprobe_gpu_device_free(dev));
    EXPECT(memprobe_source_new_gpu_process(0, &src), MEMPROBE_STATUS_UNSUPPORTED);
    CHECK(src == NULL);
    OK(memprobe_source_new_gpu_device(0, &src));
    FREE_OK(memprobe_source_free(src));
}

/* --- fork while the monitor polls a GPU ------------------------------------ */

static int fork_child(const memprobe_source *gpu) {
    memprobe_window *w = NULL;
    memprobe_gpu_memory m;
    memprobe_monitor_stats st;
    uint64_t peak = 0;
    const memprobe_source *srcs[1];
    srcs[0] = gpu;
    alarm(20); /* a deadlock kills the child instead of hanging the test */
    if (memprobe_gpu_mem_get(0, &m) != MEMPROBE_STATUS_OK || m.used != 2 * GIB) return 10;
    if (memprobe_window_open(srcs, 1, &w) != MEMPROBE_STATUS_OK) return 11;
    if (memprobe_window_peak(w, 0, &peak) != MEMPROBE_STATUS_OK || peak != 2 * GIB) return 12;
    if (memprobe_monitor_get_stats(&st) != MEMPROBE_STATUS_OK || !st.running) return 13;
    if (memprobe_window_free(w) != MEMPROBE_STATUS_OK) return 14;
    if (memprobe_monitor_stop() != MEMPROBE_STATUS_OK) return 15;
    return 0;
}

static void scenario_fork(void) {
    memprobe_source *gpu = NULL;
    memprobe_window *w = NULL;
    const memprobe_source *srcs[1];
    int i;

    OK(memprobe_monitor_set_interval_ns(200000));
    OK(memprobe_source_new_gpu_device(0, &gpu));
    srcs[0] = gpu;
    OK(memprobe_window_open(srcs, 1, &w)); /* the monitor polls the GPU from now on */
    for (i = 0; i < 20; i++) {
        int status = 0;
        pid_t pid = fork();
        if (pid == 0) {
            /* End by exec, as test_fork.c does. */
            char code[32];
            snprintf(code, sizeof code, "exit %d", fork_child(gpu));
            execl("/bin/sh", "sh", "-c", code, (char *)NULL);
            _exit(127);
        }
        CHECK(pid > 0);
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            fprintf(stderr, "fork %d: child status %#x\n", i, status);
            break;
        }
        sleep_ms(2);
    }
    FREE_OK(memprobe_window_free(w));
    FREE_OK(memprobe_source_free(gpu));
    OK(memprobe_monitor_stop());
}

int main(int argc, char **argv) {
    uint64_t s = 1, w = 1, t = 1, d = 1;
    const char *scenario = argc > 1 ? argv[1] : "";
    const char *arg = argc > 2 ? argv[2] : "";

    if (strcmp(scenario, "nogpu") == 0) {
        scenario_nogpu(arg);
    } else if (strcmp(scenario, "one") == 0) {
        scenario_one();
    } else if (strcmp(scenario, "eight") == 0) {
        scenario_eight();
    } else if (strcmp(scenario, "trace") == 0) {
        scenario_trace();
    } else if (strcmp(scenario, "visible") == 0) {
        scenario_visible(arg);
    } else if (strcmp(scenario, "lost") == 0) {
        scenario_lost();
    } else if (strcmp(scenario, "spike") == 0) {
        scenario_spike();
    } else if (strcmp(scenario, "configure") == 0) {
        scenario_configure();
    } else if (strcmp(scenario, "cudart") == 0) {
        scenario_cudart();
    } else if (strcmp(scenario, "fork") == 0) {
        scenario_fork();
    } else {
        fprintf(stderr, "unknown scenario '%s'\n", scenario);
        return 2;
    }
    OK(memprobe_debug_live_handles(&s, &w, &t, NULL));
    OK(memprobe_gpu_debug_live_devices(&d));
    CHECK(s == 0 && w == 0 && t == 0 && d == 0);
    return check_summary();
}
