//! Exact peak windows over this process's RSS, and fastai's deltas on pushed
//! sources.

mod common;
use common::{serial, spike, MIB, SLACK};
use memprobe_core::{PeakFidelity, Source, Window};

#[test]
fn spike_is_caught_in_window_and_outer_not_in_later_sibling() {
    let _g = serial();
    let rss = Source::process().unwrap();
    assert_eq!(
        rss.info().fidelity,
        PeakFidelity::Exact,
        "VmHWM reset must work on this machine"
    );
    let outer = Window::open(std::slice::from_ref(&rss)).unwrap();
    let inner = Window::open(std::slice::from_ref(&rss)).unwrap();
    let start = inner.starts()[0].used;
    spike(256 * MIB as usize);
    let inner_peak = inner.peaks().unwrap()[0];
    assert!(
        inner_peak >= start + 256 * MIB - SLACK,
        "inner peak {inner_peak} < start {start} + 256 MiB"
    );
    drop(inner);
    let sibling = Window::open(std::slice::from_ref(&rss)).unwrap();
    let sib_peak = sibling.peaks().unwrap()[0];
    assert!(
        sib_peak < start + 128 * MIB,
        "sibling opened after the spike saw it: {sib_peak}"
    );
    // The outer window saw it even though the sibling's open reset the kernel mark.
    let outer_peak = outer.peaks().unwrap()[0];
    assert!(
        outer_peak >= start + 256 * MIB - SLACK,
        "outer peak {outer_peak} lost the spike"
    );
    let d = outer.close().unwrap();
    assert_eq!(d[0].fidelity, PeakFidelity::Exact);
    assert!(d[0].delta_peaked >= 200 * MIB);
}

#[test]
fn resetting_one_window_leaves_the_others_intact() {
    let _g = serial();
    let rss = Source::process().unwrap();
    let a = Window::open(std::slice::from_ref(&rss)).unwrap();
    let mut b = Window::open(std::slice::from_ref(&rss)).unwrap();
    let c = Window::open(std::slice::from_ref(&rss)).unwrap();
    let start = a.starts()[0].used;
    spike(128 * MIB as usize);
    b.reset().unwrap();
    let peaks: Vec<u64> = [&a, &b, &c].iter().map(|w| w.peaks().unwrap()[0]).collect();
    assert!(
        peaks[0] >= start + 128 * MIB - SLACK,
        "a lost the spike: {peaks:?}"
    );
    assert!(
        peaks[1] < start + 64 * MIB,
        "b still has the spike after its reset: {peaks:?}"
    );
    assert!(
        peaks[2] >= start + 128 * MIB - SLACK,
        "c lost the spike: {peaks:?}"
    );
}

#[test]
fn sixty_four_nested_windows_all_see_a_spike_in_the_innermost() {
    let _g = serial();
    let rss = Source::process().unwrap();
    let windows: Vec<Window> = (0..64)
        .map(|_| Window::open(std::slice::from_ref(&rss)).unwrap())
        .collect();
    let start = windows[63].starts()[0].used;
    spike(64 * MIB as usize);
    let later = Window::open(std::slice::from_ref(&rss)).unwrap();
    for (i, w) in windows.iter().enumerate() {
        let p = w.peaks().unwrap()[0];
        assert!(p >= start + 64 * MIB - SLACK, "window {i}: {p}");
    }
    assert!(later.peaks().unwrap()[0] < start + 32 * MIB);
    assert_eq!(rss.open_windows().unwrap(), 65);
    drop(windows);
    drop(later);
    assert_eq!(rss.open_windows().unwrap(), 0);
}

#[test]
fn pushed_source_follows_fastai_deltas_including_negative_used() {
    let src = Source::pushed("alloc").unwrap();
    src.push(100 * MIB).unwrap();
    let w = Window::open(std::slice::from_ref(&src)).unwrap();
    for v in [120, 180, 90, 110] {
        src.push(v * MIB).unwrap();
    }
    let d = &w.measure().unwrap()[0];
    assert_eq!(
        (d.used_start, d.used_end, d.peak),
        (100 * MIB, 110 * MIB, 180 * MIB)
    );
    assert_eq!((d.delta_used, d.delta_peaked), (10 * MIB as i64, 70 * MIB));
    src.push(40 * MIB).unwrap();
    let d = &w.close().unwrap()[0];
    assert_eq!((d.delta_used, d.delta_peaked), (-60 * MIB as i64, 80 * MIB));
    assert_eq!(d.fidelity, PeakFidelity::Pushed);
}

