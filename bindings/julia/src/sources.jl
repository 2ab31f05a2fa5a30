# Part of module MemProbe (src/MemProbe.jl includes it).
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

"Bytes in use now: the cheapest read, for a hot loop (no sample, no clock
read; it still counts towards every open window's peak)."
function read_used(s::Source)
    out = Ref{UInt64}(0)
    check(ccall(sym(:memprobe_source_read_used), UInt32, (Ptr{Cvoid}, Ref{UInt64}), s.handle, out))
    out[]
end

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
