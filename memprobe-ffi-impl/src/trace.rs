//! Traces (fastai's GPUMemTrace) through the C ABI.

use crate::boundary::{
    check_flags, copy_out, entry_point, free_point, opt_text, out, FdWriter, UserData,
};
use crate::handle::{lock, publish, release, Handle, Locked, Table};
use crate::source::{memprobe_source, sources};
use crate::status::memprobe_status;
use crate::window::{memprobe_delta, pick};
use memprobe_core::{Trace, TraceOptions};
use std::ffi::{c_char, c_void, CString};
use std::io::Write;

/// A trace: delta used and delta peaked of a set of sources since its
/// start, with fastai's report line.
#[allow(non_camel_case_types)]
pub struct memprobe_trace {
    _private: [u8; 0],
}

static TRACES: Table<Trace, Locked> = Table::new(0x54, "memprobe_trace");

impl Handle for memprobe_trace {
    type Object = Trace;
    type Kind = Locked;
    fn table() -> &'static Table<Trace, Locked> {
        &TRACES
    }
}

/// `memprobe_trace_new` flag: do not print reports (data still works).
pub const MEMPROBE_TRACE_SILENT: u32 = 1;
/// `memprobe_trace_new` flag: do not start at creation; call memprobe_trace_start.
pub const MEMPROBE_TRACE_DEFERRED: u32 = 2;

/// Creates a trace over `sources[0..n_sources]`, started unless
/// MEMPROBE_TRACE_DEFERRED. `ctx` (nullable) prefixes every report's context.
/// Reports print to standard error until redirected.
#[no_mangle]
pub extern "C" fn memprobe_trace_new(
    sources: *const *const memprobe_source,
    n_sources: usize,
    ctx: *const c_char,
    flags: u32,
    out: *mut *mut memprobe_trace,
) -> memprobe_status {
    entry_point("memprobe_trace_new", || {
        self::out(out, "out")?;
        check_flags(
            flags,
            MEMPROBE_TRACE_SILENT | MEMPROBE_TRACE_DEFERRED,
            "trace flags",
        )?;
        let options = TraceOptions {
            ctx: opt_text(ctx, "ctx")?.map(str::to_owned),
            silent: flags & MEMPROBE_TRACE_SILENT != 0,
            on_exit_report: false,
            start: flags & MEMPROBE_TRACE_DEFERRED == 0,
        };
        let t = Trace::new(&self::sources(sources, n_sources)?, options)?;
        publish(t, out)
    })
}

/// Starts measuring. MEMPROBE_STATUS_WRONG_ORDER if already running.
#[no_mangle]
pub extern "C" fn memprobe_trace_start(trace: *mut memprobe_trace) -> memprobe_status {
    entry_point("memprobe_trace_start", || Ok(lock(trace)?.start()?))
}

/// Stops and freezes the data. MEMPROBE_STATUS_WRONG_ORDER if not running
/// (stop before start, double stop).
#[no_mangle]
pub extern "C" fn memprobe_trace_stop(trace: *mut memprobe_trace) -> memprobe_status {
    entry_point("memprobe_trace_stop", || Ok(lock(trace)?.stop()?))
}

/// Restarts the counters of a running trace (WRONG_ORDER if stopped). All or
/// nothing: a source that fails leaves every delta as it was.
#[no_mangle]
pub extern "C" fn memprobe_trace_reset(trace: *mut memprobe_trace) -> memprobe_status {
    entry_point("memprobe_trace_reset", || Ok(lock(trace)?.reset()?))
}

/// Whether the trace is measuring.
#[no_mangle]
pub extern "C" fn memprobe_trace_is_running(
    trace: *const memprobe_trace,
    out: *mut bool,
) -> memprobe_status {
    entry_point("memprobe_trace_is_running", || {
        let slot = self::out(out, "out")?;
        *slot = lock(trace)?.is_running();
        Ok(())
    })
}

/// fastai's `data()` for source `index`: delta used and delta peaked, bytes.
/// A stopped trace returns what it measured when it stopped.
#[no_mangle]
pub extern "C" fn memprobe_trace_data(
    trace: *const memprobe_trace,
    index: usize,
    delta_used: *mut i64,
    delta_peaked: *mut u64,
) -> memprobe_status {
    entry_point("memprobe_trace_data", || {
        let used = out(delta_used, "delta_used")?;
        let peaked = out(delta_peaked, "delta_peaked")?;
        let data = lock(trace)?.data()?;
        let d = pick(&data, index)?;
        (*used, *peaked) = (d.delta_used, d.delta_peaked);
        Ok(())
    })
}

