//! The GPUs this process sees, through one backend.

use crate::config::{GpuBackend, GpuConfig};
use crate::cudart::{self, CudartLibrary};
use crate::device::{DeviceHandle, DeviceInfo, Reader};
use crate::nvml::{self, NvmlLibrary};
use crate::visible_devices::{map_visible_devices, VisibleDevice};
use memprobe_core::internal::lock::Lock;
use memprobe_core::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

/// The GPUs of this process, numbered as CUDA numbers them, read through
/// one backend (NVML or the CUDA runtime), or none with the reason why.
///
/// Open one explicitly with [`Gpus::open`], from the environment with
/// [`Gpus::from_env`], or use the process-wide [`Gpus::shared`] (what the
/// free functions of this crate use). `Send` and `Sync`.
pub struct Gpus {
    state: State,
    /// The memprobe-side current device (NVML backend).
    current: AtomicU32,
    cudart_path: Option<PathBuf>,
}

enum State {
    /// No backend; the error says why.
    Off(Error),
    Nvml {
        lib: &'static NvmlLibrary,
        devices: Vec<Result<DeviceHandle>>,
        none_reason: String,
    },
    Cudart {
        lib: &'static CudartLibrary,
        devices: Vec<DeviceHandle>,
    },
}

impl fmt::Debug for Gpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Gpus");
        d.field("backend", &self.backend());
        match &self.state {
            State::Off(e) => d.field("unavailable", e),
            State::Nvml { lib, devices, .. } => {
                d.field("library", &lib.path()).field("devices", devices)
            }
            State::Cudart { lib, devices } => {
                d.field("library", &lib.path()).field("devices", devices)
            }
        };
        d.finish()
    }
}

/// The process-wide instance once opened: leaked, never freed, so a
/// reference to it is `'static`. Read lock-free on every call.
static SHARED: AtomicPtr<Gpus> = AtomicPtr::new(std::ptr::null_mut());
/// Serialises opening the process-wide instance. A fork-gated [`Lock`]
/// (not a `OnceLock`): NVML initialises while it is held, and `fork()` waits
/// for that instead of leaving the child an initialisation that never ends.
static SHARED_INIT: Lock<()> = Lock::new(());

impl Gpus {
    /// Opens the GPUs as `config` says.
    ///
    /// - [`GpuBackend::Auto`]: NVML; if it cannot be loaded or initialised,
    ///   a `Gpus` with no devices whose [`unavailable_reason`](Self::unavailable_reason)
    ///   says why (never the CUDA runtime: see [`GpuBackend::Auto`]).
    /// - [`GpuBackend::Nvml`] / [`GpuBackend::Cudart`]: that backend, or the error.
    /// - [`GpuBackend::None`]: no devices.
    ///
    /// # Errors
    /// Only for an explicit backend: [`ErrorKind::Unavailable`] when its
    /// library is absent, incomplete or fails to initialise, or there is no
    /// GPU (CUDA runtime); other kinds as the library says.
    pub fn open(config: GpuConfig) -> Result<Gpus> {
        let state = match config.backend {
            GpuBackend::None => State::Off(Error::unavailable(
                "GPU readings are disabled (GPU backend \"none\")",
            )),
            GpuBackend::Nvml => open_nvml(&config)?,
            GpuBackend::Cudart => open_cudart(&config)?,
            GpuBackend::Auto => open_nvml(&config).unwrap_or_else(|e| {
                State::Off(Error::new(
                    e.kind(),
                    format!(
                        "no GPU readings: {} (the CUDA runtime is not tried automatically because it \
                         creates a CUDA context; set MEMPROBE_GPU_BACKEND=cudart to use it)",
                        e.message()
                    ),
                ))
            }),
        };
        Ok(Gpus {
            state,
            current: AtomicU32::new(0),
            cudart_path: config.cudart_path,
        })
    }

