//! Out-of-memory forensics: when an allocation fails for lack of memory, one
//! report of what the training loop was doing, so that "why did my job die at
//! epoch 3 of 40?" has an answer.
//!
//! A [`Tracker`](crate::Tracker) configured with [`OomReportOptions`] keeps
//! a bounded ring of its last ended phases. A *trigger* — the GPU driver
//! failing an allocation (seen by memprobe's interposer, wired up by
//! memprobe-gpu), or the caller reporting a framework's out-of-memory error
//! ([`Tracker::report_oom`](crate::Tracker::report_oom)) — builds an
//! [`OutOfMemoryReport`]: the failed allocation, the open phases with each source's
//! peak so far, the last ended phases, each GPU's per-process use and what
//! releasing caches would free (asked of an [`OomGpuProvider`] supplied from
//! above: the core has no GPU code). It is rendered as JSON
//! ([`OutOfMemoryReport::to_json`], schema `docs/oom-report.schema.json`) and as a
//! summary for people ([`OutOfMemoryReport::summary`]), and written to the chosen
//! destinations: a file (written whole, then renamed into place), a writer
//! for each rendering, a callback.
//!
//! **One report per arming.** The first trigger writes the report and
//! disarms; later triggers (a framework retrying a failed allocation a
//! thousand times) are only counted, with the last of them kept. When they
//! happened, the report file is written once more — with their count and
//! the last one — when the report is re-armed ([`OomReporter::rearm`]),
//! removed, or its tracker dropped; the other destinations receive the
//! first report only.
//!
//! Every figure that is not known is `null` in the JSON and "unknown" in
//! the summary, with the reason where there is one; never a 0 standing in.

use crate::delta::SourceDelta;
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::phase::PhaseKind;
use crate::sample::{monotonic_ns, PeakFidelity, SourceInfo, SourceKind};
use crate::sink::Record;
use crate::sinks::json;
use crate::sinks::AtomicFile;
use crate::source::Source;
use crate::window::Window;
use std::collections::{BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Ended phases kept for a report unless told otherwise.
pub const DEFAULT_KEEP_ENDED: usize = 8;

/// The most ended phases a report keeps.
pub const MAX_KEEP_ENDED: usize = 4096;

/// The `format` of the JSON document.
pub const FORMAT: &str = "memprobe-oom-report";

/// The `version` of the JSON document (bumped when a field changes meaning
/// or goes away; new fields may appear without a bump).
pub const FORMAT_VERSION: u32 = 1;

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

    fn as_str(self) -> &'static str {
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
        }
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
    /// Total, free and used bytes, or why they could not be read.
    pub memory: std::result::Result<(u64, u64, u64), String>,
    /// The processes using it, or why they could not be listed.
    pub processes: std::result::Result<Vec<OomGpuProcess>, String>,
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
    /// Reports written before this one by the same configuration (re-armed).
    pub reports_before: u64,
    /// Triggers after this report, not written: how many.
    pub later_count: u64,
    /// The last of them.
    pub later_last: Option<FailedAllocation>,
}

/// The caller's function receiving each report: the report, its JSON and
/// its summary.
pub type OomCallback = Box<dyn FnMut(&OutOfMemoryReport, &str, &str) + Send>;

/// How a tracker reports out-of-memory.
pub struct OomReportOptions {
    /// Which triggers write a report (at least one).
    pub triggers: OomTriggers,
    /// Ended phases kept (0 to [`MAX_KEEP_ENDED`]).
    pub keep_ended: usize,
    /// A file for the JSON: written under a temporary name beside it and
    /// renamed into place, so it appears complete or not at all.
    pub path: Option<PathBuf>,
    /// A writer for the JSON (one document and a newline).
    pub json_writer: Option<Box<dyn Write + Send>>,
    /// A writer for the summary.
    pub summary_writer: Option<Box<dyn Write + Send>>,
    /// A function receiving each report.
    pub callback: Option<OomCallback>,
    /// The GPU part; `None` reports the GPUs as unavailable.
    pub gpu: Option<Arc<dyn OomGpuProvider>>,
}

impl Default for OomReportOptions {
    /// The caller's trigger, the default ring, no destination yet.
    fn default() -> Self {
        OomReportOptions {
            triggers: OomTriggers {
                driver: false,
                caller: true,
            },
            keep_ended: DEFAULT_KEEP_ENDED,
            path: None,
            json_writer: None,
            summary_writer: None,
            callback: None,
            gpu: None,
        }
    }
}

impl std::fmt::Debug for OomReportOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OomReportOptions")
            .field("triggers", &self.triggers)
            .field("keep_ended", &self.keep_ended)
            .field("path", &self.path)
            .field("json_writer", &self.json_writer.is_some())
            .field("summary_writer", &self.summary_writer.is_some())
            .field("callback", &self.callback.is_some())
            .field("gpu", &self.gpu.is_some())
            .finish()
    }
}

/// Where a reporter stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomStatus {
    /// The next trigger writes a report.
    pub armed: bool,
    /// The configured triggers.
    pub triggers: OomTriggers,
    /// Reports written (one per arming).
    pub reports_written: u64,
    /// Triggers seen, written or not.
    pub triggers_seen: u64,
    /// Triggers since the last report, counted and not written.
    pub later_triggers: u64,
    /// The last write's failure, if it failed.
    pub last_error: Option<Error>,
}

/// What a trigger did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomOutcome {
    /// The report was written (to every destination that could take it).
    Written,
    /// A report was already written: this trigger was counted in it.
    Counted,
}

