//! GPUs through the C ABI: fastai's `utils.mem` readings in bytes, device
//! handles, GPU sources for windows, traces and the monitor, the
//! cache-release callback, and the choice of backend.
//!
//! Every reading follows fastai's conventions as memprobe-gpu's [`Outcome`]
//! does: no GPU gives zeros (an empty list, no device), an invalid id gives
//! zeros, and the status says why. The readings therefore write their
//! outputs even when they fail, unlike the rest of the C ABI; calls that
//! create handles leave `*out` untouched on failure as everywhere else.

use crate::boundary::{
    entry_point, free_point, null, opt_text, out, out_array, FfiError, FfiResult, UserData,
};
use crate::handle::{Ids, Table};
use crate::source::{memprobe_source, publish};
use crate::status::memprobe_status;
use memprobe_core::{Error, ErrorKind, Source};
use memprobe_gpu::{DeviceHandle, GpuBackend, GpuConfig, GpuMemory, Gpus, Outcome};
use std::ffi::{c_char, c_void};
use std::path::PathBuf;

/// A GPU backend (`memprobe_gpu_configure`, `memprobe_gpu_get_backend`,
/// `memprobe_gpu_info.backend`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum memprobe_gpu_backend {
    /// NVML if it loads and initialises, else no GPU readings; the CUDA
    /// runtime is never tried automatically (it would create a context).
    Auto = 0,
    /// NVML (libnvidia-ml): no CUDA context, fork-safe. The default.
    Nvml = 1,
    /// The CUDA runtime (libcudart): creates a CUDA context (hundreds of
    /// MB) on each device it reads, and CUDA then fails in children forked
    /// afterwards. Opt-in.
    Cudart = 2,
    /// No GPU readings (configure), or no backend in use (get_backend).
    None = 3,
}

impl memprobe_gpu_backend {
    fn from_u32(v: u32) -> FfiResult<GpuBackend> {
        match v {
            0 => Ok(GpuBackend::Auto),
            1 => Ok(GpuBackend::Nvml),
            2 => Ok(GpuBackend::Cudart),
            3 => Ok(GpuBackend::None),
            other => Err(FfiError::new(
                memprobe_status::InvalidArgument,
                format!("unknown memprobe_gpu_backend {other}"),
            )),
        }
    }

    fn code(b: GpuBackend) -> u32 {
        let c = match b {
            GpuBackend::Auto => memprobe_gpu_backend::Auto,
            GpuBackend::Nvml => memprobe_gpu_backend::Nvml,
            GpuBackend::Cudart => memprobe_gpu_backend::Cudart,
            GpuBackend::None => memprobe_gpu_backend::None,
        };
        c as u32
    }
}

/// `memprobe_gpu_mem_get` id: the current device (memprobe_gpu_set_current_device;
/// with the CUDA runtime backend, the calling thread's cudaGetDevice).
pub const MEMPROBE_GPU_CURRENT_DEVICE: i64 = -1;
/// `memprobe_gpu_with_max_free_mem` id when no device could be read.
pub const MEMPROBE_GPU_NO_DEVICE: i64 = -1;

/// `memprobe_gpu_memory.valid`: `total`, `free`, `used`, `taken_at_ns` and
/// `read_ns` hold a reading (clear: the zeros of a failed reading).
pub const MEMPROBE_GPU_MEMORY_READ: u32 = 1;
/// `memprobe_gpu_memory.valid`: `reserved` holds a value (NVML's v2 query).
pub const MEMPROBE_GPU_MEMORY_RESERVED: u32 = 2;

/// One reading of a GPU's memory, in bytes (fastai's `GPUMemory(total,
/// free, used)` plus the driver's reservation). With NVML's v2 query,
/// `total = used + free + reserved` and `used` matches nvidia-smi; with the
/// v1 query (old drivers) `reserved` is not valid and `used` includes it;
/// the CUDA runtime reports `used = total - free`. A failed reading is all
/// zeros with `valid == 0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct memprobe_gpu_memory {
    /// The device's memory size.
    pub total: u64,
    /// Bytes still available for allocation.
    pub free: u64,
    /// Bytes in use by every process (and their contexts).
    pub used: u64,
    /// Bytes the driver sets aside; valid if `valid & MEMPROBE_GPU_MEMORY_RESERVED`.
    pub reserved: u64,
    /// Bit set of MEMPROBE_GPU_MEMORY_* flags.
    pub valid: u32,
    /// When the reading was taken, CLOCK_MONOTONIC nanoseconds.
    pub taken_at_ns: u64,
    /// How long the driver query took, nanoseconds.
    pub read_ns: u64,
}

