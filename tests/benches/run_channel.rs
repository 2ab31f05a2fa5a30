//! What the run channel (`MEMPROBE_RUN_CHANNEL`, memprobe-core's
//! run_channel) adds to a tracker's step boundary (`Tracker::next`: the
//! step's record is folded into its tracker's batch, one datagram per
//! `BATCH_NS` or `BATCH_STEPS` steps), measured side by side in one run:
//!
//! - unset: no variable (the boundary looks once at a cell);
//! - reading: a receiver thread reading every datagram as fast as it can
//!   (memprobe run's thread also decodes them);
//! - never reading: a bound socket nobody reads (the queue is full: the
//!   batches are kept up to `MAX_PENDING`, then dropped and counted);
//! - gone: no socket at the path (ENOENT: one failed send, then
//!   `GONE_SKIP` messages with no system call).
//!
//! Each over two trackers: this process's RSS (exact: the realistic
//! boundary, with its kernel reads) and a pushed source (the tracker's own
//! cost only, so the channel's share shows).
//!
//! `cargo bench -p memprobe-tests --bench run_channel` (release build).
//! Cases are interleaved round by round so machine noise hits them alike;
//! each figure is the median over rounds of the mean time per call.

use memprobe_core::RunChannel;
use memprobe_core::{PhaseKind, Source, Tracker};
use std::hint::black_box;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

const ROUNDS: usize = 31;
const ITERS: usize = 2000;

struct Case {
    name: String,
    tracker: Tracker,
    channel: Option<Arc<RunChannel>>,
    rounds: Vec<f64>,
    base: usize,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // "unset" means unset: the variable is read once per process.
    std::env::remove_var(memprobe_core::internal::run_channel::ENV);
    // As in the overhead bench: a trainer holds more than its launcher,
    // which keeps the exact boundary on its fast path.
    let ballast_mib: usize = std::env::var("MEMPROBE_BENCH_BALLAST_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let mut ballast = vec![0u8; ballast_mib << 20];
    for i in (0..ballast.len()).step_by(4096) {
        ballast[i] = 1;
    }
    black_box(&ballast);

    let dir = std::env::temp_dir().join(format!("memprobe-bench-channel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| -> PathBuf { dir.join(name) };
    let reader = UnixDatagram::bind(path("reading")).unwrap();
    let _never = UnixDatagram::bind(path("never")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reading = {
        let stop = Arc::clone(&stop);
        reader
            .set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .unwrap();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if reader.recv(&mut buf).is_ok() {
                    n += 1;
                }
            }
            n
        })
    };

    let rss = Source::process().unwrap();
    let pushed = Source::pushed("alloc").unwrap();
    pushed.push(64 << 20).unwrap();
    let mut cases: Vec<Case> = Vec::new();
    for (source, what) in [(&rss, "process RSS"), (&pushed, "pushed")] {
        let base = cases.len();
        for mode in ["unset", "reading", "never reading", "gone"] {
            let mut tracker = Tracker::new(std::slice::from_ref(source)).unwrap();
            let channel = match mode {
                "unset" => None,
                "reading" => Some(path("reading")),
                "never reading" => Some(path("never")),
                _ => Some(path("gone")),
            }
            .map(|p| Arc::new(RunChannel::connect(&p).unwrap()));
            if let Some(c) = &channel {
                tracker.set_run_channel(Some(Arc::clone(c)));
            }
            tracker.begin(PhaseKind::Epoch, None).unwrap();
            tracker.begin(PhaseKind::Step, None).unwrap();
            cases.push(Case {
                name: format!("tracker step next, {what}, channel {mode}"),
                tracker,
                channel,
                rounds: Vec::new(),
                base,
            });
        }
    }

    for case in &mut cases {
        for _ in 0..ITERS / 4 {
            black_box(case.tracker.next(PhaseKind::Step, None).unwrap());
        }
    }
    for _ in 0..ROUNDS {
        for case in &mut cases {
            let t = Instant::now();
            for _ in 0..ITERS {
                black_box(case.tracker.next(PhaseKind::Step, None).unwrap());
            }
            case.rounds
                .push(t.elapsed().as_nanos() as f64 / ITERS as f64);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let received = reading.join().unwrap();

    println!(
        "run channel benchmark: {ROUNDS} rounds x {ITERS} step boundaries, cases interleaved, {ballast_mib} MiB held"
    );
    println!(
        "{:<58} {:>10} {:>9} {:>10}  messages: sent, dropped (steps in them), kept",
        "case", "median ns", "x unset", "+ns"
    );
    let medians: Vec<f64> = cases
        .iter_mut()
        .map(|c| median(&mut c.rounds.clone()))
        .collect();
    for (i, case) in cases.iter().enumerate() {
        let (m, base) = (medians[i], medians[case.base]);
        let delivered = case.channel.as_ref().map_or_else(
            || "-".to_string(),
            |c| {
                let (kept, _) = c.pending();
                format!(
                    "{}, {} ({}), {kept}",
                    c.sent(),
                    c.dropped(),
                    c.dropped_steps()
                )
            },
        );
        println!(
            "{:<58} {:>10.0} {:>8.2}x {:>+10.0}  {}",
            case.name,
            m,
            m / base,
            m - base,
            delivered
        );
    }
    println!("the reading thread received {received} datagrams");
    let _ = std::fs::remove_dir_all(&dir);
}
