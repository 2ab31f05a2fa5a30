# Part of module MemProbe (src/MemProbe.jl includes it).
# ---------------------------------------------------------------------------
# The Prometheus exporter (docs/metrics.md)

"""
    Exporter(listen=nothing; web_config=nothing)

Serves `GET /metrics` in the Prometheus text format on `listen`
(`"IP:PORT"`; `nothing`: 127.0.0.1 on a free port): `add_source!`,
`watch!(e, tracker)`, `set_rank!`, `add_gpus!`, `port(e)`, `stop!`, `close`.
With `web_config` (a path), served with TLS and passwords as that file in
Prometheus exporter-toolkit's format says (docs/metrics.md); it is re-read
when it changes, and `web_config_error(e)` says why a bad new one was
refused. A file that cannot be read or has an unknown key throws.
"""
mutable struct Exporter
    handle::Ptr{Cvoid}
    closed::Bool
end

function Exporter(listen=nothing; web_config=nothing)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    addr = listen === nothing ? C_NULL : listen
    if web_config === nothing
        check(ccall(sym(:memprobe_exporter_start), UInt32, (Cstring, Ref{Ptr{Cvoid}}), addr, out))
    else
        check(ccall(sym(:memprobe_exporter_start_with_web_config), UInt32,
                    (Cstring, Cstring, Ref{Ptr{Cvoid}}), addr, string(web_config), out))
    end
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
"""
    web_config_error(e::Exporter)

Why the last re-read of the exporter's web configuration was refused (a
`MemprobeError`, returned, not thrown: the last good configuration is still
served); `nothing` when the last read was good or there is none.
"""
function web_config_error(e::Exporter)
    size = 256
    while true
        buf = Vector{UInt8}(undef, size)
        st = Ref{UInt32}(0)
        needed = Ref{Csize_t}(0)
        r = ccall(sym(:memprobe_exporter_get_web_config_error), UInt32,
                  (Ptr{Cvoid}, Ref{UInt32}, Ptr{UInt8}, Csize_t, Ref{Csize_t}),
                  e.handle, st, buf, length(buf), needed)
        if r == BUFFER_TOO_SMALL && needed[] > size
            size = Int(needed[])
            continue
        end
        check(r)
        return st[] == OK ? nothing : MemprobeError(st[], unsafe_string(pointer(buf)))
    end
end

stop!(e::Exporter) = check(ccall(sym(:memprobe_exporter_stop), UInt32, (Ptr{Cvoid},), e.handle))

function Base.close(e::Exporter)
    if !e.closed
        e.closed = true
        check(ccall(sym(:memprobe_exporter_free), UInt32, (Ptr{Cvoid},), e.handle))
    end
    nothing
end
