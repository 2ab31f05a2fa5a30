package memprobe

/*
#include <stdlib.h>
#include "memprobe.h"

memprobe_status mpgo_gpu_set_cache_release(uintptr_t id);
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// GPUBackend is a GPU backend (memprobe_gpu_backend).
type GPUBackend uint32

// GPU backends.
const (
	// BackendAuto: NVML if it loads, else no GPU readings (the CUDA
	// runtime is never tried automatically).
	BackendAuto GPUBackend = C.MEMPROBE_GPU_BACKEND_AUTO
	// BackendNVML: no CUDA context, fork-safe. The default.
	BackendNVML GPUBackend = C.MEMPROBE_GPU_BACKEND_NVML
	// BackendCUDART: the CUDA runtime; creates a context on each device it reads.
	BackendCUDART GPUBackend = C.MEMPROBE_GPU_BACKEND_CUDART
	// BackendNone: no GPU readings.
	BackendNone GPUBackend = C.MEMPROBE_GPU_BACKEND_NONE
)

func (b GPUBackend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendNVML:
		return "nvml"
	case BackendCUDART:
		return "cudart"
	case BackendNone:
		return "none"
	}
	return fmt.Sprintf("GPUBackend(%d)", uint32(b))
}

// CurrentDevice asks GPUMemGet for the current device.
const CurrentDevice = int(C.MEMPROBE_GPU_CURRENT_DEVICE)

// GPUMemory is one reading of a GPU's memory, in bytes (fastai's
// GPUMemory(total, free, used) plus the driver's reservation).
type GPUMemory struct {
	Total, Free, Used uint64
	// Reserved is valid when HasReserved (NVML's v2 query).
	Reserved    uint64
	HasReserved bool
	// Read is false for the zeros of a failed reading.
	Read     bool
	TakenAt  time.Duration
	ReadTime time.Duration
}

func gpuMemoryFromC(m *C.memprobe_gpu_memory) GPUMemory {
	v := uint32(m.valid)
	return GPUMemory{
		Total:       uint64(m.total),
		Free:        uint64(m.free),
		Used:        uint64(m.used),
		Reserved:    uint64(m.reserved),
		HasReserved: v&C.MEMPROBE_GPU_MEMORY_RESERVED != 0,
		Read:        v&C.MEMPROBE_GPU_MEMORY_READ != 0,
		TakenAt:     time.Duration(m.taken_at_ns),
		ReadTime:    time.Duration(m.read_ns),
	}
}

// MB is fastai's GPUMemory in MiB: total, free, used.
func (m GPUMemory) MB() (total, free, used uint64) {
	return B2MB(m.Total), B2MB(m.Free), B2MB(m.Used)
}

// GPUInfo is what is known about a device; empty strings are unknown.
type GPUInfo struct {
	// ID is the CUDA ordinal as this process sees it.
	ID      int
	Backend GPUBackend
	// NVMLIndex is valid when HasNVMLIndex.
	NVMLIndex       int
	HasNVMLIndex    bool
	Name, UUID, PCI string
}

// ConfigureGPU chooses the backend and libraries ("" for the default
// names) instead of the environment. Call it before any other GPU call
// (else ErrWrongOrder).
func ConfigureGPU(backend GPUBackend, nvmlPath, cudartPath string) error {
	n, c := cString(nvmlPath, true), cString(cudartPath, true)
	defer freeCString(n)
	defer freeCString(c)
	return call(func() C.memprobe_status { return C.memprobe_gpu_configure(C.uint32_t(backend), n, c) })
}

// GPUBackendInUse is the backend in use (BackendNone when there is none).
func GPUBackendInUse() (GPUBackend, error) {
	var b C.uint32_t
	err := call(func() C.memprobe_status { return C.memprobe_gpu_get_backend(&b) })
	return GPUBackend(b), err
}

// GPUCount is how many GPUs this process sees; 0 and ErrUnavailable when
// there is no backend.
func GPUCount() (int, error) {
	var n C.uint32_t
	err := call(func() C.memprobe_status { return C.memprobe_gpu_count(&n) })
	return int(n), err
}

// GPUInfoOf returns what is known about device id.
func GPUInfoOf(id int) (GPUInfo, error) {
	var i C.memprobe_gpu_info
	err := call(func() C.memprobe_status { return C.memprobe_gpu_get_info(C.uint32_t(id), &i) })
	if err != nil {
		return GPUInfo{}, err
	}
	v := uint32(i.valid)
	text := func(p *C.char, bit uint32) string {
		if v&bit == 0 {
			return ""
		}
		return C.GoString(p)
	}
	return GPUInfo{
		ID:           int(i.id),
		Backend:      GPUBackend(i.backend),
		NVMLIndex:    int(i.nvml_index),
		HasNVMLIndex: v&C.MEMPROBE_GPU_INFO_NVML_INDEX != 0,
		Name:         text(&i.name[0], C.MEMPROBE_GPU_INFO_NAME),
		UUID:         text(&i.uuid[0], C.MEMPROBE_GPU_INFO_UUID),
		PCI:          text(&i.pci_bus_id[0], C.MEMPROBE_GPU_INFO_PCI_BUS_ID),
	}, nil
}

// GPUMemGet is fastai's gpu_mem_get(id) in bytes (CurrentDevice for the
// current one). No GPU: zeros and ErrUnavailable; no such id: zeros and
// ErrInvalidID.
func GPUMemGet(id int) (GPUMemory, error) {
	var m C.memprobe_gpu_memory
	err := call(func() C.memprobe_status { return C.memprobe_gpu_mem_get(C.int64_t(id), &m) })
	return gpuMemoryFromC(&m), err
}

// GPUMemGetAll is fastai's gpu_mem_get_all() in bytes: every device in id
// order (none and ErrUnavailable without a GPU). A device that cannot be
// read is zeros (Read false) and the error is the first such failure.
func GPUMemGetAll() ([]GPUMemory, error) {
	for {
		var n C.size_t
		err := call(func() C.memprobe_status { return C.memprobe_gpu_mem_get_all(nil, 0, &n) })
		if err != nil && !isStatus(err, StatusBufferTooSmall) {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]C.memprobe_gpu_memory, n)
		var got C.size_t
		err = call(func() C.memprobe_status { return C.memprobe_gpu_mem_get_all(&buf[0], n, &got) })
		if isStatus(err, StatusBufferTooSmall) && got > n {
			continue // a device appeared meanwhile
		}
		out := make([]GPUMemory, 0, got)
		for i := 0; i < int(got) && i < len(buf); i++ {
			out = append(out, gpuMemoryFromC(&buf[i]))
		}
		return out, err
	}
}

func isStatus(err error, s Status) bool {
	e, ok := err.(*Error)
	return ok && e.Status == s
}

// storedError reads an error the library keeps (a status and its message)
// through get, growing the buffer as the library asks; nil for OK.
func storedError(get func(st *C.memprobe_status, buf *C.char, size C.size_t, needed *C.size_t) error) error {
	size := C.size_t(256)
	for {
		buf := (*C.char)(C.malloc(size))
		var st C.memprobe_status
		var needed C.size_t
		err := get(&st, buf, size, &needed)
		msg := C.GoString(buf)
		C.free(unsafe.Pointer(buf))
		if isStatus(err, StatusBufferTooSmall) && needed > size {
			size = needed
			continue
		}
		if err != nil {
			return err
		}
		if Status(st) == StatusOK {
			return nil
		}
		return &Error{Status: Status(st), Message: msg}
	}
}

func bytesReading(f func(*C.uint64_t) C.memprobe_status) (uint64, error) {
	var v C.uint64_t
	err := call(func() C.memprobe_status { return f(&v) })
	return uint64(v), err
}

// GPUMemGetFree is fastai's gpu_mem_get_free(): free bytes on the current
// device, caches untouched.
func GPUMemGetFree() (uint64, error) {
	return bytesReading(func(p *C.uint64_t) C.memprobe_status { return C.memprobe_gpu_mem_get_free(p) })
}

// GPUMemGetUsed is fastai's gpu_mem_get_used(): used bytes on the current device.
func GPUMemGetUsed() (uint64, error) {
	return bytesReading(func(p *C.uint64_t) C.memprobe_status { return C.memprobe_gpu_mem_get_used(p) })
}

// GPUMemGetFreeNoCache calls the cache-release callback (SetGPUCacheRelease)
// first, then reads free bytes on the current device.
func GPUMemGetFreeNoCache() (uint64, error) {
	return bytesReading(func(p *C.uint64_t) C.memprobe_status { return C.memprobe_gpu_mem_get_free_no_cache(p) })
}

// GPUMemGetUsedNoCache calls the cache-release callback first, then reads
// used bytes on the current device.
func GPUMemGetUsedNoCache() (uint64, error) {
	return bytesReading(func(p *C.uint64_t) C.memprobe_status { return C.memprobe_gpu_mem_get_used_no_cache(p) })
}

// GPUWithMaxFreeMem is fastai's gpu_with_max_free_mem(): the first device
// with the most free memory and its free bytes; id -1 when none is readable.
func GPUWithMaxFreeMem() (id int, free uint64, err error) {
	var i C.int64_t
	var f C.uint64_t
	err = call(func() C.memprobe_status { return C.memprobe_gpu_with_max_free_mem(&i, &f) })
	return int(i), uint64(f), err
}

// GPUCurrentDevice is the device of the readings that take none.
func GPUCurrentDevice() (int, error) {
	var d C.uint32_t
	err := call(func() C.memprobe_status { return C.memprobe_gpu_get_current_device(&d) })
	return int(d), err
}

// SetGPUCurrentDevice makes id the current device (NVML: memprobe's own
// setting, for every thread; CUDA runtime: cudaSetDevice on this thread).
func SetGPUCurrentDevice(id int) error {
	return call(func() C.memprobe_status { return C.memprobe_gpu_set_current_device(C.uint32_t(id)) })
}

// GPUPreload is fastai's preload_pytorch(): creates the CUDA context on the
// current device now.
func GPUPreload() error {
	return call(func() C.memprobe_status { return C.memprobe_gpu_preload() })
}

var gpuRelease struct {
	mu sync.Mutex
	id uintptr
}

// SetGPUCacheRelease registers fn as the cache-release callback that the
// *NoCache readings call first (one per process; nil removes it). fn runs
// on the goroutine of the reading.
func SetGPUCacheRelease(fn func() error) error {
	gpuRelease.mu.Lock()
	defer gpuRelease.mu.Unlock()
	var id uintptr
	if fn != nil {
		id = callbacks.add(&releaseFunc{name: "gpu cache release", fn: fn})
	}
	var err error
	if fn == nil {
		err = call(func() C.memprobe_status { return C.memprobe_gpu_set_cache_release(nil, nil) })
	} else {
		err = call(func() C.memprobe_status { return C.mpgo_gpu_set_cache_release(C.uintptr_t(id)) })
	}
	if err != nil {
		if id != 0 {
			callbacks.del(id)
		}
		return err
	}
	if gpuRelease.id != 0 {
		callbacks.del(gpuRelease.id)
	}
	gpuRelease.id = id
	return nil
}

// GPULiveDevices is the number of live GPUDevice handles (leak checks).
func GPULiveDevices() (uint64, error) {
	return bytesReading(func(p *C.uint64_t) C.memprobe_status { return C.memprobe_gpu_debug_live_devices(p) })
}

// GPUDevice is a pre-resolved GPU (fastai's gpu_handle): readings through it
// do no lookup.
type GPUDevice struct {
	h    *C.memprobe_gpu_device
	ID   int
	once sync.Once
}

// OpenGPUDevice resolves device id once.
func OpenGPUDevice(id int) (*GPUDevice, error) {
	var h *C.memprobe_gpu_device
	if err := call(func() C.memprobe_status { return C.memprobe_gpu_device_open(C.uint32_t(id), &h) }); err != nil {
		return nil, err
	}
	d := &GPUDevice{h: h, ID: id}
	runtime.SetFinalizer(d, (*GPUDevice).Close)
	return d, nil
}

// UsedFast is fastai's gpu_mem_get_used_fast(handle): used bytes, one driver query.
func (d *GPUDevice) UsedFast() (uint64, error) {
	v, err := bytesReading(func(p *C.uint64_t) C.memprobe_status { return C.memprobe_gpu_mem_get_used_fast(d.h, p) })
	runtime.KeepAlive(d)
	return v, err
}

// MemGet is the full reading of the device.
func (d *GPUDevice) MemGet() (GPUMemory, error) {
	var m C.memprobe_gpu_memory
	err := call(func() C.memprobe_status { return C.memprobe_gpu_device_mem_get(d.h, &m) })
	runtime.KeepAlive(d)
	return gpuMemoryFromC(&m), err
}

// ProcessUsed is the bytes this process uses on the device.
func (d *GPUDevice) ProcessUsed() (uint64, error) {
	v, err := bytesReading(func(p *C.uint64_t) C.memprobe_status { return C.memprobe_gpu_device_process_used(d.h, p) })
	runtime.KeepAlive(d)
	return v, err
}

// Close releases the handle. Closing twice is a no-op.
func (d *GPUDevice) Close() error {
	var err error
	d.once.Do(func() {
		runtime.SetFinalizer(d, nil)
		err = call(func() C.memprobe_status { return C.memprobe_gpu_device_free(d.h) })
	})
	return err
}

// NewGPUDevice is a source reading device id's memory ("gpu<id>"; sampled
// by the monitor while a window is open over it).
func NewGPUDevice(id int) (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_gpu_device(C.uint32_t(id), out)
	})
}

// NewGPUProcess is a source reading this process's memory on device id
// ("gpu<id>.proc"; ErrUnsupported with the CUDA runtime backend).
func NewGPUProcess(id int) (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_gpu_process(C.uint32_t(id), out)
	})
}

// LastError says why the source's last read failed — by Read, a window
// boundary or the monitor thread (e.g. ErrGPULost for a GPU lost while
// polled); nil when the last read succeeded.
func (s *Source) LastError() error {
	defer runtime.KeepAlive(s)
	return storedError(func(st *C.memprobe_status, buf *C.char, size C.size_t, needed *C.size_t) error {
		return call(func() C.memprobe_status { return C.memprobe_source_get_last_error(s.h, st, buf, size, needed) })
	})
}
