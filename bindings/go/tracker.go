package memprobe

/*
#include <stdlib.h>
#include "memprobe.h"

memprobe_status mpgo_tracker_add_callback_sink(memprobe_tracker *tracker, uintptr_t id);
memprobe_status mpgo_tracker_add_release(memprobe_tracker *tracker, const char *name, uint32_t kind, uintptr_t id);
memprobe_status mpgo_tracker_run_oom_retry(memprobe_tracker *tracker, uintptr_t id, uint32_t max_retries,
                                           memprobe_oom_retry_result *out, uint64_t *freed, size_t n_freed);
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// PhaseKind is a training-loop phase (memprobe_phase_kind).
type PhaseKind uint32

// Phase kinds. Steps nest in epochs, epochs in experiences, experiences in
// streams; custom phases (named) nest anywhere.
const (
	Step       PhaseKind = C.MEMPROBE_PHASE_KIND_STEP
	Epoch      PhaseKind = C.MEMPROBE_PHASE_KIND_EPOCH
	Experience PhaseKind = C.MEMPROBE_PHASE_KIND_EXPERIENCE
	Stream     PhaseKind = C.MEMPROBE_PHASE_KIND_STREAM
	Custom     PhaseKind = C.MEMPROBE_PHASE_KIND_CUSTOM
)

func (k PhaseKind) String() string {
	switch k {
	case Step:
		return "step"
	case Epoch:
		return "epoch"
	case Experience:
		return "experience"
	case Stream:
		return "stream"
	case Custom:
		return "custom"
	}
	return fmt.Sprintf("PhaseKind(%d)", uint32(k))
}

// PhaseRecord is the record of an ended phase, with one Delta per source.
type PhaseRecord struct {
	Kind PhaseKind
	// Name is the kind's name, or the custom phase's name.
	Name string
	// Depth is the number of enclosing phases still open (0 = outermost).
	Depth uint32
	// Index counts the phases of this kind (and name) ended before it.
	Index uint64
	// StartedAt and EndedAt are CLOCK_MONOTONIC times.
	StartedAt, EndedAt, Duration time.Duration
	// Releases is the number of cache releases fired at the end of the phase.
	Releases uint32
	// LeakFlags has bit i set when source i is flagged as leaking.
	LeakFlags uint64
	// ReleasedBytes is the bytes freed by the phase's releases, summed over sources.
	ReleasedBytes uint64
	Deltas        []Delta
}

// Leaking reports whether source i is flagged as leaking.
func (r PhaseRecord) Leaking(i int) bool { return i < 64 && r.LeakFlags>>uint(i)&1 == 1 }

func recordFromC(r *C.memprobe_phase_record, deltas *C.memprobe_delta, n int) PhaseRecord {
	out := PhaseRecord{
		Kind:          PhaseKind(r.kind),
		Name:          C.GoString(&r.name[0]),
		Depth:         uint32(r.depth),
		Index:         uint64(r.index),
		StartedAt:     time.Duration(r.started_at_ns),
		EndedAt:       time.Duration(r.ended_at_ns),
		Duration:      time.Duration(r.duration_ns),
		Releases:      uint32(r.n_releases),
		LeakFlags:     uint64(r.leak_flags),
		ReleasedBytes: uint64(r.released_bytes),
	}
	if deltas != nil && n > 0 {
		for _, d := range unsafe.Slice(deltas, n) {
			out.Deltas = append(out.Deltas, deltaFromC(&d))
		}
	}
	return out
}

// LeakStatus is a source's leak trend.
type LeakStatus struct {
	Flagged bool
	// Streak is the current run of growing epochs.
	Streak uint32
	// LastGrowth is the last epoch-over-epoch growth, bytes.
	LastGrowth int64
}

// OOMRetryResult is what RunOOMRetry did: the OOM retry's result (not an
// OOM report, which is SetOOMReport's).
type OOMRetryResult struct {
	Succeeded bool
	Retries   uint32
	// Freed is the bytes freed per source by the releases between attempts.
	Freed      []uint64
	FreedBytes uint64
}

// OOMReport is the old name of OOMRetryResult.
//
// Deprecated: use OOMRetryResult (an OOM report is SetOOMReport's). Removed
// in 0.3.0.
type OOMReport = OOMRetryResult

type recordSink struct{ fn func(PhaseRecord) }

type releaseFunc struct {
	name    string
	fn      func() error
	tracker *Tracker
}

type stepState struct {
	fn  func() (oom bool, err error)
	err error
}

// Tracker tracks a training loop's phases over a set of sources: one record
// per ended phase, sinks (a PeakMemMetric table, JSON Lines, CSV, a Go
// function), cache-release policies, out-of-memory retry and leak trends.
type Tracker struct {
	h       *C.memprobe_tracker
	sources []*Source
	once    sync.Once
	mu      sync.Mutex
	ids     []uintptr // registered sinks and releases
	errs    []error
}

// NewTracker creates a tracker over sources (at least one).
func NewTracker(sources ...*Source) (*Tracker, error) {
	hs, err := handles(sources)
	if err != nil {
		return nil, err
	}
	var h *C.memprobe_tracker
	err = call(func() C.memprobe_status { return C.memprobe_tracker_new(&hs[0], C.size_t(len(hs)), &h) })
	runtime.KeepAlive(sources)
	if err != nil {
		return nil, err
	}
	t := &Tracker{h: h, sources: append([]*Source(nil), sources...)}
	for _, s := range t.sources {
		s.use()
	}
	runtime.SetFinalizer(t, (*Tracker).Close)
	return t, nil
}

func (t *Tracker) do(f func(*C.memprobe_tracker) C.memprobe_status) error {
	err := call(func() C.memprobe_status { return f(t.h) })
	runtime.KeepAlive(t)
	return err
}

// Begin begins a phase; name is "" except for Custom phases.
func (t *Tracker) Begin(kind PhaseKind, name string) error {
	cname := cString(name, true)
	defer freeCString(cname)
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_begin(h, C.uint32_t(kind), cname)
	})
}

func (t *Tracker) ending(next bool, kind PhaseKind, name string) (PhaseRecord, error) {
	cname := cString(name, true)
	defer freeCString(cname)
	var rec C.memprobe_phase_record
	ds := make([]C.memprobe_delta, len(t.sources))
	err := t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		if next {
			return C.memprobe_tracker_next(h, C.uint32_t(kind), cname, &rec, &ds[0], C.size_t(len(ds)))
		}
		return C.memprobe_tracker_end(h, C.uint32_t(kind), cname, &rec, &ds[0], C.size_t(len(ds)))
	})
	if err != nil {
		return PhaseRecord{}, err
	}
	return recordFromC(&rec, &ds[0], len(ds)), nil
}

// End ends the innermost phase, which must be kind (and name).
func (t *Tracker) End(kind PhaseKind, name string) (PhaseRecord, error) {
	return t.ending(false, kind, name)
}

// Next ends the innermost phase and begins the next of the same kind at the
// same instant (the cheapest step boundary).
func (t *Tracker) Next(kind PhaseKind, name string) (PhaseRecord, error) {
	return t.ending(true, kind, name)
}

// chained is ending for EndInto and EndTail (tail: began on its own tail),
// which name the phase whose tail the window becomes.
func (t *Tracker) chained(tail bool, kind PhaseKind, name string, nextKind PhaseKind, nextName string) (PhaseRecord, error) {
	cname, cnext := cString(name, true), cString(nextName, true)
	defer freeCString(cname)
	defer freeCString(cnext)
	var rec C.memprobe_phase_record
	ds := make([]C.memprobe_delta, len(t.sources))
	err := t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		if tail {
			return C.memprobe_tracker_end_tail(h, C.uint32_t(kind), cname, C.uint32_t(nextKind), cnext,
				&rec, &ds[0], C.size_t(len(ds)))
		}
		return C.memprobe_tracker_end_into(h, C.uint32_t(kind), cname, C.uint32_t(nextKind), cnext,
			&rec, &ds[0], C.size_t(len(ds)))
	})
	if err != nil {
		return PhaseRecord{}, err
	}
	return recordFromC(&rec, &ds[0], len(ds)), nil
}

// EndInto ends the innermost phase, which must be kind (and name), as End
// does, and keeps its window running, restarted at this end, as the tail of
// the phase nextKind (and nextName): the next Resume of that phase begins
// at this end (one boundary per step when the end of a step cannot tell
// whether another follows).
func (t *Tracker) EndInto(kind PhaseKind, name string, nextKind PhaseKind, nextName string) (PhaseRecord, error) {
	return t.chained(false, kind, name, nextKind, nextName)
}

// EndTail ends the phase of kind (and name) that began on its own tail and
// ends now: Resume then EndInto in one call (one boundary per step for a
// loop whose hooks see only the end of each step).
func (t *Tracker) EndTail(kind PhaseKind, name string, nextKind PhaseKind, nextName string) (PhaseRecord, error) {
	return t.chained(true, kind, name, nextKind, nextName)
}

// Resume begins a phase of kind (and name) on the tail of fromKind (and
// fromName), made by EndInto or MarkTail: its interval began when the tail
// did. Without such a tail, as Begin.
func (t *Tracker) Resume(kind PhaseKind, name string, fromKind PhaseKind, fromName string) error {
	cname, cfrom := cString(name, true), cString(fromName, true)
	defer freeCString(cname)
	defer freeCString(cfrom)
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_resume(h, C.uint32_t(kind), cname, C.uint32_t(fromKind), cfrom)
	})
}

// MarkTail starts the tail of kind (and name) now: the next Resume of it
// begins here. No phase begins or ends.
func (t *Tracker) MarkTail(kind PhaseKind, name string) error {
	cname := cString(name, true)
	defer freeCString(cname)
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_mark_tail(h, C.uint32_t(kind), cname)
	})
}

// AddTableSink adds fastai's PeakMemMetric table: one row per ended phase
// of kind, each source's delta used and delta peaked in MiB, written by the
// library to file descriptor fd (e.g. int(os.Stdout.Fd())).
func (t *Tracker) AddTableSink(kind PhaseKind, fd int) error {
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_add_table_sink(h, C.uint32_t(kind), C.int32_t(fd))
	})
}

// AddJSONLSink adds a JSON Lines sink, written beside path and renamed to
// it when the sinks finish (FinishSinks or Close).
func (t *Tracker) AddJSONLSink(path string) error {
	cpath := cString(path, false)
	defer freeCString(cpath)
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_add_jsonl_sink(h, cpath)
	})
}

// AddCSVSink adds a CSV sink (one row per record and source), written like
// the JSON Lines sink.
func (t *Tracker) AddCSVSink(path string) error {
	cpath := cString(path, false)
	defer freeCString(cpath)
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_add_csv_sink(h, cpath)
	})
}

func (t *Tracker) register(v any) uintptr {
	id := callbacks.add(v)
	t.mu.Lock()
	t.ids = append(t.ids, id)
	t.mu.Unlock()
	return id
}

// AddCallbackSink calls fn with each record, on the goroutine that ended
// the phase. fn must not call this tracker.
func (t *Tracker) AddCallbackSink(fn func(PhaseRecord)) error {
	id := t.register(&recordSink{fn: fn})
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.mpgo_tracker_add_callback_sink(h, C.uintptr_t(id))
	})
}

// FinishSinks finishes every sink now (files renamed into place) and
// detaches them.
func (t *Tracker) FinishSinks() error {
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status { return C.memprobe_tracker_finish_sinks(h) })
}

// ReleaseKind says when a release callback runs.
type ReleaseKind uint32

// Release kinds.
const (
	// ReleaseCache empties a framework cache; it runs at every release.
	ReleaseCache ReleaseKind = C.MEMPROBE_RELEASE_CACHE
	// ReleaseGC runs a garbage collector; only when a policy asks for GC
	// and on out-of-memory recovery.
	ReleaseGC ReleaseKind = C.MEMPROBE_RELEASE_GC
)

// AddRelease registers a release callback named name. An error (or panic)
// fails that release; it is kept in Errors and the others still run.
func (t *Tracker) AddRelease(name string, kind ReleaseKind, fn func() error) error {
	id := t.register(&releaseFunc{name: name, fn: fn, tracker: t})
	cname := cString(name, false)
	defer freeCString(cname)
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.mpgo_tracker_add_release(h, cname, C.uint32_t(kind), C.uintptr_t(id))
	})
}

// AddGoGC registers runtime.GC as the garbage-collector release.
func (t *Tracker) AddGoGC() error {
	return t.AddRelease("runtime.GC", ReleaseGC, func() error { runtime.GC(); return nil })
}

func (t *Tracker) addErr(err error) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.errs = append(t.errs, err)
	t.mu.Unlock()
}

// Errors returns the errors of release callbacks so far.
func (t *Tracker) Errors() []error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]error(nil), t.errs...)
}

// ReleaseEvery runs the release callbacks at the end of every n-th step or
// epoch, like ClearCacheHook (gc: the GC ones too).
func (t *Tracker) ReleaseEvery(kind PhaseKind, n uint64, gc bool) error {
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_release_every(h, C.uint32_t(kind), C.uint64_t(n), C.bool(gc))
	})
}

// ReleaseBelowFree runs the release callbacks at the end of any step or
// epoch where source's free bytes are below bytes.
func (t *Tracker) ReleaseBelowFree(source int, bytes uint64, gc bool) error {
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_release_below_free(h, C.size_t(source), C.uint64_t(bytes), C.bool(gc))
	})
}

// ReleaseNow runs the release callbacks now and returns the bytes freed per
// source.
func (t *Tracker) ReleaseNow(gc bool) ([]uint64, error) {
	freed := make([]C.uint64_t, len(t.sources))
	err := t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_release_now(h, C.bool(gc), &freed[0], C.size_t(len(freed)))
	})
	out := make([]uint64, len(freed))
	for i, f := range freed {
		out[i] = uint64(f)
	}
	return out, err
}

// ReleasesFired is the number of releases fired so far.
func (t *Tracker) ReleasesFired() (uint64, error) {
	var n C.uint64_t
	err := t.do(func(h *C.memprobe_tracker) C.memprobe_status { return C.memprobe_tracker_releases_fired(h, &n) })
	return uint64(n), err
}

// SetLeakPolicy flags a source whose end-of-epoch used grows by more than
// threshold bytes for epochs epochs in a row (0 turns it off).
func (t *Tracker) SetLeakPolicy(threshold uint64, epochs uint32) error {
	return t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_set_leak_policy(h, C.uint64_t(threshold), C.uint32_t(epochs))
	})
}

// LeakStatus returns source i's leak trend.
func (t *Tracker) LeakStatus(i int) (LeakStatus, error) {
	var flagged C.bool
	var streak C.uint32_t
	var growth C.int64_t
	err := t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.memprobe_tracker_leak_status(h, C.size_t(i), &flagged, &streak, &growth)
	})
	return LeakStatus{Flagged: bool(flagged), Streak: uint32(streak), LastGrowth: int64(growth)}, err
}

// RunOOMRetry is fastai's gpu_mem_restore as a loop: it runs step; when
// step reports oom, it runs every release callback (GC included) and
// retries, at most maxRetries times. An error from step stops it and is
// returned. When the last try still ran out of memory the result (Succeeded
// false) comes with ErrOutOfMemory. step must not call this tracker.
func (t *Tracker) RunOOMRetry(step func() (oom bool, err error), maxRetries uint32) (OOMRetryResult, error) {
	st := &stepState{fn: step}
	id := callbacks.add(st)
	defer callbacks.del(id)
	var rep C.memprobe_oom_retry_result
	freed := make([]C.uint64_t, len(t.sources))
	err := t.do(func(h *C.memprobe_tracker) C.memprobe_status {
		return C.mpgo_tracker_run_oom_retry(h, C.uintptr_t(id), C.uint32_t(maxRetries), &rep, &freed[0], C.size_t(len(freed)))
	})
	if st.err != nil {
		return OOMRetryResult{}, st.err
	}
	out := OOMRetryResult{Succeeded: bool(rep.succeeded), Retries: uint32(rep.retries), FreedBytes: uint64(rep.freed_bytes)}
	for _, f := range freed {
		out.Freed = append(out.Freed, uint64(f))
	}
	return out, err
}

// Close finishes the sinks and frees the tracker; later calls return
// ErrInvalidHandle. Closing twice is a no-op.
func (t *Tracker) Close() error {
	var err error
	t.once.Do(func() {
		runtime.SetFinalizer(t, nil)
		err = call(func() C.memprobe_status { return C.memprobe_tracker_free(t.h) })
		t.mu.Lock()
		ids := t.ids
		t.ids = nil
		t.mu.Unlock()
		for _, id := range ids {
			callbacks.del(id)
		}
		for _, s := range t.sources {
			s.unuse()
		}
	})
	return err
}
