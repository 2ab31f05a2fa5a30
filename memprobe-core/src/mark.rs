//! Exact sources over a caller's resettable high-water marks.
//!
//! Frameworks keep marks of their own: PyTorch's caching allocator keeps the
//! peak of allocated, reserved and active bytes per device since the last
//! `reset_peak_memory_stats`. Such a mark is as good as the kernel's `VmHWM`:
//! a [`Source`](crate::Source) over it folds the mark into every open window
//! and resets it at each window boundary, so one global counter becomes any
//! number of concurrent, nested, independently resettable windows (fidelity
//! [`Exact`](crate::PeakFidelity::Exact), no polling).
//!
//! One framework reset usually clears several marks at once, so the marks
//! come as a [`MarkGroup`]: the caller's three functions ([`Marks`]) behind
//! one lock, and one source per mark. Before the shared reset that any
//! member's boundary makes, the group reads the mark of every other member
//! and carries it until that member's own next fold: a reset through one
//! source never loses another's peak.
//!
//! A window over several members of one group resets the group once per
//! boundary, not once per member: the other members' intervals end at the
//! first member's reset (one `reset_peak_memory_stats` per step for a
//! window over a device's allocated and reserved bytes).

use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One window boundary over several sources (a [`Window`](crate::Window)'s
/// open or reset), on this thread. Within a sweep, the members of one group
/// share its one reset: the first member's boundary carries every other
/// member's mark and resets the group; the others' intervals then end at
/// that same reset instead of making one reset each. That is the same
/// partition of time with one framework reset per group instead of one per
/// member (a window over PyTorch's allocated and reserved bytes: one
/// `reset_peak_memory_stats` per step, not two).
pub(crate) struct Sweep {
    outer: u64,
}

/// Sweep ids are handed to threads in blocks of this many, so that
/// beginning a sweep touches no line another thread writes.
const SWEEP_BLOCK: u64 = 1 << 16;

/// The next block of sweep ids (0 is "outside any sweep").
static SWEEPS: AtomicU64 = AtomicU64::new(1);

/// This thread's sweep now, and what is left of its block of ids.
struct ThreadSweeps {
    current: Cell<u64>,
    next: Cell<u64>,
    end: Cell<u64>,
}

thread_local! {
    static SWEEP: ThreadSweeps = const {
        ThreadSweeps {
            current: Cell::new(0),
            next: Cell::new(0),
            end: Cell::new(0),
        }
    };
}

impl Sweep {
    /// Begins a sweep on this thread (a nested one, e.g. a callback opening
    /// a window, gets its own id and restores the outer one when it ends).
    pub(crate) fn begin() -> Sweep {
        SWEEP.with(|s| {
            let mut id = s.next.get();
            if id == s.end.get() {
                id = SWEEPS.fetch_add(SWEEP_BLOCK, Ordering::Relaxed);
                s.end.set(id + SWEEP_BLOCK);
            }
            s.next.set(id + 1);
            Sweep {
                outer: s.current.replace(id),
            }
        })
    }

    fn current() -> u64 {
        SWEEP.with(|s| s.current.get())
    }
}

impl Drop for Sweep {
    fn drop(&mut self) {
        SWEEP.with(|s| s.current.set(self.outer));
    }
}

/// Which value of a mark [`Marks::read_many`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkValue {
    /// The bytes in use now ([`Marks::current`]).
    Current,
    /// The high-water mark since the last reset ([`Marks::peak`]).
    Peak,
}

/// The caller's marks: the three functions a [`MarkGroup`] calls, each
/// under the group's lock (never two at once for one group).
///
/// A boundary reads a mark, then resets it: an allocation that rises and
/// falls on another thread between the two is in neither interval, as with
/// the kernel's `VmHWM`. Allocations made by the thread that makes the
/// boundaries (a training loop's) are always counted.
///
/// `index` is the caller's own number for one mark (e.g. device × 3 +
/// allocated / reserved / active), given to
/// [`Source::over_mark`](crate::Source::over_mark). An error returned by any
/// function fails the memprobe call that needed it (a read, a window
/// boundary) and leaves every window's peak intact.
pub trait Marks: Send {
    /// Bytes in use now for mark `index`.
    fn current(&mut self, index: usize) -> Result<u64>;

    /// The high-water mark of `index` since the last [`reset`](Marks::reset),
    /// in bytes. A mark below the current value (a framework bug) does not
    /// lower a window's peak: memprobe also reads [`current`](Marks::current)
    /// whenever it reports a peak, and a peak is never below a reading.
    fn peak(&mut self, index: usize) -> Result<u64>;