impl From<GpuMemory> for memprobe_gpu_memory {
    fn from(m: GpuMemory) -> Self {
        if m == GpuMemory::ZERO {
            return memprobe_gpu_memory::default();
        }
        let mut valid = MEMPROBE_GPU_MEMORY_READ;
        if m.reserved.is_some() {
            valid |= MEMPROBE_GPU_MEMORY_RESERVED;
        }
        memprobe_gpu_memory {
            total: m.total,
            free: m.free,
            used: m.used,
            reserved: m.reserved.unwrap_or(0),
            valid,
            taken_at_ns: m.taken_at_ns,
            read_ns: m.read_ns,
        }
    }
}

/// `memprobe_gpu_info.valid`: `name` holds the product name.
pub const MEMPROBE_GPU_INFO_NAME: u32 = 1;
/// `memprobe_gpu_info.valid`: `uuid` holds the `GPU-...` or `MIG-...` UUID.
pub const MEMPROBE_GPU_INFO_UUID: u32 = 2;
/// `memprobe_gpu_info.valid`: `pci_bus_id` holds the PCI bus id.
pub const MEMPROBE_GPU_INFO_PCI_BUS_ID: u32 = 4;
/// `memprobe_gpu_info.valid`: `nvml_index` holds the NVML index (a whole GPU
/// under NVML; not a MIG instance, not the CUDA runtime backend).
pub const MEMPROBE_GPU_INFO_NVML_INDEX: u32 = 8;

/// What is known about a device. Strings are NUL-terminated and empty when
/// unknown (their bit clear in `valid`); longer ones are cut to fit.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct memprobe_gpu_info {
    /// The device id memprobe uses: the CUDA ordinal as this process sees
    /// it (after CUDA_VISIBLE_DEVICES).
    pub id: u32,
    /// The memprobe_gpu_backend reading the device.
    pub backend: u32,
    /// The NVML index (PCI bus order); valid if `valid & MEMPROBE_GPU_INFO_NVML_INDEX`.
    pub nvml_index: u32,
    /// Bit set of MEMPROBE_GPU_INFO_* flags.
    pub valid: u32,
    /// The product name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: [c_char; 96],
    /// `GPU-<uuid>` or `MIG-<uuid>`.
    pub uuid: [c_char; 96],
    /// The PCI bus id, e.g. "00000000:3B:00.0".
    pub pci_bus_id: [c_char; 32],
}

impl memprobe_gpu_info {
    const ZERO: memprobe_gpu_info = memprobe_gpu_info {
        id: 0,
        backend: 0,
        nvml_index: 0,
        valid: 0,
        name: [0; 96],
        uuid: [0; 96],
        pci_bus_id: [0; 32],
    };
}

/// Copies `s` into `dst` with a NUL, cut at a character boundary to fit.
/// Returns `flag` when `s` is present, else 0.
fn fill(dst: &mut [c_char], s: Option<&str>, flag: u32) -> u32 {
    let Some(s) = s else { return 0 };
    crate::boundary::copy_to_fixed(dst, s);
    flag
}

/// A pre-resolved GPU (fastai's `gpu_handle`): reading through it does no
/// lookup. Created by memprobe_gpu_device_open, released by
/// memprobe_gpu_device_free.
#[allow(non_camel_case_types)]
pub struct memprobe_gpu_device {
    _private: [u8; 0],
}

/// The ids of open device handles. Lookups take no lock: a handle names a
/// device of the process-wide [`Gpus`], which never changes once open.
static DEVICES: Table<u32, Ids> = Table::with_max(0x47, "memprobe_gpu_device", 4096);

fn device(h: *const memprobe_gpu_device) -> FfiResult<&'static DeviceHandle> {
    if h.is_null() {
        return Err(null("device"));
    }
    let id = DEVICES.get(h as usize)?;
    Ok(Gpus::shared().device_ref(id)?)
}

