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
 */
#ifndef MEMPROBE_HPP
#define MEMPROBE_HPP

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <memory>
#include <stdexcept>
#include <string>
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
inline void check(memprobe_status st) {
    if (st != MEMPROBE_STATUS_OK) throw Error(st, memprobe_last_error());
}
inline void store(Status &out, memprobe_status st) { out = status_of(st); }
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

    Source(Source &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Source &operator=(Source &&o) noexcept {
        if (this != &o) {
            memprobe_source_free(h_);
            h_ = std::exchange(o.h_, nullptr);
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
        detail::store(st, memprobe_source_read(h_, &s));
        return s;
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

private:
    explicit Source(memprobe_source *h) : h_(h) {}
    static Source make(memprobe_status (*f)(memprobe_source **)) {
        memprobe_source *h = nullptr;
        detail::check(f(&h));
        return Source(h);
    }
    memprobe_source *h_ = nullptr;
};

namespace detail {
/* An empty list is an invalid argument (the C ABI says so too, whatever the
 * pointer of an empty vector is). */
inline std::vector<const memprobe_source *> handles(std::initializer_list<std::reference_wrapper<const Source>> l) {
    if (l.size() == 0) throw Error(MEMPROBE_STATUS_INVALID_ARGUMENT, "at least one source is needed");
    std::vector<const memprobe_source *> v;
    v.reserve(l.size());
    for (const Source &s : l) v.push_back(s.handle());
    return v;
}
}  // namespace detail

/** A peak window over sources; closed by the destructor. */
class Window {
public:
    explicit Window(std::initializer_list<std::reference_wrapper<const Source>> sources) {
        std::vector<const memprobe_source *> hs = detail::handles(sources);
        detail::check(memprobe_window_open(hs.data(), hs.size(), &h_));
        n_ = hs.size();
    }
    Window(Window &&o) noexcept : h_(std::exchange(o.h_, nullptr)), n_(o.n_) {}
    Window &operator=(Window &&o) noexcept {
        if (this != &o) {
            memprobe_window_free(h_);
            h_ = std::exchange(o.h_, nullptr);
            n_ = o.n_;
        }
        return *this;
    }
    Window(const Window &) = delete;
    Window &operator=(const Window &) = delete;
    ~Window() { memprobe_window_free(h_); }

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
        detail::store(st, memprobe_window_reset(h_, d.data(), d.size()));
        return d;
    }

private:
    memprobe_window *h_ = nullptr;
    std::size_t n_ = 0;
};

/** fastai's GPUMemTrace over any sources; freed by the destructor. */
class Trace {
public:
    /** Starts tracing now unless `deferred`; reports print to stderr unless redirected. */
    Trace(std::initializer_list<std::reference_wrapper<const Source>> sources, const std::string &ctx = "",
          bool silent = false, bool deferred = false) {
        std::vector<const memprobe_source *> hs = detail::handles(sources);
        std::uint32_t flags = (silent ? MEMPROBE_TRACE_SILENT : 0u) | (deferred ? MEMPROBE_TRACE_DEFERRED : 0u);
        detail::check(memprobe_trace_new(hs.data(), hs.size(), ctx.empty() ? nullptr : ctx.c_str(), flags, &h_));
    }
    Trace(Trace &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Trace &operator=(Trace &&o) noexcept {
        if (this != &o) {
            memprobe_trace_free(h_);
            h_ = std::exchange(o.h_, nullptr);
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
    void stop(Status &st) noexcept { detail::store(st, memprobe_trace_stop(h_)); }
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
        detail::store(st, memprobe_trace_report(h_, note.empty() ? nullptr : note.c_str()));
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
    bool running() const {
        bool r = false;
        detail::check(memprobe_trace_is_running(h_, &r));
        return r;
    }

protected:
    memprobe_trace *h_ = nullptr;
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

/** The training-loop tracker; sinks finish and the handle is freed by the destructor. */
class Tracker {
public:
    explicit Tracker(std::initializer_list<std::reference_wrapper<const Source>> sources) {
        std::vector<const memprobe_source *> hs = detail::handles(sources);
        detail::check(memprobe_tracker_new(hs.data(), hs.size(), &h_));
        n_ = hs.size();
    }
    Tracker(Tracker &&o) noexcept
        : h_(std::exchange(o.h_, nullptr)), n_(o.n_), callbacks_(std::move(o.callbacks_)) {}
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
        detail::store(st, memprobe_tracker_begin(h_, static_cast<std::uint32_t>(kind), name));
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
    memprobe_oom_report run_oom_retry(std::function<StepOutcome()> step, std::uint32_t max_retries) {
        Status st;
        memprobe_oom_report r = run_oom_retry_status(step, max_retries, st);
        detail::rethrow_pending();
        if (!st) throw Error(st.code, st.message);
        return r;
    }
    /** Non-throwing run_oom_retry; exceptions from the step or a release
     *  callback are dropped (the status says the call failed). */
    memprobe_oom_report run_oom_retry(std::function<StepOutcome()> step, std::uint32_t max_retries,
                                      Status &st) noexcept {
        memprobe_oom_report r = run_oom_retry_status(step, max_retries, st);
        detail::pending() = nullptr;
        return r;
    }

private:
    memprobe_oom_report run_oom_retry_status(std::function<StepOutcome()> &step, std::uint32_t max_retries,
                                             Status &st) noexcept {
        memprobe_oom_report r{};
        detail::store(st, memprobe_tracker_run_oom_retry(h_, &Tracker::call_step, &step, max_retries, &r, nullptr, 0));
        return r;
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
