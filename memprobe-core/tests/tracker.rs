//! The training-loop tracker on scripted (pushed) sources: phases and
//! nesting errors, sinks' exact output, release policies, OOM retry, leaks.

mod common;
use common::Buf;
use memprobe_core::LeakPolicy;
use memprobe_core::{CsvSink, JsonlSink, TableSink, CSV_HEADER};
use memprobe_core::{ErrorKind, PhaseKind, SnapshotSink, Source, StepOutcome, Tracker};
use memprobe_core::{ReleaseKind, ReleasePolicy, ReleaseReason};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn pushed(name: &str, v: u64) -> Source {
    let s = Source::pushed(name).unwrap();
    s.push(v).unwrap();
    s
}

#[test]
fn every_phase_kind_nests_and_records() {
    let cpu = pushed("cpu", 100 * MIB);
    let mut t = Tracker::new(std::slice::from_ref(&cpu)).unwrap();
    let snap = Arc::new(SnapshotSink::new());
    t.add_sink(snap.clone());
    t.begin(PhaseKind::Stream, None).unwrap();
    t.begin(PhaseKind::Experience, None).unwrap();
    t.begin(PhaseKind::Epoch, None).unwrap();
    t.begin(PhaseKind::Custom, Some("forward")).unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    cpu.push(300 * MIB).unwrap();
    cpu.push(120 * MIB).unwrap();
    let step = t.end(PhaseKind::Step, None).unwrap();
    let p = step.phase.as_ref().unwrap();
    assert_eq!(
        (p.kind, p.index, p.depth, p.name.as_str()),
        (PhaseKind::Step, 0, 4, "step")
    );
    let d = &step.sources[0];
    assert_eq!(
        (
            d.used_start,
            d.used_end,
            d.peak,
            d.delta_used,
            d.delta_peaked
        ),
        (100 * MIB, 120 * MIB, 300 * MIB, 20 * MIB as i64, 180 * MIB)
    );
    t.end(PhaseKind::Custom, Some("forward")).unwrap();
    let epoch = t.end(PhaseKind::Epoch, None).unwrap();
    assert_eq!(
        epoch.sources[0].peak,
        300 * MIB,
        "the outer phase saw the step's peak"
    );
    t.end(PhaseKind::Experience, None).unwrap();
    t.end(PhaseKind::Stream, None).unwrap();
    let kinds: Vec<&str> = snap
        .records()
        .iter()
        .map(|r| r.phase.as_ref().unwrap().kind.as_str())
        .collect();
    assert_eq!(kinds, ["step", "custom", "epoch", "experience", "stream"]);
    assert!(snap
        .records()
        .iter()
        .all(|r| r.ended_at_ns >= r.started_at_ns));
}

#[test]
fn wrong_nesting_is_an_error_and_changes_nothing() {
    let cpu = pushed("cpu", 1);
    let mut t = Tracker::new(&[cpu]).unwrap();
    let e = t.end(PhaseKind::Epoch, None).unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::WrongOrder,
        "ending what was never begun"
    );
    t.begin(PhaseKind::Epoch, None).unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    let e = t.end(PhaseKind::Epoch, None).unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::WrongOrder,
        "ending an epoch inside a step: {e}"
    );
    assert_eq!(
        t.begin(PhaseKind::Epoch, None).unwrap_err().kind(),
        ErrorKind::WrongOrder,
        "epoch inside a step"
    );
    assert_eq!(
        t.begin(PhaseKind::Step, None).unwrap_err().kind(),
        ErrorKind::WrongOrder,
        "step inside a step"
    );
    assert_eq!(
        t.begin(PhaseKind::Custom, None).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        t.begin(PhaseKind::Step, Some("x")).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    t.begin(PhaseKind::Custom, Some("a")).unwrap();
    assert_eq!(
        t.end(PhaseKind::Custom, Some("b")).unwrap_err().kind(),
        ErrorKind::WrongOrder
    );
    t.end(PhaseKind::Custom, Some("a")).unwrap();
    assert_eq!(
        t.open_phases().len(),
        2,
        "failed calls left the stack as it was"
    );
    let r = t.end(PhaseKind::Step, None).unwrap();
    assert_eq!(
        r.phase.unwrap().index,
        0,
        "no record was consumed by the failures"
    );
    t.end(PhaseKind::Epoch, None).unwrap();
    assert!(Tracker::new(&[]).is_err());
}

