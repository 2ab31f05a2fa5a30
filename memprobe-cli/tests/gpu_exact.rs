//! `memprobe run --gpu-exact` against the fake driver
//! (tests/fake-gpu/fake_cuda.c) and the interposer built by the workspace:
//! a process tree's exact GPU peaks per process and for the tree, through
//! fork, fork + exec and a killed child; spikes of microseconds caught in
//! every try; a clear error, before the command starts, without the
//! interposer.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

#[path = "cli/schema.rs"]
mod schema;

const MIB: u64 = 1 << 20;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn scratch() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cli-gpu-exact-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    })
    .clone()
}

fn cc(args: &[&str], out: &Path) {
    let o = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

struct Built {
    /// The directory holding the fake driver as libcuda.so.1.
    driver: PathBuf,
    /// tests/interpose/tree.c.
    program: PathBuf,
}

/// The fake driver, the test program and the interposer (built beside the
/// memprobe binary, where `--gpu-exact` looks first), once.
fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-q", "-p", "memprobe-interpose-preload"])
            .current_dir(root())
            .status()
            .expect("run cargo build");
        assert!(
            st.success(),
            "cargo build -p memprobe-interpose-preload failed"
        );
        let exe_dir = Path::new(env!("CARGO_BIN_EXE_memprobe")).parent().unwrap();
        assert!(
            exe_dir.join("libmemprobe_interpose.so").is_file(),
            "the interposer is not beside {}",
            env!("CARGO_BIN_EXE_memprobe")
        );
        let dir = scratch();
        let driver = dir.join("driver");
        std::fs::create_dir_all(&driver).unwrap();
        // -Bsymbolic: the driver's calls to its own functions stay inside it.
        let fake = root().join("tests/fake-gpu/fake_cuda.c");
        let lib = driver.join("libcuda.so.1");
        cc(
            &[
                "-shared",
                "-fPIC",
                "-Wl,-soname,libcuda.so.1",
                "-Wl,-Bsymbolic",
                fake.to_str().unwrap(),
                "-lpthread",
            ],
            &lib,
        );
        let program = dir.join("tree");
        let src = root().join("tests/interpose/tree.c");
        let inc = format!("-I{}", root().join("tests/interpose").display());
        cc(&[&inc, src.to_str().unwrap(), "-ldl"], &program);
        Built { driver, program }
    })
}

/// `memprobe run --gpu-exact --json FILE -- tree MODE ARGS`: the output and
/// the JSON document.
fn run(name: &str, mode_args: &[&str], extra: &[&str]) -> (Output, Value) {
    run_env(name, mode_args, extra, &[])
}

