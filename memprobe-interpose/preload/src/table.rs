//! A lock-free map from a pointer or handle to what the interposer counted
//! for it (counter index and bytes), so a free subtracts exactly what the
//! allocation added.
//!
//! Open addressing with linear probing over a fixed array of (key, value)
//! atomics, mapped lazily from anonymous memory (untouched pages cost
//! nothing; no `malloc` on the allocation path). A removed key leaves a
//! tombstone that later inserts reuse. Probes are bounded: a full
//! neighbourhood makes an insert fail (the allocation is reported as not
//! counted), never loop.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

const EMPTY: u64 = 0;
const TOMB: u64 = u64::MAX;
const MAX_PROBES: usize = 4096;

#[repr(C)]
struct Slot {
    key: AtomicU64,
    value: AtomicU64,
}

/// One map.
pub(crate) struct Table {
    slots: AtomicPtr<Slot>,
    bits: u32,
}

/// Bytes the value of one entry holds: 48 bits (256 TiB), the rest names
/// the counter and the origin.
pub(crate) const MAX_BYTES: u64 = (1 << 48) - 1;

/// Counter index, origin slot and bytes packed in one word: the counter in
/// the top byte, the origin in the next, the bytes below.
pub(crate) fn pack(counter: usize, origin: usize, bytes: u64) -> u64 {
    (bytes & MAX_BYTES) | ((origin as u64 & 0xff) << 48) | ((counter as u64) << 56)
}

/// The inverse of [`pack`]: (counter, origin, bytes).
pub(crate) fn unpack(v: u64) -> (usize, usize, u64) {
    (
        (v >> 56) as usize,
        ((v >> 48) & 0xff) as usize,
        v & MAX_BYTES,
    )
}

impl Table {
    /// A map of `1 << bits` slots, mapped on first use.
    pub(crate) const fn new(bits: u32) -> Table {
        Table {
            slots: AtomicPtr::new(std::ptr::null_mut()),
            bits,
        }
    }

    fn len(&self) -> usize {
        1 << self.bits
    }

    fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<Slot>()
    }

    fn slots(&self) -> Option<&[Slot]> {
        let mut p = self.slots.load(Acquire);
        if p.is_null() {
            // SAFETY: a fresh private anonymous mapping; zero pages are
            // valid (EMPTY) slots.
            let m = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    self.bytes(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if m == libc::MAP_FAILED {
                return None;
            }
            match self
                .slots
                .compare_exchange(std::ptr::null_mut(), m.cast(), AcqRel, Acquire)
            {
                Ok(_) => p = m.cast(),
                Err(won) => {
                    // SAFETY: our mapping, never published.
                    unsafe { libc::munmap(m, self.bytes()) };
                    p = won;
                }
            }
        }
        // SAFETY: `p` maps `len()` slots for the life of the process.
        Some(unsafe { std::slice::from_raw_parts(p, self.len()) })
    }

    fn start(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    /// Records `key -> value`; false when it cannot (key 0 or all ones, or
    /// no free slot within the probe bound).
    pub(crate) fn insert(&self, key: u64, value: u64) -> bool {
        if key == EMPTY || key == TOMB {
            return false;
        }
        let Some(slots) = self.slots() else {
            return false;
        };
        let mask = self.len() - 1;
        let mut i = self.start(key);
        for _ in 0..MAX_PROBES.min(self.len()) {
            let s = &slots[i];
            let k = s.key.load(Acquire);
            if (k == EMPTY || k == TOMB) && s.key.compare_exchange(k, key, AcqRel, Acquire).is_ok()
            {
                s.value.store(value, Release);
                return true;
            }
            i = (i + 1) & mask;
        }
        false
    }

    /// The slot holding `key`, found along its probe sequence.
    #[inline]
    fn slot_of(&self, key: u64) -> Option<&Slot> {
        if key == EMPTY || key == TOMB {
            return None;
        }
        let slots = self.slots()?;
        let mask = self.len() - 1;
        let mut i = self.start(key);
        for _ in 0..MAX_PROBES.min(self.len()) {
            let s = &slots[i];
            match s.key.load(Acquire) {
                EMPTY => return None,
                k if k == key => return Some(s),
                _ => {}
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// The value of `key`, left in place.
    pub(crate) fn get(&self, key: u64) -> Option<u64> {
        self.slot_of(key).map(|s| s.value.load(Acquire))
    }

    /// Removes `key`, returning its value.
    pub(crate) fn remove(&self, key: u64) -> Option<u64> {
        let s = self.slot_of(key)?;
        let v = s.value.load(Acquire);
        if s.key.compare_exchange(key, TOMB, AcqRel, Acquire).is_ok() {
            return Some(v);
        }
        None
    }

    /// Forgets every entry (a forked child: its parent's allocations are
    /// not its own). Single-threaded context only.
    pub(crate) fn clear(&self) {
        let p = self.slots.load(Acquire);
        if !p.is_null() {
            // SAFETY: our private anonymous mapping: MADV_DONTNEED gives back
            // zero pages, i.e. EMPTY slots, without touching them.
            unsafe { libc::madvise(p.cast(), self.bytes(), libc::MADV_DONTNEED) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_reuse() {
        let t = Table::new(4);
        assert!(t.insert(0x1000, pack(3, 9, 42)));
        assert_eq!(t.get(0x1000).map(unpack), Some((3, 9, 42)));
        assert!(t.insert(0x2000, pack(64, 255, 7)));
        assert!(!t.insert(0, 1));
        assert_eq!(t.remove(0x1000).map(unpack), Some((3, 9, 42)));
        assert_eq!(t.remove(0x1000), None);
        // Fill all 16 slots (tombstones are reused), then one more fails.
        for k in 1..=15u64 {
            assert!(t.insert(k << 20, pack(0, 1, k)), "{k}");
        }
        assert!(!t.insert(99 << 20, 1));
        for k in 1..=15u64 {
            assert_eq!(t.remove(k << 20).map(unpack), Some((0, 1, k)));
        }
        assert_eq!(t.remove(0x2000).map(unpack), Some((64, 255, 7)));
        assert_eq!(t.get(0x2000), None);
        t.clear();
        assert!(t.insert(0x1000, 5));
    }

    #[test]
    fn concurrent_threads_each_get_their_own_values_back() {
        let t = std::sync::Arc::new(Table::new(16));
        let handles: Vec<_> = (0..8u64)
            .map(|th| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for i in 1..20_000u64 {
                        let key = (th << 40) | (i % 97 + 1) << 8;
                        assert!(t.insert(key, pack(th as usize, 0, i)));
                        assert_eq!(t.remove(key).map(unpack), Some((th as usize, 0, i)));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
