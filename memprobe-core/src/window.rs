//! Peak windows: concurrent, nestable, independently resettable intervals
//! over which each source's peak is kept.

use crate::delta::SourceDelta;
use crate::error::{Error, ErrorKind, Result};
use crate::mark::Sweep;
use crate::sample::{monotonic_ns, Sample};
use crate::source::{Clock, SlotId, Source};

struct Part {
    source: Source,
    slot: SlotId,
    start: Sample,
}

impl Part {
    /// The record of the interval that ends (or is read) at `used_end`.
    fn ended(&self, peak: u64, used_end: u64) -> SourceDelta {
        self.ended_named(peak, used_end, String::new())
    }

    /// [`ended`](Self::ended) with its name written into `name`, whose
    /// allocation is kept (a boundary that reuses its records allocates
    /// nothing once they name their sources).
    fn ended_named(&self, peak: u64, used_end: u64, mut name: String) -> SourceDelta {
        let info = self.source.info();
        if name != info.name {
            name.clear();
            name.push_str(&info.name);
        }
        SourceDelta {
            name,
            ..SourceDelta::new(
                "",
                info.kind,
                info.fidelity,
                self.start.used,
                used_end,
                peak,
            )
        }
    }

    fn measure(&self) -> Result<SourceDelta> {
        let (peak, now) = self.source.peek_slot(self.slot)?;
        Ok(self.ended(peak, now.used))
    }
}

/// An open peak window over a set of sources.
///
/// Opening, resetting or closing a window never disturbs any other window,
/// whichever sources they share. For exact sources the peak is a high-water
/// mark (the kernel's, or a caller's: see [`MarkGroup`](crate::MarkGroup)),
/// folded in at every boundary: no polling, no missed spike.
/// Dropping a window closes it.
///
/// # Example
///
/// ```
/// use memprobe_core::{PeakFidelity, Source, Window};
///
/// # fn main() -> memprobe_core::Result<()> {
/// let rss = Source::process()?;
/// let mut epoch = Window::open(std::slice::from_ref(&rss))?;
/// let mut step = Window::open(std::slice::from_ref(&rss))?;
/// let start = step.starts()[0].used;
///
/// let batch = vec![1u8; 64 << 20]; // 64 MiB, every page touched
/// drop(batch);
///
/// // The step ends and the next begins at the same instant; the epoch,
/// // which shares the source, keeps the spike.
/// let ended = step.reset()?;
/// let next = step.peaks()?[0];
/// let epoch_peak = epoch.peaks()?[0];
/// if rss.info().fidelity == PeakFidelity::Exact {
///     // The kernel's high-water mark caught the spike, without polling.
///     assert!(ended[0].peak >= start + (48 << 20));
///     assert!(epoch_peak >= start + (48 << 20));
///     assert!(next < start + (32 << 20));
/// }
/// let epoch_total = epoch.reset()?;
/// assert_eq!(epoch_total[0].name, "rss");
/// # Ok(())
/// # }
/// ```
pub struct Window {
    parts: Vec<Part>,
    started_at_ns: u64,
    /// The new starts of a boundary over several sources, held until every
    /// source's part succeeded (kept to reuse its allocation).
    starts: Vec<Sample>,
    /// A boundary may run a caller's code (a mark, a callback), so it runs
    /// inside a [`Sweep`]; over memprobe's own readers nothing could see
    /// one, and it costs two thread-local accesses.
    sweeps: bool,
}

impl Window {
    /// Opens a window over `sources` (at least one).
    pub fn open(sources: &[Source]) -> Result<Window> {
        if sources.is_empty() {
            return Err(Error::invalid("a window needs at least one source"));
        }
        let mut window = Window {
            parts: Vec::with_capacity(sources.len()),
            started_at_ns: monotonic_ns(),
            starts: Vec::new(),
            sweeps: sources.iter().any(Source::runs_caller_code),
        };
        let _sweep = Sweep::begin();
        for source in sources {
            // On failure, `window` drops and closes the slots opened so far
            // (their boundaries folded every other window's peak first).
            let (slot, start) = source.open_slot()?;
            window.parts.push(Part {
                source: source.clone(),
                slot,
                start,
            });
        }
        Ok(window)
    }

    /// The sources, in the order given at open.
    pub fn sources(&self) -> impl Iterator<Item = &Source> {
        self.parts.iter().map(|p| &p.source)
    }

    /// The readings taken when the window (last) started.
    pub fn starts(&self) -> Vec<Sample> {
        self.parts.iter().map(|p| p.start).collect()
    }

    /// When the window (last) started, monotonic nanoseconds; 0 after a
    /// [`reset_untimed_into`](Self::reset_untimed_into).
    pub fn started_at_ns(&self) -> u64 {
        self.started_at_ns
    }

    /// The peak of each source since the window (last) started, without
    /// ending it, in bytes.
    pub fn peaks(&self) -> Result<Vec<u64>> {
        self.parts
            .iter()
            .map(|p| p.source.peek_peak(p.slot))
            .collect()
    }

    /// Start, now, peak and fastai's deltas for each source, without ending
    /// the window.
    pub fn measure(&self) -> Result<Vec<SourceDelta>> {
        self.parts.iter().map(Part::measure).collect()
    }

    /// The peak of source `index` (in the order given at open) alone: only
    /// that source is read, so a failing source (a lost GPU) does not hide
    /// the others.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidId`](crate::ErrorKind::InvalidId) when `index` is
    /// out of range; the source's read error.
    pub fn peak_of(&self, index: usize) -> Result<u64> {
        let p = self.part(index)?;
        p.source.peek_peak(p.slot)
    }

