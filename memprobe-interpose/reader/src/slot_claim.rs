//! How the writer names a slot of the region's shared tables (origins,
//! stacks, frame names): under a spin lock held only while it looks a
//! name up and fills the slot, which it then marks ready for readers. The
//! origins' and the stacks' tables claim slots alike.

use std::sync::atomic::{AtomicU32, Ordering::*};

/// A slot not named yet (the zeroed region's state).
pub(crate) const FREE: u32 = 0;
/// A slot whose name readers may read.
pub(crate) const READY: u32 = 2;

/// Takes the claim lock; yields while another thread holds it (claims are
/// rare: once per new name).
pub(crate) fn lock(l: &AtomicU32) {
    while l.swap(1, Acquire) != 0 {
        std::hint::spin_loop();
        std::thread::yield_now();
    }
}

pub(crate) fn unlock(l: &AtomicU32) {
    l.store(0, Release);
}
