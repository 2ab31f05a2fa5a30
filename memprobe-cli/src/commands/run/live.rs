//! The live one-line status of `run`, on stderr, only when stderr is a
//! terminal. A thread of its own redraws it twice a second from figures the
//! sampling thread publishes, so a stalled terminal never delays sampling.
//!
//! The command writes to the same terminal, so the line lives on the
//! terminal's last row, outside a scroll region that holds everything else
//! (the way apt draws its progress bar): the command's output scrolls above
//! it and never mixes with it. The region is re-made when the terminal is
//! resized and reset when the command ends. (A memprobe killed with SIGKILL
//! leaves the region set; `reset` or `tput reset` restores the terminal.)

use crate::terminal::{terminal_size, truncate};
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
}

impl LiveState {
    pub(crate) fn new() -> LiveState {
        LiveState {
            tree_rss: AtomicU64::new(0),
            tree_peak: AtomicU64::new(0),
            processes: AtomicU64::new(0),
            cgroup: AtomicU64::new(NONE),
        }
    }

    /// Publishes one sample's figures.
    pub(crate) fn publish(&self, tree_rss: u64, processes: u32, cgroup: Option<u64>) {
        self.tree_rss.store(tree_rss, Ordering::Relaxed);
        self.tree_peak.fetch_max(tree_rss, Ordering::Relaxed);
        self.processes
            .store(u64::from(processes), Ordering::Relaxed);
        self.cgroup.store(cgroup.unwrap_or(NONE), Ordering::Relaxed);
    }

    fn line(&self, elapsed: Duration) -> String {
        let mut s = format!(
            "memprobe {}  tree {}  peak {}  {} proc",
            units::secs(elapsed.as_secs_f64()),
            units::bytes(self.tree_rss.load(Ordering::Relaxed)),
            units::bytes(self.tree_peak.load(Ordering::Relaxed)),
            self.processes.load(Ordering::Relaxed),
        );
        let cg = self.cgroup.load(Ordering::Relaxed);
        if cg != NONE {
            s.push_str(&format!("  container {}", units::bytes(cg)));
        }
        s
    }
}

/// The running status line.
pub(crate) struct LiveLine {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: JoinHandle<()>,
}

/// Save the cursor, set the scroll region to rows 1..=`rows - 1`, restore.
fn scroll_region(rows: usize) -> String {
    format!("\x1b7\x1b[1;{}r\x1b8", rows - 1)
}

fn write_stderr(s: &str) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(s.as_bytes());
    let _ = e.flush();
}

impl LiveLine {
    /// Starts the line at the bottom of the terminal on stderr; `None` when
    /// stderr is not a terminal or it is too small.
    pub(crate) fn start(state: Arc<LiveState>, t0: Instant) -> Option<LiveLine> {
        let (_, mut rows) = terminal_size(2).filter(|&(_, r)| r >= 3)?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = Arc::clone(&stop);
        // Make room: scroll one line if the cursor is on the last row, then
        // keep the cursor inside the region.
        write_stderr(&format!("\n{}\x1b[1A", scroll_region(rows)));
        let handle = thread::Builder::new()
            .name("memprobe-live".into())
            .spawn(move || {
                let (lock, cv) = &*s;
                let Ok(mut stopped) = lock.lock() else { return };
                while !*stopped {
                    let (cols, now_rows) = terminal_size(2).unwrap_or((80, rows));
                    let mut out = String::new();
                    if now_rows != rows && now_rows >= 3 {
                        rows = now_rows;
                        out.push_str(&scroll_region(rows));
                    }
                    let line = state.line(t0.elapsed());
                    // Save the cursor, go to the last row, clear it, draw, restore.
                    out.push_str(&format!(
                        "\x1b7\x1b[{rows};1H\x1b[2K\x1b[7m{}\x1b[0m\x1b8",
                        truncate(&line, cols.saturating_sub(1))
                    ));
                    write_stderr(&out);
                    match cv.wait_timeout(stopped, REDRAW) {
                        Ok((g, _)) => stopped = g,
                        Err(_) => return,
                    }
                }
                // Clear the line, give the whole screen back.
                write_stderr(&format!("\x1b7\x1b[{rows};1H\x1b[2K\x1b[r\x1b8"));
            })
            .ok()?;
        Some(LiveLine { stop, handle })
    }

    /// Erases the line, resets the scroll region and stops.
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
    fn line_shows_tree_peak_and_container() {
        let s = LiveState::new();
        s.publish(3 << 20, 2, None);
        s.publish(1 << 20, 2, Some(5 << 30));
        let line = s.line(Duration::from_millis(1500));
        assert!(line.contains("tree 1.00 MiB  peak 3.00 MiB"), "{line}");
        assert!(line.contains("container 5.00 GiB"), "{line}");
    }
}
