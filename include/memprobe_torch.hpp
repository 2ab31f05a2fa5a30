/*
 * memprobe_torch.hpp — exact GPU peaks from PyTorch's CUDA caching
 * allocator, for libtorch (C++) programs, and which tensors held each
 * epoch's peak step (Attribution, below). Header-only; include it only when
 * building against libtorch (C++17 up to libtorch 2.9, C++20 from 2.10, as
 * libtorch itself requires), and link libc10_cuda and libc10 besides
 * libmemprobe. With libtorch >= 2.11 the sources need no CUDA header (see
 * MEMPROBE_TORCH_DEVICE_ALLOCATOR below); attribution always does.
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

/* Attribution (which blocks held a step's peak) reads torch's allocator
 * history: recordHistory and snapshot are declared only in c10/cuda, whose
 * headers include the CUDA runtime's, with every libtorch. It is built
 * when those headers are at hand (always below 2.11, where this header
 * already needs them; from 2.11 when cuda_runtime_api.h is on the include
 * path). Define MEMPROBE_TORCH_ATTRIBUTION to 0 or 1 to choose. C++ stacks
 * for the blocks (MEMPROBE_TORCH_CPP_STACKS=1) use libtorch's own
 * unwinder: link libtorch_cpu too. */
#ifndef MEMPROBE_TORCH_ATTRIBUTION
#if !MEMPROBE_TORCH_DEVICE_ALLOCATOR || __has_include(<cuda_runtime_api.h>)
#define MEMPROBE_TORCH_ATTRIBUTION 1
#else
#define MEMPROBE_TORCH_ATTRIBUTION 0
#endif
#endif
#ifndef MEMPROBE_TORCH_CPP_STACKS
#define MEMPROBE_TORCH_CPP_STACKS 0
#endif
#if MEMPROBE_TORCH_ATTRIBUTION
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <memory>
#include <atomic>
#include <mutex>
#include <optional>
#include <time.h>
#include "memprobe_torch_attribution.hpp"
#if MEMPROBE_TORCH_CPP_STACKS
#include <torch/csrc/profiler/combined_traceback.h>
#endif
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

#if MEMPROBE_TORCH_ATTRIBUTION
/** Options of an Attribution: where and what to write (device, top N,
 *  stage, rank, directory; see attribution::Options) and how torch
 *  records. */
struct AttributionOptions : attribution::Options {
    /** torch's ring buffer of history entries: every entry of a step must
     *  fit, or that step's record says the history was incomplete. */
    std::size_t max_entries = 100000;
    /** C++ stacks for each block (torch's unwinder; costs at every
     *  allocation). Needs MEMPROBE_TORCH_CPP_STACKS=1. */
    bool cpp_stacks = false;
    /** Also write a record at each out-of-memory error of the device. */
    bool on_oom = true;
};

