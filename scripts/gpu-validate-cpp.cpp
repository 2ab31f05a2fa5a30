// The libtorch C++ part of scripts/gpu-validate-torch.py (--cpp-only):
// memprobe's exact windows over c10's CUDA caching allocator through
// include/memprobe_torch.hpp, on a real device.
//
//     validate [TRIES]     prints one JSON line; exit 0 when every figure is right
//
// References memprobe does not control:
//   * known sizes: nested epoch / step windows over uint8 tensors whose sizes
//     this program chose (small ones rounded up to 512 bytes, as c10's
//     allocator does; large ones whole multiples of 2 MiB): every window's
//     peak is computed here from the sizes it holds;
//   * the spike: one step per epoch holds a 2 GiB tensor for about 1 ms; the
//     step's window must read at least its base + 2 GiB (caught), and every
//     other step, the one after it included, below that (negative control).
// c10's own DeviceStats peak before each boundary is compared as well, but
// it is the counter memprobe resets: a consistency figure, not a reference.
//
// Attribution: two epochs whose second one's peak is one 1 GiB tensor; the
// records written (epoch-<E>-rank-0.json, oom-0-rank-0.json) are checked by
// gpu-validate-torch.py against the steps' exact peaks.
//
// `make test` compiles and links it against the CPU test environment's
// torch (bindings/python/tests/test_gpu_validation.py); without a device it
// prints {"error": ...} and exits 2.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>  // the consistency figure: c10's DeviceStats
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "memprobe_torch.hpp"

namespace {

constexpr std::int64_t MIB = 1 << 20;
constexpr std::int64_t SPIKE = 2ll << 30;

std::uint64_t rounded(std::int64_t n) { return static_cast<std::uint64_t>(std::max<std::int64_t>((n + 511) / 512 * 512, 512)); }

std::uint64_t allocated_now() {
    return static_cast<std::uint64_t>(c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current);
}

std::uint64_t allocated_peak() {
    return static_cast<std::uint64_t>(c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak);
}

// One step of the known schedule: (allocate name size) or (free name).
struct Op {
    bool alloc;
    std::string name;
    std::int64_t size;
};

// As known_schedule in gpu-validate-torch.py: large tensors whole multiples
// of 2 MiB of at least 12 MiB (c10 then never hands out a larger block than
// asked for), small ones under 1 MiB (rounded up to 512 bytes).
std::vector<Op> known_step(int e, int s) {
    const std::int64_t a = (s + 6) * 2 * MIB, b = (e + s + 7) * 2 * MIB, c = 777 * (e + 1) + 100 * s + 1;
    std::vector<Op> ops{{true, "x", a}, {true, "c", c}, {true, "y", b}, {false, "x", 0}};
    if (e == 0 && s == 1) {
        ops.push_back({true, "big", 512 * MIB});
        ops.push_back({false, "big", 0});
    }
    ops.push_back({true, "z", ((s + 6) / 2 + 6) * 2 * MIB});
    ops.push_back({false, "y", 0});
    ops.push_back({false, "c", 0});
    ops.push_back({false, "z", 0});
    return ops;
}

// The step's peak above its base, from the sizes alone.
std::uint64_t expected_peak(const std::vector<Op> &ops) {
    std::map<std::string, std::uint64_t> held;
    std::uint64_t now = 0, peak = 0;
    for (const Op &op : ops) {
        if (op.alloc) {
            held[op.name] = rounded(op.size);
            now += held[op.name];
            peak = std::max(peak, now);
        } else {
            now -= held[op.name];
            held.erase(op.name);
        }
    }
    return peak;
}

}  // namespace

