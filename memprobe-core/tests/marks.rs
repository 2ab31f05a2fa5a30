//! Exact sources over a caller's marks, against a scripted stand-in for a
//! framework's allocator (PyTorch's caching allocator: current and peak bytes
//! per mark, one reset for all): exact peaks between boundaries, independent
//! windows, shared resets that lose nothing, failing and buggy callbacks,
//! callbacks never run concurrently, and trackers and traces over them.

use memprobe_core::{
    Error, ErrorKind, MarkGroup, MarkValue, Marks, PeakFidelity, PhaseKind, Result, Source,
    SourceKind, Trace, TraceOptions, Tracker, Window,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Which callback fails next (until cleared).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fail {
    None,
    Current(usize),
    Peak(usize),
    Reset,
}

#[derive(Default)]
struct State {
    now: Vec<u64>,
    peak: Vec<u64>,
    resets: u64,
    /// A buggy framework: its peaks read 0.
    peak_reads_zero: bool,
    /// Another thread's temporary allocation right after the next reset:
    /// (mark, bytes).
    blip_after_reset: Option<(usize, u64)>,
}

/// The framework: allocations are scripted by the test; memprobe reads it
/// through [`Script`].
#[derive(Clone)]
struct Framework {
    state: Arc<Mutex<State>>,
    fail: Arc<Mutex<Fail>>,
    /// Set while a callback runs: two at once would be a memprobe bug.
    inside: Arc<AtomicBool>,
    overlaps: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
    /// Reads every mark of one kind in one call ([`Marks::read_many`]), as
    /// PyTorch's statistics dictionary does.
    batched: bool,
}

impl Framework {
    fn new(marks: usize) -> Framework {
        Framework {
            state: Arc::new(Mutex::new(State {
                now: vec![0; marks],
                peak: vec![0; marks],
                ..State::default()
            })),
            fail: Arc::new(Mutex::new(Fail::None)),
            inside: Arc::new(AtomicBool::new(false)),
            overlaps: Arc::new(AtomicU64::new(0)),
            calls: Arc::new(AtomicU64::new(0)),
            batched: false,
        }
    }

    fn batched(marks: usize) -> Framework {
        Framework {
            batched: true,
            ..Framework::new(marks)
        }
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn alloc(&self, i: usize, bytes: u64) {
        let mut s = self.state.lock().unwrap();
        s.now[i] += bytes;
        s.peak[i] = s.peak[i].max(s.now[i]);
    }

    fn free(&self, i: usize, bytes: u64) {
        self.state.lock().unwrap().now[i] -= bytes;
    }

    /// A temporary allocation: up by `bytes` and down again.
    fn blip(&self, i: usize, bytes: u64) {
        self.alloc(i, bytes);
        self.free(i, bytes);
    }

    fn resets(&self) -> u64 {
        self.state.lock().unwrap().resets
    }

    fn fail(&self, f: Fail) {
        *self.fail.lock().unwrap() = f;
    }

    fn group(&self) -> MarkGroup {
        MarkGroup::new(Box::new(Script(self.clone())))
    }

    /// Runs one callback, counting overlaps with any other.
    fn call<T>(&self, f: impl FnOnce(&mut State, Fail) -> Result<T>) -> Result<T> {
        if self.inside.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::yield_now();
        let fail = *self.fail.lock().unwrap();
        let r = f(&mut self.state.lock().unwrap(), fail);
        self.inside.store(false, Ordering::SeqCst);
        r
    }
}

fn failed(what: &str) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{what} failed (scripted)"))
}

struct Script(Framework);

impl Marks for Script {
    fn current(&mut self, i: usize) -> Result<u64> {
        self.0.call(|s, fail| {
            if fail == Fail::Current(i) {
                return Err(failed("current"));
            }
            Ok(s.now[i])
        })
    }

    fn peak(&mut self, i: usize) -> Result<u64> {
        self.0.call(|s, fail| {
            if fail == Fail::Peak(i) {
                return Err(failed("peak"));
            }
            Ok(if s.peak_reads_zero { 0 } else { s.peak[i] })
        })
    }

    fn read_many(
        &mut self,
        what: MarkValue,
        indices: &[usize],
        out: &mut [u64],
    ) -> Option<Result<()>> {
        if !self.0.batched {
            return None;
        }
        Some(self.0.call(|s, fail| {
            for (o, &i) in out.iter_mut().zip(indices) {
                *o = match what {
                    MarkValue::Current if fail == Fail::Current(i) => {
                        return Err(failed("current"))
                    }
                    MarkValue::Peak if fail == Fail::Peak(i) => return Err(failed("peak")),
                    MarkValue::Current => s.now[i],
                    MarkValue::Peak if s.peak_reads_zero => 0,
                    MarkValue::Peak => s.peak[i],
                };
            }
            Ok(())
        }))
    }

    fn reset(&mut self) -> Result<()> {
        self.0.call(|s, fail| {
            if fail == Fail::Reset {
                return Err(failed("reset"));
            }
            s.peak = s.now.clone();
            s.resets += 1;
            if let Some((i, bytes)) = s.blip_after_reset.take() {
                s.peak[i] = s.peak[i].max(s.now[i] + bytes);
            }
            Ok(())
        })
    }
}

fn one(src: &Source) -> Window {
    Window::open(std::slice::from_ref(src)).unwrap()
}

#[test]
fn a_temporary_allocation_between_boundaries_is_the_peak_exactly() {
    let fw = Framework::new(1);
    fw.alloc(0, 3 * GIB);
    let src = Source::mark(
        "torch_alloc:0",
        SourceKind::GpuProcess,
        Box::new(Script(fw.clone())),
    )
    .unwrap();
    assert_eq!(src.info().fidelity, PeakFidelity::Exact);
    assert_eq!(src.info().kind, SourceKind::GpuProcess);
    assert_eq!(src.read().unwrap().used, 3 * GIB);

    let mut w = one(&src);
    assert_eq!(w.starts()[0].used, 3 * GIB);
    fw.alloc(0, 100 * MIB);
    fw.blip(0, 2 * GIB);
    fw.alloc(0, 50 * MIB);
    assert_eq!(w.peaks().unwrap(), vec![5 * GIB + 100 * MIB]);

    // The boundary ends the interval with its exact peak; the next starts
    // at the current value and does not see the blip.
    let ended = w.reset().unwrap();
    let d = &ended[0];
    assert_eq!(d.fidelity, PeakFidelity::Exact);
    assert_eq!(
        (d.used_start, d.used_end, d.peak),
        (3 * GIB, 3 * GIB + 150 * MIB, 5 * GIB + 100 * MIB)
    );
    assert_eq!(d.delta_used, 150 * MIB as i64);
    assert_eq!(d.delta_peaked, 2 * GIB - 50 * MIB);
    assert_eq!(w.peaks().unwrap(), vec![3 * GIB + 150 * MIB]);

    fw.blip(0, GIB);
    fw.free(0, 150 * MIB);
    let closed = w.close().unwrap();
    assert_eq!(
        (closed[0].used_start, closed[0].used_end, closed[0].peak),
        (3 * GIB + 150 * MIB, 3 * GIB, 4 * GIB + 150 * MIB)
    );
    assert_eq!(src.open_windows().unwrap(), 0);
}

#[test]
fn nested_and_sibling_windows_stay_independent() {
    let fw = Framework::new(1);
    let src = Source::mark("alloc", SourceKind::Custom, Box::new(Script(fw.clone()))).unwrap();
    let outer = one(&src);
    let mut middle = one(&src);
    let inner = one(&src);
    fw.blip(0, 700);
    assert_eq!(inner.peaks().unwrap(), vec![700]);
    drop(inner);

    // A sibling opened after the spike does not see it; the outer ones do.
    let sibling = one(&src);
    assert_eq!(sibling.peaks().unwrap(), vec![0]);
    fw.blip(0, 300);
    assert_eq!(sibling.peaks().unwrap(), vec![300]);

    // Resetting the middle window leaves the outer and the sibling intact.
    assert_eq!(middle.reset().unwrap()[0].peak, 700);
    fw.blip(0, 200);
    assert_eq!(middle.peaks().unwrap(), vec![200]);
    assert_eq!(sibling.peaks().unwrap(), vec![300]);
    assert_eq!(outer.peaks().unwrap(), vec![700]);

    // Sixty-four nested windows: a blip in the innermost is in all of them,
    // and one opened later sees none of it.
    let nested: Vec<Window> = (0..64).map(|_| one(&src)).collect();
    fw.blip(0, 900);
    let later = one(&src);
    for w in &nested {
        assert_eq!(w.peaks().unwrap(), vec![900]);
    }
    assert_eq!(later.peaks().unwrap(), vec![0]);
    assert_eq!(outer.peaks().unwrap(), vec![900]);
}

#[test]
fn a_shared_reset_through_one_source_never_loses_the_others_peaks() {
    a_shared_reset_through_one_source_never_loses_the_others_peaks_with(Framework::new(6));
    a_shared_reset_through_one_source_never_loses_the_others_peaks_with(Framework::batched(6));
}

fn a_shared_reset_through_one_source_never_loses_the_others_peaks_with(fw: Framework) {
    // PyTorch's layout on two devices: allocated, reserved, active per device.
    let group = fw.group();
    let names = [
        "alloc:0",
        "reserved:0",
        "active:0",
        "alloc:1",
        "reserved:1",
        "active:1",
    ];
    let sources: Vec<Source> = names
        .iter()
        .enumerate()
        .map(|(i, n)| Source::over_mark(&group, i, n, SourceKind::GpuProcess).unwrap())
        .collect();
    assert_eq!(group.len().unwrap(), 6);
    for i in 0..6 {
        fw.alloc(i, 1000 * (i as u64 + 1));
    }
    // One epoch window over all six; one window per source besides.
    let epoch = Window::open(&sources).unwrap();
    let mut each: Vec<Window> = sources.iter().map(one).collect();
    let base: Vec<u64> = (0..6).map(|i| 1000 * (i as u64 + 1)).collect();

    // Every mark blips by a different amount; then every per-source window
    // is reset in turn, each reset clearing all six marks in the framework.
    for i in 0..6 {
        fw.blip(i, 10 * (i as u64 + 1));
    }
    let resets = fw.resets();
    for (i, w) in each.iter_mut().enumerate() {
        let d = w.reset().unwrap();
        assert_eq!(d[0].peak, base[i] + 10 * (i as u64 + 1), "source {i}");
    }
    assert_eq!(fw.resets(), resets + 6, "each boundary reset the framework");
    let peaks: Vec<u64> = (0..6).map(|i| base[i] + 10 * (i as u64 + 1)).collect();
    assert_eq!(epoch.peaks().unwrap(), peaks);

    // A blip on reserved:1 and a boundary on alloc:0 only: the boundary's
    // reset clears reserved:1's mark in the framework, yet reserved:1's
    // windows keep it.
    fw.blip(4, 5000);
    let step = one(&sources[0]);
    assert_eq!(
        fw.state.lock().unwrap().peak[4],
        base[4],
        "the mark was reset"
    );
    assert_eq!(each[4].peaks().unwrap(), vec![base[4] + 5000]);
    assert_eq!(epoch.peaks().unwrap()[4], base[4] + 5000);
    assert_eq!(each[4].reset().unwrap()[0].peak, base[4] + 5000);
    // Carried only until its own boundary: the next interval starts clean.
    assert_eq!(each[4].peaks().unwrap(), vec![base[4]]);
    assert_eq!(step.peaks().unwrap(), vec![base[0]]);
    drop(step);

    // Dropping sources frees their indices; the rest keep working.
    drop(each);
    drop(epoch);
    let kept = sources[2].clone();
    drop(sources);
    assert_eq!(group.len().unwrap(), 1);
    let w = one(&kept);
    fw.blip(2, 77);
    assert_eq!(w.peaks().unwrap(), vec![base[2] + 77]);
}

#[test]
fn a_window_over_several_members_resets_the_group_once_per_boundary() {
    several_members_one_reset(Framework::new(2), 5);
}

#[test]
fn marks_read_at_once_give_the_same_peaks_in_three_calls_per_boundary() {
    several_members_one_reset(Framework::batched(2), 3);
}

/// A step window over one device's allocated and reserved marks (PyTorch:
/// one reset_peak_memory_stats for both), an epoch window over the same,
/// and a window over reserved alone; each step boundary makes
/// `calls_per_step` callbacks.
fn several_members_one_reset(fw: Framework, calls_per_step: u64) {
    let group = fw.group();
    let alloc = Source::over_mark(&group, 0, "alloc:0", SourceKind::GpuProcess).unwrap();
    let reserved = Source::over_mark(&group, 1, "reserved:0", SourceKind::GpuProcess).unwrap();
    let both = [alloc.clone(), reserved.clone()];
    fw.alloc(0, 100 * MIB);
    fw.alloc(1, 200 * MIB);
    let epoch = Window::open(&both).unwrap();
    let mut lone = one(&reserved);
    let before = fw.resets();
    let mut step = Window::open(&both).unwrap();
    assert_eq!(
        fw.resets(),
        before + 1,
        "one reset opens a window over both"
    );

    let mut epoch_peak = [100 * MIB, 200 * MIB];
    for round in 1..=50u64 {
        // Blips on both marks; an allocation that stays on reserved.
        fw.blip(0, round * MIB);
        fw.blip(1, 3 * round * MIB);
        fw.alloc(1, MIB);
        let (resets, calls) = (fw.resets(), fw.calls());
        let d = step.reset().unwrap();
        assert_eq!(
            fw.resets(),
            resets + 1,
            "round {round}: one reset per boundary"
        );
        assert_eq!(
            fw.calls(),
            calls + calls_per_step,
            "round {round}: callbacks"
        );
        let now1 = 200 * MIB + round * MIB;
        assert_eq!(d[0].peak, 100 * MIB + round * MIB, "round {round}: alloc");
        assert_eq!(
            d[1].peak,
            now1 - MIB + 3 * round * MIB,
            "round {round}: reserved"
        );
        assert_eq!(d[1].used_end, now1);
        epoch_peak[0] = epoch_peak[0].max(d[0].peak);
        epoch_peak[1] = epoch_peak[1].max(d[1].peak);
        // Right after the boundary, nothing has happened in the new interval.
        assert_eq!(
            step.peaks().unwrap(),
            vec![100 * MIB, now1],
            "round {round}"
        );
    }
    assert_eq!(epoch.peaks().unwrap(), epoch_peak.to_vec());
    // The window over reserved alone saw every blip of reserved too.
    let lone_peak = lone.reset().unwrap()[0].peak;
    assert_eq!(lone_peak, epoch_peak[1]);

    // What another thread allocates and frees right after the boundary's
    // one reset, before reserved's turn in it, lands in exactly one
    // interval: the next (the interval of every member ends at the reset).
    fw.state.lock().unwrap().blip_after_reset = Some((1, 7 * MIB));
    let d = step.reset().unwrap();
    assert_eq!(d[1].peak, 250 * MIB, "not in the interval that ended");
    assert_eq!(step.peaks().unwrap()[1], 250 * MIB + 7 * MIB, "in the next");
    assert_eq!(
        epoch.peaks().unwrap()[1],
        epoch_peak[1].max(250 * MIB + 7 * MIB)
    );
    assert_eq!(
        lone.peaks().unwrap()[0],
        250 * MIB + 7 * MIB,
        "and in every window"
    );
}

#[test]
fn failing_callbacks_fail_the_call_and_keep_every_peak() {
    failing_callbacks_fail_the_call_and_keep_every_peak_with(Framework::new(2));
    failing_callbacks_fail_the_call_and_keep_every_peak_with(Framework::batched(2));
}

fn failing_callbacks_fail_the_call_and_keep_every_peak_with(fw: Framework) {
    let group = fw.group();
    let a = Source::over_mark(&group, 0, "a", SourceKind::Custom).unwrap();
    let b = Source::over_mark(&group, 1, "b", SourceKind::Custom).unwrap();
    let mut wa = one(&a);
    let wb = one(&b);

    // A failing peak read fails the peek, and changes nothing.
    fw.blip(0, 40);
    fw.fail(Fail::Peak(0));
    let e = wa.peaks().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("source 'a'"), "{e}");
    assert!(e.message().contains("peak"), "{e}");
    fw.fail(Fail::None);
    assert_eq!(wa.peaks().unwrap(), vec![40]);

    // b's peak cannot be carried: the shared reset is not made, so b's mark
    // (still in the framework) is not lost.
    fw.blip(1, 60);
    fw.fail(Fail::Peak(1));
    let resets = fw.resets();
    assert!(wa.reset().is_err());
    assert_eq!(fw.resets(), resets, "no reset without carrying b first");
    fw.fail(Fail::None);
    assert_eq!(wb.peaks().unwrap(), vec![60]);
    // The failed boundary did not end a's interval: it still holds the blip.
    assert_eq!(wa.peaks().unwrap(), vec![40]);

    // A failing reset: the interval does not end, nothing is lost.
    fw.fail(Fail::Reset);
    let e = wa.reset().unwrap_err();
    assert!(e.message().contains("reset"), "{e}");
    fw.fail(Fail::None);
    fw.blip(0, 10);
    assert_eq!(wa.reset().unwrap()[0].peak, 40);
    assert_eq!(wb.peaks().unwrap(), vec![60]);

    // The reset succeeds but reading the new start fails: the interval
    // stays open, and what came before and after the reset both count.
    fw.blip(0, 25);
    fw.fail(Fail::Current(0));
    assert!(wa.reset().is_err());
    assert!(a.read().is_err());
    assert_eq!(
        a.last_error().unwrap().unwrap().kind(),
        ErrorKind::Unavailable
    );
    fw.fail(Fail::None);
    fw.blip(0, 5);
    assert_eq!(wa.reset().unwrap()[0].peak, 25);
    assert_eq!(wb.peaks().unwrap(), vec![60]);
    assert_eq!(a.read().unwrap().used, 0);
    assert!(a.last_error().unwrap().is_none());

    // Opening a window fails cleanly, leaving no half-open slot.
    fw.fail(Fail::Reset);
    assert!(Window::open(std::slice::from_ref(&a)).is_err());
    fw.fail(Fail::None);
    assert_eq!(a.open_windows().unwrap(), 1);
}

