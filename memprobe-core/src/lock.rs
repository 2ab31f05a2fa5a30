//! The one mutex type memprobe uses: fork-gated and re-entry-checked.
//! Public so that layers above (the C ABI) keep the same guarantees.
//!
//! Every call on memprobe's hot path takes one or two of these, so the lock
//! is its own: one word holds the holder's thread id (0 when free), taken
//! with one compare-and-swap. Releasing it is a plain store where the
//! kernel offers `membarrier(2)`: a thread about to sleep on the lock
//! raises `waiters`, makes every running thread of the process execute a
//! barrier, and only then looks at the word again; the releasing thread
//! stores 0, then reads `waiters` (a compiler barrier between). Either the
//! waiter sees the word free, or the releaser sees the waiter and wakes
//! it: the fork gate's pairing (see [`crate::fork`]), with the barrier paid
//! by the side that waits anyway. Without `membarrier` the release is an
//! atomic exchange (a full barrier of its own).

use crate::error::{Error, Result};
use crate::fork::{self, GateGuard};
use std::cell::UnsafeCell;
use std::sync::atomic::{compiler_fence, AtomicU32, Ordering};
use std::time::Duration;

/// A mutex that holds the fork gate while locked and refuses re-entry from
/// the thread that holds it (a callback calling back into the same object)
/// with an error instead of a deadlock. A panic while it is held releases
/// it; the protected state is kept consistent by never panicking
/// mid-update.
pub struct Lock<T> {
    /// The holder's thread id ([`GateGuard::thread`]), 0 when free.
    owner: AtomicU32,
    /// Threads waiting for it, or about to.
    waiters: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, which exists on one
// thread at a time (the one whose id is in `owner`).
unsafe impl<T: Send> Send for Lock<T> {}
// SAFETY: as above: `&Lock<T>` hands out `&mut T` to one thread at a time.
unsafe impl<T: Send> Sync for Lock<T> {}
// As `std::sync::Mutex`: a panic while it is held releases it, and the
// holders keep the state consistent at every point they can panic.
impl<T> std::panic::UnwindSafe for Lock<T> {}
impl<T> std::panic::RefUnwindSafe for Lock<T> {}

impl<T: Default> Default for Lock<T> {
    fn default() -> Self {
        Lock::new(T::default())
    }
}

/// The value is not shown: reading it would take the lock.
impl<T> std::fmt::Debug for Lock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock").finish_non_exhaustive()
    }
}

/// Holds a [`Lock`] (and the fork gate) until dropped.
pub struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
    _gate: GateGuard,
}

/// How many times a thread finding the lock held looks again before it
/// sleeps: the holder is usually within a system call of releasing it.
const SPINS: u32 = 100;

/// How long a waiter sleeps before it looks again when the kernel refused
/// the barrier its wake-up relies on.
const FALLBACK_WAIT: Duration = Duration::from_millis(1);

impl<T> Lock<T> {
    /// A new unlocked lock around `value`.
    pub const fn new(value: T) -> Self {
        Lock {
            owner: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// The value, through the exclusive borrow that proves no guard exists.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    /// Locks; fails with [`ErrorKind::WrongOrder`](crate::ErrorKind::WrongOrder)
    /// when this thread already holds it (re-entry from a callback).
    #[inline]
    pub fn lock(&self) -> Result<LockGuard<'_, T>> {
        // The gate first: it knows this thread's id. Re-entry holds it
        // already, so refusing below takes and gives back nothing else.
        let gate = GateGuard::enter();
        let me = gate.thread();
        if !self.try_take(me) {
            self.lock_contended(me)?;
        }
        Ok(LockGuard {
            lock: self,
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
        match self
            .owner
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Ok(Some(LockGuard {
                lock: self,
                _gate: gate,
            })),
            Err(holder) if holder == me => Err(reentered()),
            Err(_) => Ok(None),
        }
    }

    /// The lock was held: re-entry is refused, anything else waits.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self, me: u32) -> Result<()> {
        // Only this thread ever writes its own id: seeing it, the thread
        // holds the lock.
        if self.owner.load(Ordering::Relaxed) == me {
            return Err(reentered());
        }
        for _ in 0..SPINS {
            std::hint::spin_loop();
            if self.owner.load(Ordering::Relaxed) == 0 && self.try_take(me) {
                return Ok(());
            }
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        // The releaser reads `waiters` after a plain store (asymmetric):
        // this barrier makes it see the count raised above, or makes its
        // store visible to the attempt below.
        let woken = !fork::asymmetric() || fork::barrier_with_every_thread();
        loop {
            match self
                .owner
                .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(holder) => futex_wait(&self.owner, holder, (!woken).then_some(FALLBACK_WAIT)),
            }
        }
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    #[inline]
    fn try_take(&self, me: u32) -> bool {
        self.owner
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    fn unlock(&self) {
        if fork::asymmetric() {
            self.owner.store(0, Ordering::Release);
            // A waiter's `membarrier` is the other half of this barrier.
            compiler_fence(Ordering::SeqCst);
        } else {
            self.owner.swap(0, Ordering::SeqCst);
        }
        if self.waiters.load(Ordering::Relaxed) != 0 {
            futex_wake_one(&self.owner);
        }
    }
}

/// Sleeps while `word` holds `expected` (or for `timeout`); returns at once
/// when it holds something else, and on a spurious wake-up.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned u32 for the whole call; the kernel
    // only reads it (and `ts`, when given).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts_ptr,
        );
    }
}

fn futex_wake_one(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; a wake touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
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
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard's thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for LockGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard's thread holds the lock; `&mut self` makes the
        // reference unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for LockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Released before the gate (the field drops after this).
        self.lock.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Threads that each hold the lock for a moment, many times over, with
    /// sleeping waiters: every increment is kept, none is lost or doubled.
    #[test]
    fn excludes_and_wakes_every_waiter() {
        let lock = Arc::new(Lock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let mut g = lock.lock().unwrap();
                        let (a, b) = *g;
                        // Two fields written apart: a second holder would
                        // see them differ.
                        g.0 = a + 1;
                        if i % 1000 == 0 {
                            // Long enough for the others to go to sleep.
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        g.1 = b + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let g = lock.lock().unwrap();
        assert_eq!(*g, (80_000, 80_000));
    }

    #[test]
    fn refuses_re_entry_and_try_lock_sees_the_holder() {
        let lock = Arc::new(Lock::new(1));
        let g = lock.lock().unwrap();
        assert!(lock.lock().is_err());
        assert!(lock.try_lock().is_err());
        let other = Arc::clone(&lock);
        let taken = std::thread::spawn(move || other.try_lock().unwrap().is_some())
            .join()
            .unwrap();
        assert!(!taken);
        drop(g);
        assert_eq!(*lock.try_lock().unwrap().unwrap(), 1);
    }

    #[test]
    fn a_panic_while_held_releases_it() {
        let lock = Arc::new(Lock::new(5));
        let l = Arc::clone(&lock);
        let r = std::thread::spawn(move || {
            let _g = l.lock().unwrap();
            panic!("inside");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*lock.lock().unwrap(), 5);
    }
}
