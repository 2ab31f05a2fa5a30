//! The seam between the command and the GPU crate.
//!
//! Everything GPU-related that the command needs goes through [`read_gpus`]:
//! `run` calls it once at start (to learn the devices, or why there are none)
//! and then at every tick; `status`, `watch` and `gpus` call it per reading.
//! The JSON, CSV, SVG and summary code already handle any number of devices,
//! so wiring a GPU backend in changes only this file.

use serde::Serialize;

/// One reading of one GPU device. Bytes everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct GpuReading {
    /// The device index as CUDA numbers it for this process (honouring
    /// `CUDA_VISIBLE_DEVICES`).
    pub(crate) index: u32,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub(crate) name: String,
    /// The device UUID (`GPU-…`, or `MIG-…` for a MIG instance): stable
    /// across readings, so series are matched on it.
    pub(crate) uuid: String,
    /// Memory capacity.
    pub(crate) total_bytes: u64,
    /// Memory in use (NVML v2 semantics: excludes the driver reservation).
    pub(crate) used_bytes: u64,
    /// Memory available for allocation.
    pub(crate) free_bytes: u64,
    /// Memory reserved by the driver, where the backend reports it apart.
    pub(crate) reserved_bytes: Option<u64>,
    /// The compute processes on this device.
    pub(crate) processes: Vec<GpuProcess>,
}

/// One process's use of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct GpuProcess {
    /// Process id, as seen in this PID namespace.
    pub(crate) pid: u32,
    /// Device memory the process uses; `None` where the driver does not say
    /// (e.g. under some virtualization or MIG setups).
    pub(crate) used_bytes: Option<u64>,
}

/// Why there are no GPU readings in this build.
pub(crate) const NO_GPU_SUPPORT: &str = "memprobe was built without GPU support";

/// Reads every GPU visible to this process, ordered by index; `Err` says why
/// none can be read (no driver, no device, no GPU support in this build).
pub(crate) fn read_gpus() -> Result<Vec<GpuReading>, String> {
    Err(NO_GPU_SUPPORT.to_string())
}
