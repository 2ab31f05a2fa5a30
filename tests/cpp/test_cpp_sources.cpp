// The C++ layer's sources for a libtorch trainer: mark groups over a
// scripted allocator (exact peaks, shared reset, exceptions from the
// functions), source lists built at run time, callback / PSS / GPU
// sources, the trace output and record callbacks, and the exporter.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memprobe.hpp"

#include "check.hpp"

constexpr std::uint64_t MIB = 1ull << 20;
constexpr std::uint64_t GIB = 1ull << 30;

/* A framework allocator: allocated (even) and reserved (odd) bytes per
 * device, one reset for all. */
struct Allocator {
    std::array<std::uint64_t, 4> now{}, peak{};
    int resets = 0;
    bool fail = false;
    std::function<void()> during;  // run inside current() (re-entry)
    void set(std::size_t i, std::uint64_t b) {
        now[i] = b;
        if (b > peak[i]) peak[i] = b;
    }
    void spike(std::size_t i, std::uint64_t b) {
        std::uint64_t before = now[i];
        set(i, before + b);
        set(i, before);
    }
};

struct AllocatorGone : std::runtime_error {
    AllocatorGone() : std::runtime_error("allocator gone") {}
};

static memprobe::MarkGroup group_over(Allocator &a) {
    return memprobe::MarkGroup(
        [&a](std::size_t i) {
            if (a.during) a.during();
            return a.now.at(i);
        },
        [&a](std::size_t i) {
            if (a.fail) throw AllocatorGone();
            return a.peak.at(i);
        },
        [&a] {
            a.peak = a.now;
            a.resets++;
        });
}

static std::size_t registered() {
    memprobe::detail::Registry &r = memprobe::detail::registry();
    std::lock_guard<std::mutex> g(r.mu);
    return r.entries.size();
}

/* GET /metrics from 127.0.0.1:port. */
static std::string scrape(std::uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return "";
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string out;
    if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0) {
        const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
        if (write(fd, req, sizeof req - 1) == static_cast<ssize_t>(sizeof req - 1)) {
            char buf[4096];
            ssize_t n;
            while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
        }
    }
    close(fd);
    return out;
}