/// What the reporter decides and counts. Never held while a report is
/// built or written, so a phase that ends meanwhile does not wait for one.
struct State {
    triggers: OomTriggers,
    keep_ended: usize,
    sources: Vec<SourceInfo>,
    gpu: Option<Arc<dyn OomGpuProvider>>,
    ended: VecDeque<Record>,
    ended_total: u64,
    armed: bool,
    closed: bool,
    reports_written: u64,
    triggers_seen: u64,
    later: u64,
    later_last: Option<FailedAllocation>,
    /// The last report, kept to write its file again with the later count.
    last_report: Option<OutOfMemoryReport>,
    last_error: Option<Error>,
    attachment: Option<Box<dyn Send>>,
}

/// Where reports go; held while one is built and written, which orders
/// the triggers. Taken before [`State`] when both are needed, never after.
struct Outputs {
    path: Option<PathBuf>,
    json_writer: Option<Box<dyn Write + Send>>,
    summary_writer: Option<Box<dyn Write + Send>>,
    callback: Option<OomCallback>,
}

struct Shared {
    state: Lock<State>,
    out: Lock<Outputs>,
}

/// A tracker's out-of-memory reporter, shared with hooks that fire outside
/// the tracker's calls (the GPU driver's). Cheap to clone.
#[derive(Clone)]
pub struct OomReporter {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for OomReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OomReporter")
            .field("status", &self.status().ok())
            .finish()
    }
}

fn check_options(o: &OomReportOptions) -> Result<()> {
    if !o.triggers.driver && !o.triggers.caller {
        return Err(Error::invalid(
            "an out-of-memory report needs a trigger (driver, caller or both)",
        ));
    }
    if o.keep_ended > MAX_KEEP_ENDED {
        return Err(Error::invalid(format!(
            "an out-of-memory report keeps at most {MAX_KEEP_ENDED} ended phases, not {}",
            o.keep_ended
        )));
    }
    if o.path.is_none()
        && o.json_writer.is_none()
        && o.summary_writer.is_none()
        && o.callback.is_none()
    {
        return Err(Error::invalid(
            "an out-of-memory report needs a destination (a path, a writer or a callback)",
        ));
    }
    if let Some(p) = &o.path {
        // Refuses a directory, a missing directory or an unwritable one
        // now, not at the failure; the probe file is removed at once.
        drop(AtomicFile::create(p)?);
    }
    Ok(())
}

fn removed() -> Error {
    Error::wrong_order("the out-of-memory report was removed")
}

impl OomReporter {
    fn new(options: OomReportOptions, sources: Vec<SourceInfo>) -> Result<OomReporter> {
        check_options(&options)?;
        let keep = options.keep_ended;
        Ok(OomReporter {
            shared: Arc::new(Shared {
                state: Lock::new(State {
                    triggers: options.triggers,
                    keep_ended: keep,
                    sources,
                    gpu: options.gpu,
                    ended: VecDeque::with_capacity(keep.min(64)),
                    ended_total: 0,
                    armed: true,
                    closed: false,
                    reports_written: 0,
                    triggers_seen: 0,
                    later: 0,
                    later_last: None,
                    last_report: None,
                    last_error: None,
                    attachment: None,
                }),
                out: Lock::new(Outputs {
                    path: options.path,
                    json_writer: options.json_writer,
                    summary_writer: options.summary_writer,
                    callback: options.callback,
                }),
            }),
        })
    }

    /// Where the reporter stands.
    pub fn status(&self) -> Result<OomStatus> {
        let st = self.shared.state.lock()?;
        Ok(OomStatus {
            armed: st.armed && !st.closed,
            triggers: st.triggers,
            reports_written: st.reports_written,
            triggers_seen: st.triggers_seen,
            later_triggers: st.later,
            last_error: st.last_error.clone(),
        })
    }

    /// Whether the next trigger writes a report (a hook measures the open
    /// phases only then).
    pub fn armed(&self) -> bool {
        self.shared.state.lock().is_ok_and(|s| s.armed && !s.closed)
    }

    /// Whether the reporter was removed or its tracker dropped: hooks
    /// holding it stop.
    pub fn is_closed(&self) -> bool {
        self.shared.state.lock().map_or(true, |s| s.closed)
    }

    /// Whether `trigger` is configured.
    pub fn accepts(&self, trigger: OomTrigger) -> bool {
        self.shared.state.lock().is_ok_and(|s| {
            !s.closed
                && match trigger {
                    OomTrigger::Driver => s.triggers.driver,
                    OomTrigger::Caller => s.triggers.caller,
                }
        })
    }

    /// Keeps `guard` alive as long as the reporter (e.g. the driver hook's
    /// subscription, which ends when it is dropped).
    pub fn attach(&self, guard: Box<dyn Send>) -> Result<()> {
        let old = {
            let mut st = self.shared.state.lock()?;
            if st.closed {
                return Err(removed());
            }
            st.attachment.replace(guard)
        };
        drop(old);
        Ok(())
    }

    /// Arms the reporter again: the next trigger writes a new report
    /// (replacing the file). When triggers were counted since the last
    /// report, its file is first written again with their count.
    pub fn rearm(&self) -> Result<()> {
        let mut out = self.shared.out.lock()?;
        if self.is_closed() {
            return Err(removed());
        }
        let done = self.settle_later(&mut out);
        self.shared.state.lock()?.armed = true;
        done
    }

