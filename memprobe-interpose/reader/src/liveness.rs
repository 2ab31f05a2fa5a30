//! Whether a process still runs, robust to pid reuse: a pid names the same
//! process only while its start time (field 22 of `/proc/<pid>/stat`, clock
//! ticks since boot) is unchanged.

/// Field 22 of `/proc/<pid>/stat` (start time in clock ticks since boot) and
/// whether the process is a zombie or dead; `None` when it does not exist.
/// Reads into a stack buffer: no allocation, callable after `fork`.
pub fn stat(pid: u32) -> Option<(u64, bool)> {
    let mut path = [0u8; 32];
    let prefix = b"/proc/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut n = prefix.len() + write_u32(&mut path[prefix.len()..], pid);
    path[n..n + 5].copy_from_slice(b"/stat");
    n += 5;
    path[n] = 0;
    let mut buf = [0u8; 1024];
    // SAFETY: `path` is NUL-terminated; `buf` is writable for its length;
    // the descriptor is closed on every path.
    let len = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let r = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        r
    };
    if len <= 0 {
        return None;
    }
    parse_stat(&buf[..len as usize])
}

/// Parses `/proc/<pid>/stat` text: (start time, zombie or dead).
pub fn parse_stat(text: &[u8]) -> Option<(u64, bool)> {
    // The command name (field 2) may hold spaces and parentheses: the fields
    // after it start past the last ')'.
    let close = text.iter().rposition(|&b| b == b')')?;
    let mut fields = text[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?; // field 3
    let start = fields.nth(18)?; // field 22
    let mut v: u64 = 0;
    for &b in start {
        if !b.is_ascii_digit() {
            break;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some((v, matches!(state, b'Z' | b'X' | b'x')))
}

/// The start time of process `pid`, 0 when unknown.
pub fn start_time(pid: u32) -> u64 {
    stat(pid).map_or(0, |(t, _)| t)
}

/// Whether process `pid`, started at `start` (0: any start time), still runs.
/// Zombies count as gone: their memory is released.
pub fn alive(pid: u32, start: u64) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    match stat(pid) {
        Some((t, dead)) => !dead && (start == 0 || t == start),
        None => false,
    }
}

/// Writes `v` in decimal at the start of `out` and returns how many bytes
/// it took (at most 10). No allocation: the interposer builds paths with it
/// after `fork`.
pub fn write_u32(out: &mut [u8], mut v: u32) -> usize {
    let mut digits = [0u8; 10];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = digits[n - 1 - i];
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parentheses() {
        let line =
            b"42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some((987654, false)));
        let zombie = b"42 (x) Z 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat(zombie), Some((5, true)));
        assert_eq!(parse_stat(b"42 (x) S 1"), None);
        assert_eq!(parse_stat(b"garbage"), None);
    }

    #[test]
    fn writes_decimal_digits() {
        let mut out = [0u8; 10];
        for v in [0, 7, 10, 4_194_304, u32::MAX] {
            let n = write_u32(&mut out, v);
            assert_eq!(&out[..n], v.to_string().as_bytes());
        }
    }

    #[test]
    fn this_process_is_alive_and_pid_reuse_is_seen() {
        let me = std::process::id();
        let t = start_time(me);
        assert!(t > 0);
        assert!(alive(me, t));
        assert!(alive(me, 0));
        assert!(!alive(me, t + 1));
        assert!(!alive(0, 0));
        assert!(!alive(0x7fff_fff0, 0));
    }
}
