//! `memprobe run --gpu-exact=stacks:N --json`: each process's call paths at
//! its exact peak per device (`stacks_at_peak`), bounded, summing to the
//! peak; null under plain `--gpu-exact`. The program is
//! tests/interpose/stacks.c under the interposer and the fake driver, run
//! as gpu_origins_views.rs runs it.

use crate::gpu_origins_views;
use crate::schema::assert_valid;
use crate::support::{scratch, MIB};
use serde_json::Value;
use std::path::PathBuf;

/// `memprobe run MODE --json FILE -- stacks`, its checkpoints answered.
fn run_json(mode: &str) -> Value {
    let dir = scratch("stacks-json");
    let json: PathBuf = dir.join("run.json");
    let o = gpu_origins_views::run_stacks(mode, &["--json".as_ref(), json.as_os_str()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_valid("docs/run-output.schema.json", &v);
    let _ = std::fs::remove_dir_all(&dir);
    v
}

#[test]
fn run_json_has_the_call_paths_at_each_process_peak() {
    let v = run_json("--gpu-exact=stacks:2");
    let procs = v["gpu_exact"]["processes"].as_array().unwrap();
    let p = procs
        .iter()
        .find(|p| p["stacks_at_peak"][0].is_object())
        .unwrap_or_else(|| panic!("no process with paths: {procs:#?}"));
    let s = &p["stacks_at_peak"][0];
    // The peak: path_a 3 MiB and path_b 5 MiB through NCCL, the program's 2 MiB.
    assert_eq!(s["peak_bytes"], 10 * MIB);
    assert_eq!(s["peak_bytes"], p["peak_bytes"][0]);
    let paths = s["paths"].as_array().unwrap();
    let got: Vec<(Vec<&str>, u64)> = paths
        .iter()
        .map(|q| {
            let frames = q["frames"].as_array().unwrap();
            (
                frames.iter().map(|f| f.as_str().unwrap()).collect(),
                q["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (vec!["libfake_nccl.so!nccl_alloc", "stacks!path_b"], 5 * MIB),
            (vec!["libfake_nccl.so!nccl_alloc", "stacks!path_a"], 3 * MIB),
            (vec!["stacks!prog_alloc", "stacks!main"], 2 * MIB),
        ]
    );
    assert_eq!(s["rest"], serde_json::json!({"bytes": 0, "paths": 0}));

    // Plain --gpu-exact keeps origins only: null paths, per device.
    let v = run_json("--gpu-exact");
    for p in v["gpu_exact"]["processes"].as_array().unwrap() {
        let s = p["stacks_at_peak"].as_array().unwrap();
        assert_eq!(s.len(), p["peak_bytes"].as_array().unwrap().len());
        assert!(s.iter().all(Value::is_null), "{p}");
    }
}
