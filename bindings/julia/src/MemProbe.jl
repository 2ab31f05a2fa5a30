"""
    MemProbe

Exact memory measurement for machine-learning training through libmemprobe's
C ABI: this process's RSS with exact peaks (the kernel's high-water mark),
process trees, the container's cgroup, GPUs; concurrent peak windows,
fastai-style traces and the training-loop tracker.

The library is found at load time: `ENV["MEMPROBE_LIBRARY"]` (a path), else
the dynamic loader's search path (`libmemprobe.so.0.1`, `libmemprobe.so`),
else common prefixes. Every quantity is in bytes.

Untested: there is no Julia toolchain where memprobe is built. The binding is
kept in step with `include/memprobe.h` by a test that checks every header
function is named here (or listed in `UNBOUND.txt`).
"""
module MemProbe

using Libdl

export Source, Sample, SourceInfo, Window, Delta, Trace, Tracker, PhaseRecord,
       MemprobeError, read_sample, peak, peaks, measure, reset!, report,
       report_n_reset, format_report, data, data_mb, b2mb, withtrace, start!, stop!,
       isrunning, begin_phase, end_phase, next_phase, phase, monitor_set_interval,
       monitor_stats, monitor_stop, GPUMemory, GpuDevice, gpu_mem_get, gpu_mem_get_all,
       gpu_mem_get_free, gpu_mem_get_free_no_cache, gpu_mem_get_used,
       gpu_mem_get_used_no_cache, gpu_mem_get_used_fast, gpu_with_max_free_mem,
       preload_pytorch, gpu_source, gpu_exact_source, Exporter, set_oom_report!,
       clear_oom_report!, report_oom!, oom_status, rearm_oom_report!, OomCache

# ---------------------------------------------------------------------------
# Loading

const ABI = (0, 1)
const SONAME = "libmemprobe.so.$(ABI[1]).$(ABI[2])"

const FUNCTIONS = (
    :memprobe_version, :memprobe_soname, :memprobe_b2mb, :memprobe_b2mb_signed, :memprobe_debug_live_handles,
    :memprobe_last_error, :memprobe_status_name,
    :memprobe_monitor_set_interval_ns, :memprobe_monitor_get_stats, :memprobe_monitor_stop,
    :memprobe_source_new_process, :memprobe_source_new_process_tree,
    :memprobe_source_new_system_ram, :memprobe_source_new_cgroup, :memprobe_source_new_smaps,
    :memprobe_source_new_process_tree_smaps,
    :memprobe_source_new_pushed, :memprobe_source_new_callback, :memprobe_source_free,
    :memprobe_source_read, :memprobe_source_push, :memprobe_source_get_info,
    :memprobe_trace_new, :memprobe_trace_start, :memprobe_trace_stop, :memprobe_trace_reset,
    :memprobe_trace_is_running, :memprobe_trace_data, :memprobe_trace_measure,
    :memprobe_trace_report, :memprobe_trace_report_n_reset, :memprobe_trace_format,
    :memprobe_trace_set_silent, :memprobe_trace_set_output_fd,
    :memprobe_trace_set_output_callback, :memprobe_trace_free,
    :memprobe_window_open, :memprobe_window_peak, :memprobe_window_measure,
    :memprobe_window_reset, :memprobe_window_source_count, :memprobe_window_free,
    :memprobe_tracker_new, :memprobe_tracker_free, :memprobe_tracker_begin,
    :memprobe_tracker_end, :memprobe_tracker_next, :memprobe_tracker_add_table_sink,
    :memprobe_tracker_add_jsonl_sink, :memprobe_tracker_add_csv_sink,
    :memprobe_tracker_add_callback_sink, :memprobe_tracker_finish_sinks,
    :memprobe_tracker_add_release, :memprobe_tracker_release_every,
    :memprobe_tracker_release_below_free, :memprobe_tracker_release_now,
    :memprobe_tracker_releases_fired, :memprobe_tracker_set_leak_policy,
    :memprobe_tracker_leak_status, :memprobe_tracker_run_oom_retry,
    :memprobe_tracker_set_oom_report, :memprobe_tracker_report_oom,
    :memprobe_tracker_report_oom_event, :memprobe_tracker_oom_status,
    :memprobe_tracker_rearm_oom_report,
    :memprobe_source_get_last_error, :memprobe_source_new_gpu_device,
    :memprobe_source_new_gpu_process, :memprobe_source_new_gpu_exact, :memprobe_gpu_configure, :memprobe_gpu_get_backend,
    :memprobe_gpu_count, :memprobe_gpu_get_info, :memprobe_gpu_mem_get,
    :memprobe_gpu_mem_get_all, :memprobe_gpu_mem_get_free, :memprobe_gpu_mem_get_used,
    :memprobe_gpu_mem_get_free_no_cache, :memprobe_gpu_mem_get_used_no_cache,
    :memprobe_gpu_with_max_free_mem, :memprobe_gpu_get_current_device,
    :memprobe_gpu_set_current_device, :memprobe_gpu_preload, :memprobe_gpu_set_cache_release,
    :memprobe_gpu_device_open, :memprobe_gpu_mem_get_used_fast, :memprobe_gpu_device_mem_get,
    :memprobe_gpu_device_process_used, :memprobe_gpu_device_free,
    :memprobe_gpu_debug_live_devices,
    :memprobe_exporter_start, :memprobe_exporter_port, :memprobe_exporter_add_source,
    :memprobe_exporter_watch_tracker, :memprobe_exporter_set_rank, :memprobe_exporter_add_gpus,
    :memprobe_exporter_stop, :memprobe_exporter_free,
)

const LIB = Ref{Ptr{Cvoid}}(C_NULL)
const LIBPATH = Ref{String}("")
const SYMS = Dict{Symbol,Ptr{Cvoid}}()

function candidates()
    env = get(ENV, "MEMPROBE_LIBRARY", "")
    isempty(env) || return [env]
    c = [SONAME, "libmemprobe.so"]
    for prefix in (joinpath(homedir(), ".local"), "/usr/local", "/usr", "/opt/memprobe")
        push!(c, joinpath(prefix, "lib", SONAME))
    end
    return c
end

function __init__()
    tried = String[]
    for cand in candidates()
        h = Libdl.dlopen(cand, Libdl.RTLD_NOW; throw_error=false)
        if h === nothing
            push!(tried, "$cand: cannot be loaded")
            continue
        end
        vsym = Libdl.dlsym(h, :memprobe_version; throw_error=false)
        if vsym === nothing
            push!(tried, "$cand: not libmemprobe")
            continue
        end
        v = unsafe_string(ccall(vsym, Cstring, ()))
        parts = parse.(Int, split(v, ".")[1:2])
        if (parts[1], parts[2]) != ABI
            push!(tried, "$cand: version $v, this package needs $(ABI[1]).$(ABI[2]).x")
            continue
        end
        LIB[] = h
        LIBPATH[] = Libdl.dlpath(h)
        for f in FUNCTIONS
            p = Libdl.dlsym(h, f; throw_error=false)
            SYMS[f] = p === nothing ? C_NULL : p
        end
        return
    end
    error("MemProbe: cannot load libmemprobe (ABI $(ABI[1]).$(ABI[2])). Tried:\n  " *
          join(tried, "\n  ") * "\nSet ENV[\"MEMPROBE_LIBRARY\"] to the library's path.")
end

