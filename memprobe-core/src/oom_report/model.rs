//! The report's model: the failed allocation, the open and last ended
//! phases, the GPU part asked of an [`OomGpuProvider`] from above (with
//! what held the failing device, by origin), and what releasing caches
//! would free.

use super::unix_ns;
use super::LiveBlocks;
use crate::phase::PhaseKind;
use crate::record::Record;
use crate::sample::{monotonic_ns, PeakFidelity, SourceInfo, SourceKind};
use crate::window::Window;
use std::collections::BTreeSet;

/// Which triggers write a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OomTriggers {
    /// The GPU driver failing an allocation with out-of-memory, seen by
    /// memprobe's interposer (wired up by memprobe-gpu).
    pub driver: bool,
    /// The caller reporting it ([`Tracker::report_oom`](crate::Tracker::report_oom)):
    /// a framework's out-of-memory error, PyTorch's observer.
    pub caller: bool,
}

/// What triggered a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomTrigger {
    /// The GPU driver (through the interposer).
    Driver,
    /// The caller.
    Caller,
}

impl OomTrigger {
    /// `driver` or `caller`.
    pub fn as_str(self) -> &'static str {
        match self {
            OomTrigger::Driver => "driver",
            OomTrigger::Caller => "caller",
        }
    }
}

/// Where the failed allocation was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomLocation {
    /// Memory of a GPU (the CUDA ordinal as the process sees it).
    Device(u32),
    /// Page-locked host memory (`cuMemHostAlloc` and kin).
    HostPinned,
    /// Not known (no current context, or the reporter did not say).
    Unknown,
}

impl OomLocation {
    /// The device, when there is one.
    pub fn device(self) -> Option<u32> {
        match self {
            OomLocation::Device(d) => Some(d),
            _ => None,
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            OomLocation::Device(_) => "device",
            OomLocation::HostPinned => "host_pinned",
            OomLocation::Unknown => "unknown",
        }
    }
}

/// A framework's cache on one device, as the reporter gives it (e.g.
/// PyTorch's caching allocator: reserved, allocated, and what
/// `empty_cache()` could return).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheFigures {
    /// The device.
    pub device: u32,
    /// Whose cache (`torch`).
    pub framework: String,
    /// Bytes the cache holds from the driver.
    pub reserved_bytes: Option<u64>,
    /// Bytes of it handed out to the program.
    pub allocated_bytes: Option<u64>,
    /// Bytes releasing the cache would give back to the driver, by the
    /// framework's own account.
    pub releasable_bytes: Option<u64>,
}

/// The allocation that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedAllocation {
    /// What reported it.
    pub trigger: OomTrigger,
    /// Where it was asked for.
    pub location: OomLocation,
    /// The size asked for, when known.
    pub requested_bytes: Option<u64>,
    /// The API or framework that reported it (`cuMemAlloc_v2`, `torch`,
    /// `caller`).
    pub reported_by: String,
    /// The caller's detail (an exception's message), if any.
    pub detail: Option<String>,
    /// When it failed: `CLOCK_MONOTONIC` nanoseconds.
    pub at_ns: u64,
    /// When it failed: nanoseconds since the Unix epoch (`CLOCK_REALTIME`).
    pub at_unix_ns: u64,
    /// The device's total (or the allowed maximum) as the reporter saw it.
    pub device_total_bytes: Option<u64>,
    /// The device's free bytes as the reporter saw it at the failure.
    pub device_free_bytes: Option<u64>,
    /// The interposer's count of out-of-memory failures in this process so
    /// far, this one included (driver reports).
    pub driver_oom_failures: Option<u64>,
    /// Framework caches, per device, as the reporter gives them.
    pub caches: Vec<CacheFigures>,
    /// What the framework had live at the failure (a torch attribution
    /// record), or why the one given was refused; `None`: none given.
    /// Set with [`FailedAllocation::set_live_blocks_json`].
    pub live_blocks: Option<std::result::Result<LiveBlocks, String>>,
}

impl FailedAllocation {
    /// A failure reported now by `reported_by`; the optional figures unknown.
    pub fn new(
        trigger: OomTrigger,
        location: OomLocation,
        requested_bytes: Option<u64>,
        reported_by: &str,
    ) -> FailedAllocation {
        FailedAllocation {
            trigger,
            location,
            requested_bytes,
            reported_by: reported_by.to_owned(),
            detail: None,
            at_ns: monotonic_ns(),
            at_unix_ns: unix_ns(),
            device_total_bytes: None,
            device_free_bytes: None,
            driver_oom_failures: None,
            caches: Vec::new(),
            live_blocks: None,
        }
    }

    /// Gives the framework's table of what was live (a torch attribution
    /// record of kind `oom`, `memprobe.torch_attribution/1`, at most
    /// [`MAX_LIVE_BLOCKS_BYTES`](super::MAX_LIVE_BLOCKS_BYTES)). A record
    /// that is not valid JSON, lacks the schema or is too large is kept out
    /// of the report, which says why (`live_blocks_error`): never an error
    /// here, so that the failure's report is never lost.
    pub fn set_live_blocks_json(&mut self, json: &str) {
        self.live_blocks = Some(LiveBlocks::from_json(json));
    }
}

