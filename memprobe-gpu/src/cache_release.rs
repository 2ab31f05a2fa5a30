//! The cache-release hook that the `*_no_cache` readings call first
//! (fastai: `gc.collect()` + `torch.cuda.empty_cache()`).
//!
//! The framework owns its caches, so the caller registers how to empty them.
//! One process-wide hook; [`release_caches`] is the single place that calls
//! it, so it can later be pointed at memprobe-core's cache-release registry.

use memprobe_core::lock::Lock;
use memprobe_core::{Error, ErrorKind, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

type Hook = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// A fork-gated [`Lock`], held only to swap or clone the hook (never while it runs).
static HOOK: Lock<Option<Hook>> = Lock::new(None);

/// Replaces the hook. The lock is never held across a call into the hook,
/// so it cannot be re-entered and locking cannot fail.
fn replace(hook: Option<Hook>) {
    if let Ok(mut h) = HOOK.lock() {
        *h = hook;
    }
}

/// Registers `hook` as the cache-release callback, replacing any previous one.
pub fn set_cache_release(hook: impl Fn() -> Result<()> + Send + Sync + 'static) {
    replace(Some(Arc::new(hook)));
}

/// Removes the cache-release callback.
pub fn clear_cache_release() {
    replace(None);
}

/// Calls the registered cache-release callback; `Ok(())` when none is
/// registered. The lock is not held during the call, so the callback may
/// itself read memory through memprobe (or replace the hook).
///
/// # Errors
/// The callback's error; [`ErrorKind::Internal`] if it panicked.
pub fn release_caches() -> Result<()> {
    let hook = HOOK.lock()?.clone();
    match hook {
        None => Ok(()),
        Some(hook) => catch_unwind(AssertUnwindSafe(|| hook())).unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Internal,
                "the cache-release callback panicked",
            ))
        }),
    }
}