#[test]
fn pushed_windows_are_independent() {
    let src = Source::pushed("p").unwrap();
    src.push(10).unwrap();
    let outer = Window::open(std::slice::from_ref(&src)).unwrap();
    src.push(50).unwrap();
    let mut inner = Window::open(std::slice::from_ref(&src)).unwrap();
    src.push(30).unwrap();
    assert_eq!(inner.peaks().unwrap(), vec![50]);
    inner.reset().unwrap();
    src.push(20).unwrap();
    assert_eq!(inner.peaks().unwrap(), vec![30]);
    assert_eq!(outer.peaks().unwrap(), vec![50]);
    let sibling = Window::open(std::slice::from_ref(&src)).unwrap();
    assert_eq!(sibling.peaks().unwrap(), vec![20]);
}

#[test]
fn invalid_inputs_are_errors() {
    assert!(Window::open(&[]).is_err());
    assert!(Source::pushed("").is_err());
    assert!(Source::pushed(&"x".repeat(65)).is_err());
    assert!(
        Source::process().unwrap().push(1).is_err(),
        "sampled sources refuse pushes"
    );
}

#[test]
fn one_failing_source_does_not_hide_the_others() {
    use memprobe_core::{Error, ErrorKind};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let pushed = Source::pushed("host").unwrap();
    let broken = Arc::new(AtomicBool::new(false));
    let flag = broken.clone();
    let gpu = Source::callback(
        "gpu",
        Box::new(move || {
            if flag.load(Ordering::Relaxed) {
                Err(Error::new(ErrorKind::GpuLost, "fell off the bus"))
            } else {
                Ok(7)
            }
        }),
    )
    .unwrap();
    pushed.push(100).unwrap();
    let w = Window::open(&[pushed.clone(), gpu.clone()]).unwrap();
    pushed.push(500).unwrap();
    broken.store(true, Ordering::Relaxed);
    assert_eq!(w.peaks().unwrap_err().kind(), ErrorKind::GpuLost);
    assert_eq!(w.peak_of(0).unwrap(), 500);
    assert_eq!(w.measure_of(0).unwrap().delta_used, 400);
    assert_eq!(w.peak_of(1).unwrap_err().kind(), ErrorKind::GpuLost);
    assert_eq!(w.measure_of(1).unwrap_err().kind(), ErrorKind::GpuLost);
    assert_eq!(w.peak_of(2).unwrap_err().kind(), ErrorKind::InvalidId);
    assert_eq!(w.measure_of(2).unwrap_err().kind(), ErrorKind::InvalidId);
    broken.store(false, Ordering::Relaxed);
    assert_eq!(w.peak_of(1).unwrap(), 7);
}

/// An untimed boundary keeps the same peaks and records as a timed one,
/// over the kernel's mark, a pushed source and both at once; it stamps
/// nothing and leaves the sources' last readings alone.
#[test]
fn an_untimed_reset_measures_as_a_timed_one_and_stamps_nothing() {
    let _g = serial();
    let rss = Source::process().unwrap();
    let pushed = Source::pushed("untimed").unwrap();
    for sources in [vec![rss.clone()], vec![rss.clone(), pushed.clone()]] {
        let mut timed = Window::open(&sources).unwrap();
        let mut untimed = Window::open(&sources).unwrap();
        let mut ended = Vec::new();
        for step in 0..6u64 {
            pushed.push(100 + step * 7).unwrap();
            pushed.push(10 + step).unwrap();
            spike(96 * MIB as usize);
            let last = rss.last().unwrap();
            untimed.reset_untimed_into(&mut ended).unwrap();
            assert_eq!(
                rss.last().unwrap(),
                last,
                "an untimed boundary kept its reading"
            );
            assert_eq!(untimed.started_at_ns(), 0);
            assert!(untimed
                .starts()
                .iter()
                .all(|s| s.taken_at_ns == 0 && s.read_ns == 0));
            let timed_ended = timed.reset().unwrap();
            assert!(timed.started_at_ns() > 0);
            assert_eq!(ended.len(), sources.len());
            for (u, t) in ended.iter().zip(&timed_ended) {
                assert_eq!((&u.name, u.kind, u.fidelity), (&t.name, t.kind, t.fidelity));
            }
            // The RSS: the spike is in both intervals, whole.
            for d in [&ended[0], &timed_ended[0]] {
                assert!(
                    d.peak + SLACK >= d.used_start + 96 * MIB,
                    "step {step}: {d:?}"
                );
            }
            if sources.len() == 2 {
                // The pushed source's peak and deltas are exact in both.
                let (u, t) = (&ended[1], &timed_ended[1]);
                assert_eq!((u.peak, u.used_end), (100 + step * 7, 10 + step));
                assert_eq!((t.peak, t.used_end), (u.peak, u.used_end));
                assert_eq!(u.delta_used, t.delta_used);
            }
        }
        // A timed boundary after untimed ones stamps again.
        untimed.reset_into(&mut ended).unwrap();
        assert!(untimed.started_at_ns() > 0);
        assert!(untimed.starts().iter().all(|s| s.taken_at_ns > 0));
    }
}
