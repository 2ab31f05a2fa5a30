//! The boundary every entry point goes through: NULL checks, panic capture,
//! status mapping and the thread-local last-error message.

use crate::status::memprobe_status;
use memprobe_core::Error;
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_void, CStr, CString};
use std::io::Write;
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

/// What the boundary keeps per thread, in one thread-local: in a library
/// loaded with `dlopen` each thread-local costs a call (`__tls_get_addr`)
/// at every access, and an entry point reaches all of them.
struct ThreadState {
    /// `None` (no allocation) until a call on this thread fails.
    last_error: RefCell<Option<CString>>,
    in_boundary: Cell<bool>,
    panic_message: RefCell<Option<String>>,
}

thread_local! {
    static STATE: ThreadState = const {
        ThreadState {
            last_error: RefCell::new(None),
            in_boundary: Cell::new(false),
            panic_message: RefCell::new(None),
        }
    };
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
            if STATE.with(|st| st.in_boundary.get()) {
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
                STATE.with(|st| *st.panic_message.borrow_mut() = Some(format!("{msg}{loc}")));
            } else {
                previous(info);
            }
        }));
    });
}

/// `s` as a C string; a NUL inside (which C would read as the end) becomes
/// a space.
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Runs an entry point's body: maps errors to a status and message, catches
/// panics. `name` is the C function's name, used in messages. Success
/// clears the thread's last error.
pub(crate) fn entry_point(name: &'static str, body: impl FnOnce() -> FfiResult) -> memprobe_status {
    guarded(name, true, body)
}

/// As [`entry_point`], for the `*_free` functions: success leaves the last
/// error alone, so a finaliser (Python `__del__`, a Julia finaliser) running
/// between a failed call and `memprobe_last_error()` does not erase the
/// message. A failed free still reports its own.
pub(crate) fn free_point(name: &'static str, body: impl FnOnce() -> FfiResult) -> memprobe_status {
    guarded(name, false, body)
}

fn guarded(
    name: &'static str,
    clear_on_success: bool,
    body: impl FnOnce() -> FfiResult,
) -> memprobe_status {
    install_panic_hook();
    // One access to the thread's state for the whole call (no borrow is
    // held across `body`, which may re-enter through a callback).
    STATE.with(|st| {
        let outer = st.in_boundary.replace(true);
        let result = catch_unwind(AssertUnwindSafe(|| {
            if INJECT_PANIC_IN.as_deref() == Some(name) {
                panic!("panic injected by {PANIC_ENV}={name}");
            }
            body()
        }));
        st.in_boundary.set(outer);
        let set_last_error = |message: String| {
            *st.last_error.borrow_mut() = Some(c_string(&message));
        };
        match result {
            Ok(Ok(())) => {
                if clear_on_success {
                    let mut e = st.last_error.borrow_mut();
                    if e.is_some() {
                        *e = None;
                    }
                }
                memprobe_status::Ok
            }
            Ok(Err(e)) => {
                set_last_error(format!("{name}: {}", e.message));
                e.status
            }
            Err(_) => {
                let msg = st
                    .panic_message
                    .borrow_mut()
                    .take()
                    .unwrap_or_else(|| "unknown panic".into());
                set_last_error(format!("{name}: internal panic: {msg}"));
                memprobe_status::Panic
            }
        }
    })
}

/// The message of the last failed call on this thread, or `""` if the last
/// call succeeded. A `*_free` that succeeds leaves it as it was, so a
/// finaliser freeing a handle between a failed call and this one does not
/// erase the message. Valid until the next memprobe call on this thread.
/// Never NULL.
#[no_mangle]
pub extern "C" fn memprobe_last_error() -> *const c_char {
    STATE.with(|st| {
        st.last_error
            .borrow()
            .as_ref()
            .map_or(c"".as_ptr(), |c| c.as_ptr())
    })
}

// Every write through a caller's pointer goes through the helpers below:
// `out` / `opt_out` for one value, `out_array` / `opt_out_array` for arrays
// and `write_c_str` for strings. None of them trusts a claimed capacity
// beyond the entries it actually writes, so a capacity given in bytes
// instead of entries, or SIZE_MAX, cannot make memprobe touch memory past
// what it fills.

/// A required out-pointer.
pub(crate) fn out<'a, T>(p: *mut T, what: &str) -> FfiResult<&'a mut T> {
    // SAFETY: the caller promises a non-NULL pointer is valid for writes of T
    // (the documented contract of every entry point); NULL is rejected.
    unsafe { p.as_mut() }.ok_or_else(|| null(what))
}

/// An optional out-pointer (NULL: the caller does not want the value).
pub(crate) fn opt_out<'a, T>(p: *mut T) -> Option<&'a mut T> {
    // SAFETY: as in `out`.
    unsafe { p.as_mut() }
}

