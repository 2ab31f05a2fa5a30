//! Sinks receive samples (from the monitor) and records (ended traces,
//! windows, phases). Sources are kept apart from sinks: a sink never reads.

use crate::error::Result;
use crate::lock::Lock;
use crate::record::Record;
use crate::sample::{Sample, SourceInfo};

/// Receives what memprobe measures. Every method has a default that does
/// nothing, so a sink implements only what it cares about.
pub trait Sink: Send + Sync {
    /// A reading taken by the monitor.
    fn on_sample(&self, _source: &SourceInfo, _sample: &Sample) {}
    /// An interval that was reported or ended.
    fn on_record(&self, _record: &Record) {}
    /// Finishes output (e.g. renames a file written under a temporary name
    /// into place). Called once when the owner is done; records after it
    /// may be dropped.
    fn finish(&self) -> Result<()> {
        self.flush()
    }
    /// Flushes buffered output.
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

/// A sink that drops everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopSink;

impl Sink for NoopSink {}

/// A sink that keeps everything it receives, for tests and inspection.
#[derive(Debug, Default)]
pub struct SnapshotSink {
    samples: Lock<Vec<(String, Sample)>>,
    records: Lock<Vec<Record>>,
}

impl SnapshotSink {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// The samples received so far, with their source names.
    pub fn samples(&self) -> Vec<(String, Sample)> {
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The records received so far.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Sink for SnapshotSink {
    fn on_sample(&self, source: &SourceInfo, sample: &Sample) {
        // Refused only on re-entry from this thread: nothing to keep then.
        if let Ok(mut s) = self.samples.lock() {
            s.push((source.name.clone(), *sample));
        }
    }
    fn on_record(&self, record: &Record) {
        if let Ok(mut r) = self.records.lock() {
            r.push(record.clone());
        }
    }
}
