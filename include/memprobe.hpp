/*
 * memprobe.hpp — a header-only C++17 RAII layer over memprobe's C ABI.
 *
 * C++ users depend only on the stable C ABI (libmemprobe.so): this header
 * owns handles (move-only classes freed in destructors), turns statuses into
 * exceptions (memprobe::Error carries the status and message) and offers a
 * non-throwing overload of every fallible call, taking a memprobe::Status&
 * (the std::filesystem pattern). Destructors never throw.
 *
 * Thread safety is the C ABI's: any object may be used from any thread.
 *
 * Callbacks (callback and mark sources, report lines, records, releases)
 * are C++ callables. An exception a mark, line, record or release callback
 * throws never crosses the C frames: the C call fails, and the exception is
 * rethrown by the throwing C++ call that ran the callback once the C call
 * has returned (a non-throwing overload drops it; its Status says the call
 * failed). A callback source's read function may run on the monitor
 * thread: its exceptions fail that reading (UNAVAILABLE) and are dropped.
 * A callable stays registered while its source, or any window, trace,
 * tracker or exporter over it, lives; a late call from the library after
 * that answers "failed" instead of touching freed memory.
 */
#ifndef MEMPROBE_HPP
#define MEMPROBE_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memprobe.h"

namespace memprobe {

/** The outcome of a non-throwing call: a status code and its message. */
struct Status {
    memprobe_status code = MEMPROBE_STATUS_OK;
    std::string message;
    /** True when the call succeeded. */
    explicit operator bool() const noexcept { return code == MEMPROBE_STATUS_OK; }
};

/** Thrown by the throwing calls: the status and memprobe_last_error(). */
class Error : public std::runtime_error {
public:
    Error(memprobe_status status, const std::string &message)
        : std::runtime_error(message), status_(status) {}
    /** The memprobe_status value. */
    memprobe_status status() const noexcept { return status_; }
    /** The status's name ("wrong call order", ...). */
    const char *status_name() const noexcept { return memprobe_status_name(status_); }

private:
    memprobe_status status_;
};

namespace detail {
inline Status status_of(memprobe_status st) {
    Status s;
    s.code = st;
    if (st != MEMPROBE_STATUS_OK) s.message = memprobe_last_error();
    return s;
}
/* The exception a callback threw during the current C call on this thread,
 * kept until the call returns: exceptions never cross the C frames, and the
 * callbacks run on the thread that made the call. */
inline std::exception_ptr &pending() {
    static thread_local std::exception_ptr p;
    return p;
}
inline void keep_pending() noexcept {
    if (!pending()) pending() = std::current_exception();
}
inline void rethrow_pending() {
    if (pending()) std::rethrow_exception(std::exchange(pending(), nullptr));
}
/* After a C call: a callback's exception first, then the status. */
inline void check(memprobe_status st) {
    rethrow_pending();
    if (st != MEMPROBE_STATUS_OK) throw Error(st, memprobe_last_error());
}
inline void store(Status &out, memprobe_status st) { out = status_of(st); }
/* store for non-throwing overloads: a callback's exception is dropped. */
inline void store_drop(Status &out, memprobe_status st) noexcept {
    pending() = nullptr;
    try {
        out = status_of(st);
    } catch (...) {
        out.code = st;
    }
}

/* Callables the library calls back, found through ids passed as user_data
 * (never pointers to C++ objects, which a late call could find freed). */
struct Registry {
    std::mutex mu;
    std::unordered_map<std::uintptr_t, std::shared_ptr<void>> entries;
    std::uintptr_t next = 0;
};
/* Never destroyed: the monitor or an exporter thread may still call in
 * while static objects are destroyed at exit. */
inline Registry &registry() {
    static Registry *r = new Registry();
    return *r;
}
/* One registered callable; unregistered when the last owner drops it. */
class Registration {
public:
    explicit Registration(std::shared_ptr<void> callable) {
        Registry &r = registry();
        std::lock_guard<std::mutex> g(r.mu);
        id_ = ++r.next;
        r.entries.emplace(id_, std::move(callable));
    }
    ~Registration() {
        Registry &r = registry();
        std::lock_guard<std::mutex> g(r.mu);
        r.entries.erase(id_);
    }
    Registration(const Registration &) = delete;
    Registration &operator=(const Registration &) = delete;
    void *user_data() const noexcept { return reinterpret_cast<void *>(id_); }

private:
    std::uintptr_t id_ = 0;
};
/* What keeps a callable registered: held by its source and by every
 * window, trace, tracker and exporter over that source. */
using Keep = std::shared_ptr<const Registration>;
template <class T>
std::shared_ptr<T> registered(void *user_data) {
    Registry &r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.entries.find(reinterpret_cast<std::uintptr_t>(user_data));
    return it == r.entries.end() ? nullptr : std::static_pointer_cast<T>(it->second);
}
template <class T>
Keep register_callable(T callable) {
    return std::make_shared<const Registration>(std::make_shared<T>(std::move(callable)));
}

using ReadFn = std::function<std::uint64_t()>;
inline std::int32_t call_read(void *user_data, std::uint64_t *out) noexcept {
    try {
        std::shared_ptr<ReadFn> f = registered<ReadFn>(user_data);
        if (!f) return 1;
        *out = (*f)();
        return 0;
    } catch (...) {
        return 2; /* may be the monitor thread: nobody to rethrow to */
    }
}
}  // namespace detail

/** The library's version string, e.g. "0.1.0". */
inline std::string version() { return memprobe_version(); }

/** fastai's b2mb: bytes to MiB, rounded down. */
inline std::uint64_t b2mb(std::uint64_t bytes) noexcept { return memprobe_b2mb(bytes); }
/** Signed bytes (a delta) to MiB, rounded toward zero like fastai's int(num / 2**20). */
inline std::int64_t b2mb_signed(std::int64_t bytes) noexcept { return memprobe_b2mb_signed(bytes); }

/** A training-loop phase. */
enum class PhaseKind : std::uint32_t {
    Step = MEMPROBE_PHASE_KIND_STEP,
    Epoch = MEMPROBE_PHASE_KIND_EPOCH,
    Experience = MEMPROBE_PHASE_KIND_EXPERIENCE,
    Stream = MEMPROBE_PHASE_KIND_STREAM,
    Custom = MEMPROBE_PHASE_KIND_CUSTOM,
};

/** A source of readings (owns one memprobe_source handle). */
class Source {
public:
    /** This process's RSS; exact peaks unless preserve_hwm. */
    static Source process(bool preserve_hwm = false) {
        memprobe_source *h = nullptr;
        detail::check(memprobe_source_new_process(preserve_hwm ? MEMPROBE_PROCESS_PRESERVE_HWM : 0, &h));
        return Source(h);
    }
    /** This process and its descendants. */
    static Source process_tree() { return make(memprobe_source_new_process_tree); }
    /** The machine's RAM. */
    static Source system_ram() { return make(memprobe_source_new_system_ram); }
    /** The container's memory cgroup (throws Error with UNAVAILABLE if none). */
    static Source cgroup() { return make(memprobe_source_new_cgroup); }
    /** A source whose values you push(). */
    static Source pushed(const std::string &name) {
        memprobe_source *h = nullptr;
        detail::check(memprobe_source_new_pushed(name.c_str(), &h));
        return Source(h);
    }
    /** This process's proportional set size (smaps_rollup; each read costs
     *  milliseconds per GiB mapped). */
    static Source pss() { return smaps(MEMPROBE_SMAPS_PSS); }
    /** This process's unique set size. */
    static Source uss() { return smaps(MEMPROBE_SMAPS_USS); }
    /** The PSS of this process and its descendants: pages that forked
     *  workers share with their parent counted once (the tree's summed RSS
     *  counts them once per process). Each read walks every mapping of every
     *  process of the tree (milliseconds for big processes). */
    static Source tree_pss() { return make_id(memprobe_source_new_process_tree_smaps, MEMPROBE_SMAPS_PSS); }
    /** The USS of this process and its descendants: pages private to each. */
    static Source tree_uss() { return make_id(memprobe_source_new_process_tree_smaps, MEMPROBE_SMAPS_USS); }
    /** A whole GPU (memprobe id; sampled). UNAVAILABLE without a GPU
     *  backend, INVALID_ID for an id that names no GPU. */
    static Source gpu_device(std::uint32_t id) { return make_id(memprobe_source_new_gpu_device, id); }
    /** This process's memory on GPU `id` (sampled). */
    static Source gpu_process(std::uint32_t id) { return make_id(memprobe_source_new_gpu_process, id); }
    /** Exact device memory on CUDA device `device` as this process numbers
     *  it, counted by the driver-API interposer (libmemprobe_interpose.so,
     *  loaded by `memprobe run --gpu-exact` or LD_PRELOAD). UNAVAILABLE when
     *  it is not loaded or counting is off, INVALID_ID for a device >= 64. */
    static Source gpu_exact(std::uint32_t device) { return make_id(memprobe_source_new_gpu_exact, device); }
    /** A custom source read by calling `read()` (bytes in use; sampled:
     *  the monitor thread may call it while a window is open over it, so it
     *  must be thread-safe). An exception fails that reading. */
    static Source callback(const std::string &name, std::function<std::uint64_t()> read) {
        if (!read) throw Error(MEMPROBE_STATUS_NULL_POINTER, "the read function is empty");
        detail::Keep keep = detail::register_callable(std::move(read));
        memprobe_source *h = nullptr;
        detail::check(memprobe_source_new_callback(name.c_str(), &detail::call_read, keep->user_data(), &h));
        Source s(h);
        s.keep_ = std::move(keep);
        return s;
    }

