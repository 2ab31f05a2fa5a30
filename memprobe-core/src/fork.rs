//! Fork safety: a process-wide gate that `fork()` closes, and a generation
//! counter that tells samplers to reopen `/proc/self` descriptors in the child.
//!
//! Every memprobe lock ([`Lock`](crate::lock::Lock)) holds a `GateGuard`
//! while it is held. A `pthread_atfork` prepare handler closes the gate and
//! waits until no thread holds a guard, so `fork()` waits until no memprobe
//! call is in progress: no memprobe mutex is held at the instant of the fork,
//! and the child's calls never deadlock. The child handler bumps
//! [`generation`] so kept-open `/proc/self/...` descriptors (which would
//! still name the parent) are reopened, and the monitor sees its thread is
//! gone (it belonged to the parent).
//!
//! The gate is on every call's path, so entering it costs a store to a
//! line of the thread's own (`Presence`) and leaving it another; the
//! fork, which is rare, does the work: it raises `FORKING`, then reads every
//! thread's presence. Either the entering thread sees `FORKING` (and steps
//! back and waits on `WAIT`, which the fork holds for writing), or the fork
//! sees the thread inside (and waits for it to leave). Each side stores,
//! then loads; the order between the two is what a full memory barrier on
//! both sides gives. Where the kernel offers `membarrier(2)` (Linux ≥ 4.14,
//! registered once per process), the fork makes every running thread of the
//! process execute that barrier, and an entering thread needs none of its
//! own (a compiler barrier); elsewhere each side pays an atomic exchange.
//! (A process-wide reader-writer lock did the same with two atomic
//! operations on one shared line per call.)

use std::cell::Cell;
use std::cell::UnsafeCell;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Once;

struct RawRwLock(UnsafeCell<libc::pthread_rwlock_t>);
// SAFETY: pthread_rwlock_t is designed for concurrent use from many threads.
unsafe impl Sync for RawRwLock {}

/// Held for writing by the fork in progress: a thread that found `FORKING`
/// raised sleeps on it instead of spinning.
static WAIT: RawRwLock = RawRwLock(UnsafeCell::new(libc::PTHREAD_RWLOCK_INITIALIZER));
/// Raised by the prepare handler while it waits for every thread to leave.
static FORKING: AtomicBool = AtomicBool::new(false);
static GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();
/// This process is registered for `membarrier`'s private expedited
/// barrier: entering the gate takes no barrier of its own. Set before the
/// fork handlers are installed; cleared only in a child that cannot
/// register (it has one thread then, so no entry is under way).
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Set to `1` (tests) to leave `membarrier(2)` unused, as on a kernel
/// without it: every entry into the gate then takes its own barrier.
const NO_MEMBARRIER_ENV: &str = "MEMPROBE_TEST_NO_MEMBARRIER";

// From <linux/membarrier.h>.
const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1 << 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: membarrier(2) takes two integers (and a CPU id, unused here)
    // and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
}

/// Whether one thread is inside memprobe now. One per thread that ever
/// entered, on a cache line of its own, in a list that only grows (a node
/// is never freed: an exited thread's is taken again by the next thread).
#[repr(align(64))]
struct Presence {
    inside: AtomicBool,
    /// Claimed by a live thread.
    taken: AtomicBool,
    /// The node's number (from 1): the id of the live thread holding it.
    id: u32,
    next: *const Presence,
}

/// The number of the next new [`Presence`].
static NEXT_PRESENCE: AtomicU32 = AtomicU32::new(1);

/// The list of every [`Presence`], newest first.
static PRESENCES: AtomicPtr<Presence> = AtomicPtr::new(std::ptr::null_mut());

fn presences() -> impl Iterator<Item = &'static Presence> {
    let mut p = PRESENCES.load(Ordering::Acquire) as *const Presence;
    std::iter::from_fn(move || {
        // SAFETY: nodes are leaked, never freed, and fully written before
        // they are published (Release in `claim`, Acquire above).
        let node = unsafe { p.as_ref()? };
        p = node.next;
        Some(node)
    })
}

/// A free node, or a new one pushed on the list.
fn claim() -> &'static Presence {
    for node in presences() {
        if !node.taken.load(Ordering::Relaxed)
            && node
                .taken
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return node;
        }
    }
    let node: &'static mut Presence = Box::leak(Box::new(Presence {
        inside: AtomicBool::new(false),
        taken: AtomicBool::new(true),
        // Never 0 (a free lock's owner): 2^32 - 1 threads at once are out
        // of reach, as each holds a node.
        id: NEXT_PRESENCE.fetch_add(1, Ordering::Relaxed),
        next: std::ptr::null(),
    }));
    let mut head = PRESENCES.load(Ordering::Relaxed);
    loop {
        node.next = head;
        match PRESENCES.compare_exchange_weak(
            head,
            node as *mut Presence,
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => return node,
            Err(h) => head = h,
        }
    }
}