namespace detail {
namespace cca = c10::cuda::CUDACachingAllocator;

/* recordHistory's signature grew (clearHistory in 2.6, skip_actions
 * later): call the widest one this libtorch declares. */
struct pick0 {};
struct pick1 : pick0 {};
struct pick2 : pick1 {};
template <class A>
auto record_history(A *a, bool on, cca::CreateContextFn fn, std::size_t n, cca::RecordContext when, pick2)
    -> decltype(a->recordHistory(on, fn, n, when, false, std::vector<std::string>{}), void()) {
    a->recordHistory(on, fn, n, when, false, std::vector<std::string>{});
}
template <class A>
auto record_history(A *a, bool on, cca::CreateContextFn fn, std::size_t n, cca::RecordContext when, pick1)
    -> decltype(a->recordHistory(on, fn, n, when, false), void()) {
    a->recordHistory(on, fn, n, when, false);
}
template <class A>
void record_history(A *a, bool on, cca::CreateContextFn fn, std::size_t n, cca::RecordContext when, pick0) {
    a->recordHistory(on, fn, n, when);
}

#if MEMPROBE_TORCH_CPP_STACKS
inline std::shared_ptr<c10::GatheredContext> gather_cpp() { return ::torch::CapturedTraceback::gather(false, false, true); }
#endif

/** Frames of torch's contexts (C++ stacks), symbolized in one batch. */
class Frames {
public:
    void want(const std::shared_ptr<c10::GatheredContext> &c) {
#if MEMPROBE_TORCH_CPP_STACKS
        if (auto *t = dynamic_cast<::torch::CapturedTraceback *>(c.get()))
            if (index_.emplace(t, list_.size()).second) list_.push_back(t);
#else
        (void)c;
#endif
    }
    void resolve() {
#if MEMPROBE_TORCH_CPP_STACKS
        if (list_.empty()) return;
        ::torch::SymbolizedTracebacks st = ::torch::symbolize(list_);
        for (const auto &tb : st.tracebacks) {
            std::vector<attribution::Frame> f;
            for (std::uint64_t i : tb) {
                const auto &fr = st.all_frames.at(static_cast<std::size_t>(i));
                f.push_back(attribution::Frame{fr.filename, static_cast<std::int64_t>(fr.lineno), fr.funcname});
            }
            resolved_.push_back(std::move(f));
        }
#endif
    }
    std::vector<attribution::Frame> of(const std::shared_ptr<c10::GatheredContext> &c) const {
#if MEMPROBE_TORCH_CPP_STACKS
        if (auto *t = dynamic_cast<::torch::CapturedTraceback *>(c.get())) {
            auto it = index_.find(t);
            if (it != index_.end() && it->second < resolved_.size()) return resolved_[it->second];
        }
#else
        (void)c;
#endif
        return {};
    }

private:
#if MEMPROBE_TORCH_CPP_STACKS
    std::vector<::torch::CapturedTraceback *> list_;
    std::unordered_map<::torch::CapturedTraceback *, std::size_t> index_;
    std::vector<std::vector<attribution::Frame>> resolved_;
#endif
};

inline std::uint64_t stream_id(cudaStream_t s) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(s)); }

inline attribution::Action action_of(cca::TraceEntry::Action a) {
    switch (a) {
    case cca::TraceEntry::ALLOC: return attribution::Action::Alloc;
    case cca::TraceEntry::FREE_REQUESTED: return attribution::Action::FreeRequested;
    case cca::TraceEntry::FREE_COMPLETED: return attribution::Action::FreeCompleted;
    case cca::TraceEntry::SEGMENT_ALLOC: return attribution::Action::SegmentAlloc;
    case cca::TraceEntry::SEGMENT_FREE: return attribution::Action::SegmentFree;
    case cca::TraceEntry::SEGMENT_MAP: return attribution::Action::SegmentMap;
    case cca::TraceEntry::SEGMENT_UNMAP: return attribution::Action::SegmentUnmap;
    case cca::TraceEntry::OOM: return attribution::Action::Oom;
    default: return attribution::Action::Snapshot;  // moves no block
    }
}

/** torch's snapshot of one device as the replay's History. */
inline attribution::History history_of(const cca::SnapshotInfo &info, int device, std::size_t max_entries,
                                       std::int64_t since_us) {
    Frames frames;
    const std::vector<cca::TraceEntry> none;
    const auto d = static_cast<std::size_t>(device);
    const std::vector<cca::TraceEntry> &trace = d < info.device_traces.size() ? info.device_traces[d] : none;
    for (const cca::SegmentInfo &seg : info.segments)
        if (seg.device == device)
            for (const cca::BlockInfo &b : seg.blocks) frames.want(b.context_when_allocated);
    for (const cca::TraceEntry &e : trace) frames.want(e.context_);
    frames.resolve();
    attribution::History h;
    h.max_entries = max_entries;
    h.recording_since_us = since_us;
    for (const cca::SegmentInfo &seg : info.segments) {
        if (seg.device != device) continue;
        attribution::Segment s{seg.address, seg.total_size, stream_id(seg.stream), {}};
        for (const cca::BlockInfo &b : seg.blocks)
            s.blocks.push_back(attribution::SnapshotBlock{b.size, b.requested_size, b.allocated, b.active,
                                                          frames.of(b.context_when_allocated)});
        h.segments.push_back(std::move(s));
    }
    h.events.reserve(trace.size());
    for (const cca::TraceEntry &e : trace)
        h.events.push_back(attribution::Event{action_of(e.action_), static_cast<std::uint64_t>(e.addr_),
                                              static_cast<std::uint64_t>(e.size_), stream_id(e.stream_),
                                              static_cast<std::int64_t>(e.time_.t_), frames.of(e.context_)});
    return h;
}