    /// [`measure`](Self::measure) of source `index` alone (see [`peak_of`](Self::peak_of)).
    ///
    /// # Errors
    /// As [`peak_of`](Self::peak_of).
    pub fn measure_of(&self, index: usize) -> Result<SourceDelta> {
        self.part(index)?.measure()
    }

    fn part(&self, index: usize) -> Result<&Part> {
        self.parts.get(index).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidId,
                format!(
                    "source index {index} out of range (0..{})",
                    self.parts.len()
                ),
            )
        })
    }

    /// Ends the current interval and starts the next at the same instant
    /// (one reading serves as both the end and the new start); other windows
    /// keep their peaks. Returns what the ended interval measured. This is
    /// the cheapest step boundary: per exact source, one high-water-mark
    /// read, one reset and one RSS read.
    ///
    /// All or nothing: when one source fails (a callback's read, a caller's
    /// mark), the error is returned and the window goes on as if the call
    /// had not been made — its start and every source's peak so far intact,
    /// those of the sources that were already restarted included.
    pub fn reset(&mut self) -> Result<Vec<SourceDelta>> {
        let mut ended = Vec::with_capacity(self.parts.len());
        self.reset_into(&mut ended)?;
        Ok(ended)
    }

    /// [`reset`](Self::reset) into `ended`, for a loop that calls it every
    /// step: its entries are overwritten (their allocations kept, so a
    /// boundary over the same window allocates nothing), then it holds one
    /// record per source. On failure `ended` is left empty.
    pub fn reset_into(&mut self, ended: &mut Vec<SourceDelta>) -> Result<()> {
        self.reset_with(ended, Clock::Read)
    }

    /// [`reset_into`](Self::reset_into) without the time: the new interval's
    /// readings in [`starts`](Self::starts) carry the bytes alone (no stamp,
    /// `taken_at_ns` 0; no other field), [`started_at_ns`](Self::started_at_ns)
    /// is 0 until a timed boundary, and the sources' [`last`](Source::last)
    /// readings stay as they were.
    /// The peaks and records are the same. A built-in source then reads no
    /// clock at all (the process's RSS: two clock reads fewer, about 4 %
    /// of a boundary); it is how every window of the C ABI, which never
    /// reports a window's time, is reset.
    pub fn reset_untimed_into(&mut self, ended: &mut Vec<SourceDelta>) -> Result<()> {
        self.reset_with(ended, Clock::Skip)
    }

    fn reset_with(&mut self, ended: &mut Vec<SourceDelta>, clock: Clock) -> Result<()> {
        let r = self.restart_all(ended, clock);
        if r.is_err() {
            ended.clear();
        }
        r
    }

    fn restart_all(&mut self, ended: &mut Vec<SourceDelta>, clock: Clock) -> Result<()> {
        ended.truncate(self.parts.len());
        if let [p] = self.parts.as_mut_slice() {
            // One source: its boundary is the whole boundary, and commits at
            // once (no later source can fail it).
            let (peak, sample) = {
                let _sweep = self.sweeps.then(Sweep::begin);
                p.source.restart(p.slot, clock)?
            };
            Self::record(p, 0, peak, sample.used, ended);
            p.start = sample;
            self.started_at_ns = Self::time(p, &sample, clock);
            return Ok(());
        }
        self.starts.clear();
        {
            let _sweep = self.sweeps.then(Sweep::begin);
            for (i, p) in self.parts.iter().enumerate() {
                match p.source.begin_restart(p.slot, clock) {
                    Ok((peak, sample)) => {
                        Self::record(p, i, peak, sample.used, ended);
                        self.starts.push(sample);
                    }
                    Err(e) => {
                        for q in &self.parts[..i] {
                            // Fails only on re-entry, which `begin_restart`
                            // refused first; a restart left pending is
                            // overwritten by the next boundary.
                            let _ = q.source.abort_restart(q.slot);
                        }
                        return Err(e);
                    }
                }
            }
        }
        let started_at_ns = Self::time(&self.parts[0], &self.starts[0], clock);
        for (p, start) in self.parts.iter_mut().zip(&self.starts) {
            p.source.commit_restart(p.slot)?;
            p.start = *start;
        }
        self.started_at_ns = started_at_ns;
        Ok(())
    }

    /// When a boundary whose first source read `sample` happened (0 untimed).
    fn time(first: &Part, sample: &Sample, clock: Clock) -> u64 {
        match clock {
            Clock::Read => first.source.boundary_time(sample),
            Clock::Skip => 0,
        }
    }

    /// Writes part `i`'s ended interval into `ended[i]` (pushed when the
    /// vector is shorter).
    fn record(p: &Part, i: usize, peak: u64, used_end: u64, ended: &mut Vec<SourceDelta>) {
        match ended.get_mut(i) {
            Some(slot) => *slot = p.ended_named(peak, used_end, std::mem::take(&mut slot.name)),
            None => ended.push(p.ended(peak, used_end)),
        }
    }

    /// Measures one last time and closes the window.
    pub fn close(self) -> Result<Vec<SourceDelta>> {
        self.measure()
        // Drop frees the slots.
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        for p in &self.parts {
            // Only fails on re-entry from a callback; the slot then stays
            // allocated, which costs a few bytes and no correctness.
            let _ = p.source.close_slot(p.slot);
        }
    }
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("sources", &self.parts.len())
            .field("started_at_ns", &self.started_at_ns)
            .finish()
    }
}