#[test]
fn next_is_end_plus_begin_and_indexes_count() {
    let cpu = pushed("cpu", 10);
    let mut t = Tracker::new(std::slice::from_ref(&cpu)).unwrap();
    t.begin(PhaseKind::Epoch, None).unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    for i in 0..5u64 {
        cpu.push(100 + i).unwrap();
        cpu.push(10 + i).unwrap();
        let r = t.next(PhaseKind::Step, None).unwrap();
        assert_eq!(r.phase.as_ref().unwrap().index, i);
        assert_eq!(r.sources[0].peak, 100 + i);
    }
    t.end(PhaseKind::Step, None).unwrap();
    assert_eq!(t.end(PhaseKind::Epoch, None).unwrap().sources[0].peak, 104);
    assert_eq!(
        t.last_record(PhaseKind::Step)
            .unwrap()
            .phase
            .as_ref()
            .unwrap()
            .index,
        5
    );
}

fn scripted_epochs(t: &mut Tracker, cpu: &Source, gpu: &Source) {
    // epoch 1: cpu +1 MiB with a 2 MiB blip; gpu +80 MiB with a 6220 MiB blip
    for (e, (cu, cp, gu, gp)) in [(1u64, 2u64, 80u64, 6220u64), (0, 2, 2, 914)]
        .into_iter()
        .enumerate()
    {
        let (c0, g0) = (cpu.read().unwrap().used, gpu.read().unwrap().used);
        t.begin(PhaseKind::Epoch, None).unwrap();
        cpu.push(c0 + (cu + cp) * MIB).unwrap();
        gpu.push(g0 + (gu + gp) * MIB).unwrap();
        cpu.push(c0 + cu * MIB).unwrap();
        gpu.push(g0 + gu * MIB).unwrap();
        let r = t.end(PhaseKind::Epoch, None).unwrap();
        assert_eq!(r.phase.unwrap().index, e as u64);
    }
}

#[test]
fn table_matches_peak_mem_metric() {
    let cpu = pushed("cpu", 500 * MIB);
    let gpu = pushed("gpu0", 1000 * MIB);
    let mut t = Tracker::new(&[cpu.clone(), gpu.clone()]).unwrap();
    let buf = Buf::default();
    t.add_sink(Arc::new(TableSink::new(
        PhaseKind::Epoch,
        Box::new(buf.clone()),
    )));
    scripted_epochs(&mut t, &cpu, &gpu);
    // Pushed sources are "custom": labelled by name.
    assert_eq!(
        buf.text(),
        "epoch  cpu used  peak  gpu0 used  peak\n    0         1     2         80  6220\n    1         0     2          2   914\n"
    );
}

#[test]
fn jsonl_and_csv_files_appear_complete() {
    let dir = std::env::temp_dir().join(format!("memprobe-sinks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (jp, cp) = (dir.join("run.jsonl"), dir.join("run.csv"));
    let cpu = pushed("cpu", 500 * MIB);
    let gpu = pushed("gpu0", 1000 * MIB);
    {
        let mut t = Tracker::new(&[cpu.clone(), gpu.clone()]).unwrap();
        t.add_sink(Arc::new(JsonlSink::create(&jp).unwrap()));
        t.add_sink(Arc::new(CsvSink::create(&cp).unwrap()));
        scripted_epochs(&mut t, &cpu, &gpu);
        assert!(
            !jp.exists() && !cp.exists(),
            "nothing at the final path before the end"
        );
        t.finish_sinks().unwrap();
    }
    let jsonl = std::fs::read_to_string(&jp).unwrap();
    let lines: Vec<&str> = jsonl.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].starts_with("{\"label\":\"epoch\",\"phase\":{\"kind\":\"epoch\",\"name\":\"epoch\",\"index\":0,\"depth\":0},\"started_at_ns\":"), "{}", lines[0]);
    assert!(lines[0].contains(&format!(
        "\"sources\":[{{\"name\":\"cpu\",\"kind\":\"custom\",\"fidelity\":\"pushed\",\"used_start\":{},\"used_end\":{},\"peak\":{},\"delta_used\":{},\"delta_peaked\":{}}}",
        500 * MIB, 501 * MIB, 503 * MIB, MIB, 2 * MIB
    )), "{}", lines[0]);
    assert!(
        lines[1].ends_with(",\"leaks\":[],\"releases\":[]}"),
        "{}",
        lines[1]
    );
    let csv = std::fs::read_to_string(&cp).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(format!("{}\n", rows[0]), CSV_HEADER);
    assert_eq!(rows.len(), 1 + 2 * 2, "one row per epoch and source");
    let cols: Vec<&str> = rows[2].split(',').collect();
    assert_eq!(cols.len(), CSV_HEADER.trim().split(',').count());
    assert_eq!(
        (cols[0], cols[1], cols[2], cols[7], cols[9]),
        ("epoch", "epoch", "0", "gpu0", "pushed")
    );
    assert_eq!(cols[13], (80 * MIB).to_string());
    assert_eq!(cols[14], (6220 * MIB).to_string());
    // An unwritable path fails at creation, before any work.
    assert!(JsonlSink::create("/nonexistent-dir/x.jsonl").is_err());
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".tmp-")));
}

