//! A source: one sampler plus the peak state of every window open over it,
//! and the constructors of the built-in sources.
//!
//! Peaks are kept per source, not per window, so that one window's boundary
//! can fold the source's high-water mark into *every* open window before it
//! resets it — opening, resetting or closing one window never disturbs another.
//!
//! Each source keeps a high-water mark "since the last boundary":
//! - exact sources: the mark the kernel (`VmHWM`, the cgroup's peak) or a
//!   caller ([`MarkGroup`]) keeps, through the sampler's
//!   `read_peak` / `reset_peak`;
//! - pushed sources: the largest value pushed since the last boundary;
//! - sampled sources: the largest value the monitor (or any read) saw.
//!
//! A window's peak is the max of what was folded into its slot and the
//! current high-water mark.
//!
//! Sources backed by a process-wide kernel counter (this process's `VmHWM`,
//! the cgroup's peak) are shared: every call returns the same [`Source`], so
//! all windows over it fold into one another correctly.
//!
//! Sampled sources are polled by the [`monitor`], which sees them only as
//! `Polled`: readings flow from the sampler through the source into its
//! windows, never back.

use crate::callback::{CallbackSampler, ReadFn};
use crate::cgroup::{CgroupOptions, CgroupSampler};
use crate::cohorts::Cohorts;
use crate::error::{Error, ErrorKind, Result};
use crate::lock::Lock;
use crate::mark::{MarkGroup, Marks};
use crate::monitor::{self, Polled};
use crate::process::{HwmMode, ProcessSampler};
use crate::process_tree::ProcessTreeSampler;
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;
use crate::smaps::{SmapsMetric, SmapsSampler};
use crate::system::SystemRamSampler;
use crate::tree_smaps::TreeSmapsSampler;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

static PROCESS: Lock<Option<Source>> = Lock::new(None);
static CGROUP: Lock<Option<Source>> = Lock::new(None);

/// Set to `1` to keep `VmHWM` untouched process-wide: [`Source::process`]
/// then samples its peak instead of resetting the kernel mark.
pub const PRESERVE_VMHWM_ENV: &str = "MEMPROBE_PRESERVE_VMHWM";

/// A shared handle to one source of readings. Cloning is cheap and every
/// clone refers to the same source, its windows and its peak state.
///
/// # Example
///
/// ```
/// use memprobe_core::{PeakFidelity, Source};
///
/// # fn main() -> memprobe_core::Result<()> {
/// // This process's RSS: shared process-wide, exact peaks from the kernel.
/// let rss = Source::process()?;
/// assert_eq!(rss.info().name, "rss");
/// assert!(rss.read()?.used > 0);
///
/// // A source whose values the caller pushes.
/// let alloc = Source::pushed("alloc")?;
/// alloc.push(4096)?;
/// assert_eq!(alloc.read()?.used, 4096);
/// assert_eq!(alloc.info().fidelity, PeakFidelity::Pushed);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Source {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    id: u64,
    info: SourceInfo,
    /// Read by a sampler (each boundary takes a fresh, stamped reading),
    /// not pushed (a boundary returns the last value pushed).
    sampled: bool,
    /// Its reads and boundaries may run a caller's code (a callback, a
    /// mark's functions, a sampler from outside memprobe). memprobe's own
    /// readers of the kernel's files and pushed sources run none, so nothing
    /// their boundaries do can see a [`Sweep`](crate::mark::Sweep).
    runs_caller_code: bool,
    state: Lock<State>,
}