/// [`run`] with more environment (set last: it overrides the defaults).
fn run_env(
    name: &str,
    mode_args: &[&str],
    extra: &[&str],
    env: &[(&str, &Path)],
) -> (Output, Value) {
    let b = built();
    let json = scratch().join(format!("{name}.json"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memprobe"));
    cmd.args(["run", "--gpu-exact", "--no-live", "--json"])
        .arg(&json)
        .args(extra)
        .arg("--")
        .arg(&b.program)
        .args(mode_args)
        .env("LD_LIBRARY_PATH", &b.driver)
        .env("FAKE_CUDA_DEVICES", "2")
        .env("MEMPROBE_GPU_BACKEND", "none")
        .env_remove("MEMPROBE_INTERPOSE_LIBRARY")
        .env_remove("MEMPROBE_GPU_EXACT")
        .env_remove("MEMPROBE_GPU_EXACT_DIR")
        .env_remove("FAKE_CUDA_MEMORY")
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("run memprobe");
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

/// The pid the program printed after `label`.
fn pid_of(o: &Output, label: &str) -> u64 {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(label)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{label}' line in {:?}", o.stdout))
}

fn process(v: &Value, pid: u64) -> &Value {
    v["gpu_exact"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no process {pid} in {:#}", v["gpu_exact"]))
}

fn mib(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap() / MIB)
        .collect()
}

#[test]
fn microsecond_spikes_are_the_exact_peaks_in_every_try() {
    const TRIES: u64 = 20;
    for i in 0..TRIES {
        let size = 1 + (i * 7) % 13;
        let (o, v) = run(&format!("spike-{i}"), &["spike", &size.to_string()], &[]);
        let x = &v["gpu_exact"];
        assert_eq!(x["peak_fidelity"], "exact");
        assert_eq!(
            x["devices"][0]["tree_peak_bytes"],
            (2 + size) * MIB,
            "try {i}"
        );
        let p = process(&v, pid_of(&o, "pid"));
        assert_eq!(mib(&p["peak_bytes"])[0], 2 + size, "try {i}");
        assert_eq!(mib(&p["end_bytes"])[0], 2, "exits holding its 2 MiB");
        assert_eq!(p["exited"], true);
        // The driver freed what it held at exit: the tree ends empty.
        assert_eq!(x["devices"][0]["tree_end_bytes"], 0);
        // The spike, held for microseconds, is on the timeline too.
        let on_timeline = v["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["gpu_exact_peak_bytes"][0].as_u64())
            .max();
        assert_eq!(on_timeline, Some((2 + size) * MIB), "try {i}");
    }
}

#[test]
fn fork_the_tree_peak_is_the_largest_sum_not_the_sum_of_peaks() {
    let csv = scratch().join("fork.csv");
    let svg = scratch().join("fork.svg");
    let (o, v) = run(
        "fork",
        &["fork"],
        &[
            "--csv",
            csv.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    let parent = process(&v, pid_of(&o, "parent"));
    let child = process(&v, pid_of(&o, "child"));
    assert_eq!(mib(&parent["peak_bytes"]), vec![12, 0]);
    assert_eq!(mib(&child["peak_bytes"]), vec![7, 5]);
    assert_eq!(mib(&child["end_bytes"]), vec![6, 5]);
    let x = &v["gpu_exact"];
    // 4 + 8 in the parent alone beats 4 + 6 + 1 with the child; the
    // processes' peaks sum to 19.
    assert_eq!(x["devices"][0]["tree_peak_bytes"], 12 * MIB);
    assert_eq!(x["devices"][1]["tree_peak_bytes"], 5 * MIB);
    assert_eq!(x["devices"][0]["max_process_pid"], parent["pid"]);
    assert_eq!(x["devices"][1]["max_process_pid"], child["pid"]);
    assert_eq!(x["devices"][0]["tree_end_bytes"], 0);
    assert_eq!(x["devices"][1]["tree_end_bytes"], 0);

    let summary = String::from_utf8_lossy(&o.stderr);
    assert!(summary.contains("GPU 0 exact peak"), "{summary}");
    assert!(summary.contains("12.0 MiB tree (exact"), "{summary}");
    assert!(summary.contains("GPU 1 exact peak"), "{summary}");
    let csv = std::fs::read_to_string(csv).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(
        header.ends_with(",gpu0_exact_peak_bytes,gpu1_exact_peak_bytes"),
        "{header}"
    );
    let col0_max = csv
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').rev().nth(1)?.parse::<u64>().ok())
        .max();
    assert_eq!(col0_max, Some(12 * MIB));
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.contains("GPU 0 exact, all processes of the run"));
}

#[test]
fn fork_and_exec_the_old_image_leaves_the_tree() {
    let (o, v) = run("exec", &["exec"], &[]);
    let parent = process(&v, pid_of(&o, "parent"));
    let child = process(&v, pid_of(&o, "child"));
    assert_eq!(mib(&parent["peak_bytes"])[0], 3);
    // One process across its exec: 1 MiB before, 2 + 4 after.
    assert_eq!(mib(&child["peak_bytes"])[0], 6);
    assert_eq!(v["gpu_exact"]["devices"][0]["tree_peak_bytes"], 9 * MIB);
    assert_eq!(v["gpu_exact"]["devices"][0]["tree_end_bytes"], 0);
}

#[test]
fn a_killed_child_keeps_its_figures_and_leaves_the_tree() {
    let (o, v) = run("killed", &["killed"], &[]);
    let child = process(&v, pid_of(&o, "child"));
    assert_eq!(child["exited"], true);
    assert_eq!(mib(&child["peak_bytes"])[0], 8);
    assert_eq!(mib(&child["end_bytes"])[0], 8, "held when it was killed");
    assert_eq!(v["gpu_exact"]["devices"][0]["tree_peak_bytes"], 8 * MIB);
    assert_eq!(v["gpu_exact"]["devices"][0]["tree_end_bytes"], 0);
}

#[test]
fn context_memory_is_nvmls_figure_minus_the_counted_bytes() {
    // NVML (the fake) gives each child of memprobe 768 MiB on device 0; the
    // child holds 256 MiB through the driver: 512 MiB no call revealed.
    let dir = scratch().join("nvml");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libnvidia-ml.so.1");
    let fake = root().join("tests/fake-gpu/fake_nvml.c");
    cc(
        &["-shared", "-fPIC", fake.to_str().unwrap(), "-lpthread"],
        &lib,
    );
    let script = dir.join("fake_nvml.script");
    std::fs::write(
        &script,
        format!("devices 1\ndevice 0 procs children:{}\n", 768 * MIB),
    )
    .unwrap();
    let (o, v) = run_env(
        "context",
        &["hold", "256", "300"],
        &["--interval", "10ms"],
        &[
            ("MEMPROBE_GPU_BACKEND", Path::new("nvml")),
            ("MEMPROBE_NVML_LIBRARY", &lib),
            ("FAKE_NVML_SCRIPT", &script),
        ],
    );
    let p = process(&v, pid_of(&o, "pid"));
    assert_eq!(mib(&p["peak_bytes"]), vec![256]);
    assert_eq!(p["nvml_used_bytes"][0], 768 * MIB, "{p:#}");
    assert_eq!(p["context_bytes"][0], 512 * MIB, "{p:#}");
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(
        text.contains("context GPU 0 512 MiB (NVML minus counted, sampled)"),
        "{text}"
    );
    // What held the peak: the program's own allocation, and beside it what
    // NVML adds.
    let at = &p["origins_at_peak"][0];
    assert_eq!(at["peak_bytes"], 256 * MIB, "{p:#}");
    assert_eq!(at["by_origin"].as_array().unwrap().len(), 1, "{p:#}");
    assert_eq!(at["by_origin"][0]["name"], "the program", "{p:#}");
    assert_eq!(at["by_origin"][0]["bytes"], 256 * MIB, "{p:#}");
    assert!(
        at["by_origin"][0]["library"]
            .as_str()
            .unwrap()
            .ends_with("/tree"),
        "{p:#}"
    );
    let line = text
        .lines()
        .find(|l| l.contains("at GPU 0's peak"))
        .unwrap_or_else(|| panic!("no breakdown line in {text}"));
    assert!(
        line.contains(
            ": the program 256 MiB; CUDA context and unseen 512 MiB (NVML minus counted, sampled)"
        ),
        "{line}"
    );
    // Without NVML the figures are null, not 0, and the context line says
    // it is unknown.
    let (o, v) = run("context-none", &["hold", "8", "50"], &[]);
    let p = process(&v, pid_of(&o, "pid"));
    assert_eq!(p["context_bytes"][0], Value::Null, "{p:#}");
    assert_eq!(p["nvml_used_bytes"][0], Value::Null, "{p:#}");
    assert_eq!(p["origins_at_peak"][0]["peak_bytes"], 8 * MIB, "{p:#}");
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(
        text.contains("CUDA context and unseen unknown (no NVML per-process figure)"),
        "{text}"
    );
}

#[test]
fn the_run_directory_is_removed_and_ld_preload_is_appended() {
    let b = built();
    let json = scratch().join("env.json");
    let o = Command::new(env!("CARGO_BIN_EXE_memprobe"))
        .args(["run", "--gpu-exact", "--no-live", "--json"])
        .arg(&json)
        .args([
            "--",
            "sh",
            "-c",
            "echo \"$LD_PRELOAD|$MEMPROBE_GPU_EXACT_DIR|${MEMPROBE_GPU_EXACT-unset}\"",
        ])
        .env("LD_LIBRARY_PATH", &b.driver)
        .env("LD_PRELOAD", "")
        .env("MEMPROBE_GPU_EXACT", "off")
        .env("MEMPROBE_GPU_BACKEND", "none")
        .env_remove("MEMPROBE_INTERPOSE_LIBRARY")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let fields: Vec<&str> = out.trim().split('|').collect();
    assert!(fields[0].ends_with("/libmemprobe_interpose.so"), "{out}");
    assert!(!fields[0].starts_with(':'), "{out}");
    assert!(fields[1].contains("memprobe-run-"), "{out}");
    assert_eq!(fields[2], "unset", "counting is on under --gpu-exact");
    assert!(!Path::new(fields[1]).exists(), "{} left behind", fields[1]);
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // The shell used no GPU: no device, no process.
    assert_eq!(v["gpu_exact"]["devices"].as_array().unwrap().len(), 0);

    // An existing LD_PRELOAD keeps its place, the interposer goes after it.
    let o = Command::new(env!("CARGO_BIN_EXE_memprobe"))
        .args([
            "run",
            "--gpu-exact",
            "--no-live",
            "--",
            "sh",
            "-c",
            "echo \"$LD_PRELOAD\"",
        ])
        .env("LD_PRELOAD", "/nonexistent-first.so")
        .env("MEMPROBE_GPU_BACKEND", "none")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.trim().starts_with("/nonexistent-first.so:")
            && out.trim().ends_with("/libmemprobe_interpose.so"),
        "{out}"
    );
}

#[test]
fn without_the_interposer_it_fails_before_the_command_starts() {
    // A memprobe binary with no interposer beside it nor in ../lib.
    let dir = scratch().join("lonely/bin");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("memprobe");
    // A hard link where it can be: a copy's file is open for writing a
    // moment, and a child another test forks then holds it open, so that
    // executing it fails with "text file busy" (retried below).
    let _ = std::fs::remove_file(&exe);
    if std::fs::hard_link(env!("CARGO_BIN_EXE_memprobe"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_memprobe"), &exe).unwrap();
    }
    let output = |cmd: &mut Command| {
        for _ in 0..100 {
            match cmd.output() {
                Err(e) if e.raw_os_error() == Some(libc_etxtbsy()) => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                r => return r.unwrap(),
            }
        }
        panic!("{} stayed busy", exe.display())
    };
    let marker = scratch().join("lonely/started");
    let o = output(
        Command::new(&exe)
            .args(["run", "--gpu-exact", "--no-live", "--", "touch"])
            .arg(&marker)
            .env_remove("MEMPROBE_INTERPOSE_LIBRARY")
            .env("MEMPROBE_GPU_BACKEND", "none"),
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("libmemprobe_interpose.so was not found"),
        "{err}"
    );
    assert!(
        err.contains(&dir.join("libmemprobe_interpose.so").display().to_string()),
        "{err}"
    );
    assert!(
        err.contains("MEMPROBE_INTERPOSE_LIBRARY (not set)"),
        "{err}"
    );
    assert!(!marker.exists(), "the command ran");

    // Named through the environment, it is found.
    let _ = built();
    let o = output(
        Command::new(&exe)
            .args(["run", "--gpu-exact", "--no-live", "--", "true"])
            .env(
                "MEMPROBE_INTERPOSE_LIBRARY",
                Path::new(env!("CARGO_BIN_EXE_memprobe"))
                    .parent()
                    .unwrap()
                    .join("libmemprobe_interpose.so"),
            )
            .env("MEMPROBE_GPU_BACKEND", "none"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// ETXTBSY on Linux.
fn libc_etxtbsy() -> i32 {
    26
}

/// A GPU out-of-memory the interposer counted (the program survived it)
/// is in the summary and the JSON: it was in neither.
#[test]
fn a_gpu_out_of_memory_is_reported() {
    let (o, v) = run_env(
        "oom",
        &["oom", "64"],
        &[],
        &[("FAKE_CUDA_MEMORY", Path::new("33554432"))],
    );
    let pid = pid_of(&o, "pid");
    let x = &v["gpu_exact"];
    assert_eq!(x["oom_failures"], 1, "{x:#}");
    let p = process(&v, pid);
    assert_eq!(p["oom_failures"], 1);
    assert_eq!(p["last_oom"]["device"], 0);
    assert_eq!(p["last_oom"]["size_bytes"], 64 * MIB);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("GPU out of memory     1 allocation(s) failed with CUDA out-of-memory"),
        "{err}"
    );
    assert!(err.contains("64.0 MiB on GPU 0"), "{err}");
    // What held the device when it failed: the program's 2 MiB.
    let held = &p["last_oom"]["held_by_origin"];
    assert_eq!(held["peak_bytes"], 2 * MIB, "{p:#}");
    assert_eq!(held["by_origin"][0]["name"], "the program", "{p:#}");
    assert_eq!(held["by_origin"][0]["bytes"], 2 * MIB, "{p:#}");
    assert!(
        err.contains("held then 2.00 MiB: the program 2.00 MiB"),
        "{err}"
    );
    // None counted: no line.
    let (o, v) = run("no-oom", &["spike", "4"], &[]);
    assert_eq!(v["gpu_exact"]["oom_failures"], 0);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("GPU out of memory"));
}
