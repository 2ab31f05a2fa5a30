//! Errors: a kind that maps one-to-one to a C status code, and a message.

use std::fmt;

/// What went wrong, coarsely; each kind has a stable C status code.
///
/// Exhaustive on purpose: the C ABI matches every kind to its status, so a
/// new kind must be given one there before it compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// An argument is out of range, malformed, or otherwise unusable.
    InvalidArgument,
    /// An id (device, source, window, phase) names nothing that exists.
    InvalidId,
    /// The call is not allowed in the object's current state (stop before
    /// start, ending what was never begun, a call from inside a callback).
    WrongOrder,
    /// The thing measured cannot be read on this machine (no GPU, no driver,
    /// no cgroup, a missing /proc file); the message says why.
    Unavailable,
    /// The source exists but does not support this operation.
    Unsupported,
    /// The operating system refused (e.g. writing /proc/self/clear_refs).
    PermissionDenied,
    /// An I/O error while reading or writing.
    Io,
    /// A value could not be parsed (a malformed /proc or cgroup file).
    Parse,
    /// A GPU fell off the bus or otherwise became unusable.
    GpuLost,
    /// An internal invariant broke (a caught panic); please report it.
    Internal,
}

impl ErrorKind {
    /// Every kind, in declaration order (the C library maps each to its
    /// status and names the status after it).
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::InvalidArgument,
        ErrorKind::InvalidId,
        ErrorKind::WrongOrder,
        ErrorKind::Unavailable,
        ErrorKind::Unsupported,
        ErrorKind::PermissionDenied,
        ErrorKind::Io,
        ErrorKind::Parse,
        ErrorKind::GpuLost,
        ErrorKind::Internal,
    ];

    /// A short lowercase name, used in messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidId => "invalid id",
            ErrorKind::WrongOrder => "wrong call order",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::Io => "i/o error",
            ErrorKind::Parse => "parse error",
            ErrorKind::GpuLost => "gpu lost",
            ErrorKind::Internal => "internal error",
        }
    }
}

/// An error: a [`ErrorKind`] plus a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// Builds an error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// Shorthand for [`ErrorKind::WrongOrder`].
    pub fn wrong_order(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::WrongOrder, message)
    }

    /// Shorthand for [`ErrorKind::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// Wraps an I/O error with what was being done, mapping the OS error to a kind.
    pub fn io(context: impl fmt::Display, err: &std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::Unavailable,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            _ => ErrorKind::Io,
        };
        Self::new(kind, format!("{context}: {err}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

impl std::error::Error for Error {}

/// The result type of memprobe.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn all_lists_the_kinds_in_declaration_order_with_distinct_names() {
        let mut names = std::collections::HashSet::new();
        for (i, k) in ErrorKind::ALL.into_iter().enumerate() {
            assert_eq!(k as usize, i, "{k:?}");
            assert!(names.insert(k.as_str()), "{k:?} shares its name");
        }
    }
}
