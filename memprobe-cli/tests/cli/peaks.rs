//! Exact peaks: spikes too short for any sampling interval, and worker
//! processes.

use crate::support::*;
use serde_json::Value;

const SPIKE_MIB: u64 = 256;

fn process(json: &Value, pid: u64) -> &Value {
    json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| u(&p["pid"]) == pid)
        .unwrap_or_else(|| panic!("no process {pid} in {}", json["processes"]))
}

/// The child allocates and touches 256 MiB and exits at once: the whole
/// spike lasts well under a millisecond at its top. With a 1 s interval no
/// sample can see it; `wait4`'s ru_maxrss does.
#[test]
fn spike_right_before_exit_is_exact() {
    let (out, json) = run_helper_json(&["--interval", "1s"], &["spike-exit", "256"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let peak = &json["peak_process"];
    assert!(
        u(&peak["peak_rss_bytes"]) >= SPIKE_MIB * MIB,
        "peak {} < 256 MiB: {json}",
        peak["peak_rss_bytes"]
    );
    assert_eq!(u(&peak["pid"]), u(&json["pid"]));
    assert_eq!(peak["peak_source"], "rusage");
    assert!(
        max_sampled(&json) < SPIKE_MIB * MIB,
        "a sample caught it, so this proves nothing: {json}"
    );
    // The tree's peak is never below a member's exact peak.
    assert!(u(&json["tree"]["peak_rss_bytes"]) >= u(&peak["peak_rss_bytes"]));
    let err = stderr(&out);
    assert!(err.contains("peak single process"), "{err}");
    assert!(err.contains("exact"), "{err}");
}

/// The child spikes, frees the memory and keeps running: the kernel's
/// high-water mark read at the next tick holds the spike.
#[test]
fn spike_in_the_middle_is_exact() {
    let (out, json) = run_helper_json(&["--interval", "1s"], &["spike-then-run", "256", "1500"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let child = process(&json, u(&json["pid"]));
    assert!(
        u(&child["vmhwm_bytes"]) >= SPIKE_MIB * MIB,
        "VmHWM missed the spike: {child}"
    );
    assert!(u(&json["peak_process"]["peak_rss_bytes"]) >= SPIKE_MIB * MIB);
}

/// A worker (a grandchild, so no rusage for it) spikes early and keeps
/// running; its VmHWM read while it lives carries the spike. The worker is
/// forked by a thread other than the main one (the test harness runs the
/// helper on a thread of its own), so this also checks that children of
/// every thread are found.
#[test]
fn worker_spike_is_exact() {
    let (out, json) = run_helper_json(&["--interval", "1s"], &["worker-spike", "256", "1800"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let root = u(&json["pid"]);
    let worker = the_worker(&json, root);
    assert_eq!(worker["peak_source"], "vmhwm");
    assert!(
        u(&worker["peak_rss_bytes"]) >= SPIKE_MIB * MIB,
        "worker peak {worker}"
    );
    assert_eq!(json["peak_process"]["pid"], worker["pid"]);
    // The command reaped the worker: its ru_maxrss is the worker's spike,
    // which is never credited to the command itself.
    let command = process(&json, root);
    assert_eq!(command["rusage_includes_children"], true, "{command}");
    assert_eq!(command["peak_source"], "vmhwm", "{command}");
    assert!(
        u(&command["peak_rss_bytes"]) < SPIKE_MIB * MIB / 2,
        "the worker's spike credited to the command: {command}"
    );
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("peak single process"))
        .unwrap_or_default();
    assert!(line.contains(&format!("pid {}", worker["pid"])), "{err}");
    assert!(
        max_sampled(&json) < SPIKE_MIB * MIB,
        "a sample caught the spike, so this proves nothing"
    );
    assert!(u(&json["tree"]["peak_rss_bytes"]) >= u(&worker["peak_rss_bytes"]));
}

/// The largest tree RSS any sample saw.
fn max_sampled(json: &Value) -> u64 {
    json["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u(&p["tree_rss_bytes"]))
        .max()
        .unwrap_or(0)
}

/// A command that ends before any sample sees it whole (`false`): the
/// tree's peak is still at least the command's exact peak from `wait4`,
/// never the near-zero the samples saw.
#[test]
fn tree_peak_is_never_below_a_process_peak() {
    for _ in 0..5 {
        let (out, json) = run_json(&["--interval", "1s"], &["false".into()], None);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        crate::schema::assert_valid("docs/run-output.schema.json", &json);
        let exact = u(&json["peak_process"]["peak_rss_bytes"]);
        assert!(exact > 0, "{json}");
        let tree = &json["tree"];
        assert!(
            u(&tree["peak_rss_bytes"]) >= exact,
            "tree {tree} below the process's exact {exact}"
        );
        let max = json["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| u(&p["peak_rss_bytes"]))
            .max()
            .unwrap();
        assert!(u(&tree["peak_rss_bytes"]) >= max, "{json}");
        if u(&tree["peak_rss_bytes"]) > max_sampled(&json) {
            assert!(tree["peak_at_s"].is_null(), "no sample saw it: {tree}");
            assert!(
                stderr(&out).contains("at least one of its processes' exact peak"),
                "{}",
                stderr(&out)
            );
        }
    }
}

/// Workers forked by the child count in the tree and have their own peaks.
#[test]
fn tree_includes_workers() {
    let (out, json) = run_helper_json(&["--interval", "10ms"], &["workers", "2", "64", "800"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let root = u(&json["pid"]);
    let workers: Vec<&Value> = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["ppid"].as_u64() == Some(root))
        .collect();
    assert_eq!(workers.len(), 2, "{}", json["processes"]);
    for w in &workers {
        assert!(u(&w["peak_rss_bytes"]) >= 64 * MIB, "{w}");
        assert_eq!(w["exited"], true);
    }
    assert!(u(&json["tree"]["max_processes"]) >= 3);
    assert!(
        u(&json["tree"]["peak_rss_bytes"]) >= 2 * 64 * MIB,
        "tree peak {}",
        json["tree"]
    );
    let max_point = json["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u(&p["tree_rss_bytes"]))
        .max()
        .unwrap();
    assert_eq!(max_point, u(&json["tree"]["peak_rss_bytes"]));
    assert_eq!(u(&json["processes_seen"]), 3);
}

/// A worker (a grandchild: no rusage of its own) is sampled small, then
/// spikes in its last interval and exits before the next tick: no sample
/// and no `VmHWM` read while it lived can see the spike. The kernel's exit
/// record (taskstats) holds it: the worker's peak is exact.
#[test]
fn worker_spike_in_its_last_interval_is_exact() {
    let (out, json) = run_helper_json(
        &["--interval", "1s"],
        &["worker-spike-exit", "256", "1300", "1200"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let x = &json["exit_hwm"];
    if x["available"] == false {
        // Registering for exit records needs CAP_NET_ADMIN in the initial
        // namespaces: without it the JSON says why, and nothing else can.
        assert!(
            x["reason"]
                .as_str()
                .is_some_and(|r| r.contains("taskstats")),
            "{x}"
        );
        eprintln!("skipped: {}", x["reason"]);
        return;
    }
    let root = u(&json["pid"]);
    let worker = the_worker(&json, root);
    assert!(
        u(&worker["max_sampled_rss_bytes"]) < SPIKE_MIB * MIB / 2
            && worker["vmhwm_bytes"].as_u64().unwrap_or(0) < SPIKE_MIB * MIB / 2,
        "a sample or VmHWM read caught the spike, so this proves nothing: {worker}"
    );
    assert_eq!(worker["peak_source"], "exit_hwm", "{worker}");
    assert!(
        u(&worker["peak_rss_bytes"]) >= SPIKE_MIB * MIB,
        "worker peak {worker}"
    );
    assert_eq!(worker["exit_hwm_bytes"], worker["peak_rss_bytes"]);
    assert_eq!(json["peak_process"]["pid"], worker["pid"]);
    assert!(u(&json["tree"]["peak_rss_bytes"]) >= u(&worker["peak_rss_bytes"]));
    assert!(u(&x["raised"]) >= 1 && u(&x["processes"]) >= 2, "{x}");
    let err = stderr(&out);
    assert!(err.contains("high-water mark at its exit"), "{err}");
}

/// A worker whose main thread ends (`pthread_exit`) while another thread
/// lives on is still followed: its peak is the 64 MiB that thread touched
/// 300 ms later, and it is seen to the end of that thread.
#[test]
fn a_worker_outliving_its_main_thread_is_followed() {
    let (out, json) = run_helper_json(&["--interval", "10ms"], &["leader-exits", "64", "700"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let root = u(&json["pid"]);
    let worker = the_worker(&json, root);
    assert!(u(&worker["peak_rss_bytes"]) >= 64 * MIB, "{worker}");
    let lived = worker["last_seen_s"].as_f64().unwrap() - worker["first_seen_s"].as_f64().unwrap();
    assert!(lived >= 0.9, "seen for {lived} s only: {worker}");
}

/// The process of the run whose parent is `root`.
fn the_worker(json: &Value, root: u64) -> &Value {
    json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["ppid"].as_u64() == Some(root))
        .unwrap_or_else(|| panic!("worker not seen: {json}"))
}

/// A command that execs and ends before a sample reads it again: where the
/// kernel's exit records can be had, it is named as it ended (`true`), not
/// as it was first read (`sh`).
#[test]
fn a_process_is_named_as_it_ended() {
    let argv: Vec<std::ffi::OsString> = ["sh", "-c", "sleep 0.3 && exec true"]
        .iter()
        .map(Into::into)
        .collect();
    let (out, json) = run_json(&["--interval", "1s"], &argv, None);
    assert!(out.status.success(), "{}", stderr(&out));
    if json["exit_hwm"]["available"] == false {
        eprintln!("skipped: {}", json["exit_hwm"]["reason"]);
        return;
    }
    let root = &json["processes"][0];
    assert_eq!(root["pid"], json["pid"], "{json}");
    assert_eq!(root["name"], "true", "{root}");
}
