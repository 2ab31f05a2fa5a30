//! The chart's tests: its units and ticks, and what each run draws.

use super::*;

#[test]
fn units_follow_the_range() {
    assert_eq!(memory_unit(100 << 20).name, "MiB");
    assert_eq!(memory_unit(3 << 30).name, "GiB");
    assert_eq!(time_unit(30.0).name, "s");
    assert_eq!(time_unit(3000.0).name, "min");
    assert_eq!(time_unit(86_400.0).name, "h");
}

#[test]
fn ticks_have_no_float_noise() {
    assert_eq!(tick(0.6000000000000001), "0.6");
    assert_eq!(tick(2.0), "2");
    assert_eq!(tick(0.125), "0.125");
    assert_eq!(tick(-0.0), "0");
}

#[test]
fn phases_and_processes_on_the_chart() {
    let mut r = crate::commands::run::phase_report::tests::run_with_phases(3, 13);
    r.process_lines = crate::commands::run::process_lines::LinesReport {
        lines: (0..20u32)
            .map(|i| crate::commands::run::process_lines::DrawnLine {
                pid: 600 + i,
                name: "worker".to_string(),
                peak: u64::from(20 - i) << 20,
                points: vec![(0.0, 1 << 20), (0.03, u64::from(20 - i) << 20)],
            })
            .collect(),
        processes: 40,
    };
    r.process_lines
        .lines
        .truncate(crate::commands::run::process_lines::DRAWN);
    let svg = render(&r).unwrap();
    for needle in [
        "epochs (shaded)",
        "evaluations (shaded): stream",
        "rss peak 900 MiB in epoch 1, step 13, at 0.02 s",
        "pid 600 worker (peak 20.0 MiB)",
        "10 more processes, grey (the 16 largest of 40 drawn)",
        "epoch 2",
    ] {
        assert!(svg.contains(needle), "no {needle:?} in the SVG");
    }
    assert!(!svg.contains("pid 606 "), "only 6 processes are named");
    // Three epochs and three streams shaded.
    let shade = |c: RGBColor| format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
    let bands =
        svg.matches(&shade(EPOCH_SHADES[0])).count() + svg.matches(&shade(EPOCH_SHADES[1])).count();
    assert_eq!(bands, 3 + 1, "3 epochs and the legend's swatch");
    assert_eq!(svg.matches(&shade(EVAL_SHADE)).count(), 3 + 1);
    // Without phases or workers, nothing of it.
    let plain = crate::commands::run::phase_report::tests::run_with_phases(0, 0);
    let svg = render(&plain).unwrap();
    assert!(!svg.contains("shaded") && !svg.contains("pid 6"));
}

/// The `<text>` elements of an SVG, as (x, y, text).
fn texts(svg: &str) -> Vec<(f64, f64, String)> {
    svg.split("<text ")
        .skip(1)
        .map(|t| format!(" {t}"))
        .filter_map(|t| {
            let attr = |name: &str| -> Option<f64> {
                let at = t.find(&format!(" {name}=\""))? + name.len() + 3;
                t[at..].split('"').next()?.parse().ok()
            };
            let body = t.split('>').nth(1)?.split('<').next()?;
            Some((attr("x")?, attr("y")?, body.trim().to_string()))
        })
        .collect()
}

#[test]
fn a_validation_phase_is_shaded_and_named_like_a_stream() {
    let mut r = crate::commands::run::phase_report::tests::run_with_phases(3, 13);
    for p in r.phases.iter_mut().filter(|p| p.kind == "stream") {
        p.kind = "custom";
        p.name = "validation".into();
        p.label = p.label.replace("stream", "validation");
    }
    // Wide enough to be named.
    r.duration_s = 0.036;
    let svg = render(&r).unwrap();
    assert!(
        svg.contains("evaluations (shaded): validation"),
        "no legend"
    );
    let shade = format!(
        "fill=\"#{:02X}{:02X}{:02X}\"",
        EVAL_SHADE.0, EVAL_SHADE.1, EVAL_SHADE.2
    );
    assert_eq!(svg.matches(&shade).count(), 3 + 1);
    for name in ["test", "EVAL", "evaluation"] {
        let mut p = r.phases[0].clone();
        p.kind = "custom";
        p.name = name.into();
        assert!(is_evaluation(&p), "{name}");
    }
    let mut p = r.phases[0].clone();
    p.kind = "custom";
    p.name = "checkpoint".into();
    assert!(!is_evaluation(&p));
}

