//! Out-of-memory reports, with the GPU driver as a trigger.
//!
//! [`configure_oom_report`] configures a tracker's report (memprobe-core's
//! `oom_report`) with this crate's GPU part ([`GpuOomForensics`]) and, for
//! the driver trigger, subscribes the tracker to the hook of memprobe's
//! interposer (`memprobe_interpose_reader::oom_report_hook`): when a counted allocation
//! fails with `CUDA_ERROR_OUT_OF_MEMORY`, the report is written on the
//! failing thread, before the error returns to the program (and so before
//! the framework above sees it).
//!
//! Inside the failing allocation the hook:
//! - makes no CUDA call (NVML only, and the interposer's counters);
//! - never waits on the tracker for long: it measures the open phases if it
//!   can take the tracker's lock within [`TRACKER_WAIT`]; when the tracker is
//!   busy (the allocation failed inside a call on that tracker, e.g. one of
//!   its callbacks, or another thread held it throughout), the report is
//!   written without the open phases and says why — the ended phases, the
//!   GPUs and the failed allocation are still in it;
//! - never unwinds into the interposer, and leaves the driver's error as
//!   it is (the interposer returns it unchanged).
//!
//! The interposer holds one hook for the whole process; it is registered
//! while at least one tracker subscribes, and removed with the last.

use crate::exact::unavailable;
use crate::oom_report_gpu::GpuOomForensics;
use memprobe_core::internal::lock::Lock;
use memprobe_core::oom_report::{
    FailedAllocation, OomLocation, OomReportOptions, OomReporter, OomTrigger, OpenPhase,
};
use memprobe_core::{Error, Result, Tracker};
use memprobe_interpose_reader::layout::{HOST_PINNED, MAX_DEVICES};
use memprobe_interpose_reader::oom_report_hook::{self, OomEvent};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long the driver's hook tries for the tracker's lock before writing
/// the report without the open phases.
pub const TRACKER_WAIT: Duration = Duration::from_millis(100);

/// One failure, as the interposer reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverOom {
    /// Where it was asked for.
    pub location: OomLocation,
    /// The bytes asked for (`None` when the interposer could not size it).
    pub requested_bytes: Option<u64>,
    /// The driver entry point that failed.
    pub api: String,
    /// Out-of-memory failures of the process so far (this one included).
    pub failures: u64,
    /// When it failed, `CLOCK_MONOTONIC` nanoseconds.
    pub at_ns: u64,
}

impl DriverOom {
    fn from_event(e: &OomEvent) -> DriverOom {
        let location = match usize::try_from(e.counter) {
            Ok(d) if d < MAX_DEVICES => OomLocation::Device(d as u32),
            Ok(HOST_PINNED) => OomLocation::HostPinned,
            _ => OomLocation::Unknown,
        };
        DriverOom {
            location,
            requested_bytes: Some(e.requested).filter(|&b| b > 0),
            api: e.api().to_owned(),
            failures: e.failures,
            at_ns: e.at_ns,
        }
    }
}

type Subscriber = Arc<dyn Fn(&DriverOom) + Send + Sync>;

/// The subscribers; held only to change or copy the list, never while one
/// of them runs.
static SUBSCRIBERS: Lock<Vec<(u64, Subscriber)>> = Lock::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A subscription to the driver's out-of-memory failures; dropping it ends it.
#[derive(Debug)]
pub struct DriverOomSubscription {
    id: u64,
}

impl Drop for DriverOomSubscription {
    fn drop(&mut self) {
        if let Ok(mut list) = SUBSCRIBERS.lock() {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                // Nothing listens: the interposer stops calling into this
                // library (which may then be unloaded).
                // SAFETY: removing the hook.
                let _ = unsafe { oom_report_hook::set_oom_hook(None, std::ptr::null_mut()) };
            }
        }
    }
}

/// Whether the interposer is loaded and counting here: the driver trigger
/// needs it.
///
/// # Errors
/// [`ErrorKind::Unavailable`](memprobe_core::ErrorKind::Unavailable),
/// saying how to load it.
pub fn driver_oom_available() -> Result<()> {
    memprobe_interpose_reader::Region::in_process()
        .map(|_| ())
        .map_err(|e| unavailable(&e))
}