/** A CLOCK_MONOTONIC instant (memprobe's phase records) as Unix µs. */
inline std::int64_t monotonic_to_unix_us(std::uint64_t monotonic_ns) {
    timespec mono{}, real{};
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &real);
    const std::int64_t mono_ns = static_cast<std::int64_t>(mono.tv_sec) * 1000000000 + mono.tv_nsec;
    const std::int64_t real_ns = static_cast<std::int64_t>(real.tv_sec) * 1000000000 + real.tv_nsec;
    return (real_ns - (mono_ns - static_cast<std::int64_t>(monotonic_ns))) / 1000;
}
}  // namespace detail

/** Which tensors held each epoch's peak step, for a libtorch program:
 *  turns on torch's allocator history for one device (bounded, no stacks
 *  unless asked) and, when a step sets a new peak for its epoch, takes
 *  torch's snapshot, replays it to that step's exact peak and writes the
 *  record (epoch-<E>-rank-<R>.json, the Python integrations' format) into
 *  MEMPROBE_ATTRIBUTION_DIR or options.dir. An out-of-memory error of the
 *  device writes oom-<N>-rank-<R>.json with the failing request and the
 *  segments.
 *
 *     memprobe::torch::AllocatorSources gpu0(0);
 *     memprobe::torch::Attribution attr;                    // device 0
 *     memprobe::Tracker tracker(gpu0.list());
 *     for (epoch ...) for (step ...) {
 *         tracker.begin(memprobe::PhaseKind::Step);
 *         ... forward, backward, optimizer ...
 *         attr.step_ended(epoch, tracker.end(memprobe::PhaseKind::Step));  // torch_alloc:0 is source 0
 *     }
 *
 *  History recording is torch's cost (every allocation); memprobe adds a
 *  snapshot and a replay on new-peak steps only (snapshots() counts them).
 *  Throws memprobe::Error UNAVAILABLE without a CUDA device. */
class Attribution {
public:
    explicit Attribution(AttributionOptions o = {}) : state_(std::make_shared<State>()) {
        const int n = device_count();
        if (n == 0)
            throw Error(MEMPROBE_STATUS_UNAVAILABLE, "memprobe_torch: no CUDA device is visible, so there is no "
                                                     "allocator history to attribute device " + std::to_string(o.device));
        if (o.device < 0 || o.device >= n)
            throw Error(MEMPROBE_STATUS_INVALID_ID, "memprobe_torch: CUDA device " + std::to_string(o.device) +
                                                       " does not exist (" + std::to_string(n) + " visible)");
        if (o.max_entries == 0)
            throw Error(MEMPROBE_STATUS_INVALID_ARGUMENT, "memprobe_torch: max_entries must be at least 1");
#if !MEMPROBE_TORCH_CPP_STACKS
        if (o.cpp_stacks)
            throw Error(MEMPROBE_STATUS_INVALID_ARGUMENT,
                        "memprobe_torch: cpp_stacks needs MEMPROBE_TORCH_CPP_STACKS=1 (and libtorch_cpu linked)");
#endif
        auto *alloc = detail::cca::get();
        if (alloc == nullptr)
            throw Error(MEMPROBE_STATUS_UNAVAILABLE, "memprobe_torch: libtorch's CUDA caching allocator is not set up");
        detail::cca::CreateContextFn fn = nullptr;
        auto when = detail::cca::RecordContext::NEVER;
#if MEMPROBE_TORCH_CPP_STACKS
        if (o.cpp_stacks) {
            fn = &detail::gather_cpp;
            when = detail::cca::RecordContext::ALLOC;
        }
#endif
        try {
            detail::record_history(alloc, true, fn, o.max_entries, when, detail::pick2{});
        } catch (const c10::Error &e) {
            throw Error(MEMPROBE_STATUS_UNAVAILABLE,
                        std::string("memprobe_torch: torch refused to record its allocator history: ") +
                            e.what_without_backtrace());
        }
        const std::int64_t since = attribution::now_us();
        const int device = o.device;
        const std::size_t entries = o.max_entries;
        state_->attributor.emplace(o, [device, entries, since] {
            return detail::history_of(detail::cca::snapshot(), device, entries, since);
        });
        if (o.on_oom) {
            // torch keeps observers for the process's life: this one holds
            // the state weakly and does nothing once the Attribution is gone.
            // It runs inside the failing allocation: nothing may escape.
            std::weak_ptr<State> weak = state_;
            detail::cca::attachOutOfMemoryObserver([weak, device](std::int64_t dev, std::size_t, std::size_t,
                                                                  std::size_t) {
                if (dev != device) return;
                if (auto st = weak.lock()) {
                    try {
                        std::lock_guard<std::mutex> g(st->lock);
                        if (st->attributor) {
                            st->last_oom = st->attributor->out_of_memory(st->epoch, st->step);
                            st->last_oom_json = st->attributor->last_json();
                        }
                    } catch (...) {
                        st->oom_failures++;
                    }
                }
            });
        }
    }
    Attribution(const Attribution &) = delete;
    Attribution &operator=(const Attribution &) = delete;