#[test]
fn the_peak_step_is_marked_at_its_peak_and_its_label_is_clear_of_the_line() {
    let r = crate::commands::run::phase_report::tests::run_with_phases(3, 13);
    let svg = render(&r).unwrap();
    // The sample at the spike (16 ms) is inside step 13 (15-16 ms... the
    // step's span) and its time is the label's.
    let (x, y, text) = texts(&svg)
        .into_iter()
        .find(|t| t.2.starts_with("rss peak 900 MiB"))
        .expect("the peak step's label");
    assert!(text.ends_with("at 0.02 s"), "{text}");
    // The dashed line (drawn as short segments) ends at the marker, and
    // the label sits beside it: no line passes through the label.
    let dashes: Vec<(f64, f64)> = svg
        .split("<polyline")
        .skip(1)
        .filter(|p| p.contains("stroke=\"#96143C\""))
        .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
        .flat_map(|pts| {
            pts.split_whitespace()
                .filter_map(|xy| {
                    let (a, b) = xy.split_once(',')?;
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect::<Vec<(f64, f64)>>()
        })
        .collect();
    assert!(dashes.len() > 10, "no dashed line: {dashes:?}");
    let line_x = dashes[0].0;
    assert!(
        dashes.iter().all(|d| d.0 == line_x),
        "not one vertical line"
    );
    let top = dashes.iter().map(|d| d.1).fold(f64::MAX, f64::min);
    assert!(
        y >= top,
        "the label starts above the line's top: {y} < {top}"
    );
    assert!((x - line_x).abs() >= 8.0, "label at {x}, line at {line_x}");
    // Without a sample inside the step, the label says so.
    let mut sparse = crate::commands::run::phase_report::tests::run_with_phases(3, 13);
    sparse.timeline.retain(|p| p.t_s < 0.010 || p.t_s > 0.020);
    let svg = render(&sparse).unwrap();
    assert!(svg.contains("no sample inside the step"), "not said");
}

#[test]
fn a_machine_sized_container_gets_its_own_panel() {
    let mut r = crate::commands::run::phase_report::tests::run_with_phases(3, 13);
    for p in &mut r.timeline {
        p.cgroup_bytes = Some(9 << 30);
    }
    r.cgroup = Some(crate::commands::run::report::CgroupReport {
        version: "v2",
        path: "/".into(),
        limit_bytes: None,
        start_bytes: Some(9 << 30),
        end_bytes: Some(9 << 30),
        peak_bytes: Some(9 << 30),
        peak_fidelity: "sampled",
        sampled_peak_bytes: Some(9 << 30),
        sampled_peak_at_s: Some(0.0),
        read_errors: 0,
    });
    let svg = render(&r).unwrap();
    assert!(svg.contains(&format!("height=\"{}\"", HEIGHT + PANEL_HEIGHT)));
    let ys: Vec<String> = texts(&svg)
        .into_iter()
        .filter(|t| t.2.starts_with("memory ("))
        .map(|t| t.2)
        .collect();
    assert_eq!(ys, ["memory (GiB)", "memory (MiB)"], "two scales");
    // The program's scale is its own: 900 MiB tall, not 9 GiB.
    assert!(texts(&svg).iter().any(|t| t.2 == "1000" || t.2 == "800"));
    // A container close to the program shares the scale.
    let plain = render(&crate::commands::run::phase_report::tests::run_with_phases(
        3, 13,
    ))
    .unwrap();
    assert!(plain.contains(&format!("height=\"{HEIGHT}\"")));
}

#[test]
fn oom_kills_and_gpu_out_of_memory_are_marked_at_their_time() {
    use crate::commands::run::gpu_exact::{ExactProcess, ExactRecord, GpuExactReport};
    let mut r = crate::commands::run::phase_report::tests::run_with_phases(3, 13);
    r.oom_kill = Some(crate::commands::run::oom_kill::OomKillReport {
        verdict: crate::commands::run::oom_kill::Level::Confirmed,
        counters: Some("memory.events"),
        oom_kill_rise: Some(1),
        oom_rise: Some(1),
        oom_group_kill_rise: None,
        kills_outside_tree: Some(0),
        kernel_log: true,
        kernel_log_unavailable: None,
        other_kills: Vec::new(),
        tracking: "process_events",
        tracking_unavailable: None,
        victims: vec![crate::commands::run::oom_kill::VictimReport {
            pid: 777,
            name: "grow".into(),
            at_s: 0.02,
            phase: None,
            phase_pid: None,
            direct_child: true,
            sigkill_seen: true,
            evidence: crate::commands::run::oom_kill::Evidence::KernelLog,
            peak_bytes: Some(250 << 20),
            peak_source: "rusage",
        }],
        container_peak_bytes: None,
        container_limit_bytes: None,
        explanation: None,
    });
    let exact = |at: Option<u64>| {
        let mut x = ExactRecord {
            library: "libmemprobe_interpose.so".into(),
            processes: vec![ExactProcess {
                pid: 901,
                oom_failures: 2,
                last_oom_mono_ns: at,
                ..ExactProcess::default()
            }],
            ..ExactRecord::default()
        };
        x.place_in_run(1_000_000_000);
        x
    };
    r.gpu_exact = Some(GpuExactReport::new(&exact(Some(1_030_000_000))));
    assert_eq!(
        r.gpu_exact.as_ref().unwrap().processes[0].last_oom_at_s,
        Some(0.03)
    );
    let svg = render(&r).unwrap();
    let t = texts(&svg);
    let kill = t
        .iter()
        .find(|t| t.2 == "OOM kill (confirmed): pid 777 grow")
        .expect("the kill's label");
    let gpu = t
        .iter()
        .find(|t| t.2 == "GPU out of memory: 2 failed allocations (pid 901), the last here")
        .expect("the GPU OOM's label");
    // Later on the time axis.
    assert!(gpu.0 > kill.0 - 1.0 || gpu.1 != kill.1, "{kill:?} {gpu:?}");
    // Its time unknown: the footer says so.
    r.gpu_exact = Some(GpuExactReport::new(&exact(None)));
    let svg = render(&r).unwrap();
    assert!(svg.contains("GPU out of memory: 2 failed allocations (pid 901), time unknown"));
    // No verdict, no mark.
    r.oom_kill.as_mut().unwrap().verdict = crate::commands::run::oom_kill::Level::None;
    assert!(!render(&r).unwrap().contains("OOM kill"));
}

#[test]
fn decimation_keeps_maxima() {
    let pts: Vec<(f64, u64)> = (0..10_000).map(|i| (i as f64, (i % 97) as u64)).collect();
    let d = decimate(&pts, 100);
    assert!(d.len() <= 100);
    assert_eq!(d.iter().map(|p| p.1).max(), Some(96));
}

/// An epoch's attribution record: its peak step and one block per entry
/// of `blocks` (bytes, function), allocated in train.py.
fn torch_epoch(
    epoch: u64,
    step: u64,
    peak: u64,
    blocks: &[(u64, &str)],
) -> crate::commands::run::torch_attribution::TorchRecord {
    use crate::commands::run::torch_attribution::{Block, Frame, History, Rest, TorchRecord};
    TorchRecord {
        kind: "epoch_peak".into(),
        file: format!("epoch-{epoch}-rank-0.json"),
        number: epoch,
        rank: 0,
        epoch: Some(epoch),
        step: Some(step),
        stage: Some("train".into()),
        device: Some(0),
        peak_bytes: Some(peak),
        requested_bytes: None,
        blocks: blocks
            .iter()
            .map(|&(bytes, function)| Block {
                bytes,
                stream: Some(0),
                address: None,
                frames: vec![Frame {
                    file: "/home/u/train.py".into(),
                    line: 42,
                    function: function.into(),
                }],
                module: None,
            })
            .collect(),
        rest: Rest {
            bytes: Some(1 << 20),
            blocks: Some(3),
        },
        history: History {
            complete: true,
            entries: 10,
            lost_entries: false,
            reason: None,
        },
        truncated: false,
        cost_ms: Some(1.0),
    }
}

#[test]
fn each_epochs_torch_peak_is_marked_at_its_step_with_its_top_block() {
    let mut r = crate::commands::run::phase_report::tests::run_with_phases(3, 13);
    // Each epoch's peak step as the phase reports hold it.
    let steps: Vec<(u64, u64, f64)> = r
        .phases
        .iter()
        .filter(|p| p.kind == "epoch")
        .map(|p| {
            let s = &p.steps.peaks[0];
            (p.index, s.index, (s.start_s + s.end_s) / 2.0)
        })
        .collect();
    assert_eq!(steps.len(), 3);
    r.torch_attribution = steps
        .iter()
        .map(|&(e, s, _)| {
            torch_epoch(
                e,
                s,
                (e + 1) << 30,
                &[(1 << 30, "forward"), (1 << 20, "backward")],
            )
        })
        .collect();
    // A record whose step no phase holds: never placed at a guess.
    r.torch_attribution
        .push(torch_epoch(1, 99_999, 8 << 30, &[(1 << 30, "lost")]));
    let m = torch_marks::torch_marks(&r);
    assert_eq!((m.marks.len(), m.unlabelled, m.untimed), (3, 0, 1));
    // Highest first, each at its step's time.
    assert_eq!(m.marks[0].t_s, steps[2].2);
    assert_eq!(m.marks[2].t_s, steps[0].2);
    let svg = render(&r).unwrap();
    for &(e, s, _) in &steps {
        // The top block, and the other block plus the rest's three.
        let needle = format!("epoch {e} peak, step {s}: 1.00 GiB train.py:42 forward (+4)");
        assert!(svg.contains(&needle), "no {needle:?} in the SVG");
    }
    assert!(!svg.contains("step 99999"), "an untimed step is not drawn");
    assert!(
        // SVG escapes the apostrophe.
        svg.contains("1 torch epoch peak not drawn (its step&apos;s time unknown)"),
        "the untimed record is counted in the footer"
    );
    // Nothing of it without records.
    r.torch_attribution.clear();
    let svg = render(&r).unwrap();
    assert!(!svg.contains("torch epoch") && !svg.contains("peak, step"));
}

#[test]
fn torch_epoch_labels_are_bounded_in_count_and_width() {
    let mut r = crate::commands::run::phase_report::tests::run_with_phases(20, 13);
    let steps: Vec<(u64, u64)> = r
        .phases
        .iter()
        .filter(|p| p.kind == "epoch")
        .map(|p| (p.index, p.steps.peaks[0].index))
        .collect();
    let long = "f".repeat(200);
    r.torch_attribution = steps
        .iter()
        .map(|&(e, s)| torch_epoch(e, s, (e + 1) << 30, &[(1 << 30, long.as_str())]))
        .collect();
    let m = torch_marks::torch_marks(&r);
    assert_eq!(m.marks.len(), torch_marks::MAX_TORCH_MARKS);
    assert_eq!(m.unlabelled, 20 - torch_marks::MAX_TORCH_MARKS);
    // The highest peaks are the ones kept: epochs 19 down to 8.
    assert!(m.marks[0].text.starts_with("epoch 19 peak"));
    assert!(m.marks[11].text.starts_with("epoch 8 peak"));
    assert!(m
        .marks
        .iter()
        .all(|k| k.text.chars().count() == torch_marks::LABEL_CHARS && k.text.ends_with('…')));
    let svg = render(&r).unwrap();
    let drawn = texts(&svg)
        .into_iter()
        .filter(|t| t.2.contains("peak, step"))
        .count();
    assert_eq!(drawn, torch_marks::MAX_TORCH_MARKS);
    assert!(!svg.contains("epoch 7 peak"));
    assert!(svg.contains("8 more torch epoch peaks not marked (the 12 highest are)"));
}