    /// Resets every mark of the group to its current value.
    fn reset(&mut self) -> Result<()>;

    /// Reads `what` of every mark in `indices` into `out` (as long as
    /// `indices`) in one call, for marks that come from one snapshot
    /// (PyTorch's statistics: one `memory_stats` read gives every mark of a
    /// device). With it, a window boundary over a group costs three calls
    /// whatever the number of members: every peak, the reset, every
    /// current value. The other members' peaks are then read at the start
    /// of the boundary rather than right before the reset: the gap in which
    /// another thread's rise and fall is in neither interval widens by the
    /// boundary's own work, as it already is for the member whose boundary
    /// it is.
    ///
    /// `None` (the default): this implementation reads one mark at a time,
    /// and the group calls [`current`](Marks::current) and
    /// [`peak`](Marks::peak) for the marks it needs only.
    fn read_many(
        &mut self,
        what: MarkValue,
        indices: &[usize],
        out: &mut [u64],
    ) -> Option<Result<()>> {
        let _ = (what, indices, out);
        None
    }
}

/// A group of exact sources over marks that share one reset.
///
/// Cloning is cheap; every clone names the same group. The group lives as
/// long as any of its clones or sources.
///
/// # Example
///
/// ```
/// use memprobe_core::{MarkGroup, Marks, Result, Source, SourceKind, Window};
/// use std::sync::{Arc, Mutex};
///
/// /// A stand-in for a framework's allocator: two marks, one reset.
/// #[derive(Default)]
/// struct Allocator { now: [u64; 2], peak: [u64; 2] }
///
/// impl Allocator {
///     fn set(&mut self, i: usize, bytes: u64) {
///         self.now[i] = bytes;
///         self.peak[i] = self.peak[i].max(bytes);
///     }
/// }
///
/// struct Shared(Arc<Mutex<Allocator>>);
///
/// impl Marks for Shared {
///     fn current(&mut self, i: usize) -> Result<u64> { Ok(self.0.lock().unwrap().now[i]) }
///     fn peak(&mut self, i: usize) -> Result<u64> { Ok(self.0.lock().unwrap().peak[i]) }
///     fn reset(&mut self) -> Result<()> {
///         let mut a = self.0.lock().unwrap();
///         a.peak = a.now;
///         Ok(())
///     }
/// }
///
/// # fn main() -> Result<()> {
/// let alloc = Arc::new(Mutex::new(Allocator::default()));
/// let group = MarkGroup::new(Box::new(Shared(alloc.clone())));
/// let allocated = Source::over_mark(&group, 0, "alloc:0", SourceKind::GpuProcess)?;
/// let reserved = Source::over_mark(&group, 1, "reserved:0", SourceKind::GpuProcess)?;
///
/// let epoch = Window::open(&[allocated.clone(), reserved.clone()])?;
/// alloc.lock().unwrap().set(1, 8 << 20); // the cache grows...
/// alloc.lock().unwrap().set(1, 2 << 20); // ...and is emptied
///
/// // Opening a window over `allocated` resets both marks, yet the epoch
/// // keeps the reserved peak: it was carried before the reset.
/// let step = Window::open(&[allocated.clone()])?;
/// alloc.lock().unwrap().set(0, 1 << 20);
/// alloc.lock().unwrap().set(0, 0);
/// assert_eq!(step.peaks()?, vec![1 << 20]);
/// assert_eq!(epoch.peaks()?, vec![1 << 20, 8 << 20]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MarkGroup {
    shared: Arc<Group>,
}

struct Group {
    state: Lock<GroupState>,
}

struct GroupState {
    marks: Box<dyn Marks>,
    members: Vec<Member>,
    /// The sweep in which the group was last reset (0: outside any sweep).
    reset_in: u64,
    /// The sweep in which every member's peak was read and carried in one
    /// [`Marks::read_many`] (0: none).
    peaks_read_in: u64,
}

struct Member {
    index: usize,
    /// The highest mark read for this member at other members' resets since
    /// its own last boundary: folded into its windows at its next fold.
    carried: Option<u64>,
    /// Carried at the group's reset in sweep `reset_in`, with no boundary of
    /// its own since: within that sweep, its interval ends at that reset.
    swept: bool,
    /// Its value read right after that reset, when the group reads every
    /// member at once: the start of its next interval.
    current_at_reset: Option<u64>,
}

impl MarkGroup {
    /// A group over the caller's `marks`.
    pub fn new(marks: Box<dyn Marks>) -> MarkGroup {
        MarkGroup {
            shared: Arc::new(Group {
                state: Lock::new(GroupState {
                    marks,
                    members: Vec::new(),
                    reset_in: 0,
                    peaks_read_in: 0,
                }),
            }),
        }
    }

