//! A table like fastai's PeakMemMetric: one row per ended epoch (or another
//! phase kind) with each source's delta used and delta peaked in MiB.
//!
//! ```text
//! epoch  cpu used  peak  gpu used  peak
//!     1         0     2        80  6220
//! ```
//!
//! A single host source (process, tree, PSS, USS) is labelled `cpu`, a
//! single GPU source `gpu`; when two sources would share a label, each of
//! them takes its own name instead (`rss`, `tree`, `gpu0`, `gpu1`, ...).
//! Others are labelled by name. With a leak policy a `leak` column names
//! the flagged sources.
//!
//! Writes that fail are not lost: the first error is kept and returned by
//! [`Sink::flush`] / [`Sink::finish`] (the tracker's `finish_sinks`), as the
//! file sinks do.

use crate::delta::{b2mb, b2mb_signed};
use crate::error::{Error, Result};
use crate::phase::PhaseKind;
use crate::sink::{Record, Sink};
use crate::SourceKind;
use std::io::Write;
use std::sync::Mutex;

struct State {
    out: Box<dyn Write + Send>,
    header_done: bool,
    /// The first write error, until flush or finish reports it.
    error: Option<Error>,
}

/// Prints one row per ended phase of one kind.
pub struct TableSink {
    kind: PhaseKind,
    state: Mutex<State>,
}

impl TableSink {
    /// Rows for phases of `kind` (fastai: epochs), written to `out`.
    pub fn new(kind: PhaseKind, out: Box<dyn Write + Send>) -> TableSink {
        TableSink {
            kind,
            state: Mutex::new(State {
                out,
                header_done: false,
                error: None,
            }),
        }
    }

    /// The column labels for a record's sources: fastai's `cpu` / `gpu`
    /// where one source has it alone, the source's name otherwise.
    pub fn labels(record: &Record) -> Vec<String> {
        let short = |kind: SourceKind| match kind {
            SourceKind::Process
            | SourceKind::ProcessTree
            | SourceKind::ProcessPss
            | SourceKind::ProcessUss
            | SourceKind::ProcessTreePss
            | SourceKind::ProcessTreeUss => Some("cpu"),
            SourceKind::GpuDevice | SourceKind::GpuProcess => Some("gpu"),
            _ => None,
        };
        let shared = |label: &str| {
            record
                .sources
                .iter()
                .filter(|d| short(d.kind).unwrap_or(&d.name) == label)
                .count()
                > 1
        };
        record
            .sources
            .iter()
            .map(|d| match short(d.kind) {
                Some(label) if !shared(label) => label.to_owned(),
                _ => d.name.clone(),
            })
            .collect()
    }

    /// The header and row lines for a record (without newlines).
    pub fn format(&self, record: &Record) -> (String, String) {
        let labels = Self::labels(record);
        let first = self.kind.as_str();
        let mut header = format!("{first:>5}");
        let index = record.phase.as_ref().map_or(0, |p| p.index + 1);
        let mut row = format!("{index:>width$}", width = first.len().max(5));
        for (label, d) in labels.iter().zip(&record.sources) {
            let used_w = label.len() + 5;
            header.push_str(&format!("  {label} used  peak"));
            row.push_str(&format!(
                "  {:>used_w$} {:>5}",
                b2mb_signed(d.delta_used),
                b2mb(d.delta_peaked),
            ));
        }
        if !record.leaks.is_empty() {
            let flagged: Vec<&str> = labels
                .iter()
                .zip(&record.leaks)
                .filter(|(_, l)| l.flagged)
                .map(|(n, _)| n.as_str())
                .collect();
            header.push_str("  leak");
            row.push_str(&format!(
                "  {}",
                if flagged.is_empty() {
                    "-".to_owned()
                } else {
                    flagged.join(",")
                }
            ));
        }
        (header, row)
    }
}

impl Sink for TableSink {
    fn on_record(&self, record: &Record) {
        if record.phase.as_ref().map(|p| p.kind) != Some(self.kind) {
            return;
        }
        let (header, row) = self.format(record);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut text = String::new();
        if !st.header_done {
            st.header_done = true;
            text.push_str(&header);
            text.push('\n');
        }
        text.push_str(&row);
        text.push('\n');
        let written = st
            .out
            .write_all(text.as_bytes())
            .and_then(|()| st.out.flush());
        if let Err(e) = written {
            st.error
                .get_or_insert_with(|| Error::io("write the table sink's row", &e));
        }
    }

    fn flush(&self) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        st.out
            .flush()
            .map_err(|e| Error::io("flush the table sink", &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::SourceDelta;
    use crate::phase::PhaseInfo;
    use crate::ErrorKind;
    use crate::PeakFidelity;

    fn delta(name: &str, kind: SourceKind) -> SourceDelta {
        SourceDelta {
            name: name.to_owned(),
            kind,
            fidelity: PeakFidelity::Pushed,
            used_start: 0,
            used_end: 0,
            peak: 0,
            delta_used: 0,
            delta_peaked: 0,
        }
    }

    fn record(sources: Vec<SourceDelta>) -> Record {
        let mut r = Record::new("epoch", 0, 1, sources);
        r.phase = Some(PhaseInfo {
            kind: PhaseKind::Epoch,
            name: "epoch".into(),
            index: 0,
            depth: 0,
        });
        r
    }

    #[test]
    fn labels_use_names_when_they_would_collide() {
        let r = record(vec![
            delta("rss", SourceKind::Process),
            delta("tree", SourceKind::ProcessTree),
            delta("gpu0", SourceKind::GpuDevice),
        ]);
        assert_eq!(TableSink::labels(&r), ["rss", "tree", "gpu"]);
        let r = record(vec![
            delta("rss", SourceKind::Process),
            delta("gpu0", SourceKind::GpuDevice),
            delta("gpu1", SourceKind::GpuDevice),
        ]);
        assert_eq!(TableSink::labels(&r), ["cpu", "gpu0", "gpu1"]);
        // A custom source named "cpu" collides with the host source's label.
        let r = record(vec![
            delta("rss", SourceKind::Process),
            delta("cpu", SourceKind::Custom),
        ]);
        assert_eq!(TableSink::labels(&r), ["rss", "cpu"]);
    }

    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(9))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn write_errors_surface_at_finish() {
        let sink = TableSink::new(PhaseKind::Epoch, Box::new(Broken));
        sink.on_record(&record(vec![delta("rss", SourceKind::Process)]));
        let e = sink.finish().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.message().contains("table sink"), "{}", e.message());
        // Reported once.
        assert!(sink.finish().is_ok());
    }
}
