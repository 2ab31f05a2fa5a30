//! Which samplers catch a memory spike: memprobe's exact window against
//! polling samplers at 1 s (Avalanche's MaxRAM default), 100 ms, 10 ms and
//! 1 ms (fastai's peak thread), all watching the same spikes in one run.
//!
//! Each spike maps 64 MiB with MAP_POPULATE (RSS jumps in one call), holds it
//! for the hold time and unmaps it, at a random phase against the pollers.
//! A sampler "caught" the spike when its maximum over the spike reached the
//! baseline plus 90 % of the spike. Pollers read /proc/self/statm in their own
//! threads, as a polling thread in Python or C would.
//!
//! `cargo bench -p memprobe-tests --bench spike_catch` (part of `make bench`).
//! `MEMPROBE_BENCH_SPIKES` spikes per hold time (default 20).

use memprobe_core::{Source, Window};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SPIKE: usize = 64 << 20;

struct Poller {
    interval: Duration,
    max: Arc<AtomicU64>,
}

fn rss(f: &std::fs::File) -> u64 {
    let mut buf = [0u8; 128];
    let n = f.read_at(&mut buf, 0).unwrap_or(0);
    let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 4096
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let spikes: usize = std::env::var("MEMPROBE_BENCH_SPIKES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let stop = Arc::new(AtomicBool::new(false));
    let intervals = [1000u64, 100, 10, 1];
    let pollers: Vec<Poller> = intervals
        .iter()
        .map(|&ms| {
            let max = Arc::new(AtomicU64::new(0));
            let (m, s) = (max.clone(), stop.clone());
            std::thread::spawn(move || {
                let f = std::fs::File::open("/proc/self/statm").unwrap();
                let interval = Duration::from_millis(ms);
                let mut next = Instant::now();
                while !s.load(Ordering::Relaxed) {
                    m.fetch_max(rss(&f), Ordering::Relaxed);
                    next += interval;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now;
                    }
                }
            });
            Poller {
                interval: Duration::from_millis(ms),
                max,
            }
        })
        .collect();
    let statm = std::fs::File::open("/proc/self/statm").unwrap();
    let src = Source::process().unwrap();
    let mut w = Window::open(std::slice::from_ref(&src)).unwrap();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let holds = [0.5f64, 2.0, 10.0, 50.0, 200.0];
    println!(
        "memprobe spike-catch benchmark: {spikes} spikes of 64 MiB per hold time, at random phases"
    );
    print!("{:>10} {:>14}", "hold", "exact window");
    for p in &pollers {
        print!(" {:>11}", format!("poll {:?}", p.interval));
    }
    println!();
    for hold in holds {
        let mut caught = vec![0usize; 1 + pollers.len()];
        for _ in 0..spikes {
            // Random gap: the spike starts at a random phase of every poller.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            std::thread::sleep(Duration::from_micros(2000 + seed % 20_000));
            let base = rss(&statm);
            w.reset().unwrap();
            for p in &pollers {
                p.max.store(0, Ordering::Relaxed);
            }
            // SAFETY: an anonymous private mapping, populated, held, unmapped.
            unsafe {
                let m = libc::mmap(
                    std::ptr::null_mut(),
                    SPIKE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                    -1,
                    0,
                );
                assert_ne!(m, libc::MAP_FAILED);
                let until = Instant::now() + Duration::from_secs_f64(hold / 1000.0);
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                libc::munmap(m, SPIKE);
            }
            let want = base + (SPIKE as u64) * 9 / 10;
            if w.peaks().unwrap()[0] >= want {
                caught[0] += 1;
            }
            for (i, p) in pollers.iter().enumerate() {
                if p.max.load(Ordering::Relaxed) >= want {
                    caught[i + 1] += 1;
                }
            }
        }
        print!("{:>8} ms", hold);
        for c in &caught {
            print!(" {:>10.0}%", 100.0 * *c as f64 / spikes as f64);
        }
        println!();
    }
    stop.store(true, Ordering::Relaxed);
}
