# Part of module MemProbe (src/MemProbe.jl includes it).
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