    /// Opens the GPUs as the environment says ([`GpuConfig::from_env`]).
    ///
    /// # Errors
    /// An unknown `MEMPROBE_GPU_BACKEND` ([`ErrorKind::InvalidArgument`]),
    /// then as [`open`](Self::open).
    pub fn from_env() -> Result<Gpus> {
        Gpus::open(GpuConfig::from_env()?)
    }

    /// The process-wide instance, opened from the environment on first use
    /// (unless [`configure_shared`](Self::configure_shared) opened it first).
    /// If that fails, it has no devices and [`unavailable_reason`](Self::unavailable_reason)
    /// holds the error.
    #[inline]
    pub fn shared() -> &'static Gpus {
        let p = SHARED.load(Ordering::Acquire);
        if p.is_null() {
            return Gpus::open_shared(None).unwrap_or_else(|e| Box::leak(Box::new(Gpus::off(e))));
        }
        // SAFETY: a non-null SHARED comes from Box::leak in open_shared and is never freed.
        unsafe { &*p }
    }

    /// Opens the process-wide instance ([`shared`](Self::shared)) with
    /// `config` instead of the environment. Call it before anything uses the
    /// shared instance (the free functions of this crate, the GPU samplers
    /// of [`device_sampler`](crate::device_sampler), the C ABI).
    ///
    /// # Errors
    /// [`ErrorKind::WrongOrder`] when the shared instance is already open;
    /// else as [`open`](Self::open), and then nothing is set: the call may be
    /// repeated (e.g. with another library path), and if it is not, the
    /// first use opens the instance from the environment.
    pub fn configure_shared(config: GpuConfig) -> Result<&'static Gpus> {
        Gpus::open_shared(Some(config))
    }

    #[cold]
    #[inline(never)]
    fn open_shared(config: Option<GpuConfig>) -> Result<&'static Gpus> {
        let _guard = SHARED_INIT.lock()?;
        let p = SHARED.load(Ordering::Acquire);
        if !p.is_null() {
            return match config {
                // SAFETY: as in `shared`.
                None => Ok(unsafe { &*p }),
                Some(_) => Err(Error::wrong_order(
                    "the GPUs are already open: configure them before the first GPU call",
                )),
            };
        }
        let gpus = match config {
            None => Gpus::from_env().unwrap_or_else(Gpus::off),
            Some(config) => Gpus::open(config)?,
        };
        let gpus: &'static Gpus = Box::leak(Box::new(gpus));
        SHARED.store(std::ptr::from_ref(gpus).cast_mut(), Ordering::Release);
        Ok(gpus)
    }

    /// No backend, because of `reason`.
    fn off(reason: Error) -> Gpus {
        Gpus {
            state: State::Off(reason),
            current: AtomicU32::new(0),
            cudart_path: None,
        }
    }

    /// The backend in use: `Nvml`, `Cudart`, or `None` when there is none.
    pub fn backend(&self) -> GpuBackend {
        match self.state {
            State::Off(_) => GpuBackend::None,
            State::Nvml { .. } => GpuBackend::Nvml,
            State::Cudart { .. } => GpuBackend::Cudart,
        }
    }

    /// Why there is no backend; `None` when there is one (even with 0 devices).
    pub fn unavailable_reason(&self) -> Option<&Error> {
        match &self.state {
            State::Off(e) => Some(e),
            _ => None,
        }
    }

    /// The path or name of the loaded library, if any.
    pub fn library_path(&self) -> Option<&str> {
        match &self.state {
            State::Off(_) => None,
            State::Nvml { lib, .. } => Some(lib.path()),
            State::Cudart { lib, .. } => Some(lib.path()),
        }
    }

    /// How many devices this process sees (after `CUDA_VISIBLE_DEVICES`).
    ///
    /// # Errors
    /// The [`unavailable_reason`](Self::unavailable_reason) when there is no backend.
    #[doc(alias = "nvmlDeviceGetCount_v2")]
    #[doc(alias = "cudaGetDeviceCount")]
    pub fn device_count(&self) -> Result<u32> {
        match &self.state {
            State::Off(e) => Err(e.clone()),
            State::Nvml { devices, .. } => Ok(devices.len() as u32),
            State::Cudart { devices, .. } => Ok(devices.len() as u32),
        }
    }

    /// The device with CUDA ordinal `id`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidId`] when there is no such device;
    /// [`ErrorKind::Unavailable`] when there is no GPU at all; the
    /// enumeration error (e.g. [`ErrorKind::GpuLost`]) for a device NVML
    /// could not open.
    #[doc(alias = "nvmlDeviceGetHandleByIndex_v2")]
    #[doc(alias = "nvmlDeviceGetHandleByUUID")]
    pub fn device(&self, id: u32) -> Result<DeviceHandle> {
        self.device_ref(id).cloned()
    }

    /// As [`device`](Self::device), borrowed (no reference count traffic).
    ///
    /// # Errors
    /// As [`device`](Self::device).
    #[inline]
    pub fn device_ref(&self, id: u32) -> Result<&DeviceHandle> {
        match &self.state {
            State::Nvml { devices, .. } => match devices.get(id as usize) {
                Some(Ok(h)) => Ok(h),
                _ => Err(self.device_error(id)),
            },
            State::Cudart { devices, .. } => devices
                .get(id as usize)
                .ok_or_else(|| self.device_error(id)),
            State::Off(_) => Err(self.device_error(id)),
        }
    }

    /// Why `device(id)` fails.
    #[cold]
    #[inline(never)]
    fn device_error(&self, id: u32) -> Error {
        match &self.state {
            State::Off(e) => e.clone(),
            State::Nvml {
                devices,
                none_reason,
                ..
            } => match devices.get(id as usize) {
                Some(Err(e)) => e.clone(),
                _ => no_device(id, devices.len(), none_reason),
            },
            State::Cudart { devices, .. } => {
                no_device(id, devices.len(), "the CUDA runtime reports no GPU")
            }
        }
    }

    /// Name, UUID and bus id of every device that could be opened.
    pub fn device_infos(&self) -> Vec<DeviceInfo> {
        match &self.state {
            State::Off(_) => Vec::new(),
            State::Nvml { devices, .. } => {
                devices.iter().flatten().map(|h| h.info().clone()).collect()
            }
            State::Cudart { devices, .. } => devices.iter().map(|h| h.info().clone()).collect(),
        }
    }

    /// The current device: with NVML, a memprobe-side setting (default 0,
    /// changed by [`set_current_device`](Self::set_current_device); NVML
    /// cannot see the framework's current device); with the CUDA runtime,
    /// `cudaGetDevice` on the calling thread.
    ///
    /// # Errors
    /// The [`unavailable_reason`](Self::unavailable_reason) when there is no
    /// backend; the runtime's error for `cudaGetDevice`.
    #[doc(alias = "cudaGetDevice")]
    pub fn current_device(&self) -> Result<u32> {
        match &self.state {
            State::Off(e) => Err(e.clone()),
            State::Nvml { .. } => Ok(self.current.load(Ordering::Relaxed)),
            State::Cudart { lib, .. } => lib.current_device(),
        }
    }

    /// Sets the current device (NVML: memprobe's setting, for every thread;
    /// CUDA runtime: `cudaSetDevice` on the calling thread).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidId`] when `id` is not a device.
    #[doc(alias = "cudaSetDevice")]
    pub fn set_current_device(&self, id: u32) -> Result<()> {
        let count = self.device_count()?;
        if id >= count {
            return Err(no_device(id, count as usize, "no GPU is visible"));
        }
        match &self.state {
            State::Cudart { lib, .. } => lib.set_current_device(id),
            _ => {
                self.current.store(id, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Creates the CUDA context on the current device now, on purpose, so
    /// later readings do not change when the framework creates it (fastai's
    /// `preload_pytorch`): `cudaSetDevice(current)` + `cudaFree(0)`, then
    /// the calling thread's previous device is restored. With the NVML
    /// backend this loads the CUDA runtime ([`GpuConfig::cudart_path`] or
    /// the soname search) just for this; the runtime numbers devices by the
    /// real `CUDA_VISIBLE_DEVICES`.
    ///
    /// # Errors
    /// No GPU, an invalid current device, or the runtime cannot be loaded
    /// ([`ErrorKind::Unavailable`]).
    #[doc(alias = "cudaFree")]
    #[doc(alias = "preload_pytorch")]
    pub fn preload(&self) -> Result<()> {
        let id = self.current_device()?;
        self.device(id)?;
        match &self.state {
            State::Off(e) => Err(e.clone()),
            State::Cudart { lib, .. } => lib.create_context(id),
            State::Nvml { .. } => cudart::load(self.cudart_path.as_deref())?.create_context(id),
        }
    }
}

fn no_device(id: u32, count: usize, none_reason: &str) -> Error {
    if count == 0 {
        Error::unavailable(format!("no GPU {id}: {none_reason}"))
    } else {
        Error::new(
            ErrorKind::InvalidId,
            format!("no GPU {id}: this process sees {count} (ids 0..{count})"),
        )
    }
}

fn open_nvml(config: &GpuConfig) -> Result<State> {
    let lib = nvml::load(config.nvml_path.as_deref())?;
    let count = lib.device_count()?;
    // Per physical device: the handle, its UUID and name (where readable).
    type Physical = (nvml::RawDevice, Option<String>, Option<String>);
    let physical: Vec<Result<Physical>> = (0..count)
        .map(|i| {
            let d = lib.device_by_index(i)?;
            Ok((d, lib.uuid(d).ok(), lib.name(d).ok()))
        })
        .collect();
    let uuids: Vec<Option<&str>> = physical
        .iter()
        .map(|p| p.as_ref().ok().and_then(|(_, uuid, _)| uuid.as_deref()))
        .collect();
    let mut migs = HashMap::new();
    let visible = map_visible_devices(config.visible_devices.as_deref(), &uuids, |uuid| {
        lib.device_by_uuid(uuid)
            .map(|d| migs.insert(uuid.to_string(), d))
            .is_ok()
    });
    let devices = visible
        .into_iter()
        .enumerate()
        .map(|(id, v)| {
            let id = id as u32;
            let (device, uuid, name, nvml_index) = match v {
                VisibleDevice::Physical(i) => {
                    let (d, uuid, name) = physical[i as usize].clone()?;
                    (d, uuid, name, Some(i))
                }
                VisibleDevice::Mig(uuid) => {
                    let d = migs[&uuid];
                    (d, Some(lib.uuid(d).unwrap_or(uuid)), lib.name(d).ok(), None)
                }
            };
            let info = DeviceInfo {
                id,
                name,
                uuid,
                pci_bus_id: None,
                nvml_index,
            };
            Ok(DeviceHandle::new(
                info,
                Reader::Nvml {
                    lib,
                    device,
                    v2_refused: AtomicBool::new(false),
                },
            ))
        })
        .collect();
    let none_reason = match &config.visible_devices {
        Some(spec) if count > 0 => format!("CUDA_VISIBLE_DEVICES={spec:?} hides every GPU"),
        _ => "NVML reports no GPU".to_string(),
    };
    Ok(State::Nvml {
        lib,
        devices,
        none_reason,
    })
}

fn open_cudart(config: &GpuConfig) -> Result<State> {
    let lib = cudart::load(config.cudart_path.as_deref())?;
    let count = lib.device_count()?;
    let devices = (0..count)
        .map(|ordinal| {
            let info = DeviceInfo {
                id: ordinal,
                name: None,
                uuid: None,
                pci_bus_id: lib.pci_bus_id(ordinal),
                nvml_index: None,
            };
            DeviceHandle::new(info, Reader::Cudart { lib, ordinal })
        })
        .collect();
    Ok(State::Cudart { lib, devices })
}
