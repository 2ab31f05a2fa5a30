//! The GPUs as the command sees them: [`read_gpus`] reads every device with
//! its processes through memprobe-gpu (`run` once at start, to learn the
//! devices or why there are none, then at every tick; `status`, `watch` and
//! `gpus` once per reading), and [`table`] shows them to people.

use crate::columns::render_rows;
use crate::units;
use memprobe_core::internal::process::command_name;
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
    pub(crate) processes: Vec<GpuProcessReading>,
}

/// One process's use of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct GpuProcessReading {
    /// Process id, as seen in this PID namespace.
    pub(crate) pid: u32,
    /// Device memory the process uses; `None` where the driver does not say
    /// (e.g. under some virtualization or MIG setups).
    pub(crate) used_bytes: Option<u64>,
    /// Who holds it, where memprobe's interposer counts the process and the
    /// command asked ([`crate::gpu_process_origins`]; `gpus`, `watch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) origins: Option<crate::gpu_process_origins::ProcessOrigins>,
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
                .map(|p| GpuProcessReading {
                    pid: p.pid,
                    used_bytes: p.used,
                    origins: None,
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

/// Fills in, for each process the interposer counts, what it holds on its
/// device by origin ([`crate::gpu_process_origins`]; `gpus`, `watch`).
pub(crate) fn name_origins(gpus: &mut [GpuReading]) {
    let counted = crate::gpu_process_origins::Counted::find();
    for g in gpus.iter_mut() {
        for p in &mut g.processes {
            p.origins = counted.of(p.pid, g.index);
        }
    }
}

/// Devices, then each device's processes.
pub(crate) fn table(gpus: &[GpuReading]) -> String {
    if gpus.is_empty() {
        return "no GPUs\n".into();
    }
    let mut rows = vec![[
        "GPU".to_string(),
        "NAME".into(),
        "USED".into(),
        "TOTAL".into(),
        "FREE".into(),
        "RESERVED".into(),
        "UUID".into(),
    ]];
    for g in gpus {
        rows.push([
            g.index.to_string(),
            g.name.clone(),
            units::bytes(g.used_bytes),
            units::bytes(g.total_bytes),
            units::bytes(g.free_bytes),
            units::opt_bytes(g.reserved_bytes),
            g.uuid.clone(),
        ]);
    }
    let mut out = render_rows(&rows);
    let mut procs = vec![[
        "GPU".to_string(),
        "PID".into(),
        "NAME".into(),
        "USED".into(),
    ]];
    // The line under each process naming who holds its memory, if known.
    let mut under: Vec<Option<String>> = vec![None];
    for g in gpus {
        for p in &g.processes {
            procs.push([
                g.index.to_string(),
                p.pid.to_string(),
                command_name(p.pid).unwrap_or_else(|| "?".into()),
                units::opt_bytes(p.used_bytes),
            ]);
            under.push(p.origins.as_ref().map(|o| {
                format!(
                    "    by origin: {} counted: {}",
                    units::bytes(o.held_bytes),
                    o.line()
                )
            }));
        }
    }
    out.push('\n');
    if procs.len() > 1 {
        for (line, extra) in render_rows(&procs).lines().zip(&under) {
            out.push_str(line);
            out.push('\n');
            if let Some(extra) = extra {
                out.push_str(extra);
                out.push('\n');
            }
        }
    } else {
        out.push_str("no GPU processes\n");
    }
    out
}