int main(int argc, char **argv) {
    const int tries = argc > 1 ? std::atoi(argv[1]) : 20, steps = 10;
    if (c10::cuda::device_count() == 0) {
        std::printf("{\"error\": \"no CUDA device is visible\"}\n");
        return 2;
    }
    const auto dev = at::Device(at::kCUDA, 0);
    const auto bytes = at::TensorOptions().dtype(at::kByte).device(dev);
    const auto floats = at::TensorOptions().dtype(at::kFloat).device(dev);
    auto w = at::randn({1024, 1024}, floats);  // initialises CUDA and the allocator
    memprobe::torch::AllocatorSources gpu(0);
    memprobe::Tracker tracker(gpu.list());

    int caught = 0, mismatches = 0, quiet_steps = 0, quiet_loud = 0;
    for (int t = 0; t < tries; t++) {
        tracker.begin(memprobe::PhaseKind::Epoch);
        std::uint64_t ref_epoch = 0;
        for (int s = 0; s < steps; s++) {
            tracker.begin(memprobe::PhaseKind::Step);
            const std::uint64_t base = allocated_now();
            auto y = at::matmul(at::randn({64, 1024}, floats), w).relu().sum();
            const bool spike = s == t % steps;
            if (spike) {
                c10::cuda::CUDACachingAllocator::emptyCache();
                auto x = at::empty({SPIKE}, bytes);
                x.fill_(1);
                c10::cuda::device_synchronize();
                const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
                while (std::chrono::steady_clock::now() < end) {
                }
            }
            y = at::Tensor();
            c10::cuda::device_synchronize();
            const std::uint64_t ref = allocated_peak();
            const auto r = tracker.end(memprobe::PhaseKind::Step);
            ref_epoch = std::max(ref_epoch, ref);
            mismatches += r.deltas[0].peak != ref;
            if (spike) {
                caught += r.deltas[0].peak >= base + SPIKE;
            } else {
                quiet_steps++;
                quiet_loud += r.deltas[0].peak >= base + SPIKE;
            }
        }
        const auto e = tracker.end(memprobe::PhaseKind::Epoch);
        mismatches += e.deltas[0].peak != ref_epoch;
    }

    // Known sizes in nested windows.
    c10::cuda::CUDACachingAllocator::emptyCache();
    memprobe::Window epoch_w(gpu.list()), step_w(gpu.list());
    int known_windows = 0, known_wrong = 0;
    for (int e = 0; e < 3; e++) {
        (void)epoch_w.reset();
        (void)step_w.reset();
        std::uint64_t epoch_want = 0;
        for (int s = 0; s < 4; s++) {
            const std::uint64_t base = allocated_now();
            const auto ops = known_step(e, s);
            std::map<std::string, at::Tensor> held;
            for (const Op &op : ops) {
                if (op.alloc)
                    held[op.name] = at::empty({op.size}, bytes);
                else
                    held.erase(op.name);
            }
            c10::cuda::device_synchronize();
            const std::uint64_t want = base + expected_peak(ops);
            epoch_want = std::max(epoch_want, want);
            known_windows++;
            known_wrong += step_w.reset()[0].peak != want;
        }
        known_windows++;
        known_wrong += epoch_w.peak(0) != epoch_want;
    }
    // Attribution (memprobe_torch.hpp's Attribution): two epochs of six
    // steps; epoch 1, step 3 holds one 1 GiB tensor, the peak of its epoch.
    // The records land in MEMPROBE_ATTRIBUTION_DIR (set by the caller), which
    // gpu-validate-torch.py reads; here: how many snapshots were taken
    // against the new epoch peaks counted from the steps' own peaks, and the
    // spike step's exact peak. Then a request beyond the device: torch's
    // out-of-memory error, whose record the observer writes.
    std::string attr_error, oom_path;
    long long attr_snapshots = -1, attr_expected = 0, spike_step = -1, oom_request = 0;
    unsigned long long spike_peak = 0;
    bool oom_seen = false;
    try {
        memprobe::torch::AttributionOptions ao;
        ao.max_entries = 20000;
        memprobe::torch::Attribution attr(ao);
        memprobe::Tracker at(gpu.list());
        for (int e = 0; e < 2; e++) {
            at.begin(memprobe::PhaseKind::Epoch);
            std::uint64_t best = 0;
            for (int s = 0; s < 6; s++) {
                at.begin(memprobe::PhaseKind::Step);
                auto act = at::empty({(s + 1) * 4 * MIB}, bytes);
                if (e == 1 && s == 3) {
                    auto big = at::empty({1ll << 30}, bytes);  // the spike: the top block
                    big.fill_(1);
                }
                act = at::Tensor();
                c10::cuda::device_synchronize();
                const auto r = at.end(memprobe::PhaseKind::Step);
                if (s == 0 || r.deltas[0].peak > best) {
                    attr_expected++;
                    best = r.deltas[0].peak;
                }
                if (e == 1 && s == 3) {
                    spike_peak = r.deltas[0].peak;
                    spike_step = static_cast<long long>(r.phase.index);
                }
                if (attr.step_ended(e, r)) std::fprintf(stderr, "%s\n", attr.last_line().c_str());
            }
            at.end(memprobe::PhaseKind::Epoch);
        }
        attr_snapshots = static_cast<long long>(attr.snapshots());
        oom_request = 1ll << 50;  // 1 PiB: beyond any device
        try {
            auto huge = at::empty({oom_request}, bytes);
        } catch (const c10::OutOfMemoryError &) {
            oom_seen = true;
        }
        oom_path = attr.last_oom().value_or("");
    } catch (const std::exception &ex) {
        attr_error = ex.what();
    }
    for (char &ch : attr_error)
        if (ch == '"' || ch == '\\' || static_cast<unsigned char>(ch) < 0x20) ch = ' ';

    std::printf("{\"tries\": %d, \"caught\": %d, \"mismatches\": %d, \"quiet_steps\": %d, \"quiet_loud\": %d, "
                "\"known_windows\": %d, \"known_wrong\": %d, \"peak_since_start\": %llu, "
                "\"attribution\": {\"error\": \"%s\", \"snapshots\": %lld, \"new_epoch_peaks\": %lld, "
                "\"spike_step\": %lld, \"spike_peak\": %llu, \"oom_seen\": %s, \"oom_request\": %lld, "
                "\"oom_record\": \"%s\"}}\n",
                tries, caught, mismatches, quiet_steps, quiet_loud, known_windows, known_wrong,
                static_cast<unsigned long long>(gpu.peak_allocated_since_start()), attr_error.c_str(), attr_snapshots,
                attr_expected, spike_step, spike_peak, oom_seen ? "true" : "false", oom_request, oom_path.c_str());
    return caught == tries && mismatches == 0 && quiet_loud == 0 && known_wrong == 0 && attr_error.empty() ? 0 : 1;
}
