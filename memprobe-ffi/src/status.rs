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
}

impl memprobe_status {
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
            _ => memprobe_status::Internal,
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
        }
    }

    fn from_u32(v: u32) -> Option<Self> {
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
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }
}

/// A static, NUL-terminated name for a status value (`"ok"`, `"null pointer"`,
/// ...); `"unknown status"` for values this version does not know. Never NULL.
#[no_mangle]
pub extern "C" fn memprobe_status_name(status: u32) -> *const c_char {
    let name = memprobe_status::from_u32(status).map_or("unknown status\0", memprobe_status::name);
    name.as_ptr().cast()
}
