//! Runs calls into the NVML wrapper behind `catch_unwind`, so a partial or
//! broken library never unwinds into the caller.

use memprobe_core::{Error, ErrorKind, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; a panic becomes an [`ErrorKind::Unavailable`] error naming `what`.
///
/// nvml-wrapper panics (rather than returning an error) in a few places when
/// a symbol is missing; a library that cannot be used is "unavailable".
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_string());
            Err(Error::new(
                ErrorKind::Unavailable,
                format!("{what}: the NVML wrapper panicked ({detail}); the library is incomplete"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_becomes_unavailable() {
        let r: Result<()> = guarded("probing", || panic!("missing symbol"));
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.message().contains("missing symbol"), "{e}");
        assert_eq!(guarded("ok", || Ok(3)).unwrap(), 3);
    }
}
