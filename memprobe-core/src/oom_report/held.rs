//! What held the memory when the allocation failed, by origin: the library
//! that asked for each byte (PyTorch's caching allocator, NCCL, cuBLAS, the
//! program), as memprobe's interposer names it, and beside it what the
//! device shows for this process beyond those bytes (the CUDA context and
//! anything no driver call showed). Supplied by the GPU provider; the core
//! only renders it.

use super::model::{OomLocation, OutOfMemoryReport};

/// How a breakdown was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomHeldBasis {
    /// Copied by the interposer inside the failing allocation, before its
    /// error returned: exactly what was live then.
    AtFailure,
    /// Read when the report was written (a caller's trigger: the failure
    /// the interposer saw, if any, was on another device or long before).
    AtReport,
}

impl OomHeldBasis {
    /// `at_failure` or `at_report`.
    pub fn as_str(self) -> &'static str {
        match self {
            OomHeldBasis::AtFailure => "at_failure",
            OomHeldBasis::AtReport => "at_report",
        }
    }
}

/// The bytes one origin held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomOriginBytes {
    /// What people call it ("PyTorch caching allocator", "NCCL", "the
    /// program", else the library's file name).
    pub name: String,
    /// The library's path as the loader knew it.
    pub library: String,
    /// The nearest dynamic symbol at its first call site, when known.
    pub symbol: Option<String>,
    /// Whether the library is the process's own executable.
    pub program: bool,
    /// Bytes it held.
    pub bytes: u64,
}

/// The live bytes by origin on the failing device (or pinned host memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomHeldByOrigin {
    /// Where they were held.
    pub location: OomLocation,
    /// When they were taken.
    pub basis: OomHeldBasis,
    /// `CLOCK_MONOTONIC` nanoseconds of that moment.
    pub at_ns: u64,
    /// Everything this process held there through counted driver calls
    /// (the sum of `by_origin`).
    pub held_bytes: u64,
    /// Largest first.
    pub by_origin: Vec<OomOriginBytes>,
}

impl OutOfMemoryReport {
    /// NVML's figure for this process on the breakdown's device minus what
    /// the interposer counted there (never below 0): the CUDA context and
    /// memory no driver call showed; or why it is not known.
    pub fn context_and_unseen(&self) -> std::result::Result<u64, String> {
        let held = self
            .held_by_origin
            .as_ref()
            .map_err(|_| "no breakdown by origin".to_owned())?;
        let OomLocation::Device(d) = held.location else {
            return Err("pinned host memory has no device figure".into());
        };
        let gpus = self
            .gpus
            .as_ref()
            .map_err(|e| format!("no NVML figure: {e}"))?;
        let dev = gpus
            .iter()
            .find(|g| g.id == d)
            .ok_or_else(|| format!("GPU {d} is not among the GPUs read"))?;
        let procs = dev
            .processes
            .as_ref()
            .map_err(|e| format!("no NVML per-process figure: {e}"))?;
        let mine: Vec<u64> = procs
            .iter()
            .filter(|p| p.this_process)
            .map(|p| p.used_bytes)
            .collect::<Option<Vec<u64>>>()
            .ok_or("NVML gives no per-process figure on this driver")?;
        if mine.is_empty() {
            return Err("NVML does not list this process".into());
        }
        Ok(mine.iter().sum::<u64>().saturating_sub(held.held_bytes))
    }
}
