//! The GPU part of an out-of-memory report (memprobe-core's
//! [`OomGpuProvider`]): which processes hold how much on each GPU (NVML's
//! process lists) and what this process holds per device through the
//! driver (the interposer's counts).
//!
//! It runs on the failing thread, for a driver trigger inside the failing
//! allocation, so it never calls CUDA: with the CUDA runtime backend (whose
//! every reading is a CUDA call) the GPUs are reported unavailable.

use crate::gpus::Gpus;
use crate::own_pid::OwnPids;
use crate::process::GpuProcessKind;
use crate::GpuBackend;
use memprobe_core::oom_report::{
    FailedAllocation, OomDriverCount, OomDriverCounts, OomGpuDevice, OomGpuMemory, OomGpuProcess,
    OomGpuProvider, OomHeldBasis, OomHeldByOrigin, OomLocation, OomOriginBytes, OomProcessList,
    OomStackBytes, OomTrigger,
};
use memprobe_interpose_reader::origins::PeakOrigins;
use memprobe_interpose_reader::stacks::StackBytes;
use memprobe_interpose_reader::{Counter, Region};

/// The GPU part of out-of-memory reports, over a set of GPUs (the
/// process-wide ones by default).
#[derive(Debug, Clone, Copy)]
pub struct GpuOomForensics {
    gpus: &'static Gpus,
}

impl Default for GpuOomForensics {
    fn default() -> Self {
        GpuOomForensics::new()
    }
}

impl GpuOomForensics {
    /// Over the process-wide GPUs ([`Gpus::shared`]), opened now if they are
    /// not yet, so that no library is loaded at the failure.
    pub fn new() -> GpuOomForensics {
        GpuOomForensics::over(Gpus::shared())
    }

    /// Over `gpus`.
    pub fn over(gpus: &'static Gpus) -> GpuOomForensics {
        GpuOomForensics { gpus }
    }
}

impl OomGpuProvider for GpuOomForensics {
    fn devices(&self) -> Result<Vec<OomGpuDevice>, String> {
        match self.gpus.backend() {
            GpuBackend::Nvml => {}
            GpuBackend::Cudart => {
                return Err(
                    "the CUDA runtime backend reads GPUs through CUDA calls, which an \
                            out-of-memory report must not make; use the NVML backend"
                        .to_owned(),
                )
            }
            _ => {
                return Err(self
                    .gpus
                    .unavailable_reason()
                    .map_or_else(|| "no GPU backend".to_owned(), |e| e.message().to_owned()))
            }
        }
        let count = self
            .gpus
            .device_count()
            .map_err(|e| e.message().to_owned())?;
        let me = OwnPids::current();
        let mut out = Vec::with_capacity(count as usize);
        for id in 0..count {
            let device = match self.gpus.device_ref(id) {
                Ok(h) => {
                    let info = h.info();
                    let processes = h
                        .processes()
                        .map_err(|e| e.message().to_owned())
                        .map(|list| {
                            list.iter()
                                .map(|p| OomGpuProcess {
                                    pid: p.pid,
                                    used_bytes: p.used,
                                    list: match p.kind {
                                        GpuProcessKind::Compute => OomProcessList::Compute,
                                        GpuProcessKind::Graphics => OomProcessList::Graphics,
                                    },
                                    this_process: p.pid == me.outermost || p.pid == me.own,
                                })
                                .collect()
                        });
                    OomGpuDevice {
                        id,
                        name: info.name.clone(),
                        uuid: info.uuid.clone(),
                        memory: h
                            .memory()
                            .map(|m| OomGpuMemory {
                                total_bytes: m.total,
                                free_bytes: m.free,
                                used_bytes: m.used,
                            })
                            .map_err(|e| e.message().to_owned()),
                        processes,
                    }
                }
                Err(e) => OomGpuDevice {
                    id,
                    name: None,
                    uuid: None,
                    memory: Err(e.message().to_owned()),
                    processes: Err(e.message().to_owned()),
                },
            };
            out.push(device);
        }
        Ok(out)
    }

