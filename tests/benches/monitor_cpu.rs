//! The background monitor's CPU use with GPUs, and a GPU read through the C
//! ABI against a direct call into the same (fake) NVML.
//!
//! `cargo bench -p memprobe-tests --bench monitor_cpu` (release build).
//!
//! Part 1: at the default 10 ms interval, one window open over this
//! process's RSS, the container's cgroup (when there is one) and 8 fake GPUs
//! (`tests/fake-gpu/fake_nvml.c`, each memory query busy-waiting `spin_ns`:
//! 0; 7 µs, what `nvmlDeviceGetMemoryInfo_v2` takes on an H100; 20 µs, a
//! slow driver), and with 1 free GPU to show the fixed cost of a tick. The process's CPU time
//! (`CLOCK_PROCESS_CPUTIME_ID`, every thread) is measured over a period
//! with the window open and over the same period with no window open, the
//! two alternating; the figures are medians over the repetitions, in % of
//! one core. `MEMPROBE_BENCH_SECS` (default 5) and `MEMPROBE_BENCH_REPS`
//! (default 3) change the period and the repetitions.
//!
//! Part 2: nanoseconds per call, medians over rounds of batches, cases
//! interleaved round by round: `memprobe_gpu_mem_get_used_fast` and
//! `memprobe_gpu_mem_get` from `libmemprobe.so` (dlopen) against
//! `nvmlDeviceGetMemoryInfo_v2` called directly from the fake (dlopen).

#[path = "../../memprobe-gpu/benches/support/interleaved.rs"]
mod interleaved;

use interleaved::{median, per_call};
use memprobe_core::{monitor, PeakFidelity, Source, Window};
use memprobe_gpu::{GpuBackend, GpuConfig, Gpus};
use memprobe_tests::{scratch, stage_fake_gpu, FakeGpu};
use std::ffi::{c_char, c_uint, c_void, CString};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time of every thread of this process, nanoseconds.
fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// % of one core this process used while `f` ran for `period`.
fn cpu_percent(period: Duration, f: impl FnOnce(Duration)) -> f64 {
    let wall = Instant::now();
    let cpu = process_cpu_ns();
    f(period);
    let cpu = process_cpu_ns() - cpu;
    cpu as f64 / wall.elapsed().as_nanos() as f64 * 100.0
}

/// A private fake NVML with 8 devices whose memory query costs `spin_ns`.
fn fake_nvml(tag: &str, spin_ns: u64) -> PathBuf {
    let dir = scratch("monitor_cpu").join(tag);
    stage_fake_gpu(
        FakeGpu::Nvml,
        &[],
        &format!("devices 8\nspin_ns {spin_ns}\n"),
        &dir,
    )
}

struct Row {
    label: String,
    idle: f64,
    open: f64,
    ticks_per_s: f64,
}

/// Alternates `reps` periods with no window and with a window over `sources`.
fn measure_monitor(label: String, sources: &[Source], period: Duration, reps: u64) -> Row {
    let (mut idle, mut open, mut rates) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        idle.push(cpu_percent(period, std::thread::sleep));
        let ticks = monitor::stats().unwrap().ticks;
        let started = Instant::now();
        open.push(cpu_percent(period, |p| {
            let w = Window::open(sources).unwrap();
            std::thread::sleep(p);
            drop(w);
        }));
        let ticks = monitor::stats().unwrap().ticks - ticks;
        rates.push(ticks as f64 / started.elapsed().as_secs_f64());
    }
    Row {
        label,
        idle: median(idle),
        open: median(open),
        ticks_per_s: median(rates),
    }
}

/// The floor: a bare thread that does nothing but wake every 10 ms (what
/// the operating system charges for the wake-ups alone).
fn floor(period: Duration, reps: u64) -> Row {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let (mut idle, mut open, mut rates) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        idle.push(cpu_percent(period, std::thread::sleep));
        let stop = Arc::new(AtomicBool::new(false));
        let wakes = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        open.push(cpu_percent(period, |p| {
            let (s, w) = (stop.clone(), wakes.clone());
            let t = std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::park_timeout(Duration::from_millis(10));
                    w.fetch_add(1, Ordering::Relaxed);
                }
            });
            std::thread::sleep(p);
            stop.store(true, Ordering::Relaxed);
            t.thread().unpark();
            t.join().unwrap();
        }));
        rates.push(wakes.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64());
    }
    Row {
        label: "floor: a thread waking every 10 ms".to_string(),
        idle: median(idle),
        open: median(open),
        ticks_per_s: median(rates),
    }
}

// --- part 2: the C ABI against a direct call -------------------------------