@inline function sym(f::Symbol)
    p = SYMS[f]
    p == C_NULL && throw(MemprobeError(UNSUPPORTED, "$f is not in $(LIBPATH[])"))
    return p
end

"The path of the loaded libmemprobe.so."
library_path() = LIBPATH[]

# ---------------------------------------------------------------------------
# Statuses and errors
#
# Constants, enum values and struct layouts below copy include/memprobe.h;
# tests/tests/bindings_cover_header.rs checks each against the header (a
# constant's C name is MEMPROBE_STATUS_<name> or MEMPROBE_<name> unless a
# trailing `# MEMPROBE_...` comment names it; structs name theirs in a
# `# layout:` comment).

const OK = UInt32(0)
const NULL_POINTER = UInt32(1)
const INVALID_ARGUMENT = UInt32(2)
const INVALID_HANDLE = UInt32(3)
const INVALID_ID = UInt32(4)
const WRONG_ORDER = UInt32(5)
const UNAVAILABLE = UInt32(6)
const UNSUPPORTED = UInt32(7)
const PERMISSION_DENIED = UInt32(8)
const IO_ERROR = UInt32(9)  # MEMPROBE_STATUS_IO
const PARSE = UInt32(10)
const GPU_LOST = UInt32(11)
const BUFFER_TOO_SMALL = UInt32(12)
const PANIC = UInt32(13)
const INTERNAL = UInt32(14)
const OUT_OF_MEMORY = UInt32(15)

"""
    MemprobeError(status, message)

A failed memprobe call: `status` is a `memprobe_status` value
(`MemProbe.WRONG_ORDER`, ...), `message` the library's explanation.
"""
struct MemprobeError <: Exception
    status::UInt32
    message::String
end

status_name(s::Integer) = unsafe_string(ccall(sym(:memprobe_status_name), Cstring, (UInt32,), s))

Base.showerror(io::IO, e::MemprobeError) =
    print(io, "MemprobeError: ", e.message, " [", status_name(e.status), "]")

last_error() = unsafe_string(ccall(sym(:memprobe_last_error), Cstring, ()))

# memprobe_last_error is thread-local: read it on the thread that failed,
# with no task switch in between (no yield point between the two calls).
@inline function check(st::UInt32)
    st == OK || throw(MemprobeError(st, last_error()))
    nothing
end

# ---------------------------------------------------------------------------
# Library-wide functions

"The library's version, e.g. \"0.1.0\"."
version() = unsafe_string(ccall(sym(:memprobe_version), Cstring, ()))
"The library's SONAME, e.g. \"libmemprobe.so.0.1\"."
soname() = unsafe_string(ccall(sym(:memprobe_soname), Cstring, ()))
"fastai's b2mb: bytes to MiB, rounded toward zero (negative deltas too, like fastai's int(n / 2^20))."
b2mb(n::Integer) = n >= 0 ? Int(ccall(sym(:memprobe_b2mb), UInt64, (UInt64,), n)) :
                   Int(ccall(sym(:memprobe_b2mb_signed), Int64, (Int64,), n))

"Live handles: (sources, windows, traces, trackers)."
function live_handles()
    s, w, t, k = Ref{UInt64}(0), Ref{UInt64}(0), Ref{UInt64}(0), Ref{UInt64}(0)
    check(ccall(sym(:memprobe_debug_live_handles), UInt32,
                (Ref{UInt64}, Ref{UInt64}, Ref{UInt64}, Ref{UInt64}), s, w, t, k))
    (s[], w[], t[], k[])
end

# ---------------------------------------------------------------------------
# Monitor

struct MonitorStats  # layout: memprobe_monitor_stats
    running::Bool
    watched::UInt64
    ticks::UInt64
    reads::UInt64
    errors::UInt64
    interval_ns::UInt64
end

"Sets how often sampled sources are polled, seconds (default 0.01)."
monitor_set_interval(seconds::Real) =
    check(ccall(sym(:memprobe_monitor_set_interval_ns), UInt32, (UInt64,), round(UInt64, seconds * 1e9)))

function monitor_stats()
    out = Ref{MonitorStats}()
    check(ccall(sym(:memprobe_monitor_get_stats), UInt32, (Ref{MonitorStats},), out))
    out[]
end

monitor_stop() = check(ccall(sym(:memprobe_monitor_stop), UInt32, ()))

# ---------------------------------------------------------------------------
# Sources

struct CSample  # layout: memprobe_sample
    used::UInt64
    total::UInt64
    free::UInt64
    limit::UInt64
    reserved::UInt64
    valid::UInt32
    taken_at_ns::UInt64
    read_ns::UInt64
end

struct CSourceInfo  # layout: memprobe_source_info
    kind::UInt32
    fidelity::UInt32
    name::NTuple{72,UInt8}
end

struct CDelta  # layout: memprobe_delta
    used_start::UInt64
    used_end::UInt64
    peak::UInt64
    delta_used::Int64
    delta_peaked::UInt64
    kind::UInt32
    fidelity::UInt32
end

"One reading in bytes; fields a source cannot supply are `nothing`."
struct Sample
    used::UInt64
    total::Union{UInt64,Nothing}
    free::Union{UInt64,Nothing}
    limit::Union{UInt64,Nothing}
    reserved::Union{UInt64,Nothing}
    taken_at_ns::UInt64
    read_ns::UInt64
end

const SAMPLE_TOTAL = UInt32(1)
const SAMPLE_FREE = UInt32(2)
const SAMPLE_LIMIT = UInt32(4)
const SAMPLE_RESERVED = UInt32(8)

Sample(c::CSample) = Sample(c.used,
    c.valid & SAMPLE_TOTAL != 0 ? c.total : nothing,
    c.valid & SAMPLE_FREE != 0 ? c.free : nothing,
    c.valid & SAMPLE_LIMIT != 0 ? c.limit : nothing,
    c.valid & SAMPLE_RESERVED != 0 ? c.reserved : nothing,
    c.taken_at_ns, c.read_ns)

const KINDS = (:process, :process_tree, :system_ram, :cgroup, :gpu_device, :gpu_process,
               :custom, :process_pss, :process_uss, :gpu_exact, :process_tree_pss,
               :process_tree_uss)
const FIDELITIES = (:exact, :pushed, :sampled)
kind_symbol(k) = k + 1 <= length(KINDS) ? KINDS[k+1] : Symbol("kind", k)
fidelity_symbol(f) = f + 1 <= length(FIDELITIES) ? FIDELITIES[f+1] : Symbol("fidelity", f)

struct SourceInfo
    name::String
    kind::Symbol
    fidelity::Symbol
end

"""
    Source

A source of readings: `Source(:process)`, `Source(:process_tree)`,
`Source(:system_ram)`, `Source(:cgroup)`, `Source(:pss)`, `Source(:uss)`,
`Source(:tree_pss)`, `Source(:tree_uss)` (the PSS / USS of this process and
its descendants: pages forked workers share counted once; each read walks
every mapping of every process of the tree), `Source(:pushed, name)`, `Source(read::Function, name)` (a custom source
whose `read()` returns bytes). Release with `close` (a finalizer does it
too).
"""
mutable struct Source
    handle::Ptr{Cvoid}
    closed::Bool
    keep::Any  # a callback's closure, kept alive with the source
end

const CALLBACKS = IdDict{Any,Nothing}()  # roots of callback closures
const CALLBACKS_LOCK = ReentrantLock()