    Source(Source &&o) noexcept : h_(std::exchange(o.h_, nullptr)), keep_(std::move(o.keep_)) {}
    Source &operator=(Source &&o) noexcept {
        if (this != &o) {
            memprobe_source_free(h_);
            h_ = std::exchange(o.h_, nullptr);
            keep_ = std::move(o.keep_);
        }
        return *this;
    }
    Source(const Source &) = delete;
    Source &operator=(const Source &) = delete;
    ~Source() { memprobe_source_free(h_); }

    /** Takes one reading now. */
    memprobe_sample read() const {
        memprobe_sample s{};
        detail::check(memprobe_source_read(h_, &s));
        return s;
    }
    /** Non-throwing read. */
    memprobe_sample read(Status &st) const noexcept {
        memprobe_sample s{};
        detail::store_drop(st, memprobe_source_read(h_, &s));
        return s;
    }
    /** Bytes in use now: the cheapest read, for a hot loop (no sample, no
     *  clock read; it still counts towards every open window's peak). */
    std::uint64_t used() const {
        std::uint64_t v = 0;
        detail::check(memprobe_source_read_used(h_, &v));
        return v;
    }
    /** Non-throwing used(). */
    std::uint64_t used(Status &st) const noexcept {
        std::uint64_t v = 0;
        detail::store_drop(st, memprobe_source_read_used(h_, &v));
        return v;
    }
    /** Pushes a value (pushed sources only). */
    void push(std::uint64_t bytes) const { detail::check(memprobe_source_push(h_, bytes)); }
    /** Non-throwing push. */
    void push(std::uint64_t bytes, Status &st) const noexcept { detail::store(st, memprobe_source_push(h_, bytes)); }
    /** Name, kind and fidelity. */
    memprobe_source_info info() const {
        memprobe_source_info i{};
        detail::check(memprobe_source_get_info(h_, &i));
        return i;
    }
    /** The C handle (still owned by this object). */
    const memprobe_source *handle() const noexcept { return h_; }
    /** What keeps this source's callables registered (empty for sources
     *  without callbacks); windows and traces over it hold a copy. */
    const detail::Keep &keep() const noexcept { return keep_; }

private:
    friend class MarkGroup;
    explicit Source(memprobe_source *h) : h_(h) {}
    static Source make(memprobe_status (*f)(memprobe_source **)) {
        memprobe_source *h = nullptr;
        detail::check(f(&h));
        return Source(h);
    }
    static Source make_id(memprobe_status (*f)(std::uint32_t, memprobe_source **), std::uint32_t id) {
        memprobe_source *h = nullptr;
        detail::check(f(id, &h));
        return Source(h);
    }
    static Source smaps(std::uint32_t metric) {
        memprobe_source *h = nullptr;
        detail::check(memprobe_source_new_smaps(metric, &h));
        return Source(h);
    }
    memprobe_source *h_ = nullptr;
    detail::Keep keep_;
};

/** A group of exact sources over resettable high-water marks that share
 *  one reset (memprobe_mark_group): e.g. a framework allocator's allocated
 *  and reserved bytes on one device. `current(i)` and `peak(i)` return the
 *  bytes in use and the high-water mark since the last reset of mark `i`
 *  (your own numbering); `reset()` resets every mark of the group. Before
 *  the reset that any member's window boundary makes, the group keeps every
 *  other member's peak, so windows over different members never lose each
 *  other's peaks.
 *
 *  The functions are called one at a time per group, on the thread that
 *  reads a source or opens, resets or closes a window (trace, tracker
 *  phase) over one of its sources, or on an exporter's thread at a scrape;
 *  never by the monitor. An exception fails that call (its peaks stay
 *  intact) and is rethrown after it, as described at the top of this
 *  header. A function must not call memprobe on the group's sources (or
 *  windows over them): WRONG_ORDER. Sources keep the group alive. */
class MarkGroup {
public:
    using ReadFn = std::function<std::uint64_t(std::size_t)>;
    using ResetFn = std::function<void()>;
    /** Stores value `what` of mark `indices[i]` in `out[i]`, `i < count`. */
    using ReadManyFn =
        std::function<void(memprobe_mark_value what, const std::size_t *indices, std::size_t count, std::uint64_t *out)>;

