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

/// Without a readable GPU (today: a build without GPU support), `gpus`
/// prints the reason `status` reports and exits with 1.
#[test]
fn gpus_without_a_gpu_is_1_with_the_reason() {
    let status = memprobe().args(["status", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let Some(why) = v["unavailable"]["gpus"].as_str() else {
        return; // This machine has GPUs.
    };
    for args in [vec!["gpus"], vec!["gpus", "--json"]] {
        let out = memprobe().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(out.stdout.is_empty());
        assert_eq!(stderr(&out), format!("memprobe: {why}\n"));
    }
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