/// One source of an open phase, so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSource {
    /// The source's name.
    pub name: String,
    /// What it measures.
    pub kind: SourceKind,
    /// How exact its peak is.
    pub fidelity: PeakFidelity,
    /// Used when the phase began, bytes.
    pub used_start: u64,
    /// Used at the report, when the source could be read.
    pub used_now: Option<u64>,
    /// The peak since the phase began, when the source could be read.
    pub peak: Option<u64>,
    /// Why the source could not be read.
    pub error: Option<String>,
}

/// A phase still open at the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenPhase {
    /// The kind.
    pub kind: PhaseKind,
    /// The name (the kind's, or the caller's for custom phases).
    pub name: String,
    /// The index it will have when it ends (phases of its kind ended before).
    pub index: u64,
    /// Enclosing phases (0 = outermost).
    pub depth: u32,
    /// When it began, `CLOCK_MONOTONIC` nanoseconds.
    pub started_at_ns: u64,
    /// Each source, in the tracker's order.
    pub sources: Vec<OpenSource>,
}

impl OpenPhase {
    /// Measures `window` (the phase's) without ending it: each source is
    /// read alone, so one that fails does not hide the others.
    pub fn measure(
        kind: PhaseKind,
        name: &str,
        index: u64,
        depth: u32,
        window: &Window,
    ) -> OpenPhase {
        let starts = window.starts();
        let sources = window
            .sources()
            .enumerate()
            .map(|(i, s)| {
                let info = s.info();
                let start = starts.get(i).map_or(0, |s| s.used);
                match window.measure_of(i) {
                    Ok(d) => OpenSource {
                        name: info.name.clone(),
                        kind: info.kind,
                        fidelity: info.fidelity,
                        used_start: d.used_start,
                        used_now: Some(d.used_end),
                        peak: Some(d.peak),
                        error: None,
                    },
                    Err(e) => OpenSource {
                        name: info.name.clone(),
                        kind: info.kind,
                        fidelity: info.fidelity,
                        used_start: start,
                        used_now: None,
                        peak: None,
                        error: Some(e.to_string()),
                    },
                }
            })
            .collect();
        OpenPhase {
            kind,
            name: name.to_owned(),
            index,
            depth,
            started_at_ns: window.started_at_ns(),
            sources,
        }
    }
}

/// Which of the driver's lists a GPU process came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomProcessList {
    /// A compute context (CUDA).
    Compute,
    /// A graphics context.
    Graphics,
}

/// One process on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomGpuProcess {
    /// The PID as the driver reports it (the host's, in a container).
    pub pid: u32,
    /// Its bytes on the device, when the driver says.
    pub used_bytes: Option<u64>,
    /// The list it came from.
    pub list: OomProcessList,
    /// Whether it is this process.
    pub this_process: bool,
}

/// One GPU at the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomGpuDevice {
    /// The CUDA ordinal as the process sees it.
    pub id: u32,
    /// The product name, when known.
    pub name: Option<String>,
    /// The UUID, when known.
    pub uuid: Option<String>,
    /// Its memory, or why it could not be read.
    pub memory: std::result::Result<OomGpuMemory, String>,
    /// The processes using it, or why they could not be listed.
    pub processes: std::result::Result<Vec<OomGpuProcess>, String>,
}

/// One GPU's memory at the report, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomGpuMemory {
    /// The device's memory.
    pub total_bytes: u64,
    /// Free, as the driver reports it.
    pub free_bytes: u64,
    /// Used, by every process.
    pub used_bytes: u64,
}

/// What this process holds from the driver, per device, as the interposer
/// counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomDriverCount {
    /// The device.
    pub device: u32,
    /// Bytes held now through counted calls.
    pub held_bytes: u64,
    /// The most held at once since the process started.
    pub lifetime_peak_bytes: u64,
    /// Allocations on it that failed with out-of-memory.
    pub oom_failures: u64,
}

/// The interposer's counts of this process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OomDriverCounts {
    /// Devices with anything counted.
    pub devices: Vec<OomDriverCount>,
    /// Pinned host bytes held now.
    pub host_pinned_bytes: u64,
    /// Successful allocations that could not be counted.
    pub not_counted_calls: u64,
    /// Their bytes, where known.
    pub not_counted_bytes: u64,
}

/// The GPU part of a report, supplied from above (memprobe-gpu): it is
/// called on the thread of the trigger — for a driver trigger, inside the
/// failing allocation — so it must make no CUDA call.
pub trait OomGpuProvider: Send + Sync {
    /// Each GPU with its per-process use, or why there is none.
    fn devices(&self) -> std::result::Result<Vec<OomGpuDevice>, String>;
    /// What this process holds per device through the driver, or why it is
    /// not known.
    fn driver_counts(&self) -> std::result::Result<OomDriverCounts, String>;
    /// What this process held by origin where `failed` failed, or why it
    /// is not known. By default: not known.
    fn held_by_origin(
        &self,
        failed: &FailedAllocation,
    ) -> std::result::Result<OomHeldByOrigin, String> {
        let _ = failed;
        Err("this GPU provider names no origins".to_owned())
    }
}

