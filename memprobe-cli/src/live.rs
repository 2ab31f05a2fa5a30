//! The live one-line status of `run`, on stderr, only when stderr is a
//! terminal. A thread of its own redraws it twice a second from figures the
//! sampling thread publishes, so a stalled terminal never delays sampling.

use crate::units;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const NONE: u64 = u64::MAX;
const REDRAW: Duration = Duration::from_millis(500);

/// The latest figures, written by the sampler, read by the status line.
#[derive(Debug)]
pub(crate) struct LiveState {
    tree_rss: AtomicU64,
    tree_peak: AtomicU64,
    processes: AtomicU64,
    cgroup: AtomicU64,
    samples: AtomicU64,
}

impl LiveState {
    pub(crate) fn new() -> LiveState {
        LiveState {
            tree_rss: AtomicU64::new(0),
            tree_peak: AtomicU64::new(0),
            processes: AtomicU64::new(0),
            cgroup: AtomicU64::new(NONE),
            samples: AtomicU64::new(0),
        }
    }

    /// Publishes one sample's figures.
    pub(crate) fn publish(&self, tree_rss: u64, processes: u32, cgroup: Option<u64>, samples: u64) {
        self.tree_rss.store(tree_rss, Ordering::Relaxed);
        self.tree_peak.fetch_max(tree_rss, Ordering::Relaxed);
        self.processes
            .store(u64::from(processes), Ordering::Relaxed);
        self.cgroup.store(cgroup.unwrap_or(NONE), Ordering::Relaxed);
        self.samples.store(samples, Ordering::Relaxed);
    }

    fn line(&self, elapsed: Duration) -> String {
        let mut s = format!(
            "memprobe {:>9}  tree {} (peak {})  {} proc",
            units::secs(elapsed.as_secs_f64()),
            units::bytes(self.tree_rss.load(Ordering::Relaxed)),
            units::bytes(self.tree_peak.load(Ordering::Relaxed)),
            self.processes.load(Ordering::Relaxed),
        );
        let cg = self.cgroup.load(Ordering::Relaxed);
        if cg != NONE {
            s.push_str(&format!("  container {}", units::bytes(cg)));
        }
        s.push_str(&format!(
            "  {} samples",
            self.samples.load(Ordering::Relaxed)
        ));
        s
    }
}

/// Whether file descriptor `fd` is a terminal.
pub(crate) fn is_tty(fd: libc::c_int) -> bool {
    // SAFETY: isatty has no memory preconditions.
    unsafe { libc::isatty(fd) == 1 }
}

/// Columns of the terminal on `fd`, if it is one.
pub(crate) fn columns(fd: libc::c_int) -> Option<usize> {
    terminal_size(fd).map(|(c, _)| c)
}

/// (columns, rows) of the terminal on `fd`, if it is one.
pub(crate) fn terminal_size(fd: libc::c_int) -> Option<(usize, usize)> {
    // SAFETY: winsize is plain data.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into the valid pointer.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then(|| (usize::from(ws.ws_col), usize::from(ws.ws_row)))
}

/// Cuts `s` to at most `width` characters.
pub(crate) fn truncate(s: &str, width: usize) -> &str {
    match s.char_indices().nth(width) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The running status line.
pub(crate) struct LiveLine {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: JoinHandle<()>,
}

impl LiveLine {
    /// Starts redrawing the line on stderr.
    pub(crate) fn start(state: Arc<LiveState>, t0: Instant) -> std::io::Result<LiveLine> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = Arc::clone(&stop);
        let handle = thread::Builder::new()
            .name("memprobe-live".into())
            .spawn(move || {
                let (lock, cv) = &*s;
                let Ok(mut stopped) = lock.lock() else { return };
                while !*stopped {
                    let width = columns(2).unwrap_or(80).saturating_sub(1);
                    let line = state.line(t0.elapsed());
                    // One write per redraw: return, clear the line, the text.
                    let text = format!("\r\x1b[2K{}", truncate(&line, width));
                    let _ = std::io::stderr().write_all(text.as_bytes());
                    match cv.wait_timeout(stopped, REDRAW) {
                        Ok((g, _)) => stopped = g,
                        Err(_) => return,
                    }
                }
                let _ = std::io::stderr().write_all(b"\r\x1b[2K");
            })?;
        Ok(LiveLine { stop, handle })
    }

    /// Erases the line and stops.
    pub(crate) fn stop(self) {
        let (lock, cv) = &*self.stop;
        if let Ok(mut s) = lock.lock() {
            *s = true;
        }
        cv.notify_all();
        let _ = self.handle.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_truncation() {
        let s = LiveState::new();
        s.publish(3 << 20, 2, None, 7);
        s.publish(1 << 20, 2, Some(5 << 30), 8);
        let line = s.line(Duration::from_millis(1500));
        assert!(line.contains("tree 1.00 MiB (peak 3.00 MiB)"), "{line}");
        assert!(line.contains("container 5.00 GiB"), "{line}");
        assert!(line.contains("8 samples"), "{line}");
        assert_eq!(truncate("héllo", 2), "hé");
        assert_eq!(truncate("hi", 10), "hi");
    }
}
