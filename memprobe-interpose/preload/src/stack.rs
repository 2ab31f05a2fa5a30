//! Call paths (`MEMPROBE_GPU_ORIGINS=stacks[:N]`): for each counted
//! allocation, its first N frames from the origin outward, named once per
//! distinct path (`library!symbol`, or `library+0xOFFSET` where `dladdr`
//! knows no symbol) and counted beside the origin (the reader's
//! `stacks`). Off by default: each allocation then pays one stack walk
//! (the unwinder's `_Unwind_Backtrace`) and two table operations; a path
//! seen before costs no `dladdr`.
//!
//! A path is known by a 64-bit hash of its return addresses: two paths with
//! the same hash (a chance of about n²/2⁶⁵ for n paths) would share a slot.

use crate::table::Table;
use shm::layout::{Layout, MAX_STACK_DEPTH};
use shm::stacks::NO_STACK;
use std::ffi::{c_int, c_void, CStr};

/// Path hash -> stack slot + 1.
static PATHS: Table = Table::new(12);
/// Allocation (key tagged by its table) -> stack slot + 1.
static STACK_OF: Table = Table::new(20);
/// Frames walked at most before the origin is found.
const MAX_WALK: u32 = 64;

const URC_NO_REASON: c_int = 0;
const URC_NORMAL_STOP: c_int = 4;

extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

/// Frames kept per path; 0 when stacks are off.
pub(crate) fn depth() -> usize {
    crate::origin::stack_depth_kept().min(MAX_STACK_DEPTH)
}

struct Walk<'a> {
    layout: &'a Layout,
    ips: [usize; MAX_STACK_DEPTH],
    n: usize,
    depth: usize,
    started: bool,
    steps: u32,
}

extern "C" fn step(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` of `here`, alive for the whole walk.
    let w = unsafe { &mut *arg.cast::<Walk<'_>>() };
    // SAFETY: the unwinder's context for this frame.
    let ip = unsafe { _Unwind_GetIP(ctx) };
    w.steps += 1;
    if ip == 0 || (!w.started && w.steps > MAX_WALK) {
        return URC_NORMAL_STOP;
    }
    // The driver's, the runtime's and this library's frames come first;
    // the path starts at the origin's.
    if !w.started && crate::origin::site(w.layout, ip).is_none() {
        return URC_NO_REASON;
    }
    w.started = true;
    w.ips[w.n] = ip;
    w.n += 1;
    if w.n >= w.depth {
        URC_NORMAL_STOP
    } else {
        URC_NO_REASON
    }
}

/// The stack slot of the allocation being made on this thread now, whose
/// origin is slot `origin` ([`NO_STACK`] when stacks are off).
pub(crate) fn here(l: &Layout, origin: usize) -> usize {
    let depth = depth();
    if depth == 0 || origin == crate::origin::NO_ORIGIN {
        return NO_STACK;
    }
    let mut w = Walk {
        layout: l,
        ips: [0; MAX_STACK_DEPTH],
        n: 0,
        depth,
        started: false,
        steps: 0,
    };
    // SAFETY: `step` only reads the context and writes `w`, which outlives
    // the call.
    unsafe { _Unwind_Backtrace(step, (&mut w as *mut Walk<'_>).cast()) };
    let ips = &w.ips[..w.n];
    // FNV-1a over the origin and the addresses; never a table's reserved key.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in std::iter::once(origin).chain(ips.iter().copied()) {
        h = (h ^ v as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let h = h.clamp(1, u64::MAX - 1);
    if let Some(s) = PATHS.get(h) {
        return s as usize - 1;
    }
    let names: Vec<Vec<u8>> = if ips.is_empty() {
        vec![shm::origins::UNKNOWN_LIBRARY.as_bytes().to_vec()]
    } else {
        ips.iter().map(|&ip| frame_name(ip)).collect()
    };
    let s = l.claim_stack(origin, &names);
    PATHS.insert(h, s as u64 + 1);
    s
}

/// `file!symbol`, `file+0xOFFSET` or `(unknown)+0xADDRESS` for return
/// address `ip` (`dladdr` of the call instruction, just before it).
fn frame_name(ip: usize) -> Vec<u8> {
    let call = ip.saturating_sub(1);
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and writes `info`.
    let known = unsafe { libc::dladdr(call as *const c_void, &mut info) } != 0;
    if !known || info.dli_fname.is_null() {
        return format!("{}+{call:#x}", shm::origins::UNKNOWN_LIBRARY).into_bytes();
    }
    // SAFETY: dladdr's strings live as long as the library stays loaded.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let mut file = path.rsplit(|&b| b == b'/').next().unwrap_or(path).to_vec();
    if file.is_empty() {
        file = b"(program)".to_vec();
    }
    if info.dli_sname.is_null() {
        let off = call.wrapping_sub(info.dli_fbase as usize);
        file.extend_from_slice(format!("+{off:#x}").as_bytes());
    } else {
        file.push(b'!');
        // SAFETY: as above.
        file.extend_from_slice(unsafe { CStr::from_ptr(info.dli_sname) }.to_bytes());
    }
    file
}

fn tagged(table: usize, key: u64) -> u64 {
    key ^ ((table as u64 & 3) << 60)
}

/// Remembers that allocation `key` of table number `table` is on path
/// `stack`.
pub(crate) fn remember(table: usize, key: u64, stack: usize) {
    if stack != NO_STACK {
        STACK_OF.insert(tagged(table, key), stack as u64 + 1);
    }
}

/// The path of allocation `key` of table `table`, forgotten.
pub(crate) fn take(table: usize, key: u64) -> usize {
    if depth() == 0 {
        return NO_STACK;
    }
    STACK_OF
        .remove(tagged(table, key))
        .map_or(NO_STACK, |s| s as usize - 1)
}

/// Forgets every path and allocation (a forked child: its region, and so
/// its stack slots, are its own).
pub(crate) fn forget_all() {
    PATHS.clear();
    STACK_OF.clear();
}
