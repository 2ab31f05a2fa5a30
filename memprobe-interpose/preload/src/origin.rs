//! The origin of an allocation: the first frame of the calling thread's
//! stack outside this library, the CUDA driver (`libcuda.so*`) and the CUDA
//! runtime (`libcudart.so*`), named by its library and nearest symbol.
//!
//! The stack is walked with the unwinder's `_Unwind_Backtrace` (DWARF
//! unwind tables: no frame pointers needed), stopping at the first frame
//! that is not the driver's or the runtime's. Each return address is
//! classified once, with `dladdr`, and cached in a bounded lock-free map
//! (return address -> origin slot, or "a CUDA frame"), so a known call site
//! costs a lookup per frame walked. Most allocations need no walk: the
//! exported entry points hand their wrappers their return address
//! (`trampoline.rs`), and when that caller is not the CUDA runtime it is
//! the origin, found with one lookup.
//!
//! `MEMPROBE_GPU_ORIGINS=off` (or `0`, `false`, `no`) keeps no origins:
//! every allocation is counted as before, with no walk and no lock.
//! `stacks[:N]` keeps origins and, beside them, call paths (`stack.rs`).

use crate::table::Table;
use shm::layout::Layout;
use shm::origins::{MAX_ORIGINS, UNKNOWN_LIBRARY};
use std::ffi::{c_int, c_void, CStr};
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// The origin of an allocation counted without one (origins switched
/// off); beyond every slot, so the region counts it plainly.
pub(crate) const NO_ORIGIN: usize = 0xff;
const _: () = assert!(MAX_ORIGINS < NO_ORIGIN);

/// Return address -> origin slot, or [`CUDA_FRAME`].
static SITES: Table = Table::new(14);
const CUDA_FRAME: u64 = u64::MAX - 1;
/// Frames walked at most before giving up on finding a caller.
const MAX_DEPTH: u32 = 64;

const UNSET: u32 = 0;
const ON: u32 = 1;
const OFF: u32 = 2;
static MODE: AtomicU32 = AtomicU32::new(UNSET);
/// This library's load address (its own frames are skipped).
static OWN_BASE: AtomicUsize = AtomicUsize::new(0);
/// Frames kept per call path (`stacks[:N]`); 0: no paths. Stored before
/// MODE, like OWN_BASE.
static STACK_DEPTH: AtomicUsize = AtomicUsize::new(0);

const URC_NO_REASON: c_int = 0;
const URC_NORMAL_STOP: c_int = 4;

extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

thread_local! {
    /// The return address of the allocation entry point running on this
    /// thread (its trampoline's), 0 when none is known.
    static CALLER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Holds the caller of the entry point running on this thread for its
/// wrapper; forgets it when the wrapper returns, so nothing else takes it
/// for its own.
pub(crate) struct Caller(());

impl Caller {
    pub(crate) fn set(ret: usize) -> Caller {
        let _ = CALLER.try_with(|c| c.set(ret));
        Caller(())
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        let _ = CALLER.try_with(|c| c.set(0));
    }
}

/// Whether origins are kept (read once from the environment).
pub(crate) fn enabled() -> bool {
    // Acquire: OWN_BASE, stored before MODE, is seen with it.
    match MODE.load(Acquire) {
        ON => true,
        OFF => false,
        _ => {
            // SAFETY: a NUL-terminated name; the value is read at once.
            let v = unsafe { libc::getenv(c"MEMPROBE_GPU_ORIGINS".as_ptr()) };
            let v = if v.is_null() {
                Vec::new()
            } else {
                // SAFETY: getenv returns a NUL-terminated string.
                unsafe { CStr::from_ptr(v) }.to_bytes().to_ascii_lowercase()
            };
            let off = matches!(v.as_slice(), b"off" | b"0" | b"false" | b"no" | b"disabled");
            if let Some(d) = stack_depth(&v) {
                STACK_DEPTH.store(d, Relaxed);
            }
            let mut info: libc::Dl_info = unsafe_zeroed_info();
            // SAFETY: dladdr writes `info`; the address is this function's.
            if unsafe { libc::dladdr(enabled as *const c_void, &mut info) } != 0 {
                OWN_BASE.store(info.dli_fbase as usize, Relaxed);
            }
            MODE.store(if off { OFF } else { ON }, Release);
            !off
        }
    }
}

/// Frames kept per call path (`MEMPROBE_GPU_ORIGINS=stacks[:N]`, see
/// `stack.rs`); 0 when paths are not kept (or origins are off).
pub(crate) fn stack_depth_kept() -> usize {
    if enabled() {
        STACK_DEPTH.load(Relaxed)
    } else {
        0
    }
}

/// `stacks` (the default depth) or `stacks:N` (N frames, 1 to the most
/// kept): the call paths are kept too. A depth that is not a number is
/// the default.
fn stack_depth(mode: &[u8]) -> Option<usize> {
    use shm::layout::{DEFAULT_STACK_DEPTH, MAX_STACK_DEPTH};
    let rest = mode.strip_prefix(b"stacks")?;
    let n = match rest.strip_prefix(b":") {
        Some(n) => std::str::from_utf8(n)
            .ok()
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or(DEFAULT_STACK_DEPTH),
        None if rest.is_empty() => DEFAULT_STACK_DEPTH,
        None => return None,
    };
    Some(n.clamp(1, MAX_STACK_DEPTH))
}

fn unsafe_zeroed_info() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}

