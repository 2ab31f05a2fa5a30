//! The training-loop tracker through the C ABI.

use crate::boundary::{
    entry_point, free_point, opt_out, opt_out_array, opt_text, out, text, FdWriter, FfiError,
    FfiResult, UserData,
};
use crate::handle::{get, publish, release, Handle, Shared, Table};
use crate::source::{memprobe_source, sources};
use crate::status::memprobe_status;
use crate::window::memprobe_delta;
use memprobe_core::internal::lock::Lock;
use memprobe_core::LeakPolicy;
use memprobe_core::{CsvSink, JsonlSink, TableSink};
use memprobe_core::{Error, ErrorKind, PhaseKind, Record, Sink, StepOutcome, Tracker};
use memprobe_core::{ReleaseKind, ReleasePolicy};
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// A training-loop tracker: nested phases over a set of sources, one record
/// per ended phase, sinks, cache-release policies and leak trends.
#[allow(non_camel_case_types)]
pub struct memprobe_tracker {
    _private: [u8; 0],
}

static TRACKERS: Table<Lock<Tracker>, Shared> = Table::new(0x4b, "memprobe_tracker");

impl Handle for memprobe_tracker {
    type Object = Lock<Tracker>;
    type Kind = Shared;
    fn table() -> &'static Table<Lock<Tracker>, Shared> {
        &TRACKERS
    }
}

/// A training-loop phase (`kind` arguments of memprobe_tracker_*).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum memprobe_phase_kind {
    /// One minibatch / iteration.
    Step = 0,
    /// One pass over the training data.
    Epoch = 1,
    /// One experience (a training or evaluation task).
    Experience = 2,
    /// One evaluation pass over a stream.
    Stream = 3,
    /// A phase named by the caller (the `name` argument).
    Custom = 4,
}

// The C numbering of the core's PhaseKind and ReleaseKind lives here only:
// explicit matches both ways, walked by a test.

/// The core's kind for a C `memprobe_phase_kind` value.
pub(crate) fn phase_kind_from_c(v: u32) -> FfiResult<PhaseKind> {
    const STEP: u32 = memprobe_phase_kind::Step as u32;
    const EPOCH: u32 = memprobe_phase_kind::Epoch as u32;
    const EXPERIENCE: u32 = memprobe_phase_kind::Experience as u32;
    const STREAM: u32 = memprobe_phase_kind::Stream as u32;
    const CUSTOM: u32 = memprobe_phase_kind::Custom as u32;
    match v {
        STEP => Ok(PhaseKind::Step),
        EPOCH => Ok(PhaseKind::Epoch),
        EXPERIENCE => Ok(PhaseKind::Experience),
        STREAM => Ok(PhaseKind::Stream),
        CUSTOM => Ok(PhaseKind::Custom),
        other => Err(FfiError::new(
            memprobe_status::InvalidArgument,
            format!("unknown memprobe_phase_kind {other}"),
        )),
    }
}

/// The C value of a phase kind.
pub(crate) fn phase_kind_code(k: PhaseKind) -> memprobe_phase_kind {
    match k {
        PhaseKind::Step => memprobe_phase_kind::Step,
        PhaseKind::Epoch => memprobe_phase_kind::Epoch,
        PhaseKind::Experience => memprobe_phase_kind::Experience,
        PhaseKind::Stream => memprobe_phase_kind::Stream,
        PhaseKind::Custom => memprobe_phase_kind::Custom,
    }
}

/// The core's release kind for a C `MEMPROBE_RELEASE_*` value.
pub(crate) fn release_kind_from_c(v: u32) -> FfiResult<ReleaseKind> {
    match v {
        MEMPROBE_RELEASE_CACHE => Ok(ReleaseKind::Cache),
        MEMPROBE_RELEASE_GC => Ok(ReleaseKind::Gc),
        other => Err(FfiError::new(
            memprobe_status::InvalidArgument,
            format!("unknown release kind {other}"),
        )),
    }
}

/// `memprobe_tracker_add_release` kind: a framework cache (always run).
pub const MEMPROBE_RELEASE_CACHE: u32 = 0;
/// `memprobe_tracker_add_release` kind: a garbage collector (run when a
/// policy asks for GC, and on out-of-memory recovery).
pub const MEMPROBE_RELEASE_GC: u32 = 1;

