//! The background monitor: one thread per process that polls the *sampled*
//! sources which have at least one open window, and fans each reading into
//! those windows (and into the monitor's sinks).
//!
//! It starts lazily, when the first window opens over a sampled source; it
//! parks (no wake-ups, no CPU) while no such window is open; [`stop`] ends the
//! thread promptly. Exact and pushed sources are never polled. After `fork()`
//! the child has no monitor thread; it starts again lazily on the next window.
//!
//! The monitor knows sources only through `Polled`, held weakly: it drives
//! the polls and fans readings out to its sinks, while the source keeps its
//! own window state. Dropping a source's last handle unwatches it.

use crate::error::{Error, Result};
use crate::fork;
use crate::lock::Lock;
use crate::sample::{Sample, SourceInfo};
use crate::sink::Sink;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Weak};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// The shortest polling interval accepted: 100 µs. Below it, the cost of the
/// reads themselves (tens of µs for a GPU) approaches a whole core.
pub const MIN_INTERVAL: Duration = Duration::from_micros(100);
/// The longest polling interval accepted: one hour.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// The default polling interval: 10 ms.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(10);

/// What the monitor polls: a sampled source with its windows. Implemented by
/// the source; the monitor never sees its state.
pub(crate) trait Polled: Send + Sync {
    /// What is polled (given to the sinks with each reading).
    fn info(&self) -> &SourceInfo;

    /// Takes one reading and folds it into the open windows. `None` when no
    /// window is open (nothing was read).
    fn poll(&self) -> Option<Result<Sample>>;
}

/// A watched source: its id (to unwatch it) and a weak handle.
type Watched = (u64, Weak<dyn Polled>);

struct Runner {
    handle: Option<JoinHandle<()>>,
    thread: Option<Thread>,
    generation: u64,
}

static WATCHED: Lock<Vec<Watched>> = Lock::new(Vec::new());
static SINKS: Lock<Vec<Arc<dyn Sink>>> = Lock::new(Vec::new());
static RUNNER: Lock<Runner> = Lock::new(Runner {
    handle: None,
    thread: None,
    generation: 0,
});
static INTERVAL_NS: AtomicU64 = AtomicU64::new(10_000_000);
static STOP: AtomicBool = AtomicBool::new(false);
static TICKS: AtomicU64 = AtomicU64::new(0);
static READS: AtomicU64 = AtomicU64::new(0);
static ERRORS: AtomicU64 = AtomicU64::new(0);

/// Counters describing the monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorStats {
    /// Whether the monitor thread exists in this process.
    pub running: bool,
    /// Sampled sources with open windows, polled at each tick.
    pub watched: usize,
    /// Ticks (polling rounds) since the process started.
    pub ticks: u64,
    /// Successful source reads by the monitor.
    pub reads: u64,
    /// Failed source reads by the monitor (e.g. a GPU lost).
    pub errors: u64,
    /// The current interval.
    pub interval: Duration,
}

/// Sets the polling interval (validated: [`MIN_INTERVAL`] ..= [`MAX_INTERVAL`]).
/// Takes effect at the next tick.
pub fn set_interval(interval: Duration) -> Result<()> {
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        return Err(Error::invalid(format!(
            "monitor interval {interval:?} is outside {MIN_INTERVAL:?} ..= {MAX_INTERVAL:?}"
        )));
    }
    INTERVAL_NS.store(crate::sample::duration_ns(interval), Ordering::Relaxed);
    wake();
    Ok(())
}

/// The polling interval.
pub fn interval() -> Duration {
    Duration::from_nanos(INTERVAL_NS.load(Ordering::Relaxed))
}

/// Adds a sink that receives every reading the monitor takes.
pub fn add_sink(sink: Arc<dyn Sink>) -> Result<()> {
    SINKS.lock()?.push(sink);
    Ok(())
}

/// Removes every sink added with [`add_sink`].
pub fn clear_sinks() -> Result<()> {
    SINKS.lock()?.clear();
    Ok(())
}

/// Counters.
pub fn stats() -> Result<MonitorStats> {
    let watched = WATCHED.lock()?.len();
    let running = {
        let r = RUNNER.lock()?;
        r.handle.is_some() && r.generation == fork::generation()
    };
    Ok(MonitorStats {
        running,
        watched,
        ticks: TICKS.load(Ordering::Relaxed),
        reads: READS.load(Ordering::Relaxed),
        errors: ERRORS.load(Ordering::Relaxed),
        interval: interval(),
    })
}

