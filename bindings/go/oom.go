package memprobe

/*
#include <stdlib.h>
#include "memprobe.h"

memprobe_status mpgo_tracker_set_oom_report(memprobe_tracker *tracker, memprobe_oom_report_options *o, uintptr_t id);
*/
import "C"

import (
	"unsafe"
)

// Out-of-memory report triggers (OOMReportOptions.Triggers).
const (
	// OOMTriggerDriver: memprobe's interposer (libmemprobe_interpose.so,
	// which must be loaded) sees the GPU driver fail a counted allocation
	// with CUDA_ERROR_OUT_OF_MEMORY; the report is written on the failing
	// thread before the error returns to the program.
	OOMTriggerDriver uint32 = C.MEMPROBE_OOM_TRIGGER_DRIVER
	// OOMTriggerCaller: the program reports it (ReportOOM, ReportOOMEvent).
	OOMTriggerCaller uint32 = C.MEMPROBE_OOM_TRIGGER_CALLER
	// OOMDeviceUnknown is the device of a failure whose device is not known.
	OOMDeviceUnknown int32 = C.MEMPROBE_OOM_DEVICE_UNKNOWN
)

// Which figures of an OOMCache hold a value (OOMCache.Valid).
const (
	OOMCacheReserved   uint32 = C.MEMPROBE_OOM_CACHE_RESERVED
	OOMCacheAllocated  uint32 = C.MEMPROBE_OOM_CACHE_ALLOCATED
	OOMCacheReleasable uint32 = C.MEMPROBE_OOM_CACHE_RELEASABLE
)

// OOMReportOptions says how a tracker reports out-of-memory (see
// docs/oom.md). At least one trigger and one destination.
type OOMReportOptions struct {
	// Triggers is a set of OOMTrigger* bits.
	Triggers uint32
	// Path receives the JSON report, written whole or not at all ("": none).
	Path string
	// JSONFd receives the JSON report and a newline (0: none).
	JSONFd int
	// SummaryFd receives the summary for people, e.g. 2 (0: none).
	SummaryFd int
	// Callback receives each report's JSON and summary, on the thread of the
	// trigger (for the driver's, inside the failing allocation: it must not
	// call CUDA nor this tracker). A panic is recovered and kept in Errors.
	Callback func(json, summary string)
	// KeepEnded is how many ended phases the report keeps (0: 8).
	KeepEnded uint32
}

// OOMCache is a framework's cache on one device (e.g. PyTorch's caching
// allocator), given with ReportOOMEvent.
type OOMCache struct {
	Device uint32
	// Valid is a set of OOMCache* bits: which figures below hold a value.
	Valid           uint32
	ReservedBytes   uint64
	AllocatedBytes  uint64
	ReleasableBytes uint64
}

// OOMEvent is an out-of-memory failure with everything the reporter knows.
type OOMEvent struct {
	// Device is the CUDA ordinal, or OOMDeviceUnknown.
	Device int32
	// RequestedBytes is the size asked for (0: not known).
	RequestedBytes uint64
	// ReportedBy names the framework ("": "caller").
	ReportedBy string
	// Detail is the caller's detail, e.g. an exception's message.
	Detail string
	// DeviceTotalBytes and DeviceFreeBytes are the device's figures as the
	// reporter saw them, when HasDeviceFigures.
	HasDeviceFigures bool
	DeviceTotalBytes uint64
	DeviceFreeBytes  uint64
	// Caches per device.
	Caches []OOMCache
	// LiveBlocksJSON is what the framework had live at the failure: one
	// torch attribution record of kind "oom" (memprobe.torch_attribution/1)
	// as JSON ("": none). The report embeds it as live_blocks; a record
	// that is not valid JSON, has another schema or is over 256 KiB is left
	// out, with live_blocks_error saying why, and the report is written.
	LiveBlocksJSON string
}

// OOMStatus says where a tracker's out-of-memory report stands.
type OOMStatus struct {
	// Armed: the next trigger writes a report.
	Armed bool
	// Triggers: the configured OOMTrigger* bits.
	Triggers uint32
	// ReportsWritten: one per arming.
	ReportsWritten uint64
	// TriggersSeen: written or not.
	TriggersSeen uint64
	// LaterTriggers: since the last report, counted and not written.
	LaterTriggers uint64
	// LastWriteStatus: StatusOK, or the status of the last report's failed write.
	LastWriteStatus Status
}

type oomCallback struct {
	fn      func(json, summary string)
	tracker *Tracker
}