/// Writes an outcome's value through `write`, then turns its error into the status.
fn finish<T>(o: Outcome<T>, write: impl FnOnce(T)) -> FfiResult {
    write(o.value);
    match o.error {
        None => Ok(()),
        Some(e) => Err(e.into()),
    }
}

/// A C device id (`MEMPROBE_GPU_CURRENT_DEVICE` or an ordinal).
fn device_id(id: i64) -> FfiResult<Option<u32>> {
    if id == MEMPROBE_GPU_CURRENT_DEVICE {
        return Ok(None);
    }
    u32::try_from(id).map(Some).map_err(|_| {
        FfiError::new(
            memprobe_status::InvalidId,
            format!("no GPU {id}: ids are 0.. or MEMPROBE_GPU_CURRENT_DEVICE (-1)"),
        )
    })
}

/// Chooses the backend and libraries instead of the environment
/// (MEMPROBE_GPU_BACKEND, MEMPROBE_NVML_LIBRARY, MEMPROBE_CUDART_LIBRARY,
/// which are then ignored; CUDA_VISIBLE_DEVICES still applies). `backend`:
/// a memprobe_gpu_backend; `nvml_path` / `cudart_path` (nullable): the
/// libraries to load, NULL for the default names (libnvidia-ml.so.1; the
/// newest libcudart.so* found). Call it before any other memprobe_gpu_* call
/// and before a GPU source is created: afterwards MEMPROBE_STATUS_WRONG_ORDER.
/// An explicit backend whose library cannot be loaded is
/// MEMPROBE_STATUS_UNAVAILABLE and changes nothing (call again, or the first
/// GPU call uses the environment).
#[no_mangle]
pub extern "C" fn memprobe_gpu_configure(
    backend: u32,
    nvml_path: *const c_char,
    cudart_path: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_gpu_configure", || {
        let backend = memprobe_gpu_backend::from_u32(backend)?;
        let nvml_path = opt_text(nvml_path, "nvml_path")?.map(PathBuf::from);
        let cudart_path = opt_text(cudart_path, "cudart_path")?.map(PathBuf::from);
        let visible_devices = std::env::var_os(memprobe_gpu::ENV_CUDA_VISIBLE_DEVICES)
            .map(|v| v.to_string_lossy().into_owned());
        Gpus::configure_shared(GpuConfig {
            backend,
            nvml_path,
            cudart_path,
            visible_devices,
        })?;
        Ok(())
    })
}

/// The backend in use: MEMPROBE_GPU_BACKEND_NVML or _CUDART, or _NONE when
/// there is none (then memprobe_gpu_count says why). Opens the GPUs on first use.
#[no_mangle]
pub extern "C" fn memprobe_gpu_get_backend(out: *mut u32) -> memprobe_status {
    entry_point("memprobe_gpu_get_backend", || {
        let slot = self::out(out, "out")?;
        *slot = memprobe_gpu_backend::code(Gpus::shared().backend());
        Ok(())
    })
}

/// How many GPUs this process sees (after CUDA_VISIBLE_DEVICES); ids are
/// 0..count. No backend (no driver, MEMPROBE_GPU_BACKEND=none, ...): 0 and
/// MEMPROBE_STATUS_UNAVAILABLE, with the reason in memprobe_last_error. A
/// backend that sees no device: 0 and MEMPROBE_STATUS_OK.
#[no_mangle]
pub extern "C" fn memprobe_gpu_count(out: *mut u32) -> memprobe_status {
    entry_point("memprobe_gpu_count", || {
        let slot = self::out(out, "out")?;
        *slot = 0;
        *slot = Gpus::shared().device_count()?;
        Ok(())
    })
}

