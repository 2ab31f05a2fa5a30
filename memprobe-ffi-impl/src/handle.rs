//! The handle table: C handles are opaque tokens, never pointers to memory.
//!
//! A token packs a type tag, a slot index and the slot's generation. Freeing
//! bumps the generation, so a stale token (use after free, double free), a
//! token of another type, or a forged value is answered with
//! `MEMPROBE_STATUS_INVALID_HANDLE` instead of touching freed memory.
//!
//! One table type, `Table`, with one token format, one slot allocator and
//! slots at fixed addresses for the life of the process (kept in chunks
//! that are never freed), holds every kind of handle. How a call reaches
//! the object is the table's `Kind`:
//!
//! - `Shared`: a call takes a reference (`Arc`) to the object and may
//!   keep it beyond the call (a source held by a window, a tracker the
//!   driver's out-of-memory hook holds weakly); the object has its own lock
//!   if it needs one. A thread's last lookup is cached: a hot loop calling
//!   with the same handle takes no lock.
//! - `Locked`: every call uses the object under a lock (windows, traces,
//!   exporters), and the lock is the slot's own: a call locks the slot the
//!   token names and checks the token's generation under that lock, one
//!   lock, no reference count. Freeing takes the same lock, so it waits for
//!   a call in progress on the handle, and the object is dropped before the
//!   free returns.
//! - `Ids`: small immutable ids (a GPU of the process-wide instance), read
//!   with one atomic load and no lock.

use crate::boundary::{FfiError, FfiResult};
use crate::status::memprobe_status;
use memprobe_core::internal::lock::{Lock, LockGuard};
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

const _: () = assert!(
    std::mem::size_of::<usize>() == 8,
    "handles need 64-bit pointers"
);

const INDEX_BITS: u32 = 24;
pub(crate) const MAX_SLOTS: usize = 1 << INDEX_BITS;

/// Chunk `k` holds `FIRST_CHUNK << k` slots.
const FIRST_CHUNK: usize = 64;
/// Enough chunks for [`MAX_SLOTS`] slots.
const CHUNKS: usize = (usize::BITS - (MAX_SLOTS + FIRST_CHUNK).leading_zeros()) as usize
    - FIRST_CHUNK.trailing_zeros() as usize;

/// The token format: a type tag in the top byte, the slot index in the next
/// 24 bits, the slot's generation (never 0) below.
#[derive(Debug)]
struct Tokens {
    tag: u8,
    what: &'static str,
}

impl Tokens {
    fn encode(&self, index: usize, generation: u32) -> usize {
        (usize::from(self.tag) << 56) | (index << 32) | generation as usize
    }

    /// (index, generation); INVALID_HANDLE for a token of another table or
    /// an index at or above `slots`.
    fn decode(&self, token: usize, slots: usize) -> FfiResult<(usize, u32)> {
        let index = (token >> 32) & (MAX_SLOTS - 1);
        if token >> 56 == usize::from(self.tag) && index < slots {
            Ok((index, token as u32))
        } else {
            Err(self.invalid())
        }
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

    fn full(&self, max: usize) -> FfiError {
        FfiError::new(
            memprobe_status::InvalidArgument,
            format!("more than {max} live {} handles", self.what),
        )
    }
}

/// A table's slot indices: freed ones are taken again before the table
/// grows.
struct Indices {
    free: Vec<usize>,
    next: usize,
    live: usize,
}

impl Indices {
    /// A free index below `max`; `None` when all of them are live.
    fn take(&mut self, max: usize) -> Option<usize> {
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
    fn give_back(&mut self, index: usize) {
        self.free.push(index);
        self.live -= 1;
    }
}

/// The chunk holding slot `index`, and the slot's place in it.
#[inline]
fn place(index: usize) -> (usize, usize) {
    let i = index + FIRST_CHUNK;
    let k = (usize::BITS - 1 - i.leading_zeros()) as usize - FIRST_CHUNK.trailing_zeros() as usize;
    (k, i - (FIRST_CHUNK << k))
}

/// How calls reach a table's objects of type `T`: what a slot holds, and
/// how an object goes in and comes out.
pub(crate) trait Kind<T>: Sized + 'static {
    /// One slot.
    type Slot: Send + Sync + 'static;
    /// What freeing a handle gives back.
    type Removed;
    /// A slot never used.
    fn empty() -> Self::Slot;
    /// Stores `value` and returns its token.
    fn insert(table: &Table<T, Self>, value: T) -> FfiResult<usize>;
    /// Frees `token` and gives its object back.
    fn remove(table: &Table<T, Self>, token: usize) -> FfiResult<Self::Removed>;
}

/// A slot of the [`Shared`] and [`Locked`] kinds: its generation (a token's
/// must match) and its value, if live, behind the slot's lock.
pub(crate) struct Entry<V> {
    generation: u32,
    value: Option<V>,
}

/// Calls take a reference to the object (see the module's docs).
pub(crate) struct Shared;
/// Calls hold the slot's lock (see the module's docs).
pub(crate) struct Locked;
/// Small ids read without a lock (see the module's docs).
pub(crate) struct Ids;

/// A process-wide table of the objects of one C handle type.
pub(crate) struct Table<T, K: Kind<T>> {
    tokens: Tokens,
    chunks: [AtomicPtr<K::Slot>; CHUNKS],
    alloc: Lock<Indices>,
    /// At most this many live handles.
    max: usize,
    /// Bumped by every removal: a thread's cached lookup (see [`Cached`])
    /// made before it is stale.
    removals: AtomicU64,
    _objects: PhantomData<fn() -> T>,
}

impl<T, K: Kind<T>> Table<T, K> {
    pub(crate) const fn new(tag: u8, what: &'static str) -> Self {
        Self::with_max(tag, what, MAX_SLOTS)
    }

