package memprobe

/*
#include "memprobe.h"
*/
import "C"

import "time"

// Bounds of the monitor's polling interval.
const (
	MinMonitorInterval = time.Duration(C.MEMPROBE_MONITOR_MIN_INTERVAL_NS)
	MaxMonitorInterval = time.Duration(C.MEMPROBE_MONITOR_MAX_INTERVAL_NS)
)

// MonitorStats are the counters of the background monitor, the thread that
// polls sampled sources while a window or trace is open over them.
type MonitorStats struct {
	// Running: the monitor thread runs in this process.
	Running bool
	// Watched: sampled sources with open windows, polled at each tick.
	Watched uint64
	// Ticks: polling rounds so far.
	Ticks uint64
	// Reads and Errors: successful and failed reads by the monitor.
	Reads, Errors uint64
	// Interval between polls.
	Interval time.Duration
}

// SetMonitorInterval sets how often sampled sources are polled (default
// 10ms), within MinMonitorInterval..MaxMonitorInterval.
func SetMonitorInterval(d time.Duration) error {
	if d < 0 {
		return &Error{Status: StatusInvalidArgument, Message: "negative monitor interval"}
	}
	return call(func() C.memprobe_status { return C.memprobe_monitor_set_interval_ns(C.uint64_t(d)) })
}

// GetMonitorStats reads the monitor's counters.
func GetMonitorStats() (MonitorStats, error) {
	var s C.memprobe_monitor_stats
	err := call(func() C.memprobe_status { return C.memprobe_monitor_get_stats(&s) })
	return MonitorStats{
		Running:  bool(s.running),
		Watched:  uint64(s.watched),
		Ticks:    uint64(s.ticks),
		Reads:    uint64(s.reads),
		Errors:   uint64(s.errors),
		Interval: time.Duration(s.interval_ns),
	}, err
}

// StopMonitor stops the monitor thread and waits for it; it restarts when
// a window next opens over a sampled source.
func StopMonitor() error {
	return call(func() C.memprobe_status { return C.memprobe_monitor_stop() })
}