root!(x) = lock(() -> (CALLBACKS[x] = nothing), CALLBACKS_LOCK)
unroot!(x) = lock(() -> delete!(CALLBACKS, x), CALLBACKS_LOCK)

function wrap_source(h::Ptr{Cvoid}, keep=nothing)
    s = Source(h, false, keep)
    finalizer(close, s)
    s
end

function Source(kind::Symbol, name::AbstractString="")
    out = Ref{Ptr{Cvoid}}(C_NULL)
    st = if kind === :process
        ccall(sym(:memprobe_source_new_process), UInt32, (UInt32, Ref{Ptr{Cvoid}}), 0, out)
    elseif kind === :process_preserve_hwm
        ccall(sym(:memprobe_source_new_process), UInt32, (UInt32, Ref{Ptr{Cvoid}}), 1, out)
    elseif kind === :process_tree
        ccall(sym(:memprobe_source_new_process_tree), UInt32, (Ref{Ptr{Cvoid}},), out)
    elseif kind === :system_ram
        ccall(sym(:memprobe_source_new_system_ram), UInt32, (Ref{Ptr{Cvoid}},), out)
    elseif kind === :cgroup
        ccall(sym(:memprobe_source_new_cgroup), UInt32, (Ref{Ptr{Cvoid}},), out)
    elseif kind === :pss || kind === :uss
        ccall(sym(:memprobe_source_new_smaps), UInt32, (UInt32, Ref{Ptr{Cvoid}}),
              kind === :pss ? 0 : 1, out)
    elseif kind === :tree_pss || kind === :tree_uss
        ccall(sym(:memprobe_source_new_process_tree_smaps), UInt32, (UInt32, Ref{Ptr{Cvoid}}),
              kind === :tree_pss ? 0 : 1, out)
    elseif kind === :pushed
        ccall(sym(:memprobe_source_new_pushed), UInt32, (Cstring, Ref{Ptr{Cvoid}}), name, out)
    else
        throw(ArgumentError("unknown source kind $kind"))
    end
    check(st)
    wrap_source(out[])
end

# The C read function of custom sources: user_data is the root of a Ref
# holding the Julia function. It may run on the library's monitor thread
# (a foreign thread: Julia >= 1.9 adopts it).
function _read_trampoline(ud::Ptr{Cvoid}, out::Ptr{UInt64})::Int32
    try
        f = unsafe_pointer_to_objref(ud)[]
        v = f()
        v < 0 && return Int32(1)
        unsafe_store!(out, UInt64(v))
        return Int32(0)
    catch
        return Int32(1)
    end
end

function Source(read::Function, name::AbstractString)
    box = Ref{Any}(read)
    root!(box)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    cb = @cfunction(_read_trampoline, Int32, (Ptr{Cvoid}, Ptr{UInt64}))
    st = ccall(sym(:memprobe_source_new_callback), UInt32,
               (Cstring, Ptr{Cvoid}, Ptr{Cvoid}, Ref{Ptr{Cvoid}}),
               name, cb, pointer_from_objref(box), out)
    if st != OK
        unroot!(box)
        check(st)
    end
    # The box stays rooted for the life of the process: windows, traces and
    # trackers keep the C source alive after close, and the monitor may poll
    # it late.
    wrap_source(out[], box)
end

"Takes one reading now."
function read_sample(s::Source)
    out = Ref{CSample}()
    check(ccall(sym(:memprobe_source_read), UInt32, (Ptr{Cvoid}, Ref{CSample}), s.handle, out))
    Sample(out[])
end

Base.read(s::Source) = read_sample(s)

"Pushes the current value of a pushed source, bytes."
Base.push!(s::Source, used::Integer) =
    (check(ccall(sym(:memprobe_source_push), UInt32, (Ptr{Cvoid}, UInt64), s.handle, used)); s)

function info(s::Source)
    out = Ref{CSourceInfo}()
    check(ccall(sym(:memprobe_source_get_info), UInt32, (Ptr{Cvoid}, Ref{CSourceInfo}), s.handle, out))
    i = out[]
    bytes = collect(i.name)
    n = something(findfirst(==(0x00), bytes), length(bytes) + 1) - 1
    SourceInfo(String(bytes[1:n]), kind_symbol(i.kind), fidelity_symbol(i.fidelity))
end

function Base.close(s::Source)
    if !s.closed
        s.closed = true
        check(ccall(sym(:memprobe_source_free), UInt32, (Ptr{Cvoid},), s.handle))
    end
    nothing
end

handles(srcs) = Ptr{Cvoid}[s.handle for s in srcs]

# ---------------------------------------------------------------------------
# Windows

"What one source did over an interval, bytes."
struct Delta
    used_start::UInt64
    used_end::UInt64
    peak::UInt64
    delta_used::Int64
    delta_peaked::UInt64
    kind::Symbol
    fidelity::Symbol
end

Delta(d::CDelta) = Delta(d.used_start, d.used_end, d.peak, d.delta_used, d.delta_peaked,
                         kind_symbol(d.kind), fidelity_symbol(d.fidelity))

"""
    Window(sources...)

An open peak window; windows are concurrent, nestable and independent.
`peak(w, i)`, `peaks(w)`, `measure(w, i)`, `reset!(w)` (the ended
intervals), `close(w)`; `Window(f, sources...)` runs `f(w)` and closes it.
"""
mutable struct Window
    handle::Ptr{Cvoid}
    sources::Vector{Source}
    closed::Bool
end

function Window(srcs::Source...)
    isempty(srcs) && throw(ArgumentError("at least one source is needed"))
    hs = handles(srcs)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall(sym(:memprobe_window_open), UInt32, (Ptr{Ptr{Cvoid}}, Csize_t, Ref{Ptr{Cvoid}}),
                hs, length(hs), out))
    w = Window(out[], collect(srcs), false)
    finalizer(close, w)
    w
end

function Window(f::Function, srcs::Source...)
    w = Window(srcs...)
    try
        f(w)
    finally
        close(w)
    end
end

function peak(w::Window, i::Integer=1)
    out = Ref{UInt64}(0)
    check(ccall(sym(:memprobe_window_peak), UInt32, (Ptr{Cvoid}, Csize_t, Ref{UInt64}), w.handle, i - 1, out))
    out[]
end

peaks(w::Window) = [peak(w, i) for i in 1:length(w.sources)]

function measure(w::Window, i::Integer=1)
    out = Ref{CDelta}()
    check(ccall(sym(:memprobe_window_measure), UInt32, (Ptr{Cvoid}, Csize_t, Ref{CDelta}), w.handle, i - 1, out))
    Delta(out[])
end

function reset!(w::Window)
    out = Vector{CDelta}(undef, length(w.sources))
    check(ccall(sym(:memprobe_window_reset), UInt32, (Ptr{Cvoid}, Ptr{CDelta}, Csize_t), w.handle, out, length(out)))
    Delta.(out)
end

function Base.length(w::Window)
    out = Ref{Csize_t}(0)
    check(ccall(sym(:memprobe_window_source_count), UInt32, (Ptr{Cvoid}, Ref{Csize_t}), w.handle, out))
    Int(out[])
end

function Base.close(w::Window)
    if !w.closed
        w.closed = true
        check(ccall(sym(:memprobe_window_free), UInt32, (Ptr{Cvoid},), w.handle))
    end
    nothing
end

