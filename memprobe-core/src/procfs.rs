//! Kept-open `/proc` files read with one `pread`, reopened after `fork()`.

use crate::error::{Error, ErrorKind, Result};
use crate::fork;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A file kept open and re-read from offset 0 with a single `pread`.
pub(crate) struct ProcFile {
    path: PathBuf,
    file: File,
    generation: u64,
    buf: Vec<u8>,
}

impl ProcFile {
    pub(crate) fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file =
            File::open(&path).map_err(|e| Error::io(format!("open {}", path.display()), &e))?;
        Ok(ProcFile {
            path,
            file,
            generation: fork::generation(),
            buf: vec![0; 4096],
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the whole file (one pread when it fits the buffer) and returns it.
    pub(crate) fn read(&mut self) -> Result<&[u8]> {
        if self.generation != fork::generation() {
            // /proc/self resolved to the parent's pid when this was opened.
            self.file = File::open(&self.path)
                .map_err(|e| Error::io(format!("reopen {}", self.path.display()), &e))?;
            self.generation = fork::generation();
        }
        let mut len = 0;
        loop {
            let n = self
                .file
                .read_at(&mut self.buf[len..], len as u64)
                .map_err(|e| Error::io(format!("read {}", self.path.display()), &e))?;
            len += n;
            if n == 0 || len < self.buf.len() {
                break;
            }
            let grow = self.buf.len();
            self.buf.resize(grow * 2, 0);
        }
        Ok(&self.buf[..len])
    }
}

/// Parses the leading unsigned decimal of `s` (after leading spaces).
pub(crate) fn parse_u64(s: &[u8]) -> Option<u64> {
    let s = trim_ascii_start(s);
    let mut v: u64 = 0;
    let mut any = false;
    for &c in s {
        if !c.is_ascii_digit() {
            break;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
        any = true;
    }
    any.then_some(v)
}

fn trim_ascii_start(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(s.len());
    &s[start..]
}

/// The `n`-th (0-based) whitespace-separated field of `s`, parsed as u64.
pub(crate) fn field_u64(s: &[u8], n: usize) -> Option<u64> {
    s.split(|c| c.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
        .nth(n)
        .and_then(parse_u64)
}

/// The value of `key:` in a `/proc/*/status` or `/proc/meminfo` style file, in kB units
/// as written (callers multiply).
pub(crate) fn keyed_u64(text: &[u8], key: &[u8]) -> Option<u64> {
    text.split(|&c| c == b'\n').find_map(|line| {
        let rest = line.strip_prefix(key)?;
        let rest = rest.strip_prefix(b":")?;
        parse_u64(rest)
    })
}

/// A parse error naming the file.
pub(crate) fn malformed(path: &Path, what: &str) -> Error {
    Error::new(ErrorKind::Parse, format!("{}: {what}", path.display()))
}

/// The system page size in bytes.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_and_keys() {
        assert_eq!(field_u64(b"123 456 789\n", 1), Some(456));
        assert_eq!(field_u64(b"1 x", 1), None);
        assert_eq!(
            keyed_u64(b"VmRSS:\t  100 kB\nVmHWM:\t 2048 kB\n", b"VmHWM"),
            Some(2048)
        );
        assert_eq!(keyed_u64(b"MemTotal: 5 kB\n", b"MemFree"), None);
        assert_eq!(
            parse_u64(b"18446744073709551616"),
            None,
            "overflow is no value"
        );
        assert_eq!(parse_u64(b"  42\n"), Some(42));
    }
}
