//! The GPU samplers behind memprobe-core's Sampler trait.

mod common;

use common::{Fake, GIB};
use memprobe_core::{monotonic_ns, ErrorKind, PeakFidelity, SourceKind};
use memprobe_gpu::Gpus;
use std::time::{Duration, Instant};

#[test]
fn device_sampler() {
    let f = Fake::nvml("devices 2\ndevice 1 reserved 1000\ndevice 1 used 5000 7000\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let mut s = gpus.device_sampler(1).unwrap();
    let info = s.info();
    assert_eq!(info.name, "gpu1");
    assert_eq!(info.kind, SourceKind::GpuDevice);
    assert_eq!(info.fidelity, PeakFidelity::Sampled);
    let a = s.read().unwrap();
    assert_eq!(
        (a.used, a.total, a.free, a.reserved, a.limit),
        (
            5000,
            Some(16 * GIB),
            Some(16 * GIB - 6000),
            Some(1000),
            None
        )
    );
    let b = s.read().unwrap();
    assert_eq!(b.used, 7000);
    assert!(b.taken_at_ns >= a.taken_at_ns);
    assert_eq!(s.read_peak().unwrap(), None);
    assert!(gpus.device_sampler(2).is_err());
}

#[test]
fn process_sampler() {
    let f = Fake::nvml("device 0 total 8589934592\ndevice 0 procs 4:1 self:12345\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let mut s = gpus.process_sampler(0).unwrap();
    let info = s.info();
    assert_eq!(info.name, "gpu0.proc");
    assert_eq!(info.kind, SourceKind::GpuProcess);
    assert_eq!(info.fidelity, PeakFidelity::Sampled);
    let r = s.read().unwrap();
    assert_eq!((r.used, r.total, r.free), (12345, Some(8 * GIB), None));
    assert!(r.taken_at_ns > 0);
}

#[test]
fn a_lost_gpu_fails_read_with_gpu_lost() {
    let f = Fake::nvml("devices 2\ndevice 0 lost_at 4\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let mut dev = gpus.device_sampler(0).unwrap();
    let mut proc0 = gpus.process_sampler(0).unwrap(); // one memory query
    let mut other = gpus.device_sampler(1).unwrap();
    dev.read().unwrap();
    dev.read().unwrap();
    assert_eq!(dev.read().unwrap_err().kind(), ErrorKind::GpuLost);
    assert_eq!(dev.read().unwrap_err().kind(), ErrorKind::GpuLost);
    assert_eq!(proc0.read().unwrap_err().kind(), ErrorKind::GpuLost);
    other.read().unwrap();
}

/// A 5 ms spike (at 30..35 ms after NVML's init, by the fake's clock) is
/// caught by polling the sampler every millisecond. A loaded machine can
/// stall the poller past the whole spike, so attempts repeat, each with a
/// fresh library, until one catches it; the test fails only when none does
/// within the deadline. Every reading of every attempt must be one of the
/// two scripted values, and the last (taken after the spike) the base.
#[test]
fn a_5ms_spike_is_caught_at_1ms_polling() {
    const BASE: u64 = 1000 << 20;
    const SPIKE: u64 = 6000 << 20;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let f = Fake::nvml(&format!(
            "device 0 timeline 0:{BASE} 30:{SPIKE} 35:{BASE}\n"
        ));
        let gpus = Gpus::open(f.nvml_config()).unwrap();
        let mut s = gpus.device_sampler(0).unwrap();
        // The fake's clock started inside `open`: 60 ms from here is past
        // the spike by its clock too.
        let t0 = monotonic_ns();
        let mut readings = Vec::new();
        while monotonic_ns() - t0 < 60_000_000 {
            readings.push(s.read().unwrap().used);
            std::thread::sleep(Duration::from_millis(1));
        }
        readings.push(s.read().unwrap().used);
        assert!(
            readings.iter().all(|&u| u == BASE || u == SPIKE),
            "{readings:?}"
        );
        assert_eq!(readings.last(), Some(&BASE));
        if readings.contains(&SPIKE) {
            eprintln!("caught at attempt {attempts}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the spike was missed in all {attempts} attempts"
        );
    }
}

/// A 5 ms spike every 40 ms (by the fake's clock), polled every millisecond
/// until both the spike and the base have been read (a deadline, not a
/// fixed duration, bounds a loaded machine); no other value is ever read.
#[test]
fn a_periodic_spike_is_caught_over_time() {
    let f = Fake::nvml("device 0 timeline 0:100 20:900 25:100\ndevice 0 period_ms 40\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let mut s = gpus.device_sampler(0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut peak, mut low) = (0, u64::MAX);
    while (low, peak) != (100, 900) && Instant::now() < deadline {
        let used = s.read().unwrap().used;
        assert!(used == 100 || used == 900, "read {used}");
        peak = peak.max(used);
        low = low.min(used);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!((low, peak), (100, 900));
}
