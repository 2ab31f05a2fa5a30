//! The interposer end to end on the fake driver: every way of obtaining GPU
//! memory, read from another process and compared with the driver's own
//! truth; spikes; threads; fork, exec, kill; pass-through cases.

mod common;

use common::*;
use memprobe_interpose_reader::{reclaim_dead, region_path, Counter, Region};
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Runs alloc_ways found `how`, checking the counters at every checkpoint
/// against the fake driver's truth; returns the region for final checks.
fn every_way(how: &str, legacy: bool) -> (std::sync::Arc<Region>, Vec<String>) {
    every_way_under(how, legacy, None)
}

/// As [`every_way`], the program run under `tool` (valgrind and its
/// arguments) when given.
fn every_way_under(
    how: &str,
    legacy: bool,
    tool: Option<&[&str]>,
) -> (std::sync::Arc<Region>, Vec<String>) {
    let fake = fake_driver(legacy);
    let regions = region_dir(&format!("ways-{how}-{legacy}-{}", tool.is_some()));
    let prog = program("alloc_ways", how == "linked");
    let mut cmd = match tool {
        Some(t) => {
            let mut c = Command::new(t[0]);
            c.args(&t[1..]).arg(prog);
            c
        }
        None => Command::new(prog),
    };
    cmd.arg(how);
    interposed(&mut cmd, &fake, &regions);
    let mut t = Talk::start(cmd);
    let pid = t.child.id();
    let mut region = None;
    let mut labels = Vec::new();
    let (mut max0, mut max1, mut maxh) = (0, 0, 0);
    loop {
        let line = t.line();
        if line == "done" {
            break;
        }
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[0], "at", "{line}");
        let truth: Vec<u64> = f[2..5].iter().map(|v| v.parse().unwrap()).collect();
        if region.is_none() && truth.iter().all(|&v| v == 0) {
            // The region comes with the first wrapped call; before it there
            // is nothing to count.
            if let Ok(r) = Region::open_path(&region_path(&regions, pid)) {
                region = Some(r);
            }
        }
        if region.is_none() && truth.iter().any(|&v| v != 0) {
            region = Some(open_region(&regions, pid));
        }
        let Some(r) = region.as_ref() else {
            labels.push(f[1].to_owned());
            t.go();
            continue;
        };
        let seen = [
            r.current(Counter::Device(0)),
            r.current(Counter::Device(1)),
            r.current(Counter::HostPinned),
        ];
        assert_eq!(seen.to_vec(), truth, "{how}: at {}", f[1]);
        max0 = max0.max(truth[0]);
        max1 = max1.max(truth[1]);
        maxh = maxh.max(truth[2]);
        labels.push(f[1].to_owned());
        t.go();
    }
    t.finish();
    let r = region.unwrap();
    assert_eq!(r.read(Counter::Device(0)).lifetime_peak, max0, "{how}");
    assert_eq!(r.read(Counter::Device(1)).lifetime_peak, max1, "{how}");
    assert_eq!(r.read(Counter::HostPinned).lifetime_peak, maxh, "{how}");
    let oom = r.last_oom().expect("the failed allocation is recorded");
    assert_eq!(
        (oom.counter, oom.size, oom.events),
        (Counter::Device(1), 1 << 50, 1)
    );
    assert_eq!(oom.api, Some("cuMemAlloc_v2"), "{how}");
    assert!(oom.at_ns.is_some_and(|t| t > 0), "{how}");
    assert_eq!(r.read(Counter::Device(1)).failures, 1);
    assert_eq!(r.read(Counter::Device(1)).last_failure_size, 1 << 50);
    // Only the release of the imported VMM handle frees something never
    // counted; the refused frees (double, unknown pointer) are not frees.
    let nc = r.not_counted();
    assert_eq!(
        (nc.calls, nc.untracked_frees),
        (0, u64::from(!legacy)),
        "{how}: {nc:?}"
    );
    assert!(r.exited() && !r.alive());
    (r, labels)
}

#[test]
fn dlsym_lookups_count_every_way() {
    let (_, labels) = every_way("dlsym", false);
    for l in [
        "vmm-imported",
        "pool-trimmed",
        "arrays",
        "pinned",
        "ipc",
        "oom",
    ] {
        assert!(labels.iter().any(|x| x == l), "{l} missing from {labels:?}");
    }
}