# ---------------------------------------------------------------------------
# Traces

const TRACE_SILENT = UInt32(1)
const TRACE_DEFERRED = UInt32(2)

"""
    Trace(sources...; ctx=nothing, silent=false, start=true, io=nothing)

fastai's GPUMemTrace over any sources: `report(t, note)`, `report_n_reset`,
`data(t, i)` (delta used, delta peaked; bytes), `data_mb`, `start!`, `stop!`,
`reset!`, `close`. Reports print to standard error unless `io` is given.
`withtrace(f, sources...; ctx)` runs `f()` and reports `(ctx: exit)`.
"""
mutable struct Trace
    handle::Ptr{Cvoid}
    sources::Vector{Source}
    io::Any
    closed::Bool
end

function _line_trampoline(line::Cstring, ud::Ptr{Cvoid})::Cvoid
    try
        io = unsafe_pointer_to_objref(ud)[]
        println(io, unsafe_string(line))
    catch
    end
    nothing
end

function Trace(srcs::Source...; ctx=nothing, silent::Bool=false, start::Bool=true, io=nothing)
    isempty(srcs) && throw(ArgumentError("at least one source is needed"))
    hs = handles(srcs)
    flags = (silent ? TRACE_SILENT : UInt32(0)) | (start ? UInt32(0) : TRACE_DEFERRED)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall(sym(:memprobe_trace_new), UInt32,
                (Ptr{Ptr{Cvoid}}, Csize_t, Cstring, UInt32, Ref{Ptr{Cvoid}}),
                hs, length(hs), ctx === nothing ? C_NULL : ctx, flags, out))
    t = Trace(out[], collect(srcs), nothing, false)
    finalizer(close, t)
    io === nothing || set_output!(t, io)
    t
end

tracecall(f::Symbol, t::Trace) = check(ccall(sym(f), UInt32, (Ptr{Cvoid},), t.handle))
start!(t::Trace) = tracecall(:memprobe_trace_start, t)
stop!(t::Trace) = tracecall(:memprobe_trace_stop, t)
reset!(t::Trace) = tracecall(:memprobe_trace_reset, t)

function isrunning(t::Trace)
    out = Ref{Bool}(false)
    check(ccall(sym(:memprobe_trace_is_running), UInt32, (Ptr{Cvoid}, Ref{Bool}), t.handle, out))
    out[]
end

function data(t::Trace, i::Integer=1)
    u, p = Ref{Int64}(0), Ref{UInt64}(0)
    check(ccall(sym(:memprobe_trace_data), UInt32, (Ptr{Cvoid}, Csize_t, Ref{Int64}, Ref{UInt64}),
                t.handle, i - 1, u, p))
    (u[], p[])
end

data_mb(t::Trace, i::Integer=1) = b2mb.(data(t, i))

function measure(t::Trace, i::Integer=1)
    out = Ref{CDelta}()
    check(ccall(sym(:memprobe_trace_measure), UInt32, (Ptr{Cvoid}, Csize_t, Ref{CDelta}), t.handle, i - 1, out))
    Delta(out[])
end

report(t::Trace, note=nothing) =
    check(ccall(sym(:memprobe_trace_report), UInt32, (Ptr{Cvoid}, Cstring), t.handle,
                note === nothing ? C_NULL : note))
report_n_reset(t::Trace, note=nothing) =
    check(ccall(sym(:memprobe_trace_report_n_reset), UInt32, (Ptr{Cvoid}, Cstring), t.handle,
                note === nothing ? C_NULL : note))

"The report line for `note`, without printing it."
function format_report(t::Trace, note=nothing)
    len = 256
    while true
        buf = Vector{UInt8}(undef, len)
        needed = Ref{Csize_t}(0)
        st = ccall(sym(:memprobe_trace_format), UInt32,
                   (Ptr{Cvoid}, Cstring, Ptr{UInt8}, Csize_t, Ref{Csize_t}),
                   t.handle, note === nothing ? C_NULL : note, buf, len, needed)
        if st == BUFFER_TOO_SMALL && needed[] > len
            len = Int(needed[])
            continue
        end
        check(st)
        return unsafe_string(pointer(buf))
    end
end

Base.show(io::IO, t::Trace) = print(io, t.closed ? "MemProbe.Trace(closed)" : format_report(t))

set_silent!(t::Trace, silent::Bool) =
    check(ccall(sym(:memprobe_trace_set_silent), UInt32, (Ptr{Cvoid}, Bool), t.handle, silent))
set_output_fd!(t::Trace, fd::Integer) =
    check(ccall(sym(:memprobe_trace_set_output_fd), UInt32, (Ptr{Cvoid}, Int32), t.handle, fd))

"Sends report lines to `io` (called synchronously by report)."
function set_output!(t::Trace, io::IO)
    box = Ref{Any}(io)
    cb = @cfunction(_line_trampoline, Cvoid, (Cstring, Ptr{Cvoid}))
    check(ccall(sym(:memprobe_trace_set_output_callback), UInt32, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}),
                t.handle, cb, pointer_from_objref(box)))
    t.io = box  # kept alive with the trace
    nothing
end

function Base.close(t::Trace)
    if !t.closed
        t.closed = true
        check(ccall(sym(:memprobe_trace_free), UInt32, (Ptr{Cvoid},), t.handle))
    end
    nothing
end

"Runs `f()` in a trace that reports `(ctx: exit)` when it returns (fastai's gpu_mem_trace)."
function withtrace(f::Function, srcs::Source...; ctx=nothing, kw...)
    t = Trace(srcs...; ctx=ctx, kw...)
    try
        return f()
    finally
        report(t, "exit")
        isrunning(t) && stop!(t)
        close(t)
    end
end

# ---------------------------------------------------------------------------
# Tracker

const PHASES = Dict(:step => 0, :epoch => 1, :experience => 2, :stream => 3, :custom => 4)
const RELEASE_CACHE = UInt32(0)
const RELEASE_GC = UInt32(1)
const STEP_DONE = Int32(0)
const STEP_OUT_OF_MEMORY = Int32(1)

struct CPhaseRecord  # layout: memprobe_phase_record
    kind::UInt32
    depth::UInt32
    index::UInt64
    started_at_ns::UInt64
    ended_at_ns::UInt64
    duration_ns::UInt64
    n_sources::UInt32
    n_releases::UInt32
    leak_flags::UInt64
    released_bytes::UInt64
    name::NTuple{72,UInt8}
end

struct COomRetryResult  # layout: memprobe_oom_retry_result
    succeeded::Bool
    retries::UInt32
    freed_bytes::UInt64
end

"The record of an ended phase, with one `Delta` per source."
struct PhaseRecord
    kind::Symbol
    name::String
    depth::Int
    index::Int
    duration_ns::UInt64
    n_releases::Int
    leak_flags::UInt64
    released_bytes::UInt64
    deltas::Vector{Delta}
end

function PhaseRecord(r::CPhaseRecord, ds::Vector{CDelta})
    bytes = collect(r.name)
    n = something(findfirst(==(0x00), bytes), length(bytes) + 1) - 1
    kinds = (:step, :epoch, :experience, :stream, :custom)
    PhaseRecord(r.kind < 5 ? kinds[r.kind+1] : :unknown, String(bytes[1:n]), r.depth, r.index,
                r.duration_ns, r.n_releases, r.leak_flags, r.released_bytes, Delta.(ds))
end

