//! Reading `/proc`: kept-open files read with one `pread` (reopened after
//! `fork()`), and the parsers of its formats (numbers, fields, `key: value`
//! lines, `/proc/<pid>/status` as [`ProcessStatus`]). Every `/proc` reader
//! in memprobe goes through here.

use crate::error::{Error, ErrorKind, Result};
use crate::fork;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// What one read of `/proc/<pid>/status` says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessStatus {
    /// `Name:`, the command name (at most 15 bytes, as the kernel keeps it).
    pub name: String,
    /// `PPid:`, the parent.
    pub ppid: Option<u32>,
    /// The first `NSpid:` value: the pid in the outermost PID namespace this
    /// `/proc` shows (the host's pid when `/proc` is the host's); `None`
    /// before Linux 4.1 or when the line is malformed.
    pub outermost_pid: Option<u32>,
    /// `VmRSS:`, the resident set, bytes (the same figure as `statm`'s).
    pub rss: u64,
    /// `VmHWM:`, the peak resident set of the process's life so far, bytes.
    pub hwm: u64,
    /// `Threads:`, 0 if absent.
    pub threads: u32,
}

impl ProcessStatus {
    /// Parses the text of a `/proc/<pid>/status` file (for readers that do
    /// not keep it open, such as a one-off read of `/proc/self/status`);
    /// `None` without `VmRSS` and `VmHWM` (zombies and kernel threads have
    /// no memory).
    pub fn parse(text: &[u8]) -> Option<ProcessStatus> {
        parse_status(text)
    }
}

/// Reads the whole of `file` from offset 0 into `buf` (one `pread` when it
/// fits; the buffer grows otherwise and is kept for the next read) and
/// returns the length read.
pub(crate) fn read_whole(file: &File, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let mut len = 0;
    loop {
        let n = file.read_at(&mut buf[len..], len as u64)?;
        len += n;
        if n == 0 || len < buf.len() {
            return Ok(len);
        }
        let grow = buf.len();
        buf.resize(grow * 2, 0);
    }
}

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
        let len = read_whole(&self.file, &mut self.buf)
            .map_err(|e| Error::io(format!("read {}", self.path.display()), &e))?;
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
#[inline]
pub(crate) fn field_u64(s: &[u8], n: usize) -> Option<u64> {
    // This parses every RSS read (`statm`'s second field). The kernel
    // writes such files as decimals with one space between them: the
    // fields before the n-th are stepped over as runs of digits, each with
    // one space after it. Any other text (leading or repeated whitespace,
    // tabs, a field not a number) takes the general parse.
    let mut i = 0;
    for _ in 0..n {
        let start = i;
        while i < s.len() && s[i].is_ascii_digit() {
            i += 1;
        }
        if i == start || s.get(i) != Some(&b' ') {
            return field_u64_general(s, n);
        }
        i += 1;
    }
    match leading_u64(&s[i..]) {
        Some(v) => Some(v),
        None => field_u64_general(s, n),
    }
}

/// The leading decimal of `s` when it has 1 to 19 digits (which never
/// overflow); `None` otherwise, for the caller's checked parse.
#[inline]
fn leading_u64(s: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    let mut i = 0;
    while i < s.len() {
        let d = s[i].wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        v = v.wrapping_mul(10).wrapping_add(u64::from(d));
        i += 1;
    }
    (1..=19).contains(&i).then_some(v)
}