/// Writes `items` into a required output array of `capacity` elements:
/// at most `capacity` of them, and nothing past the last one written.
/// Returns how many were written. `capacity == 0`: `p` may be NULL.
pub(crate) fn out_array<T>(
    p: *mut T,
    capacity: usize,
    items: impl IntoIterator<Item = T>,
    what: &str,
) -> FfiResult<usize> {
    if p.is_null() {
        return if capacity == 0 {
            Ok(0)
        } else {
            Err(null(what))
        };
    }
    let mut written = 0;
    for item in items.into_iter().take(capacity) {
        // SAFETY: non-NULL, and the caller promises `p` holds `capacity`
        // writable elements; `written < capacity`. `write` drops nothing.
        unsafe { p.add(written).write(item) };
        written += 1;
    }
    Ok(written)
}

/// As [`out_array`] for an optional array: NULL writes nothing.
pub(crate) fn opt_out_array<T>(
    p: *mut T,
    capacity: usize,
    items: impl IntoIterator<Item = T>,
) -> usize {
    if p.is_null() {
        return 0;
    }
    out_array(p, capacity, items, "array").unwrap_or(0)
}

/// The longest prefix of `s` that fits in `room` bytes with a NUL, cut at a
/// character boundary (never a lone lead byte of a UTF-8 sequence).
fn fitting_prefix(s: &str, room: usize) -> &str {
    let mut take = s.len().min(room.saturating_sub(1));
    while !s.is_char_boundary(take) {
        take -= 1;
    }
    &s[..take]
}

/// The one string writer: copies the longest prefix of `s` that fits in
/// `dst[0..cap]` with a NUL (cut at a character boundary) and returns its
/// length. Nothing past the NUL is written; `cap == 0` writes nothing.
fn write_c_str(dst: *mut c_char, cap: usize, s: &str) -> usize {
    if dst.is_null() || cap == 0 {
        return 0;
    }
    let part = fitting_prefix(s, cap);
    // SAFETY: the caller promises `dst` holds `cap` bytes; part.len() + 1 <= cap.
    unsafe {
        std::ptr::copy_nonoverlapping(part.as_ptr(), dst.cast::<u8>(), part.len());
        *dst.add(part.len()) = 0;
    }
    part.len()
}

/// Copies `s` with a NUL into `buf[..len]`; reports the needed size (with
/// the NUL) through `needed` when given. Too small: BufferTooSmall, and as
/// much as fits (NUL-terminated, cut at a character boundary) is written.
pub(crate) fn copy_out(s: &str, buf: *mut c_char, len: usize, needed: *mut usize) -> FfiResult {
    let need = s.len() + 1;
    if let Some(n) = opt_out(needed) {
        *n = need;
    }
    if buf.is_null() {
        return if len == 0 { Ok(()) } else { Err(null("buf")) };
    }
    write_c_str(buf, len, s);
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
    write_c_str(dst.as_mut_ptr(), dst.len(), s);
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

/// A caller's `user_data` pointer, kept only to be handed back to the
/// caller's callbacks (never dereferenced by memprobe).
#[derive(Debug, Clone, Copy)]
pub(crate) struct UserData(*mut c_void);

// SAFETY: memprobe never dereferences the pointer; the caller promises (as
// each callback's documentation says) that its callbacks may be called with
// it from the threads named there.
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}

impl UserData {
    pub(crate) fn new(p: *mut c_void) -> Self {
        UserData(p)
    }

    /// The pointer, for a call to the caller's callback.
    pub(crate) fn get(self) -> *mut c_void {
        self.0
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

/// Reads a caller's versioned struct: at least this library's size, and
/// any bytes beyond it zero (fields of a newer header left unset). The
/// caller promises (the documented contract of the entry points) that a
/// non-NULL `p` points at `struct_size` readable bytes starting with a
/// `uint32_t struct_size`.
pub(crate) fn versioned<'a, T>(p: *const T, what: &str) -> FfiResult<Option<&'a T>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's struct starts with its size.
    let size = unsafe { *p.cast::<u32>() } as usize;
    let ours = std::mem::size_of::<T>();
    if size < ours {
        return Err(FfiError::new(
            memprobe_status::InvalidArgument,
            format!(
                "{what}.struct_size is {size}, this library's {what} has {ours} bytes: set \
                 struct_size = sizeof({what})"
            ),
        ));
    }
    if size > 4096 {
        return Err(FfiError::new(
            memprobe_status::InvalidArgument,
            format!("{what}.struct_size {size} is not a size of {what}"),
        ));
    }
    // SAFETY: the caller promised `size` readable bytes.
    let extra = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(ours), size - ours) };
    if extra.iter().any(|&b| b != 0) {
        return Err(FfiError::new(
            memprobe_status::InvalidArgument,
            format!(
                "{what} comes from a newer memprobe.h and sets fields this library ({}) \
                 does not know",
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    // SAFETY: at least size_of::<T>() readable bytes, as checked.
    Ok(Some(unsafe { &*p }))
}

/// A C struct whose every field is valid when all its bytes are zero
/// (integers, raw pointers, optional functions).
///
/// # Safety
///
/// Implement it only for such structs.
pub(crate) unsafe trait ZeroValid {}

/// As [`versioned`], for a struct that grew at its end: a caller's size
/// from `oldest` (the first release's size) up is accepted too, the fields
/// its header lacked reading as zero. Returns a copy.
pub(crate) fn versioned_since<T: ZeroValid>(
    p: *const T,
    what: &str,
    oldest: usize,
) -> FfiResult<Option<T>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's struct starts with its size.
    let size = unsafe { *p.cast::<u32>() } as usize;
    if size >= std::mem::size_of::<T>() || size < oldest {
        // SAFETY: a plain read of a struct of integers and pointers.
        return versioned(p, what).map(|v| v.map(|r| unsafe { std::ptr::read(r) }));
    }
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: the caller promised `size` readable bytes; `size` is below
    // size_of::<T>(); zero bytes are valid for the rest (ZeroValid).
    unsafe {
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), v.as_mut_ptr().cast::<u8>(), size);
        Ok(Some(v.assume_init()))
    }
}

