package memprobe

/*
#include <stdlib.h>
#include "memprobe.h"

memprobe_status mpgo_source_new_callback(const char *name, uintptr_t id, memprobe_source **out);
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"time"
)

// SourceKind is what a source measures (memprobe_source_kind).
type SourceKind uint32

// Source kinds.
const (
	KindProcess     SourceKind = C.MEMPROBE_SOURCE_KIND_PROCESS
	KindProcessTree SourceKind = C.MEMPROBE_SOURCE_KIND_PROCESS_TREE
	KindSystemRAM   SourceKind = C.MEMPROBE_SOURCE_KIND_SYSTEM_RAM
	KindCgroup      SourceKind = C.MEMPROBE_SOURCE_KIND_CGROUP
	KindGPUDevice   SourceKind = C.MEMPROBE_SOURCE_KIND_GPU_DEVICE
	KindGPUProcess  SourceKind = C.MEMPROBE_SOURCE_KIND_GPU_PROCESS
	KindCustom      SourceKind = C.MEMPROBE_SOURCE_KIND_CUSTOM
	KindProcessPSS  SourceKind = C.MEMPROBE_SOURCE_KIND_PROCESS_PSS
	KindProcessUSS  SourceKind = C.MEMPROBE_SOURCE_KIND_PROCESS_USS
	// KindProcessTreePSS: the PSS of this process and its descendants.
	KindProcessTreePSS SourceKind = C.MEMPROBE_SOURCE_KIND_PROCESS_TREE_PSS
	// KindProcessTreeUSS: the USS of this process and its descendants.
	KindProcessTreeUSS SourceKind = C.MEMPROBE_SOURCE_KIND_PROCESS_TREE_USS
)

var kindNames = map[SourceKind]string{
	KindProcess: "process", KindProcessTree: "process tree", KindSystemRAM: "system RAM",
	KindCgroup: "cgroup", KindGPUDevice: "GPU device", KindGPUProcess: "GPU process",
	KindCustom: "custom", KindProcessPSS: "PSS", KindProcessUSS: "USS",
	KindProcessTreePSS: "process tree PSS", KindProcessTreeUSS: "process tree USS",
}

func (k SourceKind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("SourceKind(%d)", uint32(k))
}

// Fidelity is how exact a source's peaks are (memprobe_fidelity).
type Fidelity uint32

// Fidelities.
const (
	// Exact: a kernel or driver high-water mark; no spike is missed.
	Exact Fidelity = C.MEMPROBE_FIDELITY_EXACT
	// Pushed: values pushed by the caller; as exact as the pushes.
	Pushed Fidelity = C.MEMPROBE_FIDELITY_PUSHED
	// Sampled: polled by the monitor; spikes shorter than its interval can be missed.
	Sampled Fidelity = C.MEMPROBE_FIDELITY_SAMPLED
)

func (f Fidelity) String() string {
	switch f {
	case Exact:
		return "exact"
	case Pushed:
		return "pushed"
	case Sampled:
		return "sampled"
	}
	return fmt.Sprintf("Fidelity(%d)", uint32(f))
}

// Sample is one reading, in bytes. Total, Free, Limit and Reserved hold
// values only when the matching Has* field is true (a source that cannot
// supply a field leaves it absent, never a 0 pretending to be a value).
type Sample struct {
	Used                                     uint64
	Total, Free, Limit, Reserved             uint64
	HasTotal, HasFree, HasLimit, HasReserved bool
	// TakenAt is when the reading was taken (CLOCK_MONOTONIC since boot).
	TakenAt time.Duration
	// ReadTime is how long the read took.
	ReadTime time.Duration
}

func sampleFromC(s *C.memprobe_sample) Sample {
	v := uint32(s.valid)
	return Sample{
		Used:        uint64(s.used),
		Total:       uint64(s.total),
		Free:        uint64(s.free),
		Limit:       uint64(s.limit),
		Reserved:    uint64(s.reserved),
		HasTotal:    v&C.MEMPROBE_SAMPLE_TOTAL != 0,
		HasFree:     v&C.MEMPROBE_SAMPLE_FREE != 0,
		HasLimit:    v&C.MEMPROBE_SAMPLE_LIMIT != 0,
		HasReserved: v&C.MEMPROBE_SAMPLE_RESERVED != 0,
		TakenAt:     time.Duration(s.taken_at_ns),
		ReadTime:    time.Duration(s.read_ns),
	}
}

// SourceInfo describes a source.
type SourceInfo struct {
	Name     string
	Kind     SourceKind
	Fidelity Fidelity
}

// SmapsMetric picks PSS or USS for NewSmaps and NewProcessTreeSmaps.
type SmapsMetric uint32

// Smaps metrics.
const (
	PSS SmapsMetric = C.MEMPROBE_SMAPS_PSS
	USS SmapsMetric = C.MEMPROBE_SMAPS_USS
)

// callbackState is the Go side of a callback source, reachable from C
// through its registry id.
type callbackState struct {
	read func() (uint64, error)
	mu   sync.Mutex
	err  error
}

func (c *callbackState) setErr(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

func (c *callbackState) takeErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.err
	c.err = nil
	return err
}

// Source is a source of readings. Create one with NewProcess, NewPushed,
// ...; release it with Close. Windows and traces over a source keep it
// alive (and its read function registered) until they are closed too.
type Source struct {
	h *C.memprobe_source

	mu     sync.Mutex
	closed bool
	users  int // open windows and traces over this source
	cbID   uintptr
	cb     *callbackState
	// onRelease, when set, runs once the source and everything over it
	// are released (a mark source's hold on its group).
	onRelease func()
}

func newSource(f func(**C.memprobe_source) C.memprobe_status) (*Source, error) {
	var h *C.memprobe_source
	if err := call(func() C.memprobe_status { return f(&h) }); err != nil {
		return nil, err
	}
	s := &Source{h: h}
	runtime.SetFinalizer(s, (*Source).Close)
	return s, nil
}

// NewProcess is this process's RSS. Its peak is exact: the kernel's
// high-water mark, folded into every open window and reset at each boundary.
func NewProcess() (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_process(0, out)
	})
}

// NewProcessPreservingHWM is this process's RSS without ever resetting
// VmHWM (for processes where something else reads it); its peak is sampled.
func NewProcessPreservingHWM() (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_process(C.MEMPROBE_PROCESS_PRESERVE_HWM, out)
	})
}

// NewProcessTree is this process and all its descendants (sampled).
func NewProcessTree() (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_process_tree(out)
	})
}

// NewSystemRAM is the machine's RAM: used = MemTotal - MemAvailable (sampled).
func NewSystemRAM() (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_system_ram(out)
	})
}

// NewCgroup is the container's memory cgroup (v1 or v2); ErrUnavailable
// when there is none.
func NewCgroup() (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_cgroup(out)
	})
}

// NewSmaps is this process's PSS or USS from /proc/self/smaps_rollup (each
// read costs milliseconds per GiB mapped).
func NewSmaps(metric SmapsMetric) (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_smaps(C.uint32_t(metric), out)
	})
}

// NewProcessTreeSmaps is the PSS or USS of this process and all its
// descendants: the sum of each one's /proc/<pid>/smaps_rollup (sampled).
// Pages that forked workers share with their parent count once (PSS), where
// the tree's summed RSS counts them once per process. Each read walks every
// mapping of every process of the tree (milliseconds for big processes);
// processes that exit during a read are skipped. ErrPermissionDenied when a
// process of the tree belongs to another user.
func NewProcessTreeSmaps(metric SmapsMetric) (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_process_tree_smaps(C.uint32_t(metric), out)
	})
}

// NewPushed is a source whose values you push with Push (e.g. a framework
// allocator's allocated bytes). name: 1 to 64 printable bytes.
func NewPushed(name string) (*Source, error) {
	cname := cString(name, false)
	defer freeCString(cname)
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_pushed(cname, out)
	})
}

// NewCallback is a custom source read by calling read, which returns the
// bytes in use. read is called by Read and, while a window is open over the
// source, by the library's monitor thread: it must be safe for concurrent
// use and quick, and must not call methods of this source. An error (or a
// panic) fails that reading; Read returns it as the Cause of an
// ErrUnavailable *Error.
func NewCallback(name string, read func() (uint64, error)) (*Source, error) {
	if read == nil {
		return nil, &Error{Status: StatusNullPointer, Message: "NewCallback: read is nil"}
	}
	st := &callbackState{read: read}
	id := callbacks.add(st)
	cname := cString(name, false)
	defer freeCString(cname)
	s, err := newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.mpgo_source_new_callback(cname, C.uintptr_t(id), out)
	})
	if err != nil {
		callbacks.del(id)
		return nil, err
	}
	s.cbID, s.cb = id, st
	return s, nil
}

// Read takes one reading now (a pushed source returns its last value).
func (s *Source) Read() (Sample, error) {
	var out C.memprobe_sample
	err := call(func() C.memprobe_status { return C.memprobe_source_read(s.h, &out) })
	runtime.KeepAlive(s)
	if err != nil {
		return Sample{}, s.withCause(err)
	}
	return sampleFromC(&out), nil
}

// Used returns the bytes in use now: the cheapest read, for a hot loop
// (no Sample, no clock read; it still counts towards the peak of every
// open window).
func (s *Source) Used() (uint64, error) {
	var out C.uint64_t
	err := call(func() C.memprobe_status { return C.memprobe_source_read_used(s.h, &out) })
	runtime.KeepAlive(s)
	if err != nil {
		return 0, s.withCause(err)
	}
	return uint64(out), nil
}

func (s *Source) withCause(err error) error {
	if s.cb != nil {
		if cause := s.cb.takeErr(); cause != nil {
			if e, ok := err.(*Error); ok {
				e.Cause = cause
			}
		}
	}
	return err
}

// Push sets the current value of a pushed source, in bytes
// (ErrUnsupported for other sources).
func (s *Source) Push(used uint64) error {
	err := call(func() C.memprobe_status { return C.memprobe_source_push(s.h, C.uint64_t(used)) })
	runtime.KeepAlive(s)
	return err
}

// Info returns the source's name, kind and fidelity.
func (s *Source) Info() (SourceInfo, error) {
	var out C.memprobe_source_info
	err := call(func() C.memprobe_status { return C.memprobe_source_get_info(s.h, &out) })
	runtime.KeepAlive(s)
	if err != nil {
		return SourceInfo{}, err
	}
	return SourceInfo{
		Name:     C.GoString(&out.name[0]),
		Kind:     SourceKind(out.kind),
		Fidelity: Fidelity(out.fidelity),
	}, nil
}

// String is the source's name, or "<closed>".
func (s *Source) String() string {
	info, err := s.Info()
	if err != nil {
		return "<closed>"
	}
	return info.Name
}

// Close releases the source. Windows and traces opened over it keep it
// alive until they close. Calls after Close return ErrInvalidHandle (the
// library detects the freed handle). Closing twice is a no-op.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	release := s.users == 0
	s.mu.Unlock()
	runtime.SetFinalizer(s, nil)
	err := call(func() C.memprobe_status { return C.memprobe_source_free(s.h) })
	if release {
		s.unregister()
	}
	return err
}

// use and unuse count the windows and traces over a source, so that a
// callback source's read function stays registered while any is open.
func (s *Source) use() {
	s.mu.Lock()
	s.users++
	s.mu.Unlock()
}

func (s *Source) unuse() {
	s.mu.Lock()
	s.users--
	release := s.closed && s.users == 0
	s.mu.Unlock()
	if release {
		s.unregister()
	}
}

func (s *Source) unregister() {
	if s.cbID != 0 {
		callbacks.del(s.cbID)
	}
	if s.onRelease != nil {
		s.onRelease()
	}
}

// handles returns the C handles of sources, for window and trace calls.
func handles(sources []*Source) ([]*C.memprobe_source, error) {
	if len(sources) == 0 {
		return nil, &Error{Status: StatusInvalidArgument, Message: "at least one source is needed"}
	}
	hs := make([]*C.memprobe_source, len(sources))
	for i, s := range sources {
		if s == nil {
			return nil, &Error{Status: StatusNullPointer, Message: fmt.Sprintf("source %d is nil", i)}
		}
		hs[i] = s.h
	}
	return hs, nil
}