/// Calls `f` with each out-of-memory failure the driver reports through the
/// interposer, on the failing thread, until the subscription is dropped.
/// `f` must make no CUDA call and must not wait for other threads.
///
/// # Errors
/// [`ErrorKind::Unavailable`](memprobe_core::ErrorKind::Unavailable)
/// without the interposer, or with its counting switched off.
pub fn subscribe_driver_oom(
    f: impl Fn(&DriverOom) + Send + Sync + 'static,
) -> Result<DriverOomSubscription> {
    driver_oom_available()?;
    let mut list = SUBSCRIBERS.lock()?;
    if list.is_empty() {
        // SAFETY: `dispatch` is a plain function of this library, callable
        // from any thread; it ignores the user data.
        unsafe { oom_report_hook::set_oom_hook(Some(dispatch), std::ptr::null_mut()) }
            .map_err(|e| unavailable(&e))?;
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    list.push((id, Arc::new(f)));
    Ok(DriverOomSubscription { id })
}

/// The hook the interposer calls.
unsafe extern "C" fn dispatch(event: *const OomEvent, _user_data: *mut c_void) {
    // Nothing may unwind into the interposer (and through the program's
    // allocation): a panic ends this report, not the program.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the interposer passes a valid event for the call.
        let Some(e) = (unsafe { event.as_ref() }) else {
            return;
        };
        if (e.size as usize) < std::mem::size_of::<OomEvent>() {
            return;
        }
        let oom = DriverOom::from_event(e);
        let list: Vec<Subscriber> = match SUBSCRIBERS.lock() {
            Ok(l) => l.iter().map(|(_, f)| f.clone()).collect(),
            Err(_) => return,
        };
        for f in list {
            f(&oom);
        }
    }));
}

