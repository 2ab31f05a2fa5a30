//! Where a report goes: a file (written whole, then renamed into place),
//! a writer for each rendering, a callback.

use super::OutOfMemoryReport;
use crate::error::{Error, Result};
use crate::sinks::AtomicFile;
use std::io::Write;
use std::path::PathBuf;

/// The caller's function receiving each report: the report, its JSON and
/// its summary.
pub type OomCallback = Box<dyn FnMut(&OutOfMemoryReport, &str, &str) + Send>;

/// Where reports go; held while one is built and written, which orders
/// the triggers. Taken before the reporter's state (`arming.rs`) when both
/// are needed, never after.
pub(super) struct Outputs {
    pub(super) path: Option<PathBuf>,
    pub(super) json_writer: Option<Box<dyn Write + Send>>,
    pub(super) summary_writer: Option<Box<dyn Write + Send>>,
    pub(super) callback: Option<OomCallback>,
}

impl Outputs {
    /// Writes the report to every destination (`first`: the writers and the
    /// callback too; a rewrite goes to the file only). Returns the first
    /// error.
    pub(super) fn write(&mut self, report: &OutOfMemoryReport, first: bool) -> Result<()> {
        let json = report.to_json();
        let mut errors: Vec<Error> = Vec::new();
        if let Some(path) = &self.path {
            let done = AtomicFile::create(path).and_then(|f| {
                f.write(json.as_bytes())?;
                f.write(b"\n")?;
                f.finish()
            });
            if let Err(e) = done {
                errors.push(e);
            }
        }
        if !first {
            return errors.into_iter().next().map_or(Ok(()), Err);
        }
        let summary = report.summary();
        if let Some(w) = self.json_writer.as_mut() {
            let mut doc = json.clone();
            doc.push('\n');
            if let Err(e) = w.write_all(doc.as_bytes()).and_then(|()| w.flush()) {
                errors.push(Error::io("out-of-memory report (JSON writer)", &e));
            }
        }
        if let Some(w) = self.summary_writer.as_mut() {
            if let Err(e) = w.write_all(summary.as_bytes()).and_then(|()| w.flush()) {
                errors.push(Error::io("out-of-memory report (summary writer)", &e));
            }
        }
        if let Some(cb) = self.callback.as_mut() {
            cb(report, &json, &summary);
        }
        errors.into_iter().next().map_or(Ok(()), Err)
    }
}