#[test]
fn clear_cache_every_n_follows_index_plus_one_mod_n() {
    let cpu = pushed("cpu", 100);
    let mut t = Tracker::new(std::slice::from_ref(&cpu)).unwrap();
    let cache = Arc::new(AtomicU64::new(0));
    let gc = Arc::new(AtomicU64::new(0));
    let (c2, g2, src) = (cache.clone(), gc.clone(), cpu.clone());
    t.add_release(
        "empty_cache",
        ReleaseKind::Cache,
        Box::new(move || {
            c2.fetch_add(1, Ordering::SeqCst);
            src.push(50).unwrap();
            Ok(())
        }),
    )
    .unwrap();
    t.add_release(
        "gc",
        ReleaseKind::Gc,
        Box::new(move || {
            g2.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }),
    )
    .unwrap();
    t.add_release_policy(ReleasePolicy::Every {
        kind: PhaseKind::Step,
        n: 10,
        gc: false,
    })
    .unwrap();
    t.begin(PhaseKind::Epoch, None).unwrap();
    let mut fired_at = Vec::new();
    t.begin(PhaseKind::Step, None).unwrap();
    for i in 0..25u64 {
        cpu.push(100).unwrap();
        let r = t.next(PhaseKind::Step, None).unwrap();
        if !r.releases.is_empty() {
            fired_at.push(i);
            let e = &r.releases[0];
            assert_eq!(
                (e.reason, e.ran.clone(), e.freed()),
                (
                    ReleaseReason::Periodic,
                    vec!["empty_cache".to_owned()],
                    vec![50]
                )
            );
        }
    }
    assert_eq!(
        fired_at,
        vec![9, 19],
        "fires when (index + 1) % 10 == 0, like ClearCacheHook"
    );
    assert_eq!(
        (cache.load(Ordering::SeqCst), gc.load(Ordering::SeqCst)),
        (2, 0)
    );
    t.add_release_policy(ReleasePolicy::Every {
        kind: PhaseKind::Epoch,
        n: 1,
        gc: true,
    })
    .unwrap();
    t.end(PhaseKind::Step, None).unwrap();
    let r = t.end(PhaseKind::Epoch, None).unwrap();
    assert_eq!(r.releases.len(), 1);
    assert_eq!(
        gc.load(Ordering::SeqCst),
        1,
        "epoch policy with gc runs the GC callback"
    );
    assert_eq!(t.releases_fired(), 3);
    assert!(t
        .add_release_policy(ReleasePolicy::Every {
            kind: PhaseKind::Step,
            n: 0,
            gc: false
        })
        .is_err());
    assert!(t
        .add_release_policy(ReleasePolicy::Every {
            kind: PhaseKind::Stream,
            n: 1,
            gc: false
        })
        .is_err());
    assert_eq!(
        t.add_release_policy(ReleasePolicy::BelowFree {
            source: 3,
            bytes: 1,
            gc: false
        })
        .unwrap_err()
        .kind(),
        ErrorKind::InvalidId
    );
}

#[test]
fn threshold_policy_fires_when_free_memory_is_low() {
    let free = Arc::new(AtomicU64::new(10 * MIB));
    let f2 = free.clone();
    // A source with `free`: a callback source reports only used, so use system RAM semantics via a custom sampler.
    struct Gpu(Arc<AtomicU64>);
    impl memprobe_core::Sampler for Gpu {
        fn info(&self) -> memprobe_core::SourceInfo {
            memprobe_core::SourceInfo {
                name: "gpu0".into(),
                kind: memprobe_core::SourceKind::GpuDevice,
                fidelity: memprobe_core::PeakFidelity::Sampled,
            }
        }
        fn read(&mut self) -> memprobe_core::Result<memprobe_core::Sample> {
            let free = self.0.load(Ordering::SeqCst);
            Ok(memprobe_core::Sample {
                used: 100 * MIB - free,
                total: Some(100 * MIB),
                free: Some(free),
                ..Default::default()
            })
        }
    }
    let gpu = Source::from_sampler(Box::new(Gpu(f2)));
    let mut t = Tracker::new(&[gpu]).unwrap();
    let f3 = free.clone();
    t.add_release(
        "empty_cache",
        ReleaseKind::Cache,
        Box::new(move || {
            f3.store(60 * MIB, Ordering::SeqCst);
            Ok(())
        }),
    )
    .unwrap();
    t.add_release_policy(ReleasePolicy::BelowFree {
        source: 0,
        bytes: 20 * MIB,
        gc: false,
    })
    .unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    let r = t.next(PhaseKind::Step, None).unwrap();
    assert_eq!(r.releases.len(), 1);
    assert_eq!(r.releases[0].reason, ReleaseReason::LowMemory);
    assert_eq!(r.releases[0].freed(), vec![50 * MIB]);
    let r = t.end(PhaseKind::Step, None).unwrap();
    assert!(r.releases.is_empty(), "60 MiB free is above the threshold");
    let _ = free;
}

