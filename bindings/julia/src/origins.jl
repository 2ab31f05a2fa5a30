# Who holds this process's GPU memory: the origins the driver-API interposer
# names for every allocation it counts (the first library outside the CUDA
# driver and runtime), now and at each device's peak.

const GPU_ORIGINS_HOST_PINNED = -1

struct CGpuOrigin  # layout: memprobe_gpu_origin
    id::UInt32
    has_symbol::UInt32
    bytes::UInt64
    address::UInt64
    offset::UInt64
    library::NTuple{200,UInt8}
    symbol::NTuple{104,UInt8}
    is_program::UInt32
end

origin_tuple(o::CGpuOrigin) = (id=Int(o.id), library=cstr(o.library),
    symbol=o.has_symbol != 0 ? cstr(o.symbol) : nothing, bytes=o.bytes,
    address=o.address, offset=o.offset, program=o.is_program != 0)

function read_origins(f)
    while true
        n = Ref{Csize_t}(0)
        st = f(C_NULL, 0, n)
        st == OK || st == BUFFER_TOO_SMALL || check(st)
        n[] == 0 && return NamedTuple[]
        buf = Vector{CGpuOrigin}(undef, n[])
        got = Ref{Csize_t}(0)
        st = f(buf, length(buf), got)
        st == BUFFER_TOO_SMALL && got[] > length(buf) && continue  # one appeared meanwhile
        check(st)
        return [origin_tuple(o) for o in buf[1:got[]]]
    end
end

"""
    gpu_origins_live(device)

The bytes this process holds now on CUDA device `device` (or
`GPU_ORIGINS_HOST_PINNED`), by origin, largest first: named tuples
`(id, library, symbol, bytes, address, offset, program)`. Throws a `MemprobeError`
(unavailable) without the interposer in the process (`memprobe run
--gpu-exact -- CMD`), (invalid id) for a device beyond 0..63.
"""
gpu_origins_live(device::Integer) = read_origins((out, cap, n) ->
    ccall(sym(:memprobe_gpu_origins_live), UInt32, (Int32, Ptr{CGpuOrigin}, Csize_t, Ref{Csize_t}),
          device, out, cap, n))

"""
    gpu_origins_at_peak(device)

The bytes by origin at device `device`'s peak so far: `(peak, at_ns,
by_origin)` (peak 0 and no origins before anything was counted). Errors as
`gpu_origins_live`.
"""
function gpu_origins_at_peak(device::Integer)
    peak, at = Ref{UInt64}(0), Ref{UInt64}(0)
    by = read_origins((out, cap, n) ->
        ccall(sym(:memprobe_gpu_origins_at_peak), UInt32,
              (Int32, Ptr{CGpuOrigin}, Csize_t, Ref{Csize_t}, Ref{UInt64}, Ref{UInt64}),
              device, out, cap, n, peak, at))
    (peak=peak[], at_ns=at[], by_origin=by)
end

const GPU_ORIGINS_NO_OOM = -2

"""
    gpu_origins_at_oom()

What this process held by origin on the device of the last allocation that
failed with out-of-memory, copied by the interposer inside that allocation:
`(device, held, at_ns, by_origin)`, or `nothing` before any failure
(`device` is `GPU_ORIGINS_HOST_PINNED` for pinned host memory). Errors as
`gpu_origins_live`.
"""
function gpu_origins_at_oom()
    device, held, at = Ref{Int32}(0), Ref{UInt64}(0), Ref{UInt64}(0)
    by = read_origins((out, cap, n) ->
        ccall(sym(:memprobe_gpu_origins_at_oom), UInt32,
              (Ptr{CGpuOrigin}, Csize_t, Ref{Csize_t}, Ref{Int32}, Ref{UInt64}, Ref{UInt64}),
              out, cap, n, device, held, at))
    device[] == GPU_ORIGINS_NO_OOM && return nothing
    (device=Int(device[]), held=held[], at_ns=at[], by_origin=by)
end