"""
    Tracker(sources...)

The training-loop tracker: `begin_phase(t, :epoch)`, `end_phase(t, :step)`
(a `PhaseRecord`), `next_phase`, sinks (`add_table_sink!`, `add_jsonl_sink!`,
`add_csv_sink!`, `add_callback_sink!`), releases (`add_release!`,
`release_every!`, `release_below_free!`, `release_now!`), leaks
(`set_leak_policy!`, `leak_status`) and `run_oom_retry`.
"""
mutable struct Tracker
    handle::Ptr{Cvoid}
    sources::Vector{Source}
    keep::Vector{Any}
    closed::Bool
end

function Tracker(srcs::Source...)
    isempty(srcs) && throw(ArgumentError("at least one source is needed"))
    hs = handles(srcs)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall(sym(:memprobe_tracker_new), UInt32, (Ptr{Ptr{Cvoid}}, Csize_t, Ref{Ptr{Cvoid}}),
                hs, length(hs), out))
    t = Tracker(out[], collect(srcs), Any[], false)
    finalizer(close, t)
    t
end

phase_args(kind::Symbol, name) = kind in keys(PHASES) ? (PHASES[kind], name) : (PHASES[:custom], String(kind))

function begin_phase(t::Tracker, kind::Symbol, name=nothing)
    k, n = phase_args(kind, name)
    check(ccall(sym(:memprobe_tracker_begin), UInt32, (Ptr{Cvoid}, UInt32, Cstring), t.handle, k,
                n === nothing ? C_NULL : n))
end

function _ending(f::Symbol, t::Tracker, kind::Symbol, name)
    k, n = phase_args(kind, name)
    rec = Ref{CPhaseRecord}()
    ds = Vector{CDelta}(undef, length(t.sources))
    check(ccall(sym(f), UInt32, (Ptr{Cvoid}, UInt32, Cstring, Ref{CPhaseRecord}, Ptr{CDelta}, Csize_t),
                t.handle, k, n === nothing ? C_NULL : n, rec, ds, length(ds)))
    PhaseRecord(rec[], ds)
end

end_phase(t::Tracker, kind::Symbol, name=nothing) = _ending(:memprobe_tracker_end, t, kind, name)
next_phase(t::Tracker, kind::Symbol, name=nothing) = _ending(:memprobe_tracker_next, t, kind, name)

"Runs `f()` as a phase and returns its record (the phase ends on an error too)."
function phase(f::Function, t::Tracker, kind::Symbol, name=nothing)
    begin_phase(t, kind, name)
    try
        f()
    catch
        end_phase(t, kind, name)
        rethrow()
    end
    end_phase(t, kind, name)
end

add_table_sink!(t::Tracker, kind::Symbol=:epoch, fd::Integer=1) =
    check(ccall(sym(:memprobe_tracker_add_table_sink), UInt32, (Ptr{Cvoid}, UInt32, Int32), t.handle, PHASES[kind], fd))
add_jsonl_sink!(t::Tracker, path::AbstractString) =
    check(ccall(sym(:memprobe_tracker_add_jsonl_sink), UInt32, (Ptr{Cvoid}, Cstring), t.handle, path))
add_csv_sink!(t::Tracker, path::AbstractString) =
    check(ccall(sym(:memprobe_tracker_add_csv_sink), UInt32, (Ptr{Cvoid}, Cstring), t.handle, path))

function _record_trampoline(rec::Ptr{CPhaseRecord}, ds::Ptr{CDelta}, n::Csize_t, ud::Ptr{Cvoid})::Cvoid
    try
        f = unsafe_pointer_to_objref(ud)[]
        f(PhaseRecord(unsafe_load(rec), [unsafe_load(ds, i) for i in 1:n]))
    catch
    end
    nothing
end

function add_callback_sink!(f::Function, t::Tracker)
    box = Ref{Any}(f)
    push!(t.keep, box)
    cb = @cfunction(_record_trampoline, Cvoid, (Ptr{CPhaseRecord}, Ptr{CDelta}, Csize_t, Ptr{Cvoid}))
    check(ccall(sym(:memprobe_tracker_add_callback_sink), UInt32, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}),
                t.handle, cb, pointer_from_objref(box)))
end

finish_sinks!(t::Tracker) = check(ccall(sym(:memprobe_tracker_finish_sinks), UInt32, (Ptr{Cvoid},), t.handle))

function _release_trampoline(ud::Ptr{Cvoid})::Int32
    try
        unsafe_pointer_to_objref(ud)[]()
        return Int32(0)
    catch
        return Int32(1)
    end
end

"Registers a release callback (`gc=true`: a garbage collector, e.g. `GC.gc`)."
function add_release!(f::Function, t::Tracker, name::AbstractString; gc::Bool=false)
    box = Ref{Any}(f)
    push!(t.keep, box)
    cb = @cfunction(_release_trampoline, Int32, (Ptr{Cvoid},))
    check(ccall(sym(:memprobe_tracker_add_release), UInt32, (Ptr{Cvoid}, Cstring, UInt32, Ptr{Cvoid}, Ptr{Cvoid}),
                t.handle, name, gc ? RELEASE_GC : RELEASE_CACHE, cb, pointer_from_objref(box)))
end

release_every!(t::Tracker, kind::Symbol, n::Integer; gc::Bool=false) =
    check(ccall(sym(:memprobe_tracker_release_every), UInt32, (Ptr{Cvoid}, UInt32, UInt64, Bool),
                t.handle, PHASES[kind], n, gc))
release_below_free!(t::Tracker, source::Integer, bytes::Integer; gc::Bool=false) =
    check(ccall(sym(:memprobe_tracker_release_below_free), UInt32, (Ptr{Cvoid}, Csize_t, UInt64, Bool),
                t.handle, source - 1, bytes, gc))

function release_now!(t::Tracker; gc::Bool=false)
    freed = zeros(UInt64, length(t.sources))
    check(ccall(sym(:memprobe_tracker_release_now), UInt32, (Ptr{Cvoid}, Bool, Ptr{UInt64}, Csize_t),
                t.handle, gc, freed, length(freed)))
    freed
end

function releases_fired(t::Tracker)
    out = Ref{UInt64}(0)
    check(ccall(sym(:memprobe_tracker_releases_fired), UInt32, (Ptr{Cvoid}, Ref{UInt64}), t.handle, out))
    out[]
end

set_leak_policy!(t::Tracker, threshold::Integer, epochs::Integer) =
    check(ccall(sym(:memprobe_tracker_set_leak_policy), UInt32, (Ptr{Cvoid}, UInt64, UInt32), t.handle, threshold, epochs))

function leak_status(t::Tracker, i::Integer=1)
    f, s, g = Ref{Bool}(false), Ref{UInt32}(0), Ref{Int64}(0)
    check(ccall(sym(:memprobe_tracker_leak_status), UInt32,
                (Ptr{Cvoid}, Csize_t, Ref{Bool}, Ref{UInt32}, Ref{Int64}), t.handle, i - 1, f, s, g))
    (flagged=f[], streak=s[], last_growth=g[])
end

function _step_trampoline(ud::Ptr{Cvoid})::Int32
    state = unsafe_pointer_to_objref(ud)[]
    try
        state.result = state.step()
        return STEP_DONE
    catch e
        if e isa OutOfMemoryError || occursin("out of memory", lowercase(sprint(showerror, e)))
            return STEP_OUT_OF_MEMORY
        end
        state.error = e
        return Int32(2)
    end
