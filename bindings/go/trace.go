package memprobe

/*
#include <stdlib.h>
#include "memprobe.h"

memprobe_status mpgo_trace_set_output_callback(memprobe_trace *trace, uintptr_t id);
*/
import "C"

import (
	"io"
	"runtime"
	"sync"
	"unsafe"
)

// TraceOptions configures NewTrace. The zero value is a started trace,
// without context, printing to standard error.
type TraceOptions struct {
	// Ctx prefixes every report's context: "(<ctx>: <note>)".
	Ctx string
	// Silent makes Report print nothing (Data still works).
	Silent bool
	// Deferred creates the trace stopped; call Start.
	Deferred bool
	// Output receives each report line (with a newline); nil: standard
	// error, written by the library.
	Output io.Writer
}

// lineSink is the Go side of a trace's output callback.
type lineSink struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineSink) write(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, line+"\n")
}

// Trace is fastai's GPUMemTrace over any sources: delta used and delta
// peaked since its start, and the report line
//
//	△Used Peaked MB: <used> <peaked> (<ctx>: <note>)
//
// Scoped use:
//
//	tr, err := memprobe.NewTrace(memprobe.TraceOptions{Ctx: "eval"}, rss)
//	if err != nil { ... }
//	defer tr.End() // reports "(eval: exit)", stops and frees
type Trace struct {
	h       *C.memprobe_trace
	sources []*Source
	once    sync.Once
	mu      sync.Mutex
	sinkID  uintptr
}