    /** A group whose marks are read several at once, from one snapshot
     *  (memprobe_mark_group_new_many): a window boundary over any number of
     *  its sources calls `read_many` twice and `reset` once. Same sources,
     *  same peaks as the three-function group. */
    static MarkGroup many(ReadManyFn read_many, ResetFn reset) {
        if (!read_many || !reset)
            throw Error(MEMPROBE_STATUS_NULL_POINTER, "a mark group needs read_many and reset functions");
        MarkGroup g;
        g.keep_ = detail::register_callable(ManyFns{std::move(read_many), std::move(reset)});
        detail::check(
            memprobe_mark_group_new_many(&MarkGroup::call_read_many, &MarkGroup::call_reset_many, g.keep_->user_data(), &g.h_));
        return g;
    }

    MarkGroup(ReadFn current, ReadFn peak, ResetFn reset) {
        if (!current || !peak || !reset)
            throw Error(MEMPROBE_STATUS_NULL_POINTER, "a mark group needs current, peak and reset functions");
        keep_ = detail::register_callable(Fns{std::move(current), std::move(peak), std::move(reset)});
        detail::check(memprobe_mark_group_new(&MarkGroup::call_current, &MarkGroup::call_peak, &MarkGroup::call_reset,
                                              keep_->user_data(), &h_));
    }
    MarkGroup(MarkGroup &&o) noexcept : h_(std::exchange(o.h_, nullptr)), keep_(std::move(o.keep_)) {}
    MarkGroup &operator=(MarkGroup &&o) noexcept {
        if (this != &o) {
            memprobe_mark_group_free(h_);
            h_ = std::exchange(o.h_, nullptr);
            keep_ = std::move(o.keep_);
        }
        return *this;
    }
    MarkGroup(const MarkGroup &) = delete;
    MarkGroup &operator=(const MarkGroup &) = delete;
    ~MarkGroup() { memprobe_mark_group_free(h_); }

