//! A table like fastai's PeakMemMetric: one row per ended epoch (or another
//! phase kind) with each source's delta used and delta peaked in MiB.
//!
//! ```text
//! epoch  cpu used  peak  gpu used  peak
//!     1         0     2        80  6220
//! ```
//!
//! Process sources are labelled `cpu`, a single GPU source `gpu` (several:
//! their names, `gpu0`, `gpu1`, ...), others by name. With a leak policy a
//! `leak` column names the flagged sources.

use crate::delta::{b2mb, b2mb_signed};
use crate::phase::PhaseKind;
use crate::sink::{Record, Sink};
use crate::SourceKind;
use std::io::Write;
use std::sync::Mutex;

struct State {
    out: Box<dyn Write + Send>,
    header_done: bool,
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
            }),
        }
    }

    /// The column labels for a record's sources.
    pub fn labels(record: &Record) -> Vec<String> {
        let gpus = record
            .sources
            .iter()
            .filter(|d| matches!(d.kind, SourceKind::GpuDevice | SourceKind::GpuProcess))
            .count();
        record
            .sources
            .iter()
            .map(|d| match d.kind {
                SourceKind::Process
                | SourceKind::ProcessTree
                | SourceKind::ProcessPss
                | SourceKind::ProcessUss => "cpu".to_owned(),
                SourceKind::GpuDevice | SourceKind::GpuProcess if gpus == 1 => "gpu".to_owned(),
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
        if !st.header_done {
            st.header_done = true;
            let _ = writeln!(st.out, "{header}");
        }
        let _ = writeln!(st.out, "{row}");
        let _ = st.out.flush();
    }
}