    /// Handles one trigger: writes the report if armed, else counts it.
    /// `open` is the open phases measured by the caller (or why not).
    ///
    /// # Errors
    /// [`ErrorKind::WrongOrder`](crate::ErrorKind::WrongOrder) when the
    /// reporter was removed or `failed`'s trigger is not configured, or when
    /// called from a report's own callback; the first destination's write
    /// error (the others are still written, and the reporter is disarmed all
    /// the same).
    pub fn trigger(
        &self,
        failed: FailedAllocation,
        open: std::result::Result<Vec<OpenPhase>, String>,
    ) -> Result<OomOutcome> {
        let mut out = self.shared.out.lock()?;
        let (report, gpu) = {
            let mut st = self.shared.state.lock()?;
            if st.closed {
                return Err(removed());
            }
            let wanted = match failed.trigger {
                OomTrigger::Driver => st.triggers.driver,
                OomTrigger::Caller => st.triggers.caller,
            };
            if !wanted {
                return Err(Error::wrong_order(format!(
                    "out-of-memory reports are not configured for the {} trigger",
                    failed.trigger.as_str()
                )));
            }
            st.triggers_seen += 1;
            if !st.armed {
                st.later += 1;
                st.later_last = Some(failed);
                return Ok(OomOutcome::Counted);
            }
            st.armed = false;
            st.later = 0;
            st.later_last = None;
            let report = OutOfMemoryReport {
                pid: std::process::id(),
                written_at_unix_ns: unix_ns(),
                written_at_ns: monotonic_ns(),
                failed,
                sources: st.sources.clone(),
                open_phases: open,
                ended_phases: st.ended.iter().cloned().collect(),
                keep_ended: st.keep_ended,
                ended_total: st.ended_total,
                gpus: Err(String::new()),
                driver_counts: Err(String::new()),
                reports_before: st.reports_written,
                later_count: 0,
                later_last: None,
            };
            st.reports_written += 1;
            (report, st.gpu.clone())
        };
        // The GPUs are read without the state's lock.
        let mut report = report;
        const NONE: &str = "no GPU provider was given to this tracker";
        report.gpus = gpu
            .as_ref()
            .map_or_else(|| Err(NONE.to_owned()), |g| g.devices());
        report.driver_counts = gpu
            .as_ref()
            .map_or_else(|| Err(NONE.to_owned()), |g| g.driver_counts());
        let done = out.write(&report, true);
        let mut st = self.shared.state.lock()?;
        st.last_error = done.as_ref().err().cloned();
        st.last_report = Some(report);
        done.map(|()| OomOutcome::Written)
    }

    /// A phase ended: keep it in the ring.
    pub(crate) fn on_record(&self, record: &Record) {
        // Refused only on re-entry (a report's callback ending a phase):
        // that record is then not in the ring, nothing else is lost.
        if let Ok(mut st) = self.shared.state.lock() {
            if st.closed {
                return;
            }
            st.ended_total += 1;
            let keep = st.keep_ended;
            if keep == 0 {
                return;
            }
            while st.ended.len() >= keep {
                st.ended.pop_front();
            }
            st.ended.push_back(record.clone());
        }
    }

    /// The tracker is done with it (dropped, or the report removed):
    /// counted triggers are settled, hooks stop, the attachment goes.
    pub(crate) fn close(&self) {
        let Ok(mut out) = self.shared.out.lock() else {
            return;
        };
        if self.is_closed() {
            return;
        }
        let _ = self.settle_later(&mut out);
        let attachment = match self.shared.state.lock() {
            Ok(mut st) => {
                st.closed = true;
                st.attachment.take()
            }
            Err(_) => None,
        };
        drop(out);
        // Dropped without the locks: ending a subscription takes another.
        drop(attachment);
    }

    /// Writes the last report's file again with the triggers counted since
    /// (when there were any), then forgets them. `out` is held by the caller.
    fn settle_later(&self, out: &mut Outputs) -> Result<()> {
        let report = {
            let mut st = self.shared.state.lock()?;
            if st.later == 0 {
                return Ok(());
            }
            let count = std::mem::take(&mut st.later);
            let last = st.later_last.take();
            st.last_report.as_mut().map(|r| {
                r.later_count = count;
                r.later_last = last;
                r.clone()
            })
        };
        let Some(report) = report else {
            return Ok(());
        };
        let done = out.write(&report, false);
        if let Err(e) = &done {
            self.shared.state.lock()?.last_error = Some(e.clone());
        }
        done
    }
}

impl Outputs {
    /// Writes the report to every destination (`first`: the writers and the
    /// callback too; a rewrite goes to the file only). Returns the first
    /// error.
    fn write(&mut self, report: &OutOfMemoryReport, first: bool) -> Result<()> {
        let json = report.to_json();
        let mut errors: Vec<Error> = Vec::new();
        if let Some(path) = &self.path {
            let done = AtomicFile::create(path).and_then(|f| {
                f.write(json.as_bytes())?;
                f.write(b"\n")?;
                f.finish()
            });
            if let Err(e) = done {
                errors.push(e);
            }
        }
        if !first {
            return errors.into_iter().next().map_or(Ok(()), Err);
        }
        let summary = report.summary();
        if let Some(w) = self.json_writer.as_mut() {
            let mut doc = json.clone();
            doc.push('\n');
            if let Err(e) = w.write_all(doc.as_bytes()).and_then(|()| w.flush()) {
                errors.push(Error::io("out-of-memory report (JSON writer)", &e));
            }
        }
        if let Some(w) = self.summary_writer.as_mut() {
            if let Err(e) = w.write_all(summary.as_bytes()).and_then(|()| w.flush()) {
                errors.push(Error::io("out-of-memory report (summary writer)", &e));
            }
        }
        if let Some(cb) = self.callback.as_mut() {
            cb(report, &json, &summary);
        }
        errors.into_iter().next().map_or(Ok(()), Err)
    }
}

