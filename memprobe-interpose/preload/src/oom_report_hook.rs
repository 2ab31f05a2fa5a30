//! The out-of-memory hook (the protocol is `memprobe_interpose_reader::oom_report_hook`):
//! a library in the process registers one function; a counted allocation
//! that fails with `CUDA_ERROR_OUT_OF_MEMORY` calls it on the failing
//! thread before its error returns to the caller, unchanged.

use shm::oom_report_hook::{OomEvent, OomHook, COUNTER_UNKNOWN};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

// The hook and its user data, read together under a sequence count: a
// reader retries while a registration is being written, so it never pairs
// one registration's function with another's data. Registrations are rare
// (a tracker enabling or ending driver reports); reads happen only on a
// failed allocation.
static SEQ: AtomicU64 = AtomicU64::new(0);
static HOOK: AtomicUsize = AtomicUsize::new(0);
static USER_DATA: AtomicUsize = AtomicUsize::new(0);
static WRITING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Inside the hook on this thread: a failure the hook itself causes is
    /// not reported again (the hook must not allocate, but never recurse).
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Registers `hook` (`None` removes it), replacing any earlier one; see
/// `memprobe_interpose_set_oom_hook`.
pub(crate) fn set(hook: Option<OomHook>, user_data: *mut c_void) -> i32 {
    if !crate::region::counting() {
        return -1;
    }
    while WRITING.swap(true, Acquire) {
        std::hint::spin_loop();
    }
    SEQ.fetch_add(1, AcqRel);
    HOOK.store(hook.map_or(0, |h| h as usize), Release);
    USER_DATA.store(user_data as usize, Release);
    SEQ.fetch_add(1, AcqRel);
    WRITING.store(false, Release);
    0
}

fn registered() -> Option<(OomHook, *mut c_void)> {
    loop {
        let before = SEQ.load(Acquire);
        if before % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let hook = HOOK.load(Acquire);
        let data = USER_DATA.load(Acquire);
        if SEQ.load(Acquire) != before {
            continue;
        }
        if hook == 0 {
            return None;
        }
        // SAFETY: a non-zero HOOK was stored from an `OomHook`.
        let f = unsafe { std::mem::transmute::<usize, OomHook>(hook) };
        return Some((f, data as *mut c_void));
    }
}

/// Calls the registered hook, if any, for a failure of `api` (a
/// NUL-terminated name) asking `requested` bytes on `counter`.
pub(crate) fn fire(
    counter: Option<usize>,
    requested: u64,
    api: &'static [u8],
    result: i32,
    failures: u64,
    at_ns: u64,
) {
    let Some((hook, data)) = registered() else {
        return;
    };
    if IN_HOOK.with(|f| f.replace(true)) {
        return;
    }
    let event = OomEvent {
        size: std::mem::size_of::<OomEvent>() as u32,
        counter: counter.map_or(COUNTER_UNKNOWN, |c| c as i32),
        requested,
        api: api.as_ptr().cast(),
        result,
        reserved: 0,
        failures,
        at_ns,
    };
    // SAFETY: the registered function with its own user data; the event
    // lives across the call.
    unsafe { hook(&event, data) };
    IN_HOOK.with(|f| f.set(false));
}
