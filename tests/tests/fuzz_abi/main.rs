//! A property-based fuzzer over sequences of C ABI calls with arbitrary
//! arguments: handles that are live, freed, of another type or forged;
//! unknown enum values and flag bits; random strings, sizes and NULLs. It
//! drives the real `extern "C"` entry points (the same code as
//! libmemprobe.so) in this process: every function include/memprobe.h
//! declares (`every_exported_function_is_fuzzed` fails when one is left
//! out) — mark groups and their sources, the GPU module over a fake NVML,
//! exact GPU sources (without the interposer), the exporter, tracker sinks
//! — while every tracker boundary also goes to a run channel
//! (`MEMPROBE_RUN_CHANNEL`) whose receiver is drained, left full or closed.
//!
//! Properties: no call crashes or returns MEMPROBE_STATUS_PANIC; every status
//! is a known value with a message when not OK; after the sequence, freeing
//! every handle leaves none alive.
//!
//! CI runs the seeds in tests/fuzz/corpus.txt plus new random seeds for
//! MEMPROBE_FUZZ_SECONDS (default 10). A longer run:
//! `MEMPROBE_FUZZ_SECONDS=600 cargo test --release -p memprobe-tests --test fuzz_abi -- --nocapture`.
//! A failing seed is printed; add it to the corpus once fixed.

mod exporters;
mod gpus;
mod library;
mod marks;
mod oom_reports;
mod sources;
mod support;
mod traces;
mod trackers;
mod windows;

use memprobe_ffi_impl::source::memprobe_source;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::trace::memprobe_trace;
use memprobe_ffi_impl::tracker::memprobe_tracker;
use memprobe_ffi_impl::window::memprobe_window;
use std::ffi::{c_void, CString};
use std::time::{Duration, Instant};
use support::{check, run_channel, Pool, Rng, Seq, SUCCEEDED};

