//! A small stand-in for a training job, for `memprobe run` to watch.
//!
//! It forks worker processes that each hold some memory (like DataLoader
//! workers), then runs a few "epochs" of 8 steps and a short validation
//! each: every epoch keeps a little more memory than the last (a slow
//! leak), and one step of the middle epoch has a short 256 MiB spike (a
//! large temporary buffer). Then it stops the workers and exits.
//!
//! Its phases go through a memprobe tracker, as a training loop's would:
//! under `memprobe run` (which names the run channel to it) the chart
//! shades the epochs and validations and marks the step of the spike.
//!
//! ```text
//! cargo build --release -p memprobe-cli --example spiky
//! cargo run --release -p memprobe-cli -- run --plot memprobe-run.svg -- target/release/examples/spiky
//! ```
//!
//! Options (all optional): `--epochs N` (3), `--epoch-ms MS` (800),
//! `--workers N` (2), `--worker-mib MIB` (96), `--base-mib MIB` (128),
//! `--growth-mib MIB` (32), `--spike-mib MIB` (256), `--spike-ms MS` (50).

use memprobe_core::{PhaseKind, Source, Tracker};
use std::time::Duration;

/// Steps per epoch; the spike is in the middle one of the middle epoch.
const STEPS: u64 = 8;

struct Options {
    epochs: u32,
    epoch_ms: u64,
    workers: u32,
    worker_mib: usize,
    base_mib: usize,
    growth_mib: usize,
    spike_mib: usize,
    spike_ms: u64,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        epochs: 3,
        epoch_ms: 800,
        workers: 2,
        worker_mib: 96,
        base_mib: 128,
        growth_mib: 32,
        spike_mib: 256,
        spike_ms: 50,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: u64 = value
            .parse()
            .map_err(|_| format!("{flag}: '{value}' is not a whole number"))?;
        let small = || u32::try_from(n).map_err(|_| format!("{flag}: {n} is too large"));
        match flag.as_str() {
            "--epochs" => o.epochs = small()?,
            "--epoch-ms" => o.epoch_ms = n,
            "--workers" => o.workers = small()?,
            "--worker-mib" => o.worker_mib = n as usize,
            "--base-mib" => o.base_mib = n as usize,
            "--growth-mib" => o.growth_mib = n as usize,
            "--spike-mib" => o.spike_mib = n as usize,
            "--spike-ms" => o.spike_ms = n,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

/// Anonymous memory that is really resident: every page is written.
struct Block {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Block {
    fn touched(mib: usize) -> Block {
        let len = mib << 20;
        if len == 0 {
            return Block {
                ptr: std::ptr::null_mut(),
                len,
            };
        }
        // SAFETY: an anonymous private mapping with no address hint.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(ptr != libc::MAP_FAILED, "mmap of {mib} MiB failed");
        let bytes = ptr.cast::<u8>();
        for off in (0..len).step_by(4096) {
            // SAFETY: `off < len`, inside the mapping just created.
            unsafe { bytes.add(off).write_volatile(1) };
        }
        Block { ptr, len }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping was created by `touched` with this length.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("spiky: {e}");
            std::process::exit(2);
        }
    };
    let total = Duration::from_millis(o.epoch_ms * u64::from(o.epochs));
    let mut workers = Vec::new();
    for w in 0..o.workers {
        // SAFETY: this program is single-threaded, so the child may run any code.
        match unsafe { libc::fork() } {
            0 => {
                let _held = Block::touched(o.worker_mib);
                std::thread::sleep(total);
                // SAFETY: _exit skips the parent's atexit handlers and buffers.
                unsafe { libc::_exit(0) };
            }
            pid if pid > 0 => workers.push(pid),
            _ => eprintln!("spiky: fork of worker {w} failed"),
        }
    }
    println!(
        "spiky: {} workers holding {} MiB each",
        workers.len(),
        o.worker_mib
    );

    // The program's own memory, exactly: what its phases are measured on.
    let rss = Source::process().unwrap_or_else(|e| {
        eprintln!("spiky: {e}");
        std::process::exit(1);
    });
    let mut tracker = Tracker::new(std::slice::from_ref(&rss)).unwrap_or_else(|e| {
        eprintln!("spiky: {e}");
        std::process::exit(1);
    });
    let phase = |r: memprobe_core::Result<_>| {
        if let Err(e) = r {
            eprintln!("spiky: {e}");
        }
    };

    let _base = Block::touched(o.base_mib);
    let mut kept = Vec::new();
    let spike_epoch = o.epochs / 2;
    // 8 steps and a validation of about one step.
    let step = Duration::from_millis(o.epoch_ms / (STEPS + 1));
    for epoch in 0..o.epochs {
        phase(tracker.begin(PhaseKind::Epoch, None));
        phase(tracker.begin(PhaseKind::Step, None));
        for s in 0..STEPS {
            if s == 0 {
                kept.push(Block::touched(o.growth_mib));
            }
            std::thread::sleep(step / 2);
            if epoch == spike_epoch && s == STEPS / 2 {
                let spike = Block::touched(o.spike_mib);
                std::thread::sleep(Duration::from_millis(o.spike_ms));
                drop(spike);
            }
            std::thread::sleep(step / 2);
            if s + 1 < STEPS {
                phase(tracker.next(PhaseKind::Step, None).map(drop));
            }
        }
        phase(tracker.end(PhaseKind::Step, None).map(drop));
        phase(tracker.end(PhaseKind::Epoch, None).map(drop));
        phase(tracker.begin(PhaseKind::Custom, Some("validation")));
        std::thread::sleep(step);
        phase(tracker.end(PhaseKind::Custom, Some("validation")).map(drop));
        println!(
            "spiky: epoch {epoch} done, holding {} MiB",
            o.base_mib + o.growth_mib * kept.len()
        );
    }
    // Dropping the tracker sends what its channel still holds.
    drop(tracker);
    for pid in workers {
        let mut status = 0;
        // SAFETY: valid status pointer; `pid` is our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    println!("spiky: done");
}
