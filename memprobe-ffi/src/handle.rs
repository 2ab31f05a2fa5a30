//! Handle tables: C handles are opaque tokens, never pointers to memory.
//!
//! A token packs a type tag, a slot index and the slot's generation. Freeing
//! bumps the generation, so a stale token (use after free, double free), a
//! token of another type, or a forged value is answered with
//! `MEMPROBE_STATUS_INVALID_HANDLE` instead of touching freed memory.

use crate::boundary::{FfiError, FfiResult};
use crate::status::memprobe_status;
use memprobe_core::lock::Lock;
use std::sync::Arc;

const _: () = assert!(
    std::mem::size_of::<usize>() == 8,
    "handles need 64-bit pointers"
);

const INDEX_BITS: u32 = 24;
const MAX_SLOTS: usize = 1 << INDEX_BITS;

struct Slot<T> {
    generation: u32,
    value: Option<Arc<T>>,
}

struct Slots<T> {
    slots: Vec<Slot<T>>,
    free: Vec<usize>,
    live: usize,
}

/// A process-wide table of objects of one type.
pub(crate) struct Table<T> {
    tag: u8,
    what: &'static str,
    inner: Lock<Slots<T>>,
}

impl<T> Table<T> {
    pub(crate) const fn new(tag: u8, what: &'static str) -> Self {
        Table {
            tag,
            what,
            inner: Lock::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
                live: 0,
            }),
        }
    }

    /// Stores `value` and returns its token.
    pub(crate) fn insert(&self, value: T) -> FfiResult<usize> {
        let mut s = self.inner.lock()?;
        let index = match s.free.pop() {
            Some(i) => i,
            None => {
                if s.slots.len() >= MAX_SLOTS {
                    return Err(FfiError::new(
                        memprobe_status::InvalidArgument,
                        format!("more than {MAX_SLOTS} live {} handles", self.what),
                    ));
                }
                s.slots.push(Slot {
                    generation: 1,
                    value: None,
                });
                s.slots.len() - 1
            }
        };
        s.slots[index].value = Some(Arc::new(value));
        s.live += 1;
        let generation = s.slots[index].generation;
        Ok(self.encode(index, generation))
    }

    fn encode(&self, index: usize, generation: u32) -> usize {
        (usize::from(self.tag) << 56) | (index << 32) | generation as usize
    }

    fn decode(&self, token: usize) -> Option<(usize, u32)> {
        if token >> 56 != usize::from(self.tag) {
            return None;
        }
        Some(((token >> 32) & (MAX_SLOTS - 1), token as u32))
    }

    fn invalid(&self) -> FfiError {
        FfiError::new(
            memprobe_status::InvalidHandle,
            format!(
                "not a live {} handle (freed, never created, or of another type)",
                self.what
            ),
        )
    }

    /// The object behind `token`.
    pub(crate) fn get(&self, token: usize) -> FfiResult<Arc<T>> {
        let (index, generation) = self.decode(token).ok_or_else(|| self.invalid())?;
        let s = self.inner.lock()?;
        match s.slots.get(index) {
            Some(Slot {
                generation: g,
                value: Some(v),
            }) if *g == generation => Ok(v.clone()),
            _ => Err(self.invalid()),
        }
    }

    /// Removes the object behind `token`; it is dropped when its last user
    /// (a call in progress on another thread) finishes.
    pub(crate) fn remove(&self, token: usize) -> FfiResult<Arc<T>> {
        let (index, generation) = self.decode(token).ok_or_else(|| self.invalid())?;
        let mut s = self.inner.lock()?;
        let slot = match s.slots.get_mut(index) {
            Some(slot) if slot.generation == generation && slot.value.is_some() => slot,
            _ => return Err(self.invalid()),
        };
        let v = slot.value.take().expect("checked above");
        // Skip 0 so a token is never NULL.
        slot.generation = slot.generation.checked_add(1).unwrap_or(1);
        s.free.push(index);
        s.live -= 1;
        Ok(v)
    }

    /// Number of live handles (for leak checks in tests).
    pub(crate) fn live(&self) -> usize {
        self.inner.lock().map(|s| s.live).unwrap_or(0)
    }
}
