package memprobe

/*
#include <stdlib.h>
#include "memprobe.h"

memprobe_status mpgo_mark_group_new(uintptr_t id, memprobe_mark_group **out);
memprobe_status mpgo_mark_group_new_many(uintptr_t id, memprobe_mark_group **out);
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Marks is a framework's (or your own) resettable high-water marks, read
// and reset by a MarkGroup: Current and Peak return the bytes in use and
// the high-water mark since the last Reset of mark index (your own
// numbering, e.g. device*2 + allocated/reserved); Reset resets every mark
// of the group at once.
//
// The methods are called one at a time per group, on the goroutine that
// reads a source or opens, resets or closes a window (trace, tracker phase)
// over one of the group's sources, or on an exporter's thread when a scrape
// reads such a source (never by the library's monitor thread: mark sources
// are exact, never polled). An error (or a panic) fails the memprobe call that
// needed it with ErrUnavailable and leaves every window's peak intact. A
// method must not call memprobe on the group's sources, or windows,
// traces and trackers over them: such a call fails with ErrWrongOrder.
type Marks interface {
	Current(index int) (uint64, error)
	Peak(index int) (uint64, error)
	Reset() error
}

// MarkValue says which value of its marks MarksMany.ReadMany reads
// (memprobe_mark_value).
type MarkValue uint32

const (
	// MarkCurrent is the bytes in use now.
	MarkCurrent MarkValue = C.MEMPROBE_MARK_VALUE_CURRENT
	// MarkPeak is the high-water mark since the group's last Reset.
	MarkPeak MarkValue = C.MEMPROBE_MARK_VALUE_PEAK
)

// MarksMany is implemented by Marks that read every mark from one snapshot
// (PyTorch's statistics: one read gives every mark of a device). ReadMany
// stores value what of mark indices[i] in out[i] (len(out) ==
// len(indices)). NewMarkGroup then uses memprobe_mark_group_new_many: a
// window boundary over any number of the group's sources calls ReadMany
// twice and Reset once, instead of Current and Peak once per source.
type MarksMany interface {
	Marks
	ReadMany(what MarkValue, indices []int, out []uint64) error
}

// markState is the Go side of a group, reachable from C through its
// registry id. It stays registered until the group and every source over
// it are released (refs counts them).
type markState struct {
	marks Marks
	errs  callbackState // the last Go error, attached to Source.Read's error
	mu    sync.Mutex
	refs  int
	id    uintptr
}

func (m *markState) ref() {
	m.mu.Lock()
	m.refs++
	m.mu.Unlock()
}

func (m *markState) unref() {
	m.mu.Lock()
	m.refs--
	last := m.refs == 0
	m.mu.Unlock()
	if last {
		callbacks.del(m.id)
	}
}

// MarkGroup is a group of exact sources over marks that share one reset
// (memprobe_mark_group): before the reset that any member's window
// boundary makes, the group keeps every other member's peak, so windows
// over different members never lose each other's peaks. Make one source
// per mark with Source; release the group with Close (its sources keep it
// alive).
type MarkGroup struct {
	h     *C.memprobe_mark_group
	st    *markState
	mu    sync.Mutex
	freed bool
}

// NewMarkGroup is a group over m (read several marks at once when m is
// also a MarksMany).
func NewMarkGroup(m Marks) (*MarkGroup, error) {
	if m == nil {
		return nil, &Error{Status: StatusNullPointer, Message: "NewMarkGroup: marks is nil"}
	}
	st := &markState{marks: m, refs: 1}
	st.id = callbacks.add(st)
	var h *C.memprobe_mark_group
	_, many := m.(MarksMany)
	if err := call(func() C.memprobe_status {
		if many {
			return C.mpgo_mark_group_new_many(C.uintptr_t(st.id), &h)
		}
		return C.mpgo_mark_group_new(C.uintptr_t(st.id), &h)
	}); err != nil {
		callbacks.del(st.id)
		return nil, err
	}
	g := &MarkGroup{h: h, st: st}
	runtime.SetFinalizer(g, (*MarkGroup).Close)
	return g, nil
}

// Source is an exact source over mark index of the group (kind custom,
// fidelity exact), named name (1 to 64 printable bytes). One source per
// index at a time (ErrInvalidArgument until the previous one is closed
// along with every window over it); ErrInvalidHandle after Close.
func (g *MarkGroup) Source(index int, name string) (*Source, error) {
	if index < 0 {
		return nil, &Error{Status: StatusInvalidArgument, Message: fmt.Sprintf("mark index %d is negative", index)}
	}
	cname := cString(name, false)
	defer freeCString(cname)
	g.st.ref()
	s, err := newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_mark(g.h, C.size_t(index), cname, out)
	})
	runtime.KeepAlive(g)
	if err != nil {
		g.st.unref()
		return nil, err
	}
	s.cb = &g.st.errs
	s.onRelease = g.st.unref
	return s, nil
}

// Close releases the group. Sources made over it keep it (and m) until
// they and every window, trace or tracker over them are closed. Closing
// twice is a no-op.
func (g *MarkGroup) Close() error {
	g.mu.Lock()
	if g.freed {
		g.mu.Unlock()
		return nil
	}
	g.freed = true
	g.mu.Unlock()
	runtime.SetFinalizer(g, nil)
	err := call(func() C.memprobe_status { return C.memprobe_mark_group_free(g.h) })
	g.st.unref()
	return err
}

func markCall(userData unsafe.Pointer, what string, f func(*markState) error) (rc C.int32_t) {
	v, ok := callbacks.get(uintptr(userData))
	if !ok {
		return 1
	}
	st := v.(*markState)
	defer func() {
		if p := recover(); p != nil {
			st.errs.setErr(fmt.Errorf("marks %s panicked: %v", what, p))
			rc = 1
		}
	}()
	if err := f(st); err != nil {
		st.errs.setErr(err)
		return 1
	}
	return 0
}

//export mpgoMarkCurrent
func mpgoMarkCurrent(userData unsafe.Pointer, index C.size_t, out *C.uint64_t) C.int32_t {
	return markCall(userData, "Current", func(st *markState) error {
		n, err := st.marks.Current(int(index))
		*out = C.uint64_t(n)
		return err
	})
}

//export mpgoMarkPeak
func mpgoMarkPeak(userData unsafe.Pointer, index C.size_t, out *C.uint64_t) C.int32_t {
	return markCall(userData, "Peak", func(st *markState) error {
		n, err := st.marks.Peak(int(index))
		*out = C.uint64_t(n)
		return err
	})
}

//export mpgoMarkReset
func mpgoMarkReset(userData unsafe.Pointer) C.int32_t {
	return markCall(userData, "Reset", func(st *markState) error { return st.marks.Reset() })
}

//export mpgoMarkReadMany
func mpgoMarkReadMany(userData unsafe.Pointer, what C.uint32_t, indices *C.size_t, count C.size_t, out *C.uint64_t) C.int32_t {
	return markCall(userData, "ReadMany", func(st *markState) error {
		mm, ok := st.marks.(MarksMany)
		if !ok {
			return fmt.Errorf("marks %T has no ReadMany", st.marks)
		}
		n := int(count)
		cidx := unsafe.Slice(indices, n)
		cout := unsafe.Slice(out, n)
		idx := make([]int, n)
		for i, v := range cidx {
			idx[i] = int(v)
		}
		vals := make([]uint64, n)
		if err := mm.ReadMany(MarkValue(what), idx, vals); err != nil {
			return err
		}
		for i, v := range vals {
			cout[i] = C.uint64_t(v)
		}
		return nil
	})
}
