//! A process whose RSS stays level: each boundary reads `statm` once, not
//! twice. Its RSS then sits at the lowest getrusage reading the source has
//! seen, where a reading may be the launcher's mark (the exec floor, see
//! kernel_hwm.rs); the RSS read at the previous boundary, right after its
//! reset, tells the two apart without another read. Counted with the
//! kernel's own tally of this process's read system calls (`syscr` in
//! `/proc/self/io`), alone in its process.

use memprobe_core::{Source, Window};

mod kernel_mark;
use kernel_mark::{maxrss, statm_rss, Touched};

/// This process's read (`syscr`) or write (`syscw`) system calls so far.
fn io_calls(key: &str) -> u64 {
    let text =
        std::fs::read_to_string("/proc/self/io").expect("/proc/self/io (task I/O accounting)");
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("a {key} line"))
}

fn reads() -> u64 {
    io_calls("syscr:")
}

fn writes() -> u64 {
    io_calls("syscw:")
}

#[test]
fn a_level_rss_costs_one_statm_read_per_boundary() {
    // Above the exec floor, as a trainer is, and the source made after: its
    // lowest getrusage reading is this level (a source made while the
    // process was small would know the floor is lower).
    let floor = maxrss();
    let _ballast = Touched::new(((floor.saturating_sub(statm_rss()) + (16 << 20)) / 4096) as usize);
    let rss = Source::process().unwrap();
    let mut w = Window::open(std::slice::from_ref(&rss)).unwrap();
    let mut ended = Vec::new();
    for _ in 0..10 {
        w.reset_into(&mut ended).unwrap();
    }
    // What counting itself costs, in reads.
    let a = reads();
    let b = reads();
    let per_count = b - a;
    let before = reads();
    for _ in 0..100 {
        w.reset_into(&mut ended).unwrap();
    }
    let boundaries = reads() - before - per_count;
    assert_eq!(
        boundaries, 100,
        "statm reads for 100 boundaries at a level RSS"
    );
    // And they are exact: each interval's peak covers its own readings.
    let start = ended[0].used_start;
    w.reset_into(&mut ended).unwrap();
    assert!(ended[0].peak >= ended[0].used_start.max(ended[0].used_end));
    assert!(
        ended[0].used_start.abs_diff(start) < 1 << 20,
        "the RSS stayed level"
    );

    // Nor is the mark reset: it is at the level already (getrusage at or
    // below the RSS), so the boundary writes nothing to clear_refs.
    let before = writes();
    for _ in 0..100 {
        w.reset_into(&mut ended).unwrap();
    }
    assert_eq!(writes() - before, 0, "clear_refs writes at a level RSS");

    // A spike freed inside an interval: that boundary resets the mark, and
    // the next interval's peak is its own, not the spike.
    let spike = 64 << 20;
    drop(Touched::new(spike / 4096));
    let before = writes();
    w.reset_into(&mut ended).unwrap();
    assert_eq!(writes() - before, 1, "the freed spike's mark is reset");
    // Within the kernel's per-CPU counting (a few pages here).
    let seen = |d: &memprobe_core::SourceDelta| d.peak + (1 << 20) >= d.used_start + spike as u64;
    assert!(seen(&ended[0]), "{:?}", ended[0]);
    w.reset_into(&mut ended).unwrap();
    assert!(
        ended[0].peak < ended[0].used_start + (1 << 20),
        "the interval after the spike: peak {} from {}",
        ended[0].peak,
        ended[0].used_start
    );
    // After boundaries that wrote nothing, a spike is the interval's.
    w.reset_into(&mut ended).unwrap();
    drop(Touched::new(spike / 4096));
    w.reset_into(&mut ended).unwrap();
    assert!(seen(&ended[0]), "{:?}", ended[0]);
}
