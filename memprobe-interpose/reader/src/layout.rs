//! The counters' memory layout, shared by the interposer (the writer) and
//! every reader, in-process or in another process through a file mapping.
//!
//! One region per process: a [`Header`] and one [`CounterBlock`] per device
//! plus one for pinned host memory. Everything is an atomic in memory that
//! may be shared between processes, so readers and the writer never lock.
//!
//! Versioning: [`MAGIC`] names the format and [`LAYOUT_VERSION`] its
//! revision. A reader accepts a region whose magic matches, whose version
//! equals its own and whose recorded size is at least `size_of::<Layout>()`;
//! anything else is refused with a clear error, never guessed at. A change
//! that moves or resizes a field bumps the version.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::*};

/// The first eight bytes of a region: `"MPGPUXC\0"` read as a little-endian
/// `u64`. Written last when a region is set up, so a reader never sees a
/// half-initialized region as valid.
pub const MAGIC: u64 = u64::from_le_bytes(*b"MPGPUXC\0");

/// The revision of this layout.
pub const LAYOUT_VERSION: u32 = 1;

/// Devices counted, by CUDA ordinal as the process sees them (0..64).
/// Allocations on a higher ordinal pass through and are reported as not
/// counted.
pub const MAX_DEVICES: usize = 64;

/// Independent high-water marks per counter: one per reader (a reader holds
/// one slot, like a cgroup v2 `memory.peak` descriptor).
pub const MAX_MARKS: usize = 32;

/// The index of the pinned host memory counter.
pub const HOST_PINNED: usize = MAX_DEVICES;

/// Number of counter blocks: one per device and one for pinned host memory.
pub const COUNTERS: usize = MAX_DEVICES + 1;

/// [`Header::flags`]: the interposer counts (not switched off by
/// `MEMPROBE_GPU_EXACT=off`).
pub const FLAG_COUNTING: u32 = 1;
/// [`Header::flags`]: the region lives in a file another process can map.
pub const FLAG_SHARED: u32 = 2;
/// [`Header::flags`]: the process ran its exit handlers; its counts are final.
pub const FLAG_EXITED: u32 = 4;
/// [`Header::flags`]: what the process still held when it ended (or when it
/// replaced its image with `exec`) was taken out of its tree's counter
/// ([`crate::tree_counter`]).
pub const FLAG_TREE_SETTLED: u32 = 8;
/// [`Header::flags`]: the writer names the origin of every allocation it
/// counts ([`crate::origins`]).
pub const FLAG_ORIGINS: u32 = 16;

/// The per-process part of a region.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Header {
    /// [`MAGIC`] once the region is set up.
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: AtomicU32,
    /// `size_of::<Layout>()` as the writer knew it.
    pub size: AtomicU32,
    /// The process the counts belong to.
    pub pid: AtomicU32,
    /// `FLAG_*` bits.
    pub flags: AtomicU32,
    /// The process's start time (field 22 of `/proc/<pid>/stat`), which
    /// tells a live process from a later one that reused its pid.
    pub start_time: AtomicU64,
    /// Mark slots held by a reader (bit per slot).
    pub claimed: AtomicU32,
    /// Mark slots the writer folds into (set once a claimed slot is ready).
    pub active: AtomicU32,
    /// Allocations that succeeded but could not be counted (no current
    /// context, an ordinal beyond [`MAX_DEVICES`], a full pointer table, a
    /// size the interposer cannot derive).
    pub not_counted_calls: AtomicU64,
    /// Their bytes, where known.
    pub not_counted_bytes: AtomicU64,
    /// Frees of pointers or handles the interposer never saw allocated
    /// (allocated before it was loaded, or not counted): passed through.
    pub untracked_frees: AtomicU64,
    /// Allocation calls that failed with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub oom_events: AtomicU64,
    /// The counter index of the last such failure.
    pub last_oom_counter: AtomicU64,
    /// The size asked for in the last such failure.
    pub last_oom_size: AtomicU64,
    /// The pid of each slot's reader (for reclaiming slots of dead readers).
    pub mark_owner_pid: [AtomicU32; MAX_MARKS],
    /// The start time of each slot's reader.
    pub mark_owner_start: [AtomicU64; MAX_MARKS],
    /// The entry point of the last out-of-memory failure: an index into
    /// [`OOM_APIS`] (0: not recorded, as in a region written by an older
    /// interposer). Placed in what was padding: the layout keeps its size.
    pub last_oom_api: AtomicU32,
    /// Padding.
    pub reserved_oom: u32,
    /// When the last out-of-memory failure happened, `CLOCK_MONOTONIC`
    /// nanoseconds (0: not recorded).
    pub last_oom_at_ns: AtomicU64,
}