/// Configures `slot` (a tracker's) with `options`, or removes it with `None`.
pub(crate) fn configure(
    slot: &mut Option<OomReporter>,
    options: Option<OomReportOptions>,
    sources: &[Source],
) -> Result<Option<OomReporter>> {
    match options {
        None => {
            if let Some(r) = slot.take() {
                r.close();
            }
            Ok(None)
        }
        Some(o) => {
            if slot.is_some() {
                return Err(Error::wrong_order(
                    "an out-of-memory report is already configured for this tracker; remove it \
                     first (or re-arm it)",
                ));
            }
            let infos = sources.iter().map(|s| s.info().clone()).collect();
            let r = OomReporter::new(o, infos)?;
            *slot = Some(r.clone());
            Ok(Some(r))
        }
    }
}

/// The caller's trigger on `slot` (a tracker's): measures the open phases
/// (`open`) only when the report will be written.
pub(crate) fn report(
    slot: Option<&OomReporter>,
    failed: FailedAllocation,
    open: impl FnOnce() -> Vec<OpenPhase>,
) -> Result<OomOutcome> {
    let Some(r) = slot else {
        return Err(Error::wrong_order(
            "no out-of-memory report is configured for this tracker",
        ));
    };
    crate::sample::check_name(
        "the name of who reports an out-of-memory failure",
        &failed.reported_by,
    )?;
    if !r.accepts(failed.trigger) {
        return Err(Error::wrong_order(format!(
            "out-of-memory reports are not configured for the {} trigger",
            failed.trigger.as_str()
        )));
    }
    let phases = if r.armed() {
        Ok(open())
    } else {
        Err("not measured: a report was already written".to_owned())
    };
    r.trigger(failed, phases)
}

/// `CLOCK_REALTIME` in nanoseconds since the Unix epoch (0 before it).
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, crate::sample::duration_ns)
}

// ---- JSON ------------------------------------------------------------------

fn opt_u64(out: &mut String, v: Option<u64>) {
    match v {
        Some(n) => {
            let _ = write!(out, "{n}");
        }
        None => out.push_str("null"),
    }
}

fn opt_str(out: &mut String, v: Option<&str>) {
    match v {
        Some(s) => json::string(out, s),
        None => out.push_str("null"),
    }
}

fn key(out: &mut String, first: bool, k: &str) {
    if !first {
        out.push(',');
    }
    out.push('"');
    out.push_str(k);
    out.push_str("\":");
}

fn failed_json(out: &mut String, f: &FailedAllocation) {
    out.push('{');
    key(out, true, "trigger");
    json::string(out, f.trigger.as_str());
    key(out, false, "location");
    json::string(out, f.location.as_str());
    key(out, false, "device");
    opt_u64(out, f.location.device().map(u64::from));
    key(out, false, "requested_bytes");
    opt_u64(out, f.requested_bytes);
    key(out, false, "reported_by");
    json::string(out, &f.reported_by);
    key(out, false, "detail");
    opt_str(out, f.detail.as_deref());
    let _ = write!(
        out,
        ",\"at_monotonic_ns\":{},\"at_unix_ns\":{}",
        f.at_ns, f.at_unix_ns
    );
    key(out, false, "device_total_bytes");
    opt_u64(out, f.device_total_bytes);
    key(out, false, "device_free_bytes");
    opt_u64(out, f.device_free_bytes);
    key(out, false, "driver_oom_failures");
    opt_u64(out, f.driver_oom_failures);
    out.push('}');
}

fn section_head(out: &mut String, name: &str, reason: Option<&str>) {
    let _ = write!(out, ",\"{name}\":{{\"available\":{}", reason.is_none());
    key(out, false, "reason");
    opt_str(out, reason);
}

fn open_json(out: &mut String, p: &OpenPhase, now: u64) {
    out.push_str("{\"kind\":");
    json::string(out, p.kind.as_str());
    out.push_str(",\"name\":");
    json::string(out, &p.name);
    let _ = write!(
        out,
        ",\"index\":{},\"depth\":{},\"started_at_ns\":{},\"running_ns\":{},\"sources\":",
        p.index,
        p.depth,
        p.started_at_ns,
        now.saturating_sub(p.started_at_ns)
    );
    json::list(out, &p.sources, |o, s| {
        o.push_str("{\"name\":");
        json::string(o, &s.name);
        let _ = write!(
            o,
            ",\"kind\":\"{}\",\"fidelity\":\"{}\",\"used_start\":{}",
            s.kind.as_str(),
            s.fidelity.as_str(),
            s.used_start
        );
        key(o, false, "used_now");
        opt_u64(o, s.used_now);
        key(o, false, "peak");
        opt_u64(o, s.peak);
        key(o, false, "error");
        opt_str(o, s.error.as_deref());
        o.push('}');
    });
    out.push('}');
}

