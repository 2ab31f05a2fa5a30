//! What the training thread hands to the server: the last ended record of
//! each phase kind, release counts and leak flags, behind a lock held only
//! to store or clone them. A scrape never makes the training thread wait for
//! the rendering, the socket or a source read.

use memprobe_core::internal::lock::Lock;
use memprobe_core::{PhaseKind, Record, Sink};
use std::sync::Arc;

/// Releases and leak state of one source, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SourceTally {
    pub(crate) name: String,
    /// Bytes freed by phase-end releases, summed.
    pub(crate) released_bytes: u64,
    /// Leak flag and streak from the last epoch with a leak policy.
    pub(crate) leak: Option<(bool, u32)>,
}

/// The state rendered under `memprobe_phase_*`, `memprobe_cache_*` and
/// `memprobe_leak_*`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// The last ended step, epoch, experience and stream (custom phases are
    /// not exported: their names are free text).
    pub(crate) last: [Option<Arc<Record>>; 4],
    /// Cache releases fired at phase ends.
    pub(crate) releases: u64,
    pub(crate) sources: Vec<SourceTally>,
}

pub(crate) const KINDS: [PhaseKind; 4] = [
    PhaseKind::Step,
    PhaseKind::Epoch,
    PhaseKind::Experience,
    PhaseKind::Stream,
];

impl Snapshot {
    fn tally(&mut self, name: &str) -> &mut SourceTally {
        let i = match self.sources.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                self.sources.push(SourceTally {
                    name: name.to_owned(),
                    ..SourceTally::default()
                });
                self.sources.len() - 1
            }
        };
        &mut self.sources[i]
    }
}

/// The shared snapshot.
pub(crate) struct Shared {
    state: Lock<Snapshot>,
}

impl Shared {
    pub(crate) fn new() -> Self {
        Shared {
            state: Lock::new(Snapshot::default()),
        }
    }

    /// A copy for rendering (the records are shared, not copied).
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// A tracker sink feeding an exporter. Created by
/// [`Exporter::sink`](crate::Exporter::sink); add it to a tracker with
/// [`Tracker::add_sink`](memprobe_core::Tracker::add_sink).
pub struct MetricsSink {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for MetricsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsSink").finish_non_exhaustive()
    }
}

impl Sink for MetricsSink {
    fn on_record(&self, record: &Record) {
        let Some(phase) = &record.phase else { return };
        let Some(slot) = KINDS.iter().position(|k| *k == phase.kind) else {
            return;
        };
        // Built before locking: the lock is held only to store.
        let record = Arc::new(record.clone());
        let Ok(mut s) = self.shared.state.lock() else {
            return;
        };
        let old = s.last[slot].replace(Arc::clone(&record));
        s.releases += record.releases.len() as u64;
        for e in &record.releases {
            for (d, freed) in record.sources.iter().zip(e.freed()) {
                let t = s.tally(&d.name);
                t.released_bytes = t.released_bytes.saturating_add(freed);
            }
        }
        for (d, l) in record.sources.iter().zip(&record.leaks) {
            s.tally(&d.name).leak = Some((l.flagged, l.streak));
        }
        drop(s);
        // The previous record is freed outside the lock.
        drop(old);
    }
}