    /** Turns torch's history off again. */
    ~Attribution() {
        {
            std::lock_guard<std::mutex> g(state_->lock);
            state_->attributor.reset();
        }
        try {
            if (auto *alloc = detail::cca::get())
                detail::record_history(alloc, false, nullptr, 0, detail::cca::RecordContext::NEVER, detail::pick2{});
        } catch (...) {
        }
    }

    /** A step ended (the record tracker.end(Step) returned; the device's
     *  torch_alloc source is at `alloc_index` in the tracker's list): when
     *  its exact peak is a new one for `epoch`, writes that epoch's record.
     *  Returns the path written, or nothing. */
    std::optional<std::string> step_ended(std::int64_t epoch, const Tracker::Record &step, std::size_t alloc_index = 0) {
        if (alloc_index >= step.deltas.size())
            throw Error(MEMPROBE_STATUS_INVALID_ARGUMENT, "memprobe_torch: source " + std::to_string(alloc_index) +
                                                              " is not in the step's record (" +
                                                              std::to_string(step.deltas.size()) + " sources)");
        return step_ended(epoch, static_cast<std::int64_t>(step.phase.index), step.deltas[alloc_index].peak,
                          detail::monotonic_to_unix_us(step.phase.started_at_ns));
    }
    /** As above, from figures: the step's exact peak of torch_alloc and its
     *  start (Unix µs). */
    std::optional<std::string> step_ended(std::int64_t epoch, std::int64_t step, std::uint64_t peak_bytes,
                                          std::int64_t started_us) {
        std::lock_guard<std::mutex> g(state_->lock);
        state_->epoch = epoch;
        state_->step = step;
        return state_->attributor->step_ended(epoch, step, peak_bytes, started_us);
    }
    /** Writes an OOM record now (the observer does it at torch's own
     *  out-of-memory errors). */
    std::string out_of_memory() {
        std::lock_guard<std::mutex> g(state_->lock);
        return state_->attributor->out_of_memory(state_->epoch, state_->step);
    }
    /** Snapshots taken: one per new epoch peak and per OOM. */
    std::size_t snapshots() const {
        std::lock_guard<std::mutex> g(state_->lock);
        return state_->attributor->snapshots();
    }
    /** The last table made (for a log line). */
    std::optional<attribution::Table> last() const {
        std::lock_guard<std::mutex> g(state_->lock);
        return state_->attributor->last();
    }
    /** One line for the last record written (a log line per epoch). */
    std::string last_line() const {
        std::lock_guard<std::mutex> g(state_->lock);
        return state_->attributor->last_line();
    }
    /** The path of the last OOM record the observer wrote, if any. */
    std::optional<std::string> last_oom() const {
        std::lock_guard<std::mutex> g(state_->lock);
        return state_->last_oom;
    }
    /** The JSON of the last OOM record the observer wrote, if any: pass it
     *  as memprobe_oom_report_event.live_blocks_json when reporting the
     *  caught c10::OutOfMemoryError (tracker.report_oom(event)), and the
     *  report embeds what was live and names its top blocks. */
    std::optional<std::string> last_oom_json() const {
        std::lock_guard<std::mutex> g(state_->lock);
        return state_->last_oom_json;
    }
    /** OOM records the observer failed to write (an unwritable directory). */
    std::size_t oom_failures() const { return state_->oom_failures; }

private:
    struct State {
        mutable std::mutex lock;
        std::optional<attribution::Attributor> attributor;
        std::optional<std::int64_t> epoch, step;
        std::optional<std::string> last_oom;
        std::optional<std::string> last_oom_json;
        std::atomic<std::size_t> oom_failures{0};
    };
    std::shared_ptr<State> state_;
};
#endif /* MEMPROBE_TORCH_ATTRIBUTION */

}  // namespace memprobe::torch

#endif /* MEMPROBE_TORCH_HPP */
