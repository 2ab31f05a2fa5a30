//! A boundary that fails part-way (one source's read or reset fails after
//! others were already restarted) changes nothing: every source keeps its
//! peak, in the window whose boundary failed and in every other one, for
//! windows, traces, trackers and mark groups.

use memprobe_core::ReleasePolicy;
use memprobe_core::{
    Error, ErrorKind, MarkGroup, Marks, PhaseKind, Result, Source, SourceKind, Trace, TraceOptions,
    Tracker, Window,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A pushed source and a callback source whose read fails while `fail` is set.
fn pushed_and_failing() -> (Source, Source, Arc<AtomicBool>) {
    let fail = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&fail);
    let pushed = Source::pushed("alloc").unwrap();
    let flaky = Source::callback(
        "flaky",
        Box::new(move || {
            if f.load(Ordering::SeqCst) {
                Err(Error::unavailable("the device went away"))
            } else {
                Ok(5)
            }
        }),
    )
    .unwrap();
    (pushed, flaky, fail)
}

#[test]
fn a_window_reset_that_fails_keeps_every_peak() {
    let (pushed, flaky, fail) = pushed_and_failing();
    let other = Window::open(std::slice::from_ref(&pushed)).unwrap();
    let mut w = Window::open(&[pushed.clone(), flaky.clone()]).unwrap();
    let started = w.started_at_ns();
    pushed.push(600).unwrap();
    pushed.push(100).unwrap();

    fail.store(true, Ordering::SeqCst);
    let e = w.reset().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // The pushed source came first and was restarted: its peak must stay.
    assert_eq!(w.peak_of(0).unwrap(), 600);
    assert_eq!(other.peaks().unwrap(), vec![600]);
    assert_eq!(w.started_at_ns(), started);
    assert_eq!(w.starts()[0].used, 0);

    pushed.push(300).unwrap();
    fail.store(false, Ordering::SeqCst);
    let ended = w.reset().unwrap();
    assert_eq!(ended[0].peak, 600);
    assert_eq!(ended[0].used_start, 0);
    assert_eq!(ended[0].used_end, 300);
    // The next interval starts from the reset that succeeded.
    assert_eq!(w.peak_of(0).unwrap(), 300);
    assert_eq!(other.peaks().unwrap(), vec![600]);
}

#[test]
fn a_failed_reset_then_a_later_rise_counts_in_both_intervals_it_belongs_to() {
    let (pushed, flaky, fail) = pushed_and_failing();
    let mut w = Window::open(&[pushed.clone(), flaky]).unwrap();
    pushed.push(50).unwrap();
    fail.store(true, Ordering::SeqCst);
    w.reset().unwrap_err();
    // After the failed boundary: still one interval, from the open.
    pushed.push(900).unwrap();
    pushed.push(10).unwrap();
    fail.store(false, Ordering::SeqCst);
    assert_eq!(w.reset().unwrap()[0].peak, 900);
    assert_eq!(w.peak_of(0).unwrap(), 10);
}