// NewTrace creates a trace over sources (at least one), started unless
// opts.Deferred.
func NewTrace(opts TraceOptions, sources ...*Source) (*Trace, error) {
	hs, err := handles(sources)
	if err != nil {
		return nil, err
	}
	var flags C.uint32_t
	if opts.Silent {
		flags |= C.MEMPROBE_TRACE_SILENT
	}
	if opts.Deferred {
		flags |= C.MEMPROBE_TRACE_DEFERRED
	}
	ctx := cString(opts.Ctx, true)
	defer freeCString(ctx)
	var h *C.memprobe_trace
	err = call(func() C.memprobe_status {
		return C.memprobe_trace_new(&hs[0], C.size_t(len(hs)), ctx, flags, &h)
	})
	runtime.KeepAlive(sources)
	if err != nil {
		return nil, err
	}
	t := &Trace{h: h, sources: append([]*Source(nil), sources...)}
	for _, s := range t.sources {
		s.use()
	}
	runtime.SetFinalizer(t, (*Trace).Close)
	if opts.Output != nil {
		if err := t.SetOutput(opts.Output); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

// Run calls f inside a trace over sources that reports "(<ctx>: exit)"
// when f returns (fastai's gpu_mem_trace decorator); it returns f's error,
// else the trace's.
func Run(opts TraceOptions, f func() error, sources ...*Source) error {
	t, err := NewTrace(opts, sources...)
	if err != nil {
		return err
	}
	if opts.Deferred {
		if err := t.Start(); err != nil {
			t.Close()
			return err
		}
	}
	ferr := f()
	terr := t.End()
	if ferr != nil {
		return ferr
	}
	return terr
}

func (t *Trace) simple(f func(*C.memprobe_trace) C.memprobe_status) error {
	err := call(func() C.memprobe_status { return f(t.h) })
	runtime.KeepAlive(t)
	return err
}

// Start starts measuring (ErrWrongOrder if running).
func (t *Trace) Start() error {
	return t.simple(func(h *C.memprobe_trace) C.memprobe_status { return C.memprobe_trace_start(h) })
}

// Stop stops and freezes the data (ErrWrongOrder if not running).
func (t *Trace) Stop() error {
	return t.simple(func(h *C.memprobe_trace) C.memprobe_status { return C.memprobe_trace_stop(h) })
}

// Reset restarts the counters of a running trace (ErrWrongOrder if stopped).
func (t *Trace) Reset() error {
	return t.simple(func(h *C.memprobe_trace) C.memprobe_status { return C.memprobe_trace_reset(h) })
}

// Running reports whether the trace is measuring.
func (t *Trace) Running() (bool, error) {
	var out C.bool
	err := t.simple(func(h *C.memprobe_trace) C.memprobe_status { return C.memprobe_trace_is_running(h, &out) })
	return bool(out), err
}

// Data is fastai's data() for source i: delta used and delta peaked, bytes.
func (t *Trace) Data(i int) (deltaUsed int64, deltaPeaked uint64, err error) {
	var u C.int64_t
	var p C.uint64_t
	err = t.simple(func(h *C.memprobe_trace) C.memprobe_status {
		return C.memprobe_trace_data(h, C.size_t(i), &u, &p)
	})
	return int64(u), uint64(p), err
}

// DataMB is Data in MiB, rounded toward zero as fastai's b2mb.
func (t *Trace) DataMB(i int) (deltaUsed int64, deltaPeaked uint64, err error) {
	u, p, err := t.Data(i)
	mb := int64(B2MB(uint64(abs(u))))
	if u < 0 {
		mb = -mb
	}
	return mb, B2MB(p), err
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// Measure returns everything measured for source i.
func (t *Trace) Measure(i int) (Delta, error) {
	var d C.memprobe_delta
	err := t.simple(func(h *C.memprobe_trace) C.memprobe_status {
		return C.memprobe_trace_measure(h, C.size_t(i), &d)
	})
	if err != nil {
		return Delta{}, err
	}
	return deltaFromC(&d), nil
}

// Report prints the report line with note ("" for none), unless silent.
func (t *Trace) Report(note string) error {
	cnote := cString(note, true)
	defer freeCString(cnote)
	return t.simple(func(h *C.memprobe_trace) C.memprobe_status { return C.memprobe_trace_report(h, cnote) })
}

// ReportNReset is Report, then Reset (needs a running trace).
func (t *Trace) ReportNReset(note string) error {
	cnote := cString(note, true)
	defer freeCString(cnote)
	return t.simple(func(h *C.memprobe_trace) C.memprobe_status {
		return C.memprobe_trace_report_n_reset(h, cnote)
	})
}

// Format returns the report line for note without printing it.
func (t *Trace) Format(note string) (string, error) {
	cnote := cString(note, true)
	defer freeCString(cnote)
	size := C.size_t(256)
	for {
		buf := (*C.char)(C.malloc(size))
		var needed C.size_t
		err := t.simple(func(h *C.memprobe_trace) C.memprobe_status {
			return C.memprobe_trace_format(h, cnote, buf, size, &needed)
		})
		line := C.GoString(buf)
		C.free(unsafe.Pointer(buf))
		if e, ok := err.(*Error); ok && e.Status == StatusBufferTooSmall && needed > size {
			size = needed
			continue
		}
		return line, err
	}
}

// String is Format(""), or "<closed trace>".
func (t *Trace) String() string {
	s, err := t.Format("")
	if err != nil {
		return "<closed trace>"
	}
	return s
}

// SetSilent silences (true) or restores (false) printed reports.
func (t *Trace) SetSilent(silent bool) error {
	return t.simple(func(h *C.memprobe_trace) C.memprobe_status {
		return C.memprobe_trace_set_silent(h, C.bool(silent))
	})
}

// SetOutputFD sends printed reports to file descriptor fd (written by the
// library; it must stay open while the trace reports).
func (t *Trace) SetOutputFD(fd int) error {
	err := t.simple(func(h *C.memprobe_trace) C.memprobe_status {
		return C.memprobe_trace_set_output_fd(h, C.int32_t(fd))
	})
	if err == nil {
		t.setSink(0)
	}
	return err
}

// SetOutput sends each printed report line to w (one Write per line,
// newline included).
func (t *Trace) SetOutput(w io.Writer) error {
	id := callbacks.add(&lineSink{w: w})
	err := t.simple(func(h *C.memprobe_trace) C.memprobe_status {
		return C.mpgo_trace_set_output_callback(h, C.uintptr_t(id))
	})
	if err != nil {
		callbacks.del(id)
		return err
	}
	t.setSink(id)
	return nil
}

func (t *Trace) setSink(id uintptr) {
	t.mu.Lock()
	old := t.sinkID
	t.sinkID = id
	t.mu.Unlock()
	if old != 0 {
		callbacks.del(old)
	}
}

// End reports "exit", stops the trace if it runs and frees it: the end of
// a scoped trace (defer tr.End()), like fastai's context manager.
func (t *Trace) End() error {
	err := t.Report("exit")
	if running, rerr := t.Running(); rerr == nil && running {
		if serr := t.Stop(); err == nil {
			err = serr
		}
	}
	if cerr := t.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close frees the trace without reporting; later calls return
// ErrInvalidHandle. Closing twice is a no-op.
func (t *Trace) Close() error {
	var err error
	t.once.Do(func() {
		runtime.SetFinalizer(t, nil)
		err = call(func() C.memprobe_status { return C.memprobe_trace_free(t.h) })
		t.setSink(0)
		for _, s := range t.sources {
			s.unuse()
		}
	})
	return err
}
