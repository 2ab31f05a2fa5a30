//! A C training loop (tests/c/test_run_phases.c, through the C ABI) under
//! `memprobe run`: its epochs, evaluation streams, steps and the step of
//! its one spike reach the run's summary, JSON and chart, and its worker
//! gets a line of its own on the chart.

#[path = "../../memprobe-cli/tests/cli/schema.rs"]
mod schema;

use memprobe_tests::{compile, root, scratch, target_dir, Build};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const MIB: u64 = 1 << 20;

/// Builds the `memprobe` command (dev profile) once.
fn memprobe() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-q", "-p", "memprobe-cli", "--bin", "memprobe"])
            .current_dir(root())
            .status()
            .expect("run cargo build -p memprobe-cli");
        assert!(status.success(), "cargo build -p memprobe-cli failed");
        target_dir().join("debug/memprobe")
    })
}

#[test]
fn a_c_training_loop_shows_its_epochs_and_the_step_of_its_spike() {
    let dir = scratch("run_phases");
    let prog = dir.join("test_run_phases");
    compile(
        &[root().join("tests/c/test_run_phases.c")],
        &prog,
        Build::Plain,
        &[],
    );
    let (json, svg) = (dir.join("run.json"), dir.join("run.svg"));
    let out = Command::new(memprobe())
        .args(["run", "--no-live", "--interval", "5ms", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .arg("--")
        .arg(&prog)
        .args(["20", "1"])
        .env_remove("MEMPROBE_RUN_CHANNEL")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(" passed, 0 failed"),
        "{text}"
    );

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    schema::assert_valid("docs/run-output.schema.json", &v);
    let pid = v["pid"].as_u64().unwrap();
    let c = &v["phase_channel"];
    assert_eq!(c["dropped"], 0, "{c}");
    assert_eq!(
        c["processes"],
        serde_json::json!([pid]),
        "only the trainer sent"
    );
    assert_eq!(c["steps"], 24, "{c}");
    let labels: Vec<&str> = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        [
            "epoch 0",
            "stream 0",
            "epoch 1",
            "stream 1",
            "epoch 2",
            "stream 2",
            "checkpoint 0"
        ]
    );
    for p in v["phases"].as_array().unwrap() {
        assert_eq!(p["ended"], true, "{p}");
        assert_eq!(p["sources"][0]["fidelity"], "exact", "{p}");
        assert!(p["end_s"].as_f64().unwrap() >= p["start_s"].as_f64().unwrap());
    }
    // The spike's epoch: its steps, and the one that held the peak, from
    // the program's exact process peaks.
    let e1 = &v["phases"][2];
    assert_eq!(e1["steps"]["count"], 8);
    assert_eq!(e1["steps"]["peaks"][0]["index"], 13, "{e1}");
    assert!(e1["sources"][0]["peak_bytes"].as_u64().unwrap() >= 256 * MIB);
    for quiet in [0, 4] {
        let p = &v["phases"][quiet];
        assert!(
            p["sources"][0]["peak_bytes"].as_u64().unwrap() < 200 * MIB,
            "no spike in {p}"
        );
    }
    // memprobe's own samples within the epoch saw the tree (the worker
    // included) at least as large as the worker alone.
    assert!(e1["run"]["samples"].as_u64().unwrap() >= 10, "{e1}");
    assert!(e1["run"]["tree_peak_bytes"].as_u64().unwrap() >= 48 * MIB);
    let peak = &c["peaks"][0];
    assert_eq!(peak["label"], "epoch 1 / step 13", "{peak}");
    assert_eq!(
        (peak["step_index"].as_u64(), peak["step_in_phase"].as_u64()),
        (Some(13), Some(5))
    );
    assert_eq!(peak["phase"], 2);
    assert!(peak["peak_bytes"].as_u64().unwrap() >= 256 * MIB);

    assert!(
        text.contains("3 streams, 3 epochs, 1 custom phase, 24 steps"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("peak rss "))
        .unwrap_or_else(|| panic!("no peak step line:\n{text}"));
    assert!(
        line.contains("in epoch 1, step 13 (#5 of its epoch), exact"),
        "{line}"
    );
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("epoch 1 "))
        .unwrap_or_else(|| panic!("no row for epoch 1:\n{text}"));
    assert!(row.contains("step 13 rss"), "{row}");

    let chart = std::fs::read_to_string(&svg).unwrap();
    for needle in [
        "epochs (shaded)",
        "evaluations (shaded): stream",
        "rss peak ",
        " in epoch 1, step 13",
        &format!("pid {pid} test_run_phases"),
    ] {
        assert!(chart.contains(needle), "no {needle:?} in the chart");
    }
    let worker = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["ppid"].as_u64() == Some(pid))
        .expect("the worker was seen");
    assert!(
        chart.contains(&format!("pid {} test_run_phases", worker["pid"])),
        "the worker has a line of its own"
    );
    // The same lines in the JSON: the command's and the worker's, over time.
    let lines = v["process_lines"]["lines"].as_array().unwrap();
    for p in [pid, worker["pid"].as_u64().unwrap()] {
        let line = lines
            .iter()
            .find(|l| l["pid"].as_u64() == Some(p))
            .unwrap_or_else(|| panic!("no line of pid {p} in {:#}", v["process_lines"]));
        let points = line["rss_points"].as_array().unwrap();
        assert!(points.len() >= 2, "{line:#}");
        let top = points.iter().filter_map(|x| x[1].as_u64()).max();
        assert_eq!(top, line["peak_rss_bytes"].as_u64(), "{line:#}");
    }
    assert!(v["process_lines"]["processes_seen"].as_u64() >= Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