    /// The sampler of member `index`, registered in the group until it
    /// drops. Used by [`Source::over_mark`].
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a
    /// bad name, or when `index` already has a source in this group.
    pub(crate) fn member(&self, index: usize, name: &str, kind: SourceKind) -> Result<MarkSampler> {
        crate::sample::check_name("a source name", name)?;
        let mut st = self.shared.state.lock()?;
        if st.members.iter().any(|m| m.index == index) {
            return Err(Error::invalid(format!(
                "mark {index} already has a source in this group"
            )));
        }
        st.members.push(Member {
            index,
            carried: None,
            swept: false,
            current_at_reset: None,
        });
        Ok(MarkSampler {
            group: Arc::clone(&self.shared),
            index,
            info: SourceInfo {
                name: name.to_owned(),
                kind,
                fidelity: PeakFidelity::Exact,
            },
        })
    }

    /// How many sources of this group exist.
    pub fn len(&self) -> Result<usize> {
        Ok(self.shared.state.lock()?.members.len())
    }

    /// Whether the group has no source.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }
}

impl std::fmt::Debug for MarkGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MarkGroup").finish_non_exhaustive()
    }
}

/// Names the failing function and the source in a caller's error.
fn context(e: Error, what: &str, info: &SourceInfo, index: usize) -> Error {
    Error::new(
        e.kind(),
        format!(
            "source '{}': {what} of mark {index} failed: {}",
            info.name,
            e.message()
        ),
    )
}

impl GroupState {
    fn indices(&self) -> Vec<usize> {
        self.members.iter().map(|m| m.index).collect()
    }

    /// Reads `what` of every member in one call, when the marks can and the
    /// group has several members (`None` otherwise).
    fn read_all(
        &mut self,
        what: MarkValue,
        info: &SourceInfo,
        index: usize,
    ) -> Option<Result<Vec<u64>>> {
        if self.members.len() < 2 {
            return None;
        }
        let indices = self.indices();
        let mut out = vec![0; indices.len()];
        let r = self.marks.read_many(what, &indices, &mut out)?;
        let label = match what {
            MarkValue::Current => "reading the current values",
            MarkValue::Peak => "reading the peaks",
        };
        Some(r.map(|()| out).map_err(|e| context(e, label, info, index)))
    }

    /// Carries `peak` for member `i` (by position) until its own next fold.
    fn carry(&mut self, i: usize, peak: u64) {
        let m = &mut self.members[i];
        m.carried = Some(m.carried.map_or(peak, |c| c.max(peak)));
    }

    /// Carries `peaks` (one per member, in order) for every member but
    /// `index`, and returns `index`'s.
    fn carry_others(&mut self, index: usize, peaks: Vec<u64>) -> u64 {
        let mut own = 0;
        for (i, peak) in peaks.into_iter().enumerate() {
            if self.members[i].index == index {
                own = peak;
            } else {
                self.carry(i, peak);
            }
        }
        own
    }

    /// Carries every other member's mark, then resets the group. On error
    /// the marks are not reset (or were, with every other mark carried).
    /// Returns `index`'s value right after the reset when the group read
    /// every member's at once.
    fn reset(&mut self, index: usize, info: &SourceInfo) -> Result<Option<u64>> {
        let sweep = Sweep::current();
        let carried_already = sweep != 0 && self.peaks_read_in == sweep && self.reset_in != sweep;
        if !carried_already {
            match self.read_all(MarkValue::Peak, info, index) {
                Some(peaks) => {
                    self.carry_others(index, peaks?);
                }
                None => {
                    for i in 0..self.members.len() {
                        let other = self.members[i].index;
                        if other == index {
                            continue;
                        }
                        let peak = self
                            .marks
                            .peak(other)
                            .map_err(|e| context(e, "reading the peak", info, other))?;
                        self.carry(i, peak);
                    }
                }
            }
        }
        self.marks
            .reset()
            .map_err(|e| context(e, "the shared reset", info, index))?;
        self.reset_in = sweep;
        for m in &mut self.members {
            m.swept = self.reset_in != 0 && m.index != index;
            m.current_at_reset = None;
            if m.index == index {
                m.carried = None;
            }
        }
        if sweep == 0 {
            return Ok(None);
        }
        // Within a sweep the other members' intervals end at this reset and
        // start from their value right after it: read them all at once.
        let Some(now) = self.read_all(MarkValue::Current, info, index) else {
            return Ok(None);
        };
        let mut own = None;
        for (m, v) in self.members.iter_mut().zip(now?) {
            if m.index == index {
                own = Some(v);
            } else {
                m.current_at_reset = Some(v);
            }
        }
        Ok(own)
    }

