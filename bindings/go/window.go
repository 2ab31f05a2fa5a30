package memprobe

/*
#include "memprobe.h"
*/
import "C"

import (
	"runtime"
	"sync"
)

// Delta is what one source did over an interval (a window, a trace), in bytes.
type Delta struct {
	// UsedStart is used when the interval (last) started.
	UsedStart uint64
	// UsedEnd is used at the end, or now for an interval still open.
	UsedEnd uint64
	// Peak is the highest used over the interval (Avalanche's MaxRAM).
	Peak uint64
	// DeltaUsed is UsedEnd - UsedStart (negative when memory was released).
	DeltaUsed int64
	// DeltaPeaked is fastai's delta peaked: max(0, Peak - UsedStart), minus
	// DeltaUsed when DeltaUsed > 0 (the blip above the net growth).
	DeltaPeaked uint64
	Kind        SourceKind
	// Fidelity is how exact Peak is.
	Fidelity Fidelity
}

func deltaFromC(d *C.memprobe_delta) Delta {
	return Delta{
		UsedStart:   uint64(d.used_start),
		UsedEnd:     uint64(d.used_end),
		Peak:        uint64(d.peak),
		DeltaUsed:   int64(d.delta_used),
		DeltaPeaked: uint64(d.delta_peaked),
		Kind:        SourceKind(d.kind),
		Fidelity:    Fidelity(d.fidelity),
	}
}

// Window is an open peak window over one or more sources. Windows are
// concurrent, nestable and independent: opening, resetting or closing one
// never changes another's peak. For exact sources no spike is missed.
type Window struct {
	h       *C.memprobe_window
	sources []*Source
	once    sync.Once
}

// OpenWindow opens a peak window over sources (at least one).
func OpenWindow(sources ...*Source) (*Window, error) {
	hs, err := handles(sources)
	if err != nil {
		return nil, err
	}
	var h *C.memprobe_window
	err = call(func() C.memprobe_status {
		return C.memprobe_window_open(&hs[0], C.size_t(len(hs)), &h)
	})
	runtime.KeepAlive(sources)
	if err != nil {
		return nil, err
	}
	w := &Window{h: h, sources: append([]*Source(nil), sources...)}
	for _, s := range w.sources {
		s.use()
	}
	runtime.SetFinalizer(w, (*Window).Close)
	return w, nil
}

// Sources returns the window's sources, in order.
func (w *Window) Sources() []*Source { return append([]*Source(nil), w.sources...) }

// Len is the number of sources.
func (w *Window) Len() int { return len(w.sources) }

// Peak is the peak of source i since the window (last) started, bytes.
func (w *Window) Peak(i int) (uint64, error) {
	var out C.uint64_t
	err := call(func() C.memprobe_status { return C.memprobe_window_peak(w.h, C.size_t(i), &out) })
	runtime.KeepAlive(w)
	return uint64(out), err
}

// Peaks returns the peak of every source, in order.
func (w *Window) Peaks() ([]uint64, error) {
	out := make([]uint64, len(w.sources))
	for i := range out {
		p, err := w.Peak(i)
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// Measure returns start, now, peak and fastai's deltas of source i,
// without ending the interval.
func (w *Window) Measure(i int) (Delta, error) {
	var d C.memprobe_delta
	err := call(func() C.memprobe_status { return C.memprobe_window_measure(w.h, C.size_t(i), &d) })
	runtime.KeepAlive(w)
	if err != nil {
		return Delta{}, err
	}
	return deltaFromC(&d), nil
}

// Reset ends the interval and starts the next at the same instant (one
// reading serves as both); it returns the ended interval of every source.
// This is the cheapest step boundary.
func (w *Window) Reset() ([]Delta, error) {
	ds := make([]C.memprobe_delta, len(w.sources))
	err := call(func() C.memprobe_status {
		return C.memprobe_window_reset(w.h, &ds[0], C.size_t(len(ds)))
	})
	runtime.KeepAlive(w)
	if err != nil {
		return nil, err
	}
	out := make([]Delta, len(ds))
	for i := range ds {
		out[i] = deltaFromC(&ds[i])
	}
	return out, nil
}

// SourceCount asks the library how many sources the window has.
func (w *Window) SourceCount() (int, error) {
	var n C.size_t
	err := call(func() C.memprobe_status { return C.memprobe_window_source_count(w.h, &n) })
	runtime.KeepAlive(w)
	return int(n), err
}

// Close closes the window; later calls return ErrInvalidHandle. Closing
// twice is a no-op.
func (w *Window) Close() error {
	var err error
	w.once.Do(func() {
		runtime.SetFinalizer(w, nil)
		err = call(func() C.memprobe_status { return C.memprobe_window_free(w.h) })
		for _, s := range w.sources {
			s.unuse()
		}
	})
	return err
}
