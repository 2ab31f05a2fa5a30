//! `memprobe run --gpu-exact`: what held the tree's GPU memory by origin at
//! its exact peak and at each phase's peak, against the fake driver
//! (tests/fake-gpu/fake_cuda.c) with an NCCL-like library allocating beside
//! the program (tests/interpose/tree_origins.c, origin_lib.c): exact to the
//! byte where it is known, "unknown" with its reason where it is not.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

#[path = "cli/fake_gpu_libs.rs"]
mod fake_gpu_libs;
#[path = "cli/schema.rs"]
mod schema;

const MIB: u64 = 1 << 20;

fn scratch() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cli-gpu-origins-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    })
    .clone()
}

/// The directory of the fake driver and libraries, and the program.
fn built() -> &'static (PathBuf, PathBuf) {
    static B: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    B.get_or_init(|| {
        fake_gpu_libs::build_interposer();
        let dir = scratch().join("lib");
        fake_gpu_libs::origin_libs(&dir, &["nccl"]);
        let program = scratch().join("tree_origins");
        fake_gpu_libs::origin_program(&dir, "tree_origins.c", &["nccl"], &[], &program);
        (dir, program)
    })
}

/// `memprobe run --gpu-exact --interval 10ms --json FILE -- tree_origins
/// MODE`: the output and the JSON document (checked against the schema).
fn run(mode: &str) -> (Output, Value) {
    run_with(mode, &[])
}

/// [`run`] with more options of `memprobe run`.
fn run_with(mode: &str, extra: &[&str]) -> (Output, Value) {
    let (dir, program) = built();
    let json = scratch().join(format!("{mode}.json"));
    let o = Command::new(env!("CARGO_BIN_EXE_memprobe"))
        .args(["run", "--gpu-exact", "--no-live", "--interval", "10ms"])
        .arg("--json")
        .arg(&json)
        .args(extra)
        .arg("--")
        .arg(program)
        .arg(mode)
        .env("LD_LIBRARY_PATH", dir)
        .env("FAKE_CUDA_DEVICES", "1")
        .env("MEMPROBE_GPU_BACKEND", "none")
        .env_remove("MEMPROBE_INTERPOSE_LIBRARY")
        .env_remove("MEMPROBE_GPU_EXACT")
        .env_remove("MEMPROBE_GPU_ORIGINS")
        .env_remove("MEMPROBE_GPU_EXACT_DIR")
        .env_remove("FAKE_CUDA_MEMORY")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run memprobe");
    assert!(
        o.status.success(),
        "memprobe run failed: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let errors = schema::check(&schema::load("docs/run-output.schema.json"), &v);
    assert!(errors.is_empty(), "{errors:#?}");
    (o, v)
}

/// `{name: bytes}` of a breakdown, in MiB.
fn by_name(b: &Value) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = b["by_origin"]
        .as_array()
        .unwrap_or_else(|| panic!("no breakdown: {b:#}"))
        .iter()
        .map(|o| {
            (
                o["name"].as_str().unwrap().to_owned(),
                o["bytes"].as_u64().unwrap() / MIB,
            )
        })
        .collect();
    v.sort();
    v
}

fn line<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(&format!("  {label}")))
        .unwrap_or_else(|| panic!("no '{label}' line in\n{text}"))
}

#[test]
fn two_processes_holding_at_once_are_split_by_origin_at_a_tick() {
    let (o, v) = run("two");
    let d = &v["gpu_exact"]["devices"][0];
    assert_eq!(d["tree_peak_bytes"], 10 * MIB, "{d:#}");
    // Neither process alone held 10: the split was seen whole at a tick.
    assert_eq!(d["max_process_peak_bytes"], 6 * MIB, "{d:#}");
    let at = &d["origins_at_tree_peak"];
    assert_eq!(at["found"], "at_tick", "{d:#}");
    assert_eq!(at["peak_bytes"], 10 * MIB);
    assert_eq!(
        by_name(at),
        vec![("libfake_nccl.so".into(), 4), ("the program".into(), 6)]
    );
    assert!(at["at_s"].as_f64().unwrap() > 0.0);
    assert_eq!(d["origins_at_tree_peak_unknown"], Value::Null);
    let text = String::from_utf8_lossy(&o.stderr);
    let l = line(&text, "  at GPU 0's peak");
    assert!(
        l.contains("10.0 MiB: the program 6.00 MiB, libfake_nccl.so 4.00 MiB; CUDA context and unseen unknown"),
        "{l}"
    );
}