/// An exact sampler that counts its resets (one per window boundary) and
/// reports `free`, so a `BelowFree` policy can read it.
struct CountedResets {
    resets: Arc<AtomicU64>,
    free: Arc<AtomicU64>,
}

impl memprobe_core::Sampler for CountedResets {
    fn info(&self) -> memprobe_core::SourceInfo {
        memprobe_core::SourceInfo {
            name: "gpu0".into(),
            kind: memprobe_core::SourceKind::GpuDevice,
            fidelity: memprobe_core::PeakFidelity::Exact,
        }
    }
    fn read(&mut self) -> memprobe_core::Result<memprobe_core::Sample> {
        Ok(memprobe_core::Sample {
            used: MIB,
            total: Some(100 * MIB),
            free: Some(self.free.load(Ordering::SeqCst)),
            ..Default::default()
        })
    }
    fn read_peak(&mut self) -> memprobe_core::Result<Option<u64>> {
        Ok(Some(MIB))
    }
    fn reset_peak(&mut self) -> memprobe_core::Result<memprobe_core::Sample> {
        self.resets.fetch_add(1, Ordering::SeqCst);
        self.read()
    }
}

/// Resets of the source over 100 step boundaries (`next`), with `policy`
/// and `free` bytes free throughout, and the releases that ran.
fn resets_over_steps(policy: Option<ReleasePolicy>, free: u64) -> (u64, usize) {
    let resets = Arc::new(AtomicU64::new(0));
    let gpu = Source::from_sampler(Box::new(CountedResets {
        resets: resets.clone(),
        free: Arc::new(AtomicU64::new(free)),
    }));
    let mut t = Tracker::new(&[gpu]).unwrap();
    t.add_release("empty_cache", ReleaseKind::Cache, Box::new(|| Ok(())))
        .unwrap();
    if let Some(p) = policy {
        t.add_release_policy(p).unwrap();
    }
    t.begin(PhaseKind::Step, None).unwrap();
    let before = resets.load(Ordering::SeqCst);
    let mut released = 0;
    for _ in 0..100 {
        released += t.next(PhaseKind::Step, None).unwrap().releases.len();
    }
    (resets.load(Ordering::SeqCst) - before, released)
}

#[test]
fn a_below_free_policy_resets_a_step_boundary_once_unless_it_releases() {
    let plain = resets_over_steps(None, 90 * MIB);
    assert_eq!(plain.1, 0);
    assert!(plain.0 >= 100, "{plain:?}");
    // Memory is plentiful: no release, and each boundary resets the window
    // as often as without the policy (it used to reset it twice).
    let policy = ReleasePolicy::BelowFree {
        source: 0,
        bytes: 20 * MIB,
        gc: false,
    };
    assert_eq!(resets_over_steps(Some(policy), 90 * MIB), plain);
    // Memory is short: every boundary releases, and the next step restarts
    // after the release, one reset more per boundary.
    let (resets, released) = resets_over_steps(Some(policy), 10 * MIB);
    assert_eq!(released, 100);
    assert_eq!(resets, plain.0 + 100);
}

