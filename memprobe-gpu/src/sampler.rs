//! GPU samplers for memprobe-core: a whole device, and this process on a device.

use crate::device::DeviceHandle;
use crate::gpus::Gpus;
use memprobe_core::{PeakFidelity, Result, Sample, Sampler, SourceInfo, SourceKind};

/// Samples one device's memory (`gpu<id>`): `used`, `total`, `free`,
/// `reserved`. GPUs keep no high-water mark, so the peak is sampled.
struct DeviceSampler {
    handle: DeviceHandle,
    name: String,
}

impl Sampler for DeviceSampler {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: self.name.clone(),
            kind: SourceKind::GpuDevice,
            fidelity: PeakFidelity::Sampled,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        self.handle.memory().map(|m| m.to_sample())
    }
}

/// Samples this process's memory on one device (`gpu<id>.proc`): `used`,
/// and the device's size as `total`.
struct GpuProcessSampler {
    handle: DeviceHandle,
    name: String,
    total: u64,
}

impl Sampler for GpuProcessSampler {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: self.name.clone(),
            kind: SourceKind::GpuProcess,
            fidelity: PeakFidelity::Sampled,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        let p = self.handle.process_memory()?;
        Ok(Sample {
            used: p.used,
            total: Some(self.total),
            free: None,
            limit: None,
            reserved: None,
            taken_at_ns: p.taken_at_ns,
            read_ns: p.read_ns,
        })
    }
}

impl Gpus {
    /// A sampler of device `id`'s memory, named `gpu<id>`
    /// ([`SourceKind::GpuDevice`], [`PeakFidelity::Sampled`]). A lost GPU makes
    /// `read` fail with [`ErrorKind::GpuLost`](memprobe_core::ErrorKind::GpuLost).
    ///
    /// # Errors
    /// As [`Gpus::device`].
    pub fn device_sampler(&self, id: u32) -> Result<Box<dyn Sampler>> {
        let handle = self.device(id)?;
        Ok(Box::new(DeviceSampler {
            name: format!("gpu{id}"),
            handle,
        }))
    }

    /// A sampler of this process's memory on device `id`, named
    /// `gpu<id>.proc` ([`SourceKind::GpuProcess`]); `total` is the device's size.
    ///
    /// # Errors
    /// As [`Gpus::device`]; the device's memory or process list cannot be
    /// read (e.g. [`ErrorKind::Unsupported`](memprobe_core::ErrorKind::Unsupported)
    /// with the CUDA runtime backend).
    pub fn process_sampler(&self, id: u32) -> Result<Box<dyn Sampler>> {
        let handle = self.device(id)?;
        let total = handle.memory()?.total;
        handle.process_memory()?;
        Ok(Box::new(GpuProcessSampler {
            name: format!("gpu{id}.proc"),
            handle,
            total,
        }))
    }
}

/// [`Gpus::device_sampler`] on [`Gpus::shared`].
///
/// # Errors
/// As [`Gpus::device_sampler`].
pub fn device_sampler(id: u32) -> Result<Box<dyn Sampler>> {
    Gpus::shared().device_sampler(id)
}

/// [`Gpus::process_sampler`] on [`Gpus::shared`].
///
/// # Errors
/// As [`Gpus::process_sampler`].
pub fn process_sampler(id: u32) -> Result<Box<dyn Sampler>> {
    Gpus::shared().process_sampler(id)
}