    /// A table of at most `max` live handles.
    pub(crate) const fn with_max(tag: u8, what: &'static str, max: usize) -> Self {
        assert!(max <= MAX_SLOTS);
        Table {
            tokens: Tokens { tag, what },
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
            alloc: Lock::new(Indices {
                free: Vec::new(),
                next: 0,
                live: 0,
            }),
            max,
            removals: AtomicU64::new(0),
            _objects: PhantomData,
        }
    }

    /// Slot `index`, if its chunk exists.
    #[inline]
    fn slot(&self, index: usize) -> Option<&'static K::Slot> {
        let (k, at) = place(index);
        let chunk = self.chunks.get(k)?.load(Ordering::Acquire);
        // SAFETY: a published chunk holds `FIRST_CHUNK << k` initialised
        // slots (written before the Release store that published it) and
        // is never freed; `at` is below that by `place`.
        unsafe { chunk.as_ref().map(|_| &*chunk.add(at)) }
    }

    /// The slot of `token` (INVALID_HANDLE when it cannot be one of this
    /// table's), with its index and the token's generation.
    #[inline]
    fn slot_of(&self, token: usize) -> FfiResult<(usize, u32, &'static K::Slot)> {
        let (index, generation) = self.tokens.decode(token, self.max)?;
        let slot = self.slot(index).ok_or_else(|| self.tokens.invalid())?;
        Ok((index, generation, slot))
    }

    /// A free slot (its chunk made when it is the first of it), under the
    /// indices' lock the caller holds.
    fn take_slot(&self, alloc: &mut Indices) -> FfiResult<(usize, &'static K::Slot)> {
        let index = alloc
            .take(self.max)
            .ok_or_else(|| self.tokens.full(self.max))?;
        let (k, _) = place(index);
        if self.chunks[k].load(Ordering::Relaxed).is_null() {
            let chunk: Box<[K::Slot]> = (0..FIRST_CHUNK << k).map(|_| K::empty()).collect();
            self.chunks[k].store(Box::leak(chunk).as_mut_ptr(), Ordering::Release);
        }
        Ok((index, self.slot(index).expect("made above")))
    }

    /// Frees slot `index` for a later handle. Cannot fail: this thread
    /// holds no memprobe lock here that a re-entry check would refuse, but
    /// should it, the slot stays out of use rather than be reused twice.
    fn give_back(&self, index: usize) {
        if let Ok(mut a) = self.alloc.lock() {
            a.give_back(index);
        }
        self.removals.fetch_add(1, Ordering::Release);
    }

    /// Number of live handles (for leak checks in tests).
    pub(crate) fn live(&self) -> usize {
        self.alloc.lock().map(|a| a.live).unwrap_or(0)
    }

    /// Stores `value` and returns its token.
    pub(crate) fn insert(&self, value: T) -> FfiResult<usize> {
        K::insert(self, value)
    }

    /// Frees `token`; a stale, forged or wrongly typed token is rejected.
    pub(crate) fn remove(&self, token: usize) -> FfiResult<K::Removed> {
        K::remove(self, token)
    }
}

/// Stores `value` in a new slot of a [`Shared`] or [`Locked`] table.
fn insert_entry<T, K, V>(table: &Table<T, K>, value: V) -> FfiResult<usize>
where
    K: Kind<T, Slot = Lock<Entry<V>>>,
    V: Send + 'static,
{
    let mut a = table.alloc.lock()?;
    let (index, slot) = table.take_slot(&mut a)?;
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
    Ok(table.tokens.encode(index, generation))
}

