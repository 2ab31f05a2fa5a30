# Part of module MemProbe (src/MemProbe.jl includes it).
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

# end_into and end_tail: the C function `fn` ends the phase and names the
# phase whose tail the window becomes.
function end_chained(t::Tracker, fn::Symbol, kind::Symbol, name, next_kind::Symbol, next_name)
    k, n = phase_args(kind, name)
    nk, nn = phase_args(next_kind, next_name)
    rec = Ref{CPhaseRecord}()
    ds = Vector{CDelta}(undef, length(t.sources))
    check(ccall(sym(fn), UInt32,
                (Ptr{Cvoid}, UInt32, Cstring, UInt32, Cstring, Ref{CPhaseRecord}, Ptr{CDelta}, Csize_t),
                t.handle, k, n === nothing ? C_NULL : n, nk, nn === nothing ? C_NULL : nn,
                rec, ds, length(ds)))
    PhaseRecord(rec[], ds)
end

"""
    end_into(t, kind, name=nothing; next_kind=kind, next_name=name)

Ends the innermost phase as `end_phase` does and keeps its window running,
restarted at this end, as the tail of the phase `next_kind` (and
`next_name`): the next `resume_phase` of it begins at this end.
"""
function end_into(t::Tracker, kind::Symbol, name=nothing; next_kind::Symbol=kind, next_name=name)
    end_chained(t, :memprobe_tracker_end_into, kind, name, next_kind, next_name)
end

"""
    resume_phase(t, kind, name=nothing; from_kind=kind, from_name=name)

Begins a phase on the tail of `from_kind` (and `from_name`), made by
`end_into` or `mark_tail`: its interval began when the tail did. Without
such a tail, as `begin_phase`.
"""
function resume_phase(t::Tracker, kind::Symbol, name=nothing; from_kind::Symbol=kind, from_name=name)
    k, n = phase_args(kind, name)
    fk, fnm = phase_args(from_kind, from_name)
    check(ccall(sym(:memprobe_tracker_resume), UInt32, (Ptr{Cvoid}, UInt32, Cstring, UInt32, Cstring),
                t.handle, k, n === nothing ? C_NULL : n, fk, fnm === nothing ? C_NULL : fnm))
end

"""
    end_tail(t, kind, name=nothing; next_kind=kind, next_name=name)

Ends the phase that began on its own tail and ends now: `resume_phase`
then `end_into` in one call.
"""
function end_tail(t::Tracker, kind::Symbol, name=nothing; next_kind::Symbol=kind, next_name=name)
    end_chained(t, :memprobe_tracker_end_tail, kind, name, next_kind, next_name)
end

"Starts the tail of `kind` (and `name`) now: the next `resume_phase` of it begins here."
function mark_tail(t::Tracker, kind::Symbol, name=nothing)
    k, n = phase_args(kind, name)
    check(ccall(sym(:memprobe_tracker_mark_tail), UInt32, (Ptr{Cvoid}, UInt32, Cstring),
                t.handle, k, n === nothing ? C_NULL : n))
end

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
