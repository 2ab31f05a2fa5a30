package memprobe

/*
#include "memprobe.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Go functions called by the library (custom source reads, report lines)
// are found through a registry of ids passed as the C user_data. It works
// like runtime/cgo.Handle, with one difference that matters here: the
// library's monitor thread may still be inside a poll when the last Go
// object over a source is closed, and a late call with a removed id must
// answer "failed" rather than panic (cgo.Handle.Value panics on a deleted
// handle). Ids are never reused.
type registry struct {
	mu   sync.Mutex
	next uintptr
	m    map[uintptr]any
}

var callbacks = registry{m: map[uintptr]any{}}

func (r *registry) add(v any) uintptr {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.m[r.next] = v
	return r.next
}

func (r *registry) get(id uintptr) (any, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[id]
	return v, ok
}

func (r *registry) del(id uintptr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, id)
}

func (r *registry) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

//export mpgoRead
func mpgoRead(userData unsafe.Pointer, out *C.uint64_t) (rc C.int32_t) {
	v, ok := callbacks.get(uintptr(userData))
	if !ok {
		return 1
	}
	st := v.(*callbackState)
	defer func() {
		if p := recover(); p != nil {
			st.setErr(fmt.Errorf("read function panicked: %v", p))
			rc = 1
		}
	}()
	n, err := st.read()
	if err != nil {
		st.setErr(err)
		return 1
	}
	*out = C.uint64_t(n)
	return 0
}

//export mpgoLine
func mpgoLine(line *C.char, userData unsafe.Pointer) {
	v, ok := callbacks.get(uintptr(userData))
	if !ok {
		return
	}
	defer func() { _ = recover() }() // a writer must never unwind into the library
	v.(*lineSink).write(C.GoString(line))
}

//export mpgoRecord
func mpgoRecord(rec *C.memprobe_phase_record, deltas *C.memprobe_delta, n C.size_t, userData unsafe.Pointer) {
	v, ok := callbacks.get(uintptr(userData))
	if !ok {
		return
	}
	defer func() { _ = recover() }() // a sink must never unwind into the library
	v.(*recordSink).fn(recordFromC(rec, deltas, int(n)))
}

//export mpgoRelease
func mpgoRelease(userData unsafe.Pointer) (rc C.int32_t) {
	v, ok := callbacks.get(uintptr(userData))
	if !ok {
		return 1
	}
	r := v.(*releaseFunc)
	defer func() {
		if p := recover(); p != nil {
			r.tracker.addErr(fmt.Errorf("release %q panicked: %v", r.name, p))
			rc = 1
		}
	}()
	if err := r.fn(); err != nil {
		r.tracker.addErr(fmt.Errorf("release %q: %w", r.name, err))
		return 1
	}
	return 0
}

//export mpgoOOMReport
func mpgoOOMReport(json *C.char, summary *C.char, userData unsafe.Pointer) {
	v, ok := callbacks.get(uintptr(userData))
	if !ok {
		return
	}
	cb := v.(*oomCallback)
	defer func() {
		if p := recover(); p != nil {
			cb.tracker.addErr(fmt.Errorf("out-of-memory report callback panicked: %v", p))
		}
	}()
	cb.fn(C.GoString(json), C.GoString(summary))
}

//export mpgoStep
func mpgoStep(userData unsafe.Pointer) (rc C.int32_t) {
	v, ok := callbacks.get(uintptr(userData))
	if !ok {
		return 2
	}
	st := v.(*stepState)
	defer func() {
		if p := recover(); p != nil {
			st.err = fmt.Errorf("step panicked: %v", p)
			rc = 2
		}
	}()
	oom, err := st.fn()
	switch {
	case err != nil:
		st.err = err
		return 2
	case oom:
		return C.MEMPROBE_STEP_OUT_OF_MEMORY
	}
	return C.MEMPROBE_STEP_DONE
}
