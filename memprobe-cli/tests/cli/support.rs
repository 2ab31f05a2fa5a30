//! Running memprobe in tests.

use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) const MIB: u64 = 1 << 20;

/// The memprobe binary built with these tests.
pub(crate) fn memprobe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memprobe"))
}

/// A fresh, empty directory for one test.
pub(crate) fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "memprobe-cli-test-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Files in `dir`, sorted.
pub(crate) fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `memprobe run <opts> -- <helper child doing mode>`.
pub(crate) fn run_helper(opts: &[&str], mode: &[&str]) -> Output {
    let (argv, (k, v)) = crate::helper::argv(mode);
    let mut c = memprobe();
    c.arg("run").args(opts).arg("--").args(&argv).env(k, v);
    c.output().unwrap()
}

/// `memprobe run --json <tmp> <opts> -- <argv>`, its output and the JSON.
pub(crate) fn run_json(
    opts: &[&str],
    argv: &[OsString],
    env: Option<(&str, String)>,
) -> (Output, Value) {
    let dir = scratch("json");
    let json = dir.join("run.json");
    let mut c = memprobe();
    c.arg("run")
        .arg("--json")
        .arg(&json)
        .args(opts)
        .arg("--")
        .args(argv);
    if let Some((k, v)) = env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!(
            "no JSON written ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let v: Value = serde_json::from_str(&text).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (out, v)
}

/// `run_json` with the helper child doing `mode`.
pub(crate) fn run_helper_json(opts: &[&str], mode: &[&str]) -> (Output, Value) {
    let (argv, env) = crate::helper::argv(mode);
    run_json(opts, &argv, Some((env.0, env.1)))
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}