/// What releasing caches would free on one device, as far as is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheLine {
    /// The device.
    pub device: u32,
    /// The framework whose figures these are.
    pub framework: Option<String>,
    /// Bytes its cache holds from the driver.
    pub reserved_bytes: Option<u64>,
    /// Bytes of it in use by the program.
    pub allocated_bytes: Option<u64>,
    /// Bytes releasing the cache would free: the framework's own figure;
    /// `None` when unknown.
    pub releasable_bytes: Option<u64>,
    /// Bytes this process holds through counted driver calls (everything a
    /// release could give back is among them).
    pub driver_held_bytes: Option<u64>,
    /// How `releasable_bytes` is known, or why it is not.
    pub basis: String,
}

/// The complete report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemoryReport {
    /// This process.
    pub pid: u32,
    /// When the report was built, Unix nanoseconds.
    pub written_at_unix_ns: u64,
    /// When the report was built, `CLOCK_MONOTONIC` nanoseconds.
    pub written_at_ns: u64,
    /// The allocation that failed.
    pub failed: FailedAllocation,
    /// The tracker's sources.
    pub sources: Vec<SourceInfo>,
    /// The open phases, outermost first, or why they are missing (the
    /// tracker was busy when the driver's trigger fired).
    pub open_phases: std::result::Result<Vec<OpenPhase>, String>,
    /// The last ended phases, oldest first.
    pub ended_phases: Vec<Record>,
    /// How many ended phases are kept.
    pub keep_ended: usize,
    /// Phases ended since the report was configured.
    pub ended_total: u64,
    /// The GPUs, or why they could not be read.
    pub gpus: std::result::Result<Vec<OomGpuDevice>, String>,
    /// The interposer's counts, or why they are not known.
    pub driver_counts: std::result::Result<OomDriverCounts, String>,
    /// What held the failing device's memory, by origin, or why it is not
    /// known.
    pub held_by_origin: std::result::Result<OomHeldByOrigin, String>,
    /// Reports written before this one by the same configuration (re-armed).
    pub reports_before: u64,
    /// Triggers after this report, not written: how many.
    pub later_count: u64,
    /// The last of them.
    pub later_last: Option<FailedAllocation>,
}

impl OutOfMemoryReport {
    /// What releasing caches would free, per device: the failing device,
    /// every device a framework gave figures for, every device the
    /// interposer counted.
    pub fn caches(&self) -> Vec<CacheLine> {
        let counts = self.driver_counts.as_ref().ok();
        let mut devices: BTreeSet<u32> = BTreeSet::new();
        devices.extend(self.failed.location.device());
        devices.extend(self.failed.caches.iter().map(|c| c.device));
        if let Some(c) = counts {
            devices.extend(c.devices.iter().map(|d| d.device));
        }
        devices
            .into_iter()
            .map(|device| {
                let fw = self.failed.caches.iter().find(|c| c.device == device);
                let driver_held_bytes = counts.map(|c| {
                    c.devices
                        .iter()
                        .find(|d| d.device == device)
                        .map_or(0, |d| d.held_bytes)
                });
                let basis = match fw {
                    Some(f) if f.releasable_bytes.is_some() => {
                        format!(
                            "{}'s own account of what releasing its cache frees",
                            f.framework
                        )
                    }
                    Some(f) => match (f.reserved_bytes, f.allocated_bytes) {
                        (Some(r), Some(a)) => format!(
                            "{} holds {} bytes it does not use (reserved - allocated), \
                             but only its wholly free blocks could be released",
                            f.framework,
                            r.saturating_sub(a)
                        ),
                        _ => format!("{} gave no figure for it", f.framework),
                    },
                    None => "no framework reported its cache on this device".to_owned(),
                };
                CacheLine {
                    device,
                    framework: fw.map(|f| f.framework.clone()),
                    reserved_bytes: fw.and_then(|f| f.reserved_bytes),
                    allocated_bytes: fw.and_then(|f| f.allocated_bytes),
                    releasable_bytes: fw.and_then(|f| f.releasable_bytes),
                    driver_held_bytes,
                    basis,
                }
            })
            .collect()
    }
}

// ---- what held the memory, by origin (supplied by the GPU provider) ----

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
    /// The same bytes by call path, largest first, where the interposer
    /// keeps paths (`MEMPROBE_GPU_ORIGINS=stacks[:N]`); empty otherwise.
    pub by_stack: Vec<OomStackBytes>,
}

/// The bytes one call path held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomStackBytes {
    /// `library!symbol` (or `library+0xOFFSET`), innermost first: the
    /// origin's frame, then its callers.
    pub frames: Vec<String>,
    /// Bytes it held.
    pub bytes: u64,
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
