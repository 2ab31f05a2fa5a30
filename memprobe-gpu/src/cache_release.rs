//! The cache-release hook that the `*_no_cache` readings call first
//! (fastai: `gc.collect()` + `torch.cuda.empty_cache()`).
//!
//! The framework owns its caches, so the caller registers how to empty them.
//! One process-wide hook; [`release_caches`] is the single place that calls
//! it, so it can later be pointed at memprobe-core's cache-release registry.

use memprobe_core::internal::lock::Lock;
use memprobe_core::{Error, ErrorKind, Result};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

type Hook = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// A fork-gated [`Lock`], held only to swap or clone the hook (never while it runs).
static HOOK: Lock<Option<Hook>> = Lock::new(None);

thread_local! {
    /// Whether this thread is inside the hook: a `*_no_cache` reading made
    /// from the hook would call it again, without bound.
    static RUNNING: Cell<bool> = const { Cell::new(false) };
}

/// Clears [`RUNNING`] when the hook returns or unwinds.
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(false));
    }
}

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
/// The callback's error; [`ErrorKind::Internal`] if it panicked;
/// [`ErrorKind::WrongOrder`] when called from inside the callback on the
/// same thread (a `*_no_cache` reading made by the callback), as every
/// other re-entry from a callback is answered.
pub fn release_caches() -> Result<()> {
    if RUNNING.with(Cell::get) {
        return Err(Error::wrong_order(
            "a *_no_cache reading was made from inside the cache-release callback \
             (it would call the callback again); read without _no_cache there",
        ));
    }
    let hook = HOOK.lock()?.clone();
    let Some(hook) = hook else { return Ok(()) };
    RUNNING.with(|r| r.set(true));
    let _running = Running;
    catch_unwind(AssertUnwindSafe(|| hook())).unwrap_or_else(|_| {
        Err(Error::new(
            ErrorKind::Internal,
            "the cache-release callback panicked",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    #[test]
    fn reentry_from_the_hook_is_wrong_order_not_recursion() {
        static CALLS: AtomicU32 = AtomicU32::new(0);
        static INNER: Mutex<Option<ErrorKind>> = Mutex::new(None);
        set_cache_release(|| {
            CALLS.fetch_add(1, Ordering::SeqCst);
            let inner = release_caches().err().map(|e| e.kind());
            *INNER.lock().unwrap() = inner;
            Ok(())
        });
        assert!(release_caches().is_ok());
        assert_eq!(CALLS.load(Ordering::SeqCst), 1);
        assert_eq!(*INNER.lock().unwrap(), Some(ErrorKind::WrongOrder));
        // The flag is cleared after the hook: the next call runs it again.
        assert!(release_caches().is_ok());
        assert_eq!(CALLS.load(Ordering::SeqCst), 2);
        clear_cache_release();
    }
}
