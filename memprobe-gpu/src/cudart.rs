//! The CUDA runtime backend (opt-in): libcudart loaded at run time.
//!
//! Reading memory through the runtime (`cudaMemGetInfo`) creates a CUDA
//! context on the device (hundreds of MB), and once CUDA is initialised,
//! CUDA no longer works in children forked afterwards. That is why this
//! backend is only used when asked for (`MEMPROBE_GPU_BACKEND=cudart`) and
//! for [`preload`](crate::Gpus::preload), whose purpose is to create the
//! context. The library is never unloaded.

use memprobe_core::internal::lock::Lock;
use memprobe_core::{Error, ErrorKind, Result};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::path::Path;

/// Library names tried in order when no path is given: the development
/// symlink, then the sonames of CUDA 13 down to 10.
pub(crate) const CUDART_CANDIDATES: &[&str] = &[
    "libcudart.so",
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
    "libcudart.so.10.2",
    "libcudart.so.10.1",
    "libcudart.so.10.0",
];

type CountFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type SetDeviceFn = unsafe extern "C" fn(c_int) -> c_int;
type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type PciBusIdFn = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type ErrorNameFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// A loaded CUDA runtime. Lives for the rest of the process.
pub(crate) struct CudartLibrary {
    /// Keeps the library loaded (and reachable from the registry, so leak
    /// checkers see no lost block); never dropped.
    _library: libloading::Library,
    path: String,
    get_device_count: CountFn,
    set_device: SetDeviceFn,
    get_device: CountFn,
    mem_get_info: MemGetInfoFn,
    free: FreeFn,
    pci_bus_id: Option<PciBusIdFn>,
    error_name: Option<ErrorNameFn>,
    error_string: Option<ErrorNameFn>,
}

/// Every runtime loaded so far. A fork-gated [`Lock`]: it is held while the
/// runtime loads (its initialisers run), and `fork()` waits for that.
static LOADED: Lock<Vec<&'static CudartLibrary>> = Lock::new(Vec::new());

/// Loads the CUDA runtime from `path`, or the newest soname found, or
/// returns the library already loaded from there.
pub(crate) fn load(path: Option<&Path>) -> Result<&'static CudartLibrary> {
    let candidates: Vec<String> = match path {
        Some(p) => vec![p.display().to_string()],
        None => CUDART_CANDIDATES.iter().map(|s| s.to_string()).collect(),
    };
    let mut loaded = LOADED.lock()?;
    if let Some(lib) = loaded.iter().find(|l| candidates.contains(&l.path)) {
        return Ok(lib);
    }
    let mut failures = Vec::new();
    for name in &candidates {
        // SAFETY: loading the CUDA runtime runs its initialisers, which have no
        // preconditions; the library is never unloaded (leaked below).
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                let library: &'static CudartLibrary = Box::leak(Box::new(resolve(lib, name)?));
                loaded.push(library);
                return Ok(library);
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    Err(Error::unavailable(format!(
        "the CUDA runtime cannot be loaded ({}); install CUDA or set MEMPROBE_CUDART_LIBRARY",
        failures.join("; ")
    )))
}

