//! Stream-ordered memory pools: counted by what each pool reserves from its
//! device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`), read after every pool
//! operation, not by what was asked for. A pool's reservation changes inside
//! the driver (growth on allocation, release on trim or synchronization), so
//! the interposer re-reads it and counts the difference.

use crate::driver::{CUresult, CUDA_SUCCESS, H};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

const MAX_POOLS: usize = 256;
const RESERVED_MEM_CURRENT: i32 = 5;

struct Pool {
    handle: AtomicU64,
    counter: AtomicUsize,
    reserved: AtomicU64,
    /// The origin slot its reservation is counted under: whoever created
    /// it, or first allocated from it (a pool's bytes are not split between
    /// the callers that share it).
    origin: AtomicUsize,
    /// Its call path, likewise (`shm::stacks::NO_STACK` when not kept).
    stack: AtomicUsize,
    busy: AtomicBool,
}

static POOLS: [Pool; MAX_POOLS] = [const {
    Pool {
        handle: AtomicU64::new(0),
        counter: AtomicUsize::new(0),
        reserved: AtomicU64::new(0),
        origin: AtomicUsize::new(crate::origin::NO_ORIGIN),
        stack: AtomicUsize::new(shm::stacks::NO_STACK),
        busy: AtomicBool::new(false),
    }
}; MAX_POOLS];
static KNOWN: AtomicUsize = AtomicUsize::new(0);
static REGISTERING: AtomicBool = AtomicBool::new(false);

type GetAttr = unsafe extern "C" fn(*mut c_void, i32, *mut c_void) -> CUresult;

fn find(handle: u64) -> Option<&'static Pool> {
    if handle == 0 {
        return None;
    }
    POOLS.iter().find(|p| p.handle.load(Acquire) == handle)
}

fn entry(l: &shm::layout::Layout, handle: u64, counter: usize) -> Option<&'static Pool> {
    if let Some(p) = find(handle) {
        return Some(p);
    }
    // Named before the registration lock: the walk may take the loader's.
    let origin = crate::origin::here(l);
    let stack = crate::stack::here(l, origin);
    // New pools register one at a time, so a pool never gets two entries.
    while REGISTERING.swap(true, Acquire) {
        std::hint::spin_loop();
        std::thread::yield_now();
    }
    let found = find(handle).or_else(|| {
        let p = POOLS.iter().find(|p| p.handle.load(Acquire) == 0)?;
        lock(p);
        p.counter.store(counter, Release);
        p.reserved.store(0, Release);
        p.origin.store(origin, Release);
        p.stack.store(stack, Release);
        p.handle.store(handle, Release);
        p.busy.store(false, Release);
        KNOWN.fetch_add(1, AcqRel);
        Some(p)
    });
    REGISTERING.store(false, Release);
    found
}

fn lock(p: &Pool) {
    while p.busy.swap(true, Acquire) {
        std::hint::spin_loop();
        std::thread::yield_now();
    }
}

/// Re-reads the reservation of `pool` (on counter `counter` if it is new)
/// and counts the change.
pub(crate) fn refresh(pool: *mut c_void, counter: usize) {
    let (Some(l), false) = (crate::region::get(), pool.is_null()) else {
        return;
    };
    let Some(p) = entry(l, pool as u64, counter) else {
        l.record_not_counted(0);
        return;
    };
    read_into(l, p, pool);
}

/// The counter of a registered pool.
pub(crate) fn counter_of(pool: *mut c_void) -> Option<usize> {
    find(pool as u64).map(|p| p.counter.load(Acquire))
}

/// Re-reads `pool` if it is registered; false if it is not.
pub(crate) fn refresh_known(pool: *mut c_void) -> bool {
    let (Some(l), Some(p)) = (crate::region::get(), find(pool as u64)) else {
        return false;
    };
    read_into(l, p, pool);
    true
}

fn read_into(l: &shm::layout::Layout, p: &Pool, pool: *mut c_void) {
    // Only called, never wrapped: no wrapper for the lookup to skip.
    let f = crate::real::real(H::cuMemPoolGetAttribute, |_| std::ptr::null_mut());
    if f.is_null() {
        return;
    }
    // SAFETY: the driver's cuMemPoolGetAttribute.
    let f: GetAttr = unsafe { std::mem::transmute::<*mut c_void, GetAttr>(f) };
    lock(p);
    if p.handle.load(Acquire) == pool as u64 {
        let mut now: u64 = 0;
        // SAFETY: the attribute is a cuuint64_t.
        let rc = unsafe { f(pool, RESERVED_MEM_CURRENT, (&mut now as *mut u64).cast()) };
        if rc == CUDA_SUCCESS {
            let before = p.reserved.swap(now, AcqRel);
            let c = p.counter.load(Acquire);
            let (o, s) = (p.origin.load(Acquire), p.stack.load(Acquire));
            if now > before {
                crate::region::add(l, o, s, c, now - before);
            } else {
                crate::region::sub(l, o, s, c, before - now);
            }
        }
    }
    p.busy.store(false, Release);
}

/// Re-reads every pool seen (after a free or a synchronization, when any
/// pool may have released memory).
pub(crate) fn refresh_all() {
    if KNOWN.load(Acquire) == 0 {
        return;
    }
    let Some(l) = crate::region::get() else {
        return;
    };
    for p in &POOLS {
        let h = p.handle.load(Acquire);
        if h != 0 {
            read_into(l, p, h as *mut c_void);
        }
    }
}

/// Registers a pool created on counter `counter`.
pub(crate) fn created(pool: *mut c_void, counter: usize) {
    if let (Some(l), false) = (crate::region::get(), pool.is_null()) {
        let _ = entry(l, pool as u64, counter);
    }
}

/// Forgets `pool` (destroyed: its reservation went back to the device).
pub(crate) fn destroyed(pool: *mut c_void) {
    let Some(l) = crate::region::get() else {
        return;
    };
    if let Some(p) = find(pool as u64) {
        lock(p);
        if p.handle.load(Acquire) == pool as u64 {
            crate::region::sub(
                l,
                p.origin.load(Acquire),
                p.stack.load(Acquire),
                p.counter.load(Acquire),
                p.reserved.swap(0, AcqRel),
            );
            p.handle.store(0, Release);
            KNOWN.fetch_sub(1, AcqRel);
        }
        p.busy.store(false, Release);
    }
}

/// Forgets every pool (a forked child).
pub(crate) fn forget_all() {
    for p in &POOLS {
        p.handle.store(0, Relaxed);
        p.reserved.store(0, Relaxed);
        p.busy.store(false, Relaxed);
    }
    KNOWN.store(0, Relaxed);
    REGISTERING.store(false, Relaxed);
}
