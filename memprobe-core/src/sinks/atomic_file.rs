//! An output file that appears only complete: written under a temporary name
//! in the same directory, one whole line per write, and renamed into place
//! when finished. A failed or killed run leaves no half-written file at the
//! final path.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A line-oriented file renamed into place on [`finish`](AtomicFile::finish).
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    file: Mutex<Option<File>>,
    /// The first write error of a sink that cannot return one per record.
    error: Mutex<Option<Error>>,
}

impl AtomicFile {
    /// Creates `<path>.tmp-<pid>-<n>` next to `path`; fails at once (before
    /// any work) if the directory is missing or not writable.
    pub fn create(path: impl AsRef<Path>) -> Result<AtomicFile> {
        let path = path.as_ref().to_path_buf();
        let name = path
            .file_name()
            .ok_or_else(|| Error::invalid(format!("{} is not a file path", path.display())))?;
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp-{}-{n}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::io(format!("create {}", tmp.display()), &e))?;
        Ok(AtomicFile {
            path,
            tmp,
            file: Mutex::new(Some(file)),
            error: Mutex::new(None),
        })
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `line` (which should end with a newline) in one write.
    pub fn write_line(&self, line: &str) -> Result<()> {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let Some(file) = f.as_mut() else {
            return Err(Error::wrong_order(format!(
                "{} is already finished",
                self.path.display()
            )));
        };
        file.write_all(line.as_bytes())
            .map_err(|e| Error::io(format!("write {}", self.tmp.display()), &e))
    }

    /// Like [`write_line`](Self::write_line), keeping the first error for
    /// [`finish`](Self::finish) to report (sinks receive records without a
    /// way to return an error).
    pub fn write_line_or_keep_error(&self, line: &str) {
        if let Err(e) = self.write_line(line) {
            self.error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    }

    /// Syncs and renames the file into place, or reports the first error
    /// kept by [`write_line_or_keep_error`](Self::write_line_or_keep_error)
    /// (the file then stays under its temporary name). Later calls do nothing.
    pub fn finish(&self) -> Result<()> {
        if let Some(e) = self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let Some(file) = f.take() else { return Ok(()) };
        file.sync_all()
            .map_err(|e| Error::io(format!("sync {}", self.tmp.display()), &e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| {
            Error::io(
                format!("rename {} to {}", self.tmp.display(), self.path.display()),
                &e,
            )
        })
    }
}
