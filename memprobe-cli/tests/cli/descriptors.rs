//! `memprobe run` under a low descriptor limit: the tree is followed whole
//! (three descriptors per process are kept open where the limit allows),
//! and the command keeps the limit it was given.

use crate::support::*;
use serde_json::Value;

/// `memprobe run --json` of 40 workers under `ulimit` settings `limits`;
/// the JSON and the soft limit the command saw.
fn run_limited(limits: &str) -> (Value, String) {
    let dir = scratch("nofile");
    let json = dir.join("run.json");
    let seen = dir.join("limit");
    let (argv, (k, v)) = crate::helper::argv(&["workers", "40", "1", "1500"]);
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{limits} && exec \"$@\"",))
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_memprobe"))
        .args(["run", "--no-live", "--json"])
        .arg(&json)
        .args(["--", "sh", "-c", "ulimit -Sn > \"$0\" && exec \"$@\""])
        .arg(&seen)
        .args(&argv)
        .env(k, v)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let limit = std::fs::read_to_string(&seen).unwrap().trim().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    crate::schema::assert_valid("docs/run-output.schema.json", &doc);
    (doc, limit)
}

fn workers(doc: &Value) -> usize {
    let root = u(&doc["pid"]);
    doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["ppid"].as_u64() == Some(root))
        .count()
}

/// A soft limit of 64 under a high hard one: memprobe raises its own, the
/// command still runs under 64, and all 40 workers are followed.
#[test]
fn a_low_soft_limit_is_raised_for_memprobe_only() {
    let (doc, limit) = run_limited("ulimit -Sn 64");
    assert_eq!(limit, "64", "the command's limit");
    assert_eq!(workers(&doc), 40, "{}", doc["processes"]);
    assert!(
        doc["unavailable"].get("tree_descriptors").is_none(),
        "{}",
        doc["unavailable"]
    );
}

/// A hard limit of 64 too: memprobe keeps what fits and reads the rest by
/// path, follows all 40 workers, and says so.
#[test]
fn without_descriptors_the_tree_is_read_by_path_and_said() {
    let (doc, limit) = run_limited("ulimit -Sn 64 && ulimit -Hn 64");
    assert_eq!(limit, "64");
    assert_eq!(workers(&doc), 40, "{}", doc["processes"]);
    let why = doc["unavailable"]["tree_descriptors"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", doc["unavailable"]));
    assert!(why.contains("RLIMIT_NOFILE"), "{why}");
    // Each worker's exact peak still read (its 1 MiB touched).
    let root = u(&doc["pid"]);
    for p in doc["processes"].as_array().unwrap() {
        if p["ppid"].as_u64() == Some(root) {
            assert!(u(&p["peak_rss_bytes"]) >= 1 << 20, "{p}");
        }
    }
}