// The fields above went into the header's padding: its size, and so every
// offset after it, is what LAYOUT_VERSION 1 readers expect.
const _: () = assert!(std::mem::size_of::<Header>() == 512);

/// The allocation entry points whose out-of-memory failures are recorded,
/// by code ([`Header::last_oom_api`]); 0 is "not recorded". Codes are never
/// reused: new names go at the end.
pub const OOM_APIS: [&str; 15] = [
    "",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemCreate",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuMipmappedArrayCreate",
    "cuMemHostAlloc",
    "cuMemAllocHost_v2",
    "cuMemHostRegister_v2",
];

/// The [`OOM_APIS`] code of `name` (0 when it is not there).
pub fn oom_api_code(name: &str) -> u32 {
    OOM_APIS
        .iter()
        .position(|n| !n.is_empty() && *n == name)
        .map_or(0, |i| i as u32)
}

/// The counts of one device, or of pinned host memory.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct CounterBlock {
    /// Bytes held now.
    pub current: AtomicU64,
    /// The highest `current` since the process started (never reset).
    pub lifetime_peak: AtomicU64,
    /// Allocation calls that failed with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub failures: AtomicU64,
    /// The size asked for in the last of them.
    pub last_failure_size: AtomicU64,
    /// Nonzero once anything was counted here.
    pub seen: AtomicU64,
    /// Padding to keep the marks on their own cache lines.
    pub reserved: [u64; 3],
    /// The high-water mark of each reader slot.
    pub marks: [AtomicU64; MAX_MARKS],
}

/// A whole region.
#[repr(C)]
#[derive(Debug)]
pub struct Layout {
    /// The per-process part.
    pub header: Header,
    /// Devices `0..MAX_DEVICES`, then [`HOST_PINNED`].
    pub counters: [CounterBlock; COUNTERS],
    /// Who holds the counted bytes, and who held them at each counter's
    /// peak. Appended after the counters: every earlier offset is what
    /// readers of this version knew before; a region without it is shorter
    /// than `LAYOUT_SIZE` and refused as such.
    pub origins: Origins,
    /// The same bytes by call path (`MEMPROBE_GPU_ORIGINS=stacks[:N]`):
    /// appended after the origins, as they were after the counters.
    pub stacks: Stacks,
}

/// `size_of::<Layout>()`.
pub const LAYOUT_SIZE: usize = std::mem::size_of::<Layout>();

#[inline]
fn raise(mark: &AtomicU64, value: u64) {
    // A load first: the mark is usually already higher, and a plain load
    // costs far less than a locked read-modify-write.
    if mark.load(Relaxed) < value {
        mark.fetch_max(value, Relaxed);
    }
}

impl Layout {
    /// Counts `bytes` more on counter `index`, raising every active mark.
    #[inline]
    pub fn add(&self, index: usize, bytes: u64) {
        let Some(c) = self.counters.get(index) else {
            return;
        };
        if c.seen.load(Relaxed) == 0 {
            c.seen.store(1, Relaxed);
        }
        let now = c.current.fetch_add(bytes, SeqCst).wrapping_add(bytes);
        raise(&c.lifetime_peak, now);
        let mut active = self.header.active.load(SeqCst);
        while active != 0 {
            let slot = active.trailing_zeros() as usize;
            raise(&c.marks[slot], now);
            active &= active - 1;
        }
    }