/// `memprobe_step_fn` result: the step completed.
pub const MEMPROBE_STEP_DONE: i32 = 0;
/// `memprobe_step_fn` result: the step ran out of memory; release and retry.
pub const MEMPROBE_STEP_OUT_OF_MEMORY: i32 = 1;

/// The record of an ended phase. Per-source figures are `memprobe_delta`s.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct memprobe_phase_record {
    /// A memprobe_phase_kind value.
    pub kind: u32,
    /// Enclosing phases still open (0 = outermost).
    pub depth: u32,
    /// 0-based count of phases of this kind (and name) ended before it.
    pub index: u64,
    /// Start, CLOCK_MONOTONIC nanoseconds.
    pub started_at_ns: u64,
    /// End, CLOCK_MONOTONIC nanoseconds.
    pub ended_at_ns: u64,
    /// ended_at_ns - started_at_ns.
    pub duration_ns: u64,
    /// Number of sources (entries in the deltas).
    pub n_sources: u32,
    /// Cache releases fired at the end of this phase.
    pub n_releases: u32,
    /// Bit i set: source i is flagged as leaking (epochs with a leak policy;
    /// sources beyond 63 are not represented).
    pub leak_flags: u64,
    /// Bytes freed by this phase's releases, summed over sources.
    pub released_bytes: u64,
    /// The phase's name, NUL-terminated (the kind's name unless custom).
    pub name: [c_char; 72],
}

fn record_to_c(r: &Record) -> memprobe_phase_record {
    let phase = r.phase.as_ref();
    let mut name = [0 as c_char; 72];
    crate::boundary::copy_to_fixed(&mut name, &r.label);
    let leak_flags = r
        .leaks
        .iter()
        .enumerate()
        .take(64)
        .filter(|(_, l)| l.flagged)
        .fold(0u64, |m, (i, _)| m | 1 << i);
    memprobe_phase_record {
        kind: phase_kind_code(phase.map_or(PhaseKind::Custom, |p| p.kind)) as u32,
        depth: phase.map_or(0, |p| p.depth),
        index: phase.map_or(0, |p| p.index),
        started_at_ns: r.started_at_ns,
        ended_at_ns: r.ended_at_ns,
        duration_ns: r.duration_ns(),
        n_sources: r.sources.len() as u32,
        n_releases: r.releases.len() as u32,
        leak_flags,
        released_bytes: r
            .releases
            .iter()
            .flat_map(|e| e.freed())
            .fold(0u64, u64::saturating_add),
        name,
    }
}

fn kind(v: u32) -> FfiResult<PhaseKind> {
    phase_kind_from_c(v)
}

fn write_record(
    r: &Record,
    record: *mut memprobe_phase_record,
    deltas: *mut memprobe_delta,
    n_deltas: usize,
) {
    if let Some(slot) = opt_out(record) {
        *slot = record_to_c(r);
    }
    opt_out_array(deltas, n_deltas, r.sources.iter().map(Into::into));
}

/// Creates a tracker over `sources[0..n_sources]`.
#[no_mangle]
pub extern "C" fn memprobe_tracker_new(
    sources: *const *const memprobe_source,
    n_sources: usize,
    out: *mut *mut memprobe_tracker,
) -> memprobe_status {
    entry_point("memprobe_tracker_new", || {
        self::out(out, "out")?;
        let t = Tracker::new(&self::sources(sources, n_sources)?)?;
        publish(Lock::new(t), out)
    })
}

/// Finishes the tracker's sinks (files are renamed into place) and releases
/// it. A sink that failed (a write error, e.g. MEMPROBE_STATUS_IO) makes
/// this return its error; the tracker is released all the same. NULL is a
/// no-op.
#[no_mangle]
pub extern "C" fn memprobe_tracker_free(tracker: *mut memprobe_tracker) -> memprobe_status {
    free_point("memprobe_tracker_free", || {
        if let Some(t) = release(tracker)? {
            t.lock()?.finish_sinks()?;
        }
        Ok(())
    })
}

