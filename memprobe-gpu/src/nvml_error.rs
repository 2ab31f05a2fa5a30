//! NVML return codes and nvml-wrapper errors, mapped to memprobe errors.

use memprobe_core::{Error, ErrorKind};
use nvml_wrapper::error::NvmlError;

/// What a failing NVML call was about: an invalid argument on a per-device
/// call means the device handle or id is wrong, elsewhere it is a plain
/// invalid argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject {
    /// A call on one device.
    Device,
    /// A library-wide call (init, count, driver version).
    Library,
}

/// The symbolic name, memprobe kind and a short explanation of an NVML
/// return code. Unknown codes (newer drivers) map to `Unavailable`.
pub(crate) fn describe(code: u32, subject: Subject) -> (&'static str, ErrorKind, &'static str) {
    use ErrorKind::*;
    match code {
        0 => ("NVML_SUCCESS", Internal, "success reported as an error"),
        1 => (
            "NVML_ERROR_UNINITIALIZED",
            Unavailable,
            "NVML is not initialised",
        ),
        2 => (
            "NVML_ERROR_INVALID_ARGUMENT",
            if subject == Subject::Device {
                InvalidId
            } else {
                InvalidArgument
            },
            "an argument (device handle or index) is invalid",
        ),
        3 => (
            "NVML_ERROR_NOT_SUPPORTED",
            Unsupported,
            "the device does not support this query",
        ),
        4 => (
            "NVML_ERROR_NO_PERMISSION",
            PermissionDenied,
            "no permission for this query",
        ),
        5 => (
            "NVML_ERROR_ALREADY_INITIALIZED",
            Internal,
            "NVML was already initialised",
        ),
        6 => ("NVML_ERROR_NOT_FOUND", InvalidId, "no such device"),
        7 => (
            "NVML_ERROR_INSUFFICIENT_SIZE",
            Internal,
            "the buffer kept being too small",
        ),
        8 => (
            "NVML_ERROR_INSUFFICIENT_POWER",
            Unavailable,
            "the device's power cables are not attached",
        ),
        9 => (
            "NVML_ERROR_DRIVER_NOT_LOADED",
            Unavailable,
            "the NVIDIA driver is not loaded",
        ),
        10 => ("NVML_ERROR_TIMEOUT", Io, "the driver timed out"),
        11 => (
            "NVML_ERROR_IRQ_ISSUE",
            Io,
            "the driver detected an interrupt problem",
        ),
        12 => (
            "NVML_ERROR_LIBRARY_NOT_FOUND",
            Unavailable,
            "a library NVML needs was not found",
        ),
        13 => (
            "NVML_ERROR_FUNCTION_NOT_FOUND",
            Unavailable,
            "the library lacks this function",
        ),
        14 => (
            "NVML_ERROR_CORRUPTED_INFOROM",
            Unavailable,
            "the device's infoROM is corrupted",
        ),
        15 => (
            "NVML_ERROR_GPU_IS_LOST",
            GpuLost,
            "the GPU fell off the bus or became inaccessible",
        ),
        16 => (
            "NVML_ERROR_RESET_REQUIRED",
            GpuLost,
            "the GPU needs a reset",
        ),
        17 => (
            "NVML_ERROR_OPERATING_SYSTEM",
            PermissionDenied,
            "the operating system blocked the call",
        ),
        18 => (
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
            Unavailable,
            "the NVML library and the kernel driver versions differ",
        ),
        19 => ("NVML_ERROR_IN_USE", Unavailable, "the GPU is in use"),
        20 => ("NVML_ERROR_MEMORY", Io, "the driver ran out of memory"),
        21 => ("NVML_ERROR_NO_DATA", Unavailable, "no data"),
        22 => (
            "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
            Unsupported,
            "not supported with ECC on vGPU",
        ),
        23 => (
            "NVML_ERROR_INSUFFICIENT_RESOURCES",
            Unavailable,
            "insufficient resources",
        ),
        24 => (
            "NVML_ERROR_FREQ_NOT_SUPPORTED",
            Unsupported,
            "frequency not supported",
        ),
        25 => (
            "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
            Unsupported,
            "the driver does not support this structure version",
        ),
        26 => (
            "NVML_ERROR_DEPRECATED",
            Unsupported,
            "the call is deprecated",
        ),
        27 => (
            "NVML_ERROR_NOT_READY",
            Unavailable,
            "the system is not ready",
        ),
        28 => (
            "NVML_ERROR_GPU_NOT_FOUND",
            InvalidId,
            "the GPU was not found",
        ),
        29 => (
            "NVML_ERROR_INVALID_STATE",
            Unavailable,
            "the GPU is in an invalid state",
        ),
        999 => ("NVML_ERROR_UNKNOWN", Unavailable, "an unknown driver error"),
        _ => (
            "NVML_ERROR_?",
            Unavailable,
            "an NVML error code this version of memprobe does not know",
        ),
    }
}