pub(crate) struct State {
    /// `None` for pushed sources.
    sampler: Option<Box<dyn Sampler>>,
    /// Exact: the sampler keeps a resettable high-water mark (the kernel's,
    /// or a caller's).
    keeps_mark: bool,
    /// A caller's mark may trail the current value (a framework bug); the
    /// kernel's cannot. When set, a peak read without a boundary also reads
    /// `used`, so a peak is never below the current value.
    check_mark: bool,
    /// Pushed/sampled: max value seen since the last boundary.
    pending: Option<u64>,
    /// Each open window's slot; `None` marks a free one.
    slots: Vec<Option<Slot>>,
    /// The free slots, reused before the vector grows.
    free: Vec<usize>,
    /// The peaks folded into the open windows, per cohort.
    cohorts: Cohorts,
    /// The slots with a restart under way (see [`Slot::restart`]): folded
    /// into one by one, as their next interval's peak is their own.
    restarting: Vec<usize>,
    open: usize,
    last: Option<Sample>,
    last_error: Option<Error>,
    /// Fork generation the sampler last ran in.
    generation: u64,
    /// The sampler stamped its last reading itself (`taken_at_ns`), as every
    /// built-in one does: the next read takes no clock reading of its own.
    stamps: bool,
}

/// One open window's peak in a source.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The window's cohort in [`State::cohorts`], which holds the peak
    /// folded in since the window (last) started.
    cohort: u64,
    /// Set while the window's boundary is under way over several sources:
    /// the peak its next interval has seen since this source's part of the
    /// boundary. The boundary commits it (it becomes `peak`) only once every
    /// source's part succeeded; a failed boundary drops it, and `peak`,
    /// which kept folding, still covers the whole unfinished interval.
    restart: Option<u64>,
}

/// Identifies one window's slot in a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotId(usize);

/// Whether a window boundary stamps its reading with the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Clock {
    /// Stamped (`taken_at_ns`, `read_ns`), kept as the source's last reading.
    Read,
    /// The bytes alone: no clock read (see [`Window::reset_untimed_into`](crate::Window::reset_untimed_into)).
    Skip,
}

impl Source {
    /// Wraps a sampler. Its [`SourceInfo::fidelity`] decides how peaks are
    /// kept: `Exact` samplers must implement `read_peak`/`reset_peak`.
    pub fn from_sampler(sampler: Box<dyn Sampler>) -> Source {
        Self::wrap(sampler, false)
    }

    /// [`from_sampler`](Self::from_sampler) for one of memprobe's own
    /// readers of the kernel's files (see [`Shared::runs_caller_code`]).
    fn builtin(sampler: Box<dyn Sampler>) -> Source {
        Self::wrap(sampler, true)
    }

    fn wrap(mut sampler: Box<dyn Sampler>, builtin: bool) -> Source {
        let info = sampler.info();
        let keeps_mark =
            info.fidelity == PeakFidelity::Exact && matches!(sampler.read_peak(), Ok(Some(_)));
        let info = if info.fidelity == PeakFidelity::Exact && !keeps_mark {
            SourceInfo {
                fidelity: PeakFidelity::Sampled,
                ..info
            }
        } else {
            info
        };
        Self::build(info, Some(sampler), keeps_mark, false, !builtin)
    }

    /// Whether a boundary over this source may run a caller's code (a
    /// callback, a mark's functions): then it needs a
    /// [`Sweep`](crate::mark::Sweep) around it.
    pub(crate) fn runs_caller_code(&self) -> bool {
        self.shared.runs_caller_code
    }

    /// A source whose values the caller pushes (e.g. a framework allocator's
    /// allocated bytes). Its peak is exact as long as every change is pushed.
    pub fn pushed(name: &str) -> Result<Source> {
        crate::sample::check_name("a source name", name)?;
        let info = SourceInfo {
            name: name.to_owned(),
            kind: SourceKind::Custom,
            fidelity: PeakFidelity::Pushed,
        };
        Ok(Self::build(info, None, false, false, false))
    }

    /// This process's RSS, with an exact peak from the kernel high-water mark
    /// (unless `MEMPROBE_PRESERVE_VMHWM=1`, or the mark cannot be reset: then
    /// sampled). Shared process-wide.
    pub fn process() -> Result<Source> {
        shared(&PROCESS, || {
            let preserve = std::env::var(PRESERVE_VMHWM_ENV).is_ok_and(|v| v == "1");
            let mode = if preserve {
                HwmMode::Preserve
            } else {
                HwmMode::Reset
            };
            Ok(Source::builtin(Box::new(ProcessSampler::new(mode)?)))
        })
    }