#[test]
fn cu_get_proc_address_as_the_runtime_does_counts_every_way() {
    every_way("proc", false);
}

#[test]
fn per_thread_default_stream_variants_count() {
    every_way("proc-ptds", false);
}

#[test]
fn cu_get_proc_address_of_cuda_11_3_counts() {
    every_way("proc-v1", false);
}

#[test]
fn programs_linked_to_the_driver_count() {
    every_way("linked", false);
}

/// Under valgrind (memcheck, every error fatal): the interposer's memory
/// accesses are clean and the counts stay exact.
#[test]
fn under_valgrind_every_way_counts_and_nothing_is_wrong() {
    let have = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("valgrind not installed: skipped");
        return;
    }
    every_way_under(
        "proc",
        false,
        Some(&[
            "valgrind",
            "--error-exitcode=99",
            "--quiet",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--show-leak-kinds=definite",
        ]),
    );
}

#[test]
fn a_driver_without_vmm_pools_or_get_proc_address_passes_through() {
    let (_, labels) = every_way("dlsym", true);
    assert!(!labels.iter().any(|l| l.starts_with("vmm")), "{labels:?}");
}

/// A spike of microseconds, from another process, with two marks reset at
/// different times: caught every time by both.
#[test]
fn short_spikes_are_caught_every_time_by_independent_marks() {
    const TRIES: usize = 300;
    let regions = region_dir("spike");
    let mut cmd = Command::new(program("procs", false));
    cmd.args(["spike", &TRIES.to_string(), &(3 * MIB).to_string()]);
    interposed(&mut cmd, &fake_driver(false), &regions);
    let mut t = Talk::start(cmd);
    let pid: u32 = t.line().strip_prefix("ready ").unwrap().parse().unwrap();
    let r = open_region(&regions, pid);
    let every_try = r.mark().unwrap();
    let mut every_tenth = r.mark().unwrap();
    assert_ne!(every_try.slot(), every_tenth.slot());
    let d0 = Counter::Device(0);
    for i in 0..TRIES {
        assert_eq!(every_try.peak(d0), 0);
        t.go();
        assert_eq!(t.line(), "spiked");
        assert_eq!(r.current(d0), 0);
        assert_eq!(every_try.take(d0), 3 * MIB, "try {i}");
        if i % 10 == 9 {
            assert_eq!(every_tenth.take(d0), 3 * MIB, "try {i}");
            assert_eq!(every_tenth.peak(d0), 0);
        }
        if i == TRIES / 2 {
            // A reader that leaves and comes back starts afresh.
            let slot = every_tenth.slot();
            drop(every_tenth);
            every_tenth = r.mark().unwrap();
            assert_eq!(every_tenth.slot(), slot);
        }
    }
    t.finish();
    assert_eq!(r.read(d0).lifetime_peak, 3 * MIB);
}

/// A tracker inside the program and a reader outside it (memprobe run's
/// place) keep their own marks: each resets only its own.
#[test]
fn a_reader_inside_and_one_outside_never_reset_each_other() {
    const TRIES: u64 = 70;
    let regions = region_dir("inside-outside");
    let mut cmd = Command::new(program("procs", false));
    cmd.args(["inside", &TRIES.to_string()]);
    interposed(&mut cmd, &fake_driver(false), &regions);
    let mut t = Talk::start(cmd);
    let pid: u32 = t.line().strip_prefix("ready ").unwrap().parse().unwrap();
    let r = open_region(&regions, pid);
    let outside = r.mark().unwrap();
    let mut window_max = 0;
    for i in 0..TRIES {
        t.go();
        let spike = (i % 7 + 1) * MIB;
        let inside: u64 = t.line().strip_prefix("inside ").unwrap().parse().unwrap();
        assert_eq!(inside, spike, "the tracker's step peak, try {i}");
        window_max = window_max.max(spike);
        if i % 5 == 4 {
            assert_eq!(
                outside.take(Counter::Device(0)),
                window_max,
                "outside, try {i}"
            );
            window_max = 0;
        }
    }
    t.finish();
}

