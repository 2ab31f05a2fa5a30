//! fastai's `utils.mem` GPU helpers, in bytes, with the reason beside every
//! placeholder zero.
//!
//! | fastai                      | memprobe                                   |
//! |-----------------------------|--------------------------------------------|
//! | `gpu_mem_get(id)`           | [`gpu_mem_get`] → [`GpuMemory`]            |
//! | `gpu_mem_get_all()`         | [`gpu_mem_get_all`]                        |
//! | `gpu_mem_get_free()`        | [`gpu_mem_get_free`]                       |
//! | `gpu_mem_get_free_no_cache()` | [`gpu_mem_get_free_no_cache`]            |
//! | `gpu_mem_get_used()`        | [`gpu_mem_get_used`]                       |
//! | `gpu_mem_get_used_no_cache()` | [`gpu_mem_get_used_no_cache`]            |
//! | `gpu_mem_get_used_fast(h)`  | [`gpu_mem_get_used_fast`]                  |
//! | `gpu_with_max_free_mem()`   | [`gpu_with_max_free_mem`]                  |
//! | `preload_pytorch()`         | [`preload`]                                |
//! | `b2mb(n)`                   | [`b2mb`]                                   |
//!
//! fastai returns MB; memprobe returns bytes (use [`b2mb`] for fastai's
//! numbers). Conventions kept: no GPU gives zeros, an empty list or
//! `(None, 0)`; an invalid id gives zeros. Each result is an [`Outcome`]
//! whose `error` says why ([`ErrorKind::Unavailable`](memprobe_core::ErrorKind::Unavailable)
//! for no GPU, [`InvalidId`](memprobe_core::ErrorKind::InvalidId) for a bad
//! id, [`GpuLost`](memprobe_core::ErrorKind::GpuLost), ...).
//!
//! "The current device" is [`Gpus::current_device`]: memprobe's own setting
//! (default 0) with NVML, `cudaGetDevice` with the CUDA runtime backend.
//! The free functions use [`Gpus::shared`]; the same calls exist as methods
//! on any [`Gpus`].

use crate::cache_release::release_caches;
use crate::device::DeviceHandle;
use crate::gpus::Gpus;
use crate::memory::GpuMemory;
use crate::outcome::Outcome;
use memprobe_core::Result;

impl Gpus {
    #[inline]
    fn resolve(&self, id: Option<u32>) -> Result<&DeviceHandle> {
        let id = match id {
            Some(id) => id,
            None => self.current_device()?,
        };
        self.device_ref(id)
    }

    /// Every device's reading, or the reason there are no devices.
    fn read_all(&self) -> Result<Vec<Result<GpuMemory>>> {
        let n = self.device_count()?;
        if n == 0 {
            // The "no GPU" error, with its reason.
            self.device(0)?;
        }
        Ok((0..n)
            .map(|id| self.device_ref(id).and_then(|h| h.memory()))
            .collect())
    }

    /// Total, free, used and reserved memory of device `id` (the current
    /// device when `None`). No GPU or an invalid id: [`GpuMemory::ZERO`] and
    /// the error.
    #[inline]
    pub fn gpu_mem_get(&self, id: Option<u32>) -> Outcome<GpuMemory> {
        Outcome::from_result(self.resolve(id).and_then(|h| h.memory()))
    }

    /// Every device's memory, in id order. No GPU: an empty list and the
    /// reason. A device that cannot be read is [`GpuMemory::ZERO`] in the
    /// list, and the first such error is reported.
    pub fn gpu_mem_get_all(&self) -> Outcome<Vec<GpuMemory>> {
        match self.read_all() {
            Err(e) => Outcome::failed(Vec::new(), e),
            Ok(readings) => {
                let mut error = None;
                let value = readings
                    .into_iter()
                    .map(|r| {
                        r.unwrap_or_else(|e| {
                            error.get_or_insert(e);
                            GpuMemory::ZERO
                        })
                    })
                    .collect();
                Outcome { value, error }
            }
        }
    }

    /// Free bytes on the current device, caches untouched.
    pub fn gpu_mem_get_free(&self) -> Outcome<u64> {
        Outcome::from_result(
            self.resolve(None)
                .and_then(|h| h.query_memory())
                .map(|(_, free, _, _)| free),
        )
    }

    /// Free bytes on the current device after the cache-release callback
    /// ([`set_cache_release`](crate::set_cache_release)). If the callback
    /// fails: 0 and its error.
    pub fn gpu_mem_get_free_no_cache(&self) -> Outcome<u64> {
        match release_caches() {
            Ok(()) => self.gpu_mem_get_free(),
            Err(e) => Outcome::failed(0, e),
        }
    }

