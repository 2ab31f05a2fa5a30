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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Probed {
    wall_s: f64,
    memprobe_cpu_s: f64,
    samples: u64,
}

fn bare(me: &str, iterations: u64) -> f64 {
    let t = Instant::now();
    let st = Command::new(me)
        .env(CHILD_ENV, iterations.to_string())
        .status()
        .expect("run the child");
    let wall = t.elapsed().as_secs_f64();
    assert!(st.success());
    wall
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
        wall_s: wall,
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

    let iterations = calibrate(Duration::from_secs(1));
    println!(
        "memprobe run overhead: {pairs} alternating pairs, --interval {interval}, \
         CPU-bound child of {iterations} iterations (~1 s)"
    );
    // Warm-up pair (page cache, CPU frequency), not counted.
    bare(me, iterations);
    probed(memprobe, me, iterations, &interval, json);

    let (mut b, mut p, mut cpu, mut samples) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..pairs {
        let run_probed = |p: &mut Vec<f64>, cpu: &mut Vec<f64>, samples: &mut Vec<f64>| {
            let r = probed(memprobe, me, iterations, &interval, json);
            p.push(r.wall_s);
            cpu.push(r.memprobe_cpu_s / r.wall_s * 100.0);
            samples.push(r.samples as f64);
        };
        if i % 2 == 0 {
            b.push(bare(me, iterations));
            run_probed(&mut p, &mut cpu, &mut samples);
        } else {
            run_probed(&mut p, &mut cpu, &mut samples);
            b.push(bare(me, iterations));
        }
        println!(
            "pair {:>2}: bare {:.4} s  memprobe {:.4} s",
            i + 1,
            b[i],
            p[i]
        );
    }
    let _ = std::fs::remove_file(json);
    let (mb, mp) = (median(&mut b.clone()), median(&mut p.clone()));
    let overhead = (mp / mb - 1.0) * 100.0;
    let mut ratios: Vec<f64> = p
        .iter()
        .zip(&b)
        .map(|(p, b)| (p / b - 1.0) * 100.0)
        .collect();
    println!();
    println!("median bare      {mb:.4} s");
    println!("median memprobe  {mp:.4} s");
    println!("overhead         {overhead:+.2} % of the medians (target <= 1 %)");
    println!("per-pair overhead: median {:+.2} %", median(&mut ratios));
    println!(
        "memprobe's own CPU: median {:.2} % of one core, {:.0} samples per run",
        median(&mut cpu),
        median(&mut samples)
    );
    println!(
        "machine: nproc {}, kernel {}, {}",
        sh("nproc"),
        sh("uname -r"),
        sh("date -u +%Y-%m-%dT%H:%MZ")
    );
}
