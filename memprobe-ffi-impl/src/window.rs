//! Peak windows through the C ABI.

use crate::boundary::{entry_point, free_point, opt_out_array, out, FfiError, FfiResult};
use crate::handle::{lock, publish, release, Handle, Locked, Table};
use crate::source::{fidelity_code, kind_code, memprobe_source, sources};
use crate::status::memprobe_status;
use memprobe_core::{SourceDelta, Window};

/// An open peak window over one or more sources.
#[allow(non_camel_case_types)]
pub struct memprobe_window {
    _private: [u8; 0],
}

/// A window behind a handle, with the buffer its boundaries fill (reused,
/// so a step boundary allocates nothing).
pub(crate) struct OpenWindow {
    window: Window,
    ended: Vec<SourceDelta>,
}

static WINDOWS: Table<OpenWindow, Locked> = Table::new(0x57, "memprobe_window");

impl Handle for memprobe_window {
    type Object = OpenWindow;
    type Kind = Locked;
    fn table() -> &'static Table<OpenWindow, Locked> {
        &WINDOWS
    }
}

/// What one source did over an interval (a window, a trace), in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct memprobe_delta {
    /// Used when the interval (last) started.
    pub used_start: u64,
    /// Used at the end, or now for an interval still open.
    pub used_end: u64,
    /// Highest used over the interval (Avalanche's Max*).
    pub peak: u64,
    /// used_end - used_start (negative when memory was released).
    pub delta_used: i64,
    /// fastai's delta peaked: max(0, peak - used_start), minus delta_used
    /// when delta_used > 0 (the blip above the net growth).
    pub delta_peaked: u64,
    /// The source's memprobe_source_kind.
    pub kind: u32,
    /// The source's memprobe_fidelity: how exact `peak` is.
    pub fidelity: u32,
}

impl From<&SourceDelta> for memprobe_delta {
    fn from(d: &SourceDelta) -> Self {
        memprobe_delta {
            used_start: d.used_start,
            used_end: d.used_end,
            peak: d.peak,
            delta_used: d.delta_used,
            delta_peaked: d.delta_peaked,
            kind: kind_code(d.kind),
            fidelity: fidelity_code(d.fidelity),
        }
    }
}

pub(crate) fn pick(deltas: &[SourceDelta], index: usize) -> FfiResult<&SourceDelta> {
    deltas.get(index).ok_or_else(|| {
        FfiError::new(
            memprobe_status::InvalidId,
            format!("source index {index} out of range (0..{})", deltas.len()),
        )
    })
}

/// Opens a peak window over `sources[0..n_sources]`. Windows are concurrent,
/// nestable and independent: opening, resetting or freeing one never changes
/// another's peak. For exact sources no spike is missed, however short.
#[no_mangle]
pub extern "C" fn memprobe_window_open(
    sources: *const *const memprobe_source,
    n_sources: usize,
    out: *mut *mut memprobe_window,
) -> memprobe_status {
    entry_point("memprobe_window_open", || {
        self::out(out, "out")?;
        let window = Window::open(&self::sources(sources, n_sources)?)?;
        let ended = Vec::with_capacity(window.sources().count());
        publish(OpenWindow { window, ended }, out)
    })
}

/// The peak of source `index` (in the order given at open) since the window
/// (last) started, in bytes. Only that source is read: another source that
/// fails (a lost GPU) does not affect it.
#[no_mangle]
pub extern "C" fn memprobe_window_peak(
    window: *const memprobe_window,
    index: usize,
    out: *mut u64,
) -> memprobe_status {
    entry_point("memprobe_window_peak", || {
        let slot = self::out(out, "out")?;
        *slot = lock(window)?.window.peak_of(index)?;
        Ok(())
    })
}

/// Start, now, peak and fastai's deltas of source `index`, without ending
/// the window. Only that source is read.
#[no_mangle]
pub extern "C" fn memprobe_window_measure(
    window: *const memprobe_window,
    index: usize,
    out: *mut memprobe_delta,
) -> memprobe_status {
    entry_point("memprobe_window_measure", || {
        let slot = self::out(out, "out")?;
        *slot = (&lock(window)?.window.measure_of(index)?).into();
        Ok(())
    })
}

/// Ends the window's interval and starts the next at the same instant (one
/// reading serves as both end and new start); other windows keep their
/// peaks. This is the cheapest step boundary. When `ended` is not NULL, the
/// ended interval of source i is written to `ended[i]` for i below both
/// `n_ended` and the number of sources; nothing past those is touched.
/// All or nothing: when a source fails (a custom read, a mark callback),
/// its status is returned and the window goes on unchanged — its start and
/// every source's peak, those already restarted included.
#[no_mangle]
pub extern "C" fn memprobe_window_reset(
    window: *mut memprobe_window,
    ended: *mut memprobe_delta,
    n_ended: usize,
) -> memprobe_status {
    entry_point("memprobe_window_reset", || {
        let mut w = lock(window)?;
        let OpenWindow { window, ended: buf } = &mut *w;
        // No C function reports a window's time: the boundary reads no clock.
        window.reset_untimed_into(buf)?;
        opt_out_array(ended, n_ended, buf.iter().map(Into::into));
        Ok(())
    })
}

/// Number of sources of the window.
#[no_mangle]
pub extern "C" fn memprobe_window_source_count(
    window: *const memprobe_window,
    out: *mut usize,
) -> memprobe_status {
    entry_point("memprobe_window_source_count", || {
        let slot = self::out(out, "out")?;
        *slot = lock(window)?.window.sources().count();
        Ok(())
    })
}

/// Closes the window. NULL is a no-op. A call in progress on the window on
/// another thread finishes first.
#[no_mangle]
pub extern "C" fn memprobe_window_free(window: *mut memprobe_window) -> memprobe_status {
    free_point("memprobe_window_free", || {
        release(window)?;
        Ok(())
    })
}
