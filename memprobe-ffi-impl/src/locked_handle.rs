//! Handles on objects that every call uses under a lock (windows, traces,
//! exporters): the lock is the table's slot's own. (A tracker stays in the
//! shared table: the driver's out-of-memory hook holds it weakly.)
//!
//! The shared table (`handle.rs`'s `Table`) hands out a reference to its
//! object, and each call then takes the object's lock: two reference-count
//! updates and two lock operations, each an atomic read-modify-write, on a
//! step boundary. Here a slot lives at a fixed address for the life of the
//! process (slots are kept in chunks that are never freed), so a call
//! locks the slot the token names and checks the token's generation under
//! that lock: one lock, no reference count, no table-wide lock. Freeing
//! takes the same lock, so it waits for a call in progress on the handle
//! (calls on one handle are serialised), and the object is dropped before
//! the free returns.

use crate::boundary::FfiResult;
use crate::handle::{Indices, Tokens, MAX_SLOTS};
use memprobe_core::internal::lock::{Lock, LockGuard};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Chunk `k` holds `FIRST_CHUNK << k` slots.
const FIRST_CHUNK: usize = 64;
/// Enough chunks for [`MAX_SLOTS`] slots.
const CHUNKS: usize = (usize::BITS - (MAX_SLOTS + FIRST_CHUNK).leading_zeros()) as usize
    - FIRST_CHUNK.trailing_zeros() as usize;

/// One slot: its generation (a token's must match) and its object, if live.
struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// A process-wide table of objects of one type, each behind its slot's lock.
pub(crate) struct LockedTable<T: 'static> {
    tokens: Tokens,
    chunks: [AtomicPtr<Lock<Entry<T>>>; CHUNKS],
    alloc: Lock<Indices>,
}

/// The chunk holding slot `index`, and the slot's place in it.
#[inline]
fn place(index: usize) -> (usize, usize) {
    let i = index + FIRST_CHUNK;
    let k = (usize::BITS - 1 - i.leading_zeros()) as usize - FIRST_CHUNK.trailing_zeros() as usize;
    (k, i - (FIRST_CHUNK << k))
}

/// A call's hold on a live object: the slot's lock, held until dropped.
pub(crate) struct Held<T: 'static>(LockGuard<'static, Entry<T>>);

impl<T> std::ops::Deref for Held<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        self.0.value.as_ref().expect("checked live under this lock")
    }
}

impl<T> std::ops::DerefMut for Held<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        self.0.value.as_mut().expect("checked live under this lock")
    }
}

impl<T: Send + 'static> LockedTable<T> {
    pub(crate) const fn new(tag: u8, what: &'static str) -> Self {
        LockedTable {
            tokens: Tokens::new(tag, what),
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
            alloc: Lock::new(Indices::new()),
        }
    }

    /// Slot `index`, if its chunk exists.
    #[inline]
    fn slot(&self, index: usize) -> Option<&'static Lock<Entry<T>>> {
        let (k, at) = place(index);
        let chunk = self.chunks.get(k)?.load(Ordering::Acquire);
        // SAFETY: a published chunk holds `FIRST_CHUNK << k` initialised
        // slots (written before the Release store that published it) and
        // is never freed; `at` is below that by `place`.
        unsafe { chunk.as_ref().map(|_| &*chunk.add(at)) }
    }

    /// Stores `value` and returns its token.
    pub(crate) fn insert(&self, value: T) -> FfiResult<usize> {
        let mut a = self.alloc.lock()?;
        let index = a
            .take(MAX_SLOTS)
            .ok_or_else(|| self.tokens.full(MAX_SLOTS))?;
        let (k, _) = place(index);
        if self.chunks[k].load(Ordering::Relaxed).is_null() {
            // Made under the indices' lock, by the first index in it.
            let chunk: Box<[Lock<Entry<T>>]> = (0..FIRST_CHUNK << k)
                .map(|_| {
                    Lock::new(Entry {
                        generation: 1,
                        value: None,
                    })
                })
                .collect();
            self.chunks[k].store(Box::leak(chunk).as_mut_ptr(), Ordering::Release);
        }
        let slot = self.slot(index).expect("made above");
        let generation = match slot.lock() {
            Ok(mut e) => {
                e.value = Some(value);
                e.generation
            }
            Err(e) => {
                a.give_back(index);
                return Err(e.into());
            }
        };
        Ok(self.tokens.encode(index, generation))
    }

    /// Locks the object behind `token` (INVALID_HANDLE when freed, never
    /// made, or of another type; WRONG_ORDER when this thread holds it).
    #[inline]
    pub(crate) fn lock(&self, token: usize) -> FfiResult<Held<T>> {
        let (index, generation) = self.tokens.decode(token, MAX_SLOTS)?;
        let slot = self.slot(index).ok_or_else(|| self.tokens.invalid())?;
        let e = slot.lock()?;
        if e.generation != generation || e.value.is_none() {
            return Err(self.tokens.invalid());
        }
        Ok(Held(e))
    }

    /// Takes the object behind `token` out of its slot (after any call in
    /// progress on it) and frees the handle.
    pub(crate) fn remove(&self, token: usize) -> FfiResult<T> {
        let (index, generation) = self.tokens.decode(token, MAX_SLOTS)?;
        let slot = self.slot(index).ok_or_else(|| self.tokens.invalid())?;
        let value = {
            let mut e = slot.lock()?;
            if e.generation != generation {
                return Err(self.tokens.invalid());
            }
            let value = e.value.take().ok_or_else(|| self.tokens.invalid())?;
            // Skip 0 so a token is never NULL.
            e.generation = e.generation.checked_add(1).unwrap_or(1);
            value
        };
        // Cannot fail: this thread holds no memprobe lock here that a
        // re-entry check would refuse (the slot's was released above), but
        // should it, the slot stays out of use rather than reused twice.
        if let Ok(mut a) = self.alloc.lock() {
            a.give_back(index);
        }
        Ok(value)
    }

    /// Number of live handles (for leak checks in tests).
    pub(crate) fn live(&self) -> usize {
        self.alloc.lock().map(|a| a.live()).unwrap_or(0)
    }
}