    /** An exact source over mark `index` (kind CUSTOM, fidelity EXACT);
     *  one live source per index (INVALID_ARGUMENT for a second). */
    Source source(std::size_t index, const std::string &name) const {
        memprobe_source *h = nullptr;
        detail::check(memprobe_source_new_mark(h_, index, name.c_str(), &h));
        Source s(h);
        s.keep_ = keep_;
        return s;
    }
    /** The C handle (still owned by this object). */
    const memprobe_mark_group *handle() const noexcept { return h_; }

private:
    MarkGroup() = default;
    struct Fns {
        ReadFn current, peak;
        ResetFn reset;
    };
    struct ManyFns {
        ReadManyFn read_many;
        ResetFn reset;
    };
    static std::int32_t call_read_many(void *user_data, std::uint32_t what, const std::size_t *indices,
                                       std::size_t count, std::uint64_t *out) noexcept {
        try {
            std::shared_ptr<ManyFns> f = detail::registered<ManyFns>(user_data);
            if (!f) return 1;
            f->read_many(static_cast<memprobe_mark_value>(what), indices, count, out);
            return 0;
        } catch (...) {
            detail::keep_pending();
            return 2;
        }
    }
    static std::int32_t call_reset_many(void *user_data) noexcept {
        try {
            std::shared_ptr<ManyFns> f = detail::registered<ManyFns>(user_data);
            if (!f) return 1;
            f->reset();
            return 0;
        } catch (...) {
            detail::keep_pending();
            return 2;
        }
    }
    static std::int32_t call_read(void *user_data, std::size_t index, std::uint64_t *out, bool peak) noexcept {
        try {
            std::shared_ptr<Fns> f = detail::registered<Fns>(user_data);
            if (!f) return 1;
            *out = peak ? f->peak(index) : f->current(index);
            return 0;
        } catch (...) {
            detail::keep_pending();
            return 2;
        }
    }
    static std::int32_t call_current(void *u, std::size_t i, std::uint64_t *out) noexcept {
        return call_read(u, i, out, false);
    }
    static std::int32_t call_peak(void *u, std::size_t i, std::uint64_t *out) noexcept {
        return call_read(u, i, out, true);
    }
    static std::int32_t call_reset(void *user_data) noexcept {
        try {
            std::shared_ptr<Fns> f = detail::registered<Fns>(user_data);
            if (!f) return 1;
            f->reset();
            return 0;
        } catch (...) {
            detail::keep_pending();
            return 2;
        }
    }
    memprobe_mark_group *h_ = nullptr;
    detail::Keep keep_;
};

/** Sources for a window, trace, tracker: a braced list ({cpu, gpu}), a
 *  std::vector<Source> built at run time (e.g. one per GPU), a vector of
 *  references, or a pointer and a count. It refers to the sources; they
 *  must outlive it (not the window: a window keeps what it needs). */
class SourceList {
public:
    /** An empty list, for add(). */
    SourceList() = default;
    SourceList(std::initializer_list<std::reference_wrapper<const Source>> l) {
        for (const Source &s : l) add(s);
    }
    SourceList(const std::vector<Source> &v) {
        for (const Source &s : v) add(s);
    }
    SourceList(const std::vector<std::reference_wrapper<const Source>> &v) {
        for (const Source &s : v) add(s);
    }
    SourceList(const Source *first, std::size_t n) {
        for (std::size_t i = 0; i < n; i++) add(first[i]);
    }
    SourceList &add(const Source &s) {
        handles_.push_back(s.handle());
        if (s.keep()) keeps_.push_back(s.keep());
        return *this;
    }
    std::size_t size() const noexcept { return handles_.size(); }
    /** The handles; an empty list is INVALID_ARGUMENT. */
    const std::vector<const memprobe_source *> &handles() const {
        if (handles_.empty()) throw Error(MEMPROBE_STATUS_INVALID_ARGUMENT, "at least one source is needed");
        return handles_;
    }
    const std::vector<detail::Keep> &keeps() const noexcept { return keeps_; }

private:
    std::vector<const memprobe_source *> handles_;
    std::vector<detail::Keep> keeps_;
};

/** A peak window over sources; closed by the destructor. */
class Window {
public:
    explicit Window(std::initializer_list<std::reference_wrapper<const Source>> sources)
        : Window(SourceList(sources)) {}
    /** A window over sources chosen at run time. */
    explicit Window(const SourceList &sources) {
        const std::vector<const memprobe_source *> &hs = sources.handles();
        detail::check(memprobe_window_open(hs.data(), hs.size(), &h_));
        n_ = hs.size();
        keeps_ = sources.keeps();
    }
    Window(Window &&o) noexcept : h_(std::exchange(o.h_, nullptr)), n_(o.n_), keeps_(std::move(o.keeps_)) {}
    Window &operator=(Window &&o) noexcept {
        if (this != &o) {
            memprobe_window_free(h_);
            h_ = std::exchange(o.h_, nullptr);
            n_ = o.n_;
            keeps_ = std::move(o.keeps_);
        }
        return *this;
    }
    Window(const Window &) = delete;
    Window &operator=(const Window &) = delete;
    ~Window() { memprobe_window_free(h_); }
    /** Number of sources. */
    std::size_t size() const noexcept { return n_; }
    /** Peaks of every source, bytes. */
    std::vector<std::uint64_t> peaks() const {
        std::vector<std::uint64_t> p(n_);
        for (std::size_t i = 0; i < n_; i++) p[i] = peak(i);
        return p;
    }
    /** Non-throwing peak. */
    std::uint64_t peak(std::size_t i, Status &st) const noexcept {
        std::uint64_t p = 0;
        detail::store_drop(st, memprobe_window_peak(h_, i, &p));
        return p;
    }

    /** Peak of source `i` since the window (last) started, bytes. */
    std::uint64_t peak(std::size_t i = 0) const {
        std::uint64_t p = 0;
        detail::check(memprobe_window_peak(h_, i, &p));
        return p;
    }
    /** Start, now, peak and deltas of source `i`. */
    memprobe_delta measure(std::size_t i = 0) const {
        memprobe_delta d{};
        detail::check(memprobe_window_measure(h_, i, &d));
        return d;
    }
    /** Ends the interval and starts the next; returns the ended interval per source. */
    std::vector<memprobe_delta> reset() {
        std::vector<memprobe_delta> d(n_);
        detail::check(memprobe_window_reset(h_, d.data(), d.size()));
        return d;
    }
    /** Non-throwing reset. */
    std::vector<memprobe_delta> reset(Status &st) noexcept {
        std::vector<memprobe_delta> d(n_);
        detail::store_drop(st, memprobe_window_reset(h_, d.data(), d.size()));
        return d;
    }

private:
    memprobe_window *h_ = nullptr;
    std::size_t n_ = 0;
    std::vector<detail::Keep> keeps_;
};

/** fastai's GPUMemTrace over any sources; freed by the destructor. */
class Trace {
public:
    /** Starts tracing now unless `deferred`; reports print to stderr unless redirected. */
    Trace(std::initializer_list<std::reference_wrapper<const Source>> sources, const std::string &ctx = "",
          bool silent = false, bool deferred = false)
        : Trace(SourceList(sources), ctx, silent, deferred) {}
    /** A trace over sources chosen at run time. */
    Trace(const SourceList &sources, const std::string &ctx = "", bool silent = false, bool deferred = false) {
        const std::vector<const memprobe_source *> &hs = sources.handles();
        std::uint32_t flags = (silent ? MEMPROBE_TRACE_SILENT : 0u) | (deferred ? MEMPROBE_TRACE_DEFERRED : 0u);
        detail::check(memprobe_trace_new(hs.data(), hs.size(), ctx.empty() ? nullptr : ctx.c_str(), flags, &h_));
        keeps_ = sources.keeps();
    }
    Trace(Trace &&o) noexcept
        : h_(std::exchange(o.h_, nullptr)), keeps_(std::move(o.keeps_)), line_(std::move(o.line_)) {}
    Trace &operator=(Trace &&o) noexcept {
        if (this != &o) {
            memprobe_trace_free(h_);
            h_ = std::exchange(o.h_, nullptr);
            keeps_ = std::move(o.keeps_);
            line_ = std::move(o.line_);
        }
        return *this;
    }
    Trace(const Trace &) = delete;
    Trace &operator=(const Trace &) = delete;
    virtual ~Trace() { memprobe_trace_free(h_); }