// SetOOMReport configures the tracker's out-of-memory report: when an
// allocation fails for lack of GPU memory, ONE report — the failed
// allocation, the open phases with each source's peak so far, the last
// ended phases, each GPU's per-process use, what releasing caches would
// free — as JSON and a summary, to the destinations chosen. The first
// trigger writes; later ones are counted (OOMStatus). ErrWrongOrder when
// one is configured already (ClearOOMReport first); ErrUnavailable for
// OOMTriggerDriver without the interposer loaded.
func (t *Tracker) SetOOMReport(o OOMReportOptions) error {
	var c C.memprobe_oom_report_options
	c.struct_size = C.uint32_t(unsafe.Sizeof(c))
	c.triggers = C.uint32_t(o.Triggers)
	c.path = cString(o.Path, true)
	defer freeCString(c.path)
	c.json_fd = C.int32_t(o.JSONFd)
	c.summary_fd = C.int32_t(o.SummaryFd)
	c.keep_ended = C.uint32_t(o.KeepEnded)
	var id uintptr
	if o.Callback != nil {
		id = t.register(&oomCallback{fn: o.Callback, tracker: t})
	}
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.mpgo_tracker_set_oom_report(h, &c, C.uintptr_t(id))
	})
}

// ClearOOMReport removes the out-of-memory report (a no-op when none is
// configured); triggers counted since its last report are settled into its
// file.
func (t *Tracker) ClearOOMReport() error {
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_set_oom_report(h, nil)
	})
}

// ReportOOM reports an allocation that failed for lack of memory (e.g. a
// trainer catching a framework's out-of-memory error): on device
// (OOMDeviceUnknown when not known), asking requestedBytes (0: not known),
// with detail ("": none). The first report after configuration (or
// re-arming) is written; later ones are counted. ErrWrongOrder when no
// report is configured for OOMTriggerCaller.
func (t *Tracker) ReportOOM(device int32, requestedBytes uint64, detail string) error {
	cdetail := cString(detail, true)
	defer freeCString(cdetail)
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_report_oom(h, C.int32_t(device), C.uint64_t(requestedBytes), cdetail)
	})
}

// ReportOOMEvent is ReportOOM with everything the reporter knows.
func (t *Tracker) ReportOOMEvent(e OOMEvent) error {
	var c C.memprobe_oom_report_event
	c.struct_size = C.uint32_t(unsafe.Sizeof(c))
	c.device = C.int32_t(e.Device)
	c.requested_bytes = C.uint64_t(e.RequestedBytes)
	c.reported_by = cString(e.ReportedBy, true)
	defer freeCString(c.reported_by)
	c.detail = cString(e.Detail, true)
	defer freeCString(c.detail)
	c.live_blocks_json = cString(e.LiveBlocksJSON, true)
	defer freeCString(c.live_blocks_json)
	if e.HasDeviceFigures {
		c.valid = C.MEMPROBE_OOM_EVENT_DEVICE_TOTAL | C.MEMPROBE_OOM_EVENT_DEVICE_FREE
		c.device_total_bytes = C.uint64_t(e.DeviceTotalBytes)
		c.device_free_bytes = C.uint64_t(e.DeviceFreeBytes)
	}
	var caches *C.memprobe_oom_report_cache
	if len(e.Caches) > 0 {
		// C memory: the struct holding the pointer goes to C.
		size := C.size_t(len(e.Caches)) * C.size_t(unsafe.Sizeof(C.memprobe_oom_report_cache{}))
		caches = (*C.memprobe_oom_report_cache)(C.malloc(size))
		defer C.free(unsafe.Pointer(caches))
		arr := unsafe.Slice(caches, len(e.Caches))
		for i, k := range e.Caches {
			arr[i] = C.memprobe_oom_report_cache{
				device:           C.uint32_t(k.Device),
				valid:            C.uint32_t(k.Valid),
				reserved_bytes:   C.uint64_t(k.ReservedBytes),
				allocated_bytes:  C.uint64_t(k.AllocatedBytes),
				releasable_bytes: C.uint64_t(k.ReleasableBytes),
			}
		}
	}
	c.caches = caches
	c.n_caches = C.uint32_t(len(e.Caches))
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_report_oom_event(h, &c)
	})
}

// OOMStatus says where the out-of-memory report stands; ErrWrongOrder
// when none is configured.
func (t *Tracker) OOMStatus() (OOMStatus, error) {
	var st C.memprobe_oom_report_status
	err := t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_oom_status(h, &st)
	})
	return OOMStatus{
		Armed:           bool(st.armed),
		Triggers:        uint32(st.triggers),
		ReportsWritten:  uint64(st.reports_written),
		TriggersSeen:    uint64(st.triggers_seen),
		LaterTriggers:   uint64(st.later_triggers),
		LastWriteStatus: Status(st.last_write_status),
	}, err
}

// RearmOOMReport arms the out-of-memory report again: the next trigger
// writes a new report (replacing the file).
func (t *Tracker) RearmOOMReport() error {
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_rearm_oom_report(h)
	})
}
