//! Handle tables: C handles are opaque tokens, never pointers to memory.
//!
//! A token packs a type tag, a slot index and the slot's generation. Freeing
//! bumps the generation, so a stale token (use after free, double free), a
//! token of another type, or a forged value is answered with
//! `MEMPROBE_STATUS_INVALID_HANDLE` instead of touching freed memory.

use crate::boundary::{FfiError, FfiResult};
use crate::status::memprobe_status;
use memprobe_core::internal::lock::Lock;
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

const _: () = assert!(
    std::mem::size_of::<usize>() == 8,
    "handles need 64-bit pointers"
);

const INDEX_BITS: u32 = 24;
pub(crate) const MAX_SLOTS: usize = 1 << INDEX_BITS;

/// The token format both tables use: a type tag in the top byte, the slot
/// index in the next 24 bits, the slot's generation (never 0) below.
#[derive(Debug)]
pub(crate) struct Tokens {
    tag: u8,
    pub(crate) what: &'static str,
}

impl Tokens {
    pub(crate) const fn new(tag: u8, what: &'static str) -> Self {
        Tokens { tag, what }
    }

    pub(crate) fn encode(&self, index: usize, generation: u32) -> usize {
        (usize::from(self.tag) << 56) | (index << 32) | generation as usize
    }

    /// (index, generation); INVALID_HANDLE for a token of another table.
    pub(crate) fn decode(&self, token: usize, slots: usize) -> FfiResult<(usize, u32)> {
        let index = (token >> 32) & (MAX_SLOTS - 1);
        if token >> 56 == usize::from(self.tag) && index < slots {
            Ok((index, token as u32))
        } else {
            Err(self.invalid())
        }
    }

    pub(crate) fn invalid(&self) -> FfiError {
        FfiError::new(
            memprobe_status::InvalidHandle,
            format!(
                "not a live {} handle (freed, never created, or of another type)",
                self.what
            ),
        )
    }

    pub(crate) fn full(&self, max: usize) -> FfiError {
        FfiError::new(
            memprobe_status::InvalidArgument,
            format!("more than {max} live {} handles", self.what),
        )
    }
}

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
    tokens: Tokens,
    inner: Lock<Slots<T>>,
    /// Bumped by every removal: a thread's cached lookup (see [`Cached`])
    /// made before it is stale.
    removals: AtomicU64,
}

/// One thread's last lookup in one table: the token, the table's removal
/// count then, and the object, held weakly (a removed object is dropped
/// when its last call ends, whatever the caches).
struct Cached {
    token: usize,
    removals: u64,
    /// The object's type, checked without a virtual call.
    type_id: TypeId,
    object: Weak<dyn Any + Send + Sync>,
}

thread_local! {
    /// Per table (its tag's low 4 bits: the tables' tags differ there), the
    /// last lookup: a hot loop calling with the same handle takes no lock.
    static LOOKUPS: RefCell<[Option<Cached>; 16]> = const { RefCell::new([const { None }; 16]) };
}

