//! Reading the counters in the process that allocates: this test binary
//! runs itself again with the interposer preloaded (the child half of each
//! test), calls the fake driver, and checks its own counters.

mod common;

use common::*;
use memprobe_interpose_reader::{Counter, Error, Region};
use std::ffi::{c_void, CString};
use std::process::Command;

const CHILD: &str = "MEMPROBE_INTERPOSE_TEST_CHILD";
const MIB: u64 = 1 << 20;

type Init = unsafe extern "C" fn(u32) -> i32;
type Retain = unsafe extern "C" fn(*mut *mut c_void, i32) -> i32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> i32;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> i32;
type Free = unsafe extern "C" fn(u64) -> i32;

struct Driver {
    alloc: Alloc,
    free: Free,
}

/// The fake driver through dlopen + dlsym (the interposer's wrappers), with
/// device 0's primary context current on the calling thread.
fn driver() -> Driver {
    // SAFETY: loading the fake driver and looking up functions of known
    // signatures (cuda.h).
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null());
        let sym = |n: &str| {
            let c = CString::new(n).unwrap();
            let p = libc::dlsym(h, c.as_ptr());
            assert!(!p.is_null(), "{n}");
            p
        };
        let init: Init = std::mem::transmute(sym("cuInit"));
        let retain: Retain = std::mem::transmute(sym("cuDevicePrimaryCtxRetain"));
        let set: SetCurrent = std::mem::transmute(sym("cuCtxSetCurrent"));
        assert_eq!(init(0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set(ctx), 0);
        Driver {
            alloc: std::mem::transmute::<*mut c_void, Alloc>(sym("cuMemAlloc_v2")),
            free: std::mem::transmute::<*mut c_void, Free>(sym("cuMemFree_v2")),
        }
    }
}

impl Driver {
    fn alloc(&self, bytes: u64) -> u64 {
        let mut p = 0;
        // SAFETY: the fake's cuMemAlloc_v2 (through the wrapper).
        assert_eq!(unsafe { (self.alloc)(&mut p, bytes as usize) }, 0);
        p
    }

    fn free(&self, p: u64) {
        // SAFETY: a pointer from `alloc`.
        assert_eq!(unsafe { (self.free)(p) }, 0);
    }
}

/// Runs this test again in a child process with the interposer preloaded;
/// `extra` adds environment variables.
fn run_child(test: &str, extra: &[(&str, &str)]) {
    let regions = region_dir(&format!("in-process-{test}"));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    interposed(&mut cmd, &fake_driver(false), &regions);
    cmd.env(CHILD, test);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "child {test}: {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn in_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|v| v == test)
}

/// A mark inherited across fork is the parent's: the child dropping it
/// leaves the parent's slot claimed and folding.
#[test]
fn a_forked_child_dropping_an_inherited_mark_leaves_the_parents_slot() {
    const NAME: &str = "a_forked_child_dropping_an_inherited_mark_leaves_the_parents_slot";
    if !in_child(NAME) {
        return run_child(NAME, &[]);
    }
    let d = driver();
    let region = Region::in_process().expect("the interposer is preloaded");
    let d0 = Counter::Device(0);
    let mark = region.mark().unwrap();
    let p = d.alloc(3 * MIB);
    d.free(p);
    // SAFETY: the child only drops the mark (atomics, getpid) and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let inherited = mark.inherited();
        drop(mark);
        // SAFETY: ending the forked child at once.
        unsafe { libc::_exit(if inherited { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    assert!(!mark.inherited());
    let bit = 1u32 << mark.slot();
    let header = &region.layout().header;
    assert_ne!(
        header.claimed.load(std::sync::atomic::Ordering::SeqCst) & bit,
        0
    );
    assert_ne!(
        header.active.load(std::sync::atomic::Ordering::SeqCst) & bit,
        0
    );
    assert_eq!(mark.take(d0), 3 * MIB);
    let p = d.alloc(4 * MIB);
    d.free(p);
    assert_eq!(mark.take(d0), 4 * MIB);
}

/// Nested and concurrent windows over one process's counters: an outer
/// mark per "epoch", an inner mark per "step"; every step's spike of a few
/// microseconds is caught exactly by the inner mark, every time, and the
/// outer mark holds the largest.
#[test]
fn nested_marks_catch_every_spike_in_process() {
    if !in_child("nested_marks_catch_every_spike_in_process") {
        return run_child("nested_marks_catch_every_spike_in_process", &[]);
    }
    let d = driver();
    let region = Region::in_process().expect("the interposer is preloaded");
    assert!(region.counting() && region.shared() && region.alive());
    assert_eq!(region.pid(), std::process::id());
    let d0 = Counter::Device(0);
    let base = d.alloc(5 * MIB);
    let epoch = region.mark().unwrap();
    for e in 0..5u64 {
        let step = region.mark().unwrap();
        for s in 1..=200u64 {
            let spike = s * 4096 + e;
            let p = d.alloc(spike);
            d.free(p);
            assert_eq!(step.take(d0), 5 * MIB + spike, "epoch {e} step {s}");
        }
        assert_eq!(epoch.take(d0), 5 * MIB + 200 * 4096 + e, "epoch {e}");
    }
    // The same counters through the region file, as another process sees them.
    let outside = Region::open_path(&memprobe_interpose_reader::region_path(
        &memprobe_interpose_reader::default_dir(),
        std::process::id(),
    ))
    .unwrap();
    assert_eq!(outside.current(d0), 5 * MIB);
    assert_eq!(outside.read(d0).lifetime_peak, 5 * MIB + 200 * 4096 + 4);
    d.free(base);
    assert_eq!(region.current(d0), 0);
    assert_eq!(epoch.peak(d0), 5 * MIB);
}

/// Readers on other threads claim and reset their own marks while eight
/// threads allocate: no reader disturbs another, and the counts stay exact.
#[test]
fn concurrent_readers_and_allocating_threads() {
    if !in_child("concurrent_readers_and_allocating_threads") {
        return run_child("concurrent_readers_and_allocating_threads", &[]);
    }
    let region = Region::in_process().unwrap();
    let d0 = Counter::Device(0);
    let whole = region.mark().unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            s.spawn(move || {
                let d = driver();
                for i in 0..2000u64 {
                    let p = d.alloc(4096 + t * 100 + i % 7);
                    d.free(p);
                }
            });
        }
        for _ in 0..2 {
            let region = region.clone();
            s.spawn(move || {
                for _ in 0..200 {
                    let m = region.mark().unwrap();
                    let peak = m.take(Counter::Device(0));
                    assert!(peak <= 8 * (4096 + 700 + 6));
                }
            });
        }
    });
    assert_eq!(region.current(d0), 0);
    let peak = whole.peak(d0);
    assert!((4096..=8 * (4096 + 706)).contains(&peak), "{peak}");
    assert_eq!(region.read(d0).lifetime_peak, peak);
}

