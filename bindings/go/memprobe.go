// Package memprobe measures memory in machine-learning training — this
// process's RSS with exact peaks (the kernel's high-water mark), process
// trees, the container's cgroup and GPUs — through libmemprobe's C ABI.
//
// Every quantity is in bytes. Sources say what is measured; windows keep the
// peak of sources over an interval (concurrent, nestable and independent);
// traces are fastai's GPUMemTrace over any sources, printing
//
//	△Used Peaked MB:     12    340 (eval: done)
//
// Every failing call returns an *Error carrying the library's status and
// message; compare with errors.Is against the Err* sentinels:
//
//	if errors.Is(err, memprobe.ErrWrongOrder) { ... }
//
// Objects hold library handles: release them with Close (a finalizer
// releases forgotten ones). Every function may be called from any
// goroutine.
//
// Building needs an installed memprobe found by pkg-config (make install
// PREFIX=<prefix>; PKG_CONFIG_PATH=<prefix>/lib/pkgconfig when the prefix is
// not a standard one), and LD_LIBRARY_PATH=<prefix>/lib (or an rpath) at run
// time. See README.md.
package memprobe

/*
#cgo pkg-config: memprobe
#include <stdlib.h>
#include "memprobe.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// ABIMajor and ABIMinor are the version of the header this package was
// compiled against (MEMPROBE_VERSION_MAJOR / _MINOR).
const (
	ABIMajor = int(C.MEMPROBE_VERSION_MAJOR)
	ABIMinor = int(C.MEMPROBE_VERSION_MINOR)
	ABIPatch = int(C.MEMPROBE_VERSION_PATCH)
)

// Version is the library's version, e.g. "0.1.0".
func Version() string { return C.GoString(C.memprobe_version()) }

// Soname is the library's SONAME, e.g. "libmemprobe.so.0.1".
func Soname() string { return C.GoString(C.memprobe_soname()) }

// B2MB is fastai's b2mb: bytes to MiB, rounded down.
func B2MB(bytes uint64) uint64 { return uint64(C.memprobe_b2mb(C.uint64_t(bytes))) }

// B2MBSigned converts a signed byte count (a delta such as DeltaUsed) to
// MiB, rounded toward zero like fastai's int(num / 2**20).
func B2MBSigned(bytes int64) int64 { return int64(C.memprobe_b2mb_signed(C.int64_t(bytes))) }

// MiB is 2^20 bytes.
const MiB = 1 << 20

// Handles counts the library's live handles of each kind.
type Handles struct {
	Sources, Windows, Traces, Trackers uint64
}

// LiveHandles returns how many handles of each kind are alive in the
// library (for leak checks in tests).
func LiveHandles() (Handles, error) {
	var s, w, t, k C.uint64_t
	err := call(func() C.memprobe_status { return C.memprobe_debug_live_handles(&s, &w, &t, &k) })
	return Handles{uint64(s), uint64(w), uint64(t), uint64(k)}, err
}

// lastError is memprobe_last_error() of the calling thread.
func lastError() string { return C.GoString(C.memprobe_last_error()) }

// call runs one C call and turns a failure into an *Error. The goroutine is
// locked to its thread so that memprobe_last_error (thread-local) is read
// on the thread that failed.
func call(f func() C.memprobe_status) error {
	runtime.LockOSThread()
	st := f()
	var msg string
	if st != C.MEMPROBE_STATUS_OK {
		msg = lastError()
	}
	runtime.UnlockOSThread()
	if st == C.MEMPROBE_STATUS_OK {
		return nil
	}
	return &Error{Status: Status(st), Message: msg}
}

// cString returns a C copy of s (free it with freeCString); NULL for "" when
// nullable.
func cString(s string, nullable bool) *C.char {
	if nullable && s == "" {
		return nil
	}
	return C.CString(s)
}

func freeCString(p *C.char) {
	if p != nil {
		C.free(unsafe.Pointer(p))
	}
}
