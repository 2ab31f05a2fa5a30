//! What the interposer adds to an allocate + free pair: `cuMemAlloc_v2` +
//! `cuMemFree_v2` of the fake driver through the interposer's wrappers
//! (found with `dlsym`, as a program finds them), against the fake's own
//! functions called directly in the same loop, from 1 and 8 threads.
//!
//! `cargo bench -p memprobe-interpose-reader --bench interpose_overhead`. The bench
//! builds the interposer (release) and the fake driver, then runs itself
//! again with the interposer preloaded. Cases are interleaved round by round
//! so machine noise hits them alike; each figure is the median over rounds
//! of the mean time per pair in a round (per thread: wall time / pairs each
//! thread made).
//!
//! The preloaded child runs twice, interleaved with nothing else: once with
//! `MEMPROBE_GPU_ORIGINS=off` (counting only) and once naming each
//! allocation's origin (the default); the last lines compare the two, and
//! time apart the first allocation from a call site never seen before (the
//! stack walk, `dladdr` and the table insert of a new site). A third run
//! keeps call paths too (`MEMPROBE_GPU_ORIGINS=stacks:8`): a stack walk on
//! every allocation; its first pair from a new path is timed apart the
//! same way (eight `dladdr` and the names claimed).

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const ROUNDS: usize = 31;
const PAIRS: usize = 20_000;
const CHILD: &str = "MEMPROBE_INTERPOSE_BENCH_CHILD";

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> i32;
type Free = unsafe extern "C" fn(u64) -> i32;
type Init = unsafe extern "C" fn(u32) -> i32;
type Retain = unsafe extern "C" fn(*mut *mut c_void, i32) -> i32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> i32;
type Function = unsafe extern "C" fn(*const i8) -> *mut c_void;

#[derive(Clone, Copy)]
struct Pair {
    alloc: Alloc,
    free: Free,
}

struct Fake {
    wrapped: Pair,
    direct: Pair,
    retain: Retain,
    set: SetCurrent,
}

fn sym(h: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: a lookup in a library handle.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "missing {name}");
    p
}

fn load() -> Fake {
    // SAFETY: the fake driver's functions, with cuda.h's signatures.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null());
        let init: Init = std::mem::transmute::<*mut c_void, Init>(sym(h, "cuInit"));
        assert_eq!(init(0), 0);
        let function = std::mem::transmute::<*mut c_void, Function>(sym(h, "fake_cuda_function"));
        let direct = |n: &str| {
            let c = CString::new(n).unwrap();
            let p = function(c.as_ptr());
            assert!(!p.is_null());
            p
        };
        Fake {
            wrapped: Pair {
                alloc: std::mem::transmute::<*mut c_void, Alloc>(sym(h, "cuMemAlloc_v2")),
                free: std::mem::transmute::<*mut c_void, Free>(sym(h, "cuMemFree_v2")),
            },
            direct: Pair {
                alloc: std::mem::transmute::<*mut c_void, Alloc>(direct("cuMemAlloc_v2")),
                free: std::mem::transmute::<*mut c_void, Free>(direct("cuMemFree_v2")),
            },
            retain: std::mem::transmute::<*mut c_void, Retain>(sym(h, "cuDevicePrimaryCtxRetain")),
            set: std::mem::transmute::<*mut c_void, SetCurrent>(sym(h, "cuCtxSetCurrent")),
        }
    }
}

