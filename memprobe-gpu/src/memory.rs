//! One reading of a GPU device's memory.

use memprobe_core::Sample;

/// A GPU device's memory at one instant, in bytes (fastai's
/// `GPUMemory(total, free, used)`, plus the driver's reservation).
///
/// With NVML's v2 query, `total = used + free + reserved` and `used` matches
/// what `nvidia-smi` shows; with the v1 query (old drivers) `reserved` is
/// `None` and `used` includes the reservation (`total = used + free`). The
/// CUDA runtime backend reports `used = total - free` and no reservation.
///
/// A failed reading in the fastai-style calls is [`GpuMemory::ZERO`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuMemory {
    /// The device's memory size.
    pub total: u64,
    /// Bytes still available for allocation.
    pub free: u64,
    /// Bytes in use (by every process, plus contexts).
    pub used: u64,
    /// Bytes the driver sets aside (firmware, ECC), when the driver says.
    pub reserved: Option<u64>,
    /// When the reading was taken: `memprobe_core::monotonic_ns()` just
    /// before the query.
    pub taken_at_ns: u64,
    /// How long the query took, in nanoseconds.
    pub read_ns: u64,
}

impl GpuMemory {
    /// All zeros: what the fastai-style calls return when there is no
    /// reading (no GPU, invalid id, lost GPU).
    pub const ZERO: GpuMemory = GpuMemory {
        total: 0,
        free: 0,
        used: 0,
        reserved: None,
        taken_at_ns: 0,
        read_ns: 0,
    };

    /// This reading as a core [`Sample`] (`limit` is `None`: a GPU has a
    /// size, not a limit).
    pub fn to_sample(&self) -> Sample {
        Sample {
            used: self.used,
            total: Some(self.total),
            free: Some(self.free),
            limit: None,
            reserved: self.reserved,
            taken_at_ns: self.taken_at_ns,
            read_ns: self.read_ns,
        }
    }
}
