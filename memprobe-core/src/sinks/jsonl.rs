//! JSON Lines: one object per record, written safely (see [`AtomicFile`]).

use super::atomic_file::AtomicFile;
use super::json;
use crate::error::Result;
use crate::sink::{Record, Sink};
use std::path::Path;
use std::sync::Mutex;

/// Writes each record as one JSON object per line.
#[derive(Debug)]
pub struct JsonlSink {
    file: AtomicFile,
    error: Mutex<Option<crate::Error>>,
}

impl JsonlSink {
    /// Creates the sink; the file appears at `path` when finished.
    pub fn create(path: impl AsRef<Path>) -> Result<JsonlSink> {
        Ok(JsonlSink {
            file: AtomicFile::create(path)?,
            error: Mutex::new(None),
        })
    }
}

impl Sink for JsonlSink {
    fn on_record(&self, record: &Record) {
        let mut line = json::record(record);
        line.push('\n');
        if let Err(e) = self.file.write_line(&line) {
            self.error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    }

    fn finish(&self) -> Result<()> {
        if let Some(e) = self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        self.file.finish()
    }
}