struct Walk<'a> {
    layout: &'a Layout,
    found: Option<usize>,
    /// The outermost CUDA frame seen (the origin when no other is found).
    last_cuda: usize,
    depth: u32,
}

extern "C" fn step(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` of `here`, alive for the whole walk.
    let w = unsafe { &mut *arg.cast::<Walk<'_>>() };
    // SAFETY: the unwinder's context for this frame.
    let ip = unsafe { _Unwind_GetIP(ctx) };
    w.depth += 1;
    if ip == 0 || w.depth > MAX_DEPTH {
        return URC_NORMAL_STOP;
    }
    match site(w.layout, ip) {
        Some(o) => {
            w.found = Some(o);
            URC_NORMAL_STOP
        }
        None => {
            w.last_cuda = ip;
            URC_NO_REASON
        }
    }
}

/// The origin slot of the allocation being made on this thread now
/// ([`NO_ORIGIN`] when origins are off).
pub(crate) fn here(l: &Layout) -> usize {
    if !enabled() {
        return NO_ORIGIN;
    }
    // The entry point's caller, when its trampoline gave it: the origin
    // unless it is the CUDA runtime (then the walk goes past it).
    let caller = CALLER.try_with(|c| c.get()).unwrap_or(0);
    if caller != 0 {
        if let Some(o) = site(l, caller) {
            return o;
        }
    }
    let mut w = Walk {
        layout: l,
        found: None,
        last_cuda: 0,
        depth: 0,
    };
    // SAFETY: `step` only reads the context and writes `w`, which outlives
    // the call.
    unsafe { _Unwind_Backtrace(step, (&mut w as *mut Walk<'_>).cast()) };
    if let Some(o) = w.found {
        return o;
    }
    if w.last_cuda != 0 {
        // Only the driver, the runtime and this library on the stack (the
        // runtime's own start-up, a thread of the driver's): the outermost
        // of them is the origin.
        if let Some(o) = describe(l, w.last_cuda, true) {
            return o;
        }
    }
    l.origins.unwalkable.fetch_add(1, Relaxed);
    l.claim_origin(UNKNOWN_LIBRARY.as_bytes(), b"", 0, 0, false)
}

/// The origin slot of return address `ip`; `None` for a frame of the
/// driver, the runtime or this library.
pub(crate) fn site(l: &Layout, ip: usize) -> Option<usize> {
    match SITES.get(ip as u64) {
        Some(CUDA_FRAME) => None,
        Some(o) => Some(o as usize),
        None => {
            let o = describe(l, ip, false);
            SITES.insert(ip as u64, o.map_or(CUDA_FRAME, |o| o as u64));
            o
        }
    }
}

fn is_cuda(file_name: &[u8]) -> bool {
    file_name.starts_with(b"libcuda.so") || file_name.starts_with(b"libcudart.so")
}

/// Names the code at return address `ip` (`dladdr` of the call instruction,
/// just before it). `None` for the driver, the runtime or this library
/// unless `any`.
fn describe(l: &Layout, ip: usize, any: bool) -> Option<usize> {
    let mut info = unsafe_zeroed_info();
    let call = ip.saturating_sub(1);
    // SAFETY: dladdr only reads the loader's tables and writes `info`.
    let known = unsafe { libc::dladdr(call as *const c_void, &mut info) } != 0;
    if !known || info.dli_fname.is_null() {
        return Some(l.claim_origin(UNKNOWN_LIBRARY.as_bytes(), b"", ip as u64, 0, false));
    }
    // SAFETY: dladdr's strings live as long as the library stays loaded.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    let own = info.dli_fbase as usize == OWN_BASE.load(Relaxed);
    if !any && (own || is_cuda(file)) {
        return None;
    }
    let symbol = if info.dli_sname.is_null() {
        &b""[..]
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(info.dli_sname) }.to_bytes()
    };
    let exe = program_path();
    // The loader names the program "" (or by the path it was started as):
    // the program is its own executable, named by its real path.
    let program = path.is_empty() || path == exe || info.dli_fbase as usize == main_base();
    let path = if path.is_empty() {
        if exe.is_empty() {
            &b"(program)"[..]
        } else {
            exe
        }
    } else {
        path
    };
    let offset = call.wrapping_sub(info.dli_fbase as usize) as u64;
    Some(l.claim_origin(path, symbol, ip as u64, offset, program))
}

/// The program's own path (`/proc/self/exe`), read once; empty when it
/// cannot be read.
fn program_path() -> &'static [u8] {
    static EXE: OnceLock<Vec<u8>> = OnceLock::new();
    EXE.get_or_init(|| {
        std::fs::read_link("/proc/self/exe")
            .map(|p| p.into_os_string().into_vec())
            .unwrap_or_default()
    })
}

/// The main program's load address, as `dladdr` reports a library's
/// (`dli_fbase`): that of the first object the loader lists.
fn main_base() -> usize {
    static BASE: OnceLock<usize> = OnceLock::new();
    *BASE.get_or_init(|| {
        extern "C" fn first(info: *mut libc::dl_phdr_info, _: usize, out: *mut c_void) -> c_int {
            // SAFETY: the loader's record of the first object, and our usize.
            unsafe {
                let info = &*info;
                // dli_fbase is where the object's first segment is mapped:
                // the load bias plus the first PT_LOAD's vaddr rounded down
                // to its page.
                let page = (libc::sysconf(libc::_SC_PAGESIZE) as usize).max(1);
                let mut base = info.dlpi_addr as usize;
                for i in 0..info.dlpi_phnum as usize {
                    let ph = &*info.dlpi_phdr.add(i);
                    if ph.p_type == libc::PT_LOAD {
                        base += (ph.p_vaddr as usize) & !(page - 1);
                        break;
                    }
                }
                *out.cast::<usize>() = base;
            }
            1
        }
        let mut base = 0usize;
        // SAFETY: the callback writes one usize and stops at the first object.
        unsafe { libc::dl_iterate_phdr(Some(first), (&mut base as *mut usize).cast()) };
        base
    })
}

/// Forgets every call site (a forked child: its region, and so its origin
/// slots, are its own).
pub(crate) fn forget_all() {
    SITES.clear();
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_stacks_mode_names_its_depth() {
        use super::stack_depth;
        assert_eq!(stack_depth(b"stacks"), Some(8));
        assert_eq!(stack_depth(b"stacks:3"), Some(3));
        assert_eq!(stack_depth(b"stacks:99"), Some(32));
        assert_eq!(stack_depth(b"stacks:0"), Some(1));
        assert_eq!(stack_depth(b"stacks:x"), Some(8));
        assert_eq!(stack_depth(b"stacksx"), None);
        assert_eq!(stack_depth(b"on"), None);
        assert_eq!(stack_depth(b""), None);
    }
}
