//! `memprobe gpus`, `status` and `run` against the fake NVML library
//! (tests/fake-gpu/fake_nvml.c), compiled here for each test.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "cli/schema.rs"]
mod schema;

fn fake_nvml(script: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-gpu-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libnvidia-ml.so.1");
    let o = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&lib)
        .arg(root.join("tests/fake-gpu/fake_nvml.c"))
        .arg("-lpthread")
        .output()
        .expect("run cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::write(dir.join("fake_nvml.script"), script).unwrap();
    lib
}

fn memprobe(lib: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memprobe"))
        .args(args)
        .env("MEMPROBE_NVML_LIBRARY", lib)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("MEMPROBE_GPU_BACKEND")
        .output()
        .expect("run memprobe")
}

const TWO: &str = "devices 2\n\
device 0 name NVIDIA H100 80GB HBM3\n\
device 0 total 85899345920\n\
device 0 used 1073741824\n\
device 0 reserved 536870912\n\
device 0 procs 4242:1073741824\n\
device 1 name NVIDIA H100 80GB HBM3\n\
device 1 total 85899345920\n\
device 1 used 2147483648\n";

#[test]
fn gpus_json_lists_devices_as_cuda_numbers_them() {
    let lib = fake_nvml(TWO, "json");
    let o = memprobe(&lib, &["gpus", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    schema::assert_valid("docs/gpus-output.schema.json", &v);
    assert_eq!(v["gpus"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["unavailable"], serde_json::json!({}));
    let text = v.to_string();
    assert!(text.contains("NVIDIA H100 80GB HBM3"), "{text}");
    assert!(
        text.contains("85899345920") && text.contains("1073741824") && text.contains("536870912"),
        "{text}"
    );
    assert!(text.contains("4242"), "the process list is shown: {text}");
    let table = memprobe(&lib, &["gpus"]);
    assert!(table.status.success());
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(t.contains("NVIDIA H100") && t.lines().count() >= 3, "{t}");
}

#[test]
fn cuda_visible_devices_hides_and_reorders() {
    let lib = fake_nvml(TWO, "cvd");
    let o = Command::new(env!("CARGO_BIN_EXE_memprobe"))
        .args(["gpus", "--json"])
        .env("MEMPROBE_NVML_LIBRARY", &lib)
        .env("CUDA_VISIBLE_DEVICES", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("2147483648") && !text.contains("1073741824"),
        "only physical device 1, as index 0: {text}"
    );
}

#[test]
fn run_reports_gpu_peaks_per_device() {
    // Device 0's usage steps per query: a peak of 6 GiB in the middle.
    let script =
        "devices 1\ndevice 0 total 85899345920\ndevice 0 used 1073741824 6442450944 1073741824\n";
    let lib = fake_nvml(script, "run");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let json = dir.join(format!("gpu-run-{}.json", std::process::id()));
    let o = memprobe(
        &lib,
        &[
            "run",
            "--interval",
            "5ms",
            "--no-live",
            "--json",
            json.to_str().unwrap(),
            "--",
            "sleep",
            "0.2",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = String::from_utf8_lossy(&o.stderr);
    assert!(summary.to_lowercase().contains("gpu"), "{summary}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let text = v.to_string();
    assert!(
        text.contains("6442450944"),
        "the GPU peak is in the JSON: {text}"
    );
    let _ = std::fs::remove_file(json);
}

#[test]
fn no_gpu_is_a_clear_message() {
    let o = Command::new(env!("CARGO_BIN_EXE_memprobe"))
        .args(["gpus"])
        .env("MEMPROBE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("NVML") && !err.contains("unavailable: unavailable"),
        "{err}"
    );
}