/// Name, UUID, PCI bus id, NVML index and backend of device `id`. No GPU:
/// zeros and MEMPROBE_STATUS_UNAVAILABLE; no such id: zeros and
/// MEMPROBE_STATUS_INVALID_ID; a device that could not be opened (lost):
/// zeros and its error.
#[no_mangle]
pub extern "C" fn memprobe_gpu_get_info(id: u32, out: *mut memprobe_gpu_info) -> memprobe_status {
    entry_point("memprobe_gpu_get_info", || {
        let slot = self::out(out, "out")?;
        *slot = memprobe_gpu_info::ZERO;
        let gpus = Gpus::shared();
        let info = gpus.device_ref(id)?.info();
        let mut i = memprobe_gpu_info::ZERO;
        i.id = info.id;
        i.backend = memprobe_gpu_backend::code(gpus.backend());
        i.valid |= fill(&mut i.name, info.name.as_deref(), MEMPROBE_GPU_INFO_NAME);
        i.valid |= fill(&mut i.uuid, info.uuid.as_deref(), MEMPROBE_GPU_INFO_UUID);
        i.valid |= fill(
            &mut i.pci_bus_id,
            info.pci_bus_id.as_deref(),
            MEMPROBE_GPU_INFO_PCI_BUS_ID,
        );
        if let Some(n) = info.nvml_index {
            i.nvml_index = n;
            i.valid |= MEMPROBE_GPU_INFO_NVML_INDEX;
        }
        *slot = i;
        Ok(())
    })
}

/// fastai's `gpu_mem_get(id)`: total, free, used and reserved memory of
/// device `id` (MEMPROBE_GPU_CURRENT_DEVICE for the current one). Failure:
/// `*out` is all zeros and the status says why: MEMPROBE_STATUS_UNAVAILABLE
/// (no GPU), MEMPROBE_STATUS_INVALID_ID (no such id),
/// MEMPROBE_STATUS_GPU_LOST, ...
#[no_mangle]
pub extern "C" fn memprobe_gpu_mem_get(id: i64, out: *mut memprobe_gpu_memory) -> memprobe_status {
    entry_point("memprobe_gpu_mem_get", || {
        let slot = self::out(out, "out")?;
        *slot = memprobe_gpu_memory::default();
        let id = device_id(id)?;
        finish(Gpus::shared().gpu_mem_get(id), |m| *slot = m.into())
    })
}

/// fastai's `gpu_mem_get_all()`: the reading of every device, in id order,
/// into `out[0..min(capacity, count)]`; entries past those are never
/// touched, whatever `capacity` claims. `*count` receives the number of
/// devices. A
/// device that cannot be read is all zeros (`valid == 0`) and the status is
/// the first such error. `capacity` smaller than the count: the first
/// `capacity` readings and MEMPROBE_STATUS_BUFFER_TOO_SMALL (`out` may be
/// NULL with `capacity` 0 to learn the count). No GPU: `*count` = 0 and
/// MEMPROBE_STATUS_UNAVAILABLE.
#[no_mangle]
pub extern "C" fn memprobe_gpu_mem_get_all(
    out: *mut memprobe_gpu_memory,
    capacity: usize,
    count: *mut usize,
) -> memprobe_status {
    entry_point("memprobe_gpu_mem_get_all", || {
        let count = self::out(count, "count")?;
        if out.is_null() && capacity > 0 {
            return Err(null("out"));
        }
        *count = 0;
        let all = Gpus::shared().gpu_mem_get_all();
        let n = all.value.len();
        *count = n;
        out_array(out, capacity, all.value.iter().map(|&m| m.into()), "out")?;
        if n > capacity && !(out.is_null() && capacity == 0) {
            return Err(FfiError::new(
                memprobe_status::BufferTooSmall,
                format!("{n} GPUs, room for {capacity}"),
            ));
        }
        finish(all, |_| ())
    })
}

/// fastai's `gpu_mem_get_free()`: free bytes on the current device, caches
/// untouched. Failure: 0 and the status.
#[no_mangle]
pub extern "C" fn memprobe_gpu_mem_get_free(out: *mut u64) -> memprobe_status {
    entry_point("memprobe_gpu_mem_get_free", || {
        let slot = self::out(out, "out")?;
        finish(Gpus::shared().gpu_mem_get_free(), |v| *slot = v)
    })
}

