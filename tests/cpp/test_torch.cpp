// memprobe_torch.hpp against libtorch's headers and libraries, without a
// GPU: run with CUDA_VISIBLE_DEVICES empty. Real allocator sources must
// refuse clearly; sources over scripted c10 DeviceStats (c10's own Stat
// arithmetic) must give exact peaks per window, tracker step and epoch,
// across the per-device shared reset.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "memprobe_torch.hpp"

#include "check.hpp"

constexpr std::uint64_t MIB = 1ull << 20;
constexpr std::uint64_t GIB = 1ull << 30;

using c10::CachingDeviceAllocator::DeviceStats;
constexpr auto AGG = static_cast<std::size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);

/* A scripted device: what the caching allocator would count. */
struct FakeDevice {
    DeviceStats stats;
    int resets = 0;
    void alloc(std::size_t bytes) {
        stats.allocated_bytes[AGG].increase(bytes);
        stats.active_bytes[AGG].increase(bytes);
        if (stats.reserved_bytes[AGG].current < stats.allocated_bytes[AGG].current)
            stats.reserved_bytes[AGG].increase(
                static_cast<std::size_t>(stats.allocated_bytes[AGG].current - stats.reserved_bytes[AGG].current));
    }
    void free(std::size_t bytes) {
        stats.allocated_bytes[AGG].decrease(bytes);
        stats.active_bytes[AGG].decrease(bytes);
    }
    void empty_cache() {
        auto &r = stats.reserved_bytes[AGG];
        r.decrease(static_cast<std::size_t>(r.current - stats.allocated_bytes[AGG].current));
    }
    memprobe::torch::AllocatorSources sources(int device, bool active = false) {
        return memprobe::torch::AllocatorSources(
            device, [this] { return stats; },
            [this] {
                resets++;
                stats.allocated_bytes[AGG].reset_peak();
                stats.reserved_bytes[AGG].reset_peak();
                stats.active_bytes[AGG].reset_peak();
            },
            active);
    }
};

