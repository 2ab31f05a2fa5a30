# Part of module MemProbe (src/MemProbe.jl includes it).
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
