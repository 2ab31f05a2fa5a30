//! Finding the real functions: glibc's `dlsym` (ours replaces it), and the
//! driver's entry points behind each wrapper.

use crate::driver::{H, NAMES};
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering::*};

pub(crate) type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static LIBCUDA: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL: [AtomicPtr<c_void>; NAMES.len()] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; NAMES.len()];

extern "C" {
    /// Our exported `dlsym` (src/dlsym.rs), which a lookup must not return.
    fn memprobe_interpose_dlsym_entry();
}

/// glibc's `dlsym`. Found with `dlvsym`, which we do not replace, so this
/// never recurses and allocates nothing of ours. `RTLD_NEXT` first (the
/// next definition after this library: libc's, also when a second
/// interposer follows), then the global scope.
pub(crate) fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Acquire);
    if p.is_null() {
        let ours = memprobe_interpose_dlsym_entry as *mut c_void;
        'found: for handle in [libc::RTLD_NEXT, libc::RTLD_DEFAULT] {
            for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
                // SAFETY: NUL-terminated names; dlvsym only looks up.
                let q = unsafe { libc::dlvsym(handle, c"dlsym".as_ptr(), version.as_ptr()) };
                if !q.is_null() && q != ours {
                    p = q;
                    break 'found;
                }
            }
        }
        if p.is_null() {
            return None;
        }
        REAL_DLSYM.store(p, Release);
    }
    // SAFETY: `p` is glibc's dlsym, of this signature.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// The loaded driver library (opened by its SONAME, loading it if no one
/// has yet).
fn libcuda() -> *mut c_void {
    let mut h = LIBCUDA.load(Acquire);
    if h.is_null() {
        let name = c"libcuda.so.1".as_ptr();
        // SAFETY: a NUL-terminated name; the handle is kept for the process.
        h = unsafe { libc::dlopen(name, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if h.is_null() {
            // SAFETY: as above.
            h = unsafe { libc::dlopen(name, libc::RTLD_LAZY) };
        }
        if !h.is_null() {
            LIBCUDA.store(h, Release);
        }
    }
    h
}

/// What a lookup must not return for a function: our own wrapper of it
/// (`hooks.rs`'s `wrapper`; null for one only called).
pub(crate) type Wrapper = fn(H) -> *mut c_void;

/// The driver's function behind `h`, or null when the driver lacks it.
#[inline]
pub(crate) fn real(h: H, wrapper: Wrapper) -> *mut c_void {
    let p = REAL[h as usize].load(Acquire);
    if !p.is_null() {
        return p;
    }
    resolve(h, wrapper)
}

#[cold]
fn resolve(h: H, wrapper: Wrapper) -> *mut c_void {
    let Some(dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    let name = NAMES[h as usize].as_ptr().cast();
    let ours = wrapper(h);
    let lib = libcuda();
    let mut p = std::ptr::null_mut();
    if !lib.is_null() {
        // SAFETY: a valid handle and a NUL-terminated name.
        p = unsafe { dlsym(lib, name) };
    }
    if p.is_null() || p == ours {
        // SAFETY: as above.
        p = unsafe { dlsym(libc::RTLD_NEXT, name) };
    }
    if p.is_null() || p == ours {
        return std::ptr::null_mut();
    }
    record(h, p, wrapper);
    REAL[h as usize].load(Acquire)
}

/// Records what the driver handed out for `h` (through `dlsym` or
/// `cuGetProcAddress`); the first one found stays.
pub(crate) fn record(h: H, p: *mut c_void, wrapper: Wrapper) {
    if !p.is_null() && p != wrapper(h) {
        let _ = REAL[h as usize].compare_exchange(std::ptr::null_mut(), p, AcqRel, Acquire);
    }
}
