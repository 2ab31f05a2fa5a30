//! The background monitor: lazy start, sampled peaks, sinks, prompt stop, and
//! fork from a process whose monitor thread is running.

use memprobe_core::{monitor, Sample, Sink, SnapshotSink, Source, SourceInfo, Window};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn value_source(name: &str) -> (Source, Arc<AtomicU64>) {
    let v = Arc::new(AtomicU64::new(10));
    let v2 = v.clone();
    let src = Source::callback(name, Box::new(move || Ok(v2.load(Ordering::SeqCst)))).unwrap();
    (src, v)
}

#[test]
fn interval_is_validated() {
    assert!(monitor::set_interval(Duration::from_micros(99)).is_err());
    assert!(monitor::set_interval(Duration::from_secs(3601)).is_err());
    assert!(monitor::set_interval(Duration::ZERO).is_err());
}

#[test]
fn sampled_peak_is_caught_and_sinks_see_samples() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    monitor::set_interval(Duration::from_millis(1)).unwrap();
    let sink = Arc::new(SnapshotSink::new());
    monitor::add_sink(sink.clone()).unwrap();
    let (src, v) = value_source("cb");
    let w = Window::open(std::slice::from_ref(&src)).unwrap();
    assert!(
        monitor::stats().unwrap().running,
        "monitor starts lazily on a sampled window"
    );
    v.store(500, Ordering::SeqCst);
    // Hold the value until the monitor has polled at least twice.
    let before = monitor::stats().unwrap().reads;
    let t = Instant::now();
    while monitor::stats().unwrap().reads < before + 2 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    v.store(20, Ordering::SeqCst);
    assert_eq!(w.peaks().unwrap(), vec![500]);
    assert!(sink
        .samples()
        .iter()
        .any(|(n, s)| n == "cb" && s.used == 500));
    monitor::clear_sinks().unwrap();
    // With an hour between polls, a stop that waited for the next tick
    // would take an hour; a prompt one wakes the thread. Let the monitor
    // settle into its hour-long sleep first (its tick count stops moving),
    // then stop it with a bound that only separates the two.
    monitor::set_interval(monitor::MAX_INTERVAL).unwrap();
    let t = Instant::now();
    let mut ticks = monitor::stats().unwrap().ticks;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = monitor::stats().unwrap().ticks;
        if now == ticks || t.elapsed() > Duration::from_secs(60) {
            break;
        }
        ticks = now;
    }
    let stopping = std::thread::spawn(monitor::stop);
    let t = Instant::now();
    while !stopping.is_finished() && t.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        stopping.is_finished(),
        "stop waited for the polling interval"
    );
    stopping.join().unwrap().unwrap();
    drop(w);
    assert!(!monitor::stats().unwrap().running);
    monitor::set_interval(monitor::DEFAULT_INTERVAL).unwrap();
}

#[test]
fn a_failing_source_is_counted_and_others_go_on() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    monitor::set_interval(Duration::from_millis(1)).unwrap();
    let fail = Arc::new(AtomicU64::new(0));
    let f2 = fail.clone();
    let flaky = Source::callback(
        "flaky",
        Box::new(move || {
            if f2.load(Ordering::SeqCst) == 1 {
                Err(memprobe_core::Error::new(
                    memprobe_core::ErrorKind::GpuLost,
                    "fell off the bus",
                ))
            } else {
                Ok(1)
            }
        }),
    )
    .unwrap();
    let (good, v) = value_source("good");
    let w = Window::open(&[flaky.clone(), good.clone()]).unwrap();
    fail.store(1, Ordering::SeqCst);
    v.store(77, Ordering::SeqCst);
    let t = Instant::now();
    while flaky.last_error().unwrap().is_none() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let err = flaky
        .last_error()
        .unwrap()
        .expect("the monitor recorded the failure");
    assert_eq!(err.kind(), memprobe_core::ErrorKind::GpuLost);
    let t = Instant::now();
    while good.last().unwrap().map(|s| s.used) != Some(77) && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        good.last().unwrap().unwrap().used,
        77,
        "the other source is still polled"
    );
    drop(w);
    monitor::set_interval(monitor::DEFAULT_INTERVAL).unwrap();
}

struct Counting(AtomicU64);
impl Sink for Counting {
    fn on_sample(&self, _: &SourceInfo, _: &Sample) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn fork_with_monitor_running_child_works() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    monitor::set_interval(Duration::from_micros(200)).unwrap();
    monitor::add_sink(Arc::new(Counting(AtomicU64::new(0)))).unwrap();
    let (src, _v) = value_source("busy");
    let rss = Source::process().unwrap();
    let _w = Window::open(&[src.clone(), rss.clone()]).unwrap();
    assert!(monitor::stats().unwrap().running);
    for _ in 0..20 {
        // SAFETY: the child only runs memprobe calls and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = std::panic::catch_unwind(|| {
                let parent_rss = rss.read().unwrap().used;
                // The child's kept-open /proc/self descriptors were reopened: a
                // 64 MiB spike in the child is seen by a window in the child.
                let w = Window::open(&[rss.clone(), src.clone()]).unwrap();
                let start = w.starts()[0].used;
                // SAFETY: an anonymous private mapping, checked below.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        64 << 20,
                        3,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                } as *mut u8;
                assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
                for i in (0..(64 << 20)).step_by(4096) {
                    // SAFETY: `i` is within the 64 MiB mapping.
                    unsafe { p.add(i).write_volatile(1) };
                }
                // SAFETY: unmaps exactly the mapping made above.
                unsafe { libc::munmap(p as *mut _, 64 << 20) };
                let peak = w.peaks().unwrap()[0];
                let stats = monitor::stats().unwrap();
                peak >= start + (62 << 20) && parent_rss > 0 && stats.running
            });
            // SAFETY: ends the forked child without running the parent's atexit handlers.
            unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 3 }) };
        }
        wait_for_child(pid);
    }
    monitor::clear_sinks().unwrap();
    monitor::set_interval(monitor::DEFAULT_INTERVAL).unwrap();
}

/// `fork()` waits while another thread is inside a memprobe call (here a
/// read whose callback takes 300 ms, holding the source's lock), and the
/// child then uses that same source without deadlocking.
#[test]
fn fork_waits_for_a_thread_inside_memprobe() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let inside = Arc::new(AtomicU64::new(0));
    let (i, left) = (inside.clone(), Arc::new(AtomicU64::new(0)));
    let l = left.clone();
    let slow = Source::callback(
        "slow",
        Box::new(move || {
            i.store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(300));
            l.store(1, Ordering::SeqCst);
            Ok(7)
        }),
    )
    .unwrap();
    let s = slow.clone();
    let reader = std::thread::spawn(move || s.read().unwrap().used);
    while inside.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    // SAFETY: the child only runs memprobe calls and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // The read had ended when the fork went on: the lock is free here.
        let ok = left.load(Ordering::SeqCst) == 1 && slow.read().map(|s| s.used) == Ok(7);
        // SAFETY: ends the forked child without running the parent's atexit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 3 }) };
    }
    assert_eq!(
        left.load(Ordering::SeqCst),
        1,
        "the fork did not wait for the read"
    );
    wait_for_child(pid);
    assert_eq!(reader.join().unwrap(), 7);
}

/// Waits for a forked child: it must exit 0 within 20 s (a deadlock in it
/// is killed and fails the test).
fn wait_for_child(pid: libc::pid_t) {
    let t = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: `pid` is our child and `status` a valid, writable int.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if t.elapsed() > Duration::from_secs(20) {
            // SAFETY: kills our own child, which has not been reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("child deadlocked after fork");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status:#x}"
    );
}
