//! The exact RSS peak a window boundary (`Window::reset`) reports against
//! the kernel's own `VmHWM`: a boundary reads the mark, resets it and reads
//! the RSS that starts the next interval, and folds that reading into the
//! ended interval's peak in place of a reading of its own before the reset.
//! Over many random intervals of allocations still resident at the
//! boundary, no ended interval's peak, and no enclosing window's peak, is
//! below a `VmHWM` read inside it.

use memprobe_core::peak_error_bound;
use memprobe_core::{PeakFidelity, Source, Window};

mod kernel_mark;
use kernel_mark::{maxrss, seed, statm_rss, vmhwm, Rng, Touched};

/// One test, run alone in its process, so no other test's allocation lands
/// inside an interval.
#[test]
fn no_boundary_reports_a_peak_below_a_vmhwm_read_inside_its_interval() {
    let bound = peak_error_bound();
    let rss = Source::process().unwrap();
    assert_eq!(rss.info().fidelity, PeakFidelity::Exact, "clear_refs works");
    let seed = seed();
    let mut rng = Rng(seed);
    let ctx = format!("seed {seed} (MEMPROBE_PEAK_SEED), {bound:?}");
    // Above the exec floor, where a boundary reads getrusage alone before
    // its reset (see kernel_hwm.rs).
    let floor = maxrss();
    let _ballast = Touched::new(((floor.saturating_sub(statm_rss()) + (16 << 20)) / 4096) as usize);
    assert!(statm_rss() > floor, "ballast above the exec floor");

    let mut epoch = Window::open(std::slice::from_ref(&rss)).unwrap();
    let mut step = Window::open(std::slice::from_ref(&rss)).unwrap();
    let mut epoch_inside = 0;
    let mut low = 0;
    for i in 0..700 {
        let mut held = Vec::new();
        let mut inside = 0;
        for _ in 0..=rng.below(5) {
            held.push(Touched::new(1 + rng.below(2000) as usize));
            if rng.below(2) == 0 {
                inside = inside.max(vmhwm());
            }
        }
        inside = inside.max(vmhwm());
        epoch_inside = epoch_inside.max(inside);
        let ended = step.reset().unwrap()[0].peak;
        if ended + bound.held < inside {
            low += 1;
            eprintln!(
                "interval {i}: peak {ended} < VmHWM {inside} by {} KiB",
                (inside - ended) / 1024
            );
        }
        drop(held);
        if i % 100 == 99 {
            let peak = epoch.reset().unwrap()[0].peak;
            assert!(
                peak + bound.held >= epoch_inside,
                "epoch ending at {i}: peak {peak} < VmHWM {epoch_inside}; {ctx}"
            );
            epoch_inside = 0;
        }
    }
    assert_eq!(low, 0, "{low} intervals read below VmHWM; {ctx}");
}
