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

/// Reads every GPU visible to this process, ordered by index; `Err` says why
/// none can be read (no driver, no device, a backend error). Devices are
/// numbered as CUDA numbers them (honouring `CUDA_VISIBLE_DEVICES`), through
/// memprobe-gpu's process-wide instance (`MEMPROBE_GPU_BACKEND`,
/// `MEMPROBE_NVML_LIBRARY`). A device that fails to read (e.g. lost) is left
/// out of the list; if every device fails, the first error is returned.
pub(crate) fn read_gpus() -> Result<Vec<GpuReading>, String> {
    let gpus = memprobe_gpu::Gpus::shared();
    if let Some(why) = gpus.unavailable_reason() {
        return Err(why.message().to_string());
    }
    let count = gpus.device_count().map_err(|e| e.to_string())?;
    if count == 0 {
        return Err("no GPU is visible to this process".to_string());
    }
    let mut readings = Vec::with_capacity(count as usize);
    let mut first_error = None;
    for id in 0..count {
        let read = gpus.device(id).and_then(|dev| {
            let mem = dev.memory()?;
            // The process list is optional (not supported under some setups).
            let processes = dev
                .processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_bytes: p.used,
                })
                .collect();
            Ok(GpuReading {
                index: id,
                name: dev
                    .info()
                    .name
                    .clone()
                    .unwrap_or_else(|| "unknown".to_string()),
                uuid: dev.info().uuid.clone().unwrap_or_default(),
                total_bytes: mem.total,
                used_bytes: mem.used,
                free_bytes: mem.free,
                reserved_bytes: mem.reserved,
                processes,
            })
        });
        match read {
            Ok(r) => readings.push(r),
            Err(e) => {
                first_error.get_or_insert(format!("gpu {id}: {e}"));
            }
        }
    }
    match (readings.is_empty(), first_error) {
        (true, Some(e)) => Err(e),
        _ => Ok(readings),
    }
}