#[test]
fn switched_off_the_reader_says_so() {
    if !in_child("switched_off_the_reader_says_so") {
        return run_child(
            "switched_off_the_reader_says_so",
            &[("MEMPROBE_GPU_EXACT", "off")],
        );
    }
    let d = driver();
    let p = d.alloc(MIB);
    d.free(p);
    match Region::in_process() {
        Err(Error::Disabled) => {}
        other => panic!("{other:?}"),
    }
}

type Claim = unsafe extern "C" fn() -> i32;
type Release = unsafe extern "C" fn(i32);
type Take = unsafe extern "C" fn(i32, i32) -> u64;
type Current = unsafe extern "C" fn(i32) -> u64;

/// The interposer's own C entry points for readers without the Rust crate
/// (Python's ctypes in scripts/gpu-validate-interpose.py), with bad
/// arguments too.
#[test]
fn c_entry_points_for_readers_in_other_languages() {
    if !in_child("c_entry_points_for_readers_in_other_languages") {
        return run_child("c_entry_points_for_readers_in_other_languages", &[]);
    }
    let d = driver();
    // SAFETY: the interposer's exports, with their documented signatures.
    unsafe {
        let claim =
            std::mem::transmute::<*mut c_void, Claim>(sym_default("memprobe_interpose_mark_claim"));
        let release = std::mem::transmute::<*mut c_void, Release>(sym_default(
            "memprobe_interpose_mark_release",
        ));
        let take =
            std::mem::transmute::<*mut c_void, Take>(sym_default("memprobe_interpose_mark_take"));
        let current =
            std::mem::transmute::<*mut c_void, Current>(sym_default("memprobe_interpose_current"));
        let slot = claim();
        assert!(slot >= 0);
        let base = d.alloc(MIB);
        for i in 1..=100u64 {
            let p = d.alloc(i * 512);
            d.free(p);
            assert_eq!(take(slot, 0), MIB + i * 512);
        }
        assert_eq!(current(0), MIB);
        assert_eq!(current(64), 0);
        for bad in [-1, 65, 1000, i32::MIN] {
            assert_eq!(current(bad), 0);
            assert_eq!(take(slot, bad), 0);
            assert_eq!(take(bad, 0), 0);
            release(bad);
        }
        release(slot);
        let mut slots: Vec<i32> = (0..32).map(|_| claim()).collect();
        assert!(slots.iter().all(|&s| s >= 0));
        assert_eq!(claim(), -1, "all 32 slots held");
        release(slots.pop().unwrap());
        assert!(claim() >= 0);
        d.free(base);
    }
}

fn sym_default(name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: a lookup in the global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    assert!(!p.is_null(), "{name}");
    p
}
