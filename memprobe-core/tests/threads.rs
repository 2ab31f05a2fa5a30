//! Many threads opening, resetting and closing nested windows over the shared
//! process source while the monitor polls a sampled one.
//!
//! What concurrency guarantees, and what this checks: boundaries racing one
//! another never deadlock and keep every outer window's peak at or above its
//! inner windows'; spikes made while no other thread is at a boundary are
//! exact, even when every thread allocates at once. (A spike that begins and
//! ends entirely between another thread's read and reset of the kernel mark
//! can be missed — see the README's precision notes.)

use memprobe_core::{monitor, Source, Window};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const THREADS: usize = 16;
/// The kernel batches RSS counting per thread (about 64 pages for each
/// thread that recently faulted), so with 16 threads faulting at once two
/// readings can differ by ~4 MiB. Measured here: up to 4.2 MiB.
const SLACK: u64 = THREADS as u64 * 256 * 1024 + 2 * MIB;
const SPIKE: usize = 32 << 20;

/// The process source is shared: these tests count its windows, so they run
/// one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Joins every thread. A deadlock fails the test after a deadline generous
/// enough for any loaded machine, instead of hanging it; how long the
/// threads take is never asserted.
fn join_all<T>(handles: Vec<std::thread::JoinHandle<T>>) -> Vec<T> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !handles.iter().all(|h| h.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "threads still running after 10 minutes: deadlocked"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    handles
        .into_iter()
        .map(|h| h.join().expect("thread panicked"))
        .collect()
}

/// Makes a spike and returns the process's RSS read while it was held.
fn spike(bytes: usize, rss: &Source) -> u64 {
    // SAFETY: anonymous private mapping, touched within bounds, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            3,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        ) as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        for off in (0..bytes).step_by(4096) {
            p.add(off).write_volatile(1);
        }
        let held = rss.read().unwrap().used;
        libc::munmap(p as *mut _, bytes);
        held
    }
}

#[test]
fn sixteen_threads_nested_windows_with_monitor() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    monitor::set_interval(Duration::from_millis(1)).unwrap();
    let rss = Source::process().unwrap();
    let value = Arc::new(AtomicU64::new(1));
    let v2 = value.clone();
    let sampled =
        Source::callback("counter", Box::new(move || Ok(v2.load(Ordering::Relaxed)))).unwrap();
    let failures: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let (rss, sampled, barrier, value) =
                (rss.clone(), sampled.clone(), barrier.clone(), value.clone());
            let failures = failures.clone();
            // Failures are recorded, not panicked, so no thread leaves the
            // barrier protocol and the others never wait forever.
            let check = move |ok: bool, what: String| {
                if !ok {
                    failures.lock().unwrap().push(what);
                }
            };
            std::thread::spawn(move || {
                for round in 0..20 {
                    // Boundaries race each other here.
                    let outer = Window::open(&[rss.clone(), sampled.clone()]).unwrap();
                    let mut inner = Window::open(std::slice::from_ref(&rss)).unwrap();
                    barrier.wait();
                    // Every thread allocates at once; no boundary runs.
                    value.fetch_add(1, Ordering::Relaxed);
                    let held = spike(SPIKE, &rss);
                    let p = inner.peaks().unwrap()[0];
                    check(
                        p + SLACK >= held,
                        format!("thread {i} round {round}: peak {p} < reading {held}"),
                    );
                    barrier.wait();
                    // Boundaries race again; outer stays >= inner.
                    let ended = inner.reset().unwrap();
                    check(
                        ended[0].peak + SLACK >= p,
                        format!("thread {i} round {round}: ended {} < {p}", ended[0].peak),
                    );
                    let o = outer.peaks().unwrap()[0];
                    check(
                        o + SLACK >= p,
                        format!("thread {i} round {round}: outer {o} < inner {p}"),
                    );
                    drop(inner);
                    drop(outer);
                }
            })
        })
        .collect();
    join_all(handles);
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(rss.open_windows().unwrap(), 0);
    assert_eq!(sampled.open_windows().unwrap(), 0);
    monitor::set_interval(monitor::DEFAULT_INTERVAL).unwrap();
}

#[test]
fn sixty_four_threads_window_churn_with_monitor() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    monitor::set_interval(Duration::from_millis(1)).unwrap();
    let rss = Source::process().unwrap();
    let pushed = Source::pushed("p").unwrap();
    let value = Arc::new(AtomicU64::new(1));
    let v2 = value.clone();
    let sampled = Source::callback("c", Box::new(move || Ok(v2.load(Ordering::Relaxed)))).unwrap();
    let start = Instant::now();
    let handles: Vec<_> = (0..64u64)
        .map(|i| {
            let (rss, pushed, sampled, value) =
                (rss.clone(), pushed.clone(), sampled.clone(), value.clone());
            std::thread::spawn(move || -> Result<(), String> {
                for round in 0..100u64 {
                    let outer = Window::open(&[rss.clone(), pushed.clone(), sampled.clone()])
                        .map_err(|e| e.to_string())?;
                    let mut inner =
                        Window::open(&[pushed.clone(), rss.clone()]).map_err(|e| e.to_string())?;
                    let v = i * 1000 + round;
                    pushed.push(v).map_err(|e| e.to_string())?;
                    value.fetch_max(v, Ordering::Relaxed);
                    let ip = inner.peaks().map_err(|e| e.to_string())?;
                    if ip[0] < v {
                        return Err(format!("thread {i}: pushed peak {} < own push {v}", ip[0]));
                    }
                    inner.reset().map_err(|e| e.to_string())?;
                    let op = outer.peaks().map_err(|e| e.to_string())?;
                    if op[1] < v {
                        return Err(format!("thread {i}: outer pushed peak {} < {v}", op[1]));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for r in join_all(handles) {
        r.expect("consistent peaks");
    }
    assert_eq!(
        (
            rss.open_windows().unwrap(),
            pushed.open_windows().unwrap(),
            sampled.open_windows().unwrap()
        ),
        (0, 0, 0)
    );
    eprintln!("64 threads x 100 rounds: {:?}", start.elapsed());
    monitor::set_interval(monitor::DEFAULT_INTERVAL).unwrap();
}