/// fastai's `gpu_mem_get_used()`: used bytes on the current device, caches
/// untouched. Failure: 0 and the status.
#[no_mangle]
pub extern "C" fn memprobe_gpu_mem_get_used(out: *mut u64) -> memprobe_status {
    entry_point("memprobe_gpu_mem_get_used", || {
        let slot = self::out(out, "out")?;
        finish(Gpus::shared().gpu_mem_get_used(), |v| *slot = v)
    })
}

/// fastai's `gpu_mem_get_free_no_cache()`: calls the cache-release callback
/// (memprobe_gpu_set_cache_release) first, then reads free bytes on the
/// current device. A failing callback: 0 and MEMPROBE_STATUS_UNAVAILABLE,
/// without reading.
#[no_mangle]
pub extern "C" fn memprobe_gpu_mem_get_free_no_cache(out: *mut u64) -> memprobe_status {
    entry_point("memprobe_gpu_mem_get_free_no_cache", || {
        let slot = self::out(out, "out")?;
        finish(Gpus::shared().gpu_mem_get_free_no_cache(), |v| *slot = v)
    })
}

/// fastai's `gpu_mem_get_used_no_cache()`: calls the cache-release callback
/// first, then reads used bytes on the current device. A failing callback:
/// 0 and MEMPROBE_STATUS_UNAVAILABLE, without reading.
#[no_mangle]
pub extern "C" fn memprobe_gpu_mem_get_used_no_cache(out: *mut u64) -> memprobe_status {
    entry_point("memprobe_gpu_mem_get_used_no_cache", || {
        let slot = self::out(out, "out")?;
        finish(Gpus::shared().gpu_mem_get_used_no_cache(), |v| *slot = v)
    })
}

/// fastai's `gpu_with_max_free_mem()`: the first device with the most free
/// memory (`*id`) and its free bytes (`*free`). No device readable:
/// MEMPROBE_GPU_NO_DEVICE and 0, with the status saying why. Devices that
/// cannot be read are skipped; the status is then the first such error
/// while `*id` and `*free` still name the best of the others.
#[no_mangle]
pub extern "C" fn memprobe_gpu_with_max_free_mem(id: *mut i64, free: *mut u64) -> memprobe_status {
    entry_point("memprobe_gpu_with_max_free_mem", || {
        let id = self::out(id, "id")?;
        let free = self::out(free, "free")?;
        finish(Gpus::shared().gpu_with_max_free_mem(), |(best, bytes)| {
            *id = best.map_or(MEMPROBE_GPU_NO_DEVICE, i64::from);
            *free = bytes;
        })
    })
}

/// The current device: memprobe's own setting with NVML (default 0, for
/// every thread), cudaGetDevice of the calling thread with the CUDA runtime
/// backend. No GPU: 0 and MEMPROBE_STATUS_UNAVAILABLE.
#[no_mangle]
pub extern "C" fn memprobe_gpu_get_current_device(out: *mut u32) -> memprobe_status {
    entry_point("memprobe_gpu_get_current_device", || {
        let slot = self::out(out, "out")?;
        *slot = 0;
        *slot = Gpus::shared().current_device()?;
        Ok(())
    })
}

/// Makes `id` the current device of the readings that take none (NVML:
/// memprobe's setting, for every thread; NVML cannot see the framework's
/// current device. CUDA runtime: cudaSetDevice on the calling thread).
/// MEMPROBE_STATUS_INVALID_ID when there is no such device.
#[no_mangle]
pub extern "C" fn memprobe_gpu_set_current_device(id: u32) -> memprobe_status {
    entry_point("memprobe_gpu_set_current_device", || {
        Ok(Gpus::shared().set_current_device(id)?)
    })
}

/// fastai's `preload_pytorch()`: creates the CUDA context on the current
/// device now (cudaFree(0) through the CUDA runtime, loaded for this even
/// under NVML), so later readings do not jump when the framework creates
/// it. MEMPROBE_STATUS_UNAVAILABLE when there is no GPU or no runtime.
#[no_mangle]
pub extern "C" fn memprobe_gpu_preload() -> memprobe_status {
    entry_point("memprobe_gpu_preload", || Ok(memprobe_gpu::preload()?))
}

// The cache-release callback type is the tracker's (one C typedef).
pub use crate::tracker::memprobe_release_fn;

