//! The Sampler trait: one source of readings.

use crate::error::Result;
use crate::sample::{Sample, SourceInfo};

/// Reads one source of memory readings.
///
/// A sampler is owned by a [`Source`](crate::Source), which serialises calls
/// (a sampler never sees two calls at once) and implements peak windows on top
/// of it. Implementations only read; they keep no window state.
///
/// Peak fidelity (see [`SourceInfo::fidelity`]):
/// - [`Exact`](crate::PeakFidelity::Exact) samplers implement
///   [`read_peak`](Sampler::read_peak) and [`reset_peak`](Sampler::reset_peak)
///   over a high-water mark the kernel, a driver or a framework keeps
///   (see [`MarkGroup`](crate::MarkGroup) for a caller's marks).
/// - [`Sampled`](crate::PeakFidelity::Sampled) samplers only implement
///   [`read`](Sampler::read); the monitor polls them.
/// - [`Pushed`](crate::PeakFidelity::Pushed) sources are fed by the caller.
pub trait Sampler: Send {
    /// What this sampler measures. Must not change over the sampler's life.
    fn info(&self) -> SourceInfo;

    /// Takes one reading now.
    fn read(&mut self) -> Result<Sample>;

    /// The bytes in use now, without the rest of a reading (no clock read,
    /// no other field): what [`Source::read_used`](crate::Source::read_used)
    /// asks for on a hot path. The default reads.
    fn read_used(&mut self) -> Result<u64> {
        self.read().map(|s| s.used)
    }

    /// The high-water mark of `used` since the last [`reset_peak`](Sampler::reset_peak)
    /// (or since the source began), in bytes. `Ok(None)` when this sampler
    /// keeps no high-water mark (the default).
    fn read_peak(&mut self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// The high-water mark as a window boundary reads it, right before
    /// [`reset_peak`](Sampler::reset_peak), whose reading the boundary also
    /// folds into the ended interval's peak: a sampler may leave out what
    /// that reading covers (the kernel's mark reads no `statm` of its own
    /// there). The default is [`read_peak`](Sampler::read_peak).
    fn read_peak_before_reset(&mut self) -> Result<Option<u64>> {
        self.read_peak()
    }

    /// Resets the high-water mark to the current value and returns a reading
    /// taken right after the reset (the start of the next interval). Only
    /// called on samplers whose `read_peak` returns `Some`. The default just
    /// reads.
    fn reset_peak(&mut self) -> Result<Sample> {
        self.read()
    }

    /// [`reset_peak`](Sampler::reset_peak) for a boundary that keeps no
    /// time: the bytes alone (no clock read where the sampler can skip
    /// it). The default resets and keeps the reading's bytes.
    fn reset_peak_used(&mut self) -> Result<u64> {
        self.reset_peak().map(|s| s.used)
    }

    /// Re-opens whatever the sampler keeps open after `fork()` in the child,
    /// where descriptors opened on `/proc/self/...` still point at the parent.
    /// The default does nothing.
    fn after_fork(&mut self) {}
}
