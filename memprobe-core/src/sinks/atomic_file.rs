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
//!
//! The output goes where the user named it, never replacing what is there
//! with something else:
//! - a symbolic link is followed: the file is made beside its final target
//!   and renamed onto the target (the link stays, and now shows the output);
//! - a device, a FIFO or a socket is written to directly (`/dev/null`,
//!   `/dev/full`, a named pipe read by another program): nothing can be
//!   renamed onto those, and the output cannot be atomic there; a write
//!   error (`ENOSPC` from `/dev/full`) is reported like any other. A FIFO
//!   is opened when the first bytes are written (waiting for a reader then,
//!   as a shell's redirection does), so that creating one and dropping it
//!   unwritten never ends its reader's input;
//! - `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` and `/proc/self/fd/N` are the
//!   process's descriptor N, written through a duplicate of it (opening the
//!   path again would start at offset 0 of a file the shell opened for
//!   appending, and cannot reopen a socket).

use crate::error::{Error, ErrorKind, Result};
use crate::lock::Lock;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Symbolic links followed at most (the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

/// Where the bytes go.
#[derive(Debug)]
enum Target {
    /// A temporary file beside `dest`, renamed onto it when finished.
    Atomic { tmp: PathBuf, dest: PathBuf },
    /// The named object itself (a device, a FIFO, a standard stream).
    Direct,
    /// A FIFO: opened at the first write (waiting for a reader then).
    Fifo(PathBuf),
}

/// A file renamed into place on [`finish`](AtomicFile::finish).
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    target: Target,
    /// `None` once finished (or failed): the temporary file is gone then.
    file: Lock<Option<File>>,
    /// The first write error of a sink that cannot return one per record.
    error: Lock<Option<Error>>,
    /// The process that created the temporary file: a forked child shares
    /// the descriptor but must neither rename nor remove the parent's file.
    owner: u32,
    /// A FIFO not opened yet (no reader when created).
    pending: std::sync::atomic::AtomicBool,
}

/// The descriptor a path names without opening anything: `/dev/stdout`,
/// `/dev/stderr`, `/dev/stdin`, `/dev/fd/N`, `/proc/self/fd/N`.
fn standard_stream(path: &Path) -> Option<i32> {
    let text = path.to_str()?;
    match text {
        "/dev/stdin" => return Some(0),
        "/dev/stdout" => return Some(1),
        "/dev/stderr" => return Some(2),
        _ => {}
    }
    let n = text
        .strip_prefix("/dev/fd/")
        .or_else(|| text.strip_prefix("/proc/self/fd/"))
        .or_else(|| {
            let rest = text.strip_prefix("/proc/")?;
            let (pid, fd) = rest.split_once("/fd/")?;
            (pid.parse::<u32>().ok()? == std::process::id()).then_some(fd)
        })?;
    n.parse().ok()
}

/// What `path` finally names after its symbolic links: a standard stream,
/// or a path that is not a link (which may not exist yet).
enum Resolved {
    Stream(i32),
    Path(PathBuf),
}

fn resolve(path: &Path) -> Result<Resolved> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        if let Some(fd) = standard_stream(&p) {
            return Ok(Resolved::Stream(fd));
        }
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)
                    .map_err(|e| Error::io(format!("{}: read link", p.display()), &e))?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(Resolved::Path(p)),
        }
    }
    Err(Error::invalid(format!(
        "{}: more than {MAX_LINKS} symbolic links",
        path.display()
    )))
}

/// A duplicate of this process's descriptor `fd`, open for writing.
fn dup_stream(path: &Path, fd: i32) -> Result<File> {
    // SAFETY: F_DUPFD_CLOEXEC on any integer: fails with EBADF if not open.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::io(
            format!("{}: descriptor {fd} is not open", path.display()),
            &e,
        ));
    }
    // SAFETY: `copy` is a new descriptor owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(copy) };
    // SAFETY: F_GETFL on a descriptor we own.
    let flags = unsafe { libc::fcntl(copy, libc::F_GETFL) };
    if flags >= 0 && flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(Error::invalid(format!(
            "{}: descriptor {fd} is open for reading only",
            path.display()
        )));
    }
    Ok(File::from(owned))
}

