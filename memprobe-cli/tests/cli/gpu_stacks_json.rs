//! `memprobe run --gpu-exact=stacks:N --json`: each process's call paths at
//! its exact peak per device (`stacks_at_peak`), bounded, summing to the
//! peak; null under plain `--gpu-exact`. The program is
//! tests/interpose/stacks.c under the interposer and the fake driver.

use crate::fake_gpu_libs;
use crate::schema::assert_valid;
use crate::support::{memprobe, scratch, MIB};
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

/// `memprobe run --json FILE MODE -- stacks`, its checkpoints answered.
fn run_json(mode: &str) -> Value {
    let dir = scratch("stacks-json");
    fake_gpu_libs::build_interposer();
    fake_gpu_libs::origin_libs(&dir, &["nccl"]);
    let program = dir.join("stacks");
    fake_gpu_libs::origin_program(&dir, "stacks.c", &["nccl"], &["-rdynamic"], &program);
    let json: PathBuf = dir.join("run.json");
    let mut child = memprobe()
        .args(["run", mode, "--no-live", "--interval", "10ms", "--json"])
        .arg(&json)
        .arg("--")
        .arg(&program)
        .env("LD_LIBRARY_PATH", &dir)
        .env("FAKE_CUDA_DEVICES", "1")
        .env("MEMPROBE_GPU_BACKEND", "none")
        .env_remove("MEMPROBE_INTERPOSE_LIBRARY")
        .env_remove("MEMPROBE_GPU_EXACT")
        .env_remove("MEMPROBE_GPU_ORIGINS")
        .env_remove("MEMPROBE_GPU_EXACT_DIR")
        .env_remove("FAKE_CUDA_MEMORY")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"\n\n\n").unwrap();
    let o = child.wait_with_output().unwrap();
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
