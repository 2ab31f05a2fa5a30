//! Out-of-memory reports through the C ABI (memprobe-core's `oom_report`,
//! with memprobe-gpu's GPU part and driver trigger).

use crate::boundary::{
    c_string, entry_point, fd_writer, opt_text, out, versioned, versioned_since, FfiError,
    FfiResult, UserData,
};
use crate::handle::get;
use crate::status::memprobe_status;
use crate::tracker::memprobe_tracker;
use memprobe_core::oom_report::{
    CacheFigures, FailedAllocation, LiveBlocks, OomCallback, OomLocation, OomReportOptions,
    OomTrigger, OomTriggers, DEFAULT_KEEP_ENDED, MAX_LIVE_BLOCKS_BYTES,
};
use std::ffi::{c_char, c_void};

/// `memprobe_oom_report_options.triggers` bit: the GPU driver failing a
/// counted allocation with CUDA_ERROR_OUT_OF_MEMORY, seen by memprobe's
/// interposer (libmemprobe_interpose.so must be loaded).
pub const MEMPROBE_OOM_TRIGGER_DRIVER: u32 = 1;
/// `memprobe_oom_report_options.triggers` bit: the caller's reports
/// (memprobe_tracker_report_oom, memprobe_tracker_report_oom_event).
pub const MEMPROBE_OOM_TRIGGER_CALLER: u32 = 2;
/// Ended phases a report keeps when `keep_ended` is 0.
pub const MEMPROBE_OOM_KEEP_ENDED_DEFAULT: u32 = 8;
/// The most ended phases a report keeps.
pub const MEMPROBE_OOM_KEEP_ENDED_MAX: u32 = 4096;

// The macros are literals (cbindgen copies them): the build fails when they
// drift from the core's values.
const _: () = assert!(MEMPROBE_OOM_KEEP_ENDED_DEFAULT as usize == DEFAULT_KEEP_ENDED);
const _: () =
    assert!(MEMPROBE_OOM_KEEP_ENDED_MAX as usize == memprobe_core::oom_report::MAX_KEEP_ENDED);
/// A device argument of memprobe_tracker_report_oom: not known.
pub const MEMPROBE_OOM_DEVICE_UNKNOWN: i32 = -1;
/// `memprobe_oom_report_event.valid`: `device_total_bytes` holds a value.
pub const MEMPROBE_OOM_EVENT_DEVICE_TOTAL: u32 = 1;
/// `memprobe_oom_report_event.valid`: `device_free_bytes` holds a value.
pub const MEMPROBE_OOM_EVENT_DEVICE_FREE: u32 = 2;
/// `memprobe_oom_report_cache.valid`: `reserved_bytes` holds a value.
pub const MEMPROBE_OOM_CACHE_RESERVED: u32 = 1;
/// `memprobe_oom_report_cache.valid`: `allocated_bytes` holds a value.
pub const MEMPROBE_OOM_CACHE_ALLOCATED: u32 = 2;
/// `memprobe_oom_report_cache.valid`: `releasable_bytes` holds a value.
pub const MEMPROBE_OOM_CACHE_RELEASABLE: u32 = 4;

/// Receives each out-of-memory report: the JSON document and the summary
/// for people (both NUL-terminated, valid during the call), and user data.
/// It runs on the thread of the trigger — for the driver's, inside the
/// failing allocation — so it must make no CUDA call and must not call back
/// into the same tracker.
#[allow(non_camel_case_types)]
pub type memprobe_oom_report_fn = Option<
    unsafe extern "C" fn(json: *const c_char, summary: *const c_char, user_data: *mut c_void),
>;

