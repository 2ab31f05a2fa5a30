//! CSV: one row per record and source, written safely (see [`AtomicFile`]).

use super::atomic_file::AtomicFile;
use crate::error::Result;
use crate::record::Record;
use crate::sink::Sink;
use std::path::Path;

/// The header row.
pub const CSV_HEADER: &str = "label,phase,index,depth,started_at_ns,ended_at_ns,duration_ns,source,source_kind,fidelity,used_start,used_end,peak,delta_used,delta_peaked,leak_flagged,releases\n";

/// Writes one CSV row per record and source.
#[derive(Debug)]
pub struct CsvSink {
    file: AtomicFile,
}

impl CsvSink {
    /// Creates the sink (header written now); the file appears at `path`
    /// when finished.
    pub fn create(path: impl AsRef<Path>) -> Result<CsvSink> {
        let file = AtomicFile::create(path)?;
        file.write_line(CSV_HEADER)?;
        Ok(CsvSink { file })
    }
}

fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

impl Sink for CsvSink {
    fn on_record(&self, r: &Record) {
        let mut rows = String::new();
        let (phase, index, depth) = match &r.phase {
            Some(p) => (p.kind.as_str(), p.index.to_string(), p.depth.to_string()),
            None => ("", String::new(), String::new()),
        };
        for (i, d) in r.sources.iter().enumerate() {
            let leak = r
                .leaks
                .get(i)
                .map_or(String::new(), |l| l.flagged.to_string());
            rows.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                field(&r.label),
                phase,
                index,
                depth,
                r.started_at_ns,
                r.ended_at_ns,
                r.duration_ns(),
                field(&d.name),
                d.kind.as_str(),
                d.fidelity.as_str(),
                d.used_start,
                d.used_end,
                d.peak,
                d.delta_used,
                d.delta_peaked,
                leak,
                r.releases.len()
            ));
        }
        self.file.write_line_or_keep_error(&rows);
    }

    fn finish(&self) -> Result<()> {
        self.file.finish()
    }
}