/// Begins a phase. `name` is required for MEMPROBE_PHASE_KIND_CUSTOM and
/// must be NULL otherwise. A step begins inside an epoch, an epoch inside an
/// experience, an experience inside a stream, never the reverse
/// (WRONG_ORDER); custom phases nest anywhere.
#[no_mangle]
pub extern "C" fn memprobe_tracker_begin(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_tracker_begin", || {
        let (k, n) = (self::kind(kind)?, opt_text(name, "name")?);
        Ok(get(tracker)?.lock()?.begin(k, n)?)
    })
}

/// Ends the innermost phase, which must be `kind` (and `name`), else
/// WRONG_ORDER and nothing changes. Its record goes to the sinks and, when
/// the pointers are not NULL, to `*record` and `deltas[0..n_deltas]` (one per
/// source).
#[no_mangle]
pub extern "C" fn memprobe_tracker_end(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
    record: *mut memprobe_phase_record,
    deltas: *mut memprobe_delta,
    n_deltas: usize,
) -> memprobe_status {
    let out = Outputs {
        record,
        deltas,
        n_deltas,
    };
    entry_point("memprobe_tracker_end", || {
        end_with(tracker, kind, name, out, Tracker::end)
    })
}

/// Where an ended phase's record goes.
struct Outputs {
    record: *mut memprobe_phase_record,
    deltas: *mut memprobe_delta,
    n_deltas: usize,
}

/// The body of memprobe_tracker_end and _next, which differ only in `op`.
fn end_with(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
    out: Outputs,
    op: fn(&mut Tracker, PhaseKind, Option<&str>) -> memprobe_core::Result<Record>,
) -> FfiResult {
    let (k, n) = (self::kind(kind)?, opt_text(name, "name")?);
    let t = get(tracker)?;
    let r = op(&mut *t.lock()?, k, n)?;
    write_record(&r, out.record, out.deltas, out.n_deltas);
    Ok(())
}

/// A tracker end that names the phase whose tail the window becomes.
type ChainedEnd = fn(
    &mut Tracker,
    PhaseKind,
    Option<&str>,
    PhaseKind,
    Option<&str>,
) -> memprobe_core::Result<Record>;

/// [`end_with`] for the ends that name the phase whose tail the window
/// becomes (`next`: its kind and name).
fn end_chained_with(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
    next: (u32, *const c_char),
    out: Outputs,
    op: ChainedEnd,
) -> FfiResult {
    let (k, n) = (self::kind(kind)?, opt_text(name, "name")?);
    let (nk, nn) = (self::kind(next.0)?, opt_text(next.1, "next_name")?);
    let t = get(tracker)?;
    let r = op(&mut *t.lock()?, k, n, nk, nn)?;
    write_record(&r, out.record, out.deltas, out.n_deltas);
    Ok(())
}

/// Ends the innermost phase and begins the next of the same kind at the
/// same instant (the cheapest step boundary); outputs as memprobe_tracker_end.
/// All or nothing: when a source fails the phase stays open, its peaks
/// intact, and no record is made.
#[no_mangle]
pub extern "C" fn memprobe_tracker_next(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
    record: *mut memprobe_phase_record,
    deltas: *mut memprobe_delta,
    n_deltas: usize,
) -> memprobe_status {
    let out = Outputs {
        record,
        deltas,
        n_deltas,
    };
    entry_point("memprobe_tracker_next", || {
        end_with(tracker, kind, name, out, Tracker::next)
    })
}

/// Ends the innermost phase, which must be `kind` (and `name`), as
/// memprobe_tracker_end does (same outputs), and keeps its window running,
/// restarted at this end, as the *tail* of the phase `next_kind` /
/// `next_name`: the next memprobe_tracker_resume of that phase begins at
/// this end. One boundary per step when the hook that ends a step cannot
/// tell whether another follows. A release due at this end runs after the
/// boundary, in the tail. WRONG_ORDER when `kind` is not the innermost open
/// phase; all or nothing.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn memprobe_tracker_end_into(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
    next_kind: u32,
    next_name: *const c_char,
    record: *mut memprobe_phase_record,
    deltas: *mut memprobe_delta,
    n_deltas: usize,
) -> memprobe_status {
    let out = Outputs {
        record,
        deltas,
        n_deltas,
    };
    let next = (next_kind, next_name);
    entry_point("memprobe_tracker_end_into", || {
        end_chained_with(tracker, kind, name, next, out, Tracker::end_into)
    })
}

