//! One GPU as CUDA numbers it: a resolved handle that reads its memory.

use crate::cudart::CudartLibrary;
use crate::memory::GpuMemory;
use crate::nvml::{NvmlLibrary, RawDevice};
use crate::own_pid::{own_usage, OwnPids};
use crate::process::{GpuProcess, GpuProcessMemory};
use memprobe_core::{monotonic_ns, Error, ErrorKind, Result};
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What is known about a device besides its memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The CUDA ordinal memprobe uses for it (after `CUDA_VISIBLE_DEVICES`).
    pub id: u32,
    /// The product name (`NVIDIA H100 80GB HBM3`), when the backend says.
    pub name: Option<String>,
    /// `GPU-...` or `MIG-...`, when the backend says (NVML does).
    pub uuid: Option<String>,
    /// The PCI bus id, when the backend says (the CUDA runtime does).
    pub pci_bus_id: Option<String>,
    /// The NVML index of a whole physical GPU (PCI bus order); `None` for a
    /// MIG instance or the CUDA runtime backend.
    pub nvml_index: Option<u32>,
}

/// How a device is read.
pub(crate) enum Reader {
    /// Through NVML; `v2_refused` remembers a driver that refused the v2
    /// memory query, so later reads go straight to v1.
    Nvml {
        lib: &'static NvmlLibrary,
        device: RawDevice,
        v2_refused: AtomicBool,
    },
    /// Through the CUDA runtime, by ordinal.
    Cudart {
        lib: &'static CudartLibrary,
        ordinal: u32,
    },
}

/// What a handle points to.
pub(crate) struct DeviceSlot {
    pub(crate) info: DeviceInfo,
    pub(crate) reader: Reader,
}

/// A pre-resolved device: reading through it does no lookup (fastai's
/// `gpu_handle`). Cheap to clone; `Send` and `Sync`.
#[derive(Clone)]
pub struct DeviceHandle {
    slot: Arc<DeviceSlot>,
}

impl fmt::Debug for DeviceHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceHandle")
            .field("info", &self.slot.info)
            .finish()
    }
}

impl DeviceHandle {
    pub(crate) fn new(info: DeviceInfo, reader: Reader) -> Self {
        DeviceHandle {
            slot: Arc::new(DeviceSlot { info, reader }),
        }
    }

    /// The device's id (CUDA ordinal as memprobe numbers it).
    pub fn id(&self) -> u32 {
        self.slot.info.id
    }

    /// Name, UUID, PCI bus id, NVML index.
    pub fn info(&self) -> &DeviceInfo {
        &self.slot.info
    }

    /// Reads the device's memory now.
    ///
    /// NVML: `nvmlDeviceGetMemoryInfo_v2` (with `reserved`), falling back to
    /// `nvmlDeviceGetMemoryInfo` where v2 is missing or refused. CUDA
    /// runtime: `cudaMemGetInfo` on this device, restoring the calling
    /// thread's current device afterwards.
    ///
    /// # Errors
    /// [`ErrorKind::GpuLost`] when the GPU fell off the bus;
    /// [`ErrorKind::Unsupported`], [`ErrorKind::Unavailable`] and others as
    /// the driver says.
    #[doc(alias = "nvmlDeviceGetMemoryInfo_v2")]
    #[doc(alias = "nvmlDeviceGetMemoryInfo")]
    #[doc(alias = "cudaMemGetInfo")]
    #[inline]
    pub fn memory(&self) -> Result<GpuMemory> {
        let start = monotonic_ns();
        let (total, free, used, reserved) = self.query_memory()?;
        let end = monotonic_ns();
        Ok(GpuMemory {
            total,
            free,
            used,
            reserved,
            taken_at_ns: start,
            read_ns: end.saturating_sub(start),
        })
    }

    /// The memory query alone, unstamped: `(total, free, used, reserved)`.
    /// For the readings that return a single number (fastai's `*_fast`,
    /// `gpu_mem_get_free`, `gpu_mem_get_used`), which need no timestamps.
    #[inline]
    pub(crate) fn query_memory(&self) -> Result<(u64, u64, u64, Option<u64>)> {
        match &self.slot.reader {
            Reader::Nvml {
                lib,
                device,
                v2_refused,
            } => {
                let m = lib.memory(*device, v2_refused)?;
                Ok((m.total, m.free, m.used, m.reserved))
            }
            Reader::Cudart { lib, ordinal } => {
                let (free, total) = lib.mem_get_info(*ordinal)?;
                Ok((total, free, total.saturating_sub(free), None))
            }
        }
    }

    /// Every process on the device: NVML's compute list (newest API
    /// version the library has) and its graphics list. PIDs are as the
    /// driver reports them (see the crate documentation on namespaces).
    ///
    /// # Errors
    /// [`ErrorKind::Unsupported`] with the CUDA runtime backend, which
    /// cannot list processes; driver errors as for [`memory`](Self::memory).
    #[doc(alias = "nvmlDeviceGetComputeRunningProcesses_v3")]
    #[doc(alias = "nvmlDeviceGetComputeRunningProcesses")]
    #[doc(alias = "nvmlDeviceGetGraphicsRunningProcesses_v3")]
    pub fn processes(&self) -> Result<Vec<GpuProcess>> {
        match &self.slot.reader {
            Reader::Nvml { lib, device, .. } => lib.processes(*device),
            Reader::Cudart { .. } => Err(Error::new(
                ErrorKind::Unsupported,
                "the CUDA runtime backend cannot list processes; use the NVML backend",
            )),
        }
    }

    /// This process's memory on the device: its entries in
    /// [`processes`](Self::processes), matched by host PID where `/proc`
    /// shows it, else by `getpid()`. 0 when this process has no context on
    /// the device.
    ///
    /// # Errors
    /// As for [`processes`](Self::processes); [`ErrorKind::Unsupported`]
    /// when the driver does not report per-process memory.
    #[doc(alias = "nvmlDeviceGetComputeRunningProcesses_v3")]
    pub fn process_memory(&self) -> Result<GpuProcessMemory> {
        let start = monotonic_ns();
        let list = self.processes()?;
        let used = own_usage(&list, OwnPids::current())?;
        let end = monotonic_ns();
        Ok(GpuProcessMemory {
            used,
            taken_at_ns: start,
            read_ns: end.saturating_sub(start),
        })
    }
}
