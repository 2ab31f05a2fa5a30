//! memprobe-ffi-impl: the C ABI of memprobe, every entry point of
//! `libmemprobe.so` / `libmemprobe.a` (which the crate memprobe-ffi builds
//! from this one, so that Rust code depends on an ordinary library, not on
//! the C artifacts).
//!
//! A thin layer: argument checks, the panic/error boundary
//! ([`boundary`]), opaque handles ([`handle`]) and the mapping of errors to
//! status codes ([`status`]). Every behaviour lives in memprobe-core (and
//! memprobe-gpu); the header `include/memprobe.h` is generated from this
//! crate by cbindgen.

#![allow(clippy::missing_safety_doc)]

pub mod boundary;
pub mod gpu;
pub mod gpu_exact;
pub mod handle;
pub mod mark;
pub mod metrics;
pub mod monitor;
pub mod oom_report;
pub mod origins;
pub mod source;
pub mod status;
pub mod trace;
pub mod tracker;
pub mod window;

use handle::live;
use std::ffi::c_char;

pub use status::memprobe_status;

/// Major version of this header; checked against the library's Cargo.toml by a test.
pub const MEMPROBE_VERSION_MAJOR: u32 = 0;
/// Minor version of this header.
pub const MEMPROBE_VERSION_MINOR: u32 = 1;
/// Patch version of this header.
pub const MEMPROBE_VERSION_PATCH: u32 = 0;

// The macros are literals (cbindgen copies them into the header); the build
// fails when they drift from Cargo.toml.
const _: () = {
    const fn parse(s: &str) -> u32 {
        let b = s.as_bytes();
        let (mut i, mut v) = (0, 0);
        while i < b.len() {
            v = v * 10 + (b[i] - b'0') as u32;
            i += 1;
        }
        v
    }
    assert!(MEMPROBE_VERSION_MAJOR == parse(env!("CARGO_PKG_VERSION_MAJOR")));
    assert!(MEMPROBE_VERSION_MINOR == parse(env!("CARGO_PKG_VERSION_MINOR")));
    assert!(MEMPROBE_VERSION_PATCH == parse(env!("CARGO_PKG_VERSION_PATCH")));
};

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

/// A signed byte count (a delta such as `memprobe_delta.delta_used`) to
/// whole MiB, rounded toward zero like fastai's `int(num / 2**20)`:
/// -1 MiB + 1 byte gives 0, not -1. Defined for every value, INT64_MIN
/// included.
#[no_mangle]
pub extern "C" fn memprobe_b2mb_signed(bytes: i64) -> i64 {
    memprobe_core::b2mb_signed(bytes)
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
    boundary::entry_point("memprobe_debug_live_handles", || {
        let counts = [
            (sources, live::<source::memprobe_source>()),
            (windows, live::<window::memprobe_window>()),
            (traces, live::<trace::memprobe_trace>()),
            (trackers, live::<tracker::memprobe_tracker>()),
        ];
        for (p, n) in counts {
            if let Some(slot) = boundary::opt_out(p) {
                *slot = n as u64;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_mib_rounds_toward_zero() {
        const MIB: i64 = 1 << 20;
        for (bytes, mib) in [
            (0, 0),
            (MIB - 1, 0),
            (-(MIB - 1), 0),
            (-MIB, -1),
            (-MIB - 1, -1),
            (3 * MIB + 5, 3),
            (i64::MAX, i64::MAX >> 20),
            (i64::MIN, -(1 << 43)),
        ] {
            assert_eq!(memprobe_b2mb_signed(bytes), mib, "{bytes}");
        }
    }
}
