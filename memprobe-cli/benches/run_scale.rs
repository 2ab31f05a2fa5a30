//! The cost of `memprobe run` itself as its tree grows: memprobe's own CPU
//! per second of wall time with 1, 16, 64 and 256 sleeping processes at
//! `--interval 10ms`, beside the floor: a loop in this process that wakes on
//! the same 10 ms grid and reads each of the same processes' `statm` through
//! a descriptor kept open (one `pread` each), and nothing else.
//!
//! ```text
//! cargo bench -j2 -p memprobe-cli --bench run_scale
//! ```
//!
//! Per process per sample, memprobe's cost is the slope of its CPU between
//! 1 process and N (what one more process costs at every tick), divided by
//! the same slope of the bare loop: the ratio to the floor. Medians over
//! `MEMPROBE_BENCH_REPEATS` (default 3) runs of `MEMPROBE_BENCH_SECONDS`
//! (default 5) each; `MEMPROBE_BENCH_SIZES` (default `1,16,64,256`) and
//! `MEMPROBE_BENCH_INTERVAL_MS` (default 10) change the run. The sleepers
//! are this very binary, re-executed with `MEMPROBE_BENCH_SLEEPERS=N:S`.
//! `MEMPROBE_BENCH_BASELINE=PATH` also measures another `memprobe` binary
//! (an older build) in the same run, for a before/after under one load.
//!
//! Then the cost of keeping each peak's memory by kind (`host_kinds.rs`):
//! 16 processes whose peaks rise for 10 s (each touches 128 KiB more every
//! 25 ms: every few ticks a new peak of every process), `memprobe run` with
//! and without `--no-host-kinds`, alternately, medians of the same
//! repeats; the goal is at most 0.2 % of a core more.
//! `MEMPROBE_BENCH_KINDS=N:S` changes the size and length (`0:0`: skip);
//! with `MEMPROBE_BENCH_BASELINE`, that binary's pair is measured in each
//! repeat too.
//!
//! Last, busy processes: 64 (`MEMPROBE_BENCH_BUSY=N:S`, default `64:5`;
//! `0:0`: skip) each mapping and touching 128 KiB plus 0 to 7 pages in
//! turn, holding it 7 ms and unmapping it, so that `statm` moves at most
//! ticks while no peak rises after the first eight: memprobe's CPU
//! beside the floor's over the same processes (and the baseline's).
#[path = "support/median.rs"]
mod median;

use median::median;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SLEEPERS_ENV: &str = "MEMPROBE_BENCH_SLEEPERS";
const GROWERS_ENV: &str = "MEMPROBE_BENCH_GROWERS";
const BUSY_ENV: &str = "MEMPROBE_BENCH_BUSY_CHILD";
/// How long each busy process holds a mapping before it maps another.
const BUSY_EVERY: Duration = Duration::from_millis(7);
/// What each grower adds, and how often.
const GROW_STEP: usize = 128 << 10;
const GROW_EVERY: Duration = Duration::from_millis(25);

/// Child mode: this process and `n - 1` forked children each grow by
/// [`GROW_STEP`] every [`GROW_EVERY`] for `secs` (their peaks keep rising);
/// with `busy`, each maps and touches it plus 0 to 7 pages, in turn, holds
/// it [`BUSY_EVERY`] and unmaps it (`statm` moves at most ticks, the peak
/// stops rising after the first eight).
fn growers(n: usize, secs: f64, busy: bool) {
    let grow = || {
        let start = Instant::now();
        let mut round = 0usize;
        while start.elapsed().as_secs_f64() < secs {
            let len = if busy {
                round += 1;
                GROW_STEP + (round % 8) * 4096
            } else {
                GROW_STEP
            };
            // SAFETY: a fresh anonymous mapping, touched page by page and
            // kept to the end (busy: unmapped once held).
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if p != libc::MAP_FAILED {
                    for off in (0..len).step_by(4096) {
                        p.cast::<u8>().add(off).write_volatile(1);
                    }
                    if busy {
                        std::thread::sleep(BUSY_EVERY);
                        libc::munmap(p, len);
                    }
                }
            }
            if !busy {
                std::thread::sleep(GROW_EVERY);
            }
        }
    };
    let mut pids = Vec::new();
    for _ in 1..n {
        // SAFETY: the child only maps, touches, sleeps and exits.
        match unsafe { libc::fork() } {
            0 => {
                grow();
                // SAFETY: ends the forked child without the parent's handlers.
                unsafe { libc::_exit(0) };
            }
            pid if pid > 0 => pids.push(pid),
            _ => panic!("fork: {}", std::io::Error::last_os_error()),
        }
    }
    grow();
    for pid in pids {
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
}