/// The open phases of `tracker`, if its lock can be had within `wait`.
fn open_phases_within(
    tracker: &Lock<Tracker>,
    wait: Duration,
) -> std::result::Result<Vec<OpenPhase>, String> {
    let start = Instant::now();
    loop {
        match tracker.try_lock() {
            Ok(Some(t)) => return Ok(t.open_phases_now()),
            Err(_) => {
                return Err(
                    "not measured: the allocation failed inside a call on this tracker \
                            (one of its callbacks), which holds it"
                        .to_owned(),
                )
            }
            Ok(None) if start.elapsed() >= wait => {
                return Err(format!(
                    "not measured: another thread held the tracker for {} ms",
                    wait.as_millis()
                ))
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// What the driver's hook does for one tracker: the report, with the open
/// phases when the tracker can be had.
fn tracker_hook(
    tracker: Weak<Lock<Tracker>>,
    reporter: OomReporter,
    wait: Duration,
) -> impl Fn(&DriverOom) + Send + Sync {
    move |oom: &DriverOom| {
        if !reporter.accepts(OomTrigger::Driver) {
            return;
        }
        let open = if reporter.armed() {
            // A tracker already dropped reports nothing: its reporter closes.
            let Some(t) = tracker.upgrade() else {
                return;
            };
            open_phases_within(&t, wait)
        } else {
            Err("not measured: a report was already written".to_owned())
        };
        let mut failed = FailedAllocation::new(
            OomTrigger::Driver,
            oom.location,
            oom.requested_bytes,
            &oom.api,
        );
        if oom.at_ns != 0 {
            failed.at_ns = oom.at_ns;
        }
        failed.driver_oom_failures = Some(oom.failures);
        // Nowhere to return an error inside the failing allocation: the
        // reporter keeps it (its status's last error).
        let _ = reporter.trigger(failed, open);
    }
}

/// Configures `tracker`'s out-of-memory report: with this crate's GPU part
/// ([`GpuOomForensics`] over the process-wide GPUs) unless `options.gpu` is
/// given, and, when `options.triggers.driver`, subscribed to the driver's
/// failures through the interposer.
///
/// # Errors
/// [`ErrorKind::Unavailable`](memprobe_core::ErrorKind::Unavailable) for the
/// driver trigger without the interposer (nothing is configured then); the
/// tracker's errors ([`Tracker::set_oom_report`]).
pub fn configure_oom_report(
    tracker: &Arc<Lock<Tracker>>,
    mut options: OomReportOptions,
) -> Result<OomReporter> {
    if tracker.lock()?.oom_reporter().is_some() {
        return Err(Error::wrong_order(
            "an out-of-memory report is already configured for this tracker; remove it first \
             (or re-arm it)",
        ));
    }
    let driver = options.triggers.driver;
    if driver {
        driver_oom_available()?;
    }
    if options.gpu.is_none() {
        options.gpu = Some(Arc::new(GpuOomForensics::new()));
    }
    let reporter = tracker
        .lock()?
        .set_oom_report(Some(options))?
        .ok_or_else(|| Error::new(memprobe_core::ErrorKind::Internal, "no reporter"))?;
    if driver {
        let hook = tracker_hook(Arc::downgrade(tracker), reporter.clone(), TRACKER_WAIT);
        let attached = subscribe_driver_oom(hook).and_then(|sub| reporter.attach(Box::new(sub)));
        if let Err(e) = attached {
            tracker.lock()?.set_oom_report(None)?;
            return Err(e);
        }
    }
    Ok(reporter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprobe_core::oom_report::OomTriggers;
    use memprobe_core::{PhaseKind, Source};
    use std::sync::Mutex;

    fn event() -> DriverOom {
        DriverOom {
            location: OomLocation::Device(0),
            requested_bytes: Some(1 << 40),
            api: "cuMemAlloc_v2".into(),
            failures: 1,
            at_ns: 42,
        }
    }

    type Docs = Arc<Mutex<Vec<String>>>;

    fn configured() -> (Arc<Lock<Tracker>>, OomReporter, Docs) {
        let t = Tracker::new(&[Source::pushed("x").unwrap()]).unwrap();
        let t = Arc::new(Lock::new(t));
        let docs: Docs = Arc::default();
        let d = docs.clone();
        let r = t
            .lock()
            .unwrap()
            .set_oom_report(Some(OomReportOptions {
                triggers: OomTriggers {
                    driver: true,
                    caller: false,
                },
                callback: Some(Box::new(move |_, j, _| d.lock().unwrap().push(j.into()))),
                ..OomReportOptions::default()
            }))
            .unwrap()
            .unwrap();
        t.lock().unwrap().begin(PhaseKind::Epoch, None).unwrap();
        (t, r, docs)
    }

    #[test]
    fn without_the_interposer_the_driver_trigger_is_unavailable() {
        let t = Arc::new(Lock::new(
            Tracker::new(&[Source::pushed("x").unwrap()]).unwrap(),
        ));
        let e = configure_oom_report(
            &t,
            OomReportOptions {
                triggers: OomTriggers {
                    driver: true,
                    caller: true,
                },
                callback: Some(Box::new(|_, _, _| {})),
                ..OomReportOptions::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.kind(), memprobe_core::ErrorKind::Unavailable);
        assert!(e.message().contains("LD_PRELOAD"), "{e}");
        assert!(t.lock().unwrap().oom_reporter().is_none(), "nothing set");
        assert!(subscribe_driver_oom(|_| {}).is_err());
    }

    #[test]
    fn the_hook_measures_the_open_phases_when_the_tracker_is_free() {
        let (t, r, docs) = configured();
        let hook = tracker_hook(Arc::downgrade(&t), r.clone(), TRACKER_WAIT);
        hook(&event());
        hook(&event());
        let docs = docs.lock().unwrap();
        assert_eq!(docs.len(), 1, "one report");
        assert!(docs[0].contains("\"open_phases\":{\"available\":true"));
        assert!(docs[0].contains("\"reported_by\":\"cuMemAlloc_v2\""));
        assert!(docs[0].contains("\"at_monotonic_ns\":42"));
        assert!(docs[0].contains("\"driver_oom_failures\":1"));
        assert_eq!(r.status().unwrap().later_triggers, 1);
    }

    #[test]
    fn a_busy_tracker_gives_a_report_without_its_open_phases() {
        // Held by this thread: the failure happened inside a tracker call.
        let (t, r, docs) = configured();
        let hook = tracker_hook(Arc::downgrade(&t), r.clone(), TRACKER_WAIT);
        {
            let _held = t.lock().unwrap();
            hook(&event());
        }
        assert!(docs.lock().unwrap()[0].contains("inside a call on this tracker"));

        // Held by another thread throughout the wait.
        let (t, r, docs) = configured();
        let hook = tracker_hook(Arc::downgrade(&t), r, Duration::from_millis(20));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t2 = t.clone();
        let holder = std::thread::spawn(move || {
            let _g = t2.lock().unwrap();
            held_tx.send(()).unwrap();
            let _ = done_rx.recv();
        });
        held_rx.recv().unwrap();
        hook(&event());
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        let doc = docs.lock().unwrap()[0].clone();
        assert!(
            doc.contains("another thread held the tracker for 20 ms"),
            "{doc}"
        );
        assert!(doc.contains("\"available\":false"));
    }

    #[test]
    fn a_dropped_tracker_reports_nothing() {
        let (t, r, docs) = configured();
        let hook = tracker_hook(Arc::downgrade(&t), r.clone(), TRACKER_WAIT);
        drop(t);
        hook(&event());
        assert!(docs.lock().unwrap().is_empty());
        assert!(r.is_closed());
        assert_eq!(
            r.trigger(
                FailedAllocation::new(OomTrigger::Driver, OomLocation::Unknown, None, "x"),
                Ok(vec![])
            )
            .map_err(|e| e.kind()),
            Err(memprobe_core::ErrorKind::WrongOrder)
        );
    }

    #[test]
    fn events_map_their_counter() {
        let name = c"cuMemHostAlloc";
        let e = OomEvent {
            size: std::mem::size_of::<OomEvent>() as u32,
            counter: 64,
            requested: 0,
            api: name.as_ptr(),
            result: 2,
            reserved: 0,
            failures: 3,
            at_ns: 9,
        };
        let d = DriverOom::from_event(&e);
        assert_eq!(d.location, OomLocation::HostPinned);
        assert_eq!(d.requested_bytes, None);
        assert_eq!(d.api, "cuMemHostAlloc");
        let d = DriverOom::from_event(&OomEvent { counter: -1, ..e });
        assert_eq!(d.location, OomLocation::Unknown);
        let d = DriverOom::from_event(&OomEvent { counter: 3, ..e });
        assert_eq!(d.location, OomLocation::Device(3));
    }
}