/// Ends the phase of `kind` (and `name`) that began on its own tail and
/// ends now: memprobe_tracker_resume then memprobe_tracker_end_into in one
/// call (same outputs; one boundary per step for a loop whose hooks see
/// only the end of each step). Without a tail the phase began now. Nesting
/// as for memprobe_tracker_begin (WRONG_ORDER, nothing changes).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn memprobe_tracker_end_tail(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
    next_kind: u32,
    next_name: *const c_char,
    record: *mut memprobe_phase_record,
    deltas: *mut memprobe_delta,
    n_deltas: usize,
) -> memprobe_status {
    let out = Outputs {
        record,
        deltas,
        n_deltas,
    };
    let next = (next_kind, next_name);
    entry_point("memprobe_tracker_end_tail", || {
        end_chained_with(tracker, kind, name, next, out, Tracker::end_tail)
    })
}

/// Begins a phase of `kind` (and `name`) on the tail of `from_kind` /
/// `from_name` (made by memprobe_tracker_end_into or
/// memprobe_tracker_mark_tail): its interval began when the tail did, and the
/// tail is used up. Without such a tail, as memprobe_tracker_begin. Nesting
/// as for memprobe_tracker_begin (WRONG_ORDER, nothing changes).
#[no_mangle]
pub extern "C" fn memprobe_tracker_resume(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
    from_kind: u32,
    from_name: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_tracker_resume", || {
        let (k, n) = (self::kind(kind)?, opt_text(name, "name")?);
        let (fk, fnm) = (self::kind(from_kind)?, opt_text(from_name, "from_name")?);
        Ok(get(tracker)?.lock()?.resume(k, n, fk, fnm)?)
    })
}

/// Starts the tail of `kind` (and `name`) now: the next
/// memprobe_tracker_resume of it begins here. No phase begins or ends; an
/// earlier tail of it is dropped.
#[no_mangle]
pub extern "C" fn memprobe_tracker_mark_tail(
    tracker: *mut memprobe_tracker,
    kind: u32,
    name: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_tracker_mark_tail", || {
        let (k, n) = (self::kind(kind)?, opt_text(name, "name")?);
        Ok(get(tracker)?.lock()?.mark_tail(k, n)?)
    })
}

/// Adds a PeakMemMetric-style table: one row per ended phase of `kind`
/// (fastai: epochs), each source's delta used and delta peaked in MiB,
/// written to file descriptor `fd` (not closed by memprobe). A descriptor
/// that is not open for writing is INVALID_ARGUMENT; a write that fails
/// later (the descriptor was closed, the disk is full, a pipe's reader is
/// gone: never SIGPIPE) is reported by
/// memprobe_tracker_finish_sinks or memprobe_tracker_free (MEMPROBE_STATUS_IO).
#[no_mangle]
pub extern "C" fn memprobe_tracker_add_table_sink(
    tracker: *mut memprobe_tracker,
    kind: u32,
    fd: i32,
) -> memprobe_status {
    entry_point("memprobe_tracker_add_table_sink", || {
        let k = self::kind(kind)?;
        let w = FdWriter::new(fd)?;
        get(tracker)?
            .lock()?
            .add_sink(Arc::new(TableSink::new(k, Box::new(w))));
        Ok(())
    })
}

/// Adds a JSON Lines sink: one object per record. The file is written under a
/// temporary name beside `path` and renamed to `path` by
/// memprobe_tracker_finish_sinks or memprobe_tracker_free, so a failed run
/// never leaves a half-written file at `path`. An unwritable directory fails here.
#[no_mangle]
pub extern "C" fn memprobe_tracker_add_jsonl_sink(
    tracker: *mut memprobe_tracker,
    path: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_tracker_add_jsonl_sink", || {
        let sink = JsonlSink::create(text(path, "path")?)?;
        get(tracker)?.lock()?.add_sink(Arc::new(sink));
        Ok(())
    })
}

/// Adds a CSV sink (one row per record and source; header first), written
/// safely like the JSON Lines sink.
#[no_mangle]
pub extern "C" fn memprobe_tracker_add_csv_sink(
    tracker: *mut memprobe_tracker,
    path: *const c_char,
) -> memprobe_status {
    entry_point("memprobe_tracker_add_csv_sink", || {
        let sink = CsvSink::create(text(path, "path")?)?;
        get(tracker)?.lock()?.add_sink(Arc::new(sink));
        Ok(())
    })
}