/// The runtime's functions in `lib`. A runtime without a required function
/// stays loaded (its initialisers ran; unloading could run them backwards
/// mid-flight) but unused.
fn resolve(lib: libloading::Library, name: &str) -> Result<CudartLibrary> {
    fn sym<T: Copy>(lib: &libloading::Library, name: &str, symbol: &str) -> Result<T> {
        // SAFETY: T is the documented C signature of `symbol` in the CUDA runtime.
        unsafe { lib.get::<T>(symbol.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| Error::unavailable(format!("{name} lacks {symbol}: {e}")))
    }
    let required = (|| {
        Ok((
            sym(&lib, name, "cudaGetDeviceCount")?,
            sym(&lib, name, "cudaSetDevice")?,
            sym(&lib, name, "cudaGetDevice")?,
            sym(&lib, name, "cudaMemGetInfo")?,
            sym(&lib, name, "cudaFree")?,
        ))
    })();
    let (get_device_count, set_device, get_device, mem_get_info, free) = match required {
        Ok(f) => f,
        Err(e) => {
            std::mem::forget(lib);
            return Err(e);
        }
    };
    Ok(CudartLibrary {
        path: name.to_string(),
        get_device_count,
        set_device,
        get_device,
        mem_get_info,
        free,
        pci_bus_id: sym(&lib, name, "cudaDeviceGetPCIBusId").ok(),
        error_name: sym(&lib, name, "cudaGetErrorName").ok(),
        error_string: sym(&lib, name, "cudaGetErrorString").ok(),
        _library: lib,
    })
}

impl CudartLibrary {
    /// The path (or soname) the library was loaded from.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// The error for CUDA runtime status `code` from `what`.
    fn error(&self, code: c_int, what: &str) -> Error {
        let text = |f: Option<ErrorNameFn>| {
            f.map(|f| {
                // SAFETY: cudaGetErrorName/String return a static NUL-terminated
                // string (or "unrecognized error code") for any value.
                let p = unsafe { f(code) };
                if p.is_null() {
                    String::new()
                } else {
                    // SAFETY: non-null, NUL-terminated, static.
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            })
            .unwrap_or_default()
        };
        // 35 cudaErrorInsufficientDriver and 100 cudaErrorNoDevice mean "no
        // GPU"; like every other failure of the runtime they are `Unavailable`.
        let kind = match code {
            101 => ErrorKind::InvalidId, // cudaErrorInvalidDevice
            1 => ErrorKind::InvalidArgument,
            _ => ErrorKind::Unavailable,
        };
        let meaning = match code {
            35 | 100 => " (no usable GPU)",
            _ => "",
        };
        Error::new(
            kind,
            format!(
                "{what}: {} ({code}): {}{meaning}",
                text(self.error_name),
                text(self.error_string)
            ),
        )
    }

    fn check(&self, code: c_int, what: &str) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(self.error(code, what))
        }
    }

    /// `cudaGetDeviceCount`.
    pub(crate) fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.get_device_count)(&mut n) };
        self.check(rc, "cudaGetDeviceCount")?;
        Ok(n.max(0) as u32)
    }

    /// `cudaGetDevice`: the calling thread's current device.
    pub(crate) fn current_device(&self) -> Result<u32> {
        let mut d: c_int = 0;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.get_device)(&mut d) };
        self.check(rc, "cudaGetDevice")?;
        Ok(d.max(0) as u32)
    }

    /// `cudaSetDevice` on the calling thread.
    pub(crate) fn set_current_device(&self, ordinal: u32) -> Result<()> {
        let d = c_int::try_from(ordinal)
            .map_err(|_| Error::new(ErrorKind::InvalidId, "device ordinal too large"))?;
        // SAFETY: no pointers involved.
        let rc = unsafe { (self.set_device)(d) };
        self.check(rc, &format!("cudaSetDevice({ordinal})"))
    }

    /// Runs `f` with `ordinal` as the calling thread's current device, then
    /// restores the previous one.
    fn on_device<T>(&self, ordinal: u32, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let previous = self.current_device()?;
        if previous != ordinal {
            self.set_current_device(ordinal)?;
        }
        let result = f();
        if previous != ordinal {
            let _ = self.set_current_device(previous);
        }
        result
    }

    /// `(free, total)` of device `ordinal` (`cudaMemGetInfo`; creates the
    /// device's primary context if there is none).
    pub(crate) fn mem_get_info(&self, ordinal: u32) -> Result<(u64, u64)> {
        self.on_device(ordinal, || {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: valid out-pointers.
            let rc = unsafe { (self.mem_get_info)(&mut free, &mut total) };
            self.check(rc, "cudaMemGetInfo")?;
            Ok((free as u64, total as u64))
        })
    }

    /// Creates the primary context of device `ordinal` now (`cudaFree(0)`).
    pub(crate) fn create_context(&self, ordinal: u32) -> Result<()> {
        self.on_device(ordinal, || {
            // SAFETY: cudaFree(NULL) is a documented no-op that initialises the context.
            self.check(unsafe { (self.free)(std::ptr::null_mut()) }, "cudaFree(0)")
        })
    }

    /// The PCI bus id (`cudaDeviceGetPCIBusId`), when the runtime has it.
    pub(crate) fn pci_bus_id(&self, ordinal: u32) -> Option<String> {
        let f = self.pci_bus_id?;
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` is writable for its length; the runtime NUL-terminates.
        let rc = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, ordinal as c_int) };
        if rc != 0 {
            return None;
        }
        // SAFETY: NUL-terminated within `buf` (the last byte is still 0).
        Some(
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}