/// What the gate keeps per thread, in one thread-local (in a library loaded
/// with `dlopen` each thread-local costs a call at every access, and every
/// memprobe lock reaches this one).
struct ThreadGate {
    /// How many guards this thread holds (calls nest through callbacks).
    depth: Cell<u32>,
    /// This thread's presence (null until its first call).
    presence: Cell<*const Presence>,
}

/// Gives the thread's presence back when the thread exits.
struct GiveBack;

impl Drop for GiveBack {
    fn drop(&mut self) {
        let _ = THREAD.try_with(|t| {
            // SAFETY: a node from `claim`, never freed.
            if let Some(p) = unsafe { t.presence.replace(std::ptr::null()).as_ref() } {
                p.taken.store(false, Ordering::Release);
            }
        });
    }
}

thread_local! {
    static THREAD: ThreadGate = const {
        ThreadGate {
            depth: Cell::new(0),
            presence: Cell::new(std::ptr::null()),
        }
    };
    static GIVE_BACK: GiveBack = const { GiveBack };
    /// Whether the prepare handler of the fork in progress closed the gate.
    static FORK_CLOSED_GATE: Cell<bool> = const { Cell::new(false) };
}

/// This thread's presence, claimed on its first call.
#[inline]
fn presence(t: &ThreadGate) -> &'static Presence {
    // SAFETY: a node from `claim`, never freed.
    match unsafe { t.presence.get().as_ref() } {
        Some(p) => p,
        None => first_presence(t),
    }
}

#[cold]
#[inline(never)]
fn first_presence(t: &ThreadGate) -> &'static Presence {
    // Every thread's first entry comes here: the fork handlers are in place
    // before any thread is inside (no later entry checks again).
    register();
    let p = claim();
    t.presence.set(p);
    // Registers the destructor that gives it back. A first call from a
    // thread-local destructor cannot register one: that thread keeps its
    // node (one node, never reused), which costs nothing else.
    let _ = GIVE_BACK.try_with(|_| ());
    p
}