    void start() { detail::check(memprobe_trace_start(h_)); }
    void stop() { detail::check(memprobe_trace_stop(h_)); }
    void reset() { detail::check(memprobe_trace_reset(h_)); }
    /** Non-throwing stop. */
    void stop(Status &st) noexcept { detail::store_drop(st, memprobe_trace_stop(h_)); }
    /** (delta used, delta peaked) of source `i`, bytes. */
    std::pair<std::int64_t, std::uint64_t> data(std::size_t i = 0) const {
        std::int64_t u = 0;
        std::uint64_t p = 0;
        detail::check(memprobe_trace_data(h_, i, &u, &p));
        return {u, p};
    }
    /** Prints the report line (unless silent). */
    void report(const std::string &note = "") {
        detail::check(memprobe_trace_report(h_, note.empty() ? nullptr : note.c_str()));
    }
    /** Non-throwing report. */
    void report(const std::string &note, Status &st) noexcept {
        detail::store_drop(st, memprobe_trace_report(h_, note.empty() ? nullptr : note.c_str()));
    }
    void report_n_reset(const std::string &note = "") {
        detail::check(memprobe_trace_report_n_reset(h_, note.empty() ? nullptr : note.c_str()));
    }
    /** The report line for `note`, not printed. */
    std::string line(const std::string &note = "") const {
        std::size_t need = 0;
        detail::check(memprobe_trace_format(h_, note.empty() ? nullptr : note.c_str(), nullptr, 0, &need));
        std::string s(need, '\0');
        detail::check(memprobe_trace_format(h_, note.empty() ? nullptr : note.c_str(), &s[0], s.size(), nullptr));
        s.resize(need - 1);
        return s;
    }
    void set_silent(bool silent) { detail::check(memprobe_trace_set_silent(h_, silent)); }
    /** Sends printed reports to a file descriptor (not closed). */
    void set_output_fd(int fd) { detail::check(memprobe_trace_set_output_fd(h_, fd)); }
    /** Sends each printed report line (no newline) to `f` instead, on the
     *  thread that reports. An exception from `f` is rethrown by the report
     *  call, after the line was handed over. */
    void set_output(std::function<void(const std::string &)> f) {
        if (!f) throw Error(MEMPROBE_STATUS_NULL_POINTER, "the output function is empty");
        detail::Keep keep = detail::register_callable(std::move(f));
        detail::check(memprobe_trace_set_output_callback(h_, &Trace::call_line, keep->user_data()));
        line_ = std::move(keep);
    }
    bool running() const {
        bool r = false;
        detail::check(memprobe_trace_is_running(h_, &r));
        return r;
    }

protected:
    memprobe_trace *h_ = nullptr;

private:
    using LineFn = std::function<void(const std::string &)>;
    static void call_line(const char *line, void *user_data) noexcept {
        try {
            std::shared_ptr<LineFn> f = detail::registered<LineFn>(user_data);
            if (f) (*f)(line);
        } catch (...) {
            detail::keep_pending();
        }
    }
    std::vector<detail::Keep> keeps_;
    detail::Keep line_;
};

/** A Trace that reports with the note "exit" when it goes out of scope. */
class ScopedTrace : public Trace {
public:
    using Trace::Trace;
    ScopedTrace(ScopedTrace &&) = default;
    ~ScopedTrace() override {
        bool running = false;
        if (h_ && memprobe_trace_is_running(h_, &running) == MEMPROBE_STATUS_OK && running)
            memprobe_trace_report(h_, "exit");
    }
};

/** What a step run under Tracker::run_oom_retry reports. */
enum class StepOutcome { Done, OutOfMemory };

/** What Tracker::run_oom_retry did: the OOM retry's result (not an OOM
 *  report; docs/architecture.md, "One name per OOM meaning"). */
using OomRetryResult = memprobe_oom_retry_result;

/** How a tracker reports out-of-memory (Tracker::set_oom_report; docs/oom.md).
 *  At least one trigger and one destination. */
struct OomReportOptions {
    /** memprobe's interposer sees the driver fail an allocation
     *  (libmemprobe_interpose.so must be loaded). */
    bool driver = false;
    /** The program reports it (Tracker::report_oom). */
    bool caller = true;
    /** The JSON report's file, written whole or not at all; empty: none. */
    std::string path;
    /** A descriptor for the JSON report; -1: none. */
    int json_fd = -1;
    /** A descriptor for the summary for people (e.g. 2); -1: none. */
    int summary_fd = -1;
    /** Receives each report's JSON and summary, on the thread of the trigger
     *  (for the driver's, inside the failing allocation: no CUDA call, no call
     *  on this tracker). An exception it throws is dropped. */
    std::function<void(const std::string &json, const std::string &summary)> callback;
    /** Ended phases the report keeps. */
    std::uint32_t keep_ended = MEMPROBE_OOM_KEEP_ENDED_DEFAULT;
};

/** The training-loop tracker; sinks finish and the handle is freed by the destructor. */
class Tracker {
public:
    explicit Tracker(std::initializer_list<std::reference_wrapper<const Source>> sources)
        : Tracker(SourceList(sources)) {}
    /** A tracker over sources chosen at run time (e.g. one per GPU). */
    explicit Tracker(const SourceList &sources) {
        const std::vector<const memprobe_source *> &hs = sources.handles();
        detail::check(memprobe_tracker_new(hs.data(), hs.size(), &h_));
        n_ = hs.size();
        keeps_ = sources.keeps();
    }
    Tracker(Tracker &&o) noexcept
        : h_(std::exchange(o.h_, nullptr)),
          n_(o.n_),
          callbacks_(std::move(o.callbacks_)),
          records_(std::move(o.records_)),
          oom_callbacks_(std::move(o.oom_callbacks_)),
          keeps_(std::move(o.keeps_)) {}
    Tracker &operator=(Tracker &&) = delete;
    Tracker(const Tracker &) = delete;
    Tracker &operator=(const Tracker &) = delete;
    /* The handle goes first: callbacks it may still call live until after. */
    ~Tracker() { memprobe_tracker_free(h_); }