/// Takes the value out of a [`Shared`] or [`Locked`] table's slot (after
/// any call in progress that holds the slot's lock) and frees the slot.
fn remove_entry<T, K, V>(table: &Table<T, K>, token: usize) -> FfiResult<V>
where
    K: Kind<T, Slot = Lock<Entry<V>>>,
    V: Send + 'static,
{
    let (index, generation, slot) = table.slot_of(token)?;
    let value = {
        let mut e = slot.lock()?;
        if e.generation != generation {
            return Err(table.tokens.invalid());
        }
        let value = e.value.take().ok_or_else(|| table.tokens.invalid())?;
        // Skip 0 so a token is never NULL.
        e.generation = e.generation.checked_add(1).unwrap_or(1);
        value
    };
    table.give_back(index);
    Ok(value)
}

fn empty_entry<V>() -> Lock<Entry<V>> {
    Lock::new(Entry {
        generation: 1,
        value: None,
    })
}

impl<T: Send + Sync + 'static> Kind<T> for Shared {
    type Slot = Lock<Entry<Arc<T>>>;
    type Removed = Arc<T>;
    fn empty() -> Self::Slot {
        empty_entry()
    }
    fn insert(table: &Table<T, Self>, value: T) -> FfiResult<usize> {
        insert_entry(table, Arc::new(value))
    }
    /// The object is dropped when its last user (a call in progress on
    /// another thread) finishes.
    fn remove(table: &Table<T, Self>, token: usize) -> FfiResult<Arc<T>> {
        remove_entry(table, token)
    }
}

impl<T: Send + 'static> Kind<T> for Locked {
    type Slot = Lock<Entry<T>>;
    type Removed = T;
    fn empty() -> Self::Slot {
        empty_entry()
    }
    fn insert(table: &Table<T, Self>, value: T) -> FfiResult<usize> {
        insert_entry(table, value)
    }
    fn remove(table: &Table<T, Self>, token: usize) -> FfiResult<T> {
        remove_entry(table, token)
    }
}

/// One thread's last lookup in one shared table: the token, the table's
/// removal count then, and the object, held weakly (a removed object is
/// dropped when its last call ends, whatever the caches).
struct Cached {
    token: usize,
    removals: u64,
    /// The object's type, checked without a virtual call.
    type_id: TypeId,
    object: Weak<dyn Any + Send + Sync>,
}

thread_local! {
    /// Per table (its tag's low 4 bits: the shared tables' tags differ
    /// there), the last lookup.
    static LOOKUPS: RefCell<[Option<Cached>; 16]> = const { RefCell::new([const { None }; 16]) };
}

