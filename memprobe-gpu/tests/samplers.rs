//! The GPU samplers behind memprobe-core's Sampler trait.

mod common;

use common::{Fake, GIB};
use memprobe_core::{monotonic_ns, ErrorKind, PeakFidelity, SourceKind};
use memprobe_gpu::Gpus;
use std::time::Duration;

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

#[test]
fn samplers_are_send() {
    let f = Fake::nvml("devices 1\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let mut s = gpus.device_sampler(0).unwrap();
    std::thread::spawn(move || s.read().unwrap())
        .join()
        .unwrap();
}

/// A 5 ms spike (at 30..35 ms after NVML's init) is caught by polling the
/// sampler every millisecond. If the machine is so loaded that the poller
/// itself stalled for more than 4 ms around the spike, that attempt proves
/// nothing and is repeated with a fresh library.
#[test]
fn a_5ms_spike_is_caught_at_1ms_polling() {
    const BASE: u64 = 1000 << 20;
    const SPIKE: u64 = 6000 << 20;
    for attempt in 1..=5 {
        let f = Fake::nvml(&format!(
            "device 0 timeline 0:{BASE} 30:{SPIKE} 35:{BASE}\n"
        ));
        let t0 = monotonic_ns();
        let gpus = Gpus::open(f.nvml_config()).unwrap();
        let mut s = gpus.device_sampler(0).unwrap();
        let ms = |ns: u64| (ns - t0) as f64 / 1e6;
        let mut samples = Vec::new();
        while monotonic_ns() - t0 < 60_000_000 {
            let r = s.read().unwrap();
            samples.push((ms(r.taken_at_ns), r.used));
            std::thread::sleep(Duration::from_millis(1));
        }
        let peak = samples.iter().map(|&(_, u)| u).max().unwrap();
        let in_spike = samples.iter().filter(|&&(_, u)| u == SPIKE).count();
        let max_gap = samples
            .windows(2)
            .filter(|w| w[1].0 > 27.0 && w[0].0 < 38.0)
            .map(|w| w[1].0 - w[0].0)
            .fold(0.0, f64::max);
        eprintln!(
            "attempt {attempt}: {} samples, {in_spike} in the spike, largest gap near it {max_gap:.2} ms",
            samples.len()
        );
        assert_eq!(samples.first().unwrap().1, BASE);
        assert_eq!(samples.last().unwrap().1, BASE);
        if peak == SPIKE {
            return;
        }
        assert!(
            max_gap > 4.0,
            "the spike was missed although the poller kept a {max_gap:.2} ms cadence"
        );
    }
    panic!("the machine was too loaded to poll at 1 ms in 5 attempts");
}

#[test]
fn a_periodic_spike_is_caught_over_time() {
    // A 5 ms spike every 40 ms, sampled for 200 ms: the peak is the spike,
    // and the readings between spikes are the base.
    let f = Fake::nvml("device 0 timeline 0:100 20:900 25:100\ndevice 0 period_ms 40\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let mut s = gpus.device_sampler(0).unwrap();
    let t0 = monotonic_ns();
    let (mut peak, mut low) = (0, u64::MAX);
    while monotonic_ns() - t0 < 200_000_000 {
        let used = s.read().unwrap().used;
        peak = peak.max(used);
        low = low.min(used);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!((low, peak), (100, 900));
}
