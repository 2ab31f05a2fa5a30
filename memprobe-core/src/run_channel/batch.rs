//! A tracker's steps not sent yet: their ends folded into one `steps`
//! message (how many, the first and last, and per source the step with the
//! largest peak), sent once due ([`BATCH_NS`], [`BATCH_STEPS`]).

use super::protocol::{Outgoing, PeakOut};
use super::{BATCH_NS, BATCH_STEPS};
use crate::record::Record;

/// The steps of one tracker not sent yet.
#[derive(Debug)]
pub(super) struct Batch {
    pub(super) tracker: u64,
    name: String,
    depth: u32,
    pub(super) count: u64,
    first: u64,
    last: u64,
    started_ns: u64,
    ended_ns: u64,
    /// Whether a step began when (or after) the last one ended.
    pub(super) next: bool,
    releases: u64,
    truncated: bool,
    /// Per source, the step with the largest peak.
    peaks: Vec<PeakOut>,
}

impl Batch {
    /// An empty batch of `tracker`'s steps.
    pub(super) fn new(tracker: u64) -> Batch {
        Batch {
            tracker,
            name: String::new(),
            depth: 0,
            count: 0,
            first: 0,
            last: 0,
            started_ns: 0,
            ended_ns: 0,
            next: false,
            releases: 0,
            truncated: false,
            peaks: Vec::new(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether a step of `name` at `depth` belongs in this batch.
    pub(super) fn fits(&self, name: &str, depth: u32) -> bool {
        self.is_empty() || (self.name == name && self.depth == depth)
    }

    pub(super) fn add(&mut self, record: &Record, name: &str, index: u64, depth: u32, next: bool) {
        if self.is_empty() {
            self.name.clear();
            self.name.push_str(name);
            self.depth = depth;
            self.first = index;
            self.started_ns = record.started_at_ns;
            self.releases = 0;
            self.truncated = false;
            self.peaks.clear();
        }
        self.count += 1;
        self.last = index;
        self.ended_ns = record.ended_at_ns;
        self.next = next;
        self.releases += record.releases.len() as u64;
        for (i, d) in record.sources.iter().enumerate() {
            // The same sources in the same order at every step: found at
            // its place without a search, its name copied only once.
            let at = match self.peaks.get(i) {
                Some(p) if p.delta.name == d.name => Some(i),
                _ => self.peaks.iter().position(|p| p.delta.name == d.name),
            };
            match at {
                Some(j) => {
                    let p = &mut self.peaks[j];
                    if d.peak > p.delta.peak {
                        p.delta.clone_from(d);
                        (p.index, p.started_ns, p.ended_ns) =
                            (index, record.started_at_ns, record.ended_at_ns);
                    }
                }
                None => self.peaks.push(PeakOut {
                    delta: d.clone(),
                    index,
                    started_ns: record.started_at_ns,
                    ended_ns: record.ended_at_ns,
                }),
            }
        }
    }

    /// Whether it should go out now.
    pub(super) fn due(&self) -> bool {
        self.count >= BATCH_STEPS || self.ended_ns.saturating_sub(self.started_ns) >= BATCH_NS
    }

    /// The message that sends it.
    pub(super) fn outgoing(&self) -> Outgoing<'_> {
        Outgoing::Steps {
            name: &self.name,
            depth: self.depth,
            first: self.first,
            last: self.last,
            count: self.count,
            started_ns: self.started_ns,
            ended_ns: self.ended_ns,
            next: self.next,
            releases: self.releases,
            truncated: self.truncated,
            peaks: &self.peaks,
        }
    }

    pub(super) fn clear(&mut self) {
        self.count = 0;
        self.next = false;
    }
}
