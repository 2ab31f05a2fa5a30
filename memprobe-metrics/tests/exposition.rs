//! What a scrape contains: sources, phases, releases, leaks, DCGM GPU
//! gauges, labels; and that `promtool check metrics` accepts it.

mod common;

#[path = "../../tests/src/fake_gpu.rs"]
#[allow(dead_code, unreachable_pub)]
mod fake_gpu;

use common::value;
use memprobe_core::LeakPolicy;
use memprobe_core::{PhaseKind, Source, Tracker};
use memprobe_core::{ReleaseKind, ReleasePolicy};
use memprobe_gpu::{GpuBackend, GpuConfig, Gpus};
use memprobe_metrics::{Exporter, ExporterOptions, Rank};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn exporter() -> Exporter {
    Exporter::start(ExporterOptions {
        hostname: Some("node-a".into()),
        rank: Some(Rank {
            rank: Some(1),
            local_rank: Some(1),
            world_size: Some(2),
        }),
        ..ExporterOptions::default()
    })
    .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memprobe-metrics-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fake_gpus(devices: u32) -> &'static Gpus {
    let dir = scratch(&format!("gpu{devices}"));
    let lib = dir.join("libnvidia-ml.so.1");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-gpu");
    fake_gpu::compile_fake(&root, "fake_nvml.c", &[], &lib);
    let mut script = format!("devices {devices}\n");
    for i in 0..devices {
        script += &format!(
            "device {i} name NVIDIA Fake {i}\ndevice {i} total {}\ndevice {i} used {}\ndevice {i} procs 4242:{}\n",
            80 * 1024 * MIB,
            (i as u64 + 1) * 1000 * MIB + 12345,
            (i as u64 + 1) * MIB
        );
    }
    std::fs::write(dir.join("fake_nvml.script"), script).unwrap();
    let gpus = Gpus::open(GpuConfig {
        backend: GpuBackend::Nvml,
        nvml_path: Some(lib),
        ..GpuConfig::default()
    })
    .unwrap();
    Box::leak(Box::new(gpus))
}

/// A tracker over a pushed source, with a release every 2 steps and a leak
/// policy; 3 steps in one epoch, then a second epoch.
fn trained(e: &Exporter) -> (Tracker, Source) {
    let act = Source::pushed("act").unwrap();
    let mut t = Tracker::new(std::slice::from_ref(&act)).unwrap();
    let released = Arc::new(AtomicU64::new(0));
    let r = Arc::clone(&released);
    let a = act.clone();
    t.add_release(
        "cache",
        ReleaseKind::Cache,
        Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            a.push(10 * MIB)
        }),
    )
    .unwrap();
    t.add_release_policy(ReleasePolicy::Every {
        kind: PhaseKind::Step,
        n: 2,
        gc: false,
    })
    .unwrap();
    t.set_leak_policy(Some(LeakPolicy {
        threshold: 0,
        epochs: 1,
    }))
    .unwrap();
    e.watch(&mut t).unwrap();
    for epoch in 0..2u64 {
        t.begin(PhaseKind::Epoch, None).unwrap();
        t.begin(PhaseKind::Step, None).unwrap();
        for step in 0..3u64 {
            act.push(10 * MIB).unwrap();
            act.push((100 + step) * MIB).unwrap();
            act.push((20 + epoch) * MIB).unwrap();
            t.next(PhaseKind::Step, None).unwrap();
        }
        t.end(PhaseKind::Step, None).unwrap();
        act.push((30 + 10 * epoch) * MIB).unwrap();
        t.end(PhaseKind::Epoch, None).unwrap();
    }
    (t, act)
}