end

mutable struct StepState
    step::Function
    result::Any
    error::Any
end

"""
    run_oom_retry(step, t; max_retries=3)

fastai's gpu_mem_restore: runs `step()`; on an out-of-memory error runs the
release callbacks and retries. Returns `(succeeded, retries, freed_bytes, result)`;
`succeeded` is false when every try ran out of memory (the C call's
MEMPROBE_STATUS_OUT_OF_MEMORY, which is returned here rather than thrown).
"""
function run_oom_retry(step::Function, t::Tracker; max_retries::Integer=3)
    box = Ref{Any}(StepState(step, nothing, nothing))
    cb = @cfunction(_step_trampoline, Int32, (Ptr{Cvoid},))
    rep = Ref{COomRetryResult}()
    freed = zeros(UInt64, length(t.sources))
    st = GC.@preserve box ccall(sym(:memprobe_tracker_run_oom_retry), UInt32,
        (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, UInt32, Ref{COomRetryResult}, Ptr{UInt64}, Csize_t),
        t.handle, cb, pointer_from_objref(box), max_retries, rep, freed, length(freed))
    box[].error === nothing || throw(box[].error)
    st == OUT_OF_MEMORY || check(st)
    r = rep[]
    (succeeded=r.succeeded, retries=Int(r.retries), freed_bytes=r.freed_bytes, freed=freed,
     result=box[].result)
end

# ---------------------------------------------------------------------------
# Out-of-memory reports (docs/oom.md)

const OOM_TRIGGER_DRIVER = UInt32(1)
const OOM_TRIGGER_CALLER = UInt32(2)
const OOM_KEEP_ENDED_DEFAULT = UInt32(8)
const OOM_KEEP_ENDED_MAX = UInt32(4096)
const OOM_DEVICE_UNKNOWN = Int32(-1)
const OOM_EVENT_DEVICE_TOTAL = UInt32(1)
const OOM_EVENT_DEVICE_FREE = UInt32(2)
const OOM_CACHE_RESERVED = UInt32(1)
const OOM_CACHE_ALLOCATED = UInt32(2)
const OOM_CACHE_RELEASABLE = UInt32(4)

# memprobe_oom_report_options (it holds pointers, which the layout check
# does not compare; the field order and types follow the header).
struct COomReportOptions
    struct_size::UInt32
    triggers::UInt32
    path::Ptr{UInt8}
    json_fd::Int32
    summary_fd::Int32
    callback::Ptr{Cvoid}
    user_data::Ptr{Cvoid}
    keep_ended::UInt32
end

struct COomCache  # layout: memprobe_oom_cache
    device::UInt32
    valid::UInt32
    reserved_bytes::UInt64
    allocated_bytes::UInt64
    releasable_bytes::UInt64
end

# memprobe_oom_event (holds pointers, as above).
struct COomEvent
    struct_size::UInt32
    device::Int32
    requested_bytes::UInt64
    reported_by::Ptr{UInt8}
    detail::Ptr{UInt8}
    valid::UInt32
    n_caches::UInt32
    device_total_bytes::UInt64
    device_free_bytes::UInt64
    caches::Ptr{COomCache}
end

struct COomStatus  # layout: memprobe_oom_status
    armed::Bool
    triggers::UInt32
    reports_written::UInt64
    triggers_seen::UInt64
    later_triggers::UInt64
    last_write_status::UInt32
end

"A framework's cache on one device, for `report_oom!` (`nothing`: unknown)."
struct OomCache
    device::Int
    reserved::Union{Nothing,UInt64}
    allocated::Union{Nothing,UInt64}
    releasable::Union{Nothing,UInt64}
end
OomCache(device; reserved=nothing, allocated=nothing, releasable=nothing) =
    OomCache(device, reserved, allocated, releasable)

function _oom_trampoline(json::Cstring, summary::Cstring, ud::Ptr{Cvoid})::Cvoid
    try
        unsafe_pointer_to_objref(ud)[](unsafe_string(json), unsafe_string(summary))
    catch
    end
    nothing
end

_cptr(s::Nothing) = Ptr{UInt8}(C_NULL)
_cptr(s::String) = pointer(s)

"""
    set_oom_report!(t; path=nothing, fd=-1, summary_fd=-1, callback=nothing,
                    keep_ended=8, driver=false, caller=true)

Configures the tracker's out-of-memory report (docs/oom.md): when an
allocation fails for lack of GPU memory, ONE report — the failed allocation,
the open phases with each source's peak so far, the last `keep_ended` ended
phases, each GPU's processes, what releasing caches would free — as JSON to
`path` and/or `fd`, a summary to `summary_fd`, and/or `callback(json,
summary)`. Triggers: `caller` (`report_oom!`) and `driver` (memprobe's
interposer must be loaded). The first trigger writes; later ones are counted.
"""
function set_oom_report!(t::Tracker; path=nothing, fd::Integer=-1, summary_fd::Integer=-1,
                         callback=nothing, keep_ended::Integer=OOM_KEEP_ENDED_DEFAULT,
                         driver::Bool=false, caller::Bool=true)
    cpath = path === nothing ? nothing : String(path)
    cb, box = C_NULL, nothing
    if callback !== nothing
        box = Ref{Any}(callback)
        cb = @cfunction(_oom_trampoline, Cvoid, (Cstring, Cstring, Ptr{Cvoid}))
    end
    triggers = (driver ? OOM_TRIGGER_DRIVER : UInt32(0)) | (caller ? OOM_TRIGGER_CALLER : UInt32(0))
    GC.@preserve cpath box begin
        o = COomReportOptions(UInt32(sizeof(COomReportOptions)), triggers, _cptr(cpath), fd, summary_fd, cb,
                              box === nothing ? C_NULL : pointer_from_objref(box), keep_ended)
        check(ccall(sym(:memprobe_tracker_set_oom_report), UInt32, (Ptr{Cvoid}, Ref{COomReportOptions}),
                    t.handle, o))
    end
    box === nothing || push!(t.keep, box)  # called until the tracker is freed
    nothing
end

"Removes the out-of-memory report (a no-op when none is configured)."
clear_oom_report!(t::Tracker) =
    check(ccall(sym(:memprobe_tracker_set_oom_report), UInt32, (Ptr{Cvoid}, Ptr{Cvoid}), t.handle, C_NULL))