    /// This process's RSS with `VmHWM` left untouched: peaks are sampled by
    /// the monitor. A new, independent source each call.
    pub fn process_preserving_hwm() -> Result<Source> {
        Ok(Source::builtin(Box::new(ProcessSampler::new(
            HwmMode::Preserve,
        )?)))
    }

    /// This process and its descendants (sampled).
    pub fn process_tree() -> Result<Source> {
        Ok(Source::builtin(Box::new(ProcessTreeSampler::new()?)))
    }

    /// The machine's RAM (sampled).
    pub fn system_ram() -> Result<Source> {
        Ok(Source::builtin(Box::new(SystemRamSampler::new()?)))
    }

    /// The container's memory cgroup (exact where the kernel's peak can be
    /// reset, else sampled). Shared process-wide.
    pub fn cgroup() -> Result<Source> {
        shared(&CGROUP, || {
            Ok(Source::builtin(Box::new(CgroupSampler::new(
                CgroupOptions::default(),
            )?)))
        })
    }

    /// PSS or USS from smaps_rollup (opt-in: costs milliseconds per GiB).
    pub fn smaps(metric: SmapsMetric) -> Result<Source> {
        Ok(Source::builtin(Box::new(SmapsSampler::new(metric)?)))
    }

    /// PSS or USS of this process and its descendants: the sum over the
    /// tree of each process's `smaps_rollup` (sampled). Pages that forked
    /// workers share copy-on-write count once (PSS), where the tree's summed
    /// RSS counts them once per process. Opt-in: each read walks every
    /// mapping of every process (milliseconds for big processes); processes
    /// that exit mid-read are skipped, and a read during which one ends is
    /// taken again once (a process read before it ended would have its
    /// shared pages counted twice; see [`TreeSmapsSampler`](crate::TreeSmapsSampler)).
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] without `smaps_rollup` (Linux < 4.14);
    /// [`ErrorKind::PermissionDenied`] when a process of the tree may not be
    /// read (another user's).
    pub fn process_tree_smaps(metric: SmapsMetric) -> Result<Source> {
        Ok(Source::builtin(Box::new(TreeSmapsSampler::new(metric)?)))
    }

    /// A custom source read by calling `read` (sampled by the monitor).
    pub fn callback(name: &str, read: ReadFn) -> Result<Source> {
        Ok(Source::from_sampler(Box::new(CallbackSampler::new(
            name, read,
        )?)))
    }

    /// The exact source over mark `index` of `group` (the caller's own
    /// number for the mark, passed back to its [`Marks`] functions), named
    /// `name` (1 to 64 printable bytes) and labelled `kind` in reports. No
    /// function of the marks is called until the source is read or a window
    /// opens over it. The source never demotes itself to sampled: a failing
    /// function fails the call that needed it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`] for a bad name, or when `index`
    /// already has a live source in this group (dropping it frees `index`).
    pub fn over_mark(
        group: &MarkGroup,
        index: usize,
        name: &str,
        kind: SourceKind,
    ) -> Result<Source> {
        let sampler = group.member(index, name, kind)?;
        let info = sampler.info();
        Ok(Self::build(info, Some(Box::new(sampler)), true, true, true))
    }

    /// An exact source over one caller's mark with a reset of its own: a
    /// [`MarkGroup`] of one, whose mark has index 0.
    pub fn mark(name: &str, kind: SourceKind, marks: Box<dyn Marks>) -> Result<Source> {
        Self::over_mark(&MarkGroup::new(marks), 0, name, kind)
    }

    fn build(
        info: SourceInfo,
        sampler: Option<Box<dyn Sampler>>,
        keeps_mark: bool,
        check_mark: bool,
        runs_caller_code: bool,
    ) -> Source {
        let shared = Arc::new(Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            info,
            sampled: sampler.is_some(),
            runs_caller_code,
            state: Lock::new(State {
                sampler,
                keeps_mark,
                check_mark,
                pending: None,
                slots: Vec::new(),
                free: Vec::new(),
                cohorts: Cohorts::default(),
                restarting: Vec::new(),
                open: 0,
                last: None,
                last_error: None,
                generation: crate::fork::generation(),
                stamps: false,
            }),
        });
        Source { shared }
    }

    /// When a boundary over this source that returned `sample` happened:
    /// the time its sampler stamped on it (no clock read of its own), or
    /// now for a pushed source, whose reading is the last value pushed.
    pub(crate) fn boundary_time(&self, sample: &Sample) -> u64 {
        if self.shared.sampled && sample.taken_at_ns != 0 {
            sample.taken_at_ns
        } else {
            monotonic_ns()
        }
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Name, kind and peak fidelity.
    pub fn info(&self) -> &SourceInfo {
        &self.shared.info
    }

    /// Takes one reading now (for pushed sources: the last pushed value).
    /// The reading also counts towards the peak of every open window.
    pub fn read(&self) -> Result<Sample> {
        let mut st = self.shared.state.lock()?;
        st.read_now()
    }

    /// The bytes in use now: the cheapest read, for a hot loop that needs
    /// only the figure. Like [`read`](Self::read) it counts towards the
    /// peak of every open window (and clears [`last_error`](Self::last_error)
    /// or sets it), but it reads no clock and builds no [`Sample`]: it does
    /// not replace [`last`](Self::last). A pushed source returns its last
    /// value.
    pub fn read_used(&self) -> Result<u64> {
        let mut st = self.shared.state.lock()?;
        st.read_used_now()
    }

    /// Pushes a new value of a pushed source, in bytes.
    pub fn push(&self, used: u64) -> Result<()> {
        let mut st = self.shared.state.lock()?;
        if st.sampler.is_some() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "source '{}' is read by its sampler; only pushed sources take values",
                    self.info().name
                ),
            ));
        }
        let sample = Sample::used(used);
        st.note(&sample);
        st.last = Some(sample);
        Ok(())
    }

    /// The last reading taken (by a read, a window boundary or the monitor);
    /// a bytes-only read ([`read_used`](Self::read_used)) and an untimed
    /// boundary ([`Window::reset_untimed_into`](crate::Window::reset_untimed_into))
    /// leave it as it was.
    pub fn last(&self) -> Result<Option<Sample>> {
        Ok(self.shared.state.lock()?.last)
    }

    /// The error of the last failed read, cleared by the next good one
    /// (e.g. a GPU lost while the monitor polls it).
    pub fn last_error(&self) -> Result<Option<Error>> {
        Ok(self.shared.state.lock()?.last_error.clone())
    }

    /// Number of windows currently open over this source.
    pub fn open_windows(&self) -> Result<usize> {
        Ok(self.shared.state.lock()?.open)
    }

    /// Opens a slot: folds the high-water mark into every open window, resets
    /// it, and starts the new slot at the current reading.
    pub(crate) fn open_slot(&self) -> Result<(SlotId, Sample)> {
        let (slot, sample, first) = {
            let mut st = self.shared.state.lock()?;
            let (_, sample) = st.boundary(Clock::Read)?;
            let new = Slot {
                cohort: st.cohorts.join(sample.used),
                restart: None,
            };
            let slot = match st.free.pop() {
                Some(i) => {
                    st.slots[i] = Some(new);
                    i
                }
                None => {
                    st.slots.push(Some(new));
                    st.slots.len() - 1
                }
            };
            st.open += 1;
            (SlotId(slot), sample, st.open == 1)
        };
        if self.needs_polling() {
            if first {
                let polled: Arc<dyn Polled> = self.shared.clone();
                monitor::watch(self.shared.id, Arc::downgrade(&polled));
            } else {
                // Cheap when running; restarts the thread in a forked child.
                monitor::ensure_running();
            }
        }
        Ok((slot, sample))
    }

    /// One source's part of a window boundary: folds the high-water mark
    /// into every slot and restarts it, and starts the slot's next interval
    /// *pending*: the slot keeps its ended interval's peak until
    /// [`commit_restart`](Self::commit_restart), so a boundary that fails on
    /// a later source ([`abort_restart`](Self::abort_restart)) loses no peak.
    /// Returns the ended interval's peak and the reading that both ends it
    /// and starts the next.
    pub(crate) fn begin_restart(&self, slot: SlotId, clock: Clock) -> Result<(u64, Sample)> {
        let mut st = self.shared.state.lock()?;
        st.check_slot(slot)?;
        let (hwm, sample) = st.boundary(clock)?;
        let peak = st.folded(slot).max(hwm).max(sample.used);
        if st.slot_mut(slot)?.restart.replace(sample.used).is_none() {
            st.restarting.push(slot.0);
        }
        Ok((peak, sample))
    }

    /// [`begin_restart`](Self::begin_restart) and
    /// [`commit_restart`](Self::commit_restart) under one lock: a window
    /// over this source alone, whose boundary nothing else can fail.
    pub(crate) fn restart(&self, slot: SlotId, clock: Clock) -> Result<(u64, Sample)> {
        let mut st = self.shared.state.lock()?;
        st.check_slot(slot)?;
        let (hwm, sample) = st.boundary(clock)?;
        let peak = st.folded(slot).max(hwm).max(sample.used);
        st.drop_restart(slot);
        st.move_to(slot, sample.used);
        Ok((peak, sample))
    }

    /// Ends the slot's interval begun by [`begin_restart`](Self::begin_restart):
    /// its next interval's peak becomes the slot's.
    pub(crate) fn commit_restart(&self, slot: SlotId) -> Result<()> {
        let mut st = self.shared.state.lock()?;
        if let Some(r) = st.slot_mut(slot)?.restart {
            st.drop_restart(slot);
            st.move_to(slot, r);
        }
        Ok(())
    }

    /// Drops a restart begun by [`begin_restart`](Self::begin_restart): the
    /// slot's interval goes on, its peak intact.
    pub(crate) fn abort_restart(&self, slot: SlotId) -> Result<()> {
        let mut st = self.shared.state.lock()?;
        st.slot_mut(slot)?;
        st.drop_restart(slot);
        Ok(())
    }

    /// The peak of one slot so far, without ending it; also returns a reading
    /// taken now.
    pub(crate) fn peek_slot(&self, slot: SlotId) -> Result<(u64, Sample)> {
        let mut st = self.shared.state.lock()?;
        st.check_slot(slot)?;
        let now = st.read_now()?;
        let hwm = st.current_hwm()?;
        let folded = st.folded(slot);
        Ok((folded.max(hwm).max(now.used), now))
    }

    /// The peak of one slot so far. For the kernel's marks this takes no new
    /// reading of `used` (the mark already covers it).
    pub(crate) fn peek_peak(&self, slot: SlotId) -> Result<u64> {
        let mut st = self.shared.state.lock()?;
        st.check_slot(slot)?;
        let now = if st.keeps_mark && !st.check_mark {
            0
        } else {
            st.read_now()?.used
        };
        let hwm = st.current_hwm()?;
        Ok(st.folded(slot).max(hwm).max(now))
    }

    /// Frees a slot. Its peak is not computed (see `peek_slot`).
    pub(crate) fn close_slot(&self, slot: SlotId) -> Result<()> {
        let last = {
            let mut st = self.shared.state.lock()?;
            st.check_slot(slot)?;
            st.drop_restart(slot);
            if let Some(s) = st.slots[slot.0].take() {
                st.cohorts.leave(s.cohort);
            }
            st.free.push(slot.0);
            st.open -= 1;
            st.open == 0
        };
        if last && self.needs_polling() {
            monitor::unwatch(self.shared.id);
        }
        Ok(())
    }

    fn needs_polling(&self) -> bool {
        self.shared.info.fidelity == PeakFidelity::Sampled
    }
}