/// Stops the monitor thread and waits for it (at most one read round). It
/// starts again when a window next opens over a sampled source.
pub fn stop() -> Result<()> {
    let handle = {
        let mut r = RUNNER.lock()?;
        if r.generation != fork::generation() {
            // Forked child: the thread was the parent's.
            *r = Runner {
                handle: None,
                thread: None,
                generation: fork::generation(),
            };
            return Ok(());
        }
        STOP.store(true, Ordering::SeqCst);
        if let Some(t) = r.thread.take() {
            t.unpark();
        }
        r.handle.take()
    };
    if let Some(h) = handle {
        // A thread-local flag, not thread::current(): that would allocate the
        // caller's Thread handle, which valgrind reports as possibly lost.
        if ON_MONITOR_THREAD.with(std::cell::Cell::get) {
            return Err(Error::wrong_order(
                "monitor::stop called from the monitor thread (inside a sink)",
            ));
        }
        let _ = h.join();
    }
    STOP.store(false, Ordering::SeqCst);
    Ok(())
}

/// Starts polling `source` (and the monitor thread, if needed).
pub(crate) fn watch(id: u64, source: Weak<dyn Polled>) {
    if let Ok(mut w) = WATCHED.lock() {
        w.retain(|(_, s)| s.strong_count() > 0);
        w.push((id, source));
    }
    ensure_running();
    wake();
}

/// Stops polling the source `id`.
pub(crate) fn unwatch(id: u64) {
    if let Ok(mut w) = WATCHED.lock() {
        w.retain(|(i, s)| *i != id && s.strong_count() > 0);
    }
}

fn wake() {
    if let Ok(r) = RUNNER.lock() {
        if r.generation == fork::generation() {
            if let Some(t) = &r.thread {
                t.unpark();
            }
        }
    }
}

/// Starts the monitor thread unless it runs (restarts it in a forked child).
pub(crate) fn ensure_running() {
    let Ok(mut r) = RUNNER.lock() else { return };
    let gen = fork::generation();
    if r.handle.is_some() && r.generation == gen {
        return;
    }
    // Either never started, or this is a forked child whose thread is gone.
    if r.generation != gen {
        forget_parent_thread(&mut r);
    }
    // Wait until the thread has started, still holding RUNNER (and so the
    // fork gate): a fork() cannot catch the new thread half-started, inside
    // the allocator (thread start-up allocates; see `tick`).
    let started = Arc::new(Barrier::new(2));
    let ready = started.clone();
    let spawned = thread::Builder::new()
        .name("memprobe-monitor".into())
        .spawn(move || {
            ready.wait();
            drop(ready);
            run();
        });
    if let Ok(h) = spawned {
        started.wait();
        r.thread = Some(h.thread().clone());
        r.handle = Some(h);
        r.generation = gen;
    }
}

/// In a forked child, the parent's monitor thread does not exist, and glibc
/// hands its stack and descriptor (the same `pthread_t`) to the next thread
/// created. Dropping the stale `JoinHandle` would detach that new thread, so
/// it is forgotten instead.
fn forget_parent_thread(r: &mut Runner) {
    std::mem::forget(r.handle.take());
    r.thread = None;
    r.generation = fork::generation();
}

thread_local! {
    static ON_MONITOR_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn run() {
    ON_MONITOR_THREAD.with(|m| m.set(true));
    let mut next = Instant::now();
    loop {
        if STOP.load(Ordering::SeqCst) {
            return;
        }
        let polled = tick();
        if polled == 0 {
            // Nothing to poll: sleep until a window opens (or stop).
            thread::park();
            next = Instant::now();
            continue;
        }
        let interval = interval();
        next += interval;
        let now = Instant::now();
        if next <= now {
            // Fell behind (slow reads or a descheduled thread): skip, don't burst.
            next = now + interval;
        }
        thread::park_timeout(next - now.min(next));
    }
}

/// One polling round; returns how many sources were polled.
///
/// The whole round holds the fork gate, so `fork()` waits until it ends:
/// a child never inherits an allocator lock (or a library's lock) that this
/// thread held mid-round. glibc's malloc protects itself around fork, but
/// other allocators (AddressSanitizer's among them) do not.
fn tick() -> usize {
    let _gate = fork::GateGuard::enter();
    let sources: Vec<Arc<dyn Polled>> = match WATCHED.lock() {
        Ok(w) => w.iter().filter_map(|(_, s)| s.upgrade()).collect(),
        Err(_) => return 0,
    };
    if sources.is_empty() {
        return 0;
    }
    TICKS.fetch_add(1, Ordering::Relaxed);
    let mut readings: Vec<(&SourceInfo, Sample)> = Vec::with_capacity(sources.len());
    let mut polled = 0;
    for s in &sources {
        match s.poll() {
            Some(Ok(sample)) => {
                polled += 1;
                READS.fetch_add(1, Ordering::Relaxed);
                readings.push((s.info(), sample));
            }
            None => {}
            Some(Err(_)) => {
                polled += 1;
                ERRORS.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if !readings.is_empty() {
        if let Ok(sinks) = SINKS.lock() {
            for sink in sinks.iter() {
                for (info, sample) in &readings {
                    sink.on_sample(info, sample);
                }
            }
        }
    }
    polled
}