/// Writes to a caller's file descriptor (never closed by memprobe), never
/// raising SIGPIPE.
pub(crate) struct FdWriter(i32);

impl FdWriter {
    /// Checks that `fd` is open for writing now, so that a closed or
    /// read-only descriptor is refused when it is given rather than
    /// failing unseen later. Errors after this (the caller closes it) are
    /// reported by the writes.
    pub(crate) fn new(fd: i32) -> Result<FdWriter, FfiError> {
        let bad =
            |why: &str| FfiError::new(memprobe_status::InvalidArgument, format!("fd {fd} {why}"));
        if fd < 0 {
            return Err(bad("is negative"));
        }
        // SAFETY: F_GETFL only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(bad("is not an open file descriptor"));
        }
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(bad("is open for reading only"));
        }
        Ok(FdWriter(fd))
    }
}

impl Write for FdWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A pipe or socket whose reader is gone fails the write (EPIPE, an
        // IO status) instead of killing the host with SIGPIPE.
        memprobe_core::internal::fd_write::write_no_sigpipe(self.0, buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An optional report writer: 0 or -1 is none, else [`FdWriter::new`]'s
/// checks, with `what` (the option's name) in the message.
pub(crate) fn fd_writer(fd: i32, what: &str) -> FfiResult<Option<Box<dyn Write + Send>>> {
    match fd {
        0 | -1 => Ok(None),
        fd => FdWriter::new(fd)
            .map(|w| Some(Box::new(w) as Box<dyn Write + Send>))
            .map_err(|e| FfiError::new(e.status, format!("{what}: {}", e.message))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_array_writes_only_the_items_whatever_the_capacity() {
        let mut buf = [7u64; 4];
        // A claimed capacity far beyond the array: only the 2 items are written.
        assert_eq!(
            out_array(buf.as_mut_ptr(), usize::MAX, [1, 2], "a").ok(),
            Some(2)
        );
        assert_eq!(buf, [1, 2, 7, 7]);
        assert_eq!(out_array(buf.as_mut_ptr(), 1, [3, 4], "a").ok(), Some(1));
        assert_eq!(buf, [3, 2, 7, 7]);
        assert_eq!(
            out_array(std::ptr::null_mut::<u64>(), 2, [1], "a")
                .err()
                .map(|e| e.status),
            Some(memprobe_status::NullPointer)
        );
        assert_eq!(
            out_array(std::ptr::null_mut::<u64>(), 0, [1], "a").ok(),
            Some(0)
        );
        assert_eq!(opt_out_array(std::ptr::null_mut::<u64>(), 9, [1]), 0);
    }

    #[test]
    fn strings_are_cut_at_a_character_boundary_and_nul_terminated() {
        let line = "\u{25b3}Used"; // "△" is 3 bytes
        for (room, want) in [(1, ""), (2, ""), (3, ""), (4, "\u{25b3}"), (5, "\u{25b3}U")] {
            let mut buf = [0x55 as c_char; 8];
            let mut needed = 0usize;
            let r = copy_out(line, buf.as_mut_ptr(), room, &mut needed);
            assert_eq!(
                r.err().map(|e| e.status),
                Some(memprobe_status::BufferTooSmall)
            );
            assert_eq!(needed, line.len() + 1);
            // SAFETY: write_c_str NUL-terminated it within `room` bytes.
            let got = unsafe { CStr::from_ptr(buf.as_ptr()) };
            assert_eq!(got.to_str().unwrap(), want, "room {room}");
            assert!(
                buf[want.len() + 1..].iter().all(|&b| b == 0x55),
                "room {room}"
            );
        }
        let mut fixed = [0x55 as c_char; 4];
        copy_to_fixed(&mut fixed, "a\u{25b3}");
        assert_eq!(&fixed[..2], &[b'a' as c_char, 0]);
    }
}