#[test]
fn eight_threads_at_once_count_exactly() {
    let regions = region_dir("threads");
    let mut cmd = Command::new(program("procs", false));
    cmd.args(["threads", "8", "3000"]);
    interposed(&mut cmd, &fake_driver(false), &regions);
    let mut t = Talk::start(cmd);
    let truth: u64 = t.line().strip_prefix("truth ").unwrap().parse().unwrap();
    let r = open_region(&regions, t.child.id());
    assert_eq!(truth, (1..=8).sum::<u64>() * MIB);
    assert_eq!(r.current(Counter::Device(0)), truth);
    assert!(r.read(Counter::Device(0)).lifetime_peak >= truth);
    // Each thread holds at most 4 small blocks besides what it keeps.
    assert!(r.read(Counter::Device(0)).lifetime_peak <= truth + 8 * 4 * (4 * 4096 + 8));
    t.go();
    t.finish();
}

#[test]
fn a_forked_child_counts_apart_from_its_parent() {
    let regions = region_dir("fork");
    let mut cmd = Command::new(program("procs", false));
    cmd.arg("fork");
    interposed(&mut cmd, &fake_driver(false), &regions);
    let mut t = Talk::start(cmd);
    let (mut parent, mut child) = (0u32, 0u32);
    while parent == 0 || child == 0 {
        let l = t.line();
        if let Some(p) = l.strip_prefix("parent ") {
            parent = p.parse().unwrap();
        } else if let Some(c) = l.strip_prefix("child ") {
            child = c.parse().unwrap();
        }
    }
    let pr = open_region(&regions, parent);
    let cr = open_region(&regions, child);
    assert_eq!(pr.current(Counter::Device(0)), 4 * MIB);
    assert_eq!(cr.current(Counter::Device(0)), MIB);
    assert_eq!(cr.pid(), child);
    t.go(); // the child ends
    assert_eq!(t.line(), "reaped");
    assert_eq!(cr.current(Counter::Device(0)), MIB);
    // _exit: no exit handlers ran, but the process is gone.
    assert!(!cr.exited() && !cr.alive());
    t.go(); // then the parent
    t.finish();
    assert_eq!(pr.current(Counter::Device(0)), 4 * MIB);
}

#[test]
fn an_exec_child_inherits_the_interposer() {
    let regions = region_dir("exec");
    let mut cmd = Command::new(program("procs", false));
    cmd.arg("exec");
    interposed(&mut cmd, &fake_driver(false), &regions);
    let mut t = Talk::start(cmd);
    let (mut parent, mut child) = (0u32, 0u32);
    while parent == 0 || child == 0 {
        let l = t.line();
        if let Some(p) = l.strip_prefix("parent ") {
            parent = p.parse().unwrap();
        } else if let Some(c) = l.strip_prefix("child ") {
            child = c.parse().unwrap();
        }
    }
    assert_eq!(
        open_region(&regions, parent).current(Counter::Device(0)),
        3 * MIB
    );
    let cr = open_region(&regions, child);
    assert_eq!(cr.current(Counter::Device(0)), 2 * MIB);
    assert_eq!(cr.read(Counter::Device(0)).lifetime_peak, 2 * MIB);
    t.go();
    t.finish();
}

#[test]
fn a_killed_process_region_is_reclaimed_unless_a_reader_holds_it() {
    let regions = region_dir("kill");
    let mut cmd = Command::new(program("procs", false));
    cmd.arg("hold");
    interposed(&mut cmd, &fake_driver(false), &regions);
    let mut t = Talk::start(cmd);
    let pid: u32 = t.line().strip_prefix("holding ").unwrap().parse().unwrap();
    let r = open_region(&regions, pid);
    assert_eq!(r.current(Counter::Device(0)), 8 * MIB);
    assert_eq!(reclaim_dead(&regions).unwrap(), 0, "alive");
    let mark = r.mark().unwrap();
    t.child.kill().unwrap();
    t.child.wait().unwrap();
    assert!(!r.alive() && !r.exited());
    // This process holds a mark: the region stays while it reads...
    assert!(r.layout().held_by_live_reader());
    assert_eq!(reclaim_dead(&regions).unwrap(), 0, "held by a reader");
    let entries = memprobe_interpose_reader::processes(&regions).unwrap();
    assert_eq!(entries.len(), 1);
    assert!(!entries[0].alive);
    assert_eq!(mark.peak(Counter::Device(0)), 8 * MIB);
    drop(mark);
    // ... and goes once no live reader holds it.
    assert_eq!(reclaim_dead(&regions).unwrap(), 1);
    assert!(!region_path(&regions, pid).exists());
    assert!(memprobe_interpose_reader::processes(&regions)
        .unwrap()
        .is_empty());
}

