//! The NVML backend: libnvidia-ml loaded at run time through nvml-wrapper,
//! device enumeration, and the memory and process queries.
//!
//! nvml-wrapper loads the library (libloading), initialises it and resolves
//! every symbol leniently (a missing one is an error value, not a crash).
//! Its `Nvml` must never be dropped when `nvmlShutdown` is missing (its
//! `Drop` panics then), so each loaded library is leaked into a process-wide
//! registry and lives until the process exits; NVML needs no shutdown.
//!
//! nvml-wrapper only offers the v2 memory query and one process-list
//! version without retry, so memprobe calls those symbols itself, through
//! the function table nvml-wrapper already loaded: `nvmlDeviceGetMemoryInfo_v2`
//! falling back to `nvmlDeviceGetMemoryInfo`, and
//! `nvmlDeviceGetComputeRunningProcesses_v3`, `_v2`, then the unversioned one,
//! retrying while the list grows between calls (`NVML_ERROR_INSUFFICIENT_SIZE`).

use crate::nvml_error::{from_code, from_wrapper, Subject};
use crate::panic_guard::guarded;
use crate::process::{GpuProcess, GpuProcessKind};
use memprobe_core::internal::lock::Lock;
use memprobe_core::{Error, Result};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
    nvmlReturn_t,
};
use std::ffi::OsStr;
use std::os::raw::c_uint;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The library name looked up when no path is given.
pub(crate) const DEFAULT_NVML_LIBRARY: &str = "libnvidia-ml.so.1";

const SUCCESS: nvmlReturn_t = 0;
const NOT_SUPPORTED: nvmlReturn_t = 3;
const INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
const ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
/// `usedGpuMemory` when the driver cannot tell (`NVML_VALUE_NOT_AVAILABLE`).
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// `nvmlMemory_v2`: `NVML_STRUCT_VERSION(Memory, 2)`.
const MEMORY_V2_VERSION: c_uint = std::mem::size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);

type MemoryV1Fn = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
type MemoryV2Fn = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> nvmlReturn_t;
type ProcessesV1Fn =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
/// `_v2` and `_v3` share the entry layout (`nvmlProcessInfo_v2_t` = `nvmlProcessInfo_t`).
type ProcessesFn =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;

/// One process-list query in all its versions, newest first.
struct ProcessQuery {
    name: &'static str,
    v3: Option<ProcessesFn>,
    v2: Option<ProcessesFn>,
    v1: Option<ProcessesV1Fn>,
}

/// A raw NVML device handle. Handles stay valid until `nvmlShutdown`, which
/// memprobe never calls, and NVML is thread-safe.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawDevice(nvmlDevice_t);

// SAFETY: an nvmlDevice_t is an opaque pointer owned by the driver library,
// valid from any thread until nvmlShutdown (never called); NVML is thread-safe.
unsafe impl Send for RawDevice {}
// SAFETY: as for Send; the handle is never dereferenced by Rust code.
unsafe impl Sync for RawDevice {}

/// A device's memory as the driver reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawMemory {
    pub(crate) total: u64,
    pub(crate) free: u64,
    pub(crate) used: u64,
    pub(crate) reserved: Option<u64>,
}

/// A loaded, initialised NVML library. Lives for the rest of the process.
pub(crate) struct NvmlLibrary {
    nvml: &'static Nvml,
    path: String,
    memory_v2: Option<MemoryV2Fn>,
    memory_v1: Option<MemoryV1Fn>,
    compute: ProcessQuery,
    graphics: ProcessQuery,
}

/// Every library loaded so far. A fork-gated [`Lock`]: it is held while NVML
/// initialises, and `fork()` waits for that instead of leaving a child a lock
/// that is held forever.
static LOADED: Lock<Vec<&'static NvmlLibrary>> = Lock::new(Vec::new());

