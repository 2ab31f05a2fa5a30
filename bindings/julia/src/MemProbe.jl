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
       MemprobeError, read_sample, read_used, peak, peaks, measure, reset!, report,
       report_n_reset, format_report, data, data_mb, b2mb, withtrace, start!, stop!,
       isrunning, begin_phase, end_phase, next_phase, end_into, end_tail, resume_phase, mark_tail, phase, monitor_set_interval,
       monitor_stats, monitor_stop, GPUMemory, GpuDevice, gpu_mem_get, gpu_mem_get_all,
       gpu_mem_get_free, gpu_mem_get_free_no_cache, gpu_mem_get_used,
       gpu_mem_get_used_no_cache, gpu_mem_get_used_fast, gpu_with_max_free_mem,
       preload_pytorch, gpu_source, gpu_exact_source, Exporter, set_oom_report!,
       clear_oom_report!, report_oom!, oom_status, rearm_oom_report!, OomCache,
       gpu_origins_live, gpu_origins_at_peak, gpu_origins_at_oom, GPU_ORIGINS_HOST_PINNED, GPU_ORIGINS_NO_OOM

# One file per concept, included in this order (later files use earlier ones).
# tests/tests/bindings_cover_header.rs reads them in the same order.
include("loading.jl")
include("errors.jl")
include("library.jl")
include("sources.jl")
include("windows.jl")
include("traces.jl")
include("tracker.jl")
include("oom_report.jl")
include("gpu.jl")
include("origins.jl")
include("exporter.jl")

end # module