impl<T> Table<T> {
    pub(crate) const fn new(tag: u8, what: &'static str) -> Self {
        Table {
            tokens: Tokens { tag, what },
            inner: Lock::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
                live: 0,
            }),
            removals: AtomicU64::new(0),
        }
    }

    /// Stores `value` and returns its token.
    pub(crate) fn insert(&self, value: T) -> FfiResult<usize> {
        let mut s = self.inner.lock()?;
        let index = match s.free.pop() {
            Some(i) => i,
            None => {
                if s.slots.len() >= MAX_SLOTS {
                    return Err(self.tokens.full(MAX_SLOTS));
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
        Ok(self.tokens.encode(index, generation))
    }

    /// The object behind `token`.
    pub(crate) fn get(&self, token: usize) -> FfiResult<Arc<T>>
    where
        T: Send + Sync + 'static,
    {
        let (index, generation) = self.tokens.decode(token, MAX_SLOTS)?;
        let entry = usize::from(self.tokens.tag & 15);
        // The same handle as this thread's last lookup, and nothing removed
        // from the table since: the object is the one found then. A removal
        // made by this thread, or made before the caller handed the handle
        // over (which orders it first), is seen here.
        let removals = self.removals.load(Ordering::Acquire);
        // (`try_with`: a call from a thread-local destructor, after this
        // thread's cache is gone, takes the lock.)
        let hit = LOOKUPS
            .try_with(|c| {
                let c = c.borrow();
                let cached = c[entry].as_ref()?;
                if cached.token != token
                    || cached.removals != removals
                    || cached.type_id != TypeId::of::<T>()
                {
                    return None;
                }
                let object = cached.object.upgrade()?;
                // SAFETY: the object is a `T` (its type id was checked):
                // the same conversion `Arc::downcast` makes, without asking
                // the object its type again.
                Some(unsafe { Arc::from_raw(Arc::into_raw(object) as *const T) })
            })
            .ok()
            .flatten();
        if let Some(v) = hit {
            return Ok(v);
        }
        let v = {
            let s = self.inner.lock()?;
            match s.slots.get(index) {
                Some(Slot {
                    generation: g,
                    value: Some(v),
                }) if *g == generation => v.clone(),
                _ => return Err(self.tokens.invalid()),
            }
        };
        let object: Arc<dyn Any + Send + Sync> = v.clone();
        let _ = LOOKUPS.try_with(|c| {
            c.borrow_mut()[entry] = Some(Cached {
                token,
                removals,
                type_id: TypeId::of::<T>(),
                object: Arc::downgrade(&object),
            })
        });
        Ok(v)
    }

    /// Removes the object behind `token`; it is dropped when its last user
    /// (a call in progress on another thread) finishes.
    pub(crate) fn remove(&self, token: usize) -> FfiResult<Arc<T>> {
        let (index, generation) = self.tokens.decode(token, MAX_SLOTS)?;
        let mut s = self.inner.lock()?;
        let slot = match s.slots.get_mut(index) {
            Some(slot) if slot.generation == generation && slot.value.is_some() => slot,
            _ => return Err(self.tokens.invalid()),
        };
        let v = slot.value.take().expect("checked above");
        // Skip 0 so a token is never NULL.
        slot.generation = slot.generation.checked_add(1).unwrap_or(1);
        s.free.push(index);
        s.live -= 1;
        self.removals.fetch_add(1, Ordering::Release);
        Ok(v)
    }

    /// Number of live handles (for leak checks in tests).
    pub(crate) fn live(&self) -> usize {
        self.inner.lock().map(|s| s.live).unwrap_or(0)
    }
}

/// A table of small ids (below 2^31) whose lookups take no lock: for
/// handles on a hot path that name something immutable and `'static` (a
/// GPU of the process-wide instance), so a lookup is one atomic load.
/// Tokens are encoded and checked by the same [`Tokens`] as [`Table`]'s: a
/// stale, forged or wrongly typed token is rejected.
pub(crate) struct IdTable<const N: usize> {
    tokens: Tokens,
    /// Per slot: the generation in the high half, then [`LIVE`] and the id;
    /// 0 for a slot never used.
    words: [AtomicU64; N],
    alloc: Lock<Indices>,
}

/// A table's slot indices: freed ones are taken again before the table
/// grows.
pub(crate) struct Indices {
    free: Vec<usize>,
    next: usize,
    live: usize,
}

impl Indices {
    pub(crate) const fn new() -> Self {
        Indices {
            free: Vec::new(),
            next: 0,
            live: 0,
        }
    }

    /// A free index below `max`; `None` when all of them are live.
    pub(crate) fn take(&mut self, max: usize) -> Option<usize> {
        let index = match self.free.pop() {
            Some(i) => i,
            None if self.next < max => {
                self.next += 1;
                self.next - 1
            }
            None => return None,
        };
        self.live += 1;
        Some(index)
    }

    /// Frees `index` (taken before) for a later handle.
    pub(crate) fn give_back(&mut self, index: usize) {
        self.free.push(index);
        self.live -= 1;
    }

    /// How many indices are taken.
    pub(crate) fn live(&self) -> usize {
        self.live
    }
}

const LIVE: u64 = 1 << 31;
const ID_MASK: u64 = LIVE - 1;

impl<const N: usize> IdTable<N> {
    pub(crate) const fn new(tag: u8, what: &'static str) -> Self {
        assert!(N <= MAX_SLOTS);
        IdTable {
            tokens: Tokens { tag, what },
            words: [const { AtomicU64::new(0) }; N],
            alloc: Lock::new(Indices::new()),
        }
    }

    /// Stores `id` and returns its token.
    pub(crate) fn insert(&self, id: u32) -> FfiResult<usize> {
        debug_assert!(u64::from(id) <= ID_MASK);
        let mut a = self.alloc.lock()?;
        let index = a.take(N).ok_or_else(|| self.tokens.full(N))?;
        // Freeing already advanced the generation; a slot never used starts at 1.
        let generation = ((self.words[index].load(Ordering::Relaxed) >> 32) as u32).max(1);
        self.words[index].store(
            (u64::from(generation) << 32) | LIVE | (u64::from(id) & ID_MASK),
            Ordering::Release,
        );
        Ok(self.tokens.encode(index, generation))
    }

    /// The id behind `token`, without taking a lock.
    #[inline]
    pub(crate) fn get(&self, token: usize) -> FfiResult<u32> {
        let (index, generation) = self.tokens.decode(token, N)?;
        let w = self.words[index].load(Ordering::Acquire);
        if (w >> 32) as u32 == generation && w & LIVE != 0 {
            return Ok((w & ID_MASK) as u32);
        }
        Err(self.tokens.invalid())
    }

    /// Frees `token`; a stale token is rejected.
    pub(crate) fn remove(&self, token: usize) -> FfiResult<u32> {
        let (index, generation) = self.tokens.decode(token, N)?;
        let mut a = self.alloc.lock()?;
        let w = self.words[index].load(Ordering::Relaxed);
        if (w >> 32) as u32 != generation || w & LIVE == 0 {
            return Err(self.tokens.invalid());
        }
        // Skip 0 so a token is never NULL.
        let next = generation.checked_add(1).unwrap_or(1);
        self.words[index].store(u64::from(next) << 32, Ordering::Release);
        a.give_back(index);
        Ok((w & ID_MASK) as u32)
    }

    /// Number of live handles (for leak checks in tests).
    pub(crate) fn live(&self) -> usize {
        self.alloc.lock().map(|a| a.live()).unwrap_or(0)
    }
}

/// A C handle type (`memprobe_source`, `memprobe_window`, ...) and the table
/// holding its objects: [`get`], [`publish`] and [`release`] serve them all.
pub(crate) trait Handle: Sized {
    /// What a handle names.
    type Object: 'static;
    /// The handles' table.
    fn table() -> &'static Table<Self::Object>;
}

/// The object behind a handle (NULL: NULL_POINTER; stale, forged or of
/// another type: INVALID_HANDLE).
pub(crate) fn get<H: Handle>(h: *const H) -> FfiResult<Arc<H::Object>>
where
    H::Object: Send + Sync,
{
    if h.is_null() {
        return Err(crate::boundary::null(H::table().tokens.what));
    }
    H::table().get(h as usize)
}

/// Stores `object` and writes its new handle to `*out` (untouched on failure).
pub(crate) fn publish<H: Handle>(object: H::Object, out: *mut *mut H) -> FfiResult {
    let slot = crate::boundary::out(out, "out")?;
    *slot = H::table().insert(object)? as *mut H;
    Ok(())
}

/// Removes a handle's object (NULL: nothing, `None`); it is dropped when
/// its last user finishes.
pub(crate) fn release<H: Handle>(h: *mut H) -> FfiResult<Option<Arc<H::Object>>> {
    if h.is_null() {
        return Ok(None);
    }
    H::table().remove(h as usize).map(Some)
}

/// Number of live handles of a type (for leak checks in tests).
pub(crate) fn live<H: Handle>() -> usize {
    H::table().live()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_table_checks_tokens() {
        static T: IdTable<2> = IdTable::new(0x33, "thing");
        let a = T.insert(7).unwrap();
        let b = T.insert(9).unwrap();
        assert_eq!((T.get(a).ok(), T.get(b).ok()), (Some(7), Some(9)));
        assert_eq!(
            T.insert(1).err().map(|e| e.status),
            Some(memprobe_status::InvalidArgument)
        );
        assert_eq!(T.remove(a).ok(), Some(7));
        let invalid = Some(memprobe_status::InvalidHandle);
        assert_eq!(T.get(a).err().map(|e| e.status), invalid);
        assert_eq!(T.remove(a).err().map(|e| e.status), invalid);
        // The slot is reused under a new generation: the old token stays dead.
        let c = T.insert(3).unwrap();
        assert_ne!(c, a);
        assert_eq!(T.get(a).err().map(|e| e.status), invalid);
        assert_eq!(T.get(c).ok(), Some(3));
        // Forged, wrongly tagged, out of range.
        for token in [0usize, 0x1234, a ^ (1 << 57), (0x33 << 56) | (5 << 32) | 1] {
            assert_eq!(T.get(token).err().map(|e| e.status), invalid, "{token:#x}");
        }
        assert_eq!(T.live(), 2);
        T.remove(b).unwrap();
        T.remove(c).unwrap();
        assert_eq!(T.live(), 0);
    }
}
