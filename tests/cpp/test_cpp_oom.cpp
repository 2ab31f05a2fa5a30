// Out-of-memory reports through the C++ layer: a trainer catching a
// framework's out-of-memory exception reports it; the report's file and
// callback, the count of later reports, re-arming, the raw event with a
// framework's caches, and the errors as exceptions.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <unistd.h>

#include "memprobe.hpp"

#include "check.hpp"

constexpr std::uint64_t GIB = 1ull << 30;

static std::string slurp(const std::string &path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

template <typename F>
static memprobe_status status_of(F f) {
    try {
        f();
    } catch (const memprobe::Error &e) {
        return e.status();
    }
    return MEMPROBE_STATUS_OK;
}

int main() {
    using namespace memprobe;
    const char *env = std::getenv("OOM_TEST_DIR");
    if (!env) return 2;
    const std::string path = std::string(env) + "/cpp.json";
    std::remove(path.c_str());

    Source alloc = Source::pushed("c10_cuda_alloc:0");
    Tracker t({alloc});
    CHECK(status_of([&] { t.report_oom(0, GIB); }) == MEMPROBE_STATUS_WRONG_ORDER);
    CHECK(status_of([&] { t.oom_status(); }) == MEMPROBE_STATUS_WRONG_ORDER);
    OomReportOptions bad;
    bad.caller = false;
    bad.path = path;
    CHECK(status_of([&] { t.set_oom_report(bad); }) == MEMPROBE_STATUS_INVALID_ARGUMENT);
    OomReportOptions driver;
    driver.driver = true;
    driver.path = path;
    CHECK(status_of([&] { t.set_oom_report(driver); }) == MEMPROBE_STATUS_UNAVAILABLE);

    int calls = 0;
    std::string summary;
    OomReportOptions o;
    o.path = path;
    o.keep_ended = 4;
    o.callback = [&](const std::string &json, const std::string &s) {
        ++calls;
        summary = s;
        CHECK(json.find("\"format\":\"memprobe-oom-report\"") == 1);
        throw std::runtime_error("dropped, never crosses the library");
    };
    t.set_oom_report(o);
    CHECK(status_of([&] { t.set_oom_report(o); }) == MEMPROBE_STATUS_WRONG_ORDER);

    t.begin(PhaseKind::Epoch);
    t.begin(PhaseKind::Step);
    for (int i = 0; i < 3; ++i) {
        alloc.push((i + 2) * GIB);
        alloc.push(GIB);
        t.next(PhaseKind::Step);
    }
    // The trainer's step: the framework throws, the trainer reports.
    try {
        alloc.push(30 * GIB);
        throw std::bad_alloc();
    } catch (const std::bad_alloc &e) {
        t.report_oom(0, 12 * GIB, std::string("c10::OutOfMemoryError: ") + e.what());
        t.report_oom(0, 12 * GIB, "retry");
    }
    CHECK(calls == 1);
    memprobe_oom_report_status st = t.oom_status();
    CHECK(!st.armed && st.reports_written == 1 && st.later_triggers == 1);
    std::string doc = slurp(path);
    CHECK(doc.find("\"requested_bytes\":12884901888") != std::string::npos);
    CHECK(doc.find("\"kind\":\"step\",\"name\":\"step\",\"index\":3,\"depth\":1") != std::string::npos);
    CHECK(doc.find("\"used_start\":1073741824,\"used_now\":32212254720,\"peak\":32212254720") != std::string::npos);
    CHECK(summary.find("caller asked 12.0 GiB on GPU 0") != std::string::npos);

    t.rearm_oom_report();
    CHECK(slurp(path).find("\"later_triggers\":{\"count\":1,") != std::string::npos);
    memprobe_oom_report_cache cache{};
    cache.device = 0;
    cache.valid = MEMPROBE_OOM_CACHE_RESERVED | MEMPROBE_OOM_CACHE_ALLOCATED | MEMPROBE_OOM_CACHE_RELEASABLE;
    cache.reserved_bytes = 40 * GIB;
    cache.allocated_bytes = 30 * GIB;
    cache.releasable_bytes = 6 * GIB;
    memprobe_oom_report_event e{};
    e.device = 0;
    e.requested_bytes = 12 * GIB;
    e.reported_by = "c10";
    e.caches = &cache;
    e.n_caches = 1;
    // What was live (memprobe_torch.hpp's Attribution writes this record at
    // an OOM, at att.last_oom()): embedded and summarised.
    const std::string live =
        "{\"schema\": \"memprobe.torch_attribution/1\", \"kind\": \"oom\", \"requested_bytes\": 12884901888,"
        " \"blocks\": [{\"bytes\": 8589934592, \"frames\": [{\"file\": \"model.cpp\", \"line\": 7,"
        " \"function\": \"Net::forward\"}]}], \"segments\": null}";
    e.live_blocks_json = live.c_str();
    t.report_oom(e);
    CHECK(calls == 2);
    doc = slurp(path);
    CHECK(doc.find("\"live_blocks\":{\"schema\":\"memprobe.torch_attribution/1\"") != std::string::npos);
    CHECK(doc.find("\"live_blocks_error\":null") != std::string::npos);
    CHECK(summary.find("8.00 GiB model.cpp:7 Net::forward") != std::string::npos);
    CHECK(doc.find("\"reported_by\":\"c10\"") != std::string::npos);
    CHECK(doc.find("\"releasable_bytes\":6442450944") != std::string::npos);
    CHECK(status_of([&] { t.report_oom(-3, 1); }) == MEMPROBE_STATUS_INVALID_ID);
    t.clear_oom_report();
    CHECK(status_of([&] { t.rearm_oom_report(); }) == MEMPROBE_STATUS_WRONG_ORDER);

    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