/// Loads and initialises NVML from `path` (default: `libnvidia-ml.so.1`
/// through the dynamic loader's search), or returns the library already
/// loaded from the same path.
pub(crate) fn load(path: Option<&Path>) -> Result<&'static NvmlLibrary> {
    let path_str = path.map_or_else(
        || DEFAULT_NVML_LIBRARY.to_string(),
        |p| p.display().to_string(),
    );
    let mut loaded = LOADED.lock()?;
    if let Some(lib) = loaded.iter().find(|l| l.path == path_str) {
        return Ok(lib);
    }
    let what = format!("NVML unavailable ({path_str})");
    let os_path: &OsStr = path.map_or(OsStr::new(DEFAULT_NVML_LIBRARY), |p| p.as_os_str());
    let nvml = guarded(&what, || {
        Nvml::builder()
            .lib_path(os_path)
            .init()
            .map_err(|e| from_wrapper(e, &what, Subject::Library))
    })
    .map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "{}; install the NVIDIA driver or set MEMPROBE_NVML_LIBRARY to libnvidia-ml.so",
                e.message()
            ),
        )
    })?;
    // Never dropped: nvml-wrapper's Drop panics when nvmlShutdown is missing,
    // and handles must stay valid for as long as anyone holds one.
    let nvml: &'static Nvml = Box::leak(Box::new(nvml));
    let lib = nvml.lib();
    let library = NvmlLibrary {
        nvml,
        path: path_str,
        memory_v2: lib.nvmlDeviceGetMemoryInfo_v2.as_ref().ok().copied(),
        memory_v1: lib.nvmlDeviceGetMemoryInfo.as_ref().ok().copied(),
        compute: ProcessQuery {
            name: "nvmlDeviceGetComputeRunningProcesses",
            v3: lib
                .nvmlDeviceGetComputeRunningProcesses_v3
                .as_ref()
                .ok()
                .copied(),
            v2: lib
                .nvmlDeviceGetComputeRunningProcesses_v2
                .as_ref()
                .ok()
                .copied(),
            v1: lib
                .nvmlDeviceGetComputeRunningProcesses
                .as_ref()
                .ok()
                .copied(),
        },
        graphics: ProcessQuery {
            name: "nvmlDeviceGetGraphicsRunningProcesses",
            v3: lib
                .nvmlDeviceGetGraphicsRunningProcesses_v3
                .as_ref()
                .ok()
                .copied(),
            v2: lib
                .nvmlDeviceGetGraphicsRunningProcesses_v2
                .as_ref()
                .ok()
                .copied(),
            v1: lib
                .nvmlDeviceGetGraphicsRunningProcesses
                .as_ref()
                .ok()
                .copied(),
        },
    };
    let library: &'static NvmlLibrary = Box::leak(Box::new(library));
    loaded.push(library);
    Ok(library)
}

impl NvmlLibrary {
    /// The path (or name) the library was loaded from.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// The number of physical devices (`nvmlDeviceGetCount_v2`).
    pub(crate) fn device_count(&self) -> Result<u32> {
        let what = "nvmlDeviceGetCount_v2";
        guarded(what, || {
            self.nvml
                .device_count()
                .map_err(|e| from_wrapper(e, what, Subject::Library))
        })
    }