fn device_json(out: &mut String, d: &OomGpuDevice) {
    let _ = write!(out, "{{\"id\":{}", d.id);
    key(out, false, "name");
    opt_str(out, d.name.as_deref());
    key(out, false, "uuid");
    opt_str(out, d.uuid.as_deref());
    let (mem, mem_err) = match &d.memory {
        Ok(m) => (Some(*m), None),
        Err(e) => (None, Some(e.as_str())),
    };
    key(out, false, "total_bytes");
    opt_u64(out, mem.map(|m| m.0));
    key(out, false, "free_bytes");
    opt_u64(out, mem.map(|m| m.1));
    key(out, false, "used_bytes");
    opt_u64(out, mem.map(|m| m.2));
    key(out, false, "memory_error");
    opt_str(out, mem_err);
    key(out, false, "processes");
    match &d.processes {
        Ok(ps) => json::list(out, ps, |o, p| {
            let _ = write!(o, "{{\"pid\":{},\"used_bytes\":", p.pid);
            opt_u64(o, p.used_bytes);
            let _ = write!(
                o,
                ",\"list\":\"{}\",\"this_process\":{}}}",
                match p.list {
                    OomProcessList::Compute => "compute",
                    OomProcessList::Graphics => "graphics",
                },
                p.this_process
            );
        }),
        Err(_) => out.push_str("[]"),
    }
    key(out, false, "processes_error");
    opt_str(out, d.processes.as_ref().err().map(String::as_str));
    out.push('}');
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

    /// The report as one JSON document (`docs/oom-report.schema.json`).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(4096);
        let _ = write!(
            out,
            "{{\"format\":\"{FORMAT}\",\"version\":{FORMAT_VERSION},\"pid\":{},\"written_at_unix_ns\":{},\"written_at_monotonic_ns\":{}",
            self.pid, self.written_at_unix_ns, self.written_at_ns
        );
        key(&mut out, false, "failed_allocation");
        failed_json(&mut out, &self.failed);
        key(&mut out, false, "sources");
        json::list(&mut out, &self.sources, |o, s| {
            o.push_str("{\"name\":");
            json::string(o, &s.name);
            let _ = write!(
                o,
                ",\"kind\":\"{}\",\"fidelity\":\"{}\"}}",
                s.kind.as_str(),
                s.fidelity.as_str()
            );
        });
        section_head(
            &mut out,
            "open_phases",
            self.open_phases.as_ref().err().map(String::as_str),
        );
        key(&mut out, false, "phases");
        let now = self.written_at_ns;
        match &self.open_phases {
            Ok(ps) => json::list(&mut out, ps, |o, p| open_json(o, p, now)),
            Err(_) => out.push_str("[]"),
        }
        out.push('}');
        let _ = write!(
            out,
            ",\"ended_phases\":{{\"kept\":{},\"ended_total\":{},\"phases\":",
            self.keep_ended, self.ended_total
        );
        json::list(&mut out, &self.ended_phases, |o, r| {
            o.push_str(&json::record(r))
        });
        out.push('}');
        section_head(
            &mut out,
            "gpus",
            self.gpus.as_ref().err().map(String::as_str),
        );
        key(&mut out, false, "devices");
        match &self.gpus {
            Ok(ds) => json::list(&mut out, ds, device_json),
            Err(_) => out.push_str("[]"),
        }
        out.push('}');
        section_head(
            &mut out,
            "driver_counts",
            self.driver_counts.as_ref().err().map(String::as_str),
        );
        let counts = self.driver_counts.as_ref().ok();
        key(&mut out, false, "devices");
        match counts {
            Some(c) => json::list(&mut out, &c.devices, |o, d| {
                let _ = write!(
                    o,
                    "{{\"device\":{},\"held_bytes\":{},\"lifetime_peak_bytes\":{},\"oom_failures\":{}}}",
                    d.device, d.held_bytes, d.lifetime_peak_bytes, d.oom_failures
                );
            }),
            None => out.push_str("[]"),
        }
        key(&mut out, false, "host_pinned_bytes");
        opt_u64(&mut out, counts.map(|c| c.host_pinned_bytes));
        key(&mut out, false, "not_counted_calls");
        opt_u64(&mut out, counts.map(|c| c.not_counted_calls));
        key(&mut out, false, "not_counted_bytes");
        opt_u64(&mut out, counts.map(|c| c.not_counted_bytes));
        out.push('}');
        key(&mut out, false, "caches");
        json::list(&mut out, &self.caches(), |o, c| {
            let _ = write!(o, "{{\"device\":{}", c.device);
            key(o, false, "framework");
            opt_str(o, c.framework.as_deref());
            key(o, false, "reserved_bytes");
            opt_u64(o, c.reserved_bytes);
            key(o, false, "allocated_bytes");
            opt_u64(o, c.allocated_bytes);
            key(o, false, "releasable_bytes");
            opt_u64(o, c.releasable_bytes);
            key(o, false, "driver_held_bytes");
            opt_u64(o, c.driver_held_bytes);
            key(o, false, "basis");
            json::string(o, &c.basis);
            o.push('}');
        });
        let _ = write!(
            out,
            ",\"reports_before\":{},\"later_triggers\":{{\"count\":{},\"last\":",
            self.reports_before, self.later_count
        );
        match &self.later_last {
            Some(f) => failed_json(&mut out, f),
            None => out.push_str("null"),
        }
        out.push_str("}}");
        out
    }

    /// The report for people: a few lines, sizes in KiB / MiB / GiB.
    pub fn summary(&self) -> String {
        let mut s = String::with_capacity(2048);
        let f = &self.failed;
        let _ = writeln!(
            s,
            "memprobe: out-of-memory report (pid {}, {} UTC)",
            self.pid,
            utc(f.at_unix_ns)
        );
        let place = match f.location {
            OomLocation::Device(d) => format!("GPU {d}"),
            OomLocation::HostPinned => "pinned host memory".to_owned(),
            OomLocation::Unknown => "an unknown device".to_owned(),
        };
        let asked = f
            .requested_bytes
            .map_or_else(|| "an unknown size".to_owned(), bytes);
        let _ = write!(
            s,
            "  failed: {} asked {asked} on {place} ({} trigger)",
            f.reported_by,
            f.trigger.as_str()
        );
        if let Some(free) = f.device_free_bytes {
            let _ = write!(s, "; {} free", bytes(free));
            if let Some(t) = f.device_total_bytes {
                let _ = write!(s, " of {}", bytes(t));
            }
        }
        s.push('\n');
        if let Some(d) = &f.detail {
            let _ = writeln!(s, "  detail: {}", one_line(d, 200));
        }
        match &self.open_phases {
            Ok(ps) if ps.is_empty() => s.push_str("  open phases: none\n"),
            Ok(ps) => {
                s.push_str("  open phases (outermost first):\n");
                for p in ps {
                    let _ = write!(
                        s,
                        "    {:<12} for {:>8}:",
                        format!("{} #{}", p.name, p.index),
                        seconds(self.written_at_ns.saturating_sub(p.started_at_ns))
                    );
                    for (i, src) in p.sources.iter().enumerate() {
                        let sep = if i == 0 { " " } else { "; " };
                        match (src.peak, src.used_now) {
                            (Some(peak), Some(now)) => {
                                let _ = write!(
                                    s,
                                    "{sep}{} peak {} (start {}, now {})",
                                    src.name,
                                    bytes(peak),
                                    bytes(src.used_start),
                                    bytes(now)
                                );
                            }
                            _ => {
                                let _ = write!(
                                    s,
                                    "{sep}{} unknown ({})",
                                    src.name,
                                    src.error.as_deref().unwrap_or("not read")
                                );
                            }
                        }
                    }
                    s.push('\n');
                }
            }
            Err(why) => {
                let _ = writeln!(s, "  open phases: unknown ({why})");
            }
        }
        if self.ended_phases.is_empty() {
            s.push_str("  ended phases: none yet\n");
        } else {
            let _ = writeln!(
                s,
                "  last {} ended phases (of {}):",
                self.ended_phases.len(),
                self.ended_total
            );
            for r in &self.ended_phases {
                let name = r
                    .phase
                    .as_ref()
                    .map_or_else(|| r.label.clone(), |p| format!("{} #{}", p.name, p.index));
                let _ = write!(s, "    {name:<12} {:>8}:", seconds(r.duration_ns()));
                for (i, d) in r.sources.iter().enumerate() {
                    let sep = if i == 0 { " " } else { "; " };
                    let _ = write!(s, "{sep}{} peak {}", d.name, bytes(d.peak));
                    s.push_str(&delta_note(d));
                }
                s.push('\n');
            }
        }
        match &self.gpus {
            Ok(ds) if ds.is_empty() => s.push_str("  GPUs: none visible\n"),
            Ok(ds) => {
                s.push_str("  GPUs:\n");
                for d in ds {
                    let name = d.name.as_deref().unwrap_or("unnamed");
                    match &d.memory {
                        Ok((total, free, used)) => {
                            let _ = writeln!(
                                s,
                                "    GPU {} ({name}): {} used of {}, {} free",
                                d.id,
                                bytes(*used),
                                bytes(*total),
                                bytes(*free)
                            );
                        }
                        Err(e) => {
                            let _ = writeln!(s, "    GPU {} ({name}): memory unknown ({e})", d.id);
                        }
                    }
                    match &d.processes {
                        Ok(ps) if ps.is_empty() => s.push_str("      no process listed\n"),
                        Ok(ps) => {
                            for p in ps {
                                let _ = writeln!(
                                    s,
                                    "      pid {}{}: {}",
                                    p.pid,
                                    if p.this_process {
                                        " (this process)"
                                    } else {
                                        ""
                                    },
                                    p.used_bytes.map_or_else(|| "unknown".to_owned(), bytes)
                                );
                            }
                        }
                        Err(e) => {
                            let _ = writeln!(s, "      processes unknown ({e})");
                        }
                    }
                }
            }
            Err(why) => {
                let _ = writeln!(s, "  GPUs: unavailable ({why})");
            }
        }
        if let Err(why) = &self.driver_counts {
            let _ = writeln!(s, "  driver counts: unavailable ({why})");
        }
        for c in self.caches() {
            let releasable = c
                .releasable_bytes
                .map_or_else(|| "unknown".to_owned(), bytes);
            let _ = write!(s, "  releasing caches on GPU {}: {releasable}", c.device);
            if c.releasable_bytes.is_none() {
                let _ = write!(s, " ({})", c.basis);
            } else if let Some(fw) = &c.framework {
                let _ = write!(s, " ({fw})");
            }
            if let Some(h) = c.driver_held_bytes {
                let _ = write!(s, "; this process holds {} through the driver", bytes(h));
            }
            s.push('\n');
        }
        if self.later_count > 0 {
            let _ = writeln!(
                s,
                "  {} later out-of-memory failures were counted, not reported",
                self.later_count
            );
        }
        s
    }
}