/// Opens a FIFO for writing, waiting for a reader.
fn open_fifo(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

impl AtomicFile {
    /// Creates `<path>.tmp-<pid>-<n>` next to `path` (next to its final
    /// target when `path` is a symbolic link), or opens `path` itself when
    /// it names a device, a FIFO or a standard stream (see the module's
    /// text). Fails at once when `path` names no file (`/`, `..`, a path
    /// ending in `/`), is a
    /// directory, or its directory is missing, not a directory or not
    /// writable.
    pub fn create(path: impl AsRef<Path>) -> Result<AtomicFile> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display();
        if path.file_name().is_none() && standard_stream(&path).is_none() {
            return Err(Error::invalid(format!("{shown} is not a file path")));
        }
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
        let owner = std::process::id();
        let direct = |target, file: Option<File>| AtomicFile {
            path: path.clone(),
            target,
            pending: file.is_none().into(),
            file: Lock::new(file),
            error: Lock::new(None),
            owner,
        };
        let dest = match resolve(&path)? {
            Resolved::Stream(fd) => {
                return Ok(direct(Target::Direct, Some(dup_stream(&path, fd)?)))
            }
            Resolved::Path(p) => p,
        };
        if let Ok(m) = std::fs::metadata(&dest) {
            let kind = m.file_type();
            if kind.is_fifo() {
                // Opened at the first write, not now: opening and closing
                // it would end its reader's input (a probe that the path
                // can be written, an output abandoned) before the output.
                return Ok(direct(Target::Fifo(dest), None));
            }
            if !kind.is_file() {
                let f = OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
                    .open(&dest)
                    .map_err(|e| Error::io(format!("{shown}: open"), &e))?;
                return Ok(direct(Target::Direct, Some(f)));
            }
        }
        let name = dest
            .file_name()
            .ok_or_else(|| Error::invalid(format!("{shown} is not a file path")))?;
        let dir = match dest.parent() {
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
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp-{owner}-{n}"));
        let tmp = dest.with_file_name(tmp_name);
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
            target: Target::Atomic { tmp, dest },
            pending: false.into(),
            file: Lock::new(Some(file)),
            error: Lock::new(None),
            owner,
        })
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where bytes are written: the temporary file, or the named object.
    fn written(&self) -> &Path {
        match &self.target {
            Target::Atomic { tmp, .. } => tmp,
            Target::Direct | Target::Fifo(_) => &self.path,
        }
    }

    /// The FIFO waiting for a reader is opened (blocking until one comes).
    fn open_pending(&self, f: &mut Option<File>) -> Result<()> {
        if f.is_some() || !self.pending.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        if let Target::Fifo(p) = &self.target {
            let file = open_fifo(p)
                .map_err(|e| Error::io(format!("{}: open the FIFO", self.path.display()), &e))?;
            *f = Some(file);
        }
        Ok(())
    }

    /// Appends `bytes` in one write. A failed write removes the temporary
    /// file: the output is lost either way, and nothing is left behind.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        let mut f = self.file.lock()?;
        if self.finished(&f) {
            return Err(Error::wrong_order(format!(
                "{} is already finished",
                self.path.display()
            )));
        }
        self.open_pending(&mut f)?;
        let Some(file) = f.as_mut() else {
            return Err(Error::wrong_order(format!(
                "{} is already finished",
                self.path.display()
            )));
        };
        let wrote = match self.target {
            // A pipe or socket whose reader is gone must fail the write,
            // not kill the host with SIGPIPE.
            Target::Direct | Target::Fifo(_) => {
                crate::fd_write::FdWriter::new(file.as_raw_fd()).write_all(bytes)
            }
            _ => file.write_all(bytes),
        };
        if let Err(e) = wrote {
            let err = Error::io(format!("write {}", self.written().display()), &e);
            self.discard(&mut f);
            return Err(err);
        }
        Ok(())
    }

    /// Whether the file is finished (or failed): no descriptor, and none
    /// waiting to be opened.
    fn finished(&self, f: &Option<File>) -> bool {
        f.is_none() && !self.pending.load(Ordering::SeqCst)
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
            if let Ok(mut kept) = self.error.lock() {
                kept.get_or_insert(e);
            }
        }
    }

    /// Syncs and renames the file into place, or reports the first error
    /// kept by [`write_line_or_keep_error`](Self::write_line_or_keep_error).
    /// On any error the temporary file is removed. Later calls do nothing.
    pub fn finish(&self) -> Result<()> {
        let mut f = self.file.lock()?;
        let kept = self.error.lock()?.take();
        if let Some(e) = kept {
            self.pending.store(false, Ordering::SeqCst);
            self.discard(&mut f);
            return Err(e);
        }
        self.open_pending(&mut f)?;
        if f.is_none() {
            return Ok(());
        }
        let Target::Atomic { tmp, dest } = &self.target else {
            // Written in place: nothing to sync (a device or a pipe may
            // refuse it) or rename.
            *f = None;
            return Ok(());
        };
        if std::process::id() != self.owner {
            return Err(Error::wrong_order(format!(
                "{} belongs to process {}: a forked child cannot finish it",
                self.path.display(),
                self.owner
            )));
        }
        let done = match f.as_ref().map(File::sync_all) {
            Some(Err(e)) => Err(Error::io(format!("sync {}", tmp.display()), &e)),
            _ => std::fs::rename(tmp, dest).map_err(|e| {
                let kind = if dest.is_dir() {
                    ErrorKind::InvalidArgument
                } else {
                    ErrorKind::Io
                };
                Error::new(
                    kind,
                    format!("rename {} to {}: {e}", tmp.display(), dest.display()),
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
    /// created it); a direct target is only closed.
    fn discard(&self, f: &mut Option<File>) {
        self.pending.store(false, Ordering::SeqCst);
        if f.take().is_some() && std::process::id() == self.owner {
            if let Target::Atomic { tmp, .. } = &self.target {
                let _ = std::fs::remove_file(tmp);
            }
        }
    }
}

impl Drop for AtomicFile {
    /// Unfinished: the output is abandoned, and its temporary file removed.
    fn drop(&mut self) {
        // No lock to take: nothing else can hold it while `self` is dropped.
        let mut f = self.file.get_mut().take();
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

    /// A symbolic link is followed: the output lands on its target, made
    /// beside it, and the link stays a link (it was replaced by a regular
    /// file, its target left stale). A dangling link gets its target made.
    #[test]
    fn a_symbolic_link_is_written_through() {
        let d = scratch("symlink");
        std::fs::create_dir(d.join("real")).unwrap();
        std::fs::write(d.join("real/out.json"), b"stale").unwrap();
        std::os::unix::fs::symlink("real/out.json", d.join("link.json")).unwrap();
        std::os::unix::fs::symlink("link.json", d.join("link2.json")).unwrap();
        let f = AtomicFile::create(d.join("link2.json")).unwrap();
        assert_eq!(listing(&d.join("real")).len(), 2, "made beside the target");
        f.write(b"fresh").unwrap();
        f.finish().unwrap();
        assert_eq!(std::fs::read(d.join("real/out.json")).unwrap(), b"fresh");
        for link in ["link.json", "link2.json"] {
            let m = std::fs::symlink_metadata(d.join(link)).unwrap();
            assert!(m.file_type().is_symlink(), "{link} is still a link");
        }
        assert_eq!(listing(&d.join("real")), vec!["out.json"]);
        // Dangling: the target is created.
        std::os::unix::fs::symlink("real/new.json", d.join("dangling.json")).unwrap();
        let f = AtomicFile::create(d.join("dangling.json")).unwrap();
        f.write(b"new").unwrap();
        f.finish().unwrap();
        assert_eq!(std::fs::read(d.join("dangling.json")).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(d.join("dangling.json"))
            .unwrap()
            .file_type()
            .is_symlink());
        // A loop is refused, nothing made.
        std::os::unix::fs::symlink("loop-b", d.join("loop-a")).unwrap();
        std::os::unix::fs::symlink("loop-a", d.join("loop-b")).unwrap();
        let e = AtomicFile::create(d.join("loop-a")).unwrap_err();
        assert!(e.message().contains("symbolic links"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Devices are written to, never replaced by a regular file; a write
    /// error (`/dev/full`: ENOSPC) is reported.
    #[test]
    fn devices_are_written_in_place() {
        let is_char = |p: &str| std::fs::metadata(p).unwrap().file_type().is_char_device();
        let f = AtomicFile::create("/dev/null").unwrap();
        f.write(b"nothing").unwrap();
        f.finish().unwrap();
        assert!(is_char("/dev/null"));
        assert_eq!(
            listing(Path::new("/dev"))
                .iter()
                .filter(|n| n.contains(".tmp-"))
                .count(),
            0
        );
        if Path::new("/dev/full").exists() {
            let f = AtomicFile::create("/dev/full").unwrap();
            let e = f.write(b"x").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Io, "{e}");
            assert!(e.message().contains("/dev/full"), "{e}");
            assert!(is_char("/dev/full"), "still the device");
            // The same error through the sinks' path.
            let f = AtomicFile::create("/dev/full").unwrap();
            f.write_line_or_keep_error("row\n");
            assert_eq!(f.finish().unwrap_err().kind(), ErrorKind::Io);
            assert!(is_char("/dev/full"));
        }
    }

    /// A FIFO is written to (a reader there from the start, or one that
    /// comes later), never replaced.
    #[test]
    fn a_fifo_is_written_to() {
        let d = scratch("fifo");
        let fifo = d.join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No reader when created: opened at the first write.
        let f = AtomicFile::create(&fifo).unwrap();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(&fifo).unwrap())
        };
        f.write(b"one ").unwrap();
        f.write(b"two").unwrap();
        f.finish().unwrap();
        drop(f);
        assert_eq!(reader.join().unwrap(), b"one two");
        // A reader already there: creating and dropping an unwritten one
        // does not end its input.
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(&fifo).unwrap())
        };
        drop(AtomicFile::create(&fifo).unwrap());
        let f = AtomicFile::create(&fifo).unwrap();
        f.write(b"three").unwrap();
        f.finish().unwrap();
        drop(f);
        assert_eq!(reader.join().unwrap(), b"three");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert_eq!(listing(&d), vec!["pipe"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// `/proc/self/fd/N` (and so `/dev/stdout`, `/dev/fd/N`) is the open
    /// descriptor N, written where it points now, at its offset.
    #[test]
    fn a_standard_stream_is_the_open_descriptor() {
        assert_eq!(standard_stream(Path::new("/dev/stdout")), Some(1));
        assert_eq!(standard_stream(Path::new("/dev/stderr")), Some(2));
        assert_eq!(standard_stream(Path::new("/dev/fd/7")), Some(7));
        assert_eq!(standard_stream(Path::new("/proc/self/fd/9")), Some(9));
        let mine = format!("/proc/{}/fd/4", std::process::id());
        assert_eq!(standard_stream(Path::new(&mine)), Some(4));
        assert_eq!(standard_stream(Path::new("/dev/stdoutx")), None);
        let mut fds = [0; 2];
        // SAFETY: a valid array of two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both ends are ours from here on.
        let (r, w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let f = AtomicFile::create(format!("/proc/self/fd/{}", fds[1])).unwrap();
        f.write(b"through the pipe").unwrap();
        f.finish().unwrap();
        drop(f);
        drop(w);
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut { r }, &mut got).unwrap();
        assert_eq!(got, b"through the pipe");
        // A descriptor that is not open.
        let e = AtomicFile::create("/dev/fd/999").unwrap_err();
        assert!(e.message().contains("not open"), "{e}");
    }

    #[test]
    fn a_pipe_without_reader_fails_the_write_without_sigpipe() {
        let mut fds = [0; 2];
        // SAFETY: a valid array of two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the read end is ours; closed at once.
        drop(unsafe { File::from_raw_fd(fds[0]) });
        // SAFETY: fork in a test; the child only makes system calls and
        // memprobe's own writes, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SIGPIPE at its default disposition, as in a C host.
            // SAFETY: plain signal disposition in the child.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            let code = match AtomicFile::create(format!("/proc/self/fd/{}", fds[1])) {
                Ok(f) => match f.write(b"nobody reads this") {
                    Err(e) if e.kind() == ErrorKind::Io => 0,
                    _ => 2,
                },
                Err(_) => 3,
            };
            // SAFETY: leave the forked child without running the harness.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        // SAFETY: the write end is ours.
        drop(unsafe { File::from_raw_fd(fds[1]) });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child ended with status {status:#x} (signal {})",
            libc::WTERMSIG(status)
        );
    }
}