"""
    report_oom!(t, device=-1, requested_bytes=0, detail=nothing;
                reported_by=nothing, device_total=nothing, device_free=nothing, caches=OomCache[])

Reports an allocation that failed for lack of memory: the first report is
written, later ones are counted.
"""
function report_oom!(t::Tracker, device::Integer=OOM_DEVICE_UNKNOWN, requested_bytes::Integer=0,
                     detail=nothing; reported_by=nothing, device_total=nothing, device_free=nothing,
                     caches=OomCache[])
    d = detail === nothing ? nothing : String(detail)
    if reported_by === nothing && device_total === nothing && device_free === nothing && isempty(caches)
        GC.@preserve d check(ccall(sym(:memprobe_tracker_report_oom), UInt32,
                                   (Ptr{Cvoid}, Int32, UInt64, Ptr{UInt8}), t.handle, device,
                                   requested_bytes, _cptr(d)))
        return nothing
    end
    by = reported_by === nothing ? nothing : String(reported_by)
    bits(c) = (c.reserved === nothing ? 0 : OOM_CACHE_RESERVED) |
              (c.allocated === nothing ? 0 : OOM_CACHE_ALLOCATED) |
              (c.releasable === nothing ? 0 : OOM_CACHE_RELEASABLE)
    cs = [COomCache(c.device, bits(c), something(c.reserved, 0), something(c.allocated, 0),
                    something(c.releasable, 0)) for c in caches]
    valid = (device_total === nothing ? UInt32(0) : OOM_EVENT_DEVICE_TOTAL) |
            (device_free === nothing ? UInt32(0) : OOM_EVENT_DEVICE_FREE)
    GC.@preserve d by cs begin
        e = COomEvent(UInt32(sizeof(COomEvent)), device, requested_bytes, _cptr(by), _cptr(d), valid,
                      length(cs), something(device_total, 0), something(device_free, 0),
                      isempty(cs) ? Ptr{COomCache}(C_NULL) : pointer(cs))
        check(ccall(sym(:memprobe_tracker_report_oom_event), UInt32, (Ptr{Cvoid}, Ref{COomEvent}),
                    t.handle, e))
    end
    nothing
end

"Where the out-of-memory report stands: armed, triggers, reports written, triggers seen, later ones."
function oom_status(t::Tracker)
    st = Ref{COomStatus}()
    check(ccall(sym(:memprobe_tracker_oom_status), UInt32, (Ptr{Cvoid}, Ref{COomStatus}), t.handle, st))
    s = st[]
    (armed=s.armed, driver=(s.triggers & OOM_TRIGGER_DRIVER) != 0,
     caller=(s.triggers & OOM_TRIGGER_CALLER) != 0, reports_written=s.reports_written,
     triggers_seen=s.triggers_seen, later_triggers=s.later_triggers,
     last_write_status=s.last_write_status)
end

"Arms the out-of-memory report again: the next trigger writes a new one."
rearm_oom_report!(t::Tracker) =
    check(ccall(sym(:memprobe_tracker_rearm_oom_report), UInt32, (Ptr{Cvoid},), t.handle))

function Base.close(t::Tracker)
    if !t.closed
        t.closed = true
        check(ccall(sym(:memprobe_tracker_free), UInt32, (Ptr{Cvoid},), t.handle))
    end
    nothing
end

# ---------------------------------------------------------------------------
# GPUs (fastai's utils.mem; the fastai names return MiB and zeros without a GPU)

const GPU_CURRENT_DEVICE = -1
const GPU_MEMORY_RESERVED = UInt32(2)
const GPU_INFO_NVML_INDEX = UInt32(8)
const GPU_BACKENDS = (:auto, :nvml, :cudart, :none)

struct CGpuMemory  # layout: memprobe_gpu_memory
    total::UInt64
    free::UInt64
    used::UInt64
    reserved::UInt64
    valid::UInt32
    taken_at_ns::UInt64
    read_ns::UInt64
end

struct CGpuInfo  # layout: memprobe_gpu_info
    id::UInt32
    backend::UInt32
    nvml_index::UInt32
    valid::UInt32
    name::NTuple{96,UInt8}
    uuid::NTuple{96,UInt8}
    pci_bus_id::NTuple{32,UInt8}
end

"fastai's GPUMemory(total, free, used), MiB."
const GPUMemory = NamedTuple{(:total, :free, :used),Tuple{Int,Int,Int}}

cstr(t) = (b = collect(t); String(b[1:something(findfirst(==(0x00), b), length(b) + 1)-1]))

gpu_configure(backend::Symbol=:auto; nvml=nothing, cudart=nothing) =
    check(ccall(sym(:memprobe_gpu_configure), UInt32, (UInt32, Cstring, Cstring),
                findfirst(==(backend), GPU_BACKENDS) - 1,
                nvml === nothing ? C_NULL : nvml, cudart === nothing ? C_NULL : cudart))

function gpu_backend()
    out = Ref{UInt32}(0)
    check(ccall(sym(:memprobe_gpu_get_backend), UInt32, (Ref{UInt32},), out))
    GPU_BACKENDS[out[]+1]
end

function gpu_count()
    out = Ref{UInt32}(0)
    st = ccall(sym(:memprobe_gpu_count), UInt32, (Ref{UInt32},), out)
    st == UNAVAILABLE || check(st)
    Int(out[])
end

function gpu_info(id::Integer)
    out = Ref{CGpuInfo}()
    check(ccall(sym(:memprobe_gpu_get_info), UInt32, (UInt32, Ref{CGpuInfo}), id, out))
    i = out[]
    (id=Int(i.id), backend=GPU_BACKENDS[i.backend+1], name=cstr(i.name), uuid=cstr(i.uuid),
     pci_bus_id=cstr(i.pci_bus_id), nvml_index=i.valid & GPU_INFO_NVML_INDEX != 0 ? Int(i.nvml_index) : nothing)
end

"Total, free, used (and reserved) bytes of device `id` (nothing: the current one)."
function gpu_memory(id=nothing)
    out = Ref{CGpuMemory}()
    check(ccall(sym(:memprobe_gpu_mem_get), UInt32, (Int64, Ref{CGpuMemory}), id === nothing ? GPU_CURRENT_DEVICE : id, out))
    m = out[]
    (total=m.total, free=m.free, used=m.used, reserved=m.valid & GPU_MEMORY_RESERVED != 0 ? m.reserved : nothing)
end

function gpu_memory_all()
    n = Ref{Csize_t}(0)
    st = ccall(sym(:memprobe_gpu_mem_get_all), UInt32, (Ptr{CGpuMemory}, Csize_t, Ref{Csize_t}), C_NULL, 0, n)
    st == UNAVAILABLE && return NamedTuple[]
    st == BUFFER_TOO_SMALL || check(st)
    buf = Vector{CGpuMemory}(undef, n[])
    check(ccall(sym(:memprobe_gpu_mem_get_all), UInt32, (Ptr{CGpuMemory}, Csize_t, Ref{Csize_t}), buf, length(buf), n))
    [(total=m.total, free=m.free, used=m.used) for m in buf[1:n[]]]
end

# fastai's functions answer zeros for any failed reading.
quiet(f, zero) = try
    f()
catch e
    e isa MemprobeError ? zero : rethrow()
end

mb(m) = GPUMemory((b2mb(m.total), b2mb(m.free), b2mb(m.used)))
gpu_mem_get(id=nothing) = quiet(() -> mb(gpu_memory(id)), GPUMemory((0, 0, 0)))
gpu_mem_get_all() = quiet(() -> mb.(gpu_memory_all()), GPUMemory[])

function gpu_bytes(f::Symbol)
    out = Ref{UInt64}(0)
    check(ccall(sym(f), UInt32, (Ref{UInt64},), out))
    out[]
end

gpu_mem_get_free() = quiet(() -> b2mb(gpu_bytes(:memprobe_gpu_mem_get_free)), 0)
gpu_mem_get_used() = quiet(() -> b2mb(gpu_bytes(:memprobe_gpu_mem_get_used)), 0)
gpu_mem_get_free_no_cache() = quiet(() -> b2mb(gpu_bytes(:memprobe_gpu_mem_get_free_no_cache)), 0)
gpu_mem_get_used_no_cache() = quiet(() -> b2mb(gpu_bytes(:memprobe_gpu_mem_get_used_no_cache)), 0)