fn delta_note(d: &SourceDelta) -> String {
    let sign = if d.delta_used < 0 { "-" } else { "+" };
    format!(
        " (used {sign}{}, peaked {})",
        bytes(d.delta_used.unsigned_abs()),
        bytes(d.delta_peaked)
    )
}

fn one_line(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if s.chars().count() > max {
        out.push_str("...");
    }
    out
}

/// `bytes` for people: B, KiB, MiB, GiB, TiB (powers of 1024).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

fn seconds(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

/// `YYYY-MM-DDTHH:MM:SS.mmm` of Unix nanoseconds (UTC, proleptic Gregorian).
fn utc(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let millis = (unix_ns / 1_000_000) % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, PhaseKind, Tracker};
    use std::sync::Mutex;

    /// A writer into shared memory, for the tests.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    struct FakeGpu;

    impl OomGpuProvider for FakeGpu {
        fn devices(&self) -> std::result::Result<Vec<OomGpuDevice>, String> {
            Ok(vec![OomGpuDevice {
                id: 0,
                name: Some("Fake \"GPU\"".into()),
                uuid: None,
                memory: Ok((16 << 30, 1 << 20, (16 << 30) - (1 << 20))),
                processes: Ok(vec![
                    OomGpuProcess {
                        pid: std::process::id(),
                        used_bytes: Some(12 << 30),
                        list: OomProcessList::Compute,
                        this_process: true,
                    },
                    OomGpuProcess {
                        pid: 4242,
                        used_bytes: None,
                        list: OomProcessList::Graphics,
                        this_process: false,
                    },
                ]),
            }])
        }
        fn driver_counts(&self) -> std::result::Result<OomDriverCounts, String> {
            Err("the interposer is not loaded".into())
        }
    }

    fn tracker() -> Tracker {
        Tracker::new(&[Source::pushed("alloc").unwrap()]).unwrap()
    }

    fn options(buf: &Buf) -> OomReportOptions {
        OomReportOptions {
            json_writer: Some(Box::new(buf.clone())),
            gpu: Some(Arc::new(FakeGpu)),
            ..OomReportOptions::default()
        }
    }

    #[test]
    fn configuration_is_checked() {
        let mut t = tracker();
        let e = t
            .set_oom_report(Some(OomReportOptions::default()))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.message().contains("destination"), "{e}");
        let buf = Buf::default();
        let mut o = options(&buf);
        o.triggers = OomTriggers::default();
        assert!(t.set_oom_report(Some(o)).is_err());
        let mut o = options(&buf);
        o.keep_ended = MAX_KEEP_ENDED + 1;
        assert!(t.set_oom_report(Some(o)).is_err());
        let mut o = options(&buf);
        o.path = Some("/nonexistent-memprobe-dir/x.json".into());
        assert_eq!(
            t.set_oom_report(Some(o)).unwrap_err().kind(),
            ErrorKind::Unavailable
        );
        // Reporting before configuring, configuring twice.
        let f = FailedAllocation::new(OomTrigger::Caller, OomLocation::Device(0), Some(1), "x");
        assert_eq!(
            t.report_oom(f.clone()).unwrap_err().kind(),
            ErrorKind::WrongOrder
        );
        t.set_oom_report(Some(options(&buf))).unwrap();
        assert_eq!(
            t.set_oom_report(Some(options(&buf))).unwrap_err().kind(),
            ErrorKind::WrongOrder
        );
        // The driver trigger was not asked for.
        let d = FailedAllocation::new(OomTrigger::Driver, OomLocation::Unknown, None, "cu");
        assert_eq!(t.report_oom(d).unwrap_err().kind(), ErrorKind::WrongOrder);
        // Removed, then configured again.
        t.set_oom_report(None).unwrap();
        t.set_oom_report(None).unwrap();
        assert_eq!(t.report_oom(f).unwrap_err().kind(), ErrorKind::WrongOrder);
        t.set_oom_report(Some(options(&buf))).unwrap();
        assert!(buf.text().is_empty(), "nothing written before a trigger");
    }

    #[test]
    fn the_first_trigger_writes_later_ones_are_counted() {
        let dir = std::env::temp_dir().join(format!("memprobe-oom-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("oom.json");
        let alloc = Source::pushed("alloc").unwrap();
        let mut t = Tracker::new(std::slice::from_ref(&alloc)).unwrap();
        let json_buf = Buf::default();
        let summary_buf = Buf::default();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen2 = seen.clone();
        let reporter = t
            .set_oom_report(Some(OomReportOptions {
                keep_ended: 2,
                path: Some(path.clone()),
                json_writer: Some(Box::new(json_buf.clone())),
                summary_writer: Some(Box::new(summary_buf.clone())),
                callback: Some(Box::new(move |r, j, _| {
                    assert_eq!(r.to_json(), j);
                    seen2.lock().unwrap().push(j.to_owned());
                })),
                gpu: Some(Arc::new(FakeGpu)),
                ..OomReportOptions::default()
            }))
            .unwrap()
            .unwrap();
        assert!(!path.exists());
        t.begin(PhaseKind::Epoch, None).unwrap();
        t.begin(PhaseKind::Step, None).unwrap();
        for i in 0..3u64 {
            alloc.push(100 + i).unwrap();
            alloc.push(10).unwrap();
            t.next(PhaseKind::Step, None).unwrap();
        }
        alloc.push(5000).unwrap();
        let mut f = FailedAllocation::new(
            OomTrigger::Caller,
            OomLocation::Device(1),
            Some(1 << 40),
            "torch",
        );
        f.detail = Some("CUDA out of memory.\nTried to allocate 1 TiB".into());
        f.caches.push(CacheFigures {
            device: 1,
            framework: "torch".into(),
            reserved_bytes: Some(300),
            allocated_bytes: Some(100),
            releasable_bytes: None,
        });
        assert_eq!(t.report_oom(f.clone()).unwrap(), OomOutcome::Written);
        // A burst of retries: counted, not written.
        for _ in 0..1000 {
            assert_eq!(t.report_oom(f.clone()).unwrap(), OomOutcome::Counted);
        }
        let st = reporter.status().unwrap();
        assert!(!st.armed);
        assert_eq!(
            (st.reports_written, st.triggers_seen, st.later_triggers),
            (1, 1001, 1000)
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
        let first = std::fs::read_to_string(&path).unwrap();
        assert_eq!(json_buf.text(), first);
        assert!(first.ends_with("}\n"));
        assert!(first.contains("\"later_triggers\":{\"count\":0,\"last\":null}"));
        // The open phases, with the step's peak so far; the last two ended.
        assert!(first.contains("\"open_phases\":{\"available\":true,\"reason\":null,\"phases\":[{\"kind\":\"epoch\",\"name\":\"epoch\",\"index\":0,\"depth\":0"), "{first}");
        assert!(first.contains("\"kind\":\"step\",\"name\":\"step\",\"index\":3,\"depth\":1"));
        assert!(first.contains("\"used_start\":10,\"used_now\":5000,\"peak\":5000"));
        assert!(first.contains("\"kept\":2,\"ended_total\":3"));
        assert!(first.contains("\"index\":1,") && first.contains("\"peak\":102"));
        assert!(!first.contains("\"peak\":100,"), "step 0 left the ring");
        assert!(first.contains("\"detail\":\"CUDA out of memory.\\nTried to allocate 1 TiB\""));
        assert!(first.contains("\"releasable_bytes\":null"));
        assert!(first.contains("\"reserved_bytes\":300"));
        assert!(first.contains("Fake \\\"GPU\\\""));
        assert!(first.contains(
            "\"driver_counts\":{\"available\":false,\"reason\":\"the interposer is not loaded\""
        ));
        let summary = summary_buf.text();
        assert!(
            summary.contains("torch asked 1.00 TiB on GPU 1 (caller trigger)"),
            "{summary}"
        );
        assert!(summary.contains("step #3"), "{summary}");
        assert!(summary.contains("(this process)"), "{summary}");
        assert!(
            summary.contains("releasing caches on GPU 1: unknown"),
            "{summary}"
        );
        assert!(
            summary.contains("detail: CUDA out of memory. Tried"),
            "{summary}"
        );

        // Re-armed: the first file is written again with the count, then the
        // next trigger replaces it.
        reporter.rearm().unwrap();
        let settled = std::fs::read_to_string(&path).unwrap();
        assert!(
            settled.contains("\"later_triggers\":{\"count\":1000,\"last\":{\"trigger\":\"caller\"")
        );
        assert_eq!(
            json_buf.text(),
            first,
            "the writers get the first report only"
        );
        assert!(reporter.armed());
        t.report_oom(f).unwrap();
        let second = std::fs::read_to_string(&path).unwrap();
        assert!(second.contains("\"reports_before\":1"));
        assert_eq!(seen.lock().unwrap().len(), 2);
        drop(t);
        assert!(reporter.is_closed());
        let listing: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(listing.len(), 1, "no temporary file left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_report_without_phases_says_why() {
        let buf = Buf::default();
        let mut t = tracker();
        let r = t.set_oom_report(Some(options(&buf))).unwrap().unwrap();
        let f = FailedAllocation::new(OomTrigger::Caller, OomLocation::Unknown, None, "caller");
        r.trigger(f, Err("the tracker was busy".into())).unwrap();
        let doc = buf.text();
        assert!(doc.contains(
            "\"open_phases\":{\"available\":false,\"reason\":\"the tracker was busy\",\"phases\":[]}"
        ));
        assert!(doc.contains("\"requested_bytes\":null"));
        assert!(doc.contains("\"location\":\"unknown\",\"device\":null"));
    }

    #[test]
    fn a_report_being_written_never_blocks_the_training_loop() {
        // A hook's trigger (outside any tracker call, as the driver's is)
        // whose callback blocks: phases end meanwhile, and the callback
        // cannot trigger the reporter again.
        let t = Arc::new(Lock::new(tracker()));
        let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let go_rx = Mutex::new(go_rx);
        let inner: Arc<Mutex<Option<OomReporter>>> = Arc::default();
        let inner2 = inner.clone();
        let again: Arc<Mutex<Option<ErrorKind>>> = Arc::default();
        let again2 = again.clone();
        let r = t
            .lock()
            .unwrap()
            .set_oom_report(Some(OomReportOptions {
                callback: Some(Box::new(move |_, _, _| {
                    let me = inner2.lock().unwrap().clone().unwrap();
                    let f =
                        FailedAllocation::new(OomTrigger::Caller, OomLocation::Unknown, None, "x");
                    *again2.lock().unwrap() = me.trigger(f, Ok(vec![])).err().map(|e| e.kind());
                    entered_tx.send(()).unwrap();
                    go_rx.lock().unwrap().recv().unwrap();
                })),
                ..OomReportOptions::default()
            }))
            .unwrap()
            .unwrap();
        *inner.lock().unwrap() = Some(r.clone());
        t.lock().unwrap().begin(PhaseKind::Step, None).unwrap();
        let hook = {
            let r = r.clone();
            std::thread::spawn(move || {
                let f =
                    FailedAllocation::new(OomTrigger::Caller, OomLocation::Device(0), None, "x");
                r.trigger(f, Err("hook".into())).unwrap()
            })
        };
        entered_rx.recv().unwrap();
        for _ in 0..3 {
            t.lock().unwrap().next(PhaseKind::Step, None).unwrap();
        }
        assert_eq!(r.status().unwrap().reports_written, 1);
        go_tx.send(()).unwrap();
        assert_eq!(hook.join().unwrap(), OomOutcome::Written);
        assert_eq!(*again.lock().unwrap(), Some(ErrorKind::WrongOrder));
        t.lock().unwrap().set_oom_report(None).unwrap();
        assert!(r.is_closed());
    }

    #[test]
    fn dates_and_sizes_read_well() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000");
        assert_eq!(utc(951_782_400_123_000_000), "2000-02-29T00:00:00.123");
        assert_eq!(utc(1_718_000_000_000_000_000), "2024-06-10T06:13:20.000");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.00 MiB");
        assert_eq!(bytes(1536 << 20), "1.50 GiB");
    }
}
