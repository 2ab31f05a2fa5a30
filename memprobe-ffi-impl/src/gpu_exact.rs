//! Exact GPU sources over the driver-API interposer's counts (see
//! memprobe-gpu's `gpu_exact_source`).

use crate::boundary::entry_point;
use crate::source::{memprobe_source, publish};
use crate::status::memprobe_status;

/// A source of this process's memory on CUDA device `device` (the ordinal as
/// this process sees it), named `gpu_exact:<device>`
/// (MEMPROBE_SOURCE_KIND_GPU_EXACT), counted by the driver-API interposer
/// libmemprobe_interpose.so at every allocation and free. Its peak is exact
/// (MEMPROBE_FIDELITY_EXACT): the source holds a high-water mark of its own
/// in the interposer, folded and restarted at every window boundary like
/// the kernel's VmHWM, so a spike of microseconds is in the peak of every
/// window open across it, and no other reader (another source, `memprobe
/// run` outside) resets it. No polling: no monitor needed.
///
/// Errors: MEMPROBE_STATUS_NULL_POINTER for a NULL `out`;
/// MEMPROBE_STATUS_INVALID_ID for a device beyond 0..63;
/// MEMPROBE_STATUS_UNAVAILABLE when the interposer is not loaded in this
/// process (run the program with `memprobe run --gpu-exact -- CMD`, or
/// LD_PRELOAD=/path/to/libmemprobe_interpose.so), when counting is switched
/// off (MEMPROBE_GPU_EXACT=off) or when all its 32 marks are held.
#[no_mangle]
pub extern "C" fn memprobe_source_new_gpu_exact(
    device: u32,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_gpu_exact", || {
        crate::boundary::out(out, "out")?;
        publish(memprobe_gpu::gpu_exact_source(device)?, out)
    })
}
