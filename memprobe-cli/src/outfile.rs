//! Output files written whole or not at all: a temporary file is created in
//! the target's directory when the command starts (which proves the path is
//! writable before anything runs), filled at the end, flushed to disk and
//! renamed over the target. A failure, or an early exit, removes it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A reserved output: the temporary file exists, the target is untouched.
#[derive(Debug)]
pub(crate) struct PendingFile {
    target: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
}

impl PendingFile {
    /// Checks that `target` can be written and creates its temporary file.
    /// `what` names the option in messages (`--json`).
    pub(crate) fn reserve(target: &Path, what: &str) -> Result<PendingFile, String> {
        let shown = target.display();
        let name = target
            .file_name()
            .ok_or_else(|| format!("{what} {shown}: not a file name"))?;
        if target.is_dir() {
            return Err(format!("{what} {shown}: is a directory"));
        }
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(format!(
                "{what} {shown}: directory {} does not exist",
                dir.display()
            ));
        }
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".memprobe-{}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| {
                format!(
                    "{what} {shown}: cannot create a file in {}: {e}",
                    dir.display()
                )
            })?;
        Ok(PendingFile {
            target: target.to_path_buf(),
            tmp,
            file: Some(file),
        })
    }

    /// The final path.
    pub(crate) fn target(&self) -> &Path {
        &self.target
    }

    /// Writes `bytes`, syncs and renames onto the target.
    pub(crate) fn commit(mut self, bytes: &[u8]) -> Result<(), String> {
        let shown = self.target.display().to_string();
        let mut file = self.file.take().ok_or("output already written")?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("writing {shown}: {e}"))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.target)
            .map_err(|e| format!("renaming onto {shown}: {e}"))?;
        // Renamed: nothing left to clean up.
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            self.file = None;
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("memprobe-outfile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn commit_renames_and_drop_cleans_up() {
        let d = scratch("commit");
        let p = PendingFile::reserve(&d.join("a.json"), "--json").unwrap();
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "the temporary file"
        );
        assert!(!d.join("a.json").exists());
        p.commit(b"{}").unwrap();
        assert_eq!(std::fs::read(d.join("a.json")).unwrap(), b"{}");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);

        let p = PendingFile::reserve(&d.join("b.csv"), "--csv").unwrap();
        drop(p);
        assert!(!d.join("b.csv").exists());
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "no leftovers");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn unusable_paths() {
        let d = scratch("bad");
        let e = PendingFile::reserve(&d.join("missing/x.json"), "--json").unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let e = PendingFile::reserve(&d, "--json").unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