#[test]
fn a_peak_of_two_processes_between_ticks_is_unknown_not_guessed() {
    let (o, v) = run("two-spike");
    let d = &v["gpu_exact"]["devices"][0];
    assert_eq!(d["tree_peak_bytes"], 11 * MIB, "{d:#}");
    assert_eq!(d["origins_at_tree_peak"], Value::Null, "{d:#}");
    let why = d["origins_at_tree_peak_unknown"].as_str().unwrap();
    assert!(why.contains("no tick saw the tree at it"), "{why}");
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(
        line(&text, "  at GPU 0's peak").contains("by origin unknown: several processes"),
        "{text}"
    );
}

#[test]
fn each_epoch_keeps_what_held_its_own_peak() {
    let svg = scratch().join("epochs.svg");
    let (o, v) = run_with("epochs", &["--plot", svg.to_str().unwrap()]);
    let d = &v["gpu_exact"]["devices"][0];
    // The spike of epoch 2 is the process's and the tree's peak: its own
    // breakdown, copied by the interposer at that allocation.
    assert_eq!(d["tree_peak_bytes"], 24 * MIB, "{d:#}");
    let at = &d["origins_at_tree_peak"];
    assert_eq!(at["found"], "one_process", "{d:#}");
    assert_eq!(
        by_name(at),
        vec![("libfake_nccl.so".into(), 16), ("the program".into(), 8)]
    );
    assert_eq!(at["phase"], "epoch 2 / step 0", "{at:#}");
    let epochs: Vec<&Value> = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "epoch")
        .collect();
    assert_eq!(epochs.len(), 3, "{:#}", v["phases"]);
    let want: [(u64, Vec<(String, u64)>); 3] = [
        (8, vec![("the program".into(), 8)]),
        (
            12,
            vec![("libfake_nccl.so".into(), 4), ("the program".into(), 8)],
        ),
        (
            24,
            vec![("libfake_nccl.so".into(), 16), ("the program".into(), 8)],
        ),
    ];
    for (e, (peak, split)) in epochs.iter().zip(want) {
        let run = &e["run"];
        assert_eq!(run["gpu_exact_peak_bytes"][0], peak * MIB, "{e:#}");
        let b = &run["gpu_origins_at_peak"][0];
        assert_eq!(b["peak_bytes"], peak * MIB, "{e:#}");
        assert_eq!(by_name(b), split, "{e:#}");
    }
    // The step around the spike (shorter than a tick) has it too: the
    // tree's peak fell inside it.
    let step = v["phase_channel"]["peaks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["source"] == "gpu_exact:0")
        .unwrap_or_else(|| panic!("no peak step: {:#}", v["phase_channel"]));
    assert_eq!(step["label"], "epoch 2 / step 0", "{step:#}");
    assert_eq!(
        by_name(&step["gpu_origins_at_peak"][0]),
        vec![("libfake_nccl.so".into(), 16), ("the program".into(), 8)]
    );
    let text = String::from_utf8_lossy(&o.stderr);
    let l = line(&text, "  at GPU 0's peak");
    assert!(
        l.contains("24.0 MiB in epoch 2 / step 0: libfake_nccl.so 16.0 MiB, the program 8.00 MiB;"),
        "{l}"
    );
    // The chart's GPU peak says what held it.
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(
        svg.contains("held by libfake_nccl.so 16.0 MiB, the program 8.00 MiB"),
        "no breakdown at the chart's GPU peak"
    );
}