/// [`field_u64`] for any whitespace: one pass over the bytes, no splitting.
#[cold]
fn field_u64_general(s: &[u8], n: usize) -> Option<u64> {
    let mut i = 0;
    let mut field = 0;
    loop {
        while i < s.len() && s[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == s.len() {
            return None;
        }
        if field == n {
            break;
        }
        while i < s.len() && !s[i].is_ascii_whitespace() {
            i += 1;
        }
        field += 1;
    }
    match leading_u64(&s[i..]) {
        Some(v) => Some(v),
        // Longer than 19 digits (or none): the checked parse.
        None => parse_u64(&s[i..]),
    }
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

/// Parses a `/proc/<pid>/status` file; `None` without `VmRSS` and `VmHWM`
/// (zombies and kernel threads have no memory).
pub(crate) fn parse_status(text: &[u8]) -> Option<ProcessStatus> {
    let mut r = ProcessStatus::default();
    let (mut have_rss, mut have_hwm) = (false, false);
    for line in text.split(|&c| c == b'\n') {
        let Some(colon) = line.iter().position(|&c| c == b':') else {
            continue;
        };
        let (key, value) = (&line[..colon], &line[colon + 1..]);
        match key {
            b"Name" => r.name = String::from_utf8_lossy(trim_ascii(value)).into_owned(),
            b"PPid" => r.ppid = parse_u64(value).and_then(|p| u32::try_from(p).ok()),
            b"NSpid" => r.outermost_pid = outermost_pid(value),
            b"VmHWM" => {
                r.hwm = parse_u64(value)?.saturating_mul(1024);
                have_hwm = true;
            }
            b"VmRSS" => {
                r.rss = parse_u64(value)?.saturating_mul(1024);
                have_rss = true;
            }
            b"Threads" => {
                r.threads = parse_u64(value)
                    .and_then(|t| u32::try_from(t).ok())
                    .unwrap_or(0);
                // Nothing after Threads is needed.
                break;
            }
            _ => {}
        }
    }
    (have_rss && have_hwm).then_some(r)
}

/// The first pid of an `NSpid:` line's value (the pid in the outermost
/// namespace `/proc` shows); `None` when the line is empty or any of its
/// pids is malformed.
fn outermost_pid(value: &[u8]) -> Option<u32> {
    let mut pids = value
        .split(|c| c.is_ascii_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| std::str::from_utf8(t).ok()?.parse::<u32>().ok());
    let first = pids.next()??;
    pids.all(|p| p.is_some()).then_some(first)
}

fn trim_ascii(s: &[u8]) -> &[u8] {
    let s = trim_ascii_start(s);
    let end = s
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    &s[..end]
}

/// A zombie's wait status from the text of `/proc/<pid>/stat`: field 52
/// (`exit_code`) when field 3 (the state) is `Z` or `X`.
pub(crate) fn parse_zombie_status(stat: &[u8]) -> Option<i32> {
    // The command name may contain spaces and parentheses: split after the last ')'.
    let close = stat.iter().rposition(|&c| c == b')')?;
    let mut fields = stat[close + 1..]
        .split(|c| c.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let state = fields.next()?;
    if state != b"Z" && state != b"X" {
        return None;
    }
    // Field 3 was the state; exit_code is field 52.
    let code = fields.nth(52 - 4)?;
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// The whitespace-separated pids of a `children` file, appended to `out`.
pub(crate) fn parse_pids(text: &[u8], out: &mut Vec<u32>) {
    out.extend(
        text.split(|c| c.is_ascii_whitespace())
            .filter_map(parse_u64)
            .filter_map(|v| u32::try_from(v).ok()),
    );
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
        assert_eq!(field_u64(b"  7\t\t8 9", 1), Some(8));
        assert_eq!(field_u64(b"7 8", 2), None);
        assert_eq!(field_u64(b"7 8 ", 2), None);
        assert_eq!(field_u64(b"", 0), None);
        assert_eq!(field_u64(b"18446744073709551616 1", 0), None);
        // The fast path (single spaces after runs of digits) and the
        // general parse agree on every shape either takes.
        assert_eq!(field_u64(b"18446744073709551615 1", 0), Some(u64::MAX));
        assert_eq!(field_u64(b"00000000000000000000042 1", 0), Some(42));
        assert_eq!(field_u64(b"1 00000000000000000000042", 1), Some(42));
        assert_eq!(field_u64(b"12 34x 5", 1), Some(34));
        assert_eq!(field_u64(b"12x 34 5", 1), Some(34));
        assert_eq!(field_u64(b"12  34", 1), Some(34));
        assert_eq!(field_u64(b"12 -3", 1), None);
        assert_eq!(field_u64(b"12 ", 1), None);
        assert_eq!(field_u64(b"12", 1), None);
        assert_eq!(field_u64(b"4 5 6 7", 3), Some(7));
        assert_eq!(field_u64(b"S 1234 99", 1), Some(1234));
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
        let mut pids = Vec::new();
        parse_pids(b"12 345 \n", &mut pids);
        parse_pids(b"", &mut pids);
        assert_eq!(pids, vec![12, 345]);
    }

    const LIVE: &[u8] = b"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\n\
Ngid:\t0\nPid:\t42\nPPid:\t7\nTracerPid:\t0\nVmPeak:\t  300000 kB\nVmSize:\t  200000 kB\n\
VmLck:\t       0 kB\nVmPin:\t       0 kB\nVmHWM:\t  262144 kB\nVmRSS:\t    2048 kB\n\
RssAnon:\t    1024 kB\nThreads:\t3\nSigQ:\t0/100\n";

    #[test]
    fn parses_a_live_status() {
        let r = parse_status(LIVE).unwrap();
        assert_eq!(r.name, "python3");
        assert_eq!(r.ppid, Some(7));
        assert_eq!(r.hwm, 256 << 20);
        assert_eq!(r.rss, 2 << 20);
        assert_eq!(r.threads, 3);
        let spaced = parse_status(b"Name:\tmy worker \nVmHWM: 1 kB\nVmRSS: 1 kB\n").unwrap();
        assert_eq!(spaced.name, "my worker");
    }

    #[test]
    fn the_outermost_namespace_pid_is_the_first_of_nspid() {
        let status =
            |nspid: &str| format!("Name:\tx\nPid:\t5\n{nspid}PPid:\t1\nVmHWM: 1 kB\nVmRSS: 1 kB\n");
        let outermost = |nspid: &str| {
            parse_status(status(nspid).as_bytes())
                .unwrap()
                .outermost_pid
        };
        assert_eq!(outermost("NSpid:\t4242\t17\t5\n"), Some(4242));
        assert_eq!(outermost("NSpid:\t5\n"), Some(5));
        // Kernels before 4.1 have no NSpid line.
        assert_eq!(outermost(""), None);
        assert_eq!(outermost("NSpid:\t\n"), None);
        assert_eq!(outermost("NSpid:\tx\n"), None);
        assert_eq!(outermost("NSpid:\t4242\tx\n"), None);
        assert_eq!(parse_status(LIVE).unwrap().outermost_pid, None);
    }

    #[test]
    fn a_zombies_wait_status() {
        // 52 fields; the name holds a space and a parenthesis.
        let stat = |state: &str, code: &str| {
            let mut f = vec!["42".to_string(), "(my (worker)".into(), state.into()];
            f.extend((4..52).map(|i| i.to_string()));
            f.push(code.into());
            f.join(" ") + "\n"
        };
        assert_eq!(parse_zombie_status(stat("Z", "9").as_bytes()), Some(9));
        assert_eq!(parse_zombie_status(stat("X", "256").as_bytes()), Some(256));
        assert_eq!(parse_zombie_status(stat("S", "0").as_bytes()), None);
        assert_eq!(
            parse_zombie_status(b"42 (x) Z 1 2 3\n"),
            None,
            "no exit_code"
        );
        assert_eq!(parse_zombie_status(b""), None);
    }

    #[test]
    fn a_zombie_or_a_malformed_status_has_no_reading() {
        let zombie = b"Name:\tworker\nState:\tZ (zombie)\nPid:\t43\nPPid:\t42\nThreads:\t1\n";
        assert_eq!(parse_status(zombie), None);
        assert_eq!(parse_status(b"VmHWM: lots\nVmRSS: 1 kB\n"), None);
        assert_eq!(parse_status(b""), None);
    }
}