#[test]
fn phases_sources_releases_leaks() {
    let e = exporter();
    let (_t, _act) = trained(&e);
    let text = e.render();
    let common = r#"hostname="node-a",rank="1",local_rank="1",world_size="2"}"#;
    let l = |s: &str| format!("{s},{common}");
    // Steps are counted over the tracker's life: 4 per epoch (3 `next`s
    // and an `end`), so the last ended step has index 7.
    assert_eq!(
        value(&text, &l(r#"memprobe_phase_index{phase="step""#)),
        Some(7.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            &l(r#"memprobe_phase_peak_bytes{phase="epoch",source="act",kind="custom""#)
        ),
        Some(102.0 * MIB as f64),
        "{text}"
    );
    assert_eq!(
        value(&text, &l(r#"memprobe_phase_index{phase="epoch""#)),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            &l(r#"memprobe_source_used_bytes{source="act",kind="custom""#)
        ),
        Some(40.0 * MIB as f64)
    );
    assert_eq!(
        value(
            &text,
            &l(r#"memprobe_source_up{source="act",kind="custom""#)
        ),
        Some(1.0)
    );
    // Steps 1 and 3 of each epoch (indices 1, 3, 5, 7) ended with a release.
    let releases = value(&text, "memprobe_cache_releases_total{").unwrap();
    assert!(releases >= 3.0, "{text}");
    assert!(
        value(
            &text,
            &l(r#"memprobe_cache_released_bytes_total{source="act""#)
        )
        .unwrap()
            > 0.0
    );
    // Epoch ends grew 30 -> 40 MiB: flagged after one growing epoch.
    assert_eq!(
        value(&text, &l(r#"memprobe_leak_flagged{source="act""#)),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&text, &l(r#"memprobe_leak_streak_epochs{source="act""#)),
        Some(1.0)
    );
    for family in [
        "# HELP memprobe_phase_peak_bytes ",
        "# TYPE memprobe_phase_peak_bytes gauge",
        "# TYPE memprobe_phase_delta_used_bytes gauge",
        "# TYPE memprobe_phase_delta_peaked_bytes gauge",
        "# TYPE memprobe_phase_duration_seconds gauge",
        "# TYPE memprobe_cache_releases_total counter",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    promtool_accepts(&text);
}

#[test]
fn rank_from_env_shape_and_rank_change() {
    let e = exporter();
    e.set_rank(Rank::default()).unwrap();
    let s = Source::pushed("x").unwrap();
    s.push(5).unwrap();
    e.add_source(&s).unwrap();
    e.add_source(&s).unwrap();
    let text = e.render();
    assert_eq!(
        text.matches("memprobe_source_used_bytes{").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains(
            r#"memprobe_source_used_bytes{source="x",kind="custom",hostname="node-a"} 5"#
        ),
        "{text}"
    );
}

#[test]
fn dcgm_gauges_in_mib_with_dcgm_labels() {
    let e = exporter();
    e.set_gpus(Some(fake_gpus(2)), true).unwrap();
    let ram = Source::system_ram().unwrap();
    e.add_source(&ram).unwrap();
    let text = e.render();
    let want = r#"DCGM_FI_DEV_FB_USED{gpu="1",UUID=""#;
    let line = text
        .lines()
        .find(|l| l.starts_with(want))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(r#"modelName="NVIDIA Fake 1",Hostname="node-a",rank="1""#),
        "{line}"
    );
    assert!(line.ends_with(" 2000"), "{line}");
    assert!(text.contains("# TYPE DCGM_FI_DEV_FB_FREE gauge"));
    assert!(text.contains("# TYPE DCGM_FI_DEV_FB_TOTAL gauge"));
    assert!(
        text.contains(r#"memprobe_gpu_process_used_bytes{gpu="0",UUID=""#),
        "{text}"
    );
    assert!(value(&text, r#"memprobe_source_total_bytes{source="#).unwrap() > 0.0);
    promtool_accepts(&text);
}

/// `promtool check metrics` finds no format error. Its style lint is
/// allowed one complaint only: DCGM's camel-case `modelName` label, which
/// dashboards rely on.
pub(crate) fn promtool_accepts(text: &str) {
    if !common::required_tool::require(
        "promtool check metrics",
        &["promtool"],
        "apt-get install prometheus",
    ) {
        return;
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let unexpected: Vec<&str> = out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !l.contains("label names should be written in 'snake_case' not 'camelCase'"))
        .collect();
    assert!(
        matches!(o.status.code(), Some(0) | Some(3)) && unexpected.is_empty(),
        "promtool check metrics ({:?}):\n{out}\n--- input\n{text}",
        o.status
    );
}