/// Registers `callback(user_data)` as the cache-release callback that the
/// `*_no_cache` readings call first (one per process; it replaces the
/// previous one). NULL removes it. It runs on the thread of the reading and
/// may call memprobe (this function included), except the `*_no_cache`
/// readings, which return MEMPROBE_STATUS_WRONG_ORDER from inside it (as
/// every callback re-entry does) instead of calling it again; `user_data`
/// must stay valid until the callback is replaced or removed.
#[no_mangle]
pub extern "C" fn memprobe_gpu_set_cache_release(
    callback: memprobe_release_fn,
    user_data: *mut c_void,
) -> memprobe_status {
    entry_point("memprobe_gpu_set_cache_release", || {
        match callback {
            None => memprobe_gpu::clear_cache_release(),
            Some(f) => {
                let data = UserData::new(user_data);
                memprobe_gpu::set_cache_release(move || {
                    // SAFETY: the caller's function with the caller's data, per the contract above.
                    match unsafe { f(data.get()) } {
                        0 => Ok(()),
                        rc => Err(Error::new(
                            ErrorKind::Unavailable,
                            format!("the cache-release callback returned {rc}"),
                        )),
                    }
                });
            }
        }
        Ok(())
    })
}

/// Resolves device `id` once into a handle for memprobe_gpu_mem_get_used_fast
/// and friends (at most 4096 live handles; using one takes no lock). MEMPROBE_STATUS_UNAVAILABLE (no GPU), MEMPROBE_STATUS_INVALID_ID
/// (no such id), or the device's error; `*out` is then untouched.
#[no_mangle]
pub extern "C" fn memprobe_gpu_device_open(
    id: u32,
    out: *mut *mut memprobe_gpu_device,
) -> memprobe_status {
    entry_point("memprobe_gpu_device_open", || {
        let slot = self::out(out, "out")?;
        Gpus::shared().device_ref(id)?;
        *slot = DEVICES.insert(id)? as *mut memprobe_gpu_device;
        Ok(())
    })
}

/// fastai's `gpu_mem_get_used_fast(handle)`: used bytes of a pre-resolved
/// device — one driver query, no lookup, no timestamps. Failure (e.g.
/// MEMPROBE_STATUS_GPU_LOST): 0 and the status.
#[no_mangle]
pub extern "C" fn memprobe_gpu_mem_get_used_fast(
    device: *const memprobe_gpu_device,
    out: *mut u64,
) -> memprobe_status {
    entry_point("memprobe_gpu_mem_get_used_fast", || {
        let slot = self::out(out, "out")?;
        *slot = 0;
        let h = self::device(device)?;
        finish(memprobe_gpu::gpu_mem_get_used_fast(h), |v| *slot = v)
    })
}

/// The full reading of a pre-resolved device (as memprobe_gpu_mem_get).
/// Failure: zeros and the status.
#[no_mangle]
pub extern "C" fn memprobe_gpu_device_mem_get(
    device: *const memprobe_gpu_device,
    out: *mut memprobe_gpu_memory,
) -> memprobe_status {
    entry_point("memprobe_gpu_device_mem_get", || {
        let slot = self::out(out, "out")?;
        *slot = memprobe_gpu_memory::default();
        let h = self::device(device)?;
        finish(Outcome::from_result(h.memory()), |m| *slot = m.into())
    })
}

/// Bytes this process uses on a device, from the driver's process lists
/// (this process matched by its host PID inside containers); 0 when it has
/// no context there. Failure: 0 and the status (MEMPROBE_STATUS_UNSUPPORTED
/// with the CUDA runtime backend, which cannot list processes).
#[no_mangle]
pub extern "C" fn memprobe_gpu_device_process_used(
    device: *const memprobe_gpu_device,
    out: *mut u64,
) -> memprobe_status {
    entry_point("memprobe_gpu_device_process_used", || {
        let slot = self::out(out, "out")?;
        *slot = 0;
        let h = self::device(device)?;
        finish(
            Outcome::from_result(h.process_memory().map(|p| p.used)),
            |v| *slot = v,
        )
    })
}

/// Releases a device handle. NULL is a no-op.
#[no_mangle]
pub extern "C" fn memprobe_gpu_device_free(device: *mut memprobe_gpu_device) -> memprobe_status {
    free_point("memprobe_gpu_device_free", || {
        if !device.is_null() {
            DEVICES.remove(device as usize)?;
        }
        Ok(())
    })
}