    /// Counts `bytes` fewer on counter `index`.
    #[inline]
    pub fn sub(&self, index: usize, bytes: u64) {
        if let Some(c) = self.counters.get(index) {
            c.current.fetch_sub(bytes, SeqCst);
        }
    }

    /// Records an allocation of `bytes` on counter `index` that failed with
    /// out-of-memory, through entry point `api` (an [`OOM_APIS`] code) at
    /// `at_ns` (`CLOCK_MONOTONIC`).
    pub fn record_oom(&self, index: usize, bytes: u64, api: u32, at_ns: u64) {
        if let Some(c) = self.counters.get(index) {
            c.failures.fetch_add(1, Relaxed);
            c.last_failure_size.store(bytes, Relaxed);
            if c.seen.load(Relaxed) == 0 {
                c.seen.store(1, Relaxed);
            }
        }
        let h = &self.header;
        h.last_oom_counter.store(index as u64, Relaxed);
        h.last_oom_size.store(bytes, Relaxed);
        h.last_oom_api.store(api, Relaxed);
        h.last_oom_at_ns.store(at_ns, Relaxed);
        h.oom_events.fetch_add(1, SeqCst);
    }

    /// Records an allocation that succeeded but is not counted.
    pub fn record_not_counted(&self, bytes: u64) {
        self.header.not_counted_calls.fetch_add(1, Relaxed);
        self.header.not_counted_bytes.fetch_add(bytes, Relaxed);
    }

    /// Records a free of something never counted.
    pub fn record_untracked_free(&self) {
        self.header.untracked_frees.fetch_add(1, Relaxed);
    }

    /// Claims a free mark slot for the reader `(pid, start_time)`; slots of
    /// readers that died are reclaimed when none is free. The new mark
    /// starts at each counter's current bytes.
    pub fn claim_mark(&self, pid: u32, start_time: u64) -> Option<usize> {
        for attempt in 0..2 {
            let mut claimed = self.header.claimed.load(SeqCst);
            while claimed != u32::MAX {
                let slot = (!claimed).trailing_zeros() as usize;
                let bit = 1u32 << slot;
                match self
                    .header
                    .claimed
                    .compare_exchange(claimed, claimed | bit, SeqCst, SeqCst)
                {
                    Ok(_) => {
                        self.header.mark_owner_pid[slot].store(pid, SeqCst);
                        self.header.mark_owner_start[slot].store(start_time, SeqCst);
                        // Start from zero, let the writer fold in, then fold
                        // in what is held now: nothing held at or after the
                        // moment of activation is missed.
                        for c in &self.counters {
                            c.marks[slot].store(0, SeqCst);
                        }
                        self.header.active.fetch_or(bit, SeqCst);
                        for c in &self.counters {
                            raise(&c.marks[slot], c.current.load(SeqCst));
                        }
                        return Some(slot);
                    }
                    Err(now) => claimed = now,
                }
            }
            if attempt == 0 && self.reclaim_dead_marks() == 0 {
                break;
            }
        }
        None
    }

    /// Gives a mark slot back.
    pub fn release_mark(&self, slot: usize) {
        if slot < MAX_MARKS {
            let bit = 1u32 << slot;
            self.header.active.fetch_and(!bit, SeqCst);
            self.header.mark_owner_pid[slot].store(0, SeqCst);
            self.header.claimed.fetch_and(!bit, SeqCst);
        }
    }

    /// Releases the slots whose reader process is gone; returns how many.
    pub fn reclaim_dead_marks(&self) -> usize {
        let claimed = self.header.claimed.load(SeqCst);
        let mut n = 0;
        for slot in 0..MAX_MARKS {
            if claimed & (1 << slot) == 0 {
                continue;
            }
            let pid = self.header.mark_owner_pid[slot].load(SeqCst);
            let start = self.header.mark_owner_start[slot].load(SeqCst);
            if pid != 0 && !crate::liveness::alive(pid, start) {
                self.release_mark(slot);
                n += 1;
            }
        }
        n
    }