/// How a tracker reports out-of-memory (memprobe_tracker_set_oom_report).
/// Zero-initialise it, set `struct_size = sizeof(memprobe_oom_report_options)`,
/// then the fields wanted: a zero field means "none" or "the default".
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct memprobe_oom_report_options {
    /// sizeof(memprobe_oom_report_options) as the caller was compiled with:
    /// the version of this struct. Fields are only added at the end; a
    /// larger size from a newer header is accepted when the fields this
    /// library does not know are zero.
    pub struct_size: u32,
    /// MEMPROBE_OOM_TRIGGER_* bits (at least one).
    pub triggers: u32,
    /// A file for the JSON, written under a temporary name beside it and
    /// renamed into place (it appears whole or not at all); NULL: none.
    pub path: *const c_char,
    /// A file descriptor (open for writing; not closed by memprobe) for the
    /// JSON document and a newline; 0 or -1: none.
    pub json_fd: i32,
    /// A file descriptor for the summary for people (e.g. 2, standard
    /// error); 0 or -1: none. A write to a pipe or socket whose reader is
    /// gone fails with MEMPROBE_STATUS_IO, never SIGPIPE.
    pub summary_fd: i32,
    /// A function receiving each report; NULL: none.
    pub callback: memprobe_oom_report_fn,
    /// Passed to `callback`.
    pub user_data: *mut c_void,
    /// Ended phases kept for the report (0: MEMPROBE_OOM_KEEP_ENDED_DEFAULT;
    /// at most MEMPROBE_OOM_KEEP_ENDED_MAX).
    pub keep_ended: u32,
}

/// A framework's cache on one device, for memprobe_oom_report_event.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct memprobe_oom_report_cache {
    /// The device (CUDA ordinal as the process sees it).
    pub device: u32,
    /// MEMPROBE_OOM_CACHE_* bits: which figures hold a value.
    pub valid: u32,
    /// Bytes the cache holds from the driver (PyTorch: reserved).
    pub reserved_bytes: u64,
    /// Bytes of it in use (PyTorch: allocated).
    pub allocated_bytes: u64,
    /// Bytes releasing the cache would give back to the driver, by the
    /// framework's own account.
    pub releasable_bytes: u64,
}

/// An out-of-memory failure reported by the caller, with everything it
/// knows (memprobe_tracker_report_oom_event). Zero-initialise it and set
/// `struct_size = sizeof(memprobe_oom_report_event)`.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct memprobe_oom_report_event {
    /// sizeof(memprobe_oom_report_event), as for memprobe_oom_report_options.
    pub struct_size: u32,
    /// The device (CUDA ordinal), or MEMPROBE_OOM_DEVICE_UNKNOWN.
    pub device: i32,
    /// The bytes asked for; 0: not known.
    pub requested_bytes: u64,
    /// Who reports it (1 to 64 printable bytes, e.g. "torch"); NULL: "caller".
    pub reported_by: *const c_char,
    /// The caller's detail (an exception's message); NULL: none.
    pub detail: *const c_char,
    /// MEMPROBE_OOM_EVENT_* bits: which figures below hold a value.
    pub valid: u32,
    /// Entries in `caches`.
    pub n_caches: u32,
    /// The device's total as the reporter saw it (PyTorch's observer: the
    /// device's total, or the allowed maximum under a memory fraction).
    pub device_total_bytes: u64,
    /// The device's free bytes at the failure, as the reporter saw them.
    pub device_free_bytes: u64,
    /// The reporter's caches per device (`n_caches` entries; NULL when 0).
    pub caches: *const memprobe_oom_report_cache,
    /// What the framework had live at the failure: one torch attribution
    /// record of kind "oom" (schema "memprobe.torch_attribution/1", the
    /// blocks with their frames, the requested size, the segments) as JSON,
    /// NUL-terminated, at most 256 KiB; NULL: none. The report embeds it as
    /// `live_blocks`; one that is not valid JSON, has another schema or is
    /// too large is left out and the report says why (`live_blocks_error`):
    /// never an error, the report is written all the same. A struct_size
    /// from a header without this field is accepted (it reads as NULL).
    pub live_blocks_json: *const c_char,
}

// SAFETY: integers and raw pointers only.
unsafe impl crate::boundary::ZeroValid for memprobe_oom_report_event {}

/// sizeof(memprobe_oom_report_event) before `live_blocks_json`: callers
/// built with that header keep working.
const EVENT_SIZE_BEFORE_LIVE_BLOCKS: usize =
    std::mem::offset_of!(memprobe_oom_report_event, live_blocks_json);