/// Receives each record: the phase, one delta per source, user data. Runs
/// on the thread that ended the phase; it must not call back into the same
/// tracker (WRONG_ORDER).
#[allow(non_camel_case_types)]
pub type memprobe_record_fn = Option<
    unsafe extern "C" fn(
        record: *const memprobe_phase_record,
        deltas: *const memprobe_delta,
        n_deltas: usize,
        user_data: *mut c_void,
    ),
>;

struct CallbackSink {
    f: unsafe extern "C" fn(
        *const memprobe_phase_record,
        *const memprobe_delta,
        usize,
        *mut c_void,
    ),
    data: UserData,
}

impl Sink for CallbackSink {
    fn on_record(&self, r: &Record) {
        let rec = record_to_c(r);
        let deltas: Vec<memprobe_delta> = r.sources.iter().map(Into::into).collect();
        // SAFETY: the caller's function and data; the buffers outlive the call.
        unsafe { (self.f)(&rec, deltas.as_ptr(), deltas.len(), self.data.get()) };
    }
}

/// Adds a sink that calls `callback` with each record.
#[no_mangle]
pub extern "C" fn memprobe_tracker_add_callback_sink(
    tracker: *mut memprobe_tracker,
    callback: memprobe_record_fn,
    user_data: *mut c_void,
) -> memprobe_status {
    entry_point("memprobe_tracker_add_callback_sink", || {
        let f = callback.ok_or_else(|| crate::boundary::null("callback"))?;
        get(tracker)?.lock()?.add_sink(Arc::new(CallbackSink {
            f,
            data: UserData::new(user_data),
        }));
        Ok(())
    })
}

/// Finishes every sink now (renames files into place) and detaches them;
/// memprobe_tracker_free does it too.
#[no_mangle]
pub extern "C" fn memprobe_tracker_finish_sinks(tracker: *mut memprobe_tracker) -> memprobe_status {
    entry_point("memprobe_tracker_finish_sinks", || {
        Ok(get(tracker)?.lock()?.finish_sinks()?)
    })
}

/// A release callback: empties a framework's cache (e.g.
/// `c10::cuda::CUDACachingAllocator::emptyCache()`) or runs a collector;
/// returns 0, or non-zero on failure. Used by tracker release policies and by
/// the GPU `_no_cache` readings (memprobe_gpu_set_cache_release).
#[allow(non_camel_case_types)]
pub type memprobe_release_fn = Option<unsafe extern "C" fn(user_data: *mut c_void) -> i32>;

/// Registers a release callback named `name`; `kind` is
/// MEMPROBE_RELEASE_CACHE or MEMPROBE_RELEASE_GC.
#[no_mangle]
pub extern "C" fn memprobe_tracker_add_release(
    tracker: *mut memprobe_tracker,
    name: *const c_char,
    kind: u32,
    callback: memprobe_release_fn,
    user_data: *mut c_void,
) -> memprobe_status {
    entry_point("memprobe_tracker_add_release", || {
        let name = text(name, "name")?;
        let kind = release_kind_from_c(kind)?;
        let f = callback.ok_or_else(|| crate::boundary::null("callback"))?;
        let data = UserData::new(user_data);
        let call = move || {
            // SAFETY: the caller's function and data, per the contract above.
            match unsafe { f(data.get()) } {
                0 => Ok(()),
                rc => Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("release callback returned {rc}"),
                )),
            }
        };
        Ok(get(tracker)?
            .lock()?
            .add_release(name, kind, Box::new(call))?)
    })
}

/// Runs the release callbacks at the end of every `n`-th step or epoch
/// (`kind`): when (index + 1) % n == 0, like ClearCacheHook. `gc` also runs
/// the GC callbacks.
#[no_mangle]
pub extern "C" fn memprobe_tracker_release_every(
    tracker: *mut memprobe_tracker,
    kind: u32,
    n: u64,
    gc: bool,
) -> memprobe_status {
    entry_point("memprobe_tracker_release_every", || {
        let policy = ReleasePolicy::Every {
            kind: self::kind(kind)?,
            n,
            gc,
        };
        Ok(get(tracker)?.lock()?.add_release_policy(policy)?)
    })
}

