//! The boundary every entry point goes through: NULL checks, panic capture,
//! status mapping and the thread-local last-error message.

use crate::status::memprobe_status;
use memprobe_core::Error;
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{LazyLock, Once};

/// An error on its way out through the C ABI.
#[derive(Debug)]
pub(crate) struct FfiError {
    pub(crate) status: memprobe_status,
    pub(crate) message: String,
}

impl From<Error> for FfiError {
    fn from(e: Error) -> Self {
        FfiError {
            status: memprobe_status::from_kind(e.kind()),
            message: e.message().to_owned(),
        }
    }
}

impl FfiError {
    pub(crate) fn new(status: memprobe_status, message: impl Into<String>) -> Self {
        FfiError {
            status,
            message: message.into(),
        }
    }
}

pub(crate) type FfiResult<T = ()> = Result<T, FfiError>;

thread_local! {
    /// `None` (no allocation) until a call on this thread fails.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
    static IN_BOUNDARY: Cell<bool> = const { Cell::new(false) };
    static PANIC_MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The entry point named here panics on purpose, to test the boundary.
const PANIC_ENV: &str = "MEMPROBE_TEST_PANIC_IN";
static INJECT_PANIC_IN: LazyLock<Option<String>> = LazyLock::new(|| std::env::var(PANIC_ENV).ok());
static HOOK: Once = Once::new();

/// Panics inside memprobe are reported through the status and last error,
/// not printed into the host process; panics elsewhere keep the previous hook.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_BOUNDARY.with(Cell::get) {
                let loc = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                    (*s).to_owned()
                } else if let Some(s) = info.payload().downcast_ref::<String>() {
                    s.clone()
                } else {
                    "non-string panic payload".to_owned()
                };
                PANIC_MESSAGE.with(|m| *m.borrow_mut() = Some(format!("{msg}{loc}")));
            } else {
                previous(info);
            }
        }));
    });
}

fn set_last_error(message: String) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(c));
}

/// Runs an entry point's body: maps errors to a status and message, catches
/// panics. `name` is the C function's name, used in messages.
pub(crate) fn run(name: &'static str, body: impl FnOnce() -> FfiResult) -> memprobe_status {
    install_panic_hook();
    let outer = IN_BOUNDARY.with(|b| b.replace(true));
    let result = catch_unwind(AssertUnwindSafe(|| {
        if INJECT_PANIC_IN.as_deref() == Some(name) {
            panic!("panic injected by {PANIC_ENV}={name}");
        }
        body()
    }));
    IN_BOUNDARY.with(|b| b.set(outer));
    match result {
        Ok(Ok(())) => {
            LAST_ERROR.with(|e| {
                let mut e = e.borrow_mut();
                if e.is_some() {
                    *e = None;
                }
            });
            memprobe_status::Ok
        }
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {}", e.message));
            e.status
        }
        Err(_) => {
            let msg = PANIC_MESSAGE
                .with(|m| m.borrow_mut().take())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(format!("{name}: internal panic: {msg}"));
            memprobe_status::Panic
        }
    }
}

/// The message of the last failed call on this thread, or `""` if the last
/// call succeeded. Valid until the next memprobe call on this thread. Never NULL.
#[no_mangle]
pub extern "C" fn memprobe_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ref().map_or(c"".as_ptr(), |c| c.as_ptr()))
}

/// A required out-pointer.
pub(crate) fn out<'a, T>(p: *mut T, what: &str) -> FfiResult<&'a mut T> {
    // SAFETY: the caller promises a non-NULL pointer is valid for writes of T
    // (the documented contract of every entry point); NULL is rejected.
    unsafe { p.as_mut() }.ok_or_else(|| null(what))
}

/// A required output array of `len` elements (`len == 0`: an empty slice,
/// and `p` may be NULL).
pub(crate) fn out_slice<'a, T>(p: *mut T, len: usize, what: &str) -> FfiResult<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-NULL, and the caller promises `p` holds `len` writable
    // elements (the documented contract of every entry point taking an array).
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

pub(crate) fn null(what: &str) -> FfiError {
    FfiError::new(memprobe_status::NullPointer, format!("{what} is NULL"))
}

/// A required NUL-terminated UTF-8 string.
pub(crate) fn text<'a>(p: *const c_char, what: &str) -> FfiResult<&'a str> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| {
        FfiError::new(
            memprobe_status::InvalidArgument,
            format!("{what} is not valid UTF-8"),
        )
    })
}

/// An optional NUL-terminated UTF-8 string (NULL = absent).
pub(crate) fn opt_text<'a>(p: *const c_char, what: &str) -> FfiResult<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        text(p, what).map(Some)
    }
}

/// Copies `s` with a NUL into `buf[..len]`; reports the needed size (with
/// the NUL) through `needed` when given. Too small: BufferTooSmall, and as
/// much as fits (NUL-terminated) is written.
pub(crate) fn copy_out(s: &str, buf: *mut c_char, len: usize, needed: *mut usize) -> FfiResult {
    let need = s.len() + 1;
    // SAFETY: `needed`, when non-NULL, is valid for a write (documented).
    if let Some(n) = unsafe { needed.as_mut() } {
        *n = need;
    }
    if buf.is_null() {
        return if len == 0 { Ok(()) } else { Err(null("buf")) };
    }
    let take = s.len().min(len.saturating_sub(1));
    if len > 0 {
        // SAFETY: the caller promises buf is valid for `len` bytes; we write take + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), take);
            *buf.add(take) = 0;
        }
    }
    if need > len {
        return Err(FfiError::new(
            memprobe_status::BufferTooSmall,
            format!("needs {need} bytes, got {len}"),
        ));
    }
    Ok(())
}

/// Copies `s` into a fixed-size C array with a NUL, cut at a character
/// boundary to fit (a struct field such as `memprobe_source_info.name`).
pub(crate) fn copy_to_fixed(dst: &mut [c_char], s: &str) {
    let mut take = s.len().min(dst.len().saturating_sub(1));
    while !s.is_char_boundary(take) {
        take -= 1;
    }
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..take]) {
        *d = *b as c_char;
    }
    if let Some(end) = dst.get_mut(take) {
        *end = 0;
    }
}

/// Rejects flag bits outside `known`.
pub(crate) fn check_flags(flags: u32, known: u32, what: &str) -> FfiResult {
    if flags & !known != 0 {
        return Err(FfiError::new(
            memprobe_status::InvalidArgument,
            format!("unknown {what} bits {:#x}", flags & !known),
        ));
    }
    Ok(())
}