/// Where a tracker's out-of-memory report stands.
#[repr(C)]
#[derive(Default)]
#[allow(non_camel_case_types)]
pub struct memprobe_oom_report_status {
    /// The next trigger writes a report.
    pub armed: bool,
    /// The configured MEMPROBE_OOM_TRIGGER_* bits.
    pub triggers: u32,
    /// Reports written (one per arming).
    pub reports_written: u64,
    /// Triggers seen, written or not.
    pub triggers_seen: u64,
    /// Triggers since the last report, counted and not written.
    pub later_triggers: u64,
    /// MEMPROBE_STATUS_OK, or the status of the last report's failed write
    /// (its message is not kept).
    pub last_write_status: u32,
}

fn options_from_c(o: &memprobe_oom_report_options) -> FfiResult<OomReportOptions> {
    crate::boundary::check_flags(
        o.triggers,
        MEMPROBE_OOM_TRIGGER_DRIVER | MEMPROBE_OOM_TRIGGER_CALLER,
        "MEMPROBE_OOM_TRIGGER_*",
    )?;
    let callback = o.callback.map(|f| {
        let data = UserData::new(o.user_data);
        Box::new(move |_: &_, json: &str, summary: &str| {
            let (j, s) = (c_string(json), c_string(summary));
            // SAFETY: the caller's function and data; the strings outlive the call.
            unsafe { f(j.as_ptr(), s.as_ptr(), data.get()) };
        }) as OomCallback
    });
    Ok(OomReportOptions {
        triggers: OomTriggers {
            driver: o.triggers & MEMPROBE_OOM_TRIGGER_DRIVER != 0,
            caller: o.triggers & MEMPROBE_OOM_TRIGGER_CALLER != 0,
        },
        keep_ended: match o.keep_ended {
            0 => DEFAULT_KEEP_ENDED,
            n => n as usize,
        },
        path: opt_text(o.path, "path")?.map(Into::into),
        json_writer: fd_writer(o.json_fd, "json_fd")?,
        summary_writer: fd_writer(o.summary_fd, "summary_fd")?,
        callback,
        gpu: None,
    })
}

/// Configures the tracker's out-of-memory report: when an allocation fails
/// for lack of GPU memory, ONE report is written — the failed allocation
/// (device, bytes asked, who reported it, detail, time), the open phases with
/// each source's peak so far, the last `keep_ended` ended phases, each GPU's
/// per-process use (NVML), what releasing caches would free where known —
/// as JSON (docs/oom-report.schema.json) and as a summary for people, to the
/// destinations chosen (at least one). Triggers: MEMPROBE_OOM_TRIGGER_DRIVER
/// (memprobe's interposer sees the driver fail a counted allocation; the
/// report is written on the failing thread before the error returns,
/// unchanged, to the program) and MEMPROBE_OOM_TRIGGER_CALLER
/// (memprobe_tracker_report_oom). The first trigger writes the report;
/// later ones are counted (memprobe_tracker_oom_status), and when there were
/// any the file at `path` is written once more with their count when the
/// report is re-armed, removed, or the tracker freed. See docs/oom.md.
/// `options` NULL removes the report (a no-op when none is configured).
///
/// Errors: NULL_POINTER (tracker), INVALID_HANDLE, INVALID_ARGUMENT (a
/// struct_size smaller than sizeof(memprobe_oom_report_options), unknown
/// trigger bits, no trigger, no destination, keep_ended above
/// MEMPROBE_OOM_KEEP_ENDED_MAX, a descriptor not open for writing, a path
/// naming a directory or ending in '/'), UNAVAILABLE (the driver trigger without the
/// interposer loaded — it says how to load it — or with counting switched
/// off; a path whose directory is missing), WRONG_ORDER (already configured:
/// remove it first). On error nothing changes.
#[no_mangle]
pub extern "C" fn memprobe_tracker_set_oom_report(
    tracker: *mut memprobe_tracker,
    options: *const memprobe_oom_report_options,
) -> memprobe_status {
    entry_point("memprobe_tracker_set_oom_report", || {
        let t = get(tracker)?;
        let Some(o) = versioned(options, "memprobe_oom_report_options")? else {
            t.lock()?.set_oom_report(None)?;
            return Ok(());
        };
        let opts = options_from_c(o)?;
        memprobe_gpu::configure_oom_report(&t, opts)?;
        Ok(())
    })
}

