//! The training-loop tracker through the C ABI.

use crate::boundary::{opt_text, out, run, text, FfiError, FfiResult};
use crate::handle::Table;
use crate::source::{memprobe_source, sources};
use crate::status::memprobe_status;
use crate::trace::FdWriter;
use crate::window::memprobe_delta;
use memprobe_core::leak::LeakPolicy;
use memprobe_core::lock::Lock;
use memprobe_core::release::{ReleaseKind, ReleasePolicy};
use memprobe_core::sinks::{CsvSink, JsonlSink, TableSink};
use memprobe_core::{Error, ErrorKind, PhaseKind, Record, Sink, StepOutcome, Tracker};
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// A training-loop tracker: nested phases over a set of sources, one record
/// per ended phase, sinks, cache-release policies and leak trends.
#[allow(non_camel_case_types)]
pub struct memprobe_tracker {
    _private: [u8; 0],
}

static TRACKERS: Table<Lock<Tracker>> = Table::new(0x4b, "memprobe_tracker");

/// A training-loop phase (`kind` arguments of memprobe_tracker_*).
#[repr(u32)]
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
        kind: phase.map_or(PhaseKind::Custom as u32, |p| p.kind as u32),
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

pub(crate) fn tracker(h: *const memprobe_tracker) -> FfiResult<Arc<Lock<Tracker>>> {
    if h.is_null() {
        return Err(crate::boundary::null("tracker"));
    }
    TRACKERS.get(h as usize)
}

fn kind(v: u32) -> FfiResult<PhaseKind> {
    Ok(PhaseKind::from_u32(v)?)
}

fn write_record(
    r: &Record,
    record: *mut memprobe_phase_record,
    deltas: *mut memprobe_delta,
    n_deltas: usize,
) {
    // SAFETY: each pointer, when non-NULL, is valid for writes (documented).
    unsafe {
        if let Some(slot) = record.as_mut() {
            *slot = record_to_c(r);
        }
        if !deltas.is_null() {
            let out = std::slice::from_raw_parts_mut(deltas, n_deltas);
            for (o, d) in out.iter_mut().zip(&r.sources) {
                *o = d.into();
            }
        }
    }
}

/// Creates a tracker over `sources[0..n_sources]`.
#[no_mangle]
pub extern "C" fn memprobe_tracker_new(
    sources: *const *const memprobe_source,
    n_sources: usize,
    out: *mut *mut memprobe_tracker,
) -> memprobe_status {
    run("memprobe_tracker_new", || {
        let slot = self::out(out, "out")?;
        let t = Tracker::new(&self::sources(sources, n_sources)?)?;
        *slot = TRACKERS.insert(Lock::new(t))? as *mut memprobe_tracker;
        Ok(())
    })
}

