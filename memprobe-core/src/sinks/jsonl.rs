//! JSON Lines: one object per record, written safely (see [`AtomicFile`]).

use super::atomic_file::AtomicFile;
use super::json;
use crate::error::Result;
use crate::record::Record;
use crate::sink::Sink;
use std::path::Path;

/// Writes each record as one JSON object per line.
#[derive(Debug)]
pub struct JsonlSink {
    file: AtomicFile,
}

impl JsonlSink {
    /// Creates the sink; the file appears at `path` when finished.
    pub fn create(path: impl AsRef<Path>) -> Result<JsonlSink> {
        Ok(JsonlSink {
            file: AtomicFile::create(path)?,
        })
    }
}

impl Sink for JsonlSink {
    fn on_record(&self, record: &Record) {
        let mut line = json::record(record);
        line.push('\n');
        self.file.write_line_or_keep_error(&line);
    }

    fn finish(&self) -> Result<()> {
        self.file.finish()
    }
}