    /// The handle of physical device `index` (`nvmlDeviceGetHandleByIndex_v2`).
    pub(crate) fn device_by_index(&self, index: u32) -> Result<RawDevice> {
        let what = format!("nvmlDeviceGetHandleByIndex_v2({index})");
        guarded(&what, || {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|e| from_wrapper(e, &what, Subject::Device))?;
            // SAFETY: the handle is only passed back to this library's functions.
            Ok(RawDevice(unsafe { device.handle() }))
        })
    }

    /// The handle of the device (or MIG instance) with `uuid`.
    pub(crate) fn device_by_uuid(&self, uuid: &str) -> Result<RawDevice> {
        let what = format!("nvmlDeviceGetHandleByUUID({uuid})");
        guarded(&what, || {
            let device = self
                .nvml
                .device_by_uuid(uuid)
                .map_err(|e| from_wrapper(e, &what, Subject::Device))?;
            // SAFETY: the handle is only passed back to this library's functions.
            Ok(RawDevice(unsafe { device.handle() }))
        })
    }

    fn device(&self, device: RawDevice) -> Device<'static> {
        // SAFETY: `device` came from this library's handle queries and stays
        // valid (no shutdown); `self.nvml` lives for the rest of the process.
        unsafe { Device::new(device.0, self.nvml) }
    }

    /// The product name (`nvmlDeviceGetName`).
    pub(crate) fn name(&self, device: RawDevice) -> Result<String> {
        let what = "nvmlDeviceGetName";
        guarded(what, || {
            self.device(device)
                .name()
                .map_err(|e| from_wrapper(e, what, Subject::Device))
        })
    }

    /// The UUID, `GPU-...` or `MIG-...` (`nvmlDeviceGetUUID`).
    pub(crate) fn uuid(&self, device: RawDevice) -> Result<String> {
        let what = "nvmlDeviceGetUUID";
        guarded(what, || {
            self.device(device)
                .uuid()
                .map_err(|e| from_wrapper(e, what, Subject::Device))
        })
    }

    /// Memory of `device`: the v2 query unless it is missing or was refused
    /// before on this device (`v2_refused`), else the v1 query. The common
    /// case (v2 succeeds) is inlined; everything else is out of line.
    #[inline]
    pub(crate) fn memory(&self, device: RawDevice, v2_refused: &AtomicBool) -> Result<RawMemory> {
        let code = match self.memory_v2 {
            Some(query) if !v2_refused.load(Ordering::Relaxed) => {
                let mut m = nvmlMemory_v2_t {
                    version: MEMORY_V2_VERSION,
                    total: 0,
                    reserved: 0,
                    free: 0,
                    used: 0,
                };
                // SAFETY: `query` is this library's nvmlDeviceGetMemoryInfo_v2, the
                // handle is valid and `m` is a writable nvmlMemory_v2_t with its version set.
                let code = unsafe { query(device.0, &mut m) };
                if code == SUCCESS {
                    return Ok(RawMemory {
                        total: m.total,
                        free: m.free,
                        used: m.used,
                        reserved: Some(m.reserved),
                    });
                }
                Some(code)
            }
            _ => None,
        };
        self.memory_fallback(device, v2_refused, code)
    }

    /// The rest of [`memory`](Self::memory): a v2 failure (`v2_code`) or no
    /// usable v2 query. Refusals of v2 are remembered and answered by v1.
    #[cold]
    #[inline(never)]
    fn memory_fallback(
        &self,
        device: RawDevice,
        v2_refused: &AtomicBool,
        v2_code: Option<nvmlReturn_t>,
    ) -> Result<RawMemory> {
        match v2_code {
            None | Some(SUCCESS) => {}
            Some(NOT_SUPPORTED | FUNCTION_NOT_FOUND | ARGUMENT_VERSION_MISMATCH) => {
                v2_refused.store(true, Ordering::Relaxed)
            }
            Some(code) => {
                return Err(from_code(
                    code,
                    "nvmlDeviceGetMemoryInfo_v2",
                    Subject::Device,
                ))
            }
        }
        let query = self.memory_v1.ok_or_else(|| {
            Error::unavailable(format!(
                "{} has neither nvmlDeviceGetMemoryInfo_v2 nor nvmlDeviceGetMemoryInfo",
                self.path
            ))
        })?;
        let mut m = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: `query` is this library's nvmlDeviceGetMemoryInfo, the handle is
        // valid and `m` is a writable nvmlMemory_t.
        match unsafe { query(device.0, &mut m) } {
            SUCCESS => Ok(RawMemory {
                total: m.total,
                free: m.free,
                used: m.used,
                reserved: None,
            }),
            code => Err(from_code(code, "nvmlDeviceGetMemoryInfo", Subject::Device)),
        }
    }

    /// Every compute and graphics process on `device`. A missing or
    /// unsupported graphics list counts as empty.
    pub(crate) fn processes(&self, device: RawDevice) -> Result<Vec<GpuProcess>> {
        let mut out = match self.process_list(&self.compute, device, GpuProcessKind::Compute)? {
            Some(list) => list,
            None => {
                return Err(Error::unavailable(format!(
                    "{} lacks nvmlDeviceGetComputeRunningProcesses (all versions)",
                    self.path
                )))
            }
        };
        match self.process_list(&self.graphics, device, GpuProcessKind::Graphics) {
            Ok(Some(list)) => out.extend(list),
            Ok(None) => {}
            Err(e) if e.kind() == memprobe_core::ErrorKind::Unsupported => {}
            Err(e) => return Err(e),
        }
        Ok(out)
    }

    /// One list, newest API version first; `Ok(None)` when no version exists.
    fn process_list(
        &self,
        query: &ProcessQuery,
        device: RawDevice,
        kind: GpuProcessKind,
    ) -> Result<Option<Vec<GpuProcess>>> {
        let entry = |pid: c_uint, used: u64| GpuProcess {
            pid,
            used: (used != VALUE_NOT_AVAILABLE).then_some(used),
            kind,
        };
        let newer = [(query.v3, "_v3"), (query.v2, "_v2")];
        for (f, suffix) in newer {
            let Some(f) = f else { continue };
            let zero = nvmlProcessInfo_t {
                pid: 0,
                usedGpuMemory: 0,
                gpuInstanceId: 0,
                computeInstanceId: 0,
            };
            // SAFETY: `f` is this library's process query of the _v2/_v3 ABI, taking
            // a valid handle, a count and an array of `count` nvmlProcessInfo_t.
            match fetch(zero, |count, infos| unsafe { f(device.0, count, infos) }) {
                Ok(list) => {
                    return Ok(Some(
                        list.iter().map(|p| entry(p.pid, p.usedGpuMemory)).collect(),
                    ))
                }
                Err(FUNCTION_NOT_FOUND) => continue,
                Err(code) => {
                    return Err(from_code(
                        code,
                        &format!("{}{suffix}", query.name),
                        Subject::Device,
                    ))
                }
            }
        }
        if let Some(f) = query.v1 {
            let zero = nvmlProcessInfo_v1_t {
                pid: 0,
                usedGpuMemory: 0,
            };
            // SAFETY: as above, with the v1 entry layout.
            return match fetch(zero, |count, infos| unsafe { f(device.0, count, infos) }) {
                Ok(list) => Ok(Some(
                    list.iter().map(|p| entry(p.pid, p.usedGpuMemory)).collect(),
                )),
                Err(FUNCTION_NOT_FOUND) => Ok(None),
                Err(code) => Err(from_code(code, query.name, Subject::Device)),
            };
        }
        Ok(None)
    }
}