int main() {
    using namespace memprobe;
    namespace mt = memprobe::torch;

    // No CUDA here: clear refusals, nothing else touches CUDA.
    CHECK(mt::device_count() == 0);
    CHECK(mt::all_devices().empty());
    bool refused = false;
    try {
        mt::AllocatorSources s(0);
    } catch (const Error &e) {
        refused = e.status() == MEMPROBE_STATUS_UNAVAILABLE &&
                  std::string(e.what()).find("no CUDA device is visible") != std::string::npos;
        std::printf("device 0 without CUDA: %s\n", e.what());
    }
    CHECK(refused);
    CHECK(mt::source_name(mt::Stat::Allocated, 0) == "torch_alloc:0");
    CHECK(mt::source_name(mt::Stat::Reserved, 1) == "torch_reserved:1");
    CHECK(mt::source_name(mt::Stat::Active, 7) == "torch_active:7");

    // Scripted devices through c10's own DeviceStats.
    FakeDevice d0, d1;
    d0.alloc(100 * MIB);
    std::vector<mt::AllocatorSources> devs;
    devs.push_back(d0.sources(0, true));
    devs.push_back(d1.sources(1));
    CHECK(std::string(devs[0].allocated().info().name) == "torch_alloc:0");
    CHECK(std::string(devs[0].active().info().name) == "torch_active:0");
    CHECK(std::string(devs[1].reserved().info().name) == "torch_reserved:1");
    CHECK(devs[0].allocated().info().fidelity == MEMPROBE_FIDELITY_EXACT);
    CHECK(devs[0].allocated().read().used == 100 * MIB);
    bool no_active = false;
    try {
        devs[1].active();
    } catch (const Error &) {
        no_active = true;
    }
    CHECK(no_active);

    Tracker t(mt::list(devs));  // torch_alloc:0, torch_reserved:0, torch_active:0, torch_alloc:1, torch_reserved:1
    Window eval(devs[1].list());
    t.begin(PhaseKind::Epoch);
    t.begin(PhaseKind::Step);
    d0.alloc(2 * GIB);  // the temporary tensor
    d0.free(2 * GIB);
    d1.alloc(300 * MIB);
    d1.free(300 * MIB);
    d1.empty_cache();
    Tracker::Record s = t.next(PhaseKind::Step);
    CHECK(s.deltas.size() == 5);
    CHECK(s.deltas[0].peak == 100 * MIB + 2 * GIB);
    CHECK(s.deltas[1].peak == 100 * MIB + 2 * GIB);
    CHECK(s.deltas[2].peak == 100 * MIB + 2 * GIB);
    CHECK(s.deltas[4].peak == 300 * MIB && s.deltas[4].used_end == 0);
    d0.alloc(MIB);
    d0.free(MIB);
    s = t.end(PhaseKind::Step);
    CHECK(s.deltas[0].peak == 101 * MIB && s.deltas[3].peak == 0);
    Tracker::Record e = t.end(PhaseKind::Epoch);
    CHECK(e.deltas[0].peak == 100 * MIB + 2 * GIB);
    CHECK(e.deltas[4].peak == 300 * MIB);
    CHECK(d0.resets > 0);
    // The evaluation window over device 1 lost nothing to the resets.
    CHECK(eval.peak(0) == 300 * MIB && eval.peak(1) == 300 * MIB);
    // The true peaks since start.
    CHECK(devs[0].peak_allocated_since_start() == 100 * MIB + 2 * GIB);
    CHECK(devs[1].peak_reserved_since_start() == 300 * MIB);
    devs[0].since_start().reset();
    CHECK(devs[0].peak_allocated_since_start() == 100 * MIB);
    CHECK(d0.stats.allocated_bytes[AGG].peak == 100 * MIB);  // torch's own counter was reset

#if MEMPROBE_TORCH_ATTRIBUTION
    // Attribution without CUDA: refused clearly, history never touched.
    bool attr_refused = false;
    try {
        mt::Attribution a;
    } catch (const Error &e) {
        attr_refused = e.status() == MEMPROBE_STATUS_UNAVAILABLE &&
                       std::string(e.what()).find("no CUDA device is visible") != std::string::npos;
        std::printf("attribution without CUDA: %s\n", e.what());
    }
    CHECK(attr_refused);
    // A step's start as memprobe records it (CLOCK_MONOTONIC) in torch's
    // history clock (Unix µs): now is now, 2 s ago is 2 s ago.
    timespec mono{};
    clock_gettime(CLOCK_MONOTONIC, &mono);
    const std::uint64_t mono_ns = static_cast<std::uint64_t>(mono.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(mono.tv_nsec);
    const std::int64_t now = mt::attribution::now_us();
    CHECK(std::llabs(mt::detail::monotonic_to_unix_us(mono_ns) - now) < 50000);
    CHECK(std::llabs(mt::detail::monotonic_to_unix_us(mono_ns - 2000000000ull) - (now - 2000000)) < 50000);
    // torch's actions map one to one; torch's SNAPSHOT moves no block.
    CHECK(mt::detail::action_of(c10::cuda::CUDACachingAllocator::TraceEntry::FREE_REQUESTED) ==
          mt::attribution::Action::FreeRequested);
    CHECK(mt::detail::action_of(c10::cuda::CUDACachingAllocator::TraceEntry::OOM) == mt::attribution::Action::Oom);
    // An empty snapshot (what torch gives a device without history) is a
    // complete, empty table.
    c10::cuda::CUDACachingAllocator::SnapshotInfo empty;
    mt::attribution::History h = mt::detail::history_of(empty, 0, 10, 0);
    mt::attribution::Table tb = mt::attribution::replay_to_peak(h, 1, 0);
    CHECK(tb.complete && tb.blocks.empty() && tb.rest_bytes() == std::optional<std::uint64_t>(0));
#if !MEMPROBE_TORCH_DEVICE_ALLOCATOR
    {
        // torch's own snapshot types (as libtorch 2.5 ... 2.10 declare
        // them) through history_of: device 1 left out, streams and times
        // carried, the block live at the snapshot exact, the freed one from
        // its entry.
        namespace cca = c10::cuda::CUDACachingAllocator;
        cca::SnapshotInfo info;
        cca::SegmentInfo seg;
        seg.device = 0;
        seg.address = 0x10000000;
        seg.total_size = 4 * MIB;
        seg.stream = reinterpret_cast<cudaStream_t>(0x77);
        cca::BlockInfo kept, rest;
        kept.size = MIB;
        kept.requested_size = MIB - 100;
        kept.allocated = kept.active = true;
        rest.size = 3 * MIB;
        seg.blocks = {kept, rest};
        cca::SegmentInfo other = seg;
        other.device = 1;
        info.segments = {seg, other};
        info.device_traces.resize(2);
        auto entry = [&](cca::TraceEntry::Action a, std::size_t addr, std::size_t size, std::int64_t t) {
            cca::TraceEntry e(a, 0, addr, size, seg.stream, 0);
            e.time_.t_ = static_cast<time_t>(t);
            info.device_traces[0].push_back(e);
        };
        entry(cca::TraceEntry::ALLOC, 0x10000000, MIB - 100, 100);
        entry(cca::TraceEntry::ALLOC, 0x10100000, 2 * MIB, 200);
        entry(cca::TraceEntry::FREE_REQUESTED, 0x10100000, 2 * MIB, 300);
        entry(cca::TraceEntry::FREE_COMPLETED, 0x10100000, 2 * MIB, 301);
        info.device_traces[1].push_back(cca::TraceEntry(cca::TraceEntry::ALLOC, 1, 0x90000000, MIB, nullptr, 0));
        mt::attribution::History th = mt::detail::history_of(info, 0, 100, 50);
        CHECK(th.segments.size() == 1 && th.events.size() == 4 && th.recording_since_us == 50);
        CHECK(th.events[1].stream == 0x77 && th.events[2].time_us == 300 &&
              th.events[3].action == mt::attribution::Action::FreeCompleted);
        mt::attribution::Table tt = mt::attribution::replay_to_peak(th, 150, 3 * MIB);
        CHECK(tt.complete && tt.blocks.size() == 2 && tt.blocks[0].bytes == 2 * MIB && !tt.blocks[0].exact);
        CHECK(tt.blocks[1].bytes == MIB && tt.blocks[1].exact && tt.moment_us == 200);
    }
#endif
#else
    std::printf("attribution: not built (no CUDA runtime headers)\n");
#endif

    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