/// Nanoseconds per pair on each of `threads` threads (wall time / pairs).
fn measure(f: &Fake, pair: Pair, threads: usize) -> f64 {
    let (retain, set) = (f.retain, f.set);
    let barrier = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let barrier = &barrier;
            s.spawn(move || {
                let mut ctx = std::ptr::null_mut();
                // SAFETY: the fake's context calls.
                unsafe {
                    assert_eq!(retain(&mut ctx, 0), 0);
                    assert_eq!(set(ctx), 0);
                }
                barrier.wait();
                for i in 0..PAIRS {
                    let mut p = 0;
                    // SAFETY: allocate, then free what was allocated.
                    unsafe {
                        assert_eq!((pair.alloc)(&mut p, 4096 + (i & 7) * 256 + t), 0);
                        assert_eq!((pair.free)(p), 0);
                    }
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed().as_nanos() as f64 / PAIRS as f64
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// One alloc+free pair from a call site of its own: each instance of the
/// macro is a separate function, so its return address is new to the
/// interposer the first time it runs. Returns the time of the pair in ns.
macro_rules! sites {
    ($($name:ident $k:literal),*) => {
        $(
            // Each asks for a size of its own, so no two bodies are alike
            // (identical functions may be merged into one address).
            #[inline(never)]
            fn $name(pair: Pair) -> f64 {
                let mut p = 0;
                let start = Instant::now();
                // SAFETY: allocate, then free what was allocated.
                unsafe {
                    assert_eq!((pair.alloc)(&mut p, 4096 + $k), 0);
                    assert_eq!((pair.free)(p), 0);
                }
                start.elapsed().as_nanos() as f64
            }
        )*
        const SITES: &[fn(Pair) -> f64] = &[$($name),*];
    };
}
sites!(
    s0 0, s1 1, s2 2, s3 3, s4 4, s5 5, s6 6, s7 7, s8 8, s9 9, s10 10, s11 11, s12 12, s13 13, s14 14,
    s15 15
);

/// The first pair from each new site, then the second from the same one.
fn new_sites(f: &Fake) {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the fake's context calls.
    unsafe {
        assert_eq!((f.retain)(&mut ctx, 0), 0);
        assert_eq!((f.set)(ctx), 0);
    }
    let (mut first, mut again) = (Vec::new(), Vec::new());
    for site in SITES {
        let site = std::hint::black_box(site);
        first.push(site(f.wrapped));
        again.push(site(f.wrapped));
    }
    println!(
        "RESULT new-site first={:.1} again={:.1}",
        median(&mut first),
        median(&mut again)
    );
}

fn child() {
    let f = load();
    assert!(
        f.wrapped.alloc as usize != f.direct.alloc as usize,
        "the interposer is not preloaded"
    );
    for threads in [1usize, 8] {
        let (mut direct, mut wrapped) = (Vec::new(), Vec::new());
        measure(&f, f.direct, threads);
        measure(&f, f.wrapped, threads);
        for _ in 0..ROUNDS {
            direct.push(measure(&f, f.direct, threads));
            wrapped.push(measure(&f, f.wrapped, threads));
        }
        let (d, w) = (median(&mut direct), median(&mut wrapped));
        println!("RESULT threads={threads} direct={d:.1} wrapped={w:.1}");
        println!(
            "{threads} thread(s): fake driver directly {d:8.1} ns/pair | through the interposer {w:8.1} ns/pair | added {:6.1} ns/pair | ratio {:.2}",
            w - d,
            w / d
        );
        // More threads than CPUs: wall time per pair counts the waits for a
        // CPU too; CPU time per pair (wall x CPUs / threads) does not.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if threads > cpus {
            let k = cpus as f64 / threads as f64;
            println!(
                "{threads} thread(s) on {cpus} CPUs, CPU time: directly {:8.1} ns/pair | through the interposer {:8.1} ns/pair | added {:6.1} ns/pair",
                d * k,
                w * k,
                (w - d) * k
            );
        }
    }
    new_sites(&f);
}

fn cc(out: &Path, src: &Path) {
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-Wl,-soname,libcuda.so.1",
            "-Wl,-Bsymbolic",
            "-o",
        ])
        .arg(out)
        .arg(src)
        .arg("-lpthread")
        .status()
        .expect("cc");
    assert!(st.success());
}

fn main() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    // The workspace root (this crate is memprobe-interpose/reader).
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or(root.join("target"));
    let st = Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args([
            "build",
            "-q",
            "--release",
            "-p",
            "memprobe-interpose-preload",
        ])
        .current_dir(&root)
        .status()
        .expect("cargo build");
    assert!(st.success());
    let dir = target.join("memprobe-interpose-bench");
    std::fs::create_dir_all(&dir).unwrap();
    cc(
        &dir.join("libcuda.so.1"),
        &root.join("tests/fake-gpu/fake_cuda.c"),
    );
    let regions = dir.join("regions");
    println!(
        "interposer overhead on the fake driver ({} CPUs, {ROUNDS} rounds of {PAIRS} pairs per thread)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut results = Vec::new();
    for (label, origins) in [
        ("without origins", "off"),
        ("with origins", "on"),
        ("with stacks", "stacks:8"),
    ] {
        println!("-- {label} (MEMPROBE_GPU_ORIGINS={origins})");
        let out = Command::new(std::env::current_exe().unwrap())
            .env(CHILD, "1")
            .env(
                "LD_PRELOAD",
                target.join("release/libmemprobe_interpose.so"),
            )
            .env("LD_LIBRARY_PATH", &dir)
            .env("MEMPROBE_GPU_EXACT_DIR", &regions)
            .env("MEMPROBE_GPU_ORIGINS", origins)
            .env_remove("MEMPROBE_GPU_EXACT")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        for line in text.lines() {
            match line.strip_prefix("RESULT ") {
                Some(r) => results.push((label, r.to_owned())),
                None => println!("{line}"),
            }
        }
    }
    let value = |label: &str, key: &str, field: &str| -> f64 {
        results
            .iter()
            .filter(|(l, r)| *l == label && r.starts_with(key))
            .flat_map(|(_, r)| r.split(' '))
            .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    println!("-- origins, same run");
    for threads in ["threads=1", "threads=8"] {
        let (off, on, stacks) = (
            value("without origins", threads, "wrapped"),
            value("with origins", threads, "wrapped"),
            value("with stacks", threads, "wrapped"),
        );
        println!(
            "{threads}: alloc+free through the interposer without origins {off:8.1} ns/pair | with origins {on:8.1} ns/pair | ratio {:.2} (goal <= 1.5) | with stacks:8 {stacks:8.1} ns/pair | ratio {:.2}",
            on / off,
            stacks / off
        );
    }
    println!(
        "first alloc+free from a new call site: {:.0} ns with origins ({:.0} ns its second call), {:.0} ns without",
        value("with origins", "new-site", "first"),
        value("with origins", "new-site", "again"),
        value("without origins", "new-site", "first"),
    );
    println!(
        "first alloc+free from a new call path, stacks:8: {:.0} ns ({:.0} ns its second call)",
        value("with stacks", "new-site", "first"),
        value("with stacks", "new-site", "again"),
    );
    let _ = memprobe_interpose_reader::reclaim_dead(&regions);
}