/// Calls a list query with a growing buffer until the list fits: the list
/// can grow between calls, so `INSUFFICIENT_SIZE` is retried a few times.
fn fetch<T: Copy>(
    zero: T,
    mut call: impl FnMut(*mut c_uint, *mut T) -> nvmlReturn_t,
) -> Result<Vec<T>, nvmlReturn_t> {
    const ATTEMPTS: usize = 8;
    const MAX_ENTRIES: c_uint = 1 << 16;
    let mut capacity: c_uint = 16;
    for _ in 0..ATTEMPTS {
        let mut buf = vec![zero; capacity as usize];
        let mut count = capacity;
        match call(&mut count, buf.as_mut_ptr()) {
            SUCCESS => {
                buf.truncate(count.min(capacity) as usize);
                return Ok(buf);
            }
            INSUFFICIENT_SIZE => {
                capacity = count
                    .max(capacity.saturating_mul(2))
                    .saturating_add(4)
                    .min(MAX_ENTRIES);
            }
            code => return Err(code),
        }
    }
    Err(INSUFFICIENT_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_v2_version_matches_the_header() {
        // NVML_STRUCT_VERSION(Memory, 2) on 64-bit Linux.
        assert_eq!(MEMORY_V2_VERSION, 0x0200_0028);
    }

    #[test]
    fn fetch_retries_while_the_list_grows() {
        let mut calls = 0;
        let got = fetch(0u32, |count, infos| {
            calls += 1;
            let need = 20 + calls * 10; // grows by 10 every call
                                        // SAFETY: `count` points to the caller's counter.
            let capacity = unsafe { *count };
            if calls < 3 || capacity < need {
                // SAFETY: `count` points to the caller's counter.
                unsafe { *count = need };
                return INSUFFICIENT_SIZE;
            }
            for i in 0..need {
                // SAFETY: `infos` has at least `*count >= need` entries.
                unsafe { *infos.add(i as usize) = i };
            }
            // SAFETY: as above.
            unsafe { *count = need };
            SUCCESS
        })
        .unwrap();
        assert_eq!(got.len(), 50);
        assert_eq!(calls, 3);
        assert_eq!(
            fetch(0u32, |_, _| INSUFFICIENT_SIZE),
            Err(INSUFFICIENT_SIZE)
        );
        assert_eq!(fetch(0u32, |_, _| 15), Err(15));
    }
}
