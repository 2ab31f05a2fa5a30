/*
 * memprobe_torch.hpp — exact GPU peaks from PyTorch's CUDA caching
 * allocator, for libtorch (C++) programs. Header-only; include it only when
 * building against libtorch (C++20 for libtorch >= 2.10), and link
 * libc10_cuda and libc10 besides libmemprobe. With libtorch >= 2.11 it
 * needs no CUDA header (see MEMPROBE_TORCH_DEVICE_ALLOCATOR below).
 *
 * PyTorch keeps exact high-water marks of the bytes its allocator hands out
 * (allocated), holds from the driver (reserved) and keeps in active blocks
 * (active), per device, but only one global reset
 * (c10::cuda::CUDACachingAllocator::resetPeakStats). memprobe turns them
 * into exact sources (fidelity EXACT, never polled): one MarkGroup per
 * device over getDeviceStats(device) (StatType::AGGREGATE current / peak)
 * and resetPeakStats(device), so any number of nested or concurrent
 * windows, traces and tracker phases (per step, per epoch, per evaluation)
 * each get the true peak of their own interval.
 *
 *     memprobe::torch::AllocatorSources gpu0(0);      // torch_alloc:0, torch_reserved:0
 *     memprobe::Tracker tracker(gpu0.list());
 *     ... tracker.begin(memprobe::PhaseKind::Step); ... tracker.end(...) ...
 *     gpu0.peak_allocated_since_start();              // what max_memory_allocated() was
 *
 * What changes for your own code: memprobe now owns the allocator's peak
 * counters. Every window boundary over these sources (a window opening or
 * resetting, a trace starting, a tracker phase beginning or ending) resets
 * the device's peaks, so `torch.cuda.max_memory_allocated()` /
 * `max_memory_reserved()` in Python, and `getDeviceStats(d).*_bytes[0].peak`
 * in C++, then return the peak since memprobe's last boundary, not since
 * start or since your own reset. Ask memprobe instead: a Window over the
 * sources gives the peak since it opened, and AllocatorSources keeps one
 * open since it was made (peak_*_since_start). Do not call
 * resetPeakStats / reset_peak_memory_stats yourself while these sources
 * live: memprobe cannot see a peak reset before it read it, so open
 * windows would miss it.
 *
 * Without CUDA (no device, or CUDA_VISIBLE_DEVICES empty) making sources
 * for a device throws memprobe::Error with MEMPROBE_STATUS_UNAVAILABLE and
 * a message saying so; nothing else here touches CUDA.
 */
#ifndef MEMPROBE_TORCH_HPP
#define MEMPROBE_TORCH_HPP

/* Where the allocator is reached from. libtorch >= 2.11 registers its CUDA
 * caching allocator as a c10::DeviceAllocator, declared in c10/core: no
 * CUDA header is needed, so the torch wheel alone builds this header. Older
 * libtorch (2.5 ... 2.10) only declares it in c10/cuda, whose headers
 * include the CUDA runtime's (cuda_runtime_api.h and crt/host_defines.h:
 * the CUDA toolkit, or the nvidia-cuda-runtime-cu12 and
 * nvidia-cuda-nvcc-cu12 wheels matching torch.version.cuda). Define
 * MEMPROBE_TORCH_DEVICE_ALLOCATOR to 0 or 1 to choose. */
#ifndef MEMPROBE_TORCH_DEVICE_ALLOCATOR
#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif
#if defined(TORCH_VERSION_MAJOR) && defined(TORCH_VERSION_MINOR) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11))
#define MEMPROBE_TORCH_DEVICE_ALLOCATOR 1
#else
#define MEMPROBE_TORCH_DEVICE_ALLOCATOR 0
#endif
#endif

#if MEMPROBE_TORCH_DEVICE_ALLOCATOR
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceType.h>
namespace c10::cuda {
/* libc10_cuda's, as c10/cuda/CUDAFunctions.h declares it (that header
 * would pull in the CUDA runtime's). */
DeviceIndex device_count() noexcept;
}  // namespace c10::cuda
#else
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "memprobe.hpp"

