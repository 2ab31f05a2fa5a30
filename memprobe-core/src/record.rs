//! `Record`: what one measured interval came to (an ended trace, window or
//! phase), as sinks and observers receive it.

use crate::delta::SourceDelta;
use crate::leak::LeakStatus;
use crate::phase::PhaseInfo;
use crate::release::ReleaseEvent;

/// The record of one measured interval.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// What was measured: a trace's `ctx: note`, a phase's name.
    pub label: String,
    /// Start of the interval, monotonic nanoseconds.
    pub started_at_ns: u64,
    /// End of the interval (or the moment of the report), monotonic nanoseconds.
    pub ended_at_ns: u64,
    /// One entry per source, in the order the sources were given.
    pub sources: Vec<SourceDelta>,
    /// The phase, for records of a [`Tracker`](crate::Tracker).
    pub phase: Option<PhaseInfo>,
    /// Leak trend per source (epoch records with a leak policy; else empty).
    pub leaks: Vec<LeakStatus>,
    /// Cache releases fired at the end of this phase.
    pub releases: Vec<ReleaseEvent>,
}

impl Record {
    /// Builds a record.
    pub fn new(
        label: impl Into<String>,
        started_at_ns: u64,
        ended_at_ns: u64,
        sources: Vec<SourceDelta>,
    ) -> Self {
        Record {
            label: label.into(),
            started_at_ns,
            ended_at_ns,
            sources,
            phase: None,
            leaks: Vec::new(),
            releases: Vec::new(),
        }
    }

    /// Duration of the interval, nanoseconds.
    pub fn duration_ns(&self) -> u64 {
        self.ended_at_ns.saturating_sub(self.started_at_ns)
    }
}
