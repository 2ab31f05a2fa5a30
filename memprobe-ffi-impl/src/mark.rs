//! Exact sources over a caller's resettable marks through the C ABI.
//!
//! A framework's allocator (PyTorch's caching allocator, a custom pool)
//! keeps a high-water mark of its own that one call resets. A
//! `memprobe_mark_group` wraps the caller's three functions (read current,
//! read peak, reset) and `memprobe_source_new_mark` makes one exact source
//! per mark; the core's [`MarkGroup`] folds every member's mark into its
//! windows before a shared reset, so windows over different members never
//! lose each other's peaks.

use crate::boundary::{entry_point, free_point, text, UserData};
use crate::handle::{get, publish, release, Handle, Shared, Table};
use crate::source::memprobe_source;
use crate::status::memprobe_status;
use memprobe_core::{Error, ErrorKind, MarkGroup, MarkValue, Marks, Result, Source, SourceKind};
use std::ffi::{c_char, c_void};

/// A group of marks sharing one reset (e.g. one device's allocated,
/// reserved and active bytes). Sources made over it keep it alive.
#[allow(non_camel_case_types)]
pub struct memprobe_mark_group {
    _private: [u8; 0],
}

static GROUPS: Table<MarkGroup, Shared> = Table::new(0x4d, "memprobe_mark_group");

impl Handle for memprobe_mark_group {
    type Object = MarkGroup;
    type Kind = Shared;
    fn table() -> &'static Table<MarkGroup, Shared> {
        &GROUPS
    }
}

/// Reads mark `index` of a group: the bytes in use now (`current`) or the
/// high-water mark since the last reset (`peak`), stored in `*out_bytes`.
/// Returns 0 on success, non-zero on failure.
#[allow(non_camel_case_types)]
pub type memprobe_mark_read_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, index: usize, out_bytes: *mut u64) -> i32>;

/// Resets every mark of a group to its current value. Returns 0 on success,
/// non-zero on failure.
#[allow(non_camel_case_types)]
pub type memprobe_mark_reset_fn = Option<unsafe extern "C" fn(user_data: *mut c_void) -> i32>;

/// Which value of its marks a memprobe_mark_read_many_fn reads.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum memprobe_mark_value {
    /// The bytes in use now.
    Current = 0,
    /// The high-water mark since the group's last reset.
    Peak = 1,
}

/// Reads one value (`what`, a memprobe_mark_value) of `count` marks of a
/// group at once: `out_bytes[i]` receives the value of mark `indices[i]`.
/// Returns 0 on success, non-zero on failure.
#[allow(non_camel_case_types)]
pub type memprobe_mark_read_many_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        what: u32,
        indices: *const usize,
        count: usize,
        out_bytes: *mut u64,
    ) -> i32,
>;

/// The caller's three functions behind [`Marks`].
struct CMarks {
    current: unsafe extern "C" fn(*mut c_void, usize, *mut u64) -> i32,
    peak: unsafe extern "C" fn(*mut c_void, usize, *mut u64) -> i32,
    reset: unsafe extern "C" fn(*mut c_void) -> i32,
    data: UserData,
}

/// The core adds the source's name, the mark index and the function to
/// this message; a callback's failure is UNAVAILABLE, as for custom read
/// callbacks.
fn failed(what: &str, rc: i32) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{what} callback returned {rc}"),
    )
}

