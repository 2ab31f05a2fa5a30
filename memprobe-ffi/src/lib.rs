//! memprobe-ffi: the C ABI of memprobe (`libmemprobe.so`, `libmemprobe.a`).
//!
//! A thin layer: argument checks, the panic/error boundary
//! ([`boundary`]), opaque handles ([`handle`]) and the mapping of errors to
//! status codes ([`status`]). Every behaviour lives in memprobe-core (and
//! memprobe-gpu); the header `include/memprobe.h` is generated from this
//! crate by cbindgen.

#![allow(clippy::missing_safety_doc)]

pub mod boundary;
pub mod gpu;
pub mod handle;
pub mod metrics;
pub mod monitor;
pub mod source;
pub mod status;
pub mod trace;
pub mod tracker;
pub mod window;

use std::ffi::c_char;

pub use status::memprobe_status;

/// Major version of this header; checked against the library's Cargo.toml by a test.
pub const MEMPROBE_VERSION_MAJOR: u32 = 0;
/// Minor version of this header.
pub const MEMPROBE_VERSION_MINOR: u32 = 1;
/// Patch version of this header.
pub const MEMPROBE_VERSION_PATCH: u32 = 0;

/// The library's version, e.g. `"0.1.0"` (static; never NULL). Compare with
/// the MEMPROBE_VERSION_* macros to detect a header/library mismatch.
#[no_mangle]
pub extern "C" fn memprobe_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The library's SONAME, e.g. `"libmemprobe.so.0.1"` (static; never NULL).
#[no_mangle]
pub extern "C" fn memprobe_soname() -> *const c_char {
    concat!(env!("MEMPROBE_SONAME"), "\0").as_ptr().cast()
}

/// fastai's `b2mb`: bytes to MiB, rounded down.
#[no_mangle]
pub extern "C" fn memprobe_b2mb(bytes: u64) -> u64 {
    memprobe_core::b2mb(bytes)
}

/// Number of live handles of each kind, for leak checks in tests:
/// `*sources`, `*windows`, `*traces`, `*trackers` (each nullable).
#[no_mangle]
pub extern "C" fn memprobe_debug_live_handles(
    sources: *mut u64,
    windows: *mut u64,
    traces: *mut u64,
    trackers: *mut u64,
) -> memprobe_status {
    boundary::run("memprobe_debug_live_handles", || {
        // SAFETY: each pointer, when non-NULL, is valid for a write (documented).
        unsafe {
            if let Some(s) = sources.as_mut() {
                *s = source::SOURCES.live() as u64;
            }
            if let Some(w) = windows.as_mut() {
                *w = window::live() as u64;
            }
            if let Some(t) = traces.as_mut() {
                *t = trace::live() as u64;
            }
            if let Some(t) = trackers.as_mut() {
                *t = tracker::live() as u64;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_macros_match_cargo_toml() {
        assert_eq!(
            MEMPROBE_VERSION_MAJOR.to_string(),
            env!("CARGO_PKG_VERSION_MAJOR")
        );
        assert_eq!(
            MEMPROBE_VERSION_MINOR.to_string(),
            env!("CARGO_PKG_VERSION_MINOR")
        );
        assert_eq!(
            MEMPROBE_VERSION_PATCH.to_string(),
            env!("CARGO_PKG_VERSION_PATCH")
        );
    }
}