fn location(device: i32) -> FfiResult<OomLocation> {
    match device {
        MEMPROBE_OOM_DEVICE_UNKNOWN => Ok(OomLocation::Unknown),
        d if d >= 0 => Ok(OomLocation::Device(d as u32)),
        d => Err(FfiError::new(
            memprobe_status::InvalidId,
            format!("device {d}: a CUDA ordinal (0 or more) or MEMPROBE_OOM_DEVICE_UNKNOWN (-1)"),
        )),
    }
}

fn report(tracker: *mut memprobe_tracker, failed: FailedAllocation) -> FfiResult {
    get(tracker)?.lock()?.report_oom(failed)?;
    Ok(())
}

/// Reports an allocation that failed for lack of memory (e.g. a C++ trainer
/// catching c10::OutOfMemoryError): on `device` (MEMPROBE_OOM_DEVICE_UNKNOWN
/// when not known), asking `requested_bytes` (0: not known), with the
/// caller's `detail` (NULL: none); reported by "caller". The first report
/// after configuration (or re-arming) is written, with the open phases
/// measured now; later ones are counted. OK either way.
///
/// Errors: NULL_POINTER, INVALID_HANDLE, INVALID_ID (device below -1),
/// INVALID_ARGUMENT (detail not UTF-8), WRONG_ORDER (no report configured,
/// or configured without MEMPROBE_OOM_TRIGGER_CALLER), a destination's
/// failure (e.g. IO; the report is then used up all the same).
#[no_mangle]
pub extern "C" fn memprobe_tracker_report_oom(
    tracker: *mut memprobe_tracker,
    device: i32,
    requested_bytes: u64,
    detail: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_tracker_report_oom", || {
        let mut f = FailedAllocation::new(
            OomTrigger::Caller,
            location(device)?,
            Some(requested_bytes).filter(|&b| b > 0),
            "caller",
        );
        f.detail = opt_text(detail, "detail")?.map(str::to_owned);
        report(tracker, f)
    })
}

/// As memprobe_tracker_report_oom, with everything the reporter knows: who
/// reports it (a framework: "torch"), the device's total and free bytes as
/// it saw them, and its caches per device (so that the report can say what
/// releasing them would free).
///
/// Errors: as memprobe_tracker_report_oom; NULL_POINTER for a NULL `event`,
/// or NULL `caches` with `n_caches` > 0; INVALID_ARGUMENT for a small
/// struct_size (below the first release's), unknown `valid` bits, a
/// `reported_by` that is not 1 to 64 printable bytes, more than 64 caches.
/// A `live_blocks_json` that is refused is no error (see the field).
#[no_mangle]
pub extern "C" fn memprobe_tracker_report_oom_event(
    tracker: *mut memprobe_tracker,
    event: *const memprobe_oom_report_event,
) -> memprobe_status {
    entry_point("memprobe_tracker_report_oom_event", || {
        let e = versioned_since(
            event,
            "memprobe_oom_report_event",
            EVENT_SIZE_BEFORE_LIVE_BLOCKS,
        )?
        .ok_or_else(|| crate::boundary::null("event"))?;
        crate::boundary::check_flags(
            e.valid,
            MEMPROBE_OOM_EVENT_DEVICE_TOTAL | MEMPROBE_OOM_EVENT_DEVICE_FREE,
            "MEMPROBE_OOM_EVENT_*",
        )?;
        if e.n_caches > 64 {
            return Err(FfiError::new(
                memprobe_status::InvalidArgument,
                format!("{} caches: at most 64 (one per device)", e.n_caches),
            ));
        }
        let reported_by = opt_text(e.reported_by, "reported_by")?.unwrap_or("caller");
        let mut f = FailedAllocation::new(
            OomTrigger::Caller,
            location(e.device)?,
            Some(e.requested_bytes).filter(|&b| b > 0),
            reported_by,
        );
        f.detail = opt_text(e.detail, "detail")?.map(str::to_owned);
        if !e.live_blocks_json.is_null() {
            f.live_blocks = Some(live_blocks(e.live_blocks_json));
        }
        f.device_total_bytes =
            (e.valid & MEMPROBE_OOM_EVENT_DEVICE_TOTAL != 0).then_some(e.device_total_bytes);
        f.device_free_bytes =
            (e.valid & MEMPROBE_OOM_EVENT_DEVICE_FREE != 0).then_some(e.device_free_bytes);
        if e.n_caches > 0 {
            if e.caches.is_null() {
                return Err(crate::boundary::null("caches"));
            }
            // SAFETY: the caller promises `n_caches` entries.
            let caches = unsafe { std::slice::from_raw_parts(e.caches, e.n_caches as usize) };
            for c in caches {
                crate::boundary::check_flags(
                    c.valid,
                    MEMPROBE_OOM_CACHE_RESERVED
                        | MEMPROBE_OOM_CACHE_ALLOCATED
                        | MEMPROBE_OOM_CACHE_RELEASABLE,
                    "MEMPROBE_OOM_CACHE_*",
                )?;
                let has = |bit: u32, v: u64| (c.valid & bit != 0).then_some(v);
                f.caches.push(CacheFigures {
                    device: c.device,
                    framework: reported_by.to_owned(),
                    reserved_bytes: has(MEMPROBE_OOM_CACHE_RESERVED, c.reserved_bytes),
                    allocated_bytes: has(MEMPROBE_OOM_CACHE_ALLOCATED, c.allocated_bytes),
                    releasable_bytes: has(MEMPROBE_OOM_CACHE_RELEASABLE, c.releasable_bytes),
                });
            }
        }
        report(tracker, f)
    })
}

