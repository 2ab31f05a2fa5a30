//! Status codes: explicit values, never reused.

use memprobe_core::ErrorKind;
use std::ffi::c_char;

/// The result of a fallible call. Values are explicit and never reused; a
/// new failure mode gets a new number.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum memprobe_status {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL.
    NullPointer = 1,
    /// An argument is out of range or malformed (unknown enum value or flag
    /// bit, an interval out of bounds, a name that is too long, ...).
    InvalidArgument = 2,
    /// A handle was freed, never created, or is of another type.
    InvalidHandle = 3,
    /// An id (device, source index) names nothing that exists.
    InvalidId = 4,
    /// Not allowed in the current state (stop before start, double stop,
    /// re-entry from a callback).
    WrongOrder = 5,
    /// Cannot be read here (no GPU, no driver, no cgroup, ...).
    Unavailable = 6,
    /// The source does not support this operation.
    Unsupported = 7,
    /// The operating system refused.
    PermissionDenied = 8,
    /// An I/O error.
    Io = 9,
    /// A malformed /proc or cgroup file.
    Parse = 10,
    /// A GPU fell off the bus.
    GpuLost = 11,
    /// An output buffer is too small; the needed size was reported.
    BufferTooSmall = 12,
    /// A panic was caught inside memprobe (a bug: please report it).
    Panic = 13,
    /// An internal invariant broke (a bug: please report it).
    Internal = 14,
    /// memprobe_tracker_run_oom_retry: the step still ran out of memory
    /// after every retry (the report was written).
    OutOfMemory = 15,
}

impl memprobe_status {
    /// The status of a core error kind. Exhaustive: a new kind does not
    /// compile until it has its own status.
    pub(crate) fn from_kind(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => memprobe_status::InvalidArgument,
            ErrorKind::InvalidId => memprobe_status::InvalidId,
            ErrorKind::WrongOrder => memprobe_status::WrongOrder,
            ErrorKind::Unavailable => memprobe_status::Unavailable,
            ErrorKind::Unsupported => memprobe_status::Unsupported,
            ErrorKind::PermissionDenied => memprobe_status::PermissionDenied,
            ErrorKind::Io => memprobe_status::Io,
            ErrorKind::Parse => memprobe_status::Parse,
            ErrorKind::GpuLost => memprobe_status::GpuLost,
            ErrorKind::Internal => memprobe_status::Internal,
        }
    }

    /// The status's name. Only the statuses of the boundary itself are
    /// named here; a status that reports a core error kind takes the
    /// kind's name (`ErrorKind::as_str`), so each name is spelled once (the
    /// Python, Go and Julia bindings keep their own tables of values,
    /// checked against the header by tests/tests/bindings_cover_header.rs).
    /// `const`, so that the C strings are built at compile time.
    const fn text(self) -> &'static str {
        use memprobe_status::*;
        match self {
            Ok => "ok",
            NullPointer => "null pointer",
            InvalidHandle => "invalid handle",
            BufferTooSmall => "buffer too small",
            Panic => "panic",
            OutOfMemory => "out of memory",
            InvalidArgument => ErrorKind::InvalidArgument.as_str(),
            InvalidId => ErrorKind::InvalidId.as_str(),
            WrongOrder => ErrorKind::WrongOrder.as_str(),
            Unavailable => ErrorKind::Unavailable.as_str(),
            Unsupported => ErrorKind::Unsupported.as_str(),
            PermissionDenied => ErrorKind::PermissionDenied.as_str(),
            Io => ErrorKind::Io.as_str(),
            Parse => ErrorKind::Parse.as_str(),
            GpuLost => ErrorKind::GpuLost.as_str(),
            Internal => ErrorKind::Internal.as_str(),
        }
    }

    /// Every status, in value order (a test checks the order).
    pub(crate) const ALL: [memprobe_status; 16] = {
        use memprobe_status::*;
        [
            Ok,
            NullPointer,
            InvalidArgument,
            InvalidHandle,
            InvalidId,
            WrongOrder,
            Unavailable,
            Unsupported,
            PermissionDenied,
            Io,
            Parse,
            GpuLost,
            BufferTooSmall,
            Panic,
            Internal,
            OutOfMemory,
        ]
    };

    fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| *s as u32 == v)
    }
}

/// Room for the longest name and its NUL.
const NAME_ROOM: usize = 24;

/// The names as NUL-terminated strings, in value order, built at compile
/// time from [`memprobe_status::text`] (no allocation, no lazy
/// initialisation: `memprobe_status_name` stays safe in a forked child).
static NAMES: [[u8; NAME_ROOM]; memprobe_status::ALL.len()] = {
    let mut names = [[0u8; NAME_ROOM]; memprobe_status::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        let text = memprobe_status::ALL[i].text().as_bytes();
        assert!(
            text.len() < NAME_ROOM,
            "a status name longer than NAME_ROOM"
        );
        let mut j = 0;
        while j < text.len() {
            assert!(text[j] != 0);
            names[i][j] = text[j];
            j += 1;
        }
        i += 1;
    }
    names
};

/// A static, NUL-terminated name for a status value (`"ok"`, `"null pointer"`,
/// ...); `"unknown status"` for values this version does not know. Never NULL.
#[no_mangle]
pub extern "C" fn memprobe_status_name(status: u32) -> *const c_char {
    match memprobe_status::from_u32(status) {
        Some(s) => NAMES[s as usize].as_ptr().cast(),
        None => c"unknown status".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::ffi::CStr;

    fn name(s: u32) -> &'static str {
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(memprobe_status_name(s)) }
            .to_str()
            .unwrap()
    }

    // The values themselves are the enum's explicit discriminants; the
    // checked-in header shows any change to them in review, and the
    // bindings are checked against the header.
    #[test]
    fn every_status_is_listed_in_order_with_its_own_name() {
        let mut names = HashSet::new();
        for (i, s) in memprobe_status::ALL.into_iter().enumerate() {
            assert_eq!(s as u32, i as u32, "ALL is in value order, without gaps");
            assert_eq!(memprobe_status::from_u32(s as u32), Some(s));
            assert!(names.insert(name(s as u32)), "{s:?} shares its name");
        }
        let next = memprobe_status::ALL.len() as u32;
        assert_eq!(memprobe_status::from_u32(next), None);
        assert_eq!(name(next), "unknown status");
        assert_eq!(name(u32::MAX), "unknown status");
    }

    #[test]
    fn every_error_kind_has_its_own_status_named_as_the_kind() {
        let mut seen = HashSet::new();
        for k in ErrorKind::ALL {
            let s = memprobe_status::from_kind(k);
            assert!(seen.insert(s as u32), "{k:?} shares a status");
            assert_eq!(name(s as u32), k.as_str());
        }
        assert_eq!(name(memprobe_status::WrongOrder as u32), "wrong call order");
        assert_eq!(name(memprobe_status::NullPointer as u32), "null pointer");
    }
}
