//! Fork safety: a process-wide gate that `fork()` closes, and a generation
//! counter that tells samplers to reopen `/proc/self` descriptors in the child.
//!
//! Every memprobe lock ([`Lock`](crate::lock::Lock)) holds a `GateGuard`: a
//! read lock on one process-wide `pthread_rwlock`. A `pthread_atfork` prepare
//! handler takes it for writing, so `fork()` waits until no memprobe call is in
//! progress: no memprobe mutex is held at the instant of the fork, and the
//! child's calls never deadlock. The child handler bumps [`generation`] so
//! kept-open `/proc/self/...` descriptors (which would still name the parent)
//! are reopened, and the monitor sees its thread is gone (it belonged to the parent).

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

/// What the gate keeps per thread, in one thread-local (in a library loaded
/// with `dlopen` each thread-local costs a call at every access, and every
/// memprobe lock reaches this one).
struct ThreadGate {
    /// How many gate read locks this thread holds (calls nest through callbacks).
    depth: Cell<u32>,
    /// This thread's id for [`GateGuard::thread`] (0 until first asked).
    id: Cell<u64>,
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD: ThreadGate = const {
        ThreadGate {
            depth: Cell::new(0),
            id: Cell::new(0),
        }
    };
    /// Whether the prepare handler of the fork in progress took the gate.
    static FORK_TOOK_GATE: Cell<bool> = const { Cell::new(false) };
}

extern "C" fn prepare() {
    // A fork from inside a memprobe callback: this thread already holds a read
    // lock, so waiting for the write lock would deadlock. Skip the gate; the
    // forking thread still unwinds its own locks in the child.
    let nested = THREAD.with(|t| t.depth.get()) > 0;
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
    if FORK_TOOK_GATE.with(|t| t.replace(false)) {
        // glibc records the writer's tid, and the child's thread has a new
        // one, so unlock would take the reader path and leave the lock held.
        // The child has exactly one thread: re-initialise the lock instead.
        // SAFETY: no other thread exists in the child to observe the write.
        unsafe { GATE.0.get().write(libc::PTHREAD_RWLOCK_INITIALIZER) };
    }
}

fn register() {
    REGISTER.call_once(|| {
        // SAFETY: the handlers are plain extern "C" functions with 'static lifetime.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// The fork generation: 0 in the original process, incremented in each child.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// A read hold on the fork gate; while any exists, `fork()` waits. It
/// stays on the thread that took it (not `Send`): it points at that
/// thread's state, which outlives it.
pub(crate) struct GateGuard {
    thread: *const ThreadGate,
}

impl GateGuard {
    pub(crate) fn enter() -> GateGuard {
        register();
        let thread = THREAD.with(|t| t as *const ThreadGate);
        // SAFETY: this thread's own thread-local, alive while the thread
        // runs (it has no destructor, so it is never torn down first).
        let t = unsafe { &*thread };
        let depth = t.depth.get();
        t.depth.set(depth + 1);
        if depth == 0 {
            // SAFETY: GATE is a valid rwlock; the matching unlock is in Drop.
            unsafe { libc::pthread_rwlock_rdlock(GATE.0.get()) };
        }
        GateGuard { thread }
    }

    /// A process-unique id of the thread holding this guard.
    pub(crate) fn thread(&self) -> u64 {
        // SAFETY: as in `enter`; the guard never leaves its thread.
        let t = unsafe { &*self.thread };
        match t.id.get() {
            0 => {
                let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
                t.id.set(id);
                id
            }
            id => id,
        }
    }
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        // SAFETY: as in `enter`; dropped on the thread that entered.
        let t = unsafe { &*self.thread };
        let depth = t.depth.get() - 1;
        t.depth.set(depth);
        if depth == 0 {
            // SAFETY: this thread took a read lock in `enter` at depth 0.
            unsafe { libc::pthread_rwlock_unlock(GATE.0.get()) };
        }
    }
}