fn run_seed(seed: u64, steps: usize, fake_nvml: &std::path::Path) -> usize {
    use memprobe_ffi_impl::*;
    let mut rng = Rng(seed | 1);
    let mut p = Pool::default();
    let counter = Box::new(0u64);
    let counter_ptr = &*counter as *const u64 as *mut c_void;
    let mut step_counter = Box::new(0u64);
    let oom_dir = std::env::temp_dir().join(format!("memprobe-fuzz-oom-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&oom_dir);
    let oom_path = oom_dir.join("report.json").display().to_string();
    let null_file = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let mut cx = Seq {
        seed,
        step: 0,
        counter_ptr,
        step_counter: &mut *step_counter as *mut u64 as *mut c_void,
        oom_dir: oom_dir.clone(),
        oom_path,
        null_fd: std::os::fd::AsRawFd::as_raw_fd(&null_file),
        fake_nvml: fake_nvml.to_path_buf(),
    };
    for step in 0..steps {
        cx.step = step;
        // One call per step, of the family the number falls in (each
        // family's file makes the calls of its numbers).
        match rng.below(44) {
            op @ (0..=7 | 33 | 38) => sources::call(op, &mut rng, &mut p, &cx),
            op @ 8..=13 => windows::call(op, &mut rng, &mut p, &cx),
            op @ (14..=20 | 42) => traces::call(op, &mut rng, &mut p, &cx),
            op @ (21..=29 | 41) => trackers::call(op, &mut rng, &mut p, &cx),
            op @ (30..=32 | 43) => library::call(op, &mut rng, &mut p, &cx),
            op @ (34 | 35) => oom_reports::call(op, &mut rng, &mut p, &cx),
            op @ (36 | 37) => marks::call(op, &mut rng, &mut p, &cx),
            39 => gpus::call(39, &mut rng, &mut p, &cx),
            40 => exporters::call(40, &mut rng, &mut p, &cx),
            op => unreachable!("below(44) gave {op}"),
        }
    }
    // Clean up: every live handle frees; nothing leaks.
    {
        for h in p.trackers.drain(..) {
            check(
                seed,
                steps,
                "final tracker_free",
                tracker::memprobe_tracker_free(h as *mut memprobe_tracker),
            );
        }
        for h in p.traces.drain(..) {
            check(
                seed,
                steps,
                "final trace_free",
                trace::memprobe_trace_free(h as *mut memprobe_trace),
            );
        }
        for h in p.windows.drain(..) {
            check(
                seed,
                steps,
                "final window_free",
                window::memprobe_window_free(h as *mut memprobe_window),
            );
        }
        for h in p.sources.drain(..) {
            check(
                seed,
                steps,
                "final source_free",
                source::memprobe_source_free(h as *mut memprobe_source),
            );
        }
        for h in p.marks.drain(..) {
            check(
                seed,
                steps,
                "final mark_group_free",
                mark::memprobe_mark_group_free(h as *mut mark::memprobe_mark_group),
            );
        }
        for h in p.exporters.drain(..) {
            check(
                seed,
                steps,
                "final exporter_free",
                metrics::memprobe_exporter_free(h as *mut metrics::memprobe_exporter),
            );
        }
        for h in p.devices.drain(..) {
            check(
                seed,
                steps,
                "final gpu_device_free",
                gpu::memprobe_gpu_device_free(h as *mut gpu::memprobe_gpu_device),
            );
        }
    }
    drop(counter);
    drop(step_counter);
    let _ = std::fs::remove_dir_all(&oom_dir);
    steps
}

fn live_handles() -> (u64, u64, u64, u64) {
    let (mut s, mut w, mut t, mut k) = (0, 0, 0, 0);
    assert_eq!(
        memprobe_ffi_impl::memprobe_debug_live_handles(&mut s, &mut w, &mut t, &mut k),
        memprobe_status::Ok
    );
    (s, w, t, k)
}

#[test]
fn fuzz_c_abi_call_sequences() {
    let corpus =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus.txt")).unwrap();
    let seeds: Vec<u64> = corpus
        .lines()
        .filter_map(|l| l.split('#').next()?.trim().parse().ok())
        .collect();
    assert!(!seeds.is_empty(), "the corpus has seeds");
    // Before any tracker: every phase boundary also goes to the run channel.
    let _ = run_channel();
    let fake_nvml = memprobe_tests::stage_fake_gpu(
        memprobe_tests::FakeGpu::Nvml,
        &[],
        "devices 2\ndevice 0 procs self:1000\n",
        &memprobe_tests::scratch("fuzz-abi-nvml"),
    );
    // Configuring is once per process, before any other GPU call (later
    // calls, which the sequences also make, answer WRONG_ORDER): a GPU
    // that answers, so the GPU entry points get past "no GPU".
    let nvml = CString::new(fake_nvml.display().to_string()).unwrap();
    check(
        0,
        0,
        "gpu_configure",
        memprobe_ffi_impl::gpu::memprobe_gpu_configure(1, nvml.as_ptr(), std::ptr::null()),
    );
    let budget = Duration::from_secs(
        std::env::var("MEMPROBE_FUZZ_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    let start = Instant::now();
    let mut calls = 0;
    for &seed in &seeds {
        calls += run_seed(seed, 300, &fake_nvml);
    }
    let mut seed =
        0x9E37_79B9_7F4A_7C15u64 ^ std::process::id() as u64 ^ start.elapsed().as_nanos() as u64;
    let mut extra = 0;
    while start.elapsed() < budget {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        calls += run_seed(seed, 300, &fake_nvml);
        extra += 1;
    }
    memprobe_ffi_impl::monitor::memprobe_monitor_stop();
    assert_eq!(live_handles(), (0, 0, 0, 0), "handles leaked");
    let mut devices = u64::MAX;
    assert_eq!(
        memprobe_ffi_impl::gpu::memprobe_gpu_debug_live_devices(&mut devices),
        memprobe_status::Ok
    );
    assert_eq!(devices, 0, "GPU device handles leaked");
    let succeeded = SUCCEEDED.lock().unwrap_or_else(|e| e.into_inner());
    for deep in [
        "mark_group_new",
        "mark_group_new_many",
        "source_new_mark",
        "gpu_configure",
        "gpu_device_open",
        "gpu_mem_get_all",
        "source_new_gpu_device",
        "exporter_start",
        "exporter_add_source",
        "tracker_add_csv_sink",
        "tracker_next",
    ] {
        assert!(succeeded.contains(deep), "no call of {deep} ever succeeded");
    }
    eprintln!(
        "fuzz: {} corpus seeds + {extra} random seeds, {calls} calls, {:?}, 0 crashes",
        seeds.len(),
        start.elapsed()
    );
}

/// The fuzzer calls every function include/memprobe.h declares, so the ABI
/// cannot grow an entry point that no sequence ever reaches.
#[test]
fn every_exported_function_is_fuzzed() {
    use memprobe_tests::c_header::{calls, declared_functions};
    let header =
        std::fs::read_to_string(memprobe_tests::root().join("include/memprobe.h")).unwrap();
    let declared = declared_functions(&header);
    assert!(declared.len() > 90, "the header parses: {declared:?}");
    let fuzzer = [
        include_str!("main.rs"),
        include_str!("support.rs"),
        include_str!("sources.rs"),
        include_str!("windows.rs"),
        include_str!("traces.rs"),
        include_str!("trackers.rs"),
        include_str!("oom_reports.rs"),
        include_str!("marks.rs"),
        include_str!("gpus.rs"),
        include_str!("exporters.rs"),
        include_str!("library.rs"),
    ]
    .concat();
    let missing: Vec<&String> = declared.iter().filter(|f| !calls(&fuzzer, f)).collect();
    assert!(
        missing.is_empty(),
        "exported but never called by tests/tests/fuzz_abi/: {missing:?}"
    );
}