#[repr(C)]
#[derive(Default)]
struct GpuMemory {
    total: u64,
    free: u64,
    used: u64,
    reserved: u64,
    valid: u32,
    taken_at_ns: u64,
    read_ns: u64,
}

#[repr(C)]
struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// `dlopen` + `dlsym`, panicking on failure; the library stays loaded.
fn symbols(lib: &Path, names: &[&str]) -> Vec<*mut c_void> {
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we built; symbols are looked up by name.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen {}", lib.display());
        names
            .iter()
            .map(|n| {
                let c = CString::new(*n).unwrap();
                let p = libc::dlsym(h, c.as_ptr() as *const c_char);
                assert!(!p.is_null(), "missing {n}");
                p
            })
            .collect()
    }
}

fn release_libmemprobe() -> PathBuf {
    let root = memprobe_tests::root();
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args(["build", "-q", "--release", "-p", "memprobe-ffi"])
        .current_dir(&root)
        .status()
        .expect("cargo build");
    assert!(status.success());
    memprobe_tests::target_dir().join("release/libmemprobe.so")
}

fn c_abi_vs_direct() {
    type Configure = unsafe extern "C" fn(u32, *const c_char, *const c_char) -> u32;
    type Open = unsafe extern "C" fn(u32, *mut *mut c_void) -> u32;
    type UsedFast = unsafe extern "C" fn(*const c_void, *mut u64) -> u32;
    type MemGet = unsafe extern "C" fn(i64, *mut GpuMemory) -> u32;
    type Init = unsafe extern "C" fn() -> c_uint;
    type ByIndex = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_uint;
    type MemoryV2 = unsafe extern "C" fn(*mut c_void, *mut NvmlMemoryV2) -> c_uint;

    let fake = fake_nvml("c-abi", 0);
    let lib = release_libmemprobe();
    let m = symbols(
        &lib,
        &[
            "memprobe_gpu_configure",
            "memprobe_gpu_device_open",
            "memprobe_gpu_mem_get_used_fast",
            "memprobe_gpu_mem_get",
        ],
    );
    let n = symbols(
        &fake,
        &[
            "nvmlInit_v2",
            "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetMemoryInfo_v2",
        ],
    );
    // SAFETY: the symbols have these C signatures (memprobe.h, nvml.h).
    let (configure, open, used_fast, mem_get, init, by_index, memory_v2) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Configure>(m[0]),
            std::mem::transmute::<*mut c_void, Open>(m[1]),
            std::mem::transmute::<*mut c_void, UsedFast>(m[2]),
            std::mem::transmute::<*mut c_void, MemGet>(m[3]),
            std::mem::transmute::<*mut c_void, Init>(n[0]),
            std::mem::transmute::<*mut c_void, ByIndex>(n[1]),
            std::mem::transmute::<*mut c_void, MemoryV2>(n[2]),
        )
    };
    let fake_c = CString::new(fake.to_str().unwrap()).unwrap();
    let mut handle = std::ptr::null_mut();
    let mut device = std::ptr::null_mut();
    // SAFETY: valid arguments and out-pointers; MEMPROBE_GPU_BACKEND_NVML = 1.
    unsafe {
        assert_eq!(configure(1, fake_c.as_ptr(), std::ptr::null()), 0);
        assert_eq!(open(0, &mut handle), 0);
        assert_eq!(init(), 0);
        assert_eq!(by_index(0, &mut device), 0);
    }
    let handle = handle as *const c_void;
    let version = std::mem::size_of::<NvmlMemoryV2>() as c_uint | (2 << 24);
    let mut direct = || {
        let mut mem = NvmlMemoryV2 {
            version,
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a valid handle and a versioned struct.
        black_box(unsafe { memory_v2(device, &mut mem) });
        black_box(mem.used);
    };
    let mut direct_stamped = || {
        let t0 = memprobe_core::monotonic_ns();
        let mut mem = NvmlMemoryV2 {
            version,
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: as above.
        black_box(unsafe { memory_v2(device, &mut mem) });
        black_box((mem.used, memprobe_core::monotonic_ns() - t0));
    };
    let mut c_fast = || {
        let mut used = 0u64;
        // SAFETY: a live handle and a valid out-pointer.
        black_box(unsafe { used_fast(handle, &mut used) });
        black_box(used);
    };
    let mut c_get = || {
        let mut m = GpuMemory::default();
        // SAFETY: a valid out-pointer.
        black_box(unsafe { mem_get(0, &mut m) });
        black_box(m.used);
    };
    let figures = per_call(
        2000,
        101,
        &mut [&mut direct, &mut c_fast, &mut direct_stamped, &mut c_get],
    );
    println!("\nGPU read, bare fake NVML (ns per call, median of 101 rounds of 2000):");
    println!(
        "  direct nvmlDeviceGetMemoryInfo_v2                {:8.1}",
        figures[0]
    );
    println!(
        "  memprobe_gpu_mem_get_used_fast (C ABI, handle)    {:8.1}  (+{:.1} ns, {:.2}x)",
        figures[1],
        figures[1] - figures[0],
        figures[1] / figures[0]
    );
    println!(
        "  direct call + 2 x monotonic_ns, by hand           {:8.1}",
        figures[2]
    );
    println!(
        "  memprobe_gpu_mem_get(0) (C ABI, by id)            {:8.1}  (+{:.1} ns, {:.2}x)",
        figures[3],
        figures[3] - figures[2],
        figures[3] / figures[2]
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let period = Duration::from_secs(env_or("MEMPROBE_BENCH_SECS", 5));
    let reps = env_or("MEMPROBE_BENCH_REPS", 3);
    monitor::set_interval(Duration::from_millis(10)).unwrap();

    let rss = Source::process().unwrap();
    let cgroup = Source::cgroup().ok();
    let mut host = vec![rss];
    host.extend(cgroup.iter().cloned());
    println!(
        "monitor CPU at a 10 ms interval, {}-s periods, median of {reps} \
         (% of one core, window open vs no window); host: rss{}",
        period.as_secs(),
        if cgroup.is_some() {
            " + cgroup"
        } else {
            " (no cgroup)"
        }
    );
    let mut rows = vec![floor(period, reps)];
    rows.push(measure_monitor(
        "host only".to_string(),
        &host,
        period,
        reps,
    ));
    // (GPUs, emulated driver cost per memory query in ns): free, what
    // nvmlDeviceGetMemoryInfo_v2 costs on an H100 (driver 580, ~7 us), and
    // a slow driver (20 us).
    for (n_gpus, spin) in [(1u32, 0u64), (8, 0), (8, 7_000), (8, 20_000)] {
        let lib = fake_nvml(&format!("{n_gpus}gpus-spin{spin}"), spin);
        let gpus = Gpus::open(GpuConfig {
            backend: GpuBackend::Nvml,
            nvml_path: Some(lib),
            ..GpuConfig::default()
        })
        .unwrap();
        let mut sources = host.clone();
        for id in 0..n_gpus {
            sources.push(Source::from_sampler(gpus.device_sampler(id).unwrap()));
        }
        rows.push(measure_monitor(
            format!("host + {n_gpus} GPU(s), {} us per query", spin / 1000),
            &sources,
            period,
            reps,
        ));
    }
    // fastai's peak thread polls about every millisecond: the same 8 GPUs at
    // 7 us per query, at a 1 ms interval.
    {
        let lib = fake_nvml("8gpus-spin7000-1ms", 7_000);
        let gpus = Gpus::open(GpuConfig {
            backend: GpuBackend::Nvml,
            nvml_path: Some(lib),
            ..GpuConfig::default()
        })
        .unwrap();
        let mut sources = host.clone();
        for id in 0..8 {
            sources.push(Source::from_sampler(gpus.device_sampler(id).unwrap()));
        }
        monitor::set_interval(Duration::from_millis(1)).unwrap();
        rows.push(measure_monitor(
            "host + 8 GPU(s), 7 us per query, 1 ms interval".to_string(),
            &sources,
            period,
            reps,
        ));
        monitor::set_interval(Duration::from_millis(10)).unwrap();
    }
    monitor::stop().unwrap();
    println!(
        "  {:<34} {:>9} {:>9} {:>9} {:>8} {:>10}",
        "sources", "no window", "window", "overhead", "ticks/s", "CPU/tick"
    );
    for r in &rows {
        let overhead = r.open - r.idle;
        let per_tick_us = if r.ticks_per_s > 0.0 {
            format!("{:.1} us", overhead / 100.0 / r.ticks_per_s * 1e6)
        } else {
            "-".to_string()
        };
        println!(
            "  {:<34} {:>8.3}% {:>8.3}% {:>8.3}% {:>8.1} {:>10}",
            r.label, r.idle, r.open, overhead, r.ticks_per_s, per_tick_us
        );
    }
    for s in &host {
        println!(
            "  ({} is {:?}: {})",
            s.info().name,
            s.info().fidelity,
            if s.info().fidelity == PeakFidelity::Sampled {
                "polled"
            } else {
                "not polled; its peak is the kernel's"
            }
        );
    }

    c_abi_vs_direct();
}
