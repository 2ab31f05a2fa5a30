//! An output file that appears only complete: written under a temporary name
//! (`<name>.tmp-<pid>-<n>`) in the target's directory, and renamed into place
//! when finished. It is the one writer of whole files in memprobe: the JSON
//! Lines and CSV sinks append one line per record, `memprobe run` reserves its
//! outputs before the command starts and writes them whole at the end.
//!
//! Creating it checks the path (a directory, a missing directory and an
//! uncreatable file are refused at once, before any work) and a failure never
//! leaves the temporary file behind: a write error or a failed
//! [`finish`](AtomicFile::finish) removes it, and so does dropping the file
//! unfinished (a failed or abandoned run leaves nothing, not even at the final
//! path).

use crate::error::{Error, ErrorKind, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A file renamed into place on [`finish`](AtomicFile::finish).
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    /// `None` once finished (or failed): the temporary file is gone then.
    file: Mutex<Option<File>>,
    /// The first write error of a sink that cannot return one per record.
    error: Mutex<Option<Error>>,
    /// The process that created the temporary file: a forked child shares
    /// the descriptor but must neither rename nor remove the parent's file.
    owner: u32,
}

impl AtomicFile {
    /// Creates `<path>.tmp-<pid>-<n>` next to `path`. Fails at once when
    /// `path` names no file (`/`, `..`, a path ending in `/`), is a
    /// directory, or its directory is missing, not a directory or not
    /// writable.
    pub fn create(path: impl AsRef<Path>) -> Result<AtomicFile> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display();
        let name = path
            .file_name()
            .ok_or_else(|| Error::invalid(format!("{shown} is not a file path")))?;
        if path.is_dir() {
            return Err(Error::invalid(format!(
                "{shown} is a directory, not a file"
            )));
        }
        // `dir/` and `dir/.` name a directory even when none exists yet
        // (Path drops the trailing part, so the rename at the end would be
        // the first to fail).
        let bytes = path.as_os_str().as_encoded_bytes();
        if bytes.ends_with(b"/") || bytes.ends_with(b"/.") {
            return Err(Error::invalid(format!(
                "{shown} ends with '/': it names a directory, not a file"
            )));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::invalid(format!(
                    "{shown}: {} is not a directory",
                    dir.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::unavailable(format!(
                    "{shown}: directory {} does not exist",
                    dir.display()
                )))
            }
            Err(e) => return Err(Error::io(format!("{shown}: {}", dir.display()), &e)),
        }
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let owner = std::process::id();
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp-{owner}-{n}"));
        let tmp = path.with_file_name(tmp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| {
                Error::io(
                    format!("{shown}: cannot create a file in {}", dir.display()),
                    &e,
                )
            })?;
        Ok(AtomicFile {
            path,
            tmp,
            file: Mutex::new(Some(file)),
            error: Mutex::new(None),
            owner,
        })
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `bytes` in one write. A failed write removes the temporary
    /// file: the output is lost either way, and nothing is left behind.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let Some(file) = f.as_mut() else {
            return Err(Error::wrong_order(format!(
                "{} is already finished",
                self.path.display()
            )));
        };
        if let Err(e) = file.write_all(bytes) {
            let err = Error::io(format!("write {}", self.tmp.display()), &e);
            self.discard(&mut f);
            return Err(err);
        }
        Ok(())
    }

    /// Appends `line` (which should end with a newline) in one write.
    pub fn write_line(&self, line: &str) -> Result<()> {
        self.write(line.as_bytes())
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
    /// kept by [`write_line_or_keep_error`](Self::write_line_or_keep_error).
    /// On any error the temporary file is removed. Later calls do nothing.
    pub fn finish(&self) -> Result<()> {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            self.discard(&mut f);
            return Err(e);
        }
        if f.is_none() {
            return Ok(());
        }
        if std::process::id() != self.owner {
            return Err(Error::wrong_order(format!(
                "{} belongs to process {}: a forked child cannot finish it",
                self.path.display(),
                self.owner
            )));
        }
        let done = match f.as_ref().map(File::sync_all) {
            Some(Err(e)) => Err(Error::io(format!("sync {}", self.tmp.display()), &e)),
            _ => std::fs::rename(&self.tmp, &self.path).map_err(|e| {
                let kind = if self.path.is_dir() {
                    ErrorKind::InvalidArgument
                } else {
                    ErrorKind::Io
                };
                Error::new(
                    kind,
                    format!(
                        "rename {} to {}: {e}",
                        self.tmp.display(),
                        self.path.display()
                    ),
                )
            }),
        };
        match done {
            Ok(()) => *f = None,
            Err(_) => self.discard(&mut f),
        }
        done
    }

    /// Closes and removes the temporary file (only in the process that
    /// created it).
    fn discard(&self, f: &mut Option<File>) {
        if f.take().is_some() && std::process::id() == self.owner {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl Drop for AtomicFile {
    /// Unfinished: the output is abandoned, and its temporary file removed.
    fn drop(&mut self) {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        self.discard(&mut f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("memprobe-atomic-file-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn listing(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn finish_renames_and_drop_removes() {
        let d = scratch("finish");
        let f = AtomicFile::create(d.join("a.jsonl")).unwrap();
        assert_eq!(listing(&d).len(), 1, "the temporary file");
        assert!(!d.join("a.jsonl").exists());
        f.write_line("1\n").unwrap();
        f.write(b"2\n").unwrap();
        f.finish().unwrap();
        f.finish().unwrap();
        assert_eq!(std::fs::read(d.join("a.jsonl")).unwrap(), b"1\n2\n");
        assert_eq!(
            f.write_line("3\n").unwrap_err().kind(),
            ErrorKind::WrongOrder
        );
        drop(f);
        assert_eq!(listing(&d), vec!["a.jsonl"]);

        let f = AtomicFile::create(d.join("b.csv")).unwrap();
        f.write_line("x\n").unwrap();
        drop(f);
        assert_eq!(
            listing(&d),
            vec!["a.jsonl"],
            "dropped unfinished: nothing left"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn directories_and_missing_parents_are_refused_at_create() {
        let d = scratch("refused");
        let e = AtomicFile::create(&d).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.message().contains("is a directory"), "{e}");
        let e = AtomicFile::create(format!("{}/", d.display())).unwrap_err();
        assert!(e.message().contains("is a directory"), "{e}");
        let e = AtomicFile::create("/").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        // A directory that does not exist yet: its creation would succeed
        // beside it and only the rename into place would fail.
        for p in ["new/", "new/.", "new//"] {
            let e = AtomicFile::create(format!("{}/{p}", d.display())).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{p}: {e}");
            assert!(e.message().contains("ends with '/'"), "{e}");
        }
        let e = AtomicFile::create(d.join("missing/x.jsonl")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.message().contains("does not exist"), "{e}");
        std::fs::write(d.join("file"), b"").unwrap();
        let e = AtomicFile::create(d.join("file/x.jsonl")).unwrap_err();
        assert!(e.message().contains("not a directory"), "{e}");
        assert_eq!(listing(&d), vec!["file"], "no temporary file");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn both_file_sinks_refuse_a_directory_when_created() {
        use crate::sinks::{CsvSink, JsonlSink};
        let d = scratch("sinks");
        for dir in [d.as_path(), Path::new("/tmp")] {
            let e = JsonlSink::create(dir).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            let e = CsvSink::create(dir).unwrap_err();
            assert!(e.message().contains("is a directory"), "{e}");
        }
        let leftover = |d: &Path| {
            let tag = format!(".tmp-{}-", std::process::id());
            listing(d).into_iter().any(|n| n.contains(&tag))
        };
        assert!(!leftover(&d) && !leftover(Path::new("/tmp")));
        if let Ok(root) = std::fs::read_dir("/") {
            let tag = format!("tmp.tmp-{}-", std::process::id());
            assert!(!root
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&tag)));
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_finish_removes_the_temporary_file() {
        let d = scratch("finish-fails");
        let target = d.join("out.jsonl");
        let f = AtomicFile::create(&target).unwrap();
        f.write_line("1\n").unwrap();
        // The target turns into a directory (with content) after the sink
        // was created: the rename fails.
        std::fs::create_dir_all(target.join("inside")).unwrap();
        let e = f.finish().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert_eq!(listing(&d), vec!["out.jsonl"], "only the directory");
        f.finish().unwrap();
        drop(f);
        assert_eq!(listing(&d), vec!["out.jsonl"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_write_error_is_kept_and_nothing_is_left() {
        let d = scratch("write-fails");
        let f = AtomicFile::create(d.join("out.csv")).unwrap();
        // Swap the descriptor for one that cannot be written: /dev/full
        // fails every write with ENOSPC, as a full disk would.
        let Ok(full) = OpenOptions::new().write(true).open("/dev/full") else {
            eprintln!("no /dev/full: skipped");
            return;
        };
        *f.file.lock().unwrap() = Some(full);
        f.write_line_or_keep_error("row\n");
        f.write_line_or_keep_error("row\n");
        assert_eq!(listing(&d), Vec::<String>::new(), "removed at the error");
        let e = f.finish().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(!d.join("out.csv").exists());
        drop(f);
        assert_eq!(listing(&d), Vec::<String>::new());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
