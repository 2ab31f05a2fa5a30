//! Call paths end to end on the fake driver (`MEMPROBE_GPU_ORIGINS=stacks`):
//! one origin (an NCCL-like library) reached by two paths of the program,
//! beside the program's own allocation (tests/interpose/stacks.c); the
//! bytes by path, now, at the peak and at an out-of-memory failure, read
//! from another process, exact to the byte, with the origins unchanged.

mod common;

use common::*;
use memprobe_interpose_reader::stacks::{PeakStacks, StackBytes};
use memprobe_interpose_reader::{Counter, Region};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

const MIB: u64 = 1 << 20;

/// The library and the program of tests/interpose/stacks.c, built once.
fn stacks_program() -> PathBuf {
    static PROG: OnceLock<PathBuf> = OnceLock::new();
    PROG.get_or_init(|| origin_program("stacks", &["nccl"], "stacks.c", &["-rdynamic"], "stacks"))
        .clone()
}

/// Runs the program with `MEMPROBE_GPU_ORIGINS=mode`, calling `check` at
/// each checkpoint with its label and the region.
fn with_program(mode: &str, mut check: impl FnMut(&str, &Arc<Region>)) {
    let regions = region_dir(&format!("stacks-{}", mode.replace(':', "-")));
    let mut cmd = Command::new(stacks_program());
    interposed(&mut cmd, &fake_driver(false), &regions);
    cmd.env(
        "LD_LIBRARY_PATH",
        format!(
            "{}:{}",
            scratch().join("stacks").display(),
            fake_driver(false).display()
        ),
    )
    .env("MEMPROBE_GPU_ORIGINS", mode);
    let mut t = Talk::start(cmd);
    let pid = t.child.id();
    loop {
        let line = t.line();
        if line == "done" {
            break;
        }
        let label = line.strip_prefix("at ").expect("a checkpoint").to_owned();
        check(&label, &open_region(&regions, pid));
        t.go();
    }
    t.finish();
}

/// `(frames, MiB)`, largest first.
fn paths(v: &[StackBytes]) -> Vec<(Vec<String>, u64)> {
    v.iter()
        .map(|s| (s.stack.frames.clone(), s.bytes / MIB))
        .collect()
}

fn sum(p: &PeakStacks) -> u64 {
    p.by_stack.iter().map(|s| s.bytes).sum()
}

fn frames(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn one_origin_reached_by_two_paths_is_two_stacks_exact_to_the_byte() {
    let d0 = Counter::Device(0);
    let mut seen = Vec::new();
    with_program("stacks:2", |label, r| {
        seen.push(label.to_owned());
        assert_eq!(r.stack_depth(), 2);
        let live = paths(&r.live_by_stack(d0));
        let a = frames(&["libfake_nccl.so!nccl_alloc", "stacks!path_a"]);
        let b = frames(&["libfake_nccl.so!nccl_alloc", "stacks!path_b"]);
        let peak = r.peak_stacks(d0).expect("a breakdown at the peak");
        assert_eq!(peak.peak, 10 * MIB, "{label}");
        assert_eq!(sum(&peak), peak.peak, "{label}: the paths sum to the peak");
        assert_eq!(
            paths(&peak.by_stack)[..2],
            [(b.clone(), 5), (a.clone(), 3)],
            "{label}"
        );
        // The program's own allocation: its first frame is the program's
        // copy of the library code.
        let own = &paths(&peak.by_stack)[2];
        assert_eq!(own.1, 2);
        assert_eq!(own.0[0], "stacks!prog_alloc", "{own:?}");
        // Same bytes by origin: nccl 8 (both paths), the program 2.
        let origins: Vec<u64> = r.live_by_origin(d0).iter().map(|o| o.bytes / MIB).collect();
        match label {
            "held" => {
                assert_eq!(live, vec![(b, 5), (a, 3), (own.0.clone(), 2)]);
                assert_eq!(origins, vec![8, 2]);
                assert_eq!(r.oom_stacks(), None);
            }
            "freed" => {
                assert_eq!(live, vec![(a, 3), (own.0.clone(), 2)]);
                assert_eq!(origins, vec![3, 2]);
            }
            "oom" => {
                let oom = r.oom_stacks().expect("the paths at the failure");
                assert_eq!(oom.peak, 5 * MIB);
                assert_eq!(sum(&oom), oom.peak);
                assert_eq!(paths(&oom.by_stack), vec![(a, 3), (own.0.clone(), 2)]);
            }
            other => panic!("{other}"),
        }
        // Every counted byte is on exactly one path.
        let counted: u64 = r.live_by_stack(d0).iter().map(|s| s.bytes).sum();
        assert_eq!(counted, r.current(d0), "{label}");
    });
    assert_eq!(seen, ["held", "freed", "oom"]);
}

#[test]
fn deeper_paths_keep_more_frames_and_plain_origins_keep_none() {
    with_program("stacks", |label, r| {
        assert_eq!(r.stack_depth(), 8);
        if label == "held" {
            let live = r.live_by_stack(Counter::Device(0));
            let a = &live[1].stack.frames;
            assert_eq!(
                a[..3],
                frames(&["libfake_nccl.so!nccl_alloc", "stacks!path_a", "stacks!main"])
            );
            assert!(a.len() > 3 && a.len() <= 8, "{a:?}");
        }
    });
    with_program("on", |_, r| {
        assert_eq!(r.stack_depth(), 0);
        assert!(r.live_by_stack(Counter::Device(0)).is_empty());
        assert_eq!(r.peak_stacks(Counter::Device(0)), None);
        assert_eq!(r.live_by_origin(Counter::Device(0)).len(), 2);
    });
}
