//! The training-loop tracker: a stack of phases (step, epoch, experience,
//! stream, custom) as nested peak windows, one record per ended phase,
//! sinks, cache release policies and out-of-memory recovery. Its
//! boundaries are told to its observers (observer.rs): the run channel,
//! the leak trends, the out-of-memory report, and any the caller adds. It
//! unifies Avalanche's per-phase maxima, fastai's PeakMemMetric and
//! robo_orchard's ClearCacheHook.

use crate::delta::SourceDelta;
use crate::error::{Error, ErrorKind, Result};
use crate::leak::{LeakPolicy, LeakStatus};
use crate::leak_trends::LeakTrends;
use crate::observer::{Observers, PhaseBegun, PhaseObserver};
use crate::oom_report::{
    self, FailedAllocation, OomLocation, OomOutcome, OomReportOptions, OomReporter, OomTrigger,
    OpenPhase,
};
use crate::oom_retry::{OomRetryResult, StepOutcome};
use crate::phase::{PhaseInfo, PhaseKind};
use crate::record::Record;
use crate::release::{
    self, ReleaseEvent, ReleaseFn, ReleaseKind, ReleasePolicy, ReleaseReason, Releaser,
};
use crate::run_channel::{Hook, RunChannel};
use crate::sample::monotonic_ns;
use crate::sink::Sink;
use crate::source::Source;
use crate::window::Window;
use std::collections::HashMap;
use std::sync::Arc;

mod tail;

/// Windows kept for reuse by the next phase (a reset is cheaper than an open).
const PARKED: usize = 4;

/// Tails kept at most (tracker/tail.rs); the oldest goes first.
const TAILS: usize = 8;

struct Open {
    kind: PhaseKind,
    name: String,
    window: Window,
}

/// Tracks the phases of a training loop over a set of sources.
///
/// # Example
///
/// ```
/// use memprobe_core::{PeakFidelity, PhaseKind, Source, Tracker};
///
/// # fn main() -> memprobe_core::Result<()> {
/// let rss = Source::process()?;
/// let exact = rss.info().fidelity == PeakFidelity::Exact;
/// let mut tracker = Tracker::new(&[rss])?;
/// tracker.begin(PhaseKind::Epoch, None)?;
/// tracker.begin(PhaseKind::Step, None)?;
/// for i in 0..3 {
///     let activations = vec![1u8; 32 << 20]; // a step's temporary memory
///     drop(activations);
///     // Ends step i and begins step i + 1 at the same instant.
///     let step = tracker.next(PhaseKind::Step, None)?;
///     assert_eq!(step.phase.as_ref().unwrap().index, i);
///     let d = &step.sources[0];
///     if exact {
///         assert!(d.peak >= d.used_start + (24 << 20), "{d:?}");
///     }
/// }
/// tracker.end(PhaseKind::Step, None)?;
/// let epoch = tracker.end(PhaseKind::Epoch, None)?;
/// assert_eq!(epoch.label, "epoch");
/// if exact {
///     // The epoch's peak covers its steps' spikes.
///     let d = &epoch.sources[0];
///     assert!(d.peak >= d.used_start + (24 << 20), "{d:?}");
/// }
/// # Ok(())
/// # }
/// ```
pub struct Tracker {
    sources: Vec<Source>,
    stack: Vec<Open>,
    parked: Vec<Window>,
    counters: HashMap<(PhaseKind, String), u64>,
    sinks: Vec<Arc<dyn Sink>>,
    releasers: Vec<Releaser>,
    policies: Vec<ReleasePolicy>,
    releases_fired: u64,
    last: HashMap<PhaseKind, Record>,
    /// Intervals running since a chained end, each the start of the next
    /// phase of a kind and name (tracker/tail.rs).
    tails: Vec<(PhaseKind, String, Window)>,
    /// Told every boundary: from the start the run channel's end
    /// (run_channel/hook.rs) and the leak trends (leak_trends.rs); the
    /// out-of-memory report (oom_report) when configured; and any added.
    observers: Observers,
}

