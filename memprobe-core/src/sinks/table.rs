//! A table like fastai's PeakMemMetric: one row per ended epoch (or another
//! phase kind) with each source's delta used and delta peaked in MiB.
//!
//! ```text
//! epoch  rss used  peak  gpu0 used  peak
//!     0         0     2         80  6220
//! ```
//!
//! Each column is labelled by its source's name and each row numbered as
//! the phase is everywhere else (from 0), so a row reads against the
//! summary, the JSON and `memprobe run`'s report. With a leak policy a
//! `leak` column names the flagged sources.
//!
//! A row is written after what the program's C stdio had buffered for
//! `stdout` and `stderr` (both are flushed first): a table on fd 1 or 2
//! lands where the program printed it, not ahead of the lines printed
//! before it. (Only those two streams: `fflush(NULL)` would also wait on a
//! stream another thread holds, e.g. one blocked reading.) Python's own
//! `sys.stdout` buffer is flushed by the Python binding.
//!
//! Writes that fail are not lost: the first error is kept and returned by
//! [`Sink::flush`] / [`Sink::finish`] (the tracker's `finish_sinks`), as the
//! file sinks do.

use crate::delta::{b2mb, b2mb_signed};
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::phase::PhaseKind;
use crate::record::Record;
use crate::sink::Sink;
use std::io::Write;

extern "C" {
    // C's standard streams (glibc and musl export them by these names).
    static mut stdout: *mut libc::FILE;
    static mut stderr: *mut libc::FILE;
}

/// Flushes what the program's C stdio holds for `stdout` and `stderr`, so
/// a row written to fd 1 or 2 comes after it.
fn flush_stdio() {
    // SAFETY: the streams are initialised before main and never freed;
    // fflush is thread-safe. Reading the pointers copies them.
    unsafe {
        let (out, err) = (stdout, stderr);
        libc::fflush(out);
        libc::fflush(err);
    }
}

struct State {
    out: Box<dyn Write + Send>,
    header_done: bool,
    /// The first write error, until flush or finish reports it.
    error: Option<Error>,
}

/// Prints one row per ended phase of one kind.
pub struct TableSink {
    kind: PhaseKind,
    state: Lock<State>,
}

impl TableSink {
    /// Rows for phases of `kind` (fastai: epochs), written to `out`.
    pub fn new(kind: PhaseKind, out: Box<dyn Write + Send>) -> TableSink {
        TableSink {
            kind,
            state: Lock::new(State {
                out,
                header_done: false,
                error: None,
            }),
        }
    }

    /// The column labels for a record's sources: their names.
    pub fn labels(record: &Record) -> Vec<String> {
        record.sources.iter().map(|d| d.name.clone()).collect()
    }

    /// The header and row lines for a record (without newlines).
    pub fn format(&self, record: &Record) -> (String, String) {
        let labels = Self::labels(record);
        let first = self.kind.as_str();
        let mut header = format!("{first:>5}");
        let index = record.phase.as_ref().map_or(0, |p| p.index);
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
        // Refused only when the writer calls back into this sink (re-entry
        // from this thread): that row is not written.
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let mut text = String::new();
        if !st.header_done {
            st.header_done = true;
            text.push_str(&header);
            text.push('\n');
        }
        text.push_str(&row);
        text.push('\n');
        flush_stdio();
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
        let mut st = self.state.lock()?;
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
    use crate::SourceKind;

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
    fn columns_are_the_sources_names_and_rows_count_from_zero() {
        let r = record(vec![
            delta("rss", SourceKind::Process),
            delta("tree", SourceKind::ProcessTree),
            delta("gpu0", SourceKind::GpuDevice),
        ]);
        assert_eq!(TableSink::labels(&r), ["rss", "tree", "gpu0"]);
        let r = record(vec![delta("rss", SourceKind::Process)]);
        let (header, row) = TableSink::new(PhaseKind::Epoch, Box::new(Vec::new())).format(&r);
        assert_eq!(header, "epoch  rss used  peak");
        assert_eq!(row, "    0         0     0");
    }

    /// A host's fork while another thread writes a row waits for it: the
    /// child's next row does not deadlock on a sink held by a thread the
    /// child does not have.
    #[test]
    fn a_fork_while_a_row_is_written_leaves_the_child_a_free_sink() {
        let sink = std::sync::Arc::new(TableSink::new(PhaseKind::Epoch, Box::new(Vec::new())));
        let held = sink.clone();
        crate::fork::fork_test::fork_while_held(
            move |inside, leaving| {
                let st = held.state.lock().expect("not re-entered");
                inside();
                leaving();
                drop(st);
            },
            || {
                sink.on_record(&record(vec![delta("rss", SourceKind::Process)]));
                sink.finish().is_ok()
            },
        );
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