/// Finishes the tracker's sinks (files are renamed into place) and releases
/// it. NULL is a no-op.
#[no_mangle]
pub extern "C" fn memprobe_tracker_free(tracker: *mut memprobe_tracker) -> memprobe_status {
    run("memprobe_tracker_free", || {
        if !tracker.is_null() {
            let t = TRACKERS.remove(tracker as usize)?;
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
    run("memprobe_tracker_begin", || {
        let (k, n) = (self::kind(kind)?, opt_text(name, "name")?);
        Ok(self::tracker(tracker)?.lock()?.begin(k, n)?)
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
    run("memprobe_tracker_end", || {
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
    let t = self::tracker(tracker)?;
    let r = op(&mut *t.lock()?, k, n)?;
    write_record(&r, out.record, out.deltas, out.n_deltas);
    Ok(())
}

/// Ends the innermost phase and begins the next of the same kind at the
/// same instant (the cheapest step boundary); outputs as memprobe_tracker_end.
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
    run("memprobe_tracker_next", || {
        end_with(tracker, kind, name, out, Tracker::next)
    })
}

/// Adds a PeakMemMetric-style table: one row per ended phase of `kind`
/// (fastai: epochs), each source's delta used and delta peaked in MiB,
/// written to file descriptor `fd` (not closed by memprobe).
#[no_mangle]
pub extern "C" fn memprobe_tracker_add_table_sink(
    tracker: *mut memprobe_tracker,
    kind: u32,
    fd: i32,
) -> memprobe_status {
    run("memprobe_tracker_add_table_sink", || {
        let k = self::kind(kind)?;
        if fd < 0 {
            return Err(FfiError::new(
                memprobe_status::InvalidArgument,
                format!("bad fd {fd}"),
            ));
        }
        self::tracker(tracker)?
            .lock()?
            .add_sink(Arc::new(TableSink::new(k, Box::new(FdWriter(fd)))));
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
    run("memprobe_tracker_add_jsonl_sink", || {
        let sink = JsonlSink::create(text(path, "path")?)?;
        self::tracker(tracker)?.lock()?.add_sink(Arc::new(sink));
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
    run("memprobe_tracker_add_csv_sink", || {
        let sink = CsvSink::create(text(path, "path")?)?;
        self::tracker(tracker)?.lock()?.add_sink(Arc::new(sink));
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
    data: *mut c_void,
}
// SAFETY: the caller promises (documented) user_data may be used from the thread ending phases.
unsafe impl Send for CallbackSink {}
// SAFETY: as above; calls are serialised by the tracker's lock.
unsafe impl Sync for CallbackSink {}

impl Sink for CallbackSink {
    fn on_record(&self, r: &Record) {
        let rec = record_to_c(r);
        let deltas: Vec<memprobe_delta> = r.sources.iter().map(Into::into).collect();
        // SAFETY: the caller's function and data; the buffers outlive the call.
        unsafe { (self.f)(&rec, deltas.as_ptr(), deltas.len(), self.data) };
    }
}

/// Adds a sink that calls `callback` with each record.
#[no_mangle]
pub extern "C" fn memprobe_tracker_add_callback_sink(
    tracker: *mut memprobe_tracker,
    callback: memprobe_record_fn,
    user_data: *mut c_void,
) -> memprobe_status {
    run("memprobe_tracker_add_callback_sink", || {
        let f = callback.ok_or_else(|| crate::boundary::null("callback"))?;
        self::tracker(tracker)?
            .lock()?
            .add_sink(Arc::new(CallbackSink { f, data: user_data }));
        Ok(())
    })
}

/// Finishes every sink now (renames files into place) and detaches them;
/// memprobe_tracker_free does it too.
#[no_mangle]
pub extern "C" fn memprobe_tracker_finish_sinks(tracker: *mut memprobe_tracker) -> memprobe_status {
    run("memprobe_tracker_finish_sinks", || {
        Ok(self::tracker(tracker)?.lock()?.finish_sinks()?)
    })
}

/// A release callback: empties a framework's cache (e.g.
/// `c10::cuda::CUDACachingAllocator::emptyCache()`) or runs a collector;
/// returns 0, or non-zero on failure. Used by tracker release policies and by
/// the GPU `_no_cache` readings (memprobe_gpu_set_cache_release).
#[allow(non_camel_case_types)]
pub type memprobe_release_fn = Option<unsafe extern "C" fn(user_data: *mut c_void) -> i32>;

struct UserData(*mut c_void);
// SAFETY: the caller promises user_data may be used from the thread ending phases.
unsafe impl Send for UserData {}

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
    run("memprobe_tracker_add_release", || {
        let name = text(name, "name")?;
        let kind = ReleaseKind::from_u32(kind)?;
        let f = callback.ok_or_else(|| crate::boundary::null("callback"))?;
        let data = UserData(user_data);
        let call = move || {
            let data = &data;
            // SAFETY: the caller's function and data, per the contract above.
            match unsafe { f(data.0) } {
                0 => Ok(()),
                rc => Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("release callback returned {rc}"),
                )),
            }
        };
        Ok(self::tracker(tracker)?
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
    run("memprobe_tracker_release_every", || {
        let policy = ReleasePolicy::Every {
            kind: self::kind(kind)?,
            n,
            gc,
        };
        Ok(self::tracker(tracker)?.lock()?.add_release_policy(policy)?)
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
    run("memprobe_tracker_release_below_free", || {
        let policy = ReleasePolicy::BelowFree {
            source: source_index,
            bytes,
            gc,
        };
        Ok(self::tracker(tracker)?.lock()?.add_release_policy(policy)?)
    })
}

fn write_freed(freed: &[u64], out: *mut u64, n: usize) {
    if !out.is_null() {
        // SAFETY: the caller promises `out` holds `n` elements.
        let o = unsafe { std::slice::from_raw_parts_mut(out, n) };
        for (d, s) in o.iter_mut().zip(freed) {
            *d = *s;
        }
    }
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
    run("memprobe_tracker_release_now", || {
        let e = self::tracker(tracker)?.lock()?.release_now(gc);
        write_freed(&e.freed(), freed, n_freed);
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
    run("memprobe_tracker_releases_fired", || {
        let slot = self::out(out, "out")?;
        *slot = self::tracker(tracker)?.lock()?.releases_fired();
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
    run("memprobe_tracker_set_leak_policy", || {
        let policy = (epochs > 0).then_some(LeakPolicy {
            threshold: threshold_bytes,
            epochs,
        });
        Ok(self::tracker(tracker)?.lock()?.set_leak_policy(policy)?)
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
    run("memprobe_tracker_leak_status", || {
        let s = self::tracker(tracker)?.lock()?.leak_status(index)?;
        // SAFETY: each pointer, when non-NULL, is valid for a write (documented).
        unsafe {
            if let Some(p) = flagged.as_mut() {
                *p = s.flagged;
            }
            if let Some(p) = streak.as_mut() {
                *p = s.streak;
            }
            if let Some(p) = last_growth.as_mut() {
                *p = s.last_growth;
            }
        }
        Ok(())
    })
}

/// One training step for memprobe_tracker_run_oom_retry: return
/// MEMPROBE_STEP_DONE, MEMPROBE_STEP_OUT_OF_MEMORY, or anything else to fail.
#[allow(non_camel_case_types)]
pub type memprobe_step_fn = Option<unsafe extern "C" fn(user_data: *mut c_void) -> i32>;

/// What memprobe_tracker_run_oom_retry did.
#[repr(C)]
#[derive(Default)]
#[allow(non_camel_case_types)]
pub struct memprobe_oom_report {
    /// Whether the step finally completed.
    pub succeeded: bool,
    /// Retries it took (0 = succeeded at once).
    pub retries: u32,
    /// Bytes freed by the releases, summed over sources.
    pub freed_bytes: u64,
}

/// fastai's gpu_mem_restore, made useful outside IPython: runs `step`; when
/// it returns MEMPROBE_STEP_OUT_OF_MEMORY, runs every release callback (GC
/// included) and retries, at most `max_retries` times. A step that returns
/// another value fails the call (UNAVAILABLE). Bytes freed per source go to
/// `freed[0..n_freed]` when not NULL.
#[no_mangle]
pub extern "C" fn memprobe_tracker_run_oom_retry(
    tracker: *mut memprobe_tracker,
    step: memprobe_step_fn,
    user_data: *mut c_void,
    max_retries: u32,
    out: *mut memprobe_oom_report,
    freed: *mut u64,
    n_freed: usize,
) -> memprobe_status {
    run("memprobe_tracker_run_oom_retry", || {
        let slot = self::out(out, "out")?;
        let step = step.ok_or_else(|| crate::boundary::null("step"))?;
        let t = self::tracker(tracker)?;
        let report = t.lock()?.run_with_oom_retry(
            || {
                // SAFETY: the caller's function and data.
                match unsafe { step(user_data) } {
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
        let f = report.freed();
        *slot = memprobe_oom_report {
            succeeded: report.succeeded,
            retries: report.retries,
            freed_bytes: f.iter().copied().fold(0u64, u64::saturating_add),
        };
        write_freed(&f, freed, n_freed);
        Ok(())
    })
}

pub(crate) fn live() -> usize {
    TRACKERS.live()
}
