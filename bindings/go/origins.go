package memprobe

/*
#include "memprobe.h"
*/
import "C"

// OriginsHostPinned is the device of GPUOriginsLive / GPUOriginsAtPeak that
// reads pinned host memory instead of a device.
const OriginsHostPinned = int32(C.MEMPROBE_GPU_ORIGINS_HOST_PINNED)

// GPUOrigin is the bytes one origin holds: the first library outside the
// CUDA driver and runtime on the stacks of the allocations it made, as the
// driver-API interposer counted them.
type GPUOrigin struct {
	ID uint32
	// Library is the library's path (the program's for the program itself).
	Library string
	// Symbol is the nearest dynamic symbol at the first call site ("" when
	// none is known).
	Symbol  string
	Bytes   uint64
	Address uint64
	Offset  uint64
	// Program is whether the library is this process's own executable.
	Program bool
}

// GPUPeakOrigins is the bytes by origin at a device's highest use so far.
type GPUPeakOrigins struct {
	Peak     uint64
	AtNs     uint64
	ByOrigin []GPUOrigin
}

func originFromC(c *C.memprobe_gpu_origin) GPUOrigin {
	o := GPUOrigin{
		ID:      uint32(c.id),
		Library: C.GoString(&c.library[0]),
		Bytes:   uint64(c.bytes),
		Address: uint64(c.address),
		Offset:  uint64(c.offset),
		Program: c.is_program != 0,
	}
	if c.has_symbol != 0 {
		o.Symbol = C.GoString(&c.symbol[0])
	}
	return o
}

func readOrigins(f func(*C.memprobe_gpu_origin, C.size_t, *C.size_t) C.memprobe_status) ([]GPUOrigin, error) {
	for {
		var n C.size_t
		err := call(func() C.memprobe_status { return f(nil, 0, &n) })
		if err != nil && !isStatus(err, StatusBufferTooSmall) {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]C.memprobe_gpu_origin, n)
		var got C.size_t
		err = call(func() C.memprobe_status { return f(&buf[0], n, &got) })
		if isStatus(err, StatusBufferTooSmall) && got > n {
			continue // an origin appeared meanwhile
		}
		if err != nil {
			return nil, err
		}
		out := make([]GPUOrigin, 0, got)
		for i := 0; i < int(got) && i < len(buf); i++ {
			out = append(out, originFromC(&buf[i]))
		}
		return out, nil
	}
}

// GPUOriginsLive is the bytes this process holds now on CUDA device
// `device` (or OriginsHostPinned), by origin, largest first. ErrUnavailable
// without the interposer in this process (`memprobe run --gpu-exact --
// CMD`); ErrInvalidID for a device beyond 0..63.
func GPUOriginsLive(device int32) ([]GPUOrigin, error) {
	return readOrigins(func(out *C.memprobe_gpu_origin, capacity C.size_t, n *C.size_t) C.memprobe_status {
		return C.memprobe_gpu_origins_live(C.int32_t(device), out, capacity, n)
	})
}

// GPUOriginsAtPeak is the bytes by origin at device `device`'s peak so far
// (Peak 0 and no origins before anything was counted). Errors as
// GPUOriginsLive.
func GPUOriginsAtPeak(device int32) (GPUPeakOrigins, error) {
	var peak, at C.uint64_t
	by, err := readOrigins(func(out *C.memprobe_gpu_origin, capacity C.size_t, n *C.size_t) C.memprobe_status {
		return C.memprobe_gpu_origins_at_peak(C.int32_t(device), out, capacity, n, &peak, &at)
	})
	if err != nil {
		return GPUPeakOrigins{}, err
	}
	return GPUPeakOrigins{Peak: uint64(peak), AtNs: uint64(at), ByOrigin: by}, nil
}

// OriginsNoOOM is GPUOOMOrigins' Device before any allocation failed with
// out-of-memory in this process.
const OriginsNoOOM = int32(C.MEMPROBE_GPU_ORIGINS_NO_OOM)

// GPUOOMOrigins is what this process held by origin on the device of the
// last allocation that failed with out-of-memory, copied by the interposer
// inside that allocation.
type GPUOOMOrigins struct {
	// Device is the failing device (OriginsHostPinned for pinned host
	// memory; OriginsNoOOM before any failure).
	Device int32
	// Held is what the process held there then (the sum of ByOrigin).
	Held     uint64
	AtNs     uint64
	ByOrigin []GPUOrigin
}

// GPUOriginsAtOOM reads the breakdown of the last out-of-memory failure
// (Device OriginsNoOOM before any). ErrUnavailable without the interposer.
func GPUOriginsAtOOM() (GPUOOMOrigins, error) {
	var device C.int32_t
	var held, at C.uint64_t
	by, err := readOrigins(func(out *C.memprobe_gpu_origin, capacity C.size_t, n *C.size_t) C.memprobe_status {
		return C.memprobe_gpu_origins_at_oom(out, capacity, n, &device, &held, &at)
	})
	if err != nil {
		return GPUOOMOrigins{Device: OriginsNoOOM}, err
	}
	return GPUOOMOrigins{Device: int32(device), Held: uint64(held), AtNs: uint64(at), ByOrigin: by}, nil
}