    /// Whether a live process other than the region's own holds a mark
    /// (a dead process's region is kept for it).
    pub fn held_by_live_reader(&self) -> bool {
        let claimed = self.header.claimed.load(SeqCst);
        let own = self.header.pid.load(SeqCst);
        (0..MAX_MARKS).any(|slot| {
            let pid = self.header.mark_owner_pid[slot].load(SeqCst);
            claimed & (1 << slot) != 0
                && pid != own
                && pid != 0
                && crate::liveness::alive(pid, self.header.mark_owner_start[slot].load(SeqCst))
        })
    }

    /// The mark of `slot` on counter `index`.
    pub fn mark_peak(&self, slot: usize, index: usize) -> u64 {
        match self.counters.get(index) {
            Some(c) if slot < MAX_MARKS => c.marks[slot].load(SeqCst),
            _ => 0,
        }
    }

    /// Returns the mark of `slot` on counter `index` and restarts it from the
    /// current bytes, in one step: every value the counter takes belongs to
    /// the window before or the window after, never to neither.
    pub fn take_mark(&self, slot: usize, index: usize) -> u64 {
        match self.counters.get(index) {
            Some(c) if slot < MAX_MARKS => {
                let peak = c.marks[slot].swap(c.current.load(SeqCst), SeqCst);
                raise(&c.marks[slot], c.current.load(SeqCst));
                peak
            }
            _ => 0,
        }
    }

    /// Sets up a zeroed region for process `(pid, start_time)`; the magic
    /// goes last.
    pub fn init(&self, pid: u32, start_time: u64, flags: u32) {
        let h = &self.header;
        h.magic.store(0, SeqCst);
        h.version.store(LAYOUT_VERSION, SeqCst);
        h.size.store(LAYOUT_SIZE as u32, SeqCst);
        h.pid.store(pid, SeqCst);
        h.start_time.store(start_time, SeqCst);
        h.flags.store(flags, SeqCst);
        h.magic.store(MAGIC, SeqCst);
    }

    /// Checks magic, version and size; `Err` says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let magic = self.header.magic.load(SeqCst);
        if magic != MAGIC {
            return Err(format!(
                "not a memprobe GPU counter region (magic {magic:#x})"
            ));
        }
        let version = self.header.version.load(SeqCst);
        if version != LAYOUT_VERSION {
            return Err(format!(
                "counter region layout version {version}, this reader knows {LAYOUT_VERSION}"
            ));
        }
        let size = self.header.size.load(SeqCst) as usize;
        if size < LAYOUT_SIZE {
            return Err(format!(
                "counter region of {size} bytes, smaller than the {LAYOUT_SIZE} of this layout"
            ));
        }
        Ok(())
    }
}

// ---- origins: who holds the counted bytes (the methods: `origins.rs`) ----

/// [`OriginSlot::flags`]: the origin is the process's own executable.
pub const ORIGIN_PROGRAM: u32 = 1;

/// Origins a region names; the last slot collects what comes after the
/// others are taken.
pub const MAX_ORIGINS: usize = 64;
/// Bytes kept of an origin's library path (longer paths keep their end,
/// where the file name is).
pub const LIBRARY_BYTES: usize = 192;
/// Bytes kept of an origin's symbol.
pub const SYMBOL_BYTES: usize = 96;
/// One origin: its name, where it was first seen, and its live bytes.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct OriginSlot {
    /// 0 while free; 2 once the names below are written.
    pub state: AtomicU32,
    /// Bytes used of `library`.
    pub library_len: AtomicU32,
    /// The first call site seen (absolute address in that process).
    pub address: AtomicU64,
    /// That address relative to its library's load address (0 if unknown).
    pub offset: AtomicU64,
    /// Bytes used of `symbol` (0: no symbol known).
    pub symbol_len: AtomicU32,
    /// [`ORIGIN_PROGRAM`] when the origin is the process's own executable.
    pub flags: AtomicU32,
    /// The library's path as the loader knows it (the program's own path
    /// for the program).
    pub library: [AtomicU8; LIBRARY_BYTES],
    /// The nearest dynamic symbol at or before the call site.
    pub symbol: [AtomicU8; SYMBOL_BYTES],
    /// Live bytes of this origin on each counter.
    pub live: [AtomicU64; COUNTERS],
}

