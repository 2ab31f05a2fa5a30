//! `memprobe watch`: a refreshing view of the host, the container, the GPUs
//! with their processes, and the processes using the most memory, like
//! `nvidia-smi -l`.
//!
//! On a terminal the screen is cleared once, the cursor hidden, and each
//! frame drawn from the home position (plain ANSI sequences, no curses);
//! Ctrl-C, SIGTERM or SIGHUP end it with the cursor shown again and status
//! 0. Signals are blocked and taken with `sigtimedwait` between frames, so
//! no handler runs and the terminal is always restored by ordinary code.
//! When stdout is not a terminal, each reading is printed as one block,
//! headed by a `--- memprobe watch <time> ---` line.

use crate::args::WatchArgs;
use crate::columns::render_rows;
use crate::exit;
use crate::gpu_readings;
use crate::machine::{self, Probes};
use crate::signals::{self, SigSet};
use crate::terminal::{is_tty, terminal_size, truncate};
use crate::units;
use memprobe_core::internal::process::{all_pids, command_name};
use std::io::{self, Write};
use std::time::Instant;

const HIDE_CURSOR: &str = "\x1b[?25l";
const SHOW_CURSOR: &str = "\x1b[?25h";
const CLEAR_SCREEN: &str = "\x1b[2J";
const HOME: &str = "\x1b[H";
const CLEAR_LINE_END: &str = "\x1b[K";
const CLEAR_BELOW: &str = "\x1b[J";

/// Restores the terminal however the loop ends (signal, error, panic).
struct TerminalGuard;

impl TerminalGuard {
    fn enter(out: &mut impl Write) -> io::Result<TerminalGuard> {
        out.write_all(format!("{CLEAR_SCREEN}{HOME}{HIDE_CURSOR}").as_bytes())?;
        out.flush()?;
        Ok(TerminalGuard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let mut out = io::stdout();
        let _ = out.write_all(format!("{SHOW_CURSOR}\n").as_bytes());
        let _ = out.flush();
    }
}

pub(crate) fn main(args: WatchArgs) -> i32 {
    let set = SigSet::of(&signals::STOPPING);
    if let Err(e) = set.block() {
        crate::say::say!("memprobe: cannot block signals: {e}");
        return exit::FAILURE;
    }
    let tty = is_tty(1);
    let mut out = io::stdout();
    let _guard = if tty {
        match TerminalGuard::enter(&mut out) {
            Ok(g) => Some(g),
            Err(e) => return write_failed(&e),
        }
    } else {
        None
    };
    let mut probes = Probes::open();
    let mut next = Instant::now();
    loop {
        let size = if tty { terminal_size(1) } else { None };
        let text = frame(&mut probes, &args, size);
        let bytes = if tty {
            let width = size.map_or(usize::MAX, |s| s.0);
            let mut s = String::from(HOME);
            for line in text.lines() {
                s.push_str(truncate(line, width));
                s.push_str(CLEAR_LINE_END);
                s.push('\n');
            }
            s.push_str(CLEAR_BELOW);
            s
        } else {
            text + "\n"
        };
        if let Err(e) = out.write_all(bytes.as_bytes()).and_then(|()| out.flush()) {
            return write_failed(&e);
        }
        next += args.interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        if signals::wait(&set, Some(next - now)).is_some() {
            return 0;
        }
    }
}

fn write_failed(e: &io::Error) -> i32 {
    if e.kind() == io::ErrorKind::BrokenPipe {
        0
    } else {
        crate::say::say!("memprobe: writing to stdout: {e}");
        exit::FAILURE
    }
}

/// One frame's text. `size` (columns, rows) limits the process list on a
/// terminal.
fn frame(probes: &mut Probes, args: &WatchArgs, size: Option<(usize, usize)>) -> String {
    let mut r = probes.read();
    gpu_readings::name_origins(&mut r.gpus);
    let mut out = format!(
        "--- memprobe watch {} --- every {} (Ctrl-C to quit)\n\n",
        units::time_of_day(r.taken_at_unix_s),
        units::duration(args.interval)
    );
    out.push_str(&machine::table(&r, args.verbose));
    if !r.gpus.is_empty() {
        out.push('\n');
        out.push_str(&gpu_readings::table(&r.gpus));
    }
    // The list header (3 lines) and one spare row so the last newline does
    // not scroll the screen.
    let used = out.lines().count() + 4;
    let room = match size {
        Some((_, rows)) => rows.saturating_sub(used).max(1),
        None => 10,
    };
    out.push('\n');
    out.push_str(&top_processes(room));
    out
}

/// The `n` processes with the largest resident sets.
fn top_processes(n: usize) -> String {
    let mut procs: Vec<(u64, u32)> = match all_pids() {
        Ok(pids) => pids
            .into_iter()
            .filter_map(|pid| {
                Some((
                    memprobe_core::internal::process_tree::process_rss(pid)?,
                    pid,
                ))
            })
            .filter(|(rss, _)| *rss > 0)
            .collect(),
        Err(e) => return format!("processes: cannot read /proc: {e}\n"),
    };
    procs.sort_unstable_by(|a, b| b.cmp(a));
    procs.truncate(n);
    let mut rows = vec![["PID".to_string(), "RSS".into(), "NAME".into()]];
    for (rss, pid) in procs {
        rows.push([
            pid.to_string(),
            units::bytes(rss),
            command_name(pid).unwrap_or_else(|| "?".into()),
        ]);
    }
    let mut out = String::from("TOP PROCESSES BY RSS\n");
    out.push_str(&render_rows(&rows));
    out
}
