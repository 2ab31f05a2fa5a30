//! The cache-release hook that the `*_no_cache` readings call first
//! (fastai: `gc.collect()` + `torch.cuda.empty_cache()`).
//!
//! The framework owns its caches, so the caller registers how to empty them.
//! One process-wide hook; [`release_caches`] is the single place that calls
//! it, so it can later be pointed at memprobe-core's cache-release registry.

use memprobe_core::{Error, ErrorKind, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, RwLock};

type Hook = Arc<dyn Fn() -> Result<()> + Send + Sync>;

static HOOK: RwLock<Option<Hook>> = RwLock::new(None);

/// Registers `hook` as the cache-release callback, replacing any previous one.
pub fn set_cache_release(hook: impl Fn() -> Result<()> + Send + Sync + 'static) {
    *HOOK.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
}

/// Removes the cache-release callback.
pub fn clear_cache_release() {
    *HOOK.write().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Calls the registered cache-release callback; `Ok(())` when none is
/// registered. The lock is not held during the call, so the callback may
/// itself read memory through memprobe.
///
/// # Errors
/// The callback's error; [`ErrorKind::Internal`] if it panicked.
pub fn release_caches() -> Result<()> {
    let hook = HOOK.read().unwrap_or_else(|e| e.into_inner()).clone();
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