#[test]
fn a_mark_below_the_current_value_is_raised_to_it() {
    let fw = Framework::new(1);
    let src = Source::mark("buggy", SourceKind::Custom, Box::new(Script(fw.clone()))).unwrap();
    fw.alloc(0, 100);
    let mut w = one(&src);
    fw.state.lock().unwrap().peak_reads_zero = true;
    fw.alloc(0, 400);
    assert_eq!(w.peaks().unwrap(), vec![500]);
    assert_eq!(w.measure().unwrap()[0].peak, 500);
    fw.free(0, 450);
    assert_eq!(w.reset().unwrap()[0].peak, 500, "500 was read while open");
    assert_eq!(w.peaks().unwrap(), vec![50]);
}

/// Four threads make boundaries over the four marks of one group at once:
/// the framework never sees two calls at once, nothing fails or deadlocks,
/// and afterwards the group is as exact as before. (Peaks are not checked
/// while other threads reset: an allocation that rises and falls between a
/// boundary's read of the mark and its reset is, as with `VmHWM`, in neither
/// interval.)
#[test]
fn callbacks_of_one_group_never_run_concurrently() {
    callbacks_of_one_group_never_run_concurrently_with(Framework::new(4));
    callbacks_of_one_group_never_run_concurrently_with(Framework::batched(4));
}

