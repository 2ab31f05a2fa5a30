//! A GPU memory read through memprobe vs a direct call into the same (fake)
//! NVML library: `dlopen` + `nvmlDeviceGetMemoryInfo_v2` by hand.
//!
//! Run: `cargo bench -p memprobe-gpu --bench gpu_read`
//!
//! Each round times a batch of calls of each kind (the order alternates
//! between rounds); the figures are medians over the rounds, in nanoseconds
//! per call. Two fakes: a bare one (the call costs a mutex and a few loads,
//! the worst case for relative overhead) and one that busy-waits 2 µs per
//! query, closer to a real driver query (an ioctl into the kernel module).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/interleaved.rs"]
mod interleaved;

use common::Fake;
use interleaved::per_call;
use memprobe_gpu::{gpu_mem_get_used_fast, Gpus};
use std::hint::black_box;
use std::os::raw::{c_uint, c_ulonglong};

#[repr(C)]
struct Memory2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

type Device = *mut std::ffi::c_void;

const ROUNDS: usize = 301;

fn run(label: &str, script: &str, batch: usize) {
    let fake = Fake::nvml(script);
    let gpus = Gpus::open(fake.nvml_config()).expect("opening the fake NVML");
    let handle = gpus.device(0).unwrap();

    // SAFETY: the fake library's functions have NVML's C signatures; loading
    // the same path returns the instance memprobe already loaded.
    let (lib, get_memory, device) = unsafe {
        let lib = libloading::Library::new(&fake.lib).unwrap();
        let init: libloading::Symbol<unsafe extern "C" fn() -> c_uint> =
            lib.get(b"nvmlInit_v2").unwrap();
        assert_eq!(init(), 0);
        let by_index: libloading::Symbol<unsafe extern "C" fn(c_uint, *mut Device) -> c_uint> =
            lib.get(b"nvmlDeviceGetHandleByIndex_v2").unwrap();
        let mut device: Device = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut device), 0);
        let get_memory: unsafe extern "C" fn(Device, *mut Memory2) -> c_uint =
            *lib.get(b"nvmlDeviceGetMemoryInfo_v2").unwrap();
        (lib, get_memory, device)
    };
    let version = std::mem::size_of::<Memory2>() as c_uint | (2 << 24);

    let mut direct = || {
        let mut m = Memory2 {
            version,
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a valid handle and a writable, versioned nvmlMemory_v2_t.
        let rc = unsafe { get_memory(black_box(device), &mut m) };
        assert_eq!(rc, 0);
        black_box(m.used);
    };
    // The direct call stamped like a memprobe reading: when, and how long.
    let mut direct_stamped = || {
        let start = memprobe_core::monotonic_ns();
        let mut m = Memory2 {
            version,
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: as above.
        let rc = unsafe { get_memory(black_box(device), &mut m) };
        assert_eq!(rc, 0);
        let end = memprobe_core::monotonic_ns();
        black_box((m.used, start, end - start));
    };
    let mut through_handle = || {
        black_box(handle.memory().unwrap());
    };
    let mut used_fast = || {
        black_box(gpu_mem_get_used_fast(&handle).value);
    };
    let mut by_id = || {
        black_box(gpus.gpu_mem_get(Some(0)).value);
    };
    let r = per_call(
        batch,
        ROUNDS,
        &mut [
            &mut direct,
            &mut through_handle,
            &mut used_fast,
            &mut by_id,
            &mut direct_stamped,
        ],
    );
    println!("\n{label}: median ns per call over {ROUNDS} rounds of {batch} calls");
    println!("  one number (used), no timestamps:");
    println!(
        "    direct nvmlDeviceGetMemoryInfo_v2               {:9.1}",
        r[0]
    );
    println!(
        "    gpu_mem_get_used_fast(&handle)                  {:9.1}   ratio {:.3}",
        r[2],
        r[2] / r[0]
    );
    println!("  a full reading stamped with when + how long (2 x clock_gettime):");
    println!(
        "    direct call + 2 x monotonic_ns(), by hand       {:9.1}",
        r[4]
    );
    println!(
        "    DeviceHandle::memory()                          {:9.1}   ratio {:.3}",
        r[1],
        r[1] / r[4]
    );
    println!(
        "    Gpus::gpu_mem_get(Some(0)) (lookup by id)       {:9.1}   ratio {:.3}",
        r[3],
        r[3] / r[4]
    );
    std::mem::forget(lib);
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too,
    // so keep a quick mode for that.
    let quick = !std::env::args().any(|a| a == "--bench");
    let scale = if quick { 20 } else { 1 };
    run("bare fake NVML", "devices 1\n", 2000 / scale);
    run(
        "fake NVML with a 2 us driver cost",
        "devices 1\nspin_ns 2000\n",
        100 / scale.min(10),
    );
}