    /** One ended phase: its record and one delta per source. */
    struct Record {
        memprobe_phase_record phase;
        std::vector<memprobe_delta> deltas;
    };

    void begin(PhaseKind kind, const char *name = nullptr) {
        detail::check(memprobe_tracker_begin(h_, static_cast<std::uint32_t>(kind), name));
    }
    void begin(PhaseKind kind, const char *name, Status &st) noexcept {
        detail::store_drop(st, memprobe_tracker_begin(h_, static_cast<std::uint32_t>(kind), name));
    }
    /** Ends the innermost phase. A release callback that threw while the
     *  phase ended (a release policy) has its exception rethrown here, after
     *  the phase has ended. */
    Record end(PhaseKind kind, const char *name = nullptr) {
        Record r{};
        r.deltas.resize(n_);
        memprobe_status st =
            memprobe_tracker_end(h_, static_cast<std::uint32_t>(kind), name, &r.phase, r.deltas.data(), n_);
        detail::rethrow_pending();
        detail::check(st);
        return r;
    }
    /** Non-throwing end: a release callback's exception is dropped (its
     *  release counts as failed). */
    Record end(PhaseKind kind, const char *name, Status &st) noexcept {
        Record r{};
        r.deltas.resize(n_);
        detail::store(st, memprobe_tracker_end(h_, static_cast<std::uint32_t>(kind), name, &r.phase, r.deltas.data(), n_));
        detail::pending() = nullptr;
        return r;
    }
    /** Ends the innermost phase and begins the next of the same kind at once. */
    Record next(PhaseKind kind, const char *name = nullptr) {
        Record r{};
        r.deltas.resize(n_);
        memprobe_status st =
            memprobe_tracker_next(h_, static_cast<std::uint32_t>(kind), name, &r.phase, r.deltas.data(), n_);
        detail::rethrow_pending();
        detail::check(st);
        return r;
    }

    /** Ends its phase when it goes out of scope (errors are ignored there;
     *  call end() to see them). */
    class Phase {
    public:
        Phase(Tracker &t, PhaseKind kind, const char *name) : t_(&t), kind_(kind), name_(name ? name : "") {
            t_->begin(kind_, name_.empty() ? nullptr : name_.c_str());
        }
        Phase(Phase &&o) noexcept : t_(std::exchange(o.t_, nullptr)), kind_(o.kind_), name_(std::move(o.name_)) {}
        Phase(const Phase &) = delete;
        Phase &operator=(const Phase &) = delete;
        Phase &operator=(Phase &&) = delete;
        ~Phase() {
            if (t_) {
                Status ignored;
                t_->end(kind_, name_.empty() ? nullptr : name_.c_str(), ignored);
            }
        }
        /** Ends the phase now and returns its record. The guard stays armed
         *  until the phase has really ended: if end() throws because the
         *  phase could not end (a phase nested in it is still open), the
         *  destructor still ends it. Ending twice is WRONG_ORDER. */
        Record end() {
            if (!t_) throw Error(MEMPROBE_STATUS_WRONG_ORDER, "this phase was already ended");
            Tracker *t = t_;
            Record r{};
            r.deltas.resize(t->n_);
            memprobe_status st = memprobe_tracker_end(t->h_, static_cast<std::uint32_t>(kind_),
                                                      name_.empty() ? nullptr : name_.c_str(), &r.phase,
                                                      r.deltas.data(), t->n_);
            if (st == MEMPROBE_STATUS_OK) t_ = nullptr;
            detail::rethrow_pending();
            detail::check(st);
            return r;
        }

    private:
        Tracker *t_;
        PhaseKind kind_;
        std::string name_;
    };

    /** Begins a phase that ends with the returned guard. */
    Phase scope(PhaseKind kind, const char *name = nullptr) { return Phase(*this, kind, name); }

    /** PeakMemMetric-style table, one row per ended phase of `kind`, to `fd`. */
    void add_table_sink(PhaseKind kind, int fd) {
        detail::check(memprobe_tracker_add_table_sink(h_, static_cast<std::uint32_t>(kind), fd));
    }
    void add_jsonl_sink(const std::string &path) { detail::check(memprobe_tracker_add_jsonl_sink(h_, path.c_str())); }
    void add_csv_sink(const std::string &path) { detail::check(memprobe_tracker_add_csv_sink(h_, path.c_str())); }
    void finish_sinks() { detail::check(memprobe_tracker_finish_sinks(h_)); }
    /** Hands each ended phase's record to `f`, on the thread that ended
     *  it. `f` must not call this tracker (WRONG_ORDER). An exception from
     *  `f` is rethrown by the end / next call, after the phase has ended. */
    void add_record_callback(std::function<void(const Record &)> f) {
        if (!f) throw Error(MEMPROBE_STATUS_NULL_POINTER, "the record function is empty");
        records_.push_back(std::unique_ptr<RecordFn>(new RecordFn(std::move(f))));
        detail::check(memprobe_tracker_add_callback_sink(h_, &Tracker::call_record, records_.back().get()));
    }
    /** The C handle (still owned by this object). */
    memprobe_tracker *handle() noexcept { return h_; }
    /** What keeps the sources' callables registered. */
    const std::vector<detail::Keep> &keeps() const noexcept { return keeps_; }