/// The live bytes by origin of one counter at its latest lifetime peak.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct PeakBreakdown {
    /// Serializes the counter's origin-aware updates (writer only).
    pub lock: AtomicU32,
    /// Odd while the breakdown is being rewritten (readers retry).
    pub seq: AtomicU32,
    /// The peak the breakdown belongs to (0: none yet).
    pub total: AtomicU64,
    /// When it was reached, `CLOCK_MONOTONIC` nanoseconds.
    pub at_ns: AtomicU64,
    /// Bytes of each origin slot at that moment.
    pub bytes: [AtomicU64; MAX_ORIGINS],
}

/// The origins part of a region.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Origins {
    /// Slots handed out so far (the first `count` are in use).
    pub count: AtomicU32,
    /// Serializes naming a new origin (writer only; rare).
    pub claim_lock: AtomicU32,
    /// Allocations whose call stack could not be walked at all: counted
    /// under `UNKNOWN_LIBRARY` (`origins.rs`).
    pub unwalkable: AtomicU64,
    /// The origins.
    pub slots: [OriginSlot; MAX_ORIGINS],
    /// The breakdown at each counter's latest lifetime peak.
    pub peaks: [PeakBreakdown; COUNTERS],
    /// The live bytes by origin on the counter of the last allocation that
    /// failed with out-of-memory, when it failed (`total`: what that
    /// counter held then).
    pub last_oom: PeakBreakdown,
    /// That counter's index, plus one (0: no failure recorded).
    pub last_oom_counter: AtomicU32,
    /// Padding.
    pub reserved: u32,
}

// ---- stacks: the call paths that hold the counted bytes (`stacks.rs`) ----

/// Call paths a region names; the last slot collects what comes after the
/// others are taken.
pub const MAX_STACKS: usize = 128;
/// Frames a call path keeps at most (`stacks:N`, N ≤ this).
pub const MAX_STACK_DEPTH: usize = 32;
/// Frames kept when `stacks` names no depth.
pub const DEFAULT_STACK_DEPTH: usize = 8;
/// Distinct frame names a region keeps; past them a frame is named
/// `(other frames: table full)`.
pub const MAX_FRAME_NAMES: usize = 512;
/// Bytes kept of one frame's name (`libfile.so!symbol`; longer names keep
/// their start, where the library is).
pub const FRAME_NAME_BYTES: usize = 120;

/// One frame's name: `file!symbol`, or `file+0xOFFSET` without a symbol.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct FrameName {
    /// 0 while free; 2 once `text` is written.
    pub state: AtomicU32,
    /// Bytes used of `text`.
    pub len: AtomicU32,
    /// The name.
    pub text: [AtomicU8; FRAME_NAME_BYTES],
}

/// One call path: its frames, innermost (the allocating call) first, and
/// its live bytes.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct StackSlot {
    /// 0 while free; 2 once the frames are written.
    pub state: AtomicU32,
    /// Frames used of `frames`.
    pub depth: AtomicU32,
    /// The origin slot of its first frame (the origin it refines).
    pub origin: AtomicU32,
    /// Padding.
    pub reserved: u32,
    /// Indices into [`Stacks::names`].
    pub frames: [AtomicU32; MAX_STACK_DEPTH],
    /// Live bytes of this path on each counter.
    pub live: [AtomicU64; COUNTERS],
}