/// The caller's record, checked by the core; read at most one byte past
/// the bound, so that a runaway string is refused without reading it to
/// its end.
fn live_blocks(p: *const c_char) -> Result<LiveBlocks, String> {
    let max = MAX_LIVE_BLOCKS_BYTES;
    let mut n = 0;
    // SAFETY: the caller promises a NUL-terminated string; reading stops
    // at its NUL or one byte past `max`.
    while n <= max && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    if n > max {
        return Err(format!(
            "the live-blocks record has more than the {max} bytes allowed"
        ));
    }
    // SAFETY: `n` bytes read above.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) };
    let text = std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "the live-blocks record is not UTF-8 (byte {})",
            e.valid_up_to()
        )
    })?;
    LiveBlocks::from_json(text)
}

/// Where the tracker's out-of-memory report stands: armed, triggers, reports
/// written, triggers seen and those counted since the last report, the last
/// write's status.
///
/// Errors: NULL_POINTER, INVALID_HANDLE, WRONG_ORDER (no report configured).
#[no_mangle]
pub extern "C" fn memprobe_tracker_oom_status(
    tracker: *const memprobe_tracker,
    out: *mut memprobe_oom_report_status,
) -> memprobe_status {
    entry_point("memprobe_tracker_oom_status", || {
        let slot = self::out(out, "out")?;
        let t = get(tracker)?;
        let st = match t.lock()?.oom_reporter() {
            Some(r) => r.status()?,
            None => return Err(not_configured()),
        };
        *slot = memprobe_oom_report_status {
            armed: st.armed,
            triggers: (u32::from(st.triggers.driver) * MEMPROBE_OOM_TRIGGER_DRIVER)
                | (u32::from(st.triggers.caller) * MEMPROBE_OOM_TRIGGER_CALLER),
            reports_written: st.reports_written,
            triggers_seen: st.triggers_seen,
            later_triggers: st.later_triggers,
            last_write_status: st.last_error.map_or(memprobe_status::Ok, |e| {
                memprobe_status::from_kind(e.kind())
            }) as u32,
        };
        Ok(())
    })
}

fn not_configured() -> FfiError {
    FfiError::new(
        memprobe_status::WrongOrder,
        "no out-of-memory report is configured for this tracker \
         (memprobe_tracker_set_oom_report)",
    )
}

/// Arms the tracker's out-of-memory report again: the next trigger writes a
/// new report (replacing the file). When triggers were counted since the
/// last report, its file is first written again with their count.
///
/// Errors: NULL_POINTER, INVALID_HANDLE, WRONG_ORDER (no report configured),
/// that file's write error.
#[no_mangle]
pub extern "C" fn memprobe_tracker_rearm_oom_report(
    tracker: *mut memprobe_tracker,
) -> memprobe_status {
    entry_point("memprobe_tracker_rearm_oom_report", || {
        let t = get(tracker)?;
        let r = t
            .lock()?
            .oom_reporter()
            .cloned()
            .ok_or_else(not_configured)?;
        r.rearm()?;
        Ok(())
    })
}