/// Runs the release callbacks at the end of any step or epoch where source
/// `source_index`'s free bytes (GPU free, MemAvailable, cgroup headroom) are
/// below `bytes`.
#[no_mangle]
pub extern "C" fn memprobe_tracker_release_below_free(
    tracker: *mut memprobe_tracker,
    source_index: usize,
    bytes: u64,
    gc: bool,
) -> memprobe_status {
    entry_point("memprobe_tracker_release_below_free", || {
        let policy = ReleasePolicy::BelowFree {
            source: source_index,
            bytes,
            gc,
        };
        Ok(get(tracker)?.lock()?.add_release_policy(policy)?)
    })
}

/// Runs the release callbacks now (GC ones too when `gc`); bytes freed per
/// source go to `freed[0..n_freed]` when not NULL.
#[no_mangle]
pub extern "C" fn memprobe_tracker_release_now(
    tracker: *mut memprobe_tracker,
    gc: bool,
    freed: *mut u64,
    n_freed: usize,
) -> memprobe_status {
    entry_point("memprobe_tracker_release_now", || {
        let e = get(tracker)?.lock()?.release_now(gc);
        opt_out_array(freed, n_freed, e.freed());
        match e.errors.first() {
            Some((name, msg)) => Err(FfiError::new(
                memprobe_status::Unavailable,
                format!("{name}: {msg}"),
            )),
            None => Ok(()),
        }
    })
}

/// Number of releases fired so far (every reason).
#[no_mangle]
pub extern "C" fn memprobe_tracker_releases_fired(
    tracker: *const memprobe_tracker,
    out: *mut u64,
) -> memprobe_status {
    entry_point("memprobe_tracker_releases_fired", || {
        let slot = self::out(out, "out")?;
        *slot = get(tracker)?.lock()?.releases_fired();
        Ok(())
    })
}

/// Flags a source whose end-of-epoch used grows by more than
/// `threshold_bytes` for `epochs` epochs in a row (one non-growing epoch
/// clears it). `epochs` = 0 turns leak tracking off.
#[no_mangle]
pub extern "C" fn memprobe_tracker_set_leak_policy(
    tracker: *mut memprobe_tracker,
    threshold_bytes: u64,
    epochs: u32,
) -> memprobe_status {
    entry_point("memprobe_tracker_set_leak_policy", || {
        let policy = (epochs > 0).then_some(LeakPolicy {
            threshold: threshold_bytes,
            epochs,
        });
        Ok(get(tracker)?.lock()?.set_leak_policy(policy)?)
    })
}

/// The leak trend of source `index`: flagged, current streak of growing
/// epochs, last epoch-over-epoch growth in bytes (each pointer nullable).
#[no_mangle]
pub extern "C" fn memprobe_tracker_leak_status(
    tracker: *const memprobe_tracker,
    index: usize,
    flagged: *mut bool,
    streak: *mut u32,
    last_growth: *mut i64,
) -> memprobe_status {
    entry_point("memprobe_tracker_leak_status", || {
        let s = get(tracker)?.lock()?.leak_status(index)?;
        if let Some(p) = opt_out(flagged) {
            *p = s.flagged;
        }
        if let Some(p) = opt_out(streak) {
            *p = s.streak;
        }
        if let Some(p) = opt_out(last_growth) {
            *p = s.last_growth;
        }
        Ok(())
    })
}

/// One training step for memprobe_tracker_run_oom_retry: return
/// MEMPROBE_STEP_DONE, MEMPROBE_STEP_OUT_OF_MEMORY, or anything else to fail.
#[allow(non_camel_case_types)]
pub type memprobe_step_fn = Option<unsafe extern "C" fn(user_data: *mut c_void) -> i32>;

/// What memprobe_tracker_run_oom_retry did: the OOM retry's result (not an
/// OOM report). Its old name, memprobe_oom_report, is a deprecated typedef
/// until 0.3.0 (the header's trailer).
#[repr(C)]
#[derive(Default)]
#[allow(non_camel_case_types)]
pub struct memprobe_oom_retry_result {
    /// Whether the step finally completed.
    pub succeeded: bool,
    /// Retries it took (0 = succeeded at once).
    pub retries: u32,
    /// Bytes freed by the releases, summed over sources.
    pub freed_bytes: u64,
}

