//! A tracker's reporter: its options, and the arming state machine — one
//! report per arming; later triggers counted, the last one kept, and
//! settled into the file when the report is re-armed, removed or its
//! tracker dropped.

use super::destinations::{OomCallback, Outputs};
use super::{
    unix_ns, FailedAllocation, OomGpuProvider, OomTrigger, OomTriggers, OpenPhase,
    OutOfMemoryReport, DEFAULT_KEEP_ENDED, MAX_KEEP_ENDED,
};
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::observer::PhaseObserver;
use crate::record::Record;
use crate::sample::{monotonic_ns, SourceInfo};
use crate::sinks::AtomicFile;
use crate::source::Source;
use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

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
                held_by_origin: Err(String::new()),
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
        report.held_by_origin = gpu.as_ref().map_or_else(
            || Err(NONE.to_owned()),
            |g| g.held_by_origin(&report.failed),
        );
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

/// The reporter keeps its tracker's ended phases, and closes with it.
impl PhaseObserver for OomReporter {
    fn on_phase_end(&mut self, record: &Record, _next: bool) {
        self.on_record(record);
    }

    fn on_tracker_drop(&mut self) {
        self.close();
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
