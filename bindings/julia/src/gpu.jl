# Part of module MemProbe (src/MemProbe.jl includes it).
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