function gpu_with_max_free_mem()
    id, free = Ref{Int64}(0), Ref{UInt64}(0)
    ccall(sym(:memprobe_gpu_with_max_free_mem), UInt32, (Ref{Int64}, Ref{UInt64}), id, free)
    id[] < 0 && return (nothing, 0)
    (Int(id[]), b2mb(free[]))
end

function gpu_current_device()
    out = Ref{UInt32}(0)
    check(ccall(sym(:memprobe_gpu_get_current_device), UInt32, (Ref{UInt32},), out))
    Int(out[])
end

gpu_set_current_device(id::Integer) = check(ccall(sym(:memprobe_gpu_set_current_device), UInt32, (UInt32,), id))
preload_pytorch() = check(ccall(sym(:memprobe_gpu_preload), UInt32, ()))

const GPU_RELEASE = Ref{Any}(nothing)

"Registers `f` as the cache release that the *_no_cache readings call first (`nothing` removes it)."
function gpu_set_cache_release(f)
    if f === nothing
        check(ccall(sym(:memprobe_gpu_set_cache_release), UInt32, (Ptr{Cvoid}, Ptr{Cvoid}), C_NULL, C_NULL))
        GPU_RELEASE[] = nothing
        return
    end
    box = Ref{Any}(f)
    cb = @cfunction(_release_trampoline, Int32, (Ptr{Cvoid},))
    check(ccall(sym(:memprobe_gpu_set_cache_release), UInt32, (Ptr{Cvoid}, Ptr{Cvoid}), cb, pointer_from_objref(box)))
    GPU_RELEASE[] = box
    nothing
end

"A pre-resolved GPU (fastai's gpu_handle)."
mutable struct GpuDevice
    handle::Ptr{Cvoid}
    id::Int
    closed::Bool
end

function GpuDevice(id::Integer)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall(sym(:memprobe_gpu_device_open), UInt32, (UInt32, Ref{Ptr{Cvoid}}), id, out))
    d = GpuDevice(out[], id, false)
    finalizer(close, d)
    d
end

function devbytes(f::Symbol, d::GpuDevice)
    out = Ref{UInt64}(0)
    check(ccall(sym(f), UInt32, (Ptr{Cvoid}, Ref{UInt64}), d.handle, out))
    out[]
end

gpu_mem_get_used_fast(d::GpuDevice) = b2mb(devbytes(:memprobe_gpu_mem_get_used_fast, d))
process_used(d::GpuDevice) = devbytes(:memprobe_gpu_device_process_used, d)

function gpu_memory(d::GpuDevice)
    out = Ref{CGpuMemory}()
    check(ccall(sym(:memprobe_gpu_device_mem_get), UInt32, (Ptr{Cvoid}, Ref{CGpuMemory}), d.handle, out))
    m = out[]
    (total=m.total, free=m.free, used=m.used, reserved=m.valid & GPU_MEMORY_RESERVED != 0 ? m.reserved : nothing)
end

function Base.close(d::GpuDevice)
    if !d.closed
        d.closed = true
        check(ccall(sym(:memprobe_gpu_device_free), UInt32, (Ptr{Cvoid},), d.handle))
    end
    nothing
end

function gpu_live_devices()
    out = Ref{UInt64}(0)
    check(ccall(sym(:memprobe_gpu_debug_live_devices), UInt32, (Ref{UInt64},), out))
    out[]
end

"Sources over a GPU: `gpu_source(id)` (the device), `gpu_source(id; process=true)` (this process on it)."
function gpu_source(id::Integer; process::Bool=false)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    f = process ? :memprobe_source_new_gpu_process : :memprobe_source_new_gpu_device
    check(ccall(sym(f), UInt32, (UInt32, Ref{Ptr{Cvoid}}), id, out))
    wrap_source(out[])
end

"""
An exact source of this process's memory on CUDA device `device` (`gpu_exact:<device>`),
counted by the driver-API interposer at every allocation and free. Throws a MemprobeError
(UNAVAILABLE) when the interposer is not loaded: run Julia under
`memprobe run --gpu-exact -- julia ...` or with `LD_PRELOAD=/path/to/libmemprobe_interpose.so`.
"""
function gpu_exact_source(device::Integer)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall(sym(:memprobe_source_new_gpu_exact), UInt32, (UInt32, Ref{Ptr{Cvoid}}), device, out))
    wrap_source(out[])
end

"Why the source's last read failed (a MemprobeError), or nothing."
function last_read_error(s::Source)
    st = Ref{UInt32}(0)
    buf = Vector{UInt8}(undef, 512)
    needed = Ref{Csize_t}(0)
    r = ccall(sym(:memprobe_source_get_last_error), UInt32,
              (Ptr{Cvoid}, Ref{UInt32}, Ptr{UInt8}, Csize_t, Ref{Csize_t}), s.handle, st, buf, length(buf), needed)
    r in (OK, BUFFER_TOO_SMALL) || check(r)
    st[] == OK ? nothing : MemprobeError(st[], unsafe_string(pointer(buf)))
end

# ---------------------------------------------------------------------------
# The Prometheus exporter (docs/metrics.md)

"""
    Exporter(listen=nothing)

Serves `GET /metrics` in the Prometheus text format on `listen`
(`"IP:PORT"`; `nothing`: 127.0.0.1 on a free port): `add_source!`,
`watch!(e, tracker)`, `set_rank!`, `add_gpus!`, `port(e)`, `stop!`, `close`.
"""
mutable struct Exporter
    handle::Ptr{Cvoid}
    closed::Bool
end

function Exporter(listen=nothing)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall(sym(:memprobe_exporter_start), UInt32, (Cstring, Ref{Ptr{Cvoid}}),
                listen === nothing ? C_NULL : listen, out))
    e = Exporter(out[], false)
    finalizer(close, e)
    e
end

function port(e::Exporter)
    out = Ref{UInt16}(0)
    check(ccall(sym(:memprobe_exporter_port), UInt32, (Ptr{Cvoid}, Ref{UInt16}), e.handle, out))
    Int(out[])
end

add_source!(e::Exporter, s::Source) =
    check(ccall(sym(:memprobe_exporter_add_source), UInt32, (Ptr{Cvoid}, Ptr{Cvoid}), e.handle, s.handle))
watch!(e::Exporter, t::Tracker) =
    check(ccall(sym(:memprobe_exporter_watch_tracker), UInt32, (Ptr{Cvoid}, Ptr{Cvoid}), e.handle, t.handle))
set_rank!(e::Exporter, rank::Integer=-1, local_rank::Integer=-1, world_size::Integer=-1) =
    check(ccall(sym(:memprobe_exporter_set_rank), UInt32, (Ptr{Cvoid}, Int64, Int64, Int64),
                e.handle, rank, local_rank, world_size))
add_gpus!(e::Exporter; with_processes::Bool=false) =
    check(ccall(sym(:memprobe_exporter_add_gpus), UInt32, (Ptr{Cvoid}, Int32), e.handle, with_processes ? 1 : 0))
stop!(e::Exporter) = check(ccall(sym(:memprobe_exporter_stop), UInt32, (Ptr{Cvoid},), e.handle))

function Base.close(e::Exporter)
    if !e.closed
        e.closed = true
        check(ccall(sym(:memprobe_exporter_free), UInt32, (Ptr{Cvoid},), e.handle))
    end
    nothing
end

end # module