impl Polled for Shared {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn poll(&self) -> Option<Result<Sample>> {
        // A lock refused (re-entry from a sink) skips this round.
        let mut st = self.state.lock().ok()?;
        if st.open == 0 {
            return None;
        }
        Some(st.read_now())
    }
}

/// The clock before a sampler call, to stamp its reading with in case the
/// sampler leaves that to us; 0 (no clock read) when it stamped its last
/// reading itself (`stamps`): it is trusted to stamp this one too.
fn clock_unless(stamps: bool) -> u64 {
    if stamps {
        0
    } else {
        monotonic_ns()
    }
}

/// Stamps `sample` where its sampler did not: at `t0` (from
/// [`clock_unless`]) or, when that clock was skipped, now. Returns whether
/// the sampler stamped it itself.
fn stamp(sample: &mut Sample, t0: u64) -> bool {
    if sample.taken_at_ns != 0 {
        return true;
    }
    sample.taken_at_ns = if t0 == 0 { monotonic_ns() } else { t0 };
    false
}

impl State {
    /// Raises the pending high-water mark with a reading. Exact sources keep
    /// it too: the kernel's mark can trail a reading when many threads fault
    /// and unmap at once, and a window's peak must never be below a reading
    /// memprobe took while it was open.
    fn note(&mut self, sample: &Sample) {
        self.note_used(sample.used);
    }

