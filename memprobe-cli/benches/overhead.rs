//! The cost of `memprobe run` on the program it measures: wall time of a
//! CPU-bound child (a fixed amount of work, calibrated to about 1 s) run
//! bare and under `memprobe run --interval 10ms`, in alternating pairs
//! (the order flips every pair), with medians and the overhead ratio.
//!
//! ```text
//! cargo bench -j2 -p memprobe-cli --bench overhead
//! ```
//!
//! `MEMPROBE_BENCH_PAIRS` (default 10) and `MEMPROBE_BENCH_INTERVAL`
//! (default `10ms`) change the run. The child is this very binary,
//! re-executed with `MEMPROBE_BENCH_CHILD=<iterations>`.
#[path = "support/median.rs"]
mod median;

use median::median;

use std::hint::black_box;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "MEMPROBE_BENCH_CHILD";

/// The work: a chain of dependent multiply-xorshift steps (no memory traffic).
fn spin(iterations: u64) -> u64 {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..iterations {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        x ^= x >> 33;
    }
    black_box(x)
}

/// Iterations that take about `target` on this machine.
fn calibrate(target: Duration) -> u64 {
    let probe = 50_000_000;
    spin(probe / 10); // warm up
    let t = Instant::now();
    spin(probe);
    let per_iter = t.elapsed().as_secs_f64() / probe as f64;
    (target.as_secs_f64() / per_iter) as u64
}

/// One run: wall time and the child's CPU time (user + system).
struct Timing {
    wall_s: f64,
    child_cpu_s: f64,
}

struct Probed {
    timing: Timing,
    memprobe_cpu_s: f64,
    samples: u64,
}

// Reaped with wait4 (for its rusage), not Child::wait.
#[allow(clippy::zombie_processes)]
fn bare(me: &str, iterations: u64) -> Timing {
    let t = Instant::now();
    let child = Command::new(me)
        .env(CHILD_ENV, iterations.to_string())
        .spawn()
        .expect("run the child");
    let mut status = 0;
    // SAFETY: rusage is plain data written by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers; the pid is our child, waited for only here.
    let rc = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    let wall = t.elapsed().as_secs_f64();
    assert!(rc > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Timing {
        wall_s: wall,
        child_cpu_s: tv(ru.ru_utime) + tv(ru.ru_stime),
    }
}

fn probed(memprobe: &str, me: &str, iterations: u64, interval: &str, json: &str) -> Probed {
    let t = Instant::now();
    let st = Command::new(memprobe)
        .args(["run", "--interval", interval, "--json", json, "--", me])
        .env(CHILD_ENV, iterations.to_string())
        .stderr(Stdio::null())
        .status()
        .expect("run memprobe");
    let wall = t.elapsed().as_secs_f64();
    assert!(st.success());
    let text = std::fs::read_to_string(json).expect("memprobe's JSON");
    let field = |name: &str| -> f64 {
        let key = format!("\"{name}\":");
        let at = text.find(&key).expect(name) + key.len();
        let end = text[at..].find([',', '}']).expect("value end");
        text[at..at + end].trim().parse().expect("a number")
    };
    Probed {
        timing: Timing {
            wall_s: wall,
            child_cpu_s: field("command_cpu_s"),
        },
        memprobe_cpu_s: field("memprobe_cpu_s"),
        samples: field("samples") as u64,
    }
}

fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn main() {
    if let Ok(n) = std::env::var(CHILD_ENV) {
        spin(n.parse().expect("iterations"));
        return;
    }
    let memprobe = env!("CARGO_BIN_EXE_memprobe");
    let me_path = std::env::current_exe().expect("current_exe");
    let me = me_path.to_str().expect("a UTF-8 path");
    let pairs: usize = std::env::var("MEMPROBE_BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let interval = std::env::var("MEMPROBE_BENCH_INTERVAL").unwrap_or_else(|_| "10ms".into());
    let json = std::env::temp_dir().join(format!("memprobe-bench-{}.json", std::process::id()));
    let json = json.to_str().expect("a UTF-8 path");

    // Calibrate in-process, then correct with one bare run of the child.
    let guess = calibrate(Duration::from_secs(1));
    let iterations = (guess as f64 / bare(me, guess).wall_s) as u64;
    println!(
        "memprobe run overhead: {pairs} alternating pairs, --interval {interval}, \
         CPU-bound child of {iterations} iterations (~1 s)"
    );
    // Warm-up pair (page cache, CPU frequency), not counted.
    bare(me, iterations);
    probed(memprobe, me, iterations, &interval, json);

    let mut bare_runs = Vec::new();
    let mut probed_runs = Vec::new();
    for i in 0..pairs {
        if i % 2 == 0 {
            bare_runs.push(bare(me, iterations));
            probed_runs.push(probed(memprobe, me, iterations, &interval, json));
        } else {
            probed_runs.push(probed(memprobe, me, iterations, &interval, json));
            bare_runs.push(bare(me, iterations));
        }
        let (b, p) = (&bare_runs[i], &probed_runs[i].timing);
        println!(
            "pair {:>2}: wall bare {:.4} s, memprobe {:.4} s   child CPU bare {:.4} s, memprobe {:.4} s",
            i + 1,
            b.wall_s,
            p.wall_s,
            b.child_cpu_s,
            p.child_cpu_s
        );
    }
    let _ = std::fs::remove_file(json);
    let col = |v: &mut dyn Iterator<Item = f64>| median(&mut v.collect::<Vec<_>>());
    let bw = col(&mut bare_runs.iter().map(|t| t.wall_s));
    let pw = col(&mut probed_runs.iter().map(|r| r.timing.wall_s));
    let bc = col(&mut bare_runs.iter().map(|t| t.child_cpu_s));
    let pc = col(&mut probed_runs.iter().map(|r| r.timing.child_cpu_s));
    let pair_wall = col(&mut bare_runs
        .iter()
        .zip(&probed_runs)
        .map(|(b, p)| (p.timing.wall_s / b.wall_s - 1.0) * 100.0));
    let own = col(&mut probed_runs
        .iter()
        .map(|r| r.memprobe_cpu_s / r.timing.wall_s * 100.0));
    let samples = col(&mut probed_runs.iter().map(|r| r.samples as f64));
    println!();
    println!("                 bare        memprobe    overhead");
    println!(
        "wall (median)    {bw:.4} s    {pw:.4} s    {:+.2} %   (target <= 1 %)",
        (pw / bw - 1.0) * 100.0
    );
    println!(
        "child CPU        {bc:.4} s    {pc:.4} s    {:+.2} %",
        (pc / bc - 1.0) * 100.0
    );
    println!("per-pair wall overhead, median: {pair_wall:+.2} %");
    println!("memprobe's own CPU: median {own:.2} % of one core, {samples:.0} samples per run");
    println!(
        "machine: nproc {}, kernel {}, {}",
        sh("nproc"),
        sh("uname -r"),
        sh("date -u +%Y-%m-%dT%H:%MZ")
    );
}
