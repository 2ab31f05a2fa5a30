# Part of module MemProbe (src/MemProbe.jl includes it).
# ---------------------------------------------------------------------------
# Library-wide functions

"The library's version, e.g. \"0.1.0\"."
version() = unsafe_string(ccall(sym(:memprobe_version), Cstring, ()))
"The library's SONAME, e.g. \"libmemprobe.so.0.1\"."
soname() = unsafe_string(ccall(sym(:memprobe_soname), Cstring, ()))
"fastai's b2mb: bytes to MiB, rounded toward zero (negative deltas too, like fastai's int(n / 2^20))."
b2mb(n::Integer) = n >= 0 ? Int(ccall(sym(:memprobe_b2mb), UInt64, (UInt64,), n)) :
                   Int(ccall(sym(:memprobe_b2mb_signed), Int64, (Int64,), n))

"Live handles: (sources, windows, traces, trackers)."
function live_handles()
    s, w, t, k = Ref{UInt64}(0), Ref{UInt64}(0), Ref{UInt64}(0), Ref{UInt64}(0)
    check(ccall(sym(:memprobe_debug_live_handles), UInt32,
                (Ref{UInt64}, Ref{UInt64}, Ref{UInt64}, Ref{UInt64}), s, w, t, k))
    (s[], w[], t[], k[])
end

# ---------------------------------------------------------------------------
# Monitor

struct MonitorStats  # layout: memprobe_monitor_stats
    running::Bool
    watched::UInt64
    ticks::UInt64
    reads::UInt64
    errors::UInt64
    interval_ns::UInt64
end

"Sets how often sampled sources are polled, seconds (default 0.01)."
monitor_set_interval(seconds::Real) =
    check(ccall(sym(:memprobe_monitor_set_interval_ns), UInt32, (UInt64,), round(UInt64, seconds * 1e9)))

function monitor_stats()
    out = Ref{MonitorStats}()
    check(ccall(sym(:memprobe_monitor_get_stats), UInt32, (Ref{MonitorStats},), out))
    out[]
end

monitor_stop() = check(ccall(sym(:memprobe_monitor_stop), UInt32, ()))
