package memprobe

/*
#include "memprobe.h"
*/
import "C"

import "fmt"

// Status is a memprobe_status: the result of a library call. Values are
// explicit and never reused.
type Status uint32

// The statuses of include/memprobe.h.
const (
	StatusOK               Status = C.MEMPROBE_STATUS_OK
	StatusNullPointer      Status = C.MEMPROBE_STATUS_NULL_POINTER
	StatusInvalidArgument  Status = C.MEMPROBE_STATUS_INVALID_ARGUMENT
	StatusInvalidHandle    Status = C.MEMPROBE_STATUS_INVALID_HANDLE
	StatusInvalidID        Status = C.MEMPROBE_STATUS_INVALID_ID
	StatusWrongOrder       Status = C.MEMPROBE_STATUS_WRONG_ORDER
	StatusUnavailable      Status = C.MEMPROBE_STATUS_UNAVAILABLE
	StatusUnsupported      Status = C.MEMPROBE_STATUS_UNSUPPORTED
	StatusPermissionDenied Status = C.MEMPROBE_STATUS_PERMISSION_DENIED
	StatusIO               Status = C.MEMPROBE_STATUS_IO
	StatusParse            Status = C.MEMPROBE_STATUS_PARSE
	StatusGPULost          Status = C.MEMPROBE_STATUS_GPU_LOST
	StatusBufferTooSmall   Status = C.MEMPROBE_STATUS_BUFFER_TOO_SMALL
	StatusPanic            Status = C.MEMPROBE_STATUS_PANIC
	StatusInternal         Status = C.MEMPROBE_STATUS_INTERNAL
	StatusOutOfMemory      Status = C.MEMPROBE_STATUS_OUT_OF_MEMORY
)

// String is the library's name for the status ("ok", "wrong order", ...).
func (s Status) String() string {
	return C.GoString(C.memprobe_status_name(C.uint32_t(s)))
}

// Error is a failed memprobe call: its status and the library's message
// (memprobe_last_error). Match it with errors.Is(err, memprobe.ErrWrongOrder)
// or errors.As(err, &e).
type Error struct {
	Status  Status
	Message string
	// Cause is the Go error behind the failure, when there is one (the
	// error or panic of a callback source's read function).
	Cause error
}

func (e *Error) Error() string {
	msg := "memprobe: " + e.Status.String()
	if e.Message != "" {
		msg = fmt.Sprintf("memprobe: %s (%s)", e.Message, e.Status)
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Unwrap returns the Cause.
func (e *Error) Unwrap() error { return e.Cause }

// Is reports whether target is an *Error with the same status, so that the
// Err* sentinels match every error of their status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status && (t.Message == "" || t.Message == e.Message)
}

// Sentinels, one per failure status, for errors.Is.
var (
	ErrNullPointer      = &Error{Status: StatusNullPointer}
	ErrInvalidArgument  = &Error{Status: StatusInvalidArgument}
	ErrInvalidHandle    = &Error{Status: StatusInvalidHandle}
	ErrInvalidID        = &Error{Status: StatusInvalidID}
	ErrWrongOrder       = &Error{Status: StatusWrongOrder}
	ErrUnavailable      = &Error{Status: StatusUnavailable}
	ErrUnsupported      = &Error{Status: StatusUnsupported}
	ErrPermissionDenied = &Error{Status: StatusPermissionDenied}
	ErrIO               = &Error{Status: StatusIO}
	ErrParse            = &Error{Status: StatusParse}
	ErrGPULost          = &Error{Status: StatusGPULost}
	ErrBufferTooSmall   = &Error{Status: StatusBufferTooSmall}
	ErrPanic            = &Error{Status: StatusPanic}
	ErrInternal         = &Error{Status: StatusInternal}
	ErrOutOfMemory      = &Error{Status: StatusOutOfMemory}
)
