//! memprobe-gpu: GPU memory for memprobe — per device and per process, as
//! CUDA numbers the devices — behind memprobe-core's [`Sampler`] trait, plus
//! fastai's `utils.mem` helpers in bytes.
//!
//! # Backends
//!
//! Both libraries are loaded at run time (`dlopen`), never linked: a machine
//! without a GPU, without a driver, or with a partial or broken library gets
//! an [`ErrorKind::Unavailable`](memprobe_core::ErrorKind::Unavailable)
//! answer saying why, never a crash.
//!
//! - **NVML** (the default; libnvidia-ml through the `nvml-wrapper` crate):
//!   creates no CUDA context and is fork-safe. Memory comes from
//!   `nvmlDeviceGetMemoryInfo_v2` (`used` then excludes the driver's
//!   reservation and matches `nvidia-smi`; `reserved` is reported apart),
//!   falling back to `nvmlDeviceGetMemoryInfo` (no `reserved`, `used`
//!   includes it). Per-process figures come from the compute-process list
//!   (`nvmlDeviceGetComputeRunningProcesses_v3`, else `_v2`, else v1) and
//!   the graphics-process list. Every call into nvml-wrapper runs behind
//!   `catch_unwind`, and the library is never shut down or unloaded (its
//!   `Drop` would panic on a library without `nvmlShutdown`).
//! - **CUDA runtime** (opt-in; libcudart): `cudaMemGetInfo` creates a CUDA
//!   context on the device (hundreds of MB) and once CUDA is initialised,
//!   children forked afterwards cannot use CUDA. It cannot attribute memory
//!   to processes.
//!
//! # Choosing
//!
//! [`Gpus::open`] takes a [`GpuConfig`]; [`Gpus::from_env`] and the
//! process-wide [`Gpus::shared`] read the environment, unless
//! [`Gpus::configure_shared`] opened the shared instance first:
//!
//! | variable | meaning |
//! |---|---|
//! | `MEMPROBE_GPU_BACKEND` | `auto` (default): NVML, or no GPU readings if NVML is unavailable — the CUDA runtime is **not** tried, because it would create a context; `nvml`; `cudart`; `none`. Anything else is an `InvalidArgument` error. |
//! | `MEMPROBE_NVML_LIBRARY` | path of libnvidia-ml (default `libnvidia-ml.so.1` on the loader's path) |
//! | `MEMPROBE_CUDART_LIBRARY` | path of libcudart (default: the first of `libcudart.so`, `.so.13`, `.so.12`, `.so.11.0`, `.so.10.2`, `.so.10.1`, `.so.10.0` that loads) |
//! | `CUDA_VISIBLE_DEVICES` | which devices this process sees, and their numbering |
//!
//! # Device numbering
//!
//! Device ids are CUDA ordinals as this process sees them. With NVML,
//! memprobe applies `CUDA_VISIBLE_DEVICES` itself ([`map_visible_devices`]):
//! indices, `GPU-<uuid>` UUIDs or unique UUID prefixes, and `MIG-<uuid>`
//! MIG instances; the first invalid or repeated entry hides itself and
//! everything after it, an empty value hides every device, unset shows all.
//! UUIDs are mapped to NVML devices by UUID, so they are unambiguous.
//!
//! **`CUDA_DEVICE_ORDER`.** NVML enumerates devices in PCI bus order, which
//! is CUDA's order with `CUDA_DEVICE_ORDER=PCI_BUS_ID`. CUDA's default,
//! `FASTEST_FIRST`, may put a faster GPU first on machines with mixed GPUs.
//! memprobe maps *indices* in PCI bus order, i.e. it agrees with CUDA when
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID` is set or all GPUs are the same model (the
//! usual training machine). Set `CUDA_DEVICE_ORDER=PCI_BUS_ID` or use UUIDs
//! in `CUDA_VISIBLE_DEVICES` to be sure. The CUDA runtime backend uses the
//! runtime's own numbering, which honours both variables from the real
//! environment (a [`GpuConfig::visible_devices`] is not applied there).
//!
//! # This process inside a container
//!
//! NVML reports host PIDs (some newer drivers translate them), while a
//! container's `getpid()` is its namespace PID. memprobe matches the
//! outermost PID in the `NSpid:` line of `/proc/self/status` (the host PID
//! when `/proc` shows it), then `getpid()`. When the container's own `/proc`
//! hides the host PID and the driver reports host PIDs, this process cannot
//! be recognised and reads 0; device-wide figures are unaffected.
//!
//! # fastai conventions
//!
//! The fastai `utils.mem` helpers ([`gpu_mem_get`], [`gpu_mem_get_all`],
//! [`gpu_mem_get_free`], [`gpu_mem_get_used`], their `_no_cache` variants,
//! [`gpu_mem_get_used_fast`], [`gpu_with_max_free_mem`], [`preload`],
//! [`b2mb`]) speak bytes and never fail outright: they return an
//! [`Outcome`] with zeros (or an empty list, or `(None, 0)`) and the error
//! saying why, so a C layer can return zeros plus a status.
//!
//! ```no_run
//! use memprobe_gpu::{b2mb, GpuConfig, Gpus};
//!
//! // The process-wide instance, configured by the environment:
//! let m = memprobe_gpu::gpu_mem_get(None);
//! match &m.error {
//!     None => println!("GPU total {} MiB, used {} MiB", b2mb(m.value.total), b2mb(m.value.used)),
//!     Some(why) => println!("no GPU reading: {why}"),
//! }
//!
//! // An explicit instance, without touching the environment:
//! let gpus = Gpus::open(GpuConfig { visible_devices: Some("1,0".into()), ..GpuConfig::default() })?;
//! for info in gpus.device_infos() {
//!     let mine = gpus.device(info.id)?.process_memory()?.used;
//!     println!("gpu{} {:?}: this process uses {mine} bytes", info.id, info.name);
//! }
//! let mut sampler = gpus.device_sampler(0)?; // a memprobe_core::Sampler
//! let sample = sampler.read()?;
//! # let _ = sample;
//! # Ok::<(), memprobe_core::Error>(())
//! ```
//!
//! # Samplers
//!
//! [`Gpus::device_sampler`] (`gpu<id>`, [`SourceKind::GpuDevice`](memprobe_core::SourceKind::GpuDevice))
//! and [`Gpus::process_sampler`] (`gpu<id>.proc`, [`SourceKind::GpuProcess`](memprobe_core::SourceKind::GpuProcess))
//! are polled ([`PeakFidelity::Sampled`](memprobe_core::PeakFidelity::Sampled)):
//! GPUs keep no high-water mark, so a spike shorter than the polling
//! interval can be missed.
//!
//! [`gpu_exact_source`] (`gpu_exact:<id>`, [`SourceKind::GpuExact`](memprobe_core::SourceKind::GpuExact))
//! is exact: it reads the counts the driver-API interposer keeps at every
//! allocation and free, when the program runs with it loaded
//! (`memprobe run --gpu-exact`, or `LD_PRELOAD=libmemprobe_interpose.so`).
//!
//! # Out-of-memory reports
//!
//! [`configure_oom_report`] gives a tracker's out-of-memory report
//! (memprobe-core's `oom_report`) its GPU part ([`GpuOomForensics`]: each
//! GPU's processes from NVML, this process's counts from the interposer)
//! and, for the driver trigger, the interposer's hook: a counted allocation
//! that fails with `CUDA_ERROR_OUT_OF_MEMORY` writes the report on the
//! failing thread before the error reaches the program.