    fn driver_counts(&self) -> Result<OomDriverCounts, String> {
        let region =
            Region::in_process().map_err(|e| crate::exact::unavailable(&e).message().to_owned())?;
        let devices = region
            .counters_seen()
            .into_iter()
            .filter_map(|c| match c {
                Counter::Device(d) => {
                    let r = region.read(c);
                    Some(OomDriverCount {
                        device: d,
                        held_bytes: r.current,
                        lifetime_peak_bytes: r.lifetime_peak,
                        oom_failures: r.failures,
                    })
                }
                Counter::HostPinned => None,
            })
            .collect();
        let nc = region.not_counted();
        Ok(OomDriverCounts {
            devices,
            host_pinned_bytes: region.current(Counter::HostPinned),
            not_counted_calls: nc.calls,
            not_counted_bytes: nc.bytes,
        })
    }

    fn held_by_origin(&self, failed: &FailedAllocation) -> Result<OomHeldByOrigin, String> {
        let region =
            Region::in_process().map_err(|e| crate::exact::unavailable(&e).message().to_owned())?;
        if !region.keeps_origins() {
            return Err("the interposer keeps no origins here (MEMPROBE_GPU_ORIGINS=off)".into());
        }
        held_by_origin(&region, failed)
    }
}

fn counter_of(location: OomLocation) -> Option<Counter> {
    match location {
        OomLocation::Device(d) => Some(Counter::Device(d)),
        OomLocation::HostPinned => Some(Counter::HostPinned),
        OomLocation::Unknown => None,
    }
}

fn location_of(c: Counter) -> OomLocation {
    match c {
        Counter::Device(d) => OomLocation::Device(d),
        Counter::HostPinned => OomLocation::HostPinned,
    }
}

/// The driver's own failure: the breakdown the interposer copied inside it.
/// A caller's trigger (a framework's error, raised after the driver's
/// failure was handled, or with no driver failure at all): what is live on
/// its device now, said to be so.
fn held_by_origin(region: &Region, failed: &FailedAllocation) -> Result<OomHeldByOrigin, String> {
    if failed.trigger == OomTrigger::Driver {
        if let Some((c, b)) = region.oom_origins() {
            let same = counter_of(failed.location).map_or(true, |want| want == c);
            if same {
                let stacks = region.oom_stacks().map(|s| s.by_stack);
                let basis = OomHeldBasis::AtFailure;
                return Ok(held(location_of(c), basis, b, stacks.unwrap_or_default()));
            }
        }
    }
    let c = counter_of(failed.location)
        .ok_or("the failing device is not known, so neither is what it held")?;
    let by_origin = region.live_by_origin(c);
    let live = PeakOrigins {
        peak: by_origin.iter().map(|o| o.bytes).sum(),
        at_ns: memprobe_core::monotonic_ns(),
        by_origin,
    };
    let stacks = region.live_by_stack(c);
    Ok(held(failed.location, OomHeldBasis::AtReport, live, stacks))
}

fn held(
    location: OomLocation,
    basis: OomHeldBasis,
    p: PeakOrigins,
    stacks: Vec<StackBytes>,
) -> OomHeldByOrigin {
    OomHeldByOrigin {
        by_stack: stacks
            .into_iter()
            .map(|s| OomStackBytes {
                frames: s.stack.frames,
                bytes: s.bytes,
            })
            .collect(),
        location,
        basis,
        at_ns: p.at_ns,
        held_bytes: p.peak,
        by_origin: p
            .by_origin
            .into_iter()
            .map(|o| OomOriginBytes {
                name: o.origin.familiar_name(),
                library: o.origin.library,
                symbol: o.origin.symbol,
                program: o.origin.program,
                bytes: o.bytes,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_backend_or_the_interposer_each_part_says_why() {
        let off = Box::leak(Box::new(
            Gpus::open(crate::GpuConfig {
                backend: GpuBackend::None,
                ..crate::GpuConfig::default()
            })
            .unwrap(),
        ));
        let f = GpuOomForensics::over(off);
        let e = f.devices().unwrap_err();
        assert!(!e.is_empty(), "{e}");
        // The unit-test binary has no interposer.
        let e = f.driver_counts().unwrap_err();
        assert!(e.contains("LD_PRELOAD"), "{e}");
    }
}
