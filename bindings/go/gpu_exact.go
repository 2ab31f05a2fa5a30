package memprobe

/*
#include "memprobe.h"
*/
import "C"

// KindGPUExact: this process's memory on one GPU, counted by the driver-API
// interposer at every allocation and free (NewGPUExactSource).
const KindGPUExact SourceKind = C.MEMPROBE_SOURCE_KIND_GPU_EXACT

func init() { kindNames[KindGPUExact] = "exact GPU" }

// NewGPUExactSource is an exact source of this process's memory on CUDA
// device `device` ("gpu_exact:<device>"), counted by the driver-API
// interposer libmemprobe_interpose.so at every allocation and free. Its
// peak is exact: a spike of microseconds is in every window open across it,
// with no monitor polling. ErrUnavailable when the interposer is not loaded
// in this process (run the program with `memprobe run --gpu-exact -- CMD`,
// or LD_PRELOAD=/path/to/libmemprobe_interpose.so) or counting is switched
// off (MEMPROBE_GPU_EXACT=off); ErrInvalidID for a device beyond 0..63.
func NewGPUExactSource(device uint32) (*Source, error) {
	return newSource(func(out **C.memprobe_source) C.memprobe_status {
		return C.memprobe_source_new_gpu_exact(C.uint32_t(device), out)
	})
}