    fn note_used(&mut self, used: u64) {
        self.pending = Some(self.pending.map_or(used, |p| p.max(used)));
    }

    /// In a forked child, lets the sampler reopen what it keeps open.
    fn check_fork(&mut self) {
        let g = crate::fork::generation();
        if g != self.generation {
            self.generation = g;
            if let Some(s) = self.sampler.as_mut() {
                s.after_fork();
            }
        }
    }

    fn read_now(&mut self) -> Result<Sample> {
        self.check_fork();
        match self.sampler.as_mut() {
            None => Ok(self.last.unwrap_or_else(|| Sample::used(0))),
            Some(s) => {
                let t0 = clock_unless(self.stamps);
                match s.read() {
                    Ok(mut sample) => {
                        self.stamps = stamp(&mut sample, t0);
                        if sample.read_ns == 0 {
                            let since = if t0 == 0 { sample.taken_at_ns } else { t0 };
                            sample.read_ns = monotonic_ns().saturating_sub(since);
                        }
                        self.note(&sample);
                        self.last = Some(sample);
                        self.last_error = None;
                        Ok(sample)
                    }
                    Err(e) => {
                        self.last_error = Some(e.clone());
                        Err(e)
                    }
                }
            }
        }
    }

    fn read_used_now(&mut self) -> Result<u64> {
        self.check_fork();
        match self.sampler.as_mut() {
            None => Ok(self.last.map_or(0, |s| s.used)),
            Some(s) => match s.read_used() {
                Ok(used) => {
                    self.note_used(used);
                    self.last_error = None;
                    Ok(used)
                }
                Err(e) => {
                    self.last_error = Some(e.clone());
                    Err(e)
                }
            },
        }
    }