fn callbacks_of_one_group_never_run_concurrently_with(fw: Framework) {
    let group = fw.group();
    let sources: Vec<Source> = (0..4)
        .map(|i| Source::over_mark(&group, i, &format!("m{i}"), SourceKind::Custom).unwrap())
        .collect();
    let threads: Vec<_> = sources
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, src)| {
            let fw = fw.clone();
            let all = sources.clone();
            std::thread::spawn(move || {
                let outer = Window::open(&all).unwrap();
                let mut w = one(&src);
                for n in 1..=200u64 {
                    fw.blip(i, n);
                    w.reset().unwrap();
                    src.read().unwrap();
                    outer.peaks().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(fw.calls.load(Ordering::SeqCst) > 4 * 200 * 6);
    assert_eq!(fw.overlaps.load(Ordering::SeqCst), 0);

    let w = Window::open(&sources).unwrap();
    for i in 0..4 {
        fw.blip(i, 10 * (i as u64 + 1));
    }
    assert_eq!(w.peaks().unwrap(), vec![10, 20, 30, 40]);
}

#[test]
fn a_tracker_reports_exact_peaks_per_step_and_per_epoch() {
    a_tracker_reports_exact_peaks_per_step_and_per_epoch_with(Framework::new(2));
    a_tracker_reports_exact_peaks_per_step_and_per_epoch_with(Framework::batched(2));
}

fn a_tracker_reports_exact_peaks_per_step_and_per_epoch_with(fw: Framework) {
    let group = fw.group();
    let alloc = Source::over_mark(&group, 0, "torch_alloc:0", SourceKind::GpuProcess).unwrap();
    let reserved =
        Source::over_mark(&group, 1, "torch_reserved:0", SourceKind::GpuProcess).unwrap();
    fw.alloc(0, GIB);
    fw.alloc(1, 2 * GIB);
    let mut t = Tracker::new(&[alloc, reserved]).unwrap();
    for epoch in 0..2u64 {
        t.begin(PhaseKind::Epoch, None).unwrap();
        t.begin(PhaseKind::Step, None).unwrap();
        for step in 0..4u64 {
            // Step `step` holds a temporary tensor of (step + 1) × 100 MiB;
            // the cache grows once, in step 2 of epoch 0.
            fw.blip(0, (step + 1) * 100 * MIB);
            if epoch == 0 && step == 2 {
                fw.alloc(1, 512 * MIB);
            }
            let r = t.next(PhaseKind::Step, None).unwrap();
            let reserved_peak = if epoch == 0 && step < 2 {
                2 * GIB
            } else {
                2 * GIB + 512 * MIB
            };
            assert_eq!(
                (r.sources[0].peak, r.sources[1].peak),
                (GIB + (step + 1) * 100 * MIB, reserved_peak),
                "epoch {epoch} step {step}"
            );
            assert_eq!(r.sources[0].delta_peaked, (step + 1) * 100 * MIB);
        }
        t.end(PhaseKind::Step, None).unwrap();
        let e = t.end(PhaseKind::Epoch, None).unwrap();
        assert_eq!(e.phase.as_ref().unwrap().index, epoch);
        assert_eq!(e.sources[0].peak, GIB + 400 * MIB);
        assert_eq!(e.sources[1].peak, 2 * GIB + 512 * MIB);
        assert_eq!(e.sources[1].fidelity, PeakFidelity::Exact);
    }
}

#[test]
fn a_trace_reports_the_blip() {
    let fw = Framework::new(1);
    let src = Source::mark(
        "torch_alloc:0",
        SourceKind::GpuProcess,
        Box::new(Script(fw.clone())),
    )
    .unwrap();
    fw.alloc(0, GIB);
    let opts = TraceOptions {
        ctx: Some("forward".into()),
        silent: true,
        ..TraceOptions::default()
    };
    let mut trace = Trace::new(std::slice::from_ref(&src), opts).unwrap();
    fw.alloc(0, 64 * MIB);
    fw.blip(0, 256 * MIB);
    let line = trace.report_n_reset(Some("step 1")).unwrap();
    assert_eq!(line, "△Used Peaked MB:     64    256 (forward: step 1)");
    fw.free(0, 64 * MIB);
    let d = &trace.data().unwrap()[0];
    assert_eq!((d.delta_used, d.delta_peaked), (-64 * MIB as i64, 0));
}
