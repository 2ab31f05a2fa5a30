//! `gpu_exact_source` in a process that runs under the interposer: this test
//! binary runs itself again with `libmemprobe_interpose.so` preloaded and
//! the fake driver (tests/fake-gpu/fake_cuda.c) on the loader's path, and
//! checks windows over the source against spikes of microseconds.

use memprobe_core::{ErrorKind, PeakFidelity, SourceKind, Window};
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const CHILD: &str = "MEMPROBE_GPU_EXACT_TEST_CHILD";
const MIB: u64 = 1 << 20;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The interposer (copied aside) and a directory holding the fake driver.
fn staged() -> &'static (PathBuf, PathBuf) {
    static S: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    S.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("memprobe-gpu-exact-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-q", "-p", "memprobe-interpose-preload"])
            .current_dir(root())
            .status()
            .unwrap();
        assert!(st.success(), "cargo build -p memprobe-interpose-preload");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join("target"));
        let lib = dir.join("libmemprobe_interpose.so");
        std::fs::copy(target.join("debug/libmemprobe_interpose.so"), &lib).unwrap();
        let o = Command::new("cc")
            .args([
                "-shared",
                "-fPIC",
                "-O1",
                "-Wl,-soname,libcuda.so.1",
                "-Wl,-Bsymbolic",
            ])
            .arg(root().join("tests/fake-gpu/fake_cuda.c"))
            .arg("-o")
            .arg(dir.join("libcuda.so.1"))
            .arg("-lpthread")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        (lib, dir)
    })
}

fn run_child(test: &str, extra: &[(&str, &str)]) {
    let (lib, driver) = staged();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("LD_PRELOAD", lib)
        .env("LD_LIBRARY_PATH", driver)
        .env(
            "MEMPROBE_GPU_EXACT_DIR",
            driver.join(format!("regions-{test}")),
        )
        .env_remove("MEMPROBE_GPU_EXACT")
        .env(CHILD, test);
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

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> i32;
type Free = unsafe extern "C" fn(u64) -> i32;

/// The fake driver through dlopen + dlsym (answered with the interposer's
/// wrappers), device 0's primary context current.
fn driver() -> (Alloc, Free) {
    type Init = unsafe extern "C" fn(u32) -> i32;
    type Retain = unsafe extern "C" fn(*mut *mut c_void, i32) -> i32;
    type SetCurrent = unsafe extern "C" fn(*mut c_void) -> i32;
    // SAFETY: the fake driver's functions, with cuda.h's signatures.
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
        (
            std::mem::transmute::<*mut c_void, Alloc>(sym("cuMemAlloc_v2")),
            std::mem::transmute::<*mut c_void, Free>(sym("cuMemFree_v2")),
        )
    }
}

fn alloc(f: Alloc, bytes: u64) -> u64 {
    let mut p = 0;
    // SAFETY: the driver's cuMemAlloc_v2 through the interposer.
    assert_eq!(unsafe { f(&mut p, bytes as usize) }, 0);
    p
}

fn free(f: Free, p: u64) {
    // SAFETY: a pointer from `alloc`.
    assert_eq!(unsafe { f(p) }, 0);
}

/// An epoch window and a step window reset at every step: each spike of
/// microseconds is the step's exact peak, every time, and the epoch keeps
/// the largest; a second source's window is not disturbed by the resets.
#[test]
fn windows_over_the_exact_source_catch_every_spike() {
    if !in_child("windows_over_the_exact_source_catch_every_spike") {
        return run_child("windows_over_the_exact_source_catch_every_spike", &[]);
    }
    let (a, f) = driver();
    let src = memprobe_gpu::gpu_exact_source(0).unwrap();
    assert_eq!(src.info().name, "gpu_exact:0");
    assert_eq!(src.info().kind, SourceKind::GpuExact);
    assert_eq!(src.info().fidelity, PeakFidelity::Exact);
    let other = memprobe_gpu::gpu_exact_source(0).unwrap();
    let base = alloc(a, 4 * MIB);
    assert_eq!(src.read().unwrap().used, 4 * MIB);
    let epoch = Window::open(std::slice::from_ref(&src)).unwrap();
    let mut step = Window::open(std::slice::from_ref(&src)).unwrap();
    let untouched = Window::open(std::slice::from_ref(&other)).unwrap();
    for i in 1..=300u64 {
        let spike = i * 4096;
        let p = alloc(a, spike);
        free(f, p);
        let ended = step.reset().unwrap();
        assert_eq!(ended[0].peak, 4 * MIB + spike, "step {i}");
        assert_eq!(ended[0].delta_peaked, spike, "step {i}");
    }
    assert_eq!(epoch.peaks().unwrap(), vec![4 * MIB + 300 * 4096]);
    assert_eq!(untouched.peaks().unwrap(), vec![4 * MIB + 300 * 4096]);
    free(f, base);
    assert_eq!(src.read().unwrap().used, 0);
    // Device 1 is counted apart.
    let d1 = memprobe_gpu::gpu_exact_source(1).unwrap();
    assert_eq!(d1.read().unwrap().used, 0);
    let pinned = memprobe_gpu::gpu_exact_host_pinned_source().unwrap();
    assert_eq!(pinned.info().name, "gpu_exact:host_pinned");
}

/// Loaded but switched off: unavailable, saying so.
#[test]
fn switched_off_is_unavailable() {
    if !in_child("switched_off_is_unavailable") {
        return run_child(
            "switched_off_is_unavailable",
            &[("MEMPROBE_GPU_EXACT", "off")],
        );
    }
    let e = memprobe_gpu::gpu_exact_source(0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("MEMPROBE_GPU_EXACT=off"), "{e}");
}