    /// The high-water mark since the last boundary (0 if nothing was seen).
    fn current_hwm(&mut self) -> Result<u64> {
        self.check_fork();
        let pending = self.pending.unwrap_or(0);
        if self.keeps_mark {
            let s = self.sampler.as_mut().expect("a mark implies a sampler");
            Ok(s.read_peak()?.unwrap_or(0).max(pending))
        } else {
            Ok(pending)
        }
    }

    /// [`current_hwm`](Self::current_hwm) as a boundary reads it, right
    /// before the reset whose reading it folds in too.
    fn hwm_before_reset(&mut self) -> Result<u64> {
        let pending = self.pending.unwrap_or(0);
        if self.keeps_mark {
            let s = self.sampler.as_mut().expect("a mark implies a sampler");
            Ok(s.read_peak_before_reset()?.unwrap_or(0).max(pending))
        } else {
            Ok(pending)
        }
    }

    /// A window boundary: fold the high-water mark into every open slot,
    /// reset it, and return the mark (0 when no slot was open, as then it is
    /// not read) and a reading taken right after the reset. With
    /// [`Clock::Skip`] the reading holds the bytes alone (no stamp, no
    /// other field) and is not kept as the source's [`last`](Source::last).
    fn boundary(&mut self, clock: Clock) -> Result<(u64, Sample)> {
        self.check_fork();
        let mut hwm = 0;
        if self.open > 0 {
            hwm = self.hwm_before_reset()?;
            self.cohorts.raise(hwm);
            for &i in &self.restarting {
                if let Some(Some(Slot {
                    restart: Some(r), ..
                })) = self.slots.get_mut(i)
                {
                    *r = (*r).max(hwm);
                }
            }
        }
        self.pending = None;
        if clock == Clock::Skip {
            let used = match self.sampler.as_mut() {
                Some(s) if self.keeps_mark => {
                    let used = s.reset_peak_used()?;
                    self.note_used(used);
                    used
                }
                // Notes the reading itself.
                _ => self.read_used_now()?,
            };
            return Ok((
                hwm,
                Sample {
                    used,
                    ..Sample::default()
                },
            ));
        }
        if self.keeps_mark {
            let s = self.sampler.as_mut().expect("a mark implies a sampler");
            let t0 = clock_unless(self.stamps);
            let mut sample = s.reset_peak()?;
            self.stamps = stamp(&mut sample, t0);
            self.note(&sample);
            self.last = Some(sample);
            Ok((hwm, sample))
        } else {
            Ok((hwm, self.read_now()?))
        }
    }