/// fastai's gpu_mem_restore, made useful outside IPython: runs `step`; when
/// it returns MEMPROBE_STEP_OUT_OF_MEMORY, runs every release callback (GC
/// included) and retries, at most `max_retries` times. When the last try
/// still ran out of memory the status is MEMPROBE_STATUS_OUT_OF_MEMORY, with
/// `*out` (`succeeded` false) and `freed` written all the same, and the
/// out-of-memory report, when one is configured for
/// MEMPROBE_OOM_TRIGGER_CALLER, is written (reported by `run_oom_retry`; a
/// failed write shows in memprobe_tracker_oom_status). A step that
/// returns another value fails the call (UNAVAILABLE). Bytes freed per
/// source go to `freed[0..n_freed]` when not NULL.
#[no_mangle]
pub extern "C" fn memprobe_tracker_run_oom_retry(
    tracker: *mut memprobe_tracker,
    step: memprobe_step_fn,
    user_data: *mut c_void,
    max_retries: u32,
    out: *mut memprobe_oom_retry_result,
    freed: *mut u64,
    n_freed: usize,
) -> memprobe_status {
    entry_point("memprobe_tracker_run_oom_retry", || {
        let slot = self::out(out, "out")?;
        let step = step.ok_or_else(|| crate::boundary::null("step"))?;
        let t = get(tracker)?;
        let data = UserData::new(user_data);
        let result = t.lock()?.run_with_oom_retry(
            || {
                // SAFETY: the caller's function and data.
                match unsafe { step(data.get()) } {
                    MEMPROBE_STEP_DONE => Ok(StepOutcome::Done),
                    MEMPROBE_STEP_OUT_OF_MEMORY => Ok(StepOutcome::OutOfMemory),
                    rc => Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("step returned {rc}"),
                    )),
                }
            },
            max_retries,
        )?;
        let f = result.freed();
        *slot = memprobe_oom_retry_result {
            succeeded: result.succeeded,
            retries: result.retries,
            freed_bytes: f.iter().copied().fold(0u64, u64::saturating_add),
        };
        opt_out_array(freed, n_freed, f);
        if result.succeeded {
            Ok(())
        } else {
            Err(FfiError::new(
                memprobe_status::OutOfMemory,
                format!(
                    "the step still ran out of memory after {} retries",
                    result.retries
                ),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every core phase kind against its C value, by exhaustive matches: a
    /// new kind does not compile until the C ABI numbers it.
    #[test]
    fn every_phase_kind_has_its_c_value() {
        let promised = |k: PhaseKind| match k {
            PhaseKind::Step => 0,
            PhaseKind::Epoch => 1,
            PhaseKind::Experience => 2,
            PhaseKind::Stream => 3,
            PhaseKind::Custom => 4,
        };
        let all = [
            PhaseKind::Step,
            PhaseKind::Epoch,
            PhaseKind::Experience,
            PhaseKind::Stream,
            PhaseKind::Custom,
        ];
        for k in all {
            let c = phase_kind_code(k);
            assert_eq!(c as u32, promised(k), "{k:?}");
            assert_eq!(phase_kind_from_c(c as u32).ok(), Some(k));
        }
        for v in [5, 99, u32::MAX] {
            assert_eq!(
                phase_kind_from_c(v).err().map(|e| e.status),
                Some(memprobe_status::InvalidArgument)
            );
        }
    }

    #[test]
    fn every_release_kind_has_its_c_value() {
        let promised = |k: ReleaseKind| match k {
            ReleaseKind::Cache => MEMPROBE_RELEASE_CACHE,
            ReleaseKind::Gc => MEMPROBE_RELEASE_GC,
        };
        for (k, v) in [(ReleaseKind::Cache, 0), (ReleaseKind::Gc, 1)] {
            assert_eq!(promised(k), v);
            assert_eq!(release_kind_from_c(v).ok(), Some(k));
        }
        assert_eq!(
            release_kind_from_c(2).err().map(|e| e.status),
            Some(memprobe_status::InvalidArgument)
        );
    }
}
