//! The one mutex type memprobe uses: fork-gated and re-entry-checked.
//! Public so that layers above (the C ABI) keep the same guarantees.

use crate::error::{Error, Result};
use crate::fork::GateGuard;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A mutex that holds the fork gate while locked and refuses re-entry from
/// the thread that holds it (a callback calling back into the same object)
/// with an error instead of a deadlock. A poisoned lock is recovered: the
/// protected state is kept consistent by never panicking mid-update.
pub struct Lock<T> {
    owner: AtomicU64,
    inner: Mutex<T>,
}

/// Holds a [`Lock`] (and the fork gate) until dropped.
pub struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
    guard: Option<MutexGuard<'a, T>>,
    _gate: GateGuard,
}

impl<T> Lock<T> {
    /// A new unlocked lock around `value`.
    pub const fn new(value: T) -> Self {
        Lock {
            owner: AtomicU64::new(0),
            inner: Mutex::new(value),
        }
    }

    /// Locks; fails with [`ErrorKind::WrongOrder`](crate::ErrorKind::WrongOrder)
    /// when this thread already holds it (re-entry from a callback).
    #[inline]
    pub fn lock(&self) -> Result<LockGuard<'_, T>> {
        // The gate first: it knows this thread's id. Re-entry holds it
        // already, so refusing below takes and gives back nothing else.
        let gate = GateGuard::enter();
        let me = gate.thread();
        if self.owner.load(Ordering::Acquire) == me {
            return Err(reentered());
        }
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        self.owner.store(me, Ordering::Release);
        Ok(LockGuard {
            lock: self,
            guard: Some(guard),
            _gate: gate,
        })
    }

    /// Locks if no other thread holds the lock: `Ok(None)` when one does
    /// (the caller may retry or give up: code that must never wait, such as
    /// a hook running inside a failing allocation). Re-entry from the thread
    /// that holds it fails as [`lock`](Self::lock) does.
    pub fn try_lock(&self) -> Result<Option<LockGuard<'_, T>>> {
        let gate = GateGuard::enter();
        let me = gate.thread();
        if self.owner.load(Ordering::Acquire) == me {
            return Err(reentered());
        }
        let guard = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(None),
        };
        self.owner.store(me, Ordering::Release);
        Ok(Some(LockGuard {
            lock: self,
            guard: Some(guard),
            _gate: gate,
        }))
    }
}

/// The error of a lock taken again by the thread that holds it (kept out
/// of line: every call's path inlines `lock`).
#[cold]
#[inline(never)]
fn reentered() -> Error {
    Error::wrong_order("re-entered memprobe from a callback on the object that is running it")
}

impl<T> std::ops::Deref for LockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard.as_ref().expect("guard present until drop")
    }
}

impl<T> std::ops::DerefMut for LockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_mut().expect("guard present until drop")
    }
}

impl<T> Drop for LockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.owner.store(0, Ordering::Release);
        self.guard.take();
    }
}