    /// The peak folded into an open slot since its window (last) started.
    fn folded(&self, slot: SlotId) -> u64 {
        self.slots[slot.0].map_or(0, |s| self.cohorts.peak(s.cohort))
    }

    /// Clears the slot's restart under way, if any.
    fn drop_restart(&mut self, slot: SlotId) {
        if let Some(Some(s)) = self.slots.get_mut(slot.0) {
            if s.restart.take().is_some() {
                self.restarting.retain(|&i| i != slot.0);
            }
        }
    }

    /// Starts the slot's next interval at a folded peak of `peak`.
    fn move_to(&mut self, slot: SlotId, peak: u64) {
        if let Some(Some(s)) = self.slots.get_mut(slot.0) {
            self.cohorts.leave(s.cohort);
            s.cohort = self.cohorts.join(peak);
        }
    }

    fn check_slot(&self, slot: SlotId) -> Result<()> {
        match self.slots.get(slot.0) {
            Some(Some(_)) => Ok(()),
            _ => Err(Error::wrong_order("window is not open on this source")),
        }
    }

    fn slot_mut(&mut self, slot: SlotId) -> Result<&mut Slot> {
        match self.slots.get_mut(slot.0) {
            Some(Some(s)) => Ok(s),
            _ => Err(Error::wrong_order("window is not open on this source")),
        }
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("id", &self.shared.id)
            .field("info", &self.shared.info)
            .finish()
    }
}

/// The process-wide source in `cell`, made on first use.
fn shared(cell: &Lock<Option<Source>>, make: impl FnOnce() -> Result<Source>) -> Result<Source> {
    let mut slot = cell.lock()?;
    if let Some(s) = slot.as_ref() {
        return Ok(s.clone());
    }
    let s = make()?;
    *slot = Some(s.clone());
    Ok(s)
}