/// The error for NVML return code `code` from the call that did `what`.
pub(crate) fn from_code(code: u32, what: &str, subject: Subject) -> Error {
    let (name, kind, text) = describe(code, subject);
    Error::new(kind, format!("{what}: {name} ({code}): {text}"))
}

/// The error for an nvml-wrapper error from the call that did `what`.
pub(crate) fn from_wrapper(err: NvmlError, what: &str, subject: Subject) -> Error {
    match err {
        NvmlError::LibloadingError(e) => Error::new(
            ErrorKind::Unavailable,
            format!("{what}: cannot load the NVML library: {e}"),
        ),
        NvmlError::FailedToLoadSymbol(s) => Error::new(
            ErrorKind::Unavailable,
            format!("{what}: the NVML library lacks a required function: {s}"),
        ),
        NvmlError::Utf8Error(e) => Error::new(
            ErrorKind::Parse,
            format!("{what}: NVML returned a non-UTF-8 string: {e}"),
        ),
        NvmlError::NulError(e) => Error::new(ErrorKind::InvalidArgument, format!("{what}: {e}")),
        NvmlError::StringTooLong {
            max_len,
            actual_len,
        } => Error::new(
            ErrorKind::InvalidArgument,
            format!("{what}: string of {actual_len} bytes, at most {max_len} allowed"),
        ),
        NvmlError::InsufficientSize(_) => from_code(7, what, subject),
        NvmlError::UnexpectedVariant(code) => from_code(code, what, subject),
        other => {
            let code: u32 = other.into();
            from_code(code, what, subject)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_kinds() {
        let k = |c, s| describe(c, s).1;
        assert_eq!(k(15, Subject::Device), ErrorKind::GpuLost);
        assert_eq!(k(3, Subject::Device), ErrorKind::Unsupported);
        assert_eq!(k(2, Subject::Device), ErrorKind::InvalidId);
        assert_eq!(k(2, Subject::Library), ErrorKind::InvalidArgument);
        for c in [1, 9, 12, 13] {
            assert_eq!(k(c, Subject::Library), ErrorKind::Unavailable, "code {c}");
        }
        assert_eq!(k(4, Subject::Device), ErrorKind::PermissionDenied);
        assert_eq!(k(12345, Subject::Device), ErrorKind::Unavailable);
        for c in 0..=30 {
            assert!(!describe(c, Subject::Device).2.is_empty());
        }
    }

    #[test]
    fn wrapper_errors_map() {
        let e = from_wrapper(NvmlError::GpuLost, "reading", Subject::Device);
        assert_eq!(e.kind(), ErrorKind::GpuLost);
        assert!(e.message().contains("NVML_ERROR_GPU_IS_LOST"), "{e}");
        let e = from_wrapper(
            NvmlError::FailedToLoadSymbol("x".into()),
            "init",
            Subject::Library,
        );
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        let e = from_wrapper(NvmlError::DriverNotLoaded, "init", Subject::Library);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        let e = from_wrapper(NvmlError::InvalidArg, "handle", Subject::Device);
        assert_eq!(e.kind(), ErrorKind::InvalidId);
        let e = from_wrapper(NvmlError::UnexpectedVariant(77), "x", Subject::Device);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
    }
}