/// Number of live memprobe_gpu_device handles, for leak checks in tests.
#[no_mangle]
pub extern "C" fn memprobe_gpu_debug_live_devices(out: *mut u64) -> memprobe_status {
    entry_point("memprobe_gpu_debug_live_devices", || {
        *self::out(out, "out")? = DEVICES.live() as u64;
        Ok(())
    })
}

/// A source reading device `id`'s memory, named `gpu<id>`: `used`, `total`,
/// `free` and `reserved` (MEMPROBE_SOURCE_KIND_GPU_DEVICE). Its peak is
/// sampled (MEMPROBE_FIDELITY_SAMPLED): while a window or trace is open over
/// it, the monitor polls it (memprobe_monitor_set_interval_ns), and a spike
/// shorter than the interval can be missed. A lost GPU makes its reads fail
/// with MEMPROBE_STATUS_GPU_LOST (see memprobe_source_get_last_error); the
/// other sources of a window go on. Errors as memprobe_gpu_device_open.
#[no_mangle]
pub extern "C" fn memprobe_source_new_gpu_device(
    id: u32,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_gpu_device", || {
        self::out(out, "out")?;
        let sampler = Gpus::shared().device_sampler(id)?;
        publish(Source::from_sampler(sampler), out)
    })
}

/// A source reading this process's memory on device `id`, named
/// `gpu<id>.proc`: `used` from the driver's process lists and the device's
/// size as `total` (MEMPROBE_SOURCE_KIND_GPU_PROCESS, sampled as
/// memprobe_source_new_gpu_device). MEMPROBE_STATUS_UNSUPPORTED with the
/// CUDA runtime backend; other errors as memprobe_gpu_device_open.
#[no_mangle]
pub extern "C" fn memprobe_source_new_gpu_process(
    id: u32,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_gpu_process", || {
        self::out(out, "out")?;
        let sampler = Gpus::shared().process_sampler(id)?;
        publish(Source::from_sampler(sampler), out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_cuts_at_a_character_boundary() {
        let mut buf = [1 as c_char; 5];
        assert_eq!(fill(&mut buf, Some("abcdef"), 4), 4);
        assert_eq!(&buf, &[b'a', b'b', b'c', b'd', 0].map(|b| b as c_char));
        // "é" is two bytes: "aaé" needs 4 + NUL, so only "aa" fits in 4 bytes.
        let mut buf = [1 as c_char; 4];
        fill(&mut buf, Some("aaé"), 1);
        assert_eq!(&buf[..3], &[b'a', b'a', 0].map(|b| b as c_char));
        assert_eq!(fill(&mut buf, None, 8), 0);
    }

    #[test]
    fn backend_codes_round_trip() {
        for b in [
            GpuBackend::Auto,
            GpuBackend::Nvml,
            GpuBackend::Cudart,
            GpuBackend::None,
        ] {
            let code = memprobe_gpu_backend::code(b);
            assert_eq!(memprobe_gpu_backend::from_u32(code).ok(), Some(b));
        }
        assert_eq!(
            memprobe_gpu_backend::from_u32(4).err().map(|e| e.status),
            Some(memprobe_status::InvalidArgument)
        );
    }

    #[test]
    fn memory_conversion() {
        assert_eq!(
            memprobe_gpu_memory::from(GpuMemory::ZERO),
            memprobe_gpu_memory::default()
        );
        let m = memprobe_gpu_memory::from(GpuMemory {
            total: 10,
            free: 4,
            used: 5,
            reserved: Some(1),
            taken_at_ns: 7,
            read_ns: 2,
        });
        assert_eq!(
            m.valid,
            MEMPROBE_GPU_MEMORY_READ | MEMPROBE_GPU_MEMORY_RESERVED
        );
        assert_eq!((m.total, m.free, m.used, m.reserved), (10, 4, 5, 1));
        let m = memprobe_gpu_memory::from(GpuMemory {
            reserved: None,
            ..GpuMemory::ZERO
        });
        assert_eq!(m.valid, 0);
    }
}