/// Child mode: this process and `n - 1` forked children sleep `secs`.
fn sleepers(n: usize, secs: f64) {
    let mut pids = Vec::new();
    for _ in 1..n {
        // SAFETY: the child only sleeps and exits (no allocation, no locks).
        match unsafe { libc::fork() } {
            0 => {
                std::thread::sleep(Duration::from_secs_f64(secs));
                // SAFETY: ends the forked child without running the parent's
                // exit handlers.
                unsafe { libc::_exit(0) };
            }
            pid if pid > 0 => pids.push(pid),
            _ => panic!("fork: {}", std::io::Error::last_os_error()),
        }
    }
    std::thread::sleep(Duration::from_secs_f64(secs));
    for pid in pids {
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
}

/// CPU time (user + system) of `who` (`RUSAGE_SELF`, `RUSAGE_THREAD`).
fn cpu_s(who: libc::c_int) -> f64 {
    // SAFETY: rusage is plain data written by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer.
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One measured run: CPU per second of wall time, ticks taken and missed.
struct Run {
    cpu_per_wall: f64,
    samples: f64,
    missed: f64,
}

/// `memprobe run` over `n` sleepers.
fn probed(memprobe: &str, me: &str, n: usize, secs: f64, interval_ms: u64, json: &str) -> Run {
    probed_with(
        memprobe,
        me,
        (SLEEPERS_ENV, n, secs),
        &[],
        interval_ms,
        json,
    )
}

/// `memprobe run` with `opts` over `n` processes of child mode `mode`.
fn probed_with(
    memprobe: &str,
    me: &str,
    (mode, n, secs): (&str, usize, f64),
    opts: &[&str],
    interval_ms: u64,
    json: &str,
) -> Run {
    let interval = format!("{interval_ms}ms");
    let mut args = vec!["run", "--no-live", "--interval", &interval, "--json", json];
    args.extend_from_slice(opts);
    args.extend(["--", me]);
    let st = Command::new(memprobe)
        .args(&args)
        .env(mode, format!("{n}:{secs}"))
        .stderr(Stdio::null())
        .status()
        .expect("run memprobe");
    assert!(st.success());
    let text = std::fs::read_to_string(json).expect("memprobe's JSON");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let f = |k: &str| doc[k].as_f64().unwrap_or_else(|| panic!("{k}"));
    assert!(
        doc["tree"]["max_processes"].as_u64() == Some(n as u64),
        "memprobe saw {} processes, not {n}",
        doc["tree"]["max_processes"]
    );
    Run {
        cpu_per_wall: f("memprobe_cpu_s") / f("duration_s"),
        samples: f("samples"),
        missed: f("missed_ticks"),
    }
}

/// The floor: `n` sleepers' `statm` read on the same grid, for `secs`.
fn bare(me: &str, n: usize, secs: f64, interval_ms: u64) -> Run {
    bare_of(me, SLEEPERS_ENV, n, secs, interval_ms)
}

/// The floor over `n` processes of child mode `mode`.
fn bare_of(me: &str, mode: &str, n: usize, secs: f64, interval_ms: u64) -> Run {
    // The processes outlive the loop: a little margin.
    let mut tree = Command::new(me)
        .env(mode, format!("{n}:{}", secs + 1.0))
        .spawn()
        .expect("start the sleepers");
    let root = tree.id();
    // Wait until all n exist (the children file lists the forked ones).
    let children = format!("/proc/{root}/task/{root}/children");
    let t = Instant::now();
    let pids = loop {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        let mut pids: Vec<u32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.len() + 1 >= n {
            pids.push(root);
            break pids;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "sleepers did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let files: Vec<File> = pids
        .iter()
        .map(|p| File::open(format!("/proc/{p}/statm")).expect("statm"))
        .collect();
    let interval = Duration::from_millis(interval_ms);
    let mut buf = [0u8; 128];
    let mut sink = 0u64;
    let (mut samples, mut missed) = (0u64, 0u64);
    let start = Instant::now();
    let cpu0 = cpu_s(libc::RUSAGE_THREAD);
    let mut deadline = start;
    while start.elapsed().as_secs_f64() < secs {
        for f in &files {
            let len = f.read_at(&mut buf, 0).expect("pread statm");
            // The resident set: the second field.
            let rss = buf[..len]
                .split(|&c| c == b' ')
                .nth(1)
                .and_then(|s| std::str::from_utf8(s).ok()?.parse::<u64>().ok())
                .expect("statm's resident field");
            sink = sink.wrapping_add(rss);
        }
        samples += 1;
        deadline += interval;
        let now = Instant::now();
        if deadline <= now {
            let skip = now.duration_since(deadline).as_nanos() / interval.as_nanos() + 1;
            missed += skip as u64;
            deadline += interval * skip as u32;
        }
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
    }
    let cpu = cpu_s(libc::RUSAGE_THREAD) - cpu0;
    let wall = start.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    let _ = tree.kill();
    let _ = tree.wait();
    Run {
        cpu_per_wall: cpu / wall,
        samples: samples as f64,
        missed: missed as f64,
    }
}

/// Busy processes, whose `statm` moves at most ticks: memprobe's CPU
/// beside the floor over the same processes, and the baseline's.
/// `MEMPROBE_BENCH_BUSY=N:S` (default `64:5`; `0:0`: skip).
fn busy(
    memprobe: &str,
    baseline: Option<&str>,
    me: &str,
    repeats: usize,
    interval_ms: u64,
    json: &str,
) {
    let (n, secs) = count_and_seconds("MEMPROBE_BENCH_BUSY", (64, 5.0));
    if n == 0 {
        return;
    }
    let (mut run, mut floor, mut base) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..repeats {
        run.push(probed_with(
            memprobe,
            me,
            (BUSY_ENV, n, secs),
            &[],
            interval_ms,
            json,
        ));
        floor.push(bare_of(me, BUSY_ENV, n, secs, interval_ms));
        if let Some(b) = baseline {
            base.push(probed_with(
                b,
                me,
                (BUSY_ENV, n, secs),
                &[],
                interval_ms,
                json,
            ));
        }
    }
    let _ = std::fs::remove_file(json);
    let m = |v: &[Run]| median(&mut v.iter().map(|r| r.cpu_per_wall).collect::<Vec<_>>());
    let (r, f) = (m(&run), m(&floor));
    print!(
        "\nbusy: {n} processes holding 128 to 156 KiB mapped and touched 7 ms each, medians of \
         {repeats}: memprobe {:.2} %, bare statm {:.2} %, ratio {:.2}",
        r * 100.0,
        f * 100.0,
        r / f
    );
    if !base.is_empty() {
        let b = m(&base);
        print!("; baseline {:.2} %, ratio {:.2}", b * 100.0, b / f);
    }
    println!();
}

fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `name` as `N:SECONDS`, else `default`.
fn count_and_seconds(name: &str, default: (usize, f64)) -> (usize, f64) {
    std::env::var(name)
        .ok()
        .and_then(|v| {
            let (n, s) = v.split_once(':')?;
            Some((n.parse().ok()?, s.parse().ok()?))
        })
        .unwrap_or(default)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if let Ok(spec) = std::env::var(SLEEPERS_ENV) {
        let (n, secs) = spec.split_once(':').expect("N:SECONDS");
        sleepers(n.parse().expect("N"), secs.parse().expect("seconds"));
        return;
    }
    for (env, busy) in [(GROWERS_ENV, false), (BUSY_ENV, true)] {
        if let Ok(spec) = std::env::var(env) {
            let (n, secs) = spec.split_once(':').expect("N:SECONDS");
            growers(n.parse().expect("N"), secs.parse().expect("seconds"), busy);
            return;
        }
    }
    // `cargo bench` passes --bench; a test run (`cargo test --benches`)
    // does not: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let memprobe = env!("CARGO_BIN_EXE_memprobe");
    let me_path = std::env::current_exe().expect("current_exe");
    let me = me_path.to_str().expect("a UTF-8 path");
    let repeats: usize = env_or("MEMPROBE_BENCH_REPEATS", 3);
    let secs: f64 = env_or("MEMPROBE_BENCH_SECONDS", 5.0);
    let interval_ms: u64 = env_or("MEMPROBE_BENCH_INTERVAL_MS", 10);
    let sizes: Vec<usize> = std::env::var("MEMPROBE_BENCH_SIZES")
        .unwrap_or_else(|_| "1,16,64,256".into())
        .split(',')
        .map(|s| s.trim().parse().expect("a size"))
        .collect();
    let baseline = std::env::var("MEMPROBE_BENCH_BASELINE").ok();
    let json = std::env::temp_dir().join(format!("memprobe-scale-{}.json", std::process::id()));
    let json = json.to_str().expect("a UTF-8 path");
    println!(
        "memprobe run's own CPU: {repeats} runs of {secs} s per size, --interval {interval_ms}ms, \
         sleeping processes; medians"
    );
    // Warm-up (page cache, CPU frequency), not counted.
    probed(memprobe, me, 1, 1.0, interval_ms, json);
    let mut rows = Vec::new();
    for &n in &sizes {
        let mut run = Vec::new();
        let mut floor = Vec::new();
        let mut base = Vec::new();
        // Alternate which goes first, so that a load drift hits both.
        for i in 0..repeats {
            if i % 2 == 0 {
                run.push(probed(memprobe, me, n, secs, interval_ms, json));
                floor.push(bare(me, n, secs, interval_ms));
            } else {
                floor.push(bare(me, n, secs, interval_ms));
                run.push(probed(memprobe, me, n, secs, interval_ms, json));
            }
            if let Some(b) = &baseline {
                base.push(probed(b, me, n, secs, interval_ms, json));
            }
        }
        let m = |v: &[Run], f: fn(&Run) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
        rows.push((
            n,
            m(&run, |r| r.cpu_per_wall),
            m(&floor, |r| r.cpu_per_wall),
            m(&run, |r| r.samples),
            m(&run, |r| r.missed),
            m(&floor, |r| r.missed),
            (!base.is_empty()).then(|| (m(&base, |r| r.cpu_per_wall), m(&base, |r| r.missed))),
        ));
    }
    let _ = std::fs::remove_file(json);
    println!();
    println!(
        "processes  memprobe CPU  bare statm CPU  ratio  samples  missed (memprobe, bare)  \
         memprobe us/process/sample"
    );
    for &(n, run, floor, samples, missed, floor_missed, _) in &rows {
        println!(
            "{n:>9}  {:>10.2} %  {:>12.2} %  {:>5.1}  {samples:>7.0}  {missed:>6.0}, {floor_missed:<6.0}           {:>8.2}",
            run * 100.0,
            floor * 100.0,
            run / floor,
            run / (samples / secs) / n as f64 * 1e6
        );
    }
    // Per process per sample: the slope from the smallest size to each.
    if let Some(&(n0, run0, floor0, .., base0)) = rows.first() {
        println!();
        println!("per process per sample, above {n0} process(es) (slope of CPU over processes):");
        let ticks_per_s = 1000.0 / interval_ms as f64;
        for &(n, run, floor, .., base) in rows.iter().skip(1) {
            let per = |cpu: f64, cpu0: f64| (cpu - cpu0) / (n - n0) as f64 / ticks_per_s * 1e6;
            let (r, f) = (per(run, run0), per(floor, floor0));
            print!(
                "{n:>9}: memprobe {r:.2} us, bare statm {f:.2} us, ratio {:.2} (goal <= 1.5)",
                r / f
            );
            if let (Some((b, bm)), Some((b0, _))) = (base, base0) {
                let pb = per(b, b0);
                print!(
                    "; baseline {pb:.2} us, ratio {:.2}, CPU {:.2} %, missed {bm:.0}",
                    pb / f,
                    b * 100.0
                );
            }
            println!();
        }
    }
    let (kn, ks) = count_and_seconds("MEMPROBE_BENCH_KINDS", (16, 10.0));
    if kn > 0 {
        let builds: Vec<(&str, &str)> = std::iter::once(("memprobe", memprobe))
            .chain(baseline.as_deref().map(|b| ("baseline", b)))
            .collect();
        // Per build: (with, without) runs.
        let mut runs: Vec<(Vec<Run>, Vec<Run>)> =
            builds.iter().map(|_| Default::default()).collect();
        for i in 0..repeats {
            for (&(_, bin), (with, without)) in builds.iter().zip(runs.iter_mut()) {
                let one = |opts: &[&str]| {
                    probed_with(bin, me, (GROWERS_ENV, kn, ks), opts, interval_ms, json)
                };
                if i % 2 == 0 {
                    with.push(one(&[]));
                    without.push(one(&["--no-host-kinds"]));
                } else {
                    without.push(one(&["--no-host-kinds"]));
                    with.push(one(&[]));
                }
            }
        }
        let _ = std::fs::remove_file(json);
        let m = |v: &[Run]| median(&mut v.iter().map(|r| r.cpu_per_wall).collect::<Vec<_>>());
        println!();
        println!(
            "host kinds: {kn} processes whose peaks rise for {ks} s, --interval {interval_ms}ms, \
             medians of {repeats}"
        );
        for (&(name, _), (with, without)) in builds.iter().zip(&runs) {
            let (w, wo) = (m(with), m(without));
            println!(
                "  {name}: CPU with kinds {:.2} %, without (--no-host-kinds) {:.2} %: \
                 {:+.3} % of a core (goal <= 0.2); each run's pair: {}",
                w * 100.0,
                wo * 100.0,
                (w - wo) * 100.0,
                with.iter()
                    .zip(without)
                    .map(|(a, b)| format!("{:+.3}", (a.cpu_per_wall - b.cpu_per_wall) * 100.0))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
    busy(
        memprobe,
        baseline.as_deref(),
        me,
        repeats,
        interval_ms,
        json,
    );
    println!(
        "machine: nproc {}, kernel {}, {}",
        sh("nproc"),
        sh("uname -r"),
        sh("date -u +%Y-%m-%dT%H:%MZ")
    );
}