#[test]
fn a_trace_reset_that_fails_keeps_its_delta_peaked() {
    let (pushed, flaky, fail) = pushed_and_failing();
    let options = TraceOptions {
        silent: true,
        ..TraceOptions::default()
    };
    let mut trace = Trace::new(&[pushed.clone(), flaky], options).unwrap();
    pushed.push(256 << 20).unwrap();
    pushed.push(0).unwrap();
    fail.store(true, Ordering::SeqCst);
    assert_eq!(trace.reset().unwrap_err().kind(), ErrorKind::Unavailable);
    assert_eq!(
        trace.report_n_reset(None).unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    fail.store(false, Ordering::SeqCst);
    let d = &trace.data().unwrap()[0];
    assert_eq!(d.delta_peaked, 256 << 20, "{d:?}");
    assert_eq!(d.peak, 256 << 20);
}

fn tracker_next_that_fails_keeps_the_steps_record(release_every_step: bool) {
    let (pushed, flaky, fail) = pushed_and_failing();
    let mut t = Tracker::new(&[pushed.clone(), flaky]).unwrap();
    if release_every_step {
        t.add_release(
            "cache",
            memprobe_core::ReleaseKind::Cache,
            Box::new(|| Ok(())),
        )
        .unwrap();
        t.add_release_policy(ReleasePolicy::Every {
            kind: PhaseKind::Step,
            n: 1,
            gc: false,
        })
        .unwrap();
    }
    t.begin(PhaseKind::Epoch, None).unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    pushed.push(1100 << 20).unwrap();
    pushed.push(100 << 20).unwrap();

    fail.store(true, Ordering::SeqCst);
    assert_eq!(
        t.next(PhaseKind::Step, None).unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    // Nothing ended: the step is still open, no record was made.
    assert_eq!(
        t.open_phases(),
        vec![
            (PhaseKind::Epoch, "epoch".to_owned()),
            (PhaseKind::Step, "step".to_owned())
        ]
    );
    assert!(t.last_record(PhaseKind::Step).is_none());
    assert_eq!(
        t.end(PhaseKind::Step, None).unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    assert_eq!(t.open_phases().len(), 2);

    fail.store(false, Ordering::SeqCst);
    let step = t.next(PhaseKind::Step, None).unwrap();
    assert_eq!(step.phase.as_ref().unwrap().index, 0);
    assert_eq!(step.sources[0].peak, 1100 << 20, "{:?}", step.sources[0]);
    assert_eq!(step.sources[0].used_start, 0);
    assert_eq!(step.releases.len(), usize::from(release_every_step));
    pushed.push(200 << 20).unwrap();
    let step = t.end(PhaseKind::Step, None).unwrap();
    assert_eq!(step.phase.as_ref().unwrap().index, 1);
    assert_eq!(step.sources[0].peak, 200 << 20);
    let epoch = t.end(PhaseKind::Epoch, None).unwrap();
    assert_eq!(epoch.sources[0].peak, 1100 << 20);
}

#[test]
fn a_tracker_next_that_fails_keeps_the_steps_record() {
    tracker_next_that_fails_keeps_the_steps_record(false);
}

#[test]
fn a_tracker_next_that_fails_before_a_release_keeps_the_steps_record() {
    tracker_next_that_fails_keeps_the_steps_record(true);
}

/// Which of a group's functions fails.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fail {
    None,
    Peak,
    Reset,
    Current,
}

#[derive(Default)]
struct Alloc {
    now: [u64; 2],
    peak: [u64; 2],
}

struct Fw {
    alloc: Arc<Mutex<Alloc>>,
    fail: Arc<Mutex<Fail>>,
}

impl Fw {
    fn check(&self, f: Fail) -> Result<()> {
        if *self.fail.lock().unwrap() == f {
            return Err(Error::new(ErrorKind::Io, format!("{f:?} failed")));
        }
        Ok(())
    }
}

impl Marks for Fw {
    fn current(&mut self, i: usize) -> Result<u64> {
        self.check(Fail::Current)?;
        Ok(self.alloc.lock().unwrap().now[i])
    }
    fn peak(&mut self, i: usize) -> Result<u64> {
        self.check(Fail::Peak)?;
        Ok(self.alloc.lock().unwrap().peak[i])
    }
    fn reset(&mut self) -> Result<()> {
        self.check(Fail::Reset)?;
        let mut a = self.alloc.lock().unwrap();
        a.peak = a.now;
        Ok(())
    }
}

struct Group {
    alloc: Arc<Mutex<Alloc>>,
    fail: Arc<Mutex<Fail>>,
    sources: [Source; 2],
}

impl Group {
    fn new(tag: &str) -> Group {
        let alloc = Arc::new(Mutex::new(Alloc::default()));
        let fail = Arc::new(Mutex::new(Fail::None));
        let g = MarkGroup::new(Box::new(Fw {
            alloc: Arc::clone(&alloc),
            fail: Arc::clone(&fail),
        }));
        let s = |i: usize| {
            Source::over_mark(&g, i, &format!("{tag}{i}"), SourceKind::GpuProcess).unwrap()
        };
        let sources = [s(0), s(1)];
        Group {
            alloc,
            fail,
            sources,
        }
    }

    fn set(&self, i: usize, bytes: u64) {
        let mut a = self.alloc.lock().unwrap();
        a.now[i] = bytes;
        a.peak[i] = a.peak[i].max(bytes);
    }

    fn fail(&self, f: Fail) {
        *self.fail.lock().unwrap() = f;
    }
}

#[test]
fn a_window_over_two_mark_groups_keeps_both_groups_peaks_when_one_fails() {
    for fail in [Fail::Peak, Fail::Reset, Fail::Current] {
        let (a, b) = (Group::new("a"), Group::new("b"));
        let all: Vec<Source> = a.sources.iter().chain(&b.sources).cloned().collect();
        let mut w = Window::open(&all).unwrap();
        let lone = Window::open(std::slice::from_ref(&a.sources[1])).unwrap();
        a.set(0, 600);
        a.set(0, 100);
        a.set(1, 700);
        a.set(1, 200);
        b.set(0, 800);
        b.set(0, 0);
        b.set(1, 900);
        b.set(1, 50);

        b.fail(fail);
        let e = w.reset().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{fail:?}: {e}");
        b.fail(Fail::None);
        assert_eq!(w.peaks().unwrap(), vec![600, 700, 800, 900], "{fail:?}");
        assert_eq!(lone.peaks().unwrap(), vec![700], "{fail:?}");
        assert!(w.starts().iter().all(|s| s.used == 0), "{fail:?}");

        let ended = w.reset().unwrap();
        let peaks: Vec<u64> = ended.iter().map(|d| d.peak).collect();
        assert_eq!(peaks, vec![600, 700, 800, 900], "{fail:?}");
        assert_eq!(w.peaks().unwrap(), vec![100, 200, 0, 50], "{fail:?}");
        assert_eq!(lone.peaks().unwrap(), vec![700], "{fail:?}");
    }
}

#[test]
fn a_window_open_that_fails_leaves_the_other_windows_peaks() {
    let (a, b) = (Group::new("a"), Group::new("b"));
    let outer = Window::open(&a.sources).unwrap();
    a.set(0, 600);
    a.set(0, 100);
    b.fail(Fail::Reset);
    let all: Vec<Source> = a.sources.iter().chain(&b.sources).cloned().collect();
    assert_eq!(Window::open(&all).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(outer.peaks().unwrap(), vec![600, 0]);
    assert_eq!(a.sources[0].open_windows().unwrap(), 1);
}

#[test]
fn a_tracker_next_whose_reset_fails_before_a_release_ends_nothing() {
    // The marks read fine and only the reset fails: measuring the step
    // would succeed, so ending it before the failing restart would make a
    // record (and a release) for a step that is then neither open nor done.
    let g = Group::new("m");
    let mut t = Tracker::new(&g.sources).unwrap();
    let releases = Arc::new(Mutex::new(0));
    let r = Arc::clone(&releases);
    t.add_release(
        "cache",
        memprobe_core::ReleaseKind::Cache,
        Box::new(move || {
            *r.lock().unwrap() += 1;
            Ok(())
        }),
    )
    .unwrap();
    t.add_release_policy(ReleasePolicy::Every {
        kind: PhaseKind::Step,
        n: 1,
        gc: false,
    })
    .unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    g.set(0, 1100);
    g.set(0, 100);
    g.fail(Fail::Reset);
    assert_eq!(
        t.next(PhaseKind::Step, None).unwrap_err().kind(),
        ErrorKind::Io
    );
    assert_eq!(t.open_phases(), vec![(PhaseKind::Step, "step".to_owned())]);
    assert!(t.last_record(PhaseKind::Step).is_none());
    assert_eq!(*releases.lock().unwrap(), 0);

    g.fail(Fail::None);
    let step = t.next(PhaseKind::Step, None).unwrap();
    assert_eq!(step.phase.as_ref().unwrap().index, 0);
    assert_eq!(step.sources[0].peak, 1100);
    assert_eq!(step.releases.len(), 1);
    assert_eq!(*releases.lock().unwrap(), 1);
    // The next step began after the release, from what is held now.
    g.set(0, 300);
    let step = t.end(PhaseKind::Step, None).unwrap();
    assert_eq!(step.phase.as_ref().unwrap().index, 1);
    assert_eq!(step.sources[0].peak, 300);
    assert_eq!(step.sources[0].used_start, 100);
}