impl Tracker {
    /// A tracker over `sources` (at least one), with no sinks or policies.
    pub fn new(sources: &[Source]) -> Result<Tracker> {
        if sources.is_empty() {
            return Err(Error::invalid("a tracker needs at least one source"));
        }
        Ok(Tracker {
            sources: sources.to_vec(),
            stack: Vec::new(),
            parked: Vec::new(),
            counters: HashMap::new(),
            sinks: Vec::new(),
            releasers: Vec::new(),
            policies: Vec::new(),
            releases_fired: 0,
            last: HashMap::new(),
            tails: Vec::new(),
            observers: {
                let mut o = Observers::default();
                o.add(Box::new(Hook::new()));
                o.add(Box::new(LeakTrends::new(None, sources.len())));
                o
            },
        })
    }

    /// Tells `observer` every phase boundary from now on, after the
    /// observers added before it (see [`PhaseObserver`]).
    pub fn add_observer(&mut self, observer: Box<dyn PhaseObserver>) {
        self.observers.add(observer);
    }

    /// The sources, in order.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Phases currently open, outermost first.
    pub fn open_phases(&self) -> Vec<(PhaseKind, String)> {
        self.stack
            .iter()
            .map(|o| (o.kind, o.name.clone()))
            .collect()
    }

    /// Sends this tracker's phase boundaries and records to `channel`
    /// instead of the one `memprobe run` names in
    /// [`MEMPROBE_RUN_CHANNEL`](crate::run_channel::ENV) (`None`: nowhere).
    pub fn set_run_channel(&mut self, channel: Option<Arc<RunChannel>>) {
        if let Some(h) = self.observers.get_mut::<Hook>() {
            h.set(channel);
        }
    }

    /// Sends every record (and release) to `sink` too.
    pub fn add_sink(&mut self, sink: Arc<dyn Sink>) {
        self.sinks.push(sink);
    }

