//! Fork safety: a process-wide gate that `fork()` closes, and a generation
//! counter that tells samplers to reopen `/proc/self` descriptors in the child.
//!
//! Every memprobe lock is taken through [`Gate::lock`]-style guards that hold a
//! read lock on one process-wide `pthread_rwlock`. A `pthread_atfork` prepare
//! handler takes it for writing, so `fork()` waits until no memprobe call is in
//! progress: no memprobe mutex is held at the instant of the fork, and the
//! child's calls never deadlock. The child handler bumps [`generation`] so
//! kept-open `/proc/self/...` descriptors (which would still name the parent)
//! are reopened, and tells the monitor its thread is gone.

use std::cell::Cell;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

struct RawRwLock(UnsafeCell<libc::pthread_rwlock_t>);
// SAFETY: pthread_rwlock_t is designed for concurrent use from many threads.
unsafe impl Sync for RawRwLock {}

static GATE: RawRwLock = RawRwLock(UnsafeCell::new(libc::PTHREAD_RWLOCK_INITIALIZER));
static GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

thread_local! {
    /// How many gate read locks this thread holds (calls nest through callbacks).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Whether the prepare handler of the fork in progress took the gate.
    static FORK_TOOK_GATE: Cell<bool> = const { Cell::new(false) };
}

static CHILD_HOOKS: std::sync::Mutex<Vec<fn()>> = std::sync::Mutex::new(Vec::new());

extern "C" fn prepare() {
    // A fork from inside a memprobe callback: this thread already holds a read
    // lock, so waiting for the write lock would deadlock. Skip the gate; the
    // forking thread still unwinds its own locks in the child.
    let nested = DEPTH.with(|d| d.get()) > 0;
    if !nested {
        // SAFETY: GATE is a valid, initialised rwlock.
        unsafe { libc::pthread_rwlock_wrlock(GATE.0.get()) };
    }
    FORK_TOOK_GATE.with(|t| t.set(!nested));
}

extern "C" fn parent() {
    if FORK_TOOK_GATE.with(|t| t.replace(false)) {
        // SAFETY: this thread took the write lock in `prepare`.
        unsafe { libc::pthread_rwlock_unlock(GATE.0.get()) };
    }
}

extern "C" fn child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    // try_lock: the hooks vector is only locked at registration, never across a fork
    // point that holds the gate, but a plain lock could still block if a thread
    // registered a hook during the fork; skip the hooks in that unlikely case.
    if let Ok(hooks) = CHILD_HOOKS.try_lock() {
        for hook in hooks.iter() {
            hook();
        }
    }
    if FORK_TOOK_GATE.with(|t| t.replace(false)) {
        // SAFETY: the forking thread (this one, in the child) took the write lock.
        unsafe { libc::pthread_rwlock_unlock(GATE.0.get()) };
    }
}

fn register() {
    REGISTER.call_once(|| {
        // SAFETY: the handlers are plain extern "C" functions with 'static lifetime.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// Registers `hook` to run in the child after `fork()`, before any call.
/// Hooks must be async-signal-safe in spirit: no allocation-heavy work, no locks
/// other than atomics.
pub(crate) fn on_child(hook: fn()) {
    register();
    CHILD_HOOKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(hook);
}

/// The fork generation: 0 in the original process, incremented in each child.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// A read hold on the fork gate; while any exists, `fork()` waits.
pub(crate) struct GateGuard(());

impl GateGuard {
    pub(crate) fn enter() -> GateGuard {
        register();
        let depth = DEPTH.with(|d| {
            let v = d.get();
            d.set(v + 1);
            v
        });
        if depth == 0 {
            // SAFETY: GATE is a valid rwlock; the matching unlock is in Drop.
            unsafe { libc::pthread_rwlock_rdlock(GATE.0.get()) };
        }
        GateGuard(())
    }
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        let depth = DEPTH.with(|d| {
            let v = d.get() - 1;
            d.set(v);
            v
        });
        if depth == 0 {
            // SAFETY: this thread took a read lock in `enter` at depth 0.
            unsafe { libc::pthread_rwlock_unlock(GATE.0.get()) };
        }
    }
}