    /** Registers a release callback; it returns false on failure. An
     *  exception it throws never crosses the C ABI: the release counts as
     *  failed, and the exception is rethrown by the call that ran it (end,
     *  next, run_oom_retry) once the C call has returned. */
    void add_release(const std::string &name, bool is_gc, std::function<bool()> f) {
        callbacks_.push_back(std::unique_ptr<std::function<bool()>>(new std::function<bool()>(std::move(f))));
        detail::check(memprobe_tracker_add_release(h_, name.c_str(), is_gc ? MEMPROBE_RELEASE_GC : MEMPROBE_RELEASE_CACHE,
                                                   &Tracker::call_release, callbacks_.back().get()));
    }
    /** ClearCacheHook: release at the end of every n-th step or epoch ((index + 1) % n == 0). */
    void release_every(PhaseKind kind, std::uint64_t n, bool gc = false) {
        detail::check(memprobe_tracker_release_every(h_, static_cast<std::uint32_t>(kind), n, gc));
    }
    /** Release when source `i`'s free bytes fall below `bytes`. */
    void release_below_free(std::size_t i, std::uint64_t bytes, bool gc = false) {
        detail::check(memprobe_tracker_release_below_free(h_, i, bytes, gc));
    }
    std::uint64_t releases_fired() const {
        std::uint64_t n = 0;
        detail::check(memprobe_tracker_releases_fired(h_, &n));
        return n;
    }
    /** Flag sources growing more than `threshold` bytes per epoch for `epochs` epochs in a row. */
    void set_leak_policy(std::uint64_t threshold, std::uint32_t epochs) {
        detail::check(memprobe_tracker_set_leak_policy(h_, threshold, epochs));
    }
    bool leaking(std::size_t i) const {
        bool flagged = false;
        detail::check(memprobe_tracker_leak_status(h_, i, &flagged, nullptr, nullptr));
        return flagged;
    }
    /** fastai's gpu_mem_restore: run `step`, release and retry on
     *  out-of-memory. A step that throws std::bad_alloc ran out of memory.
     *  Any other exception from the step or a release callback stops the
     *  retries and is rethrown here after the C call returned (it never
     *  crosses the C ABI). Still out of memory after every retry: Error with
     *  MEMPROBE_STATUS_OUT_OF_MEMORY (the non-throwing overload returns the
     *  report with that status). */
    OomRetryResult run_oom_retry(std::function<StepOutcome()> step, std::uint32_t max_retries) {
        Status st;
        OomRetryResult r = run_oom_retry_status(step, max_retries, st);
        detail::rethrow_pending();
        if (!st) throw Error(st.code, st.message);
        return r;
    }
    /** Non-throwing run_oom_retry; exceptions from the step or a release
     *  callback are dropped (the status says the call failed). */
    OomRetryResult run_oom_retry(std::function<StepOutcome()> step, std::uint32_t max_retries,
                                      Status &st) noexcept {
        OomRetryResult r = run_oom_retry_status(step, max_retries, st);
        detail::pending() = nullptr;
        return r;
    }

    /** Configures the out-of-memory report: when an allocation fails for
     *  lack of GPU memory, ONE report (the failed allocation, the open phases
     *  with each source's peak so far, the last ended phases, each GPU's
     *  processes, what releasing caches would free) goes to the destinations
     *  chosen. The first trigger writes; later ones are counted (oom_status).
     *  Throws WRONG_ORDER when one is configured already, UNAVAILABLE for the
     *  driver trigger without the interposer. */
    void set_oom_report(const OomReportOptions &o) {
        memprobe_oom_report_options c{};
        c.struct_size = sizeof c;
        c.triggers = (o.driver ? MEMPROBE_OOM_TRIGGER_DRIVER : 0u) | (o.caller ? MEMPROBE_OOM_TRIGGER_CALLER : 0u);
        c.path = o.path.empty() ? nullptr : o.path.c_str();
        c.json_fd = o.json_fd;
        c.summary_fd = o.summary_fd;
        c.keep_ended = o.keep_ended;
        if (o.callback) {
            /* Kept until the tracker goes: the library may call it until then. */
            oom_callbacks_.push_back(std::unique_ptr<OomFn>(new OomFn(o.callback)));
            c.callback = &Tracker::call_oom;
            c.user_data = oom_callbacks_.back().get();
        }
        detail::check(memprobe_tracker_set_oom_report(h_, &c));
    }
    /** Removes the out-of-memory report (a no-op when none is configured). */
    void clear_oom_report() { detail::check(memprobe_tracker_set_oom_report(h_, nullptr)); }
    /** Reports an allocation that failed for lack of memory (e.g. a caught
     *  c10::OutOfMemoryError): on `device` (MEMPROBE_OOM_DEVICE_UNKNOWN when
     *  not known), asking `requested_bytes` (0: not known), with `detail`.
     *  The first report is written; later ones are counted. */
    void report_oom(int device, std::uint64_t requested_bytes, const std::string &detail = std::string()) {
        detail::check(memprobe_tracker_report_oom(h_, device, requested_bytes,
                                                  detail.empty() ? nullptr : detail.c_str()));
    }
    /** report_oom with everything the reporter knows (struct_size is set here). */
    void report_oom(memprobe_oom_report_event event) {
        event.struct_size = sizeof event;
        detail::check(memprobe_tracker_report_oom_event(h_, &event));
    }
    /** Where the out-of-memory report stands; throws WRONG_ORDER when none is configured. */
    memprobe_oom_report_status oom_status() const {
        memprobe_oom_report_status st{};
        detail::check(memprobe_tracker_oom_status(h_, &st));
        return st;
    }
    /** Arms the report again: the next trigger writes a new one. */
    void rearm_oom_report() { detail::check(memprobe_tracker_rearm_oom_report(h_)); }

private:
    using OomFn = std::function<void(const std::string &, const std::string &)>;
    static void call_oom(const char *json, const char *summary, void *f) noexcept {
        try {
            (*static_cast<OomFn *>(f))(json, summary);
        } catch (...) {
            /* It may run on any thread (the driver's trigger): nowhere to rethrow. */
        }
    }
    OomRetryResult run_oom_retry_status(std::function<StepOutcome()> &step, std::uint32_t max_retries,
                                             Status &st) noexcept {
        OomRetryResult r{};
        detail::store(st, memprobe_tracker_run_oom_retry(h_, &Tracker::call_step, &step, max_retries, &r, nullptr, 0));
        return r;
    }
    using RecordFn = std::function<void(const Record &)>;
    static void call_record(const memprobe_phase_record *phase, const memprobe_delta *deltas, std::size_t n,
                            void *f) noexcept {
        try {
            Record r{*phase, std::vector<memprobe_delta>(deltas, deltas + n)};
            (*static_cast<RecordFn *>(f))(r);
        } catch (...) {
            detail::keep_pending();
        }
    }
    static std::int32_t call_release(void *f) noexcept {
        try {
            return (*static_cast<std::function<bool()> *>(f))() ? 0 : 1;
        } catch (...) {
            detail::keep_pending();
            return 2;
        }
    }
    static std::int32_t call_step(void *f) noexcept {
        /* A release callback threw during the previous retry: stop. */
        if (detail::pending()) return -1;
        try {
            return (*static_cast<std::function<StepOutcome()> *>(f))() == StepOutcome::Done
                       ? MEMPROBE_STEP_DONE
                       : MEMPROBE_STEP_OUT_OF_MEMORY;
        } catch (const std::bad_alloc &) {
            return MEMPROBE_STEP_OUT_OF_MEMORY;
        } catch (...) {
            detail::keep_pending();
            return -1;
        }
    }
    memprobe_tracker *h_ = nullptr;
    std::size_t n_ = 0;
    std::vector<std::unique_ptr<std::function<bool()>>> callbacks_;
    std::vector<std::unique_ptr<RecordFn>> records_;
    std::vector<std::unique_ptr<OomFn>> oom_callbacks_;
    std::vector<detail::Keep> keeps_;
};

/** A Prometheus endpoint (memprobe_exporter): GET /metrics serves its
 *  sources' readings, the last ended phases of the trackers it watches,
 *  and optionally the GPUs. Stopped and freed by the destructor. */
class Exporter {
public:
    /** Listens on `listen_addr` ("IP:PORT"); empty: 127.0.0.1 on a free port. */
    explicit Exporter(const std::string &listen_addr = "") : keeps_(new Keeps()) {
        detail::check(memprobe_exporter_start(listen_addr.empty() ? nullptr : listen_addr.c_str(), &h_));
    }
    /** Listens on `listen_addr` as above, served with TLS and passwords as
     *  the web configuration file `web_config_file` says (Prometheus
     *  exporter-toolkit's format, see docs/metrics.md); a file that cannot
     *  be read or has an unknown key throws. */
    Exporter(const std::string &listen_addr, const std::string &web_config_file) : keeps_(new Keeps()) {
        detail::check(memprobe_exporter_start_with_web_config(
            listen_addr.empty() ? nullptr : listen_addr.c_str(), web_config_file.c_str(), &h_));
    }
    Exporter(Exporter &&o) noexcept : h_(std::exchange(o.h_, nullptr)), keeps_(std::move(o.keeps_)) {}
    Exporter &operator=(Exporter &&o) noexcept {
        if (this != &o) {
            memprobe_exporter_free(h_);
            h_ = std::exchange(o.h_, nullptr);
            keeps_ = std::move(o.keeps_);
        }
        return *this;
    }
    Exporter(const Exporter &) = delete;
    Exporter &operator=(const Exporter &) = delete;
    ~Exporter() { memprobe_exporter_free(h_); }