    /// Finishes every sink (renames files into place) and detaches them:
    /// later records go only to sinks added afterwards. Called on drop too.
    pub fn finish_sinks(&mut self) -> Result<()> {
        let mut first = None;
        for s in std::mem::take(&mut self.sinks) {
            if let Err(e) = s.finish() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Registers a release callback.
    pub fn add_release(&mut self, name: &str, kind: ReleaseKind, f: ReleaseFn) -> Result<()> {
        if name.is_empty() || name.len() > 64 {
            return Err(Error::invalid(
                "a release callback name must be 1 to 64 bytes",
            ));
        }
        self.releasers.push(Releaser {
            name: name.to_owned(),
            kind,
            f,
        });
        Ok(())
    }

    /// Adds a release policy.
    pub fn add_release_policy(&mut self, policy: ReleasePolicy) -> Result<()> {
        release::validate(&policy, self.sources.len())?;
        self.policies.push(policy);
        Ok(())
    }

    /// How many releases fired so far (all reasons).
    pub fn releases_fired(&self) -> u64 {
        self.releases_fired
    }

    /// Sets (or with `None` removes) the leak rule; trends restart.
    pub fn set_leak_policy(&mut self, policy: Option<LeakPolicy>) -> Result<()> {
        if policy.is_some_and(|p| p.epochs == 0) {
            return Err(Error::invalid("a leak policy needs at least 1 epoch"));
        }
        if let Some(t) = self.observers.get_mut::<LeakTrends>() {
            *t = LeakTrends::new(policy, self.sources.len());
        }
        Ok(())
    }

    /// The leak trend of source `index`.
    pub fn leak_status(&self, index: usize) -> Result<LeakStatus> {
        self.observers
            .get::<LeakTrends>()
            .and_then(|t| t.status(index))
            .ok_or_else(|| self.bad_index(index))
    }

    /// The last ended record of `kind`, if any.
    pub fn last_record(&self, kind: PhaseKind) -> Option<&Record> {
        self.last.get(&kind)
    }

    fn bad_index(&self, index: usize) -> Error {
        Error::new(
            ErrorKind::InvalidId,
            format!(
                "source index {index} out of range (0..{})",
                self.sources.len()
            ),
        )
    }

    fn phase_name(kind: PhaseKind, name: Option<&str>) -> Result<String> {
        match (kind, name) {
            (PhaseKind::Custom, Some(n)) => {
                crate::sample::check_name("a custom phase's name", n)?;
                Ok(n.to_owned())
            }
            (PhaseKind::Custom, None) => Err(Error::invalid("a custom phase needs a name")),
            (k, None) => Ok(k.as_str().to_owned()),
            (k, Some(_)) => Err(Error::invalid(format!(
                "only custom phases take a name, not a {}",
                k.as_str()
            ))),
        }
    }

    /// Begins a phase. A step begins inside an epoch, an epoch inside an
    /// experience, an experience inside a stream — never the other way
    /// round; custom phases nest anywhere.
    pub fn begin(&mut self, kind: PhaseKind, name: Option<&str>) -> Result<()> {
        let name = Self::phase_name(kind, name)?;
        self.check_nesting(kind)?;
        // A phase begun afresh drops its tail: its window is the one reused.
        let window = self.tail_restarted_or_fresh(kind, &name)?;
        self.push(kind, name, window);
        Ok(())
    }

    /// A window starting now: a parked one reset, else a new one.
    fn fresh_window(&mut self) -> Result<Window> {
        match self.parked.pop() {
            Some(mut w) => match w.reset() {
                Ok(_) => Ok(w),
                Err(e) => {
                    self.parked.push(w);
                    Err(e)
                }
            },
            None => Window::open(&self.sources),
        }
    }

    /// Keeps `window` for reuse, if there is room.
    fn park(&mut self, window: Window) {
        if self.parked.len() < PARKED {
            self.parked.push(window);
        }
    }

    /// WrongOrder when a phase of `kind` cannot begin inside those open.
    fn check_nesting(&self, kind: PhaseKind) -> Result<()> {
        if let Some(rank) = kind.rank() {
            if let Some(outer) = self.stack.iter().rev().find(|o| o.kind.rank().is_some()) {
                if outer.kind.rank() <= Some(rank) {
                    return Err(Error::wrong_order(format!(
                        "cannot begin a {} inside a {}; end the {} first",
                        kind.as_str(),
                        outer.kind.as_str(),
                        outer.kind.as_str()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Opens a phase on `window` (its start is the phase's) and tells the observers.
    fn push(&mut self, kind: PhaseKind, name: String, window: Window) {
        self.stack.push(Open { kind, name, window });
        let (top, depth) = (self.stack.last().expect("pushed"), self.stack.len() - 1);
        let counters = &self.counters;
        let index = || *counters.get(&(kind, top.name.clone())).unwrap_or(&0);
        self.observers.begin(&PhaseBegun {
            kind,
            name: &top.name,
            depth,
            t_ns: top.window.started_at_ns(),
            index: &index,
        });
    }

    fn check_top(&self, kind: PhaseKind, name: &str) -> Result<()> {
        match self.stack.last() {
            None => Err(Error::wrong_order(format!(
                "no {} was begun",
                kind.as_str()
            ))),
            Some(top) if top.kind != kind || top.name != name => Err(Error::wrong_order(format!(
                "cannot end {} '{}': the innermost open phase is {} '{}'",
                kind.as_str(),
                name,
                top.kind.as_str(),
                top.name
            ))),
            Some(_) => Ok(()),
        }
    }

    /// Ends the innermost phase, which must be `kind` (and `name` for custom
    /// phases), and returns its record (also sent to the sinks). On error
    /// nothing changes.
    pub fn end(&mut self, kind: PhaseKind, name: Option<&str>) -> Result<Record> {
        let name = Self::phase_name(kind, name)?;
        self.check_top(kind, &name)?;
        let top = self.stack.last().expect("checked");
        let deltas = top.window.measure()?;
        let started = top.window.started_at_ns();
        let open = self.stack.pop().expect("checked");
        self.park(open.window);
        let depth = self.stack.len();
        let record = self.finish_phase(kind, name, (started, monotonic_ns()), deltas, depth);
        self.observers.end(&record, false);
        Ok(record)
    }

    /// Ends the innermost phase and begins the next of the same kind at the
    /// same instant: the cheapest step boundary (one reading ends one phase
    /// and starts the next). Returns the ended phase's record.
    pub fn next(&mut self, kind: PhaseKind, name: Option<&str>) -> Result<Record> {
        let name_s = Self::phase_name(kind, name)?;
        self.check_top(kind, &name_s)?;
        let index = self
            .counters
            .get(&(kind, name_s.clone()))
            .copied()
            .unwrap_or(0);
        // Decided before the boundary (a `BelowFree` policy reads its source
        // here, once): a boundary without a release resets the window once.
        let due = self.due_release(kind, index);
        let top = self.stack.last_mut().expect("checked");
        let started = top.window.started_at_ns();
        // The one step that can fail, all or nothing: on error the phase
        // goes on as if `next` had not been called.
        let deltas = top.window.reset()?;
        // The phase is still on the stack: it does not enclose itself.
        let depth = self.stack.len() - 1;
        let span = (started, monotonic_ns());
        let Some((reason, gc)) = due else {
            let record = self.record_phase(kind, name_s, span, deltas, depth, None);
            self.observers.end(&record, true);
            return Ok(record);
        };
        // A release runs between the phases, not inside the next one: the
        // next phase restarts once it ran, before the sinks and observers
        // see the record (they run inside the next phase, as at a boundary
        // without a release). Should that restart fail, the next phase keeps
        // the start the boundary gave it, the release inside it: nothing is
        // lost.
        let event = self.release(reason, Some((kind, index)), gc);
        let top = self.stack.last_mut().expect("still open");
        let _ = top.window.reset();
        let t_ns = top.window.started_at_ns();
        let record = self.record_phase(kind, name_s.clone(), span, deltas, depth, Some(event));
        self.observers.end(&record, false);
        let index = *self.counters.get(&(kind, name_s.clone())).unwrap_or(&0);
        self.observers.begin(&PhaseBegun {
            kind,
            name: &name_s,
            depth,
            t_ns,
            index: &|| index,
        });
        Ok(record)
    }

    /// The ended phase's record, with the release due at its end run
    /// first (after its window was measured).
    fn finish_phase(
        &mut self,
        kind: PhaseKind,
        name: String,
        span: (u64, u64),
        deltas: Vec<SourceDelta>,
        depth: usize,
    ) -> Record {
        let index = self
            .counters
            .get(&(kind, name.clone()))
            .copied()
            .unwrap_or(0);
        let event = self
            .due_release(kind, index)
            .map(|(reason, gc)| self.release(reason, Some((kind, index)), gc));
        self.record_phase(kind, name, span, deltas, depth, event)
    }

    /// Numbers the ended phase and makes its record (with the release run
    /// at its end, if one ran), told to the observers and the sinks.
    fn record_phase(
        &mut self,
        kind: PhaseKind,
        name: String,
        (started, ended): (u64, u64),
        deltas: Vec<SourceDelta>,
        depth: usize,
        release: Option<ReleaseEvent>,
    ) -> Record {
        let counter = self.counters.entry((kind, name.clone())).or_insert(0);
        let index = *counter;
        *counter += 1;
        let mut record = Record::new(name.clone(), started, ended, deltas);
        record.phase = Some(PhaseInfo {
            kind,
            name,
            index,
            depth: depth as u32,
        });
        record.releases.extend(release);
        self.observers.record(&mut record);
        for s in &self.sinks {
            s.on_record(&record);
        }
        self.last.insert(kind, record.clone());
        record
    }

    fn due_release(&self, kind: PhaseKind, index: u64) -> Option<(ReleaseReason, bool)> {
        let mut due: Option<(ReleaseReason, bool)> = None;
        for p in &self.policies {
            let hit = match *p {
                ReleasePolicy::Every { kind: k, n, gc } => {
                    (k == kind && (index + 1) % n == 0).then_some((ReleaseReason::Periodic, gc))
                }
                ReleasePolicy::BelowFree { source, bytes, gc } => {
                    let low = matches!(kind, PhaseKind::Step | PhaseKind::Epoch)
                        && self.sources[source]
                            .read()
                            .ok()
                            .and_then(|s| s.free)
                            .is_some_and(|f| f < bytes);
                    low.then_some((ReleaseReason::LowMemory, gc))
                }
            };
            if let Some((reason, gc)) = hit {
                due = Some(match due {
                    Some((r, g)) => (r, g || gc),
                    None => (reason, gc),
                });
            }
        }
        due
    }

    fn used_now(&self) -> Vec<u64> {
        self.sources
            .iter()
            .map(|s| s.read().map(|r| r.used).unwrap_or(0))
            .collect()
    }

    fn release(
        &mut self,
        reason: ReleaseReason,
        phase: Option<(PhaseKind, u64)>,
        gc: bool,
    ) -> ReleaseEvent {
        let before = self.used_now();
        let mut ran = Vec::new();
        let mut errors = Vec::new();
        for r in self
            .releasers
            .iter_mut()
            .filter(|r| r.kind == ReleaseKind::Cache || gc)
        {
            ran.push(r.name.clone());
            if let Err(e) = (r.f)() {
                errors.push((r.name.clone(), e.to_string()));
            }
        }
        let after = self.used_now();
        self.releases_fired += 1;
        ReleaseEvent {
            reason,
            phase,
            ran,
            errors,
            before,
            after,
        }
    }

    /// Runs the release callbacks now (GC ones too when `gc`).
    pub fn release_now(&mut self, gc: bool) -> ReleaseEvent {
        self.release(ReleaseReason::Manual, None, gc)
    }

    /// fastai's gpu_mem_restore, made useful outside IPython: runs `step`;
    /// when it reports out-of-memory, runs every release callback (GC
    /// included) and retries, at most `max_retries` times. When the last
    /// try still runs out of memory and an out-of-memory report is
    /// configured for the caller trigger, the report is written (reported
    /// by `run_oom_retry`), as by [`report_oom`](Self::report_oom).
    pub fn run_with_oom_retry(
        &mut self,
        mut step: impl FnMut() -> Result<StepOutcome>,
        max_retries: u32,
    ) -> Result<OomRetryResult> {
        let mut report = OomRetryResult {
            succeeded: false,
            retries: 0,
            releases: Vec::new(),
        };
        loop {
            match step()? {
                StepOutcome::Done => {
                    report.succeeded = true;
                    return Ok(report);
                }
                StepOutcome::OutOfMemory if report.retries >= max_retries => {
                    self.report_retries_exhausted(report.retries);
                    return Ok(report);
                }
                StepOutcome::OutOfMemory => {
                    report
                        .releases
                        .push(self.release(ReleaseReason::OutOfMemory, None, true));
                    report.retries += 1;
                }
            }
        }
    }

    /// The step still ran out of memory after every retry: that is the
    /// failure an armed out-of-memory report is for (caller trigger). A
    /// write that fails is kept in the report's status.
    fn report_retries_exhausted(&self, retries: u32) {
        if !self
            .oom_reporter()
            .is_some_and(|r| r.accepts(OomTrigger::Caller))
        {
            return;
        }
        let mut failed = FailedAllocation::new(
            OomTrigger::Caller,
            OomLocation::Unknown,
            None,
            "run_oom_retry",
        );
        failed.detail = Some(format!(
            "the step still ran out of memory after {retries} retries"
        ));
        let _ = self.report_oom(failed);
    }

    // ---- Out-of-memory reports: the logic is in oom_report.rs ----

    /// Configures the out-of-memory report (see [`oom_report`]), or
    /// removes it with `None`. Returns the reporter, which a hook outside
    /// the tracker's calls (the GPU driver's) triggers.
    ///
    /// # Errors
    /// [`ErrorKind::WrongOrder`] when one is already configured; the
    /// options' errors ([`ErrorKind::InvalidArgument`], a path's).
    pub fn set_oom_report(
        &mut self,
        options: Option<OomReportOptions>,
    ) -> Result<Option<OomReporter>> {
        let mut slot = self.observers.take::<OomReporter>();
        let done = oom_report::configure(&mut slot, options, &self.sources);
        if let Some(r) = slot {
            self.observers.add(Box::new(r));
        }
        done
    }

    /// The configured out-of-memory reporter.
    pub fn oom_reporter(&self) -> Option<&OomReporter> {
        self.observers.get::<OomReporter>()
    }

    /// Reports an allocation that failed for lack of memory: the first one
    /// writes the report (with the open phases measured now), later ones
    /// are counted.
    ///
    /// # Errors
    /// [`ErrorKind::WrongOrder`] when no report is configured for the
    /// failure's trigger; a destination's write error.
    pub fn report_oom(&self, failed: FailedAllocation) -> Result<OomOutcome> {
        oom_report::report(self.oom_reporter(), failed, || self.open_phases_now())
    }

    /// The open phases, outermost first, each source's peak so far (read
    /// now; nothing ends or resets).
    pub fn open_phases_now(&self) -> Vec<OpenPhase> {
        let index = |o: &Open| self.counters.get(&(o.kind, o.name.clone())).copied();
        self.stack
            .iter()
            .enumerate()
            .map(|(depth, o)| {
                let i = index(o).unwrap_or(0);
                OpenPhase::measure(o.kind, &o.name, i, depth as u32, &o.window)
            })
            .collect()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let _ = self.finish_sinks();
        self.observers.drop_all();
    }
}