/// A C handle type whose objects live in a [`LockedTable`].
pub(crate) trait LockedHandle: Sized {
    /// What a handle names.
    type Object: Send + 'static;
    /// The handles' table.
    fn table() -> &'static LockedTable<Self::Object>;
}

/// Locks the object behind a handle (NULL: NULL_POINTER; stale, forged or
/// of another type: INVALID_HANDLE; held by this thread: WRONG_ORDER).
#[inline]
pub(crate) fn lock<H: LockedHandle>(h: *const H) -> FfiResult<Held<H::Object>> {
    if h.is_null() {
        return Err(crate::boundary::null(H::table().tokens.what));
    }
    H::table().lock(h as usize)
}

/// Stores `object` and writes its new handle to `*out` (untouched on failure).
pub(crate) fn publish<H: LockedHandle>(object: H::Object, out: *mut *mut H) -> FfiResult {
    let slot = crate::boundary::out(out, "out")?;
    *slot = H::table().insert(object)? as *mut H;
    Ok(())
}

/// Takes a handle's object out and frees the handle (NULL: nothing, `None`).
pub(crate) fn release<H: LockedHandle>(h: *mut H) -> FfiResult<Option<H::Object>> {
    if h.is_null() {
        return Ok(None);
    }
    H::table().remove(h as usize).map(Some)
}

/// Number of live handles of a type (for leak checks in tests).
pub(crate) fn live<H: LockedHandle>() -> usize {
    H::table().live()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::memprobe_status;

    #[test]
    fn places_cover_every_slot_once() {
        assert_eq!(place(0), (0, 0));
        assert_eq!(place(63), (0, 63));
        assert_eq!(place(64), (1, 0));
        assert_eq!(place(191), (1, 127));
        assert_eq!(place(192), (2, 0));
        let (k, at) = place(MAX_SLOTS - 1);
        assert!(k < CHUNKS && at < FIRST_CHUNK << k, "{k} {at}");
    }

    #[test]
    fn tokens_are_checked_and_free_drops_the_object() {
        static T: LockedTable<std::sync::Arc<()>> = LockedTable::new(0x3c, "thing");
        let object = std::sync::Arc::new(());
        let a = T.insert(object.clone()).unwrap();
        let b = T.insert(object.clone()).unwrap();
        assert_eq!(std::sync::Arc::strong_count(&object), 3);
        assert!(T.lock(a).is_ok() && T.lock(b).is_ok());
        // Held: a second lock from this thread is refused, not a deadlock.
        let held = T.lock(a).unwrap();
        assert_eq!(
            T.lock(a).err().map(|e| e.status),
            Some(memprobe_status::WrongOrder)
        );
        assert_eq!(
            T.remove(a).err().map(|e| e.status),
            Some(memprobe_status::WrongOrder)
        );
        drop(held);
        drop(T.remove(a).unwrap());
        assert_eq!(std::sync::Arc::strong_count(&object), 2);
        let invalid = Some(memprobe_status::InvalidHandle);
        assert_eq!(T.lock(a).err().map(|e| e.status), invalid);
        assert_eq!(T.remove(a).err().map(|e| e.status), invalid);
        // The slot is reused under a new generation: the old token stays dead.
        let c = T.insert(object.clone()).unwrap();
        assert_ne!(c, a);
        assert_eq!(T.lock(a).err().map(|e| e.status), invalid);
        assert!(T.lock(c).is_ok());
        // Forged, wrongly tagged, in a chunk never made.
        for token in [
            0usize,
            0x1234,
            a ^ (1 << 57),
            (0x3c << 56) | (5 << 32) | 1,
            (0x3c << 56) | ((MAX_SLOTS - 1) << 32) | 1,
        ] {
            assert_eq!(T.lock(token).err().map(|e| e.status), invalid, "{token:#x}");
        }
        assert_eq!(T.live(), 2);
        drop(T.remove(b).unwrap());
        drop(T.remove(c).unwrap());
        assert_eq!((T.live(), std::sync::Arc::strong_count(&object)), (0, 1));
    }

    /// A free waits for a call in progress on the handle on another thread,
    /// then the call's handle is dead.
    #[test]
    fn free_waits_for_a_call_in_progress() {
        static T: LockedTable<u32> = LockedTable::new(0x3d, "thing");
        let a = T.insert(7).unwrap();
        let held = T.lock(a).unwrap();
        let freer = std::thread::spawn(move || T.remove(a).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!freer.is_finished());
        assert_eq!(*held, 7);
        drop(held);
        assert_eq!(freer.join().unwrap(), 7);
        assert!(T.lock(a).is_err());
    }

    /// Slots past the first chunk (many live handles) keep their objects.
    #[test]
    fn many_handles_in_many_chunks() {
        static T: LockedTable<usize> = LockedTable::new(0x3e, "thing");
        let tokens: Vec<usize> = (0..1000).map(|i| T.insert(i).unwrap()).collect();
        for (i, &t) in tokens.iter().enumerate() {
            assert_eq!(*T.lock(t).unwrap(), i);
        }
        for t in tokens {
            T.remove(t).unwrap();
        }
        assert_eq!(T.live(), 0);
    }
}
