//! The out-of-memory hook: one function, registered in-process, that the
//! interposer calls when an allocation it counts fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` — synchronously, on the failing thread, after
//! the driver returned and before the error goes back to the caller. This
//! module holds what the interposer (the caller of the hook) and the
//! registering library (libmemprobe, through memprobe-gpu) must agree on:
//! the event's layout, the hook's signature, the registration symbol.
//!
//! The hook runs inside the program's failing allocation: it must make no
//! CUDA call, must not wait for another thread that may be allocating, and
//! must never unwind. The interposer calls it at most once at a time per
//! thread (a failure inside the hook, on the same thread, is not reported
//! again), and returns the driver's error unchanged whatever it does.

use crate::reader::Error;
use std::ffi::{c_char, c_void, CStr, CString};

/// The symbol the interposer exports to register the hook:
/// `int memprobe_interpose_set_oom_hook(memprobe_interpose_oom_hook hook,
/// void *user_data)`, returning 0, or -1 when counting is switched off.
pub const SET_OOM_HOOK_SYMBOL: &str = "memprobe_interpose_set_oom_hook";

/// [`OomEvent::counter`] when the device is not known (no current context).
pub const COUNTER_UNKNOWN: i32 = -1;

/// What the hook receives. Fields are only ever added at the end; `size`
/// says how many bytes the interposer filled.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OomEvent {
    /// `size_of::<OomEvent>()` as the interposer knew it.
    pub size: u32,
    /// The counter: a device ordinal (0..64), 64 for pinned host memory,
    /// or [`COUNTER_UNKNOWN`].
    pub counter: i32,
    /// The bytes asked for.
    pub requested: u64,
    /// The driver entry point that failed: a static NUL-terminated name.
    pub api: *const c_char,
    /// The driver's result (`CUDA_ERROR_OUT_OF_MEMORY`, 2).
    pub result: i32,
    /// Padding.
    pub reserved: u32,
    /// Out-of-memory failures of this process so far, this one included
    /// (those on a known counter; as [`crate::Region::last_oom`] counts).
    pub failures: u64,
    /// When it failed, `CLOCK_MONOTONIC` nanoseconds.
    pub at_ns: u64,
}

impl OomEvent {
    /// The entry point's name (`""` if the pointer is null or not UTF-8).
    pub fn api(&self) -> &str {
        if self.api.is_null() {
            return "";
        }
        // SAFETY: the interposer passes a static NUL-terminated name.
        unsafe { CStr::from_ptr(self.api) }.to_str().unwrap_or("")
    }
}

/// The hook: `void hook(const OomEvent *event, void *user_data)`.
pub type OomHook = unsafe extern "C" fn(event: *const OomEvent, user_data: *mut c_void);

type SetHookFn = unsafe extern "C" fn(hook: Option<OomHook>, user_data: *mut c_void) -> i32;

/// Registers `hook` (or with `None` removes it) in the interposer loaded in
/// this process, replacing any hook registered before.
///
/// # Errors
/// [`Error::NotLoaded`] without the interposer; [`Error::Disabled`] when
/// its counting is switched off (`MEMPROBE_GPU_EXACT=off`): its wrappers
/// are then never reached, so no failure would be seen.
///
/// # Safety
/// `hook` must stay callable, with `user_data`, from any thread until it
/// is replaced or removed.
pub unsafe fn set_oom_hook(hook: Option<OomHook>, user_data: *mut c_void) -> Result<(), Error> {
    let name = CString::new(SET_OOM_HOOK_SYMBOL).expect("no NUL in the symbol name");
    // SAFETY: a plain symbol lookup in the global scope.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if sym.is_null() {
        return Err(Error::NotLoaded);
    }
    // SAFETY: the interposer exports this name with this signature.
    let f: SetHookFn = unsafe { std::mem::transmute::<*mut c_void, SetHookFn>(sym) };
    // SAFETY: the function stores the two values; the hook stays valid as
    // long as the caller keeps it registered.
    match unsafe { f(hook, user_data) } {
        0 => Ok(()),
        _ => Err(Error::Disabled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_interposer_registration_says_so() {
        // The unit-test binary never has the interposer preloaded.
        // SAFETY: removing, with no hook to call.
        let r = unsafe { set_oom_hook(None, std::ptr::null_mut()) };
        assert!(matches!(r, Err(Error::NotLoaded)));
    }

    #[test]
    fn the_event_layout_is_fixed() {
        assert_eq!(std::mem::size_of::<OomEvent>(), 48);
        let name = c"cuMemAlloc_v2";
        let e = OomEvent {
            size: 48,
            counter: 0,
            requested: 1,
            api: name.as_ptr(),
            result: 2,
            reserved: 0,
            failures: 1,
            at_ns: 5,
        };
        assert_eq!(e.api(), "cuMemAlloc_v2");
        let none = OomEvent {
            api: std::ptr::null(),
            ..e
        };
        assert_eq!(none.api(), "");
    }
}
