//! `libmemprobe_interpose.so`: counts CUDA device memory at every
//! allocation and free the driver API sees, for any program, when loaded
//! with `LD_PRELOAD`.
//!
//! It answers `dlsym` lookups of the driver functions it wraps and
//! `cuGetProcAddress` (what the CUDA runtime resolves driver functions
//! with) with its wrappers, and exports the same names for programs linked
//! to `libcuda` directly. Counts go to a shared-memory region per process
//! (the layout and the reader are in the `memprobe-interpose` crate).
//!
//! Environment: `MEMPROBE_GPU_EXACT=off` (or `0`, `false`, `no`) loads the
//! library without counting (every call passes straight through);
//! `MEMPROBE_GPU_EXACT_DIR` names the directory of region files.

mod dlsym;
mod hooks;
mod pools;
mod real;
mod region;
mod table;

/// This process's counter region, for in-process readers; null when
/// counting is off.
#[no_mangle]
pub extern "C" fn memprobe_interpose_region() -> *mut shm::layout::Layout {
    region::raw()
}

/// The layout version of the region (`memprobe_interpose::layout::LAYOUT_VERSION`).
#[no_mangle]
pub extern "C" fn memprobe_interpose_layout_version() -> u32 {
    shm::layout::LAYOUT_VERSION
}

#[cfg(not(test))]
extern "C" fn load() {
    region::init();
}

/// Sets the region up when the library loads, before the program's own
/// constructors and `main` (not in this crate's unit-test binary).
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static LOAD: extern "C" fn() = load;
