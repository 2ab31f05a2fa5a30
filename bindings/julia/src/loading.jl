# Part of module MemProbe (src/MemProbe.jl includes it).
# ---------------------------------------------------------------------------
# Loading

const ABI = (0, 1)
const SONAME = "libmemprobe.so.$(ABI[1]).$(ABI[2])"

const FUNCTIONS = (
    :memprobe_version, :memprobe_soname, :memprobe_b2mb, :memprobe_b2mb_signed, :memprobe_debug_live_handles,
    :memprobe_last_error, :memprobe_status_name,
    :memprobe_monitor_set_interval_ns, :memprobe_monitor_get_stats, :memprobe_monitor_stop,
    :memprobe_source_new_process, :memprobe_source_new_process_tree,
    :memprobe_source_new_system_ram, :memprobe_source_new_cgroup, :memprobe_source_new_smaps,
    :memprobe_source_new_process_tree_smaps,
    :memprobe_source_new_pushed, :memprobe_source_new_callback, :memprobe_source_free,
    :memprobe_source_read, :memprobe_source_read_used, :memprobe_source_push, :memprobe_source_get_info,
    :memprobe_trace_new, :memprobe_trace_start, :memprobe_trace_stop, :memprobe_trace_reset,
    :memprobe_trace_is_running, :memprobe_trace_data, :memprobe_trace_measure,
    :memprobe_trace_report, :memprobe_trace_report_n_reset, :memprobe_trace_format,
    :memprobe_trace_set_silent, :memprobe_trace_set_output_fd,
    :memprobe_trace_set_output_callback, :memprobe_trace_free,
    :memprobe_window_open, :memprobe_window_peak, :memprobe_window_measure,
    :memprobe_window_reset, :memprobe_window_source_count, :memprobe_window_free,
    :memprobe_tracker_new, :memprobe_tracker_free, :memprobe_tracker_begin,
    :memprobe_tracker_end, :memprobe_tracker_next, :memprobe_tracker_end_into,
    :memprobe_tracker_resume, :memprobe_tracker_mark_tail, :memprobe_tracker_end_tail, :memprobe_tracker_add_table_sink,
    :memprobe_tracker_add_jsonl_sink, :memprobe_tracker_add_csv_sink,
    :memprobe_tracker_add_callback_sink, :memprobe_tracker_finish_sinks,
    :memprobe_tracker_add_release, :memprobe_tracker_release_every,
    :memprobe_tracker_release_below_free, :memprobe_tracker_release_now,
    :memprobe_tracker_releases_fired, :memprobe_tracker_set_leak_policy,
    :memprobe_tracker_leak_status, :memprobe_tracker_run_oom_retry,
    :memprobe_tracker_set_oom_report, :memprobe_tracker_report_oom,
    :memprobe_tracker_report_oom_event, :memprobe_tracker_oom_status,
    :memprobe_tracker_rearm_oom_report,
    :memprobe_source_get_last_error, :memprobe_source_new_gpu_device,
    :memprobe_source_new_gpu_process, :memprobe_source_new_gpu_exact, :memprobe_gpu_configure, :memprobe_gpu_get_backend,
    :memprobe_gpu_count, :memprobe_gpu_get_info, :memprobe_gpu_mem_get,
    :memprobe_gpu_mem_get_all, :memprobe_gpu_mem_get_free, :memprobe_gpu_mem_get_used,
    :memprobe_gpu_mem_get_free_no_cache, :memprobe_gpu_mem_get_used_no_cache,
    :memprobe_gpu_with_max_free_mem, :memprobe_gpu_get_current_device,
    :memprobe_gpu_set_current_device, :memprobe_gpu_preload, :memprobe_gpu_set_cache_release,
    :memprobe_gpu_device_open, :memprobe_gpu_mem_get_used_fast, :memprobe_gpu_device_mem_get,
    :memprobe_gpu_device_process_used, :memprobe_gpu_device_free,
    :memprobe_gpu_debug_live_devices, :memprobe_gpu_origins_live, :memprobe_gpu_origins_at_peak, :memprobe_gpu_origins_at_oom,
    :memprobe_exporter_start, :memprobe_exporter_port, :memprobe_exporter_add_source,
    :memprobe_exporter_watch_tracker, :memprobe_exporter_set_rank, :memprobe_exporter_add_gpus,
    :memprobe_exporter_stop, :memprobe_exporter_free,
    :memprobe_exporter_start_with_web_config, :memprobe_exporter_get_web_config_error,
)

const LIB = Ref{Ptr{Cvoid}}(C_NULL)
const LIBPATH = Ref{String}("")
const SYMS = Dict{Symbol,Ptr{Cvoid}}()

function candidates()
    env = get(ENV, "MEMPROBE_LIBRARY", "")
    isempty(env) || return [env]
    c = [SONAME, "libmemprobe.so"]
    for prefix in (joinpath(homedir(), ".local"), "/usr/local", "/usr", "/opt/memprobe")
        push!(c, joinpath(prefix, "lib", SONAME))
    end
    return c
end

function __init__()
    tried = String[]
    for cand in candidates()
        h = Libdl.dlopen(cand, Libdl.RTLD_NOW; throw_error=false)
        if h === nothing
            push!(tried, "$cand: cannot be loaded")
            continue
        end
        vsym = Libdl.dlsym(h, :memprobe_version; throw_error=false)
        if vsym === nothing
            push!(tried, "$cand: not libmemprobe")
            continue
        end
        v = unsafe_string(ccall(vsym, Cstring, ()))
        parts = parse.(Int, split(v, ".")[1:2])
        if (parts[1], parts[2]) != ABI
            push!(tried, "$cand: version $v, this package needs $(ABI[1]).$(ABI[2]).x")
            continue
        end
        LIB[] = h
        LIBPATH[] = Libdl.dlpath(h)
        for f in FUNCTIONS
            p = Libdl.dlsym(h, f; throw_error=false)
            SYMS[f] = p === nothing ? C_NULL : p
        end
        return
    end
    error("MemProbe: cannot load libmemprobe (ABI $(ABI[1]).$(ABI[2])). Tried:\n  " *
          join(tried, "\n  ") * "\nSet ENV[\"MEMPROBE_LIBRARY\"] to the library's path.")
end

@inline function sym(f::Symbol)
    p = SYMS[f]
    p == C_NULL && throw(MemprobeError(UNSUPPORTED, "$f is not in $(LIBPATH[])"))
    return p
end

"The path of the loaded libmemprobe.so."
library_path() = LIBPATH[]
