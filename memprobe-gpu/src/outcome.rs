//! A value that is always there, and why it may be only a placeholder.

use memprobe_core::{Error, Result};

/// A value plus the error that prevented a real one: the fastai convention
/// ("no GPU returns zeros") without losing the reason.
///
/// Single readings: when `error` is `Some`, `value` is the zero value
/// ([`GpuMemory::ZERO`](crate::GpuMemory::ZERO), `0`, `(None, 0)`). Readings
/// of every device: `value` holds what could be read (a failed device reads
/// as zeros) and `error` is the first failure. A C layer returns `value`
/// through its out-pointer and maps `error` to the status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<T> {
    /// The reading, or the placeholder described above.
    pub value: T,
    /// Why `value` is (partly) a placeholder; `None` on success.
    pub error: Option<Error>,
}

impl<T> Outcome<T> {
    /// A successful reading.
    pub fn ok(value: T) -> Self {
        Outcome { value, error: None }
    }

    /// A placeholder `value` and the reason.
    pub fn failed(value: T, error: Error) -> Self {
        Outcome {
            value,
            error: Some(error),
        }
    }

    /// Whether there was no error.
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }

    /// The value on success, else the error.
    pub fn into_result(self) -> Result<T> {
        match self.error {
            None => Ok(self.value),
            Some(e) => Err(e),
        }
    }
}

impl<T: Default> Outcome<T> {
    /// `Ok(v)` → `v`; `Err(e)` → the default (zero) value and `e`.
    pub fn from_result(result: Result<T>) -> Self {
        match result {
            Ok(v) => Outcome::ok(v),
            Err(e) => Outcome::failed(T::default(), e),
        }
    }
}
