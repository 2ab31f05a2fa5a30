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
    let st = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, "1")
        .env(
            "LD_PRELOAD",
            target.join("release/libmemprobe_interpose.so"),
        )
        .env("LD_LIBRARY_PATH", &dir)
        .env("MEMPROBE_GPU_EXACT_DIR", &regions)
        .env_remove("MEMPROBE_GPU_EXACT")
        .status()
        .unwrap();
    assert!(st.success());
    let _ = memprobe_interpose_reader::reclaim_dead(&regions);
}