#[test]
fn a_thread_without_a_context_passes_through() {
    let regions = region_dir("nocontext");
    let mut cmd = Command::new(program("procs", false));
    cmd.arg("nocontext");
    interposed(&mut cmd, &fake_driver(false), &regions);
    let mut t = Talk::start(cmd);
    let line = t.line();
    let truth: Vec<u64> = line
        .split(' ')
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    let r = open_region(&regions, t.child.id());
    assert_eq!(truth, [MIB, 4 * MIB], "{line}");
    assert_eq!(r.current(Counter::Device(0)), MIB);
    assert_eq!(r.read(Counter::Device(0)).failures, 0);
    // The pool of device 1, allocated from on the thread without a context.
    assert_eq!(r.current(Counter::Device(1)), 4 * MIB);
    assert_eq!(r.not_counted().calls, 0);
    t.go();
    t.finish();
}

/// A library loaded with RTLD_DEEPBIND binds to the driver before the
/// interposer: its calls run, uncounted, and nothing breaks.
#[test]
fn rtld_deepbind_libraries_pass_through_uncounted() {
    let regions = region_dir("deepbind");
    let mut cmd = Command::new(program("procs", false));
    cmd.arg("deepbind").arg(deep_library());
    interposed(&mut cmd, &fake_driver(false), &regions);
    let mut t = Talk::start(cmd);
    let truth: u64 = t.line().strip_prefix("truth ").unwrap().parse().unwrap();
    let r = open_region(&regions, t.child.id());
    assert_eq!(truth, 7 * MIB);
    assert_eq!(r.current(Counter::Device(0)), MIB);
    t.go();
    t.finish();
}

/// A second interposer preloaded after this one finds what it wraps with
/// dlsym(RTLD_NEXT): the lookup reaches glibc as the caller's own.
#[test]
fn rtld_next_lookups_stay_relative_to_their_caller() {
    let regions = region_dir("next");
    let mut cmd = Command::new(program("procs", false));
    cmd.arg("next");
    interposed(&mut cmd, &fake_driver(false), &regions);
    let preload = format!("{} {}", interposer().display(), next_library().display());
    cmd.env("LD_PRELOAD", preload);
    let mut t = Talk::start(cmd);
    let truth: u64 = t.line().strip_prefix("truth ").unwrap().parse().unwrap();
    let r = open_region(&regions, t.child.id());
    assert_eq!(r.current(Counter::Device(0)), truth);
    t.go();
    t.finish();
}

/// Programs that never touch the driver (a shell, a forked worker) leave no
/// region behind.
#[test]
fn a_process_without_cuda_leaves_no_region() {
    let regions = region_dir("no-cuda");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "true && (true) && exit 0"]);
    interposed(&mut cmd, &fake_driver(false), &regions);
    assert!(cmd.status().unwrap().success());
    assert!(!regions.exists() || std::fs::read_dir(&regions).unwrap().next().is_none());
}

#[test]
fn switched_off_it_stays_loaded_and_passes_everything_through() {
    let regions = region_dir("off");
    let mut cmd = Command::new(program("alloc_ways", false));
    cmd.arg("proc");
    interposed(&mut cmd, &fake_driver(false), &regions);
    cmd.env("MEMPROBE_GPU_EXACT", "off");
    let mut t = Talk::start(cmd);
    loop {
        let l = t.line();
        if l == "done" {
            break;
        }
        t.go();
    }
    t.finish();
    assert!(!regions.exists() || std::fs::read_dir(&regions).unwrap().next().is_none());
}

#[test]
fn in_process_reading_needs_the_interposer() {
    match Region::in_process() {
        Err(memprobe_interpose_reader::Error::NotLoaded) => {}
        other => panic!("{other:?}"),
    }
    let err = Region::open_path(std::path::Path::new("/nonexistent/1")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/1"), "{err}");
    let junk = scratch().join("junk-region");
    std::fs::write(
        &junk,
        vec![7u8; memprobe_interpose_reader::layout::LAYOUT_SIZE],
    )
    .unwrap();
    let err = Region::open_path(&junk).unwrap_err();
    assert!(err.to_string().contains("magic"), "{err}");
    std::fs::write(&junk, b"short").unwrap();
    assert!(Region::open_path(&junk)
        .unwrap_err()
        .to_string()
        .contains("smaller"));
}