namespace memprobe::torch {

/** Which allocator figure a source reports; also its mark index in the
 *  device's group. */
enum class Stat : std::size_t {
    Allocated = 0, /**< bytes handed out to tensors (memory_allocated) */
    Reserved = 1,  /**< bytes held from the driver, cache included (memory_reserved) */
    Active = 2,    /**< bytes in active blocks */
};

/** The name of a source: "torch_alloc:N", "torch_reserved:N", "torch_active:N". */
inline std::string source_name(Stat stat, int device) {
    const char *prefix = stat == Stat::Allocated  ? "torch_alloc:"
                         : stat == Stat::Reserved ? "torch_reserved:"
                                                  : "torch_active:";
    return prefix + std::to_string(device);
}

/** Reads one device's allocator statistics. */
using StatsFn = std::function<c10::CachingDeviceAllocator::DeviceStats()>;
/** Resets one device's allocator peaks. */
using ResetFn = std::function<void()>;

/** The AGGREGATE entry (all pools) of one figure. */
inline const c10::CachingDeviceAllocator::Stat &aggregate(const c10::CachingDeviceAllocator::DeviceStats &s,
                                                        Stat stat) {
    const auto &array = stat == Stat::Allocated  ? s.allocated_bytes
                        : stat == Stat::Reserved ? s.reserved_bytes
                                                 : s.active_bytes;
    return array[static_cast<std::size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
}

/** Number of CUDA devices libtorch sees (0 without CUDA; never throws). */
inline int device_count() noexcept { return static_cast<int>(c10::cuda::device_count()); }

/** The exact allocator sources of one device, the group behind them, and a
 *  window kept open since they were made (the true peaks since start). */
class AllocatorSources {
public:
    /** Sources over CUDA device `device` (allocated and reserved; active
     *  too when `with_active`). Throws memprobe::Error: UNAVAILABLE when
     *  no CUDA device is visible or the allocator cannot be read yet,
     *  INVALID_ID for a device out of range. */
    explicit AllocatorSources(int device, bool with_active = false)
        : AllocatorSources(checked(device), stats_of(device), reset_of(device), with_active) {}

    /** Sources over any statistics and reset functions (a test's scripted
     *  stand-in, or an allocator wrapper); names use `device`. */
    AllocatorSources(int device, StatsFn stats, ResetFn reset, bool with_active = false)
        : device_(device),
          // One getDeviceStats per read of every mark: a step boundary makes
          // two and one resetPeakStats, whatever the number of sources.
          group_(MarkGroup::many(
              [stats](memprobe_mark_value what, const std::size_t *idx, std::size_t n, std::uint64_t *out) {
                  const c10::CachingDeviceAllocator::DeviceStats s = stats();
                  for (std::size_t i = 0; i < n; i++) {
                      const auto &st = aggregate(s, static_cast<Stat>(idx[i]));
                      out[i] = static_cast<std::uint64_t>(what == MEMPROBE_MARK_VALUE_PEAK ? st.peak : st.current);
                  }
              },
              std::move(reset))),
          sources_(make_sources(group_, device, with_active)),
          since_start_(SourceList(sources_)) {}

    AllocatorSources(AllocatorSources &&) noexcept = default;
    AllocatorSources(const AllocatorSources &) = delete;
    AllocatorSources &operator=(const AllocatorSources &) = delete;

    int device() const noexcept { return device_; }
    const Source &allocated() const noexcept { return sources_[0]; }
    const Source &reserved() const noexcept { return sources_[1]; }
    /** Only when made with `with_active`. */
    const Source &active() const {
        if (sources_.size() < 3) throw Error(MEMPROBE_STATUS_INVALID_ARGUMENT, "made without the active source");
        return sources_[2];
    }
    /** allocated, reserved (and active): for Window, Trace, Tracker. */
    SourceList list() const { return SourceList(sources_); }
    /** Every source, for adding to a larger list (e.g. all devices). */
    const std::vector<Source> &sources() const noexcept { return sources_; }

    /** What torch.cuda.max_memory_allocated(device) returned before
     *  memprobe owned the counters: the peak since these sources were made. */
    std::uint64_t peak_allocated_since_start() const { return since_start_.peak(0); }
    /** As peak_allocated_since_start, for reserved bytes. */
    std::uint64_t peak_reserved_since_start() const { return since_start_.peak(1); }
    /** The window open since start (reset() it to start over, like
     *  reset_peak_memory_stats did, without disturbing other windows). */
    Window &since_start() noexcept { return since_start_; }

private:
    static int checked(int device) {
        int n = device_count();
        if (n == 0)
            throw Error(MEMPROBE_STATUS_UNAVAILABLE, "memprobe_torch: no CUDA device is visible (c10::cuda::device_count() is 0), "
                                                     "so there is no allocator for device " + std::to_string(device));
        if (device < 0 || device >= n)
            throw Error(MEMPROBE_STATUS_INVALID_ID, "memprobe_torch: CUDA device " + std::to_string(device) +
                                                       " does not exist (" + std::to_string(n) + " visible)");
        try {
            (void)device_stats(device);
        } catch (const c10::Error &e) {
            throw Error(MEMPROBE_STATUS_UNAVAILABLE,
                        "memprobe_torch: cannot read the CUDA caching allocator of device " + std::to_string(device) +
                            " (is CUDA initialised? create a tensor on it first): " + e.what_without_backtrace());
        }
        return device;
    }
#if MEMPROBE_TORCH_DEVICE_ALLOCATOR
    static c10::CachingDeviceAllocator::DeviceStats device_stats(int device) {
        return c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    }
    static void reset_peaks(int device) {
        c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(device));
    }
#else
    static c10::CachingDeviceAllocator::DeviceStats device_stats(int device) {
        return c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    }
    static void reset_peaks(int device) {
        c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
    }
#endif
    static StatsFn stats_of(int device) {
        return [device] { return device_stats(device); };
    }
    static ResetFn reset_of(int device) {
        return [device] { reset_peaks(device); };
    }
    static std::vector<Source> make_sources(const MarkGroup &g, int device, bool with_active) {
        std::vector<Source> v;
        v.push_back(g.source(static_cast<std::size_t>(Stat::Allocated), source_name(Stat::Allocated, device)));
        v.push_back(g.source(static_cast<std::size_t>(Stat::Reserved), source_name(Stat::Reserved, device)));
        if (with_active)
            v.push_back(g.source(static_cast<std::size_t>(Stat::Active), source_name(Stat::Active, device)));
        return v;
    }

    int device_;
    MarkGroup group_;
    std::vector<Source> sources_;
    Window since_start_;
};

/** AllocatorSources for every visible CUDA device (empty without CUDA). */
inline std::vector<AllocatorSources> all_devices(bool with_active = false) {
    std::vector<AllocatorSources> v;
    for (int d = 0, n = device_count(); d < n; d++) v.emplace_back(d, with_active);
    return v;
}

/** One list over the sources of several devices, for one tracker. */
inline SourceList list(const std::vector<AllocatorSources> &devices) {
    SourceList l;
    for (const AllocatorSources &d : devices)
        for (const Source &s : d.sources()) l.add(s);
    return l;
}

}  // namespace memprobe::torch

#endif /* MEMPROBE_TORCH_HPP */