int main() {
    using namespace memprobe;
    const char *names[] = {"torch_alloc:0", "torch_reserved:0", "torch_alloc:1", "torch_reserved:1"};

    // A group read from one snapshot: two reads and one reset per boundary
    // over both of a device's sources, the same peaks; an exception from
    // read_many is rethrown after the call and loses nothing.
    {
        Allocator a;
        int reads = 0;
        MarkGroup g = MarkGroup::many(
            [&a, &reads](memprobe_mark_value what, const std::size_t *idx, std::size_t n, std::uint64_t *out) {
                reads++;
                if (a.fail) throw AllocatorGone();
                for (std::size_t i = 0; i < n; i++)
                    out[i] = what == MEMPROBE_MARK_VALUE_PEAK ? a.peak.at(idx[i]) : a.now.at(idx[i]);
            },
            [&a] {
                a.peak = a.now;
                a.resets++;
            });
        std::vector<Source> both;
        both.push_back(g.source(0, names[0]));
        both.push_back(g.source(1, names[1]));
        a.set(0, 10 * MIB);
        a.set(1, 30 * MIB);
        Window step(both);
        for (std::uint64_t i = 1; i <= 5; i++) {
            a.spike(0, i * MIB);
            a.spike(1, 2 * i * MIB);
            int r = reads, resets = a.resets;
            std::vector<memprobe_delta> d = step.reset();
            CHECK(reads == r + 2 && a.resets == resets + 1);
            CHECK(d.at(0).peak == 10 * MIB + i * MIB && d.at(1).peak == 30 * MIB + 2 * i * MIB);
        }
        a.spike(1, 50 * MIB);
        a.fail = true;
        bool thrown = false;
        try {
            step.reset();
        } catch (const AllocatorGone &) {
            thrown = true;
        }
        CHECK(thrown);
        a.fail = false;
        CHECK(step.peak(1) == 80 * MIB);
        bool null_refused = false;
        try {
            MarkGroup::many(nullptr, [] {});
        } catch (const Error &e) {
            null_refused = e.status() == MEMPROBE_STATUS_NULL_POINTER;
        }
        CHECK(null_refused);
    }

    // Exact peaks over marks, sources built at run time (2 devices).
    {
        Allocator a;
        MarkGroup g = group_over(a);
        std::vector<Source> srcs;
        for (std::size_t i = 0; i < 4; i++) srcs.push_back(g.source(i, names[i]));
        memprobe_source_info info = srcs[0].info();
        CHECK(info.kind == MEMPROBE_SOURCE_KIND_CUSTOM && info.fidelity == MEMPROBE_FIDELITY_EXACT);
        CHECK(std::string(info.name) == "torch_alloc:0");
        a.set(0, 100 * MIB);
        Window all(srcs);
        Window reserved1({srcs[3]});
        a.spike(3, 700 * MIB);
        for (int i = 1; i <= 3; i++) {
            Window step(SourceList(&srcs[0], 1));
            a.spike(0, static_cast<std::uint64_t>(i) * GIB);
            CHECK(step.peak() == 100 * MIB + static_cast<std::uint64_t>(i) * GIB);
        }
        CHECK(a.resets >= 3 && a.peak[3] == 0);
        CHECK(reserved1.peak() == 700 * MIB);
        std::vector<std::uint64_t> p = all.peaks();
        CHECK(p.size() == 4 && p[0] == 100 * MIB + 3 * GIB && p[3] == 700 * MIB);
        CHECK(all.size() == 4);
        // One source per index.
        bool threw = false;
        try {
            g.source(0, "again");
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_INVALID_ARGUMENT;
        }
        CHECK(threw);

        // An exception from a mark function is rethrown after the C call,
        // and the windows keep their peaks.
        a.fail = true;
        threw = false;
        try {
            all.peak(0);
        } catch (const AllocatorGone &) {
            threw = true;
        }
        CHECK(threw);
        Status st;
        all.peak(0, st);
        CHECK(st.code == MEMPROBE_STATUS_UNAVAILABLE);
        CHECK(st.message.find("torch_alloc:0") != std::string::npos);
        CHECK(!detail::pending());
        a.fail = false;
        CHECK(all.peak(0) == 100 * MIB + 3 * GIB);

        // Re-entry from a mark function: WRONG_ORDER.
        Status inner;
        bool once = true;
        a.during = [&] {
            if (once) {
                once = false;
                srcs[1].read(inner);
            }
        };
        srcs[0].read();
        a.during = nullptr;
        CHECK(inner.code == MEMPROBE_STATUS_WRONG_ORDER);
    }
    CHECK(registered() == 0);

    // A window outlives its sources and group: it keeps their functions.
    {
        Allocator a;
        std::vector<Window> ws;
        {
            MarkGroup g = group_over(a);
            Source s = g.source(0, "alloc");
            ws.emplace_back(SourceList{s});
        }
        a.spike(0, 123);
        CHECK(ws[0].peak() == 123);
        CHECK(registered() == 1);
    }
    CHECK(registered() == 0);

    // Tracker over run-time sources with a record callback; trace lines.
    {
        Allocator a;
        MarkGroup g = group_over(a);
        std::vector<Source> srcs;
        for (std::size_t i = 0; i < 4; i++) srcs.push_back(g.source(i, names[i]));
        Tracker t(srcs);
        std::vector<Tracker::Record> seen;
        t.add_record_callback([&](const Tracker::Record &r) { seen.push_back(r); });
        a.set(0, 8 * MIB);
        t.begin(PhaseKind::Epoch);
        t.begin(PhaseKind::Step);
        a.spike(0, 2 * GIB);
        t.next(PhaseKind::Step);
        a.spike(1, 3 * MIB);
        t.end(PhaseKind::Step);
        Tracker::Record e = t.end(PhaseKind::Epoch);
        CHECK(seen.size() == 3);
        if (seen.size() == 3) {
            CHECK(seen[0].deltas[0].peak == 8 * MIB + 2 * GIB);
            CHECK(seen[1].deltas[0].peak == 8 * MIB && seen[1].deltas[1].peak == 3 * MIB);
            CHECK(seen[2].phase.kind == MEMPROBE_PHASE_KIND_EPOCH && seen[2].deltas[0].peak == 8 * MIB + 2 * GIB);
        }
        CHECK(e.deltas.size() == 4 && e.deltas[1].peak == 3 * MIB);

        // A record callback that throws: the phase ends, end() rethrows.
        Tracker t2({srcs[0]});
        t2.add_record_callback([](const Tracker::Record &) { throw std::logic_error("sink"); });
        t2.begin(PhaseKind::Epoch);
        bool threw = false;
        try {
            t2.end(PhaseKind::Epoch);
        } catch (const std::logic_error &) {
            threw = true;
        }
        CHECK(threw);
        t2.begin(PhaseKind::Epoch);  // it did end
        Status st;
        t2.end(PhaseKind::Epoch, nullptr, st);
        CHECK(st && !detail::pending());

        std::vector<std::string> lines;
        Trace tr({srcs[0]}, "torch");
        tr.set_output([&](const std::string &l) { lines.push_back(l); });
        a.set(0, 58 * MIB);
        a.spike(0, 150 * MIB);
        tr.report("step");
        CHECK(lines.size() == 1 && lines[0] == "\xe2\x96\xb3Used Peaked MB:     50    150 (torch: step)");
        tr.set_output([](const std::string &) { throw std::out_of_range("writer"); });
        threw = false;
        try {
            tr.report();
        } catch (const std::out_of_range &) {
            threw = true;
        }
        CHECK(threw);
        CHECK(tr.data().first == static_cast<std::int64_t>(50 * MIB));
    }
    CHECK(registered() == 0);

    // Callback, PSS and GPU sources.
    {
        std::uint64_t value = 5 * MIB;
        Source cb = Source::callback("custom", [&] { return value; });
        CHECK(cb.read().used == 5 * MIB);
        CHECK(cb.info().fidelity == MEMPROBE_FIDELITY_SAMPLED);
        value = 6 * MIB;
        CHECK(cb.used() == 6 * MIB);
        bool threw = false;
        Source bad = Source::callback("bad", []() -> std::uint64_t { throw std::runtime_error("no"); });
        Status st;
        bad.read(st);
        CHECK(st.code == MEMPROBE_STATUS_UNAVAILABLE && !detail::pending());
        st = Status{};
        CHECK(bad.used(st) == 0 && st.code == MEMPROBE_STATUS_UNAVAILABLE && !detail::pending());
        threw = false;
        try {
            bad.used();
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_UNAVAILABLE;
        }
        CHECK(threw);
        threw = false;
        try {
            Source::callback("empty", nullptr);
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_NULL_POINTER;
        }
        CHECK(threw);
        threw = false;
        try {
            MarkGroup(nullptr, nullptr, nullptr);
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_NULL_POINTER;
        }
        CHECK(threw);
        Source pss = Source::pss();
        CHECK(pss.read().used > 0 && pss.info().kind == MEMPROBE_SOURCE_KIND_PROCESS_PSS);
        CHECK(Source::uss().info().kind == MEMPROBE_SOURCE_KIND_PROCESS_USS);
        Source tree_pss = Source::tree_pss();
        CHECK(tree_pss.read().used > 0 && tree_pss.info().kind == MEMPROBE_SOURCE_KIND_PROCESS_TREE_PSS);
        CHECK(std::string(tree_pss.info().name) == "tree_pss");
        CHECK(Source::tree_uss().info().kind == MEMPROBE_SOURCE_KIND_PROCESS_TREE_USS);
        // The test runs with MEMPROBE_GPU_BACKEND=none: no GPU here.
        threw = false;
        try {
            Source::gpu_device(0);
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_UNAVAILABLE;
        }
        CHECK(threw);
        threw = false;
        try {
            Source::gpu_process(0);
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_UNAVAILABLE;
        }
        CHECK(threw);
        // No interposer is loaded here: the exact GPU source says so.
        threw = false;
        try {
            Source::gpu_exact(0);
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_UNAVAILABLE;
        }
        CHECK(threw);
        threw = false;
        try {
            Source::gpu_exact(64);
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_INVALID_ID;
        }
        CHECK(threw);
        Window w(SourceList{cb});
        value = 6 * MIB;
        CHECK(cb.read().used == 6 * MIB);
    }
    CHECK(registered() == 0);

    // The exporter scrapes a mark source (on its own thread) and a tracker.
    {
        Allocator a;
        a.set(0, 42 * MIB);
        Exporter x;
        {
            MarkGroup g = group_over(a);
            Source s = g.source(0, "torch_alloc:0");
            x.add_source(s);
            x.set_rank(3);
        }
        CHECK(x.port() > 0);
        std::string body = scrape(x.port());
        CHECK(body.find("torch_alloc:0") != std::string::npos);
        CHECK(body.find(std::to_string(42 * MIB)) != std::string::npos);
        CHECK(body.find("rank=\"3\"") != std::string::npos);
        Source p = Source::pushed("cpu");
        Tracker t({p});
        x.watch(t);
        t.begin(PhaseKind::Epoch);
        t.end(PhaseKind::Epoch);
        body = scrape(x.port());
        CHECK(body.find("memprobe_phase") != std::string::npos);
        x.stop();
        bool threw = false;
        try {
            x.stop();
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_WRONG_ORDER;
        }
        CHECK(threw);
        Exporter moved(std::move(x));
        CHECK(moved.port() > 0);
    }
    {
        // With a web configuration (basic auth only: no certificates here):
        // taken, then a broken file refused and reported, not thrown.
        char dir[] = "/tmp/memprobe-cpp-web-XXXXXX";
        CHECK(mkdtemp(dir) != nullptr);
        std::string web = std::string(dir) + "/web.yml";
        const char *users =
            "basic_auth_users:\n  user: '$2b$04$DLse4tY1yMwulgkiUjPoOuY7.3QEz2D0lKkl1cubv8IH8v4FRjdf2'\n";
        auto write = [&](const std::string &text) {
            std::string tmp = web + ".tmp";
            FILE *f = std::fopen(tmp.c_str(), "w");
            CHECK(f != nullptr);
            if (!f) return;
            std::fputs(text.c_str(), f);
            std::fclose(f);
            CHECK(std::rename(tmp.c_str(), web.c_str()) == 0);
        };
        write(users);
        Exporter w("127.0.0.1:0", web);
        CHECK(w.port() > 0);
        CHECK(w.web_config_error().status() == MEMPROBE_STATUS_OK);
        CHECK(scrape(w.port()).rfind("HTTP/1.1 401 ", 0) == 0);  // no password sent
        write(std::string(users) + "basic_auth_userz: {}\n");
        Error e = w.web_config_error();
        for (int i = 0; i < 200 && e.status() == MEMPROBE_STATUS_OK; i++) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            e = w.web_config_error();
        }
        CHECK(e.status() == MEMPROBE_STATUS_PARSE);
        CHECK(std::string(e.what()).find("basic_auth_userz") != std::string::npos);
        bool threw = false;
        try {
            Exporter bad("127.0.0.1:0", std::string(dir) + "/absent.yml");
        } catch (const Error &err) {
            threw = err.status() == MEMPROBE_STATUS_UNAVAILABLE;
        }
        CHECK(threw);
        std::remove(web.c_str());
        rmdir(dir);
    }
    CHECK(registered() == 0);

    monitor::stop();  // the callback source's window started it
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