/// Calls the caller's reset function.
fn reset(f: unsafe extern "C" fn(*mut c_void) -> i32, data: &UserData) -> Result<()> {
    // SAFETY: the caller's function with the caller's data, per the
    // contract of memprobe_mark_group_new(_many).
    let rc = unsafe { f(data.get()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(failed("reset", rc))
    }
}

impl CMarks {
    fn read(
        &self,
        f: unsafe extern "C" fn(*mut c_void, usize, *mut u64) -> i32,
        what: &str,
        index: usize,
    ) -> Result<u64> {
        let mut bytes = 0u64;
        // SAFETY: the caller's function with the caller's data, per the
        // contract of memprobe_mark_group_new.
        let rc = unsafe { f(self.data.get(), index, &mut bytes) };
        if rc == 0 {
            Ok(bytes)
        } else {
            Err(failed(what, rc))
        }
    }
}

impl Marks for CMarks {
    fn current(&mut self, index: usize) -> Result<u64> {
        self.read(self.current, "current", index)
    }

    fn peak(&mut self, index: usize) -> Result<u64> {
        self.read(self.peak, "peak", index)
    }

    fn reset(&mut self) -> Result<()> {
        reset(self.reset, &self.data)
    }
}

type ReadManyFn = unsafe extern "C" fn(*mut c_void, u32, *const usize, usize, *mut u64) -> i32;

/// The caller's two functions behind [`Marks`] when it reads every mark of
/// a group from one snapshot.
struct CMarksMany {
    read: ReadManyFn,
    reset: unsafe extern "C" fn(*mut c_void) -> i32,
    data: UserData,
}

impl CMarksMany {
    fn one(&self, what: memprobe_mark_value, index: usize) -> Result<u64> {
        let mut out = [0u64];
        self.many(what, &[index], &mut out)?;
        Ok(out[0])
    }

    fn many(&self, what: memprobe_mark_value, indices: &[usize], out: &mut [u64]) -> Result<()> {
        // SAFETY: the caller's function with the caller's data, per the
        // contract of memprobe_mark_group_new_many; both arrays hold
        // `indices.len()` elements.
        let rc = unsafe {
            (self.read)(
                self.data.get(),
                what as u32,
                indices.as_ptr(),
                indices.len(),
                out.as_mut_ptr(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(failed("read_many", rc))
        }
    }
}

impl Marks for CMarksMany {
    fn current(&mut self, index: usize) -> Result<u64> {
        self.one(memprobe_mark_value::Current, index)
    }

    fn peak(&mut self, index: usize) -> Result<u64> {
        self.one(memprobe_mark_value::Peak, index)
    }

    fn reset(&mut self) -> Result<()> {
        reset(self.reset, &self.data)
    }

    fn read_many(
        &mut self,
        what: MarkValue,
        indices: &[usize],
        out: &mut [u64],
    ) -> Option<Result<()>> {
        let what = match what {
            MarkValue::Current => memprobe_mark_value::Current,
            MarkValue::Peak => memprobe_mark_value::Peak,
        };
        Some(self.many(what, indices, out))
    }
}

/// A group of resettable marks kept by the caller (a framework allocator's
/// allocated / reserved / active bytes, per device): `current(user_data,
/// index, &bytes)` reads the bytes in use of mark `index`, `peak(user_data,
/// index, &bytes)` its high-water mark since the last reset, and
/// `reset(user_data)` resets every mark of the group at once. Each returns 0
/// on success; a non-zero return fails the memprobe call that needed it with
/// MEMPROBE_STATUS_UNAVAILABLE and a message naming the source, the mark
/// index and the callback, and leaves every window's peak intact.
///
/// The callbacks are called one at a time per group (memprobe holds the
/// group's lock around each), on the thread that reads a source or opens,
/// resets or closes a window (trace, tracker phase) over one of the group's
/// sources, or on an exporter's thread when a scrape reads such a source;
/// never by the monitor thread (mark sources are exact, never polled). A callback must
/// not call memprobe on a source, window, trace or tracker over the same
/// group: such a call fails with MEMPROBE_STATUS_WRONG_ORDER.
///
/// `user_data` is handed back to the callbacks and must stay valid until
/// the group and every source, window, trace or tracker over it are freed.
#[no_mangle]
pub extern "C" fn memprobe_mark_group_new(
    current: memprobe_mark_read_fn,
    peak: memprobe_mark_read_fn,
    reset: memprobe_mark_reset_fn,
    user_data: *mut c_void,
    out: *mut *mut memprobe_mark_group,
) -> memprobe_status {
    entry_point("memprobe_mark_group_new", || {
        crate::boundary::out(out, "out")?;
        let marks = CMarks {
            current: current.ok_or_else(|| crate::boundary::null("current"))?,
            peak: peak.ok_or_else(|| crate::boundary::null("peak"))?,
            reset: reset.ok_or_else(|| crate::boundary::null("reset"))?,
            data: UserData::new(user_data),
        };
        publish(MarkGroup::new(Box::new(marks)), out)
    })
}

/// A group of resettable marks that the caller reads from one snapshot
/// (PyTorch's `memory_stats`: one read gives every mark of a device):
/// `read_many(user_data, what, indices, count, out_bytes)` stores the
/// value `what` (MEMPROBE_MARK_VALUE_CURRENT: bytes in use now;
/// MEMPROBE_MARK_VALUE_PEAK: the high-water mark since the last reset) of
/// mark `indices[i]` in `out_bytes[i]` for each `i < count` (`count >= 1`;
/// both arrays are memprobe's, valid for the call only), and
/// `reset(user_data)` resets every mark of the group at once. Each returns
/// 0 on success; a non-zero return fails the memprobe call that needed it
/// with MEMPROBE_STATUS_UNAVAILABLE, as for memprobe_mark_group_new.
///
/// Same sources, same peaks as memprobe_mark_group_new, fewer calls: a
/// window boundary over any number of the group's sources makes three
/// (every peak, the reset, every current value) instead of two per source
/// plus one. The peaks of the other members are read at the start of the
/// boundary rather than right before the reset: as for the member whose
/// boundary it is, a temporary allocation another thread makes and frees
/// inside the boundary itself is in neither interval. Threading, re-entry
/// and `user_data` as for memprobe_mark_group_new.
#[no_mangle]
pub extern "C" fn memprobe_mark_group_new_many(
    read_many: memprobe_mark_read_many_fn,
    reset: memprobe_mark_reset_fn,
    user_data: *mut c_void,
    out: *mut *mut memprobe_mark_group,
) -> memprobe_status {
    entry_point("memprobe_mark_group_new_many", || {
        crate::boundary::out(out, "out")?;
        let marks = CMarksMany {
            read: read_many.ok_or_else(|| crate::boundary::null("read_many"))?,
            reset: reset.ok_or_else(|| crate::boundary::null("reset"))?,
            data: UserData::new(user_data),
        };
        publish(MarkGroup::new(Box::new(marks)), out)
    })
}

/// Releases a group handle. Sources made over the group keep it (and its
/// callbacks) alive until they and every window, trace or tracker over them
/// are freed. NULL is a no-op.
#[no_mangle]
pub extern "C" fn memprobe_mark_group_free(group: *mut memprobe_mark_group) -> memprobe_status {
    free_point("memprobe_mark_group_free", || {
        release(group)?;
        Ok(())
    })
}

/// An exact source over mark `index` of `group` (kind
/// MEMPROBE_SOURCE_CUSTOM, fidelity MEMPROBE_FIDELITY_EXACT): each window
/// boundary over it folds the group's peak of this mark into every open
/// window, carries the other members' peaks, then resets the group. At most
/// one live source per index and group (a second one is
/// MEMPROBE_STATUS_INVALID_ARGUMENT until the first is freed along with
/// everything over it). `name`: 1 to 64 printable bytes.
#[no_mangle]
pub extern "C" fn memprobe_source_new_mark(
    group: *const memprobe_mark_group,
    index: usize,
    name: *const c_char,
    out: *mut *mut memprobe_source,
) -> memprobe_status {
    entry_point("memprobe_source_new_mark", || {
        crate::boundary::out(out, "out")?;
        let group = get(group)?;
        let name = text(name, "name")?;
        let src = Source::over_mark(&group, index, name, SourceKind::Custom)?;
        publish(src, out)
    })
}