impl<T: Send + Sync + 'static> Table<T, Shared> {
    /// The object behind `token`.
    pub(crate) fn get(&self, token: usize) -> FfiResult<Arc<T>> {
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
        let (_, generation, slot) = self.slot_of(token)?;
        let v = {
            let e = slot.lock()?;
            match &e.value {
                Some(v) if e.generation == generation => v.clone(),
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
}

/// A call's hold on a live object of a [`Locked`] table: the slot's lock,
/// held until dropped.
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

impl<T: Send + 'static> Table<T, Locked> {
    /// Locks the object behind `token` (INVALID_HANDLE when freed, never
    /// made, or of another type; WRONG_ORDER when this thread holds it).
    #[inline]
    pub(crate) fn lock(&self, token: usize) -> FfiResult<Held<T>> {
        let (_, generation, slot) = self.slot_of(token)?;
        let e = slot.lock()?;
        if e.generation != generation || e.value.is_none() {
            return Err(self.tokens.invalid());
        }
        Ok(Held(e))
    }
}

/// An [`Ids`] slot's word: the generation in the high half, then [`LIVE`]
/// and the id; 0 for a slot never used.
const LIVE: u64 = 1 << 31;
const ID_MASK: u64 = LIVE - 1;

impl Kind<u32> for Ids {
    type Slot = AtomicU64;
    type Removed = u32;
    fn empty() -> AtomicU64 {
        AtomicU64::new(0)
    }
    fn insert(table: &Table<u32, Self>, id: u32) -> FfiResult<usize> {
        debug_assert!(u64::from(id) <= ID_MASK);
        let mut a = table.alloc.lock()?;
        let (index, word) = table.take_slot(&mut a)?;
        // Freeing already advanced the generation; a slot never used starts at 1.
        let generation = ((word.load(Ordering::Relaxed) >> 32) as u32).max(1);
        word.store(
            (u64::from(generation) << 32) | LIVE | (u64::from(id) & ID_MASK),
            Ordering::Release,
        );
        Ok(table.tokens.encode(index, generation))
    }
    fn remove(table: &Table<u32, Self>, token: usize) -> FfiResult<u32> {
        let (index, generation, word) = table.slot_of(token)?;
        let mut a = table.alloc.lock()?;
        let w = word.load(Ordering::Relaxed);
        if (w >> 32) as u32 != generation || w & LIVE == 0 {
            return Err(table.tokens.invalid());
        }
        // Skip 0 so a token is never NULL.
        let next = generation.checked_add(1).unwrap_or(1);
        word.store(u64::from(next) << 32, Ordering::Release);
        a.give_back(index);
        Ok((w & ID_MASK) as u32)
    }
}

impl Table<u32, Ids> {
    /// The id behind `token`, without taking a lock.
    #[inline]
    pub(crate) fn get(&self, token: usize) -> FfiResult<u32> {
        let (_, generation, word) = self.slot_of(token)?;
        let w = word.load(Ordering::Acquire);
        if (w >> 32) as u32 == generation && w & LIVE != 0 {
            return Ok((w & ID_MASK) as u32);
        }
        Err(self.tokens.invalid())
    }
}

/// A C handle type (`memprobe_source`, `memprobe_window`, ...) and the table
/// holding its objects: [`publish`], [`release`] and [`live`] serve them
/// all, [`get`] the shared ones and [`lock`] the locked ones.
pub(crate) trait Handle: Sized {
    /// What a handle names.
    type Object: 'static;
    /// How calls reach it.
    type Kind: Kind<Self::Object>;
    /// The handles' table.
    fn table() -> &'static Table<Self::Object, Self::Kind>;
}

/// The object behind a shared handle (NULL: NULL_POINTER; stale, forged or
/// of another type: INVALID_HANDLE).
pub(crate) fn get<H>(h: *const H) -> FfiResult<Arc<H::Object>>
where
    H: Handle<Kind = Shared>,
    H::Object: Send + Sync,
{
    if h.is_null() {
        return Err(crate::boundary::null(H::table().tokens.what));
    }
    H::table().get(h as usize)
}

/// Locks the object behind a locked handle (NULL: NULL_POINTER; stale,
/// forged or of another type: INVALID_HANDLE; held by this thread:
/// WRONG_ORDER).
#[inline]
pub(crate) fn lock<H>(h: *const H) -> FfiResult<Held<H::Object>>
where
    H: Handle<Kind = Locked>,
    H::Object: Send,
{
    if h.is_null() {
        return Err(crate::boundary::null(H::table().tokens.what));
    }
    H::table().lock(h as usize)
}

/// Stores `object` and writes its new handle to `*out` (untouched on failure).
pub(crate) fn publish<H: Handle>(object: H::Object, out: *mut *mut H) -> FfiResult {
    let slot = crate::boundary::out(out, "out")?;
    *slot = H::table().insert(object)? as *mut H;
    Ok(())
}

/// Frees a handle and gives its object back (NULL: nothing, `None`): a
/// shared object is dropped when its last user finishes, a locked one
/// after any call in progress on it.
pub(crate) fn release<H: Handle>(
    h: *mut H,
) -> FfiResult<Option<<H::Kind as Kind<H::Object>>::Removed>> {
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

    const INVALID: Option<memprobe_status> = Some(memprobe_status::InvalidHandle);

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
    fn ids_check_tokens() {
        static T: Table<u32, Ids> = Table::with_max(0x33, "thing", 2);
        let a = T.insert(7).unwrap();
        let b = T.insert(9).unwrap();
        assert_eq!((T.get(a).ok(), T.get(b).ok()), (Some(7), Some(9)));
        assert_eq!(
            T.insert(1).err().map(|e| e.status),
            Some(memprobe_status::InvalidArgument)
        );
        assert_eq!(T.remove(a).ok(), Some(7));
        assert_eq!(T.get(a).err().map(|e| e.status), INVALID);
        assert_eq!(T.remove(a).err().map(|e| e.status), INVALID);
        // The slot is reused under a new generation: the old token stays dead.
        let c = T.insert(3).unwrap();
        assert_ne!(c, a);
        assert_eq!(T.get(a).err().map(|e| e.status), INVALID);
        assert_eq!(T.get(c).ok(), Some(3));
        // Forged, wrongly tagged, out of range.
        for token in [0usize, 0x1234, a ^ (1 << 57), (0x33 << 56) | (5 << 32) | 1] {
            assert_eq!(T.get(token).err().map(|e| e.status), INVALID, "{token:#x}");
        }
        assert_eq!(T.live(), 2);
        T.remove(b).unwrap();
        T.remove(c).unwrap();
        assert_eq!(T.live(), 0);
    }

    #[test]
    fn shared_objects_outlive_their_handle_while_a_call_holds_them() {
        static T: Table<String, Shared> = Table::new(0x3a, "thing");
        let a = T.insert("a".into()).unwrap();
        let held = T.get(a).unwrap();
        // The cached lookup and the locked one agree.
        assert!(Arc::ptr_eq(&held, &T.get(a).unwrap()));
        let removed = T.remove(a).unwrap();
        assert!(Arc::ptr_eq(&held, &removed));
        assert_eq!(*held, "a");
        // Removed: the cache of this thread is stale, the token dead.
        assert_eq!(T.get(a).err().map(|e| e.status), INVALID);
        assert_eq!(T.remove(a).err().map(|e| e.status), INVALID);
        let b = T.insert("b".into()).unwrap();
        assert_ne!(a, b);
        assert_eq!(T.get(a).err().map(|e| e.status), INVALID);
        assert_eq!(*T.get(b).unwrap(), "b");
        for token in [
            0usize,
            b ^ (1 << 57),
            (0x3a << 56) | ((MAX_SLOTS - 1) << 32) | 1,
        ] {
            assert_eq!(T.get(token).err().map(|e| e.status), INVALID, "{token:#x}");
        }
        assert_eq!(T.live(), 1);
        T.remove(b).unwrap();
        assert_eq!(T.live(), 0);
    }

    #[test]
    fn locked_tokens_are_checked_and_free_drops_the_object() {
        static T: Table<Arc<()>, Locked> = Table::new(0x3c, "thing");
        let object = Arc::new(());
        let a = T.insert(object.clone()).unwrap();
        let b = T.insert(object.clone()).unwrap();
        assert_eq!(Arc::strong_count(&object), 3);
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
        assert_eq!(Arc::strong_count(&object), 2);
        assert_eq!(T.lock(a).err().map(|e| e.status), INVALID);
        assert_eq!(T.remove(a).err().map(|e| e.status), INVALID);
        // The slot is reused under a new generation: the old token stays dead.
        let c = T.insert(object.clone()).unwrap();
        assert_ne!(c, a);
        assert_eq!(T.lock(a).err().map(|e| e.status), INVALID);
        assert!(T.lock(c).is_ok());
        // Forged, wrongly tagged, in a chunk never made.
        for token in [
            0usize,
            0x1234,
            a ^ (1 << 57),
            (0x3c << 56) | (5 << 32) | 1,
            (0x3c << 56) | ((MAX_SLOTS - 1) << 32) | 1,
        ] {
            assert_eq!(T.lock(token).err().map(|e| e.status), INVALID, "{token:#x}");
        }
        assert_eq!(T.live(), 2);
        drop(T.remove(b).unwrap());
        drop(T.remove(c).unwrap());
        assert_eq!((T.live(), Arc::strong_count(&object)), (0, 1));
    }

    /// A free waits for a call in progress on the handle on another thread,
    /// then the call's handle is dead.
    #[test]
    fn a_locked_free_waits_for_a_call_in_progress() {
        static T: Table<u32, Locked> = Table::new(0x3d, "thing");
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

    /// Slots past the first chunk (many live handles) keep their objects,
    /// in every kind.
    #[test]
    fn many_handles_in_many_chunks() {
        static L: Table<usize, Locked> = Table::new(0x3e, "thing");
        static S: Table<usize, Shared> = Table::new(0x3f, "thing");
        static I: Table<u32, Ids> = Table::new(0x30, "thing");
        let tokens: Vec<(usize, usize, usize)> = (0..1000)
            .map(|i| {
                (
                    L.insert(i).unwrap(),
                    S.insert(i).unwrap(),
                    I.insert(i as u32).unwrap(),
                )
            })
            .collect();
        for (i, &(l, s, d)) in tokens.iter().enumerate() {
            assert_eq!(*L.lock(l).unwrap(), i);
            assert_eq!(*S.get(s).unwrap(), i);
            assert_eq!(I.get(d).unwrap(), i as u32);
        }
        for (l, s, d) in tokens {
            L.remove(l).unwrap();
            S.remove(s).unwrap();
            I.remove(d).unwrap();
        }
        assert_eq!((L.live(), S.live(), I.live()), (0, 0, 0));
    }
}