/// The live bytes by call path of one counter at one moment (its latest
/// lifetime peak, or the last out-of-memory failure).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct StackBreakdown {
    /// Odd while the breakdown is being rewritten (readers retry).
    pub seq: AtomicU32,
    /// Padding.
    pub reserved: u32,
    /// The bytes the breakdown belongs to (0: none yet).
    pub total: AtomicU64,
    /// When, `CLOCK_MONOTONIC` nanoseconds.
    pub at_ns: AtomicU64,
    /// Bytes of each stack slot at that moment.
    pub bytes: [AtomicU64; MAX_STACKS],
}

/// The stacks part of a region. Updated under the same per-counter lock as
/// the origins ([`PeakBreakdown::lock`]), so both views of a peak sum to
/// it.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Stacks {
    /// Frames kept per path (0: stacks are not kept).
    pub depth: AtomicU32,
    /// Slots handed out so far.
    pub count: AtomicU32,
    /// Frame names handed out so far.
    pub name_count: AtomicU32,
    /// Serializes naming new frames and paths (writer only; rare).
    pub claim_lock: AtomicU32,
    /// The frame names.
    pub names: [FrameName; MAX_FRAME_NAMES],
    /// The paths.
    pub slots: [StackSlot; MAX_STACKS],
    /// The breakdown at each counter's latest lifetime peak.
    pub peaks: [StackBreakdown; COUNTERS],
    /// The breakdown at the last out-of-memory failure (its counter is
    /// [`Origins::last_oom_counter`]).
    pub last_oom: StackBreakdown,
}

/// A zeroed layout on the heap, for the reader's unit tests (too big for a
/// thread's stack).
#[cfg(test)]
pub(crate) fn zeroed() -> Box<Layout> {
    // SAFETY: all-zero bytes are a valid value of every field (atomics);
    // the allocation has the layout's size and alignment.
    unsafe {
        let layout = std::alloc::Layout::new::<Layout>();
        let p = std::alloc::alloc_zeroed(layout).cast::<Layout>();
        assert!(!p.is_null());
        Box::from_raw(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_independent() {
        let l = zeroed();
        l.init(1, 1, FLAG_COUNTING);
        assert!(l.validate().is_ok());
        let a = l.claim_mark(std::process::id(), 0).unwrap();
        l.add(0, 100);
        let b = l.claim_mark(std::process::id(), 0).unwrap();
        assert_ne!(a, b);
        assert_eq!(l.mark_peak(b, 0), 100);
        l.add(0, 50);
        l.sub(0, 150);
        assert_eq!(l.take_mark(a, 0), 150);
        assert_eq!(l.mark_peak(a, 0), 0);
        assert_eq!(l.mark_peak(b, 0), 150);
        assert_eq!(l.counters[0].lifetime_peak.load(SeqCst), 150);
        l.release_mark(a);
        let c = l.claim_mark(std::process::id(), 0).unwrap();
        assert_eq!(c, a);
        assert_eq!(l.mark_peak(c, 0), 0);
    }

    #[test]
    fn slots_run_out_and_dead_readers_are_reclaimed() {
        let l = zeroed();
        l.init(1, 1, FLAG_COUNTING);
        for _ in 0..MAX_MARKS {
            assert!(l.claim_mark(std::process::id(), 0).is_some());
        }
        assert_eq!(l.claim_mark(std::process::id(), 0), None);
        // A reader that no longer exists: pid 0x7fff_fff0 is beyond pid_max.
        l.header.mark_owner_pid[3].store(0x7fff_fff0, SeqCst);
        assert_eq!(l.claim_mark(std::process::id(), 0), Some(3));
    }

    #[test]
    fn validation_names_the_problem() {
        let l = zeroed();
        assert!(l.validate().unwrap_err().contains("magic"));
        l.init(1, 1, 0);
        l.header.version.store(99, SeqCst);
        assert!(l.validate().unwrap_err().contains("version 99"));
        l.header.version.store(LAYOUT_VERSION, SeqCst);
        l.header.size.store(8, SeqCst);
        assert!(l.validate().unwrap_err().contains("smaller"));
    }
}
