# Part of module MemProbe (src/MemProbe.jl includes it).
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
