//! `libmemprobe_interpose.so`: counts CUDA device memory at every
//! allocation and free the driver API sees, for any program, when loaded
//! with `LD_PRELOAD`.
//!
//! It answers `dlsym` lookups of the driver functions it wraps and
//! `cuGetProcAddress` (what the CUDA runtime resolves driver functions
//! with) with its wrappers, and exports the same names for programs linked
//! to `libcuda` directly. Counts go to a shared-memory region per process
//! (the layout and the reader are in the `memprobe-interpose-reader` crate).
//!
//! An allocation that fails with `CUDA_ERROR_OUT_OF_MEMORY` is recorded in
//! the region and reported to the hook a library in the process registered
//! with `memprobe_interpose_set_oom_hook` (libmemprobe does, for its
//! trackers' out-of-memory reports), on the failing thread, before the
//! error returns to the caller unchanged.
//!
//! Environment: `MEMPROBE_GPU_EXACT=off` (or `0`, `false`, `no`) loads the
//! library without counting (every call passes straight through);
//! `MEMPROBE_GPU_EXACT_DIR` names the directory of region files;
//! `MEMPROBE_GPU_ORIGINS=off` counts without naming each allocation's
//! origin (see `origin.rs`).

mod dlsym;
mod driver;
mod hooks;
mod oom_report_hook;
mod origin;
mod pools;
mod real;
mod region;
mod stack;
mod table;
mod trampoline;

/// A forked child, once the region is set up (its fork handler): empty
/// maps (its parent's memory is not its own) and a region of its own when
/// it first uses the driver.
extern "C" fn in_child() {
    hooks::forget_all();
    origin::forget_all();
    stack::forget_all();
    region::forget_in_child();
}

/// This process's counter region, for in-process readers; null when
/// counting is off.
#[no_mangle]
pub extern "C" fn memprobe_interpose_region() -> *mut shm::layout::Layout {
    region::raw()
}

/// The layout version of the region (`memprobe_interpose_reader::layout::LAYOUT_VERSION`).
#[no_mangle]
pub extern "C" fn memprobe_interpose_layout_version() -> u32 {
    shm::layout::LAYOUT_VERSION
}

/// Claims a high-water mark for a reader in this process (a C entry point
/// for readers without the Rust crate, e.g. Python's ctypes); returns the
/// slot, or -1 when counting is off or all 32 slots are held.
#[no_mangle]
pub extern "C" fn memprobe_interpose_mark_claim() -> i32 {
    let Some(l) = region::get() else {
        return -1;
    };
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    l.claim_mark(pid, shm::liveness::start_time(pid))
        .map_or(-1, |s| s as i32)
}

/// Gives a slot from [`memprobe_interpose_mark_claim`] back.
#[no_mangle]
pub extern "C" fn memprobe_interpose_mark_release(slot: i32) {
    if let (Some(l), Ok(slot)) = (region::get(), usize::try_from(slot)) {
        l.release_mark(slot);
    }
}

/// The peak of mark `slot` on `counter` (a device ordinal 0..63, or 64 for
/// pinned host memory) since it was claimed or last taken, restarting it
/// from the current bytes; 0 for an unknown slot or counter.
#[no_mangle]
pub extern "C" fn memprobe_interpose_mark_take(slot: i32, counter: i32) -> u64 {
    match (
        region::get(),
        usize::try_from(slot),
        usize::try_from(counter),
    ) {
        (Some(l), Ok(s), Ok(c)) => l.take_mark(s, c),
        _ => 0,
    }
}

/// The bytes held now on `counter` (a device ordinal 0..63, or 64 for pinned
/// host memory); 0 when counting is off or for an unknown counter.
#[no_mangle]
pub extern "C" fn memprobe_interpose_current(counter: i32) -> u64 {
    match (region::get(), usize::try_from(counter)) {
        (Some(l), Ok(c)) if c < shm::layout::COUNTERS => l.counters[c]
            .current
            .load(std::sync::atomic::Ordering::SeqCst),
        _ => 0,
    }
}

/// Registers the out-of-memory hook (`memprobe_interpose_reader::oom_report_hook`): called
/// on the failing thread when a counted allocation fails with
/// `CUDA_ERROR_OUT_OF_MEMORY`, before the error returns to the caller. NULL
/// removes it; a new one replaces the old. Returns 0, or -1 when counting is
/// switched off (`MEMPROBE_GPU_EXACT=off`): the wrappers are then never
/// reached and no failure would be reported.
#[no_mangle]
pub extern "C" fn memprobe_interpose_set_oom_hook(
    hook: Option<shm::oom_report_hook::OomHook>,
    user_data: *mut std::ffi::c_void,
) -> i32 {
    oom_report_hook::set(hook, user_data)
}

#[cfg(not(test))]
extern "C" fn load() {
    region::init();
}

/// Reads the environment and finds glibc's `dlsym` when the library loads,
/// before the program's own constructors and `main` (not in this crate's
/// unit-test binary). The region comes with the first use of the driver.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static LOAD: extern "C" fn() = load;