/// Everything measured for source `index` (start, end, peak, deltas).
#[no_mangle]
pub extern "C" fn memprobe_trace_measure(
    trace: *const memprobe_trace,
    index: usize,
    out: *mut memprobe_delta,
) -> memprobe_status {
    entry_point("memprobe_trace_measure", || {
        let slot = self::out(out, "out")?;
        let data = lock(trace)?.data()?;
        *slot = pick(&data, index)?.into();
        Ok(())
    })
}

/// Prints the report line `△Used Peaked MB: <used> <peaked> (<ctx>: <note>)`
/// (unless silent). `note` may be NULL.
#[no_mangle]
pub extern "C" fn memprobe_trace_report(
    trace: *mut memprobe_trace,
    note: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_trace_report", || {
        let note = opt_text(note, "note")?;
        lock(trace)?.report(note)?;
        Ok(())
    })
}

/// memprobe_trace_report, then memprobe_trace_reset (needs a running trace).
#[no_mangle]
pub extern "C" fn memprobe_trace_report_n_reset(
    trace: *mut memprobe_trace,
    note: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_trace_report_n_reset", || {
        let note = opt_text(note, "note")?;
        lock(trace)?.report_n_reset(note)?;
        Ok(())
    })
}

/// Writes the report line for `note` (nullable) into `buf[0..len]`, NUL
/// included, without printing it. `*needed` (nullable) receives the size
/// needed; a short buffer gets the line cut at a UTF-8 character boundary
/// (NUL-terminated, nothing written past the NUL) and BUFFER_TOO_SMALL.
#[no_mangle]
pub extern "C" fn memprobe_trace_format(
    trace: *const memprobe_trace,
    note: *const c_char,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> memprobe_status {
    entry_point("memprobe_trace_format", || {
        let note = opt_text(note, "note")?;
        let line = lock(trace)?.line(note)?;
        copy_out(&line, buf, len, needed)
    })
}

/// Silences (true) or restores (false) printed reports.
#[no_mangle]
pub extern "C" fn memprobe_trace_set_silent(
    trace: *mut memprobe_trace,
    silent: bool,
) -> memprobe_status {
    entry_point("memprobe_trace_set_silent", || {
        lock(trace)?.set_silent(silent);
        Ok(())
    })
}

/// Sends printed reports to file descriptor `fd` (not closed by memprobe;
/// it must stay open while the trace reports). A descriptor that is not
/// open for writing is INVALID_ARGUMENT; a write that fails later fails the
/// report call (MEMPROBE_STATUS_IO), a pipe or socket whose reader is gone
/// included: memprobe never raises SIGPIPE in its host.
#[no_mangle]
pub extern "C" fn memprobe_trace_set_output_fd(
    trace: *mut memprobe_trace,
    fd: i32,
) -> memprobe_status {
    entry_point("memprobe_trace_set_output_fd", || {
        let w = FdWriter::new(fd)?;
        lock(trace)?.set_output(Box::new(w));
        Ok(())
    })
}

/// Receives each printed report line (NUL-terminated, no newline).
#[allow(non_camel_case_types)]
pub type memprobe_line_fn =
    Option<unsafe extern "C" fn(line: *const c_char, user_data: *mut c_void)>;

struct CallbackWriter {
    f: unsafe extern "C" fn(*const c_char, *mut c_void),
    data: UserData,
    pending: Vec<u8>,
}

impl Write for CallbackWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(pos) = self.pending.iter().position(|&c| c == b'\n') {
            let line: Vec<u8> = self
                .pending
                .drain(..=pos)
                .take(pos)
                .filter(|&c| c != 0)
                .collect();
            let c = CString::new(line).unwrap_or_default();
            // SAFETY: the caller's function and data; `c` lives across the call.
            unsafe { (self.f)(c.as_ptr(), self.data.get()) };
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends each printed report line to `callback(line, user_data)` instead of
/// a file descriptor.
#[no_mangle]
pub extern "C" fn memprobe_trace_set_output_callback(
    trace: *mut memprobe_trace,
    callback: memprobe_line_fn,
    user_data: *mut c_void,
) -> memprobe_status {
    entry_point("memprobe_trace_set_output_callback", || {
        let f = callback.ok_or_else(|| crate::boundary::null("callback"))?;
        lock(trace)?.set_output(Box::new(CallbackWriter {
            f,
            data: UserData::new(user_data),
            pending: Vec::new(),
        }));
        Ok(())
    })
}

/// Releases the trace (no report is printed). NULL is a no-op.
#[no_mangle]
pub extern "C" fn memprobe_trace_free(trace: *mut memprobe_trace) -> memprobe_status {
    free_point("memprobe_trace_free", || {
        release(trace)?;
        Ok(())
    })
}