    /// Whether member `index`'s interval already ended at the group's reset
    /// in the sweep under way (see [`Sweep`]).
    fn swept(&self, index: usize) -> bool {
        let now = Sweep::current();
        now != 0 && self.reset_in == now && self.members.iter().any(|m| m.index == index && m.swept)
    }
}

/// One member of a group, owned by its source.
pub(crate) struct MarkSampler {
    group: Arc<Group>,
    index: usize,
    info: SourceInfo,
}

impl MarkSampler {
    /// A sample of `known` (a value the group read already) or of a fresh
    /// reading.
    fn current(&self, st: &mut GroupState, known: Option<u64>) -> Result<Sample> {
        let t0 = monotonic_ns();
        let used = match known {
            Some(v) => v,
            None => st
                .marks
                .current(self.index)
                .map_err(|e| context(e, "reading the current value", &self.info, self.index))?,
        };
        Ok(Sample {
            used,
            taken_at_ns: t0,
            read_ns: monotonic_ns().saturating_sub(t0),
            ..Sample::default()
        })
    }
}

impl Sampler for MarkSampler {
    fn info(&self) -> SourceInfo {
        self.info.clone()
    }

    fn read(&mut self) -> Result<Sample> {
        let mut st = self.group.state.lock()?;
        self.current(&mut st, None)
    }

    fn read_peak(&mut self) -> Result<Option<u64>> {
        let mut st = self.group.state.lock()?;
        if st.swept(self.index) {
            // The interval ends at the sweep's reset: what the mark has seen
            // since belongs to the next one (the mark keeps it).
            let carried = st.members.iter().find(|m| m.index == self.index);
            return Ok(Some(carried.and_then(|m| m.carried).unwrap_or(0)));
        }
        let sweep = Sweep::current();
        let peak = if sweep != 0 && st.reset_in != sweep {
            // A boundary under way: read every member's peak at once and
            // carry the others' to the reset that follows in this sweep.
            match st.read_all(MarkValue::Peak, &self.info, self.index) {
                Some(peaks) => {
                    let own = st.carry_others(self.index, peaks?);
                    st.peaks_read_in = sweep;
                    Some(own)
                }
                None => None,
            }
        } else {
            None
        };
        let peak = match peak {
            Some(p) => p,
            None => st
                .marks
                .peak(self.index)
                .map_err(|e| context(e, "reading the peak", &self.info, self.index))?,
        };
        let carried = st
            .members
            .iter()
            .find(|m| m.index == self.index)
            .and_then(|m| m.carried);
        Ok(Some(carried.map_or(peak, |c| c.max(peak))))
    }

    fn reset_peak(&mut self) -> Result<Sample> {
        let mut st = self.group.state.lock()?;
        let known = if st.swept(self.index) {
            // Reset already, by the sweep's first member: start from there.
            st.members
                .iter_mut()
                .find(|m| m.index == self.index)
                .and_then(|m| {
                    m.carried = None;
                    m.swept = false;
                    m.current_at_reset.take()
                })
        } else {
            st.reset(self.index, &self.info)?
        };
        self.current(&mut st, known)
    }
}

impl Drop for MarkSampler {
    fn drop(&mut self) {
        // Refused only on re-entry from one of the group's own functions;
        // the member then stays: one extra peak read per reset, and its
        // index stays taken.
        if let Ok(mut st) = self.group.state.lock() {
            st.members.retain(|m| m.index != self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::source::Source;

    struct Fixed;
    impl Marks for Fixed {
        fn current(&mut self, _: usize) -> Result<u64> {
            Ok(1)
        }
        fn peak(&mut self, _: usize) -> Result<u64> {
            Ok(1)
        }
        fn reset(&mut self) -> Result<()> {
            Err(Error::new(ErrorKind::Io, "unreachable"))
        }
    }

    #[test]
    fn an_index_has_one_source_at_a_time() {
        let g = MarkGroup::new(Box::new(Fixed));
        let a = Source::over_mark(&g, 3, "a", SourceKind::Custom).unwrap();
        let e = Source::over_mark(&g, 3, "b", SourceKind::Custom).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(g.len().unwrap(), 1);
        drop(a);
        assert!(g.is_empty().unwrap());
        Source::over_mark(&g, 3, "b", SourceKind::Custom).unwrap();
        assert_eq!(
            Source::over_mark(&g, 4, "", SourceKind::Custom)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
    }
}
