// The C++ RAII layer over the C ABI: ownership, exceptions with status and
// message, non-throwing overloads, scoped phases and traces, callbacks.
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include "memprobe.hpp"
#include "memprobe.hpp"  // twice-included

#include "check.hpp"

constexpr std::uint64_t MIB = 1ull << 20;

int main() {
    using namespace memprobe;
    CHECK(!version().empty());
    Source cpu = Source::pushed("cpu");
    Source gpu = Source::pushed("gpu0");
    cpu.push(100 * MIB);
    gpu.push(1000 * MIB);

    // Windows and traces.
    {
        Window w({cpu, gpu});
        gpu.push(1300 * MIB);
        gpu.push(1000 * MIB);
        CHECK(w.peak(1) == 1300 * MIB);
        auto ended = w.reset();
        CHECK(ended.size() == 2 && ended[1].delta_peaked == 300 * MIB);
        CHECK(w.peak(1) == 1000 * MIB);
        Trace t({gpu}, "ctx", /*silent=*/true);
        gpu.push(1200 * MIB);
        CHECK(t.data().first == static_cast<std::int64_t>(200 * MIB));
        CHECK(t.line("n") == "\xe2\x96\xb3Used Peaked MB:    200      0 (ctx: n)");
        t.stop();
        Status st;
        t.stop(st);
        CHECK(!st && st.code == MEMPROBE_STATUS_WRONG_ORDER && !st.message.empty());
        bool threw = false;
        try {
            t.stop();
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_WRONG_ORDER && std::string(e.what()).find("stop") != std::string::npos;
        }
        CHECK(threw);
        try {
            (void)w.peak(5);
            CHECK(false);
        } catch (const Error &e) {
            CHECK(e.status() == MEMPROBE_STATUS_INVALID_ID);
        }
    }
    {
        int fds[2];
        CHECK(pipe(fds) == 0);
        {
            ScopedTrace s({cpu}, "scope");
            s.set_output_fd(fds[1]);
            cpu.push(101 * MIB);
        }
        char buf[256] = {0};
        ssize_t n = read(fds[0], buf, sizeof buf - 1);
        CHECK(n > 0 && std::strcmp(buf, "\xe2\x96\xb3Used Peaked MB:      1      0 (scope: exit)\n") == 0);
        close(fds[0]);
        close(fds[1]);
    }

    // The tracker: scoped phases, release policy, leak flag, OOM retry.
    {
        Tracker t({cpu, gpu});
        int released = 0;
        t.add_release("empty_cache", false, [&] {
            ++released;
            return true;
        });
        t.release_every(PhaseKind::Epoch, 2);
        t.set_leak_policy(MIB, 2);
        for (int e = 0; e < 4; ++e) {
            auto epoch = t.scope(PhaseKind::Epoch);
            for (int s = 0; s < 3; ++s) {
                auto step = t.scope(PhaseKind::Step);
                cpu.push(cpu.read().used + 2 * MIB);  // leaks 2 MiB per step
            }
        }
        CHECK(released == 2);
        CHECK(t.releases_fired() == 2);
        CHECK(t.leaking(0) && !t.leaking(1));
        {
            auto epoch = t.scope(PhaseKind::Epoch);
            Tracker::Record r = epoch.end();
            CHECK(r.phase.index == 4 && r.deltas.size() == 2);
        }
        Status st;
        t.end(PhaseKind::Step, nullptr, st);
        CHECK(st.code == MEMPROBE_STATUS_WRONG_ORDER);
        bool threw = false;
        try {
            t.begin(PhaseKind::Step);
            t.begin(PhaseKind::Epoch);
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_WRONG_ORDER;
        }
        CHECK(threw);
        t.end(PhaseKind::Step);
        int attempts = 0;
        OomRetryResult r = t.run_oom_retry([&] { return ++attempts < 3 ? StepOutcome::OutOfMemory : StepOutcome::Done; }, 4);
        CHECK(r.succeeded && r.retries == 2 && released == 4);
    }
    // Empty source lists are INVALID_ARGUMENT, not NULL_POINTER.
    {
        auto status_of = [](auto make) {
            try {
                make();
            } catch (const Error &e) {
                return e.status();
            }
            return MEMPROBE_STATUS_OK;
        };
        CHECK(status_of([] { Window w({}); }) == MEMPROBE_STATUS_INVALID_ARGUMENT);
        CHECK(status_of([] { Trace t({}); }) == MEMPROBE_STATUS_INVALID_ARGUMENT);
        CHECK(status_of([] { Tracker t({}); }) == MEMPROBE_STATUS_INVALID_ARGUMENT);
    }

    // Phase::end() that throws (a step still open) keeps its guard armed:
    // the epoch is still ended when the guard leaves scope.
    {
        Tracker t({cpu});
        {
            auto epoch = t.scope(PhaseKind::Epoch);
            t.begin(PhaseKind::Step);
            bool threw = false;
            try {
                epoch.end();
            } catch (const Error &e) {
                threw = e.status() == MEMPROBE_STATUS_WRONG_ORDER;
            }
            CHECK(threw);
            t.end(PhaseKind::Step);
        }
        // Nothing left open: a new epoch begins at the outermost level.
        Tracker::Record r{};
        {
            auto epoch = t.scope(PhaseKind::Epoch);
            r = epoch.end();
            bool threw = false;
            try {
                epoch.end();
            } catch (const Error &e) {
                threw = e.status() == MEMPROBE_STATUS_WRONG_ORDER;
            }
            CHECK(threw);
        }
        CHECK(r.phase.depth == 0 && r.phase.index == 1);
    }

    // run_oom_retry: bad_alloc is out of memory; other exceptions from the
    // step or a release callback come back out after the C call.
    {
        Tracker t({cpu});
        int released = 0;
        bool release_throws = false;
        t.add_release("empty_cache", false, [&] {
            ++released;
            if (release_throws) throw std::runtime_error("release failed");
            return true;
        });
        int attempts = 0;
        OomRetryResult r = t.run_oom_retry(
            [&] {
                if (++attempts < 3) throw std::bad_alloc();
                return StepOutcome::Done;
            },
            4);
        CHECK(r.succeeded && r.retries == 2 && released == 2);

        attempts = 0;
        bool threw = false;
        try {
            (void)t.run_oom_retry([&]() -> StepOutcome { throw std::bad_alloc(); }, 2);
        } catch (const Error &e) {
            threw = e.status() == MEMPROBE_STATUS_OUT_OF_MEMORY;
        }
        CHECK(threw);
        Status st;
        r = t.run_oom_retry([] { return StepOutcome::OutOfMemory; }, 1, st);
        CHECK(st.code == MEMPROBE_STATUS_OUT_OF_MEMORY && !r.succeeded && r.retries == 1);

        std::string what;
        try {
            (void)t.run_oom_retry([]() -> StepOutcome { throw std::logic_error("step bug"); }, 2);
        } catch (const std::logic_error &e) {
            what = e.what();
        }
        CHECK(what == "step bug");

        release_throws = true;
        attempts = 0;
        what.clear();
        try {
            (void)t.run_oom_retry([&] { return ++attempts < 2 ? StepOutcome::OutOfMemory : StepOutcome::Done; }, 3);
        } catch (const std::runtime_error &e) {
            what = e.what();
        }
        CHECK(what == "release failed" && attempts == 1);

        // A release policy's callback that throws at the end of a phase: the
        // phase ends, then the exception comes out of end().
        t.release_every(PhaseKind::Step, 1);
        what.clear();
        try {
            t.begin(PhaseKind::Step);
            t.end(PhaseKind::Step);
        } catch (const std::runtime_error &e) {
            what = e.what();
        }
        CHECK(what == "release failed");
        Status s2;
        t.end(PhaseKind::Step, nullptr, s2);
        CHECK(s2.code == MEMPROBE_STATUS_WRONG_ORDER);  // the step did end
        release_throws = false;
    }
    // A moved tracker still brings its callbacks' exceptions back out.
    {
        Tracker a({cpu});
        a.add_release("throws", false, []() -> bool { throw std::runtime_error("after the move"); });
        Tracker b(std::move(a));
        std::string what;
        try {
            (void)b.run_oom_retry([] { return StepOutcome::OutOfMemory; }, 1);
        } catch (const std::runtime_error &e) {
            what = e.what();
        }
        CHECK(what == "after the move");
    }
    CHECK(b2mb_signed(-static_cast<std::int64_t>(MIB) + 1) == 0);

    monitor::set_interval(std::chrono::milliseconds(5));
    CHECK(monitor::stats().interval_ns == 5000000);
    try {
        monitor::set_interval(std::chrono::nanoseconds(1));
        CHECK(false);
    } catch (const Error &e) {
        CHECK(e.status() == MEMPROBE_STATUS_INVALID_ARGUMENT);
    }
    std::uint64_t s = 1, w = 1, tr = 1, tk = 1;
    cpu.push(0);
    CHECK(memprobe_debug_live_handles(&s, &w, &tr, &tk) == MEMPROBE_STATUS_OK);
    CHECK(s == 2 && w == 0 && tr == 0 && tk == 0);
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