    /// Used bytes on the current device, caches untouched.
    pub fn gpu_mem_get_used(&self) -> Outcome<u64> {
        Outcome::from_result(
            self.resolve(None)
                .and_then(|h| h.query_memory())
                .map(|(_, _, used, _)| used),
        )
    }

    /// Used bytes on the current device after the cache-release callback.
    /// If the callback fails: 0 and its error.
    pub fn gpu_mem_get_used_no_cache(&self) -> Outcome<u64> {
        match release_caches() {
            Ok(()) => self.gpu_mem_get_used(),
            Err(e) => Outcome::failed(0, e),
        }
    }

    /// The first device with the most free memory, and its free bytes. No
    /// GPU (or none readable): `(None, 0)` and the reason. Devices that
    /// cannot be read are skipped; the first such error is reported.
    pub fn gpu_with_max_free_mem(&self) -> Outcome<(Option<u32>, u64)> {
        let readings = match self.read_all() {
            Ok(r) => r,
            Err(e) => return Outcome::failed((None, 0), e),
        };
        let mut best: Option<(u32, u64)> = None;
        let mut error = None;
        for (id, r) in readings.into_iter().enumerate() {
            match r {
                Ok(m) if best.map_or(true, |(_, free)| m.free > free) => {
                    best = Some((id as u32, m.free))
                }
                Ok(_) => {}
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        match best {
            Some((id, free)) => Outcome {
                value: (Some(id), free),
                error,
            },
            None => Outcome {
                value: (None, 0),
                error,
            },
        }
    }
}

/// [`Gpus::gpu_mem_get`] on [`Gpus::shared`].
pub fn gpu_mem_get(id: Option<u32>) -> Outcome<GpuMemory> {
    Gpus::shared().gpu_mem_get(id)
}

/// [`Gpus::gpu_mem_get_all`] on [`Gpus::shared`].
pub fn gpu_mem_get_all() -> Outcome<Vec<GpuMemory>> {
    Gpus::shared().gpu_mem_get_all()
}

/// [`Gpus::gpu_mem_get_free`] on [`Gpus::shared`].
pub fn gpu_mem_get_free() -> Outcome<u64> {
    Gpus::shared().gpu_mem_get_free()
}

/// [`Gpus::gpu_mem_get_free_no_cache`] on [`Gpus::shared`].
pub fn gpu_mem_get_free_no_cache() -> Outcome<u64> {
    Gpus::shared().gpu_mem_get_free_no_cache()
}

/// [`Gpus::gpu_mem_get_used`] on [`Gpus::shared`].
pub fn gpu_mem_get_used() -> Outcome<u64> {
    Gpus::shared().gpu_mem_get_used()
}

/// [`Gpus::gpu_mem_get_used_no_cache`] on [`Gpus::shared`].
pub fn gpu_mem_get_used_no_cache() -> Outcome<u64> {
    Gpus::shared().gpu_mem_get_used_no_cache()
}

/// Used bytes of a pre-resolved device ([`Gpus::device`]): no lookup, no
/// cache release, no timestamps — one driver query. On failure: 0 and the
/// error.
#[doc(alias = "nvmlDeviceGetMemoryInfo_v2")]
#[inline]
pub fn gpu_mem_get_used_fast(handle: &DeviceHandle) -> Outcome<u64> {
    match handle.query_memory() {
        Ok((_, _, used, _)) => Outcome::ok(used),
        Err(e) => Outcome::failed(0, e),
    }
}

/// [`Gpus::gpu_with_max_free_mem`] on [`Gpus::shared`].
pub fn gpu_with_max_free_mem() -> Outcome<(Option<u32>, u64)> {
    Gpus::shared().gpu_with_max_free_mem()
}

/// [`Gpus::preload`] on [`Gpus::shared`] (fastai's `preload_pytorch`).
///
/// # Errors
/// As [`Gpus::preload`].
#[doc(alias = "preload_pytorch")]
pub fn preload() -> Result<()> {
    Gpus::shared().preload()
}

/// Bytes to whole MiB, rounded down (fastai's `b2mb`: `int(bytes / 2**20)`).
pub fn b2mb(bytes: u64) -> u64 {
    bytes >> 20
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b2mb_rounds_down() {
        assert_eq!(b2mb(0), 0);
        assert_eq!(b2mb((1 << 20) - 1), 0);
        assert_eq!(b2mb(1 << 20), 1);
        assert_eq!(b2mb(5 * (1 << 20) + 12345), 5);
        assert_eq!(b2mb(u64::MAX), u64::MAX >> 20);
    }
}
