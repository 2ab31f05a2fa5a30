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

    fn name(self) -> &'static str {
        match self {
            memprobe_status::Ok => "ok\0",
            memprobe_status::NullPointer => "null pointer\0",
            memprobe_status::InvalidArgument => "invalid argument\0",
            memprobe_status::InvalidHandle => "invalid handle\0",
            memprobe_status::InvalidId => "invalid id\0",
            memprobe_status::WrongOrder => "wrong call order\0",
            memprobe_status::Unavailable => "unavailable\0",
            memprobe_status::Unsupported => "unsupported\0",
            memprobe_status::PermissionDenied => "permission denied\0",
            memprobe_status::Io => "i/o error\0",
            memprobe_status::Parse => "parse error\0",
            memprobe_status::GpuLost => "gpu lost\0",
            memprobe_status::BufferTooSmall => "buffer too small\0",
            memprobe_status::Panic => "panic\0",
            memprobe_status::Internal => "internal error\0",
            memprobe_status::OutOfMemory => "out of memory\0",
        }
    }

    /// Every status, in value order.
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

/// A static, NUL-terminated name for a status value (`"ok"`, `"null pointer"`,
/// ...); `"unknown status"` for values this version does not know. Never NULL.
#[no_mangle]
pub extern "C" fn memprobe_status_name(status: u32) -> *const c_char {
    let name = memprobe_status::from_u32(status).map_or("unknown status\0", memprobe_status::name);
    name.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    /// Each status and the value the C ABI promises for it, by an
    /// exhaustive match: a new status does not compile until it is here.
    fn promised(s: memprobe_status) -> u32 {
        match s {
            memprobe_status::Ok => 0,
            memprobe_status::NullPointer => 1,
            memprobe_status::InvalidArgument => 2,
            memprobe_status::InvalidHandle => 3,
            memprobe_status::InvalidId => 4,
            memprobe_status::WrongOrder => 5,
            memprobe_status::Unavailable => 6,
            memprobe_status::Unsupported => 7,
            memprobe_status::PermissionDenied => 8,
            memprobe_status::Io => 9,
            memprobe_status::Parse => 10,
            memprobe_status::GpuLost => 11,
            memprobe_status::BufferTooSmall => 12,
            memprobe_status::Panic => 13,
            memprobe_status::Internal => 14,
            memprobe_status::OutOfMemory => 15,
        }
    }

    #[test]
    fn every_status_keeps_its_value_and_has_a_name() {
        for (i, s) in memprobe_status::ALL.into_iter().enumerate() {
            assert_eq!(s as u32, promised(s));
            assert_eq!(s as u32, i as u32, "ALL is in value order, without gaps");
            assert_eq!(memprobe_status::from_u32(s as u32), Some(s));
            // SAFETY: a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(memprobe_status_name(s as u32)) };
            assert_ne!(name.to_str().unwrap(), "unknown status");
        }
        let next = memprobe_status::ALL.len() as u32;
        assert_eq!(memprobe_status::from_u32(next), None);
    }

    #[test]
    fn every_error_kind_has_its_own_status() {
        use ErrorKind::*;
        // Exhaustive: a new kind does not compile until it is listed here.
        let expected = |k: ErrorKind| match k {
            InvalidArgument => memprobe_status::InvalidArgument,
            InvalidId => memprobe_status::InvalidId,
            WrongOrder => memprobe_status::WrongOrder,
            Unavailable => memprobe_status::Unavailable,
            Unsupported => memprobe_status::Unsupported,
            PermissionDenied => memprobe_status::PermissionDenied,
            Io => memprobe_status::Io,
            Parse => memprobe_status::Parse,
            GpuLost => memprobe_status::GpuLost,
            Internal => memprobe_status::Internal,
        };
        let kinds = [
            InvalidArgument,
            InvalidId,
            WrongOrder,
            Unavailable,
            Unsupported,
            PermissionDenied,
            Io,
            Parse,
            GpuLost,
            Internal,
        ];
        let mut seen = std::collections::HashSet::new();
        for k in kinds {
            assert_eq!(memprobe_status::from_kind(k), expected(k), "{k:?}");
            assert!(
                seen.insert(memprobe_status::from_kind(k) as u32),
                "{k:?} shares a status"
            );
        }
    }
}