mod cache_release;
mod config;
mod cudart;
mod device;
mod exact;
mod fastai;
mod gpus;
mod memory;
mod nvml;
mod nvml_error;
mod oom_report_driver;
mod oom_report_gpu;
mod outcome;
mod own_pid;
mod panic_guard;
mod process;
mod sampler;
mod visible_devices;

pub use cache_release::{clear_cache_release, release_caches, set_cache_release};
pub use config::{
    GpuBackend, GpuConfig, ENV_CUDART_LIBRARY, ENV_CUDA_VISIBLE_DEVICES, ENV_GPU_BACKEND,
    ENV_NVML_LIBRARY,
};
pub use device::{DeviceHandle, DeviceInfo};
pub use exact::{gpu_exact_host_pinned_source, gpu_exact_source};
pub use fastai::{
    b2mb, gpu_mem_get, gpu_mem_get_all, gpu_mem_get_free, gpu_mem_get_free_no_cache,
    gpu_mem_get_used, gpu_mem_get_used_fast, gpu_mem_get_used_no_cache, gpu_with_max_free_mem,
    preload,
};
pub use gpus::Gpus;
pub use memory::GpuMemory;
pub use oom_report_driver::{
    configure_oom_report, driver_oom_available, subscribe_driver_oom, DriverOom,
    DriverOomSubscription, TRACKER_WAIT,
};
pub use oom_report_gpu::GpuOomForensics;
pub use outcome::Outcome;
pub use process::{GpuProcess, GpuProcessKind, GpuProcessMemory};
pub use sampler::{device_sampler, process_sampler};
pub use visible_devices::{map_visible_devices, VisibleDevice};

#[doc(no_inline)]
pub use memprobe_core::Sampler;