    /** The port it listens on. */
    std::uint16_t port() const {
        std::uint16_t p = 0;
        detail::check(memprobe_exporter_port(h_, &p));
        return p;
    }
    /** Exports a source's readings, read at each scrape (the source object
     *  may be destroyed afterwards). */
    void add_source(const Source &s) {
        detail::check(memprobe_exporter_add_source(h_, s.handle()));
        keep(std::vector<detail::Keep>{s.keep()});
    }
    /** Exports a tracker's sources and the records of its ended phases. */
    void watch(Tracker &t) {
        detail::check(memprobe_exporter_watch_tracker(h_, t.handle()));
        keep(t.keeps());
    }
    /** Rank labels; a negative value leaves that label out. */
    void set_rank(std::int64_t rank, std::int64_t local_rank = -1, std::int64_t world_size = -1) {
        detail::check(memprobe_exporter_set_rank(h_, rank, local_rank, world_size));
    }
    /** Exports the GPUs (DCGM-style gauges), and each process's memory on
     *  them when `with_processes`. */
    void add_gpus(bool with_processes = false) {
        detail::check(memprobe_exporter_add_gpus(h_, with_processes ? 1 : 0));
    }
    /** Why the last re-read of the web configuration was refused (the last
     *  good one is still served), as an Error to inspect, not thrown: its
     *  status is MEMPROBE_STATUS_OK and its message empty when the last
     *  read was taken or there is no web configuration. */
    Error web_config_error() const {
        std::string buf(256, '\0');
        for (;;) {
            memprobe_status st = MEMPROBE_STATUS_OK;
            std::size_t needed = 0;
            memprobe_status r = memprobe_exporter_get_web_config_error(h_, &st, &buf[0], buf.size(), &needed);
            if (r == MEMPROBE_STATUS_BUFFER_TOO_SMALL && needed > buf.size()) {
                buf.assign(needed, '\0');
                continue;
            }
            detail::check(r);
            return Error(st, std::string(buf.c_str()));
        }
    }
    /** Stops serving (WRONG_ORDER when already stopped). */
    void stop() { detail::check(memprobe_exporter_stop(h_)); }
    /** The C handle (still owned by this object). */
    memprobe_exporter *handle() noexcept { return h_; }

private:
    struct Keeps {
        std::mutex mu;
        std::vector<detail::Keep> v;
    };
    void keep(const std::vector<detail::Keep> &ks) {
        std::lock_guard<std::mutex> g(keeps_->mu);
        for (const detail::Keep &k : ks)
            if (k) keeps_->v.push_back(k);
    }
    memprobe_exporter *h_ = nullptr;
    std::unique_ptr<Keeps> keeps_;
};

/** The background monitor that polls sampled sources. */
namespace monitor {
inline void set_interval(std::chrono::nanoseconds interval) {
    detail::check(memprobe_monitor_set_interval_ns(static_cast<std::uint64_t>(interval.count())));
}
inline memprobe_monitor_stats stats() {
    memprobe_monitor_stats s{};
    detail::check(memprobe_monitor_get_stats(&s));
    return s;
}
inline void stop() { detail::check(memprobe_monitor_stop()); }
}  // namespace monitor

}  // namespace memprobe

#endif /* MEMPROBE_HPP */
