//! `status`, `watch` and `gpus`.

use crate::exit_codes::wait_timeout;
use crate::schema::assert_valid;
use crate::support::*;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn status_json_parses_and_matches_the_schema() {
    let out = memprobe().args(["status", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_valid("docs/status-output.schema.json", &v);
    assert_eq!(v["kind"], "status");
    assert!(u(&v["system"]["total_bytes"]) > 0);
    assert!(u(&v["system"]["used_bytes"]) <= u(&v["system"]["total_bytes"]));
    assert!(v["cgroup"].is_object() || v["unavailable"]["cgroup"].is_string());
    // GPUs, or the reason there are none (on a machine without a driver).
    let gpus = v["gpus"].as_array().map_or(0, |a| a.len());
    assert!(gpus > 0 || v["unavailable"]["gpus"].is_string(), "{v}");
}

#[test]
fn status_table() {
    let out = memprobe().arg("status").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("SOURCE"), "{text}");
    assert!(text.contains("system RAM"), "{text}");
    assert!(text.contains("iB"), "human units: {text}");
    assert!(
        text.contains("GPU"),
        "a GPU row or the reason there is none: {text}"
    );
}

/// No NVML library: the GPUs cannot be read, whatever the machine has.
const NO_NVML: (&str, &str) = ("MEMPROBE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");

/// Without a readable GPU, `gpus` prints the reason `status` reports on
/// stderr and exits with 1; `gpus --json` prints its JSON document all the
/// same (no devices, the reason) on stdout, nothing on stderr, status 1.
#[test]
fn gpus_without_a_gpu_is_1_with_the_reason() {
    let status = memprobe()
        .args(["status", "--json"])
        .env(NO_NVML.0, NO_NVML.1)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let why = v["unavailable"]["gpus"]
        .as_str()
        .expect("no GPU without NVML");
    let out = memprobe()
        .arg("gpus")
        .env(NO_NVML.0, NO_NVML.1)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(stderr(&out), format!("memprobe: {why}\n"));

    let out = memprobe()
        .args(["gpus", "--json"])
        .env(NO_NVML.0, NO_NVML.1)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert_valid("docs/gpus-output.schema.json", &doc);
    assert_eq!(doc["kind"], "gpus");
    assert_eq!(doc["gpus"], serde_json::json!([]));
    assert_eq!(doc["unavailable"]["gpus"], why);
}

/// The reason the GPUs are unavailable is a paragraph; text for people shows
/// one short line (the whole reason with -v), in `status`, `watch` and the
/// summary of `run`. The JSON keeps it whole.
#[test]
fn unavailable_gpus_take_one_short_line_unless_verbose() {
    let gpu_line = |text: &str| -> String {
        text.lines()
            .find(|l| l.trim_start().starts_with("GPUs"))
            .unwrap_or_else(|| panic!("no GPUs line in {text}"))
            .to_string()
    };
    let status = memprobe()
        .arg("status")
        .env(NO_NVML.0, NO_NVML.1)
        .output()
        .unwrap();
    let line = gpu_line(&String::from_utf8_lossy(&status.stdout));
    assert!(line.len() <= 100 && line.contains("-v"), "{line}");
    let verbose = memprobe()
        .args(["status", "-v"])
        .env(NO_NVML.0, NO_NVML.1)
        .output()
        .unwrap();
    let long = gpu_line(&String::from_utf8_lossy(&verbose.stdout));
    assert!(
        long.len() > 150 && long.contains("MEMPROBE_NVML_LIBRARY"),
        "{long}"
    );

    let run = memprobe()
        .args(["run", "--", "true"])
        .env(NO_NVML.0, NO_NVML.1)
        .output()
        .unwrap();
    let line = gpu_line(&stderr(&run));
    assert!(line.len() <= 100 && line.contains("-v"), "{line}");
    let run = memprobe()
        .args(["run", "--verbose", "--", "true"])
        .env(NO_NVML.0, NO_NVML.1)
        .output()
        .unwrap();
    assert!(gpu_line(&stderr(&run)).contains("MEMPROBE_NVML_LIBRARY"));

    let out = memprobe()
        .args(["watch", "--interval", "50ms"])
        .env(NO_NVML.0, NO_NVML.1)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let first_block = read_first_watch_block(out);
    let line = gpu_line(&first_block);
    assert!(line.len() <= 100 && line.contains("-v"), "{line}");
}

/// The first block `watch` prints, then SIGINT.
fn read_first_watch_block(mut c: std::process::Child) -> String {
    let stdout = c.stdout.take().unwrap();
    let mut block = String::new();
    let mut seen = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if line.starts_with("--- memprobe watch ") {
            seen += 1;
            if seen == 2 {
                break;
            }
        }
        block.push_str(&line);
        block.push('\n');
    }
    // SAFETY: kill has no memory preconditions; the pid is our child.
    unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
    let status = wait_timeout(&mut c, Duration::from_secs(5));
    assert_eq!(status.code(), Some(0));
    block
}

/// With stdout a pipe, `watch` prints one block per interval; SIGINT ends
/// it cleanly.
#[test]
fn watch_prints_blocks_and_stops_on_sigint() {
    let mut c = memprobe()
        .args(["watch", "--interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = c.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if line.starts_with("--- memprobe watch ") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let start = Instant::now();
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("a block within 10 s");
    }
    assert!(start.elapsed() < Duration::from_secs(10));
    // SAFETY: kill has no memory preconditions; the pid is our child.
    unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
    let status = wait_timeout(&mut c, Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "clean exit on SIGINT");
    let all = reader.join().unwrap();
    assert!(all.contains("system RAM"), "{all}");
    assert!(all.contains("TOP PROCESSES BY RSS"), "{all}");
    assert!(!all.contains('\x1b'), "no terminal sequences on a pipe");
}
