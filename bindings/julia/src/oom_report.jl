# Part of module MemProbe (src/MemProbe.jl includes it).
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

struct COomReportCache  # layout: memprobe_oom_report_cache
    device::UInt32
    valid::UInt32
    reserved_bytes::UInt64
    allocated_bytes::UInt64
    releasable_bytes::UInt64
end

# memprobe_oom_report_event (holds pointers, as above).
struct COomReportEvent
    struct_size::UInt32
    device::Int32
    requested_bytes::UInt64
    reported_by::Ptr{UInt8}
    detail::Ptr{UInt8}
    valid::UInt32
    n_caches::UInt32
    device_total_bytes::UInt64
    device_free_bytes::UInt64
    caches::Ptr{COomReportCache}
    live_blocks_json::Ptr{UInt8}
end

struct COomReportStatus  # layout: memprobe_oom_report_status
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
                reported_by=nothing, device_total=nothing, device_free=nothing, caches=OomCache[],
                live_blocks_json=nothing)

Reports an allocation that failed for lack of memory: the first report is
written, later ones are counted. `live_blocks_json`: what the framework had
live, one torch attribution record of kind "oom" as JSON (embedded as
`live_blocks`; a refused one is left out with `live_blocks_error`).
"""
function report_oom!(t::Tracker, device::Integer=OOM_DEVICE_UNKNOWN, requested_bytes::Integer=0,
                     detail=nothing; reported_by=nothing, device_total=nothing, device_free=nothing,
                     caches=OomCache[], live_blocks_json=nothing)
    d = detail === nothing ? nothing : String(detail)
    live = live_blocks_json === nothing ? nothing : String(live_blocks_json)
    if reported_by === nothing && device_total === nothing && device_free === nothing && isempty(caches) &&
       live === nothing
        GC.@preserve d check(ccall(sym(:memprobe_tracker_report_oom), UInt32,
                                   (Ptr{Cvoid}, Int32, UInt64, Ptr{UInt8}), t.handle, device,
                                   requested_bytes, _cptr(d)))
        return nothing
    end
    by = reported_by === nothing ? nothing : String(reported_by)
    bits(c) = (c.reserved === nothing ? 0 : OOM_CACHE_RESERVED) |
              (c.allocated === nothing ? 0 : OOM_CACHE_ALLOCATED) |
              (c.releasable === nothing ? 0 : OOM_CACHE_RELEASABLE)
    cs = [COomReportCache(c.device, bits(c), something(c.reserved, 0), something(c.allocated, 0),
                    something(c.releasable, 0)) for c in caches]
    valid = (device_total === nothing ? UInt32(0) : OOM_EVENT_DEVICE_TOTAL) |
            (device_free === nothing ? UInt32(0) : OOM_EVENT_DEVICE_FREE)
    GC.@preserve d by cs live begin
        e = COomReportEvent(UInt32(sizeof(COomReportEvent)), device, requested_bytes, _cptr(by), _cptr(d), valid,
                      length(cs), something(device_total, 0), something(device_free, 0),
                      isempty(cs) ? Ptr{COomReportCache}(C_NULL) : pointer(cs), _cptr(live))
        check(ccall(sym(:memprobe_tracker_report_oom_event), UInt32, (Ptr{Cvoid}, Ref{COomReportEvent}),
                    t.handle, e))
    end
    nothing
end

"Where the out-of-memory report stands: armed, triggers, reports written, triggers seen, later ones."
function oom_status(t::Tracker)
    st = Ref{COomReportStatus}()
    check(ccall(sym(:memprobe_tracker_oom_status), UInt32, (Ptr{Cvoid}, Ref{COomReportStatus}), t.handle, st))
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