/// What the sinks do at a boundary where a release runs is in the next
/// phase, as at any boundary: not lost between the release and the
/// phase's restart.
#[test]
fn what_sinks_do_at_a_releasing_boundary_is_in_the_next_phase() {
    struct Spike(Source);
    impl memprobe_core::Sink for Spike {
        fn on_record(&self, _: &memprobe_core::Record) {
            self.0.push(500 * MIB).unwrap();
            self.0.push(MIB).unwrap();
        }
    }
    let gpu = Source::from_sampler(Box::new(CountedResets {
        resets: Arc::new(AtomicU64::new(0)),
        free: Arc::new(AtomicU64::new(10 * MIB)),
    }));
    let cpu = pushed("cpu", MIB);
    let mut t = Tracker::new(&[gpu, cpu.clone()]).unwrap();
    t.add_release("empty_cache", ReleaseKind::Cache, Box::new(|| Ok(())))
        .unwrap();
    t.add_release_policy(ReleasePolicy::BelowFree {
        source: 0,
        bytes: 20 * MIB,
        gc: false,
    })
    .unwrap();
    t.add_sink(Arc::new(Spike(cpu)));
    t.begin(PhaseKind::Step, None).unwrap();
    let first = t.next(PhaseKind::Step, None).unwrap();
    assert_eq!((first.releases.len(), first.sources[1].peak), (1, MIB));
    let second = t.next(PhaseKind::Step, None).unwrap();
    assert_eq!(second.sources[1].peak, 500 * MIB);
}

#[test]
fn oom_retry_releases_and_retries() {
    let cpu = pushed("cpu", 100);
    let mut t = Tracker::new(std::slice::from_ref(&cpu)).unwrap();
    let src = cpu.clone();
    t.add_release(
        "empty_cache",
        ReleaseKind::Cache,
        Box::new(move || {
            src.push(src.read().unwrap().used - 10).unwrap();
            Ok(())
        }),
    )
    .unwrap();
    let mut attempts = 0;
    let r = t
        .run_with_oom_retry(
            || {
                attempts += 1;
                Ok(if attempts < 3 {
                    StepOutcome::OutOfMemory
                } else {
                    StepOutcome::Done
                })
            },
            5,
        )
        .unwrap();
    assert!(r.succeeded);
    assert_eq!((r.retries, r.freed()), (2, vec![20]));
    let r = t
        .run_with_oom_retry(|| Ok(StepOutcome::OutOfMemory), 2)
        .unwrap();
    assert!(!r.succeeded);
    assert_eq!(r.retries, 2);
    let e = t
        .run_with_oom_retry(|| Err(memprobe_core::Error::invalid("boom")), 2)
        .unwrap_err();
    assert_eq!(e.message(), "boom", "other errors pass through");
}

/// The OOM retry's result under its old name (deprecated until 0.3.0): the
/// same type, so code written against it still builds.
#[test]
#[allow(deprecated)]
fn oom_retry_result_old_name_is_the_same_type() {
    let cpu = pushed("cpu", 100 * MIB);
    let mut t = Tracker::new(std::slice::from_ref(&cpu)).unwrap();
    let r: memprobe_core::OomReport = t.run_with_oom_retry(|| Ok(StepOutcome::Done), 1).unwrap();
    let new: memprobe_core::OomRetryResult = r.clone();
    assert_eq!((new.succeeded, new.retries), (true, 0));
    assert_eq!(r, new);
}

#[test]
fn leak_flag_on_and_off() {
    let cpu = pushed("cpu", 100 * MIB);
    let mut t = Tracker::new(std::slice::from_ref(&cpu)).unwrap();
    t.set_leak_policy(Some(LeakPolicy {
        threshold: MIB,
        epochs: 2,
    }))
    .unwrap();
    let buf = Buf::default();
    t.add_sink(Arc::new(TableSink::new(
        PhaseKind::Epoch,
        Box::new(buf.clone()),
    )));
    let mut flags = Vec::new();
    for grow in [5, 5, 5, 0, 5] {
        t.begin(PhaseKind::Epoch, None).unwrap();
        cpu.push(cpu.read().unwrap().used + grow * MIB).unwrap();
        let r = t.end(PhaseKind::Epoch, None).unwrap();
        flags.push(r.leaks[0].flagged);
    }
    // growth per epoch: -, 5, 5, 0, 5 → streaks 0,1,2,0,1
    assert_eq!(flags, vec![false, false, true, false, false]);
    assert!(!t.leak_status(0).unwrap().flagged);
    assert_eq!(t.leak_status(1).unwrap_err().kind(), ErrorKind::InvalidId);
    let text = buf.text();
    assert!(text.lines().next().unwrap().ends_with("  leak"));
    assert!(text.lines().nth(3).unwrap().ends_with("  cpu"), "{text}");
    assert!(text.lines().nth(4).unwrap().ends_with("  -"), "{text}");
    assert!(t
        .set_leak_policy(Some(LeakPolicy {
            threshold: 1,
            epochs: 0
        }))
        .is_err());
}