extern "C" fn prepare() {
    // A fork from inside a memprobe callback: this thread is inside, so
    // waiting for every thread to leave would deadlock. Skip the gate; the
    // forking thread still unwinds its own locks in the child.
    let nested = THREAD.with(|t| t.depth.get()) > 0;
    if !nested {
        // SAFETY: WAIT is a valid, initialised rwlock.
        unsafe { libc::pthread_rwlock_wrlock(WAIT.0.get()) };
        FORKING.store(true, Ordering::SeqCst);
        if ASYMMETRIC.load(Ordering::Relaxed)
            && !barrier_with_every_thread()
            && !membarrier(MEMBARRIER_CMD_GLOBAL)
        {
            // Neither barrier can fail once registered; should both, the
            // threads that entered without a barrier of their own are
            // covered by the scheduler's: wait for them to be descheduled.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for node in presences() {
            let mut spins = 0u32;
            while node.inside.load(Ordering::SeqCst) {
                spins += 1;
                if spins < 64 {
                    std::thread::yield_now();
                } else {
                    // A thread inside a long call (a callback of the
                    // caller's): sleep rather than burn the CPU it needs.
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
    }
    FORK_CLOSED_GATE.with(|t| t.set(!nested));
}

extern "C" fn parent() {
    if FORK_CLOSED_GATE.with(|t| t.replace(false)) {
        FORKING.store(false, Ordering::SeqCst);
        // SAFETY: this thread took the write lock in `prepare`.
        unsafe { libc::pthread_rwlock_unlock(WAIT.0.get()) };
    }
}

extern "C" fn child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    // Whether the registration carries over into the child's new address
    // space depends on the kernel: register again (the child has one
    // thread, so turning the fast path off here is safe too).
    if ASYMMETRIC.load(Ordering::Relaxed) && !membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
    {
        ASYMMETRIC.store(false, Ordering::Relaxed);
    }
    // The child has exactly one thread: every other thread's node is free,
    // and none of them is inside (a thread that raised its flag after the
    // fork's check was about to step back).
    let own = THREAD.with(|t| t.presence.get());
    for node in presences() {
        if !std::ptr::eq(node, own) {
            node.inside.store(false, Ordering::Relaxed);
            node.taken.store(false, Ordering::Relaxed);
        }
    }
    if FORK_CLOSED_GATE.with(|t| t.replace(false)) {
        FORKING.store(false, Ordering::SeqCst);
        // glibc records the writer's tid, and the child's thread has a new
        // one, so unlock would take the reader path and leave the lock held.
        // No other thread exists in the child: re-initialise it instead.
        // SAFETY: no other thread exists in the child to observe the write.
        unsafe { WAIT.0.get().write(libc::PTHREAD_RWLOCK_INITIALIZER) };
    }
}

fn register() {
    REGISTER.call_once(|| {
        // Refused by kernels before 4.14 and by some seccomp filters: then
        // each entry takes its own barrier (as with the test variable set,
        // which runs the fork tests on that path where the kernel has it).
        let refused = std::env::var_os(NO_MEMBARRIER_ENV).is_some_and(|v| v == "1");
        if !refused && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
            ASYMMETRIC.store(true, Ordering::Relaxed);
        }
        // SAFETY: the handlers are plain extern "C" functions with 'static lifetime.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// The fork generation: 0 in the original process, incremented in each child.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// A hold on the fork gate; while any exists, `fork()` waits. It stays on
/// the thread that took it (not `Send`): it points at that thread's state,
/// which outlives it.
pub(crate) struct GateGuard {
    thread: *const ThreadGate,
}

impl GateGuard {
    #[inline]
    pub(crate) fn enter() -> GateGuard {
        let thread = THREAD.with(|t| t as *const ThreadGate);
        // SAFETY: this thread's own thread-local, alive while the thread
        // runs (it has no destructor, so it is never torn down first).
        let t = unsafe { &*thread };
        let depth = t.depth.get();
        if depth == 0 {
            let p = presence(t);
            loop {
                // Store, then load FORKING: the prepare handler stores
                // FORKING, then loads this.
                if ASYMMETRIC.load(Ordering::Relaxed) {
                    p.inside.store(true, Ordering::Relaxed);
                    // The prepare handler's membarrier is this barrier.
                    compiler_fence(Ordering::SeqCst);
                } else {
                    p.inside.swap(true, Ordering::SeqCst);
                }
                if !FORKING.load(Ordering::SeqCst) {
                    break;
                }
                // A fork is being prepared: step back, wait until it is done.
                p.inside.store(false, Ordering::SeqCst);
                // SAFETY: WAIT is a valid rwlock; held for writing by the
                // fork, so this returns once the fork is done.
                unsafe {
                    libc::pthread_rwlock_rdlock(WAIT.0.get());
                    libc::pthread_rwlock_unlock(WAIT.0.get());
                }
            }
        }
        t.depth.set(depth + 1);
        GateGuard { thread }
    }

    /// The id of the thread holding this guard: never 0, and no two live
    /// threads have the same (an exited thread's is taken again by a new
    /// one). Its presence exists: the first entry at depth 0 claimed it.
    #[inline]
    pub(crate) fn thread(&self) -> u32 {
        // SAFETY: as in `enter`; the guard never leaves its thread, and the
        // node, claimed by the first entry, is never freed.
        unsafe { (*(*self.thread).presence.get()).id }
    }
}

/// Whether a lock may be released with a plain store ([`Lock`] and a
/// thread about to wait for it meet with `membarrier`, as the gate and the
/// fork do): see [`crate::lock`].
///
/// [`Lock`]: crate::lock::Lock
#[inline]
pub(crate) fn asymmetric() -> bool {
    ASYMMETRIC.load(Ordering::Relaxed)
}

/// The waiting side's barrier of [`asymmetric`] release: every thread of
/// the process running now executes a full memory barrier. `false` when
/// the kernel refused it (the caller then waits with a timeout).
pub(crate) fn barrier_with_every_thread() -> bool {
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
}

impl Drop for GateGuard {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as in `enter`; dropped on the thread that entered.
        let t = unsafe { &*self.thread };
        let depth = t.depth.get() - 1;
        t.depth.set(depth);
        if depth == 0 {
            // SAFETY: set at depth 0 in `enter`, never freed.
            let p = unsafe { &*t.presence.get() };
            p.inside.store(false, Ordering::Release);
        }
    }
}

/// For tests of what a host's fork may interrupt: a fork made while
/// another thread holds one of memprobe's locks.
#[cfg(test)]
pub(crate) mod fork_test {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Runs `hold` on a thread of its own: it takes a memprobe lock, calls
    /// `inside`, keeps the lock 300 ms, calls `leaving` and releases it.
    /// Once it is inside, this thread forks; the child runs `child` (a
    /// boundary over what was held) and must exit 0 within 20 s, a deadlock
    /// failing the test. Also checks that the fork waited for the release.
    pub(crate) fn fork_while_held(
        hold: impl FnOnce(&dyn Fn(), &dyn Fn()) + Send + 'static,
        child: impl FnOnce() -> bool,
    ) {
        let (inside, left) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (i, l) = (inside.clone(), left.clone());
        let holder = std::thread::spawn(move || {
            hold(&|| i.store(true, Ordering::SeqCst), &|| {
                std::thread::sleep(Duration::from_millis(300));
                l.store(true, Ordering::SeqCst);
            });
        });
        while !inside.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // SAFETY: the child runs `child` (memprobe calls) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = child();
            // SAFETY: ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 3 }) };
        }
        assert!(
            left.load(Ordering::SeqCst),
            "the fork did not wait for the lock's release"
        );
        let t = Instant::now();
        let mut status = 0;
        loop {
            // SAFETY: `pid` is our child, `status` a writable int.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                break;
            }
            if t.elapsed() > Duration::from_secs(20) {
                // SAFETY: our own child, not reaped yet.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("the child deadlocked at its next boundary after the fork");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child failed: status {status:#x}"
        );
        holder.join().unwrap();
    }
}
