//! Out-of-memory reports with the driver's trigger, from C
//! (tests/c/test_oom_driver.c): under the driver-API interposer
//! (LD_PRELOAD) with the fake driver of tests/fake-gpu/fake_cuda.c and a
//! fake NVML listing this process, with counting switched off, and without
//! the interposer; plainly, under AddressSanitizer + UBSan and under
//! valgrind. The reports are validated against docs/oom-report.schema.json.
//!
//! ASan wants its runtime first in the initial library list and refuses to
//! start behind an LD_PRELOAD'ed library; the interposer replaces no function
//! ASan intercepts, so the ASan runs set `verify_asan_link_order=0` (as
//! tests/tests/gpu_exact_abi.rs does).

use memprobe_tests::{
    assert_ok, compile, have_valgrind, root, run, run_valgrind, scratch, stage_fake_gpu,
    stage_interposer_and_driver, Build, FakeGpu,
};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

#[path = "../../memprobe-cli/tests/cli/schema.rs"]
mod schema;

struct Staged {
    program: PathBuf,
    asan: PathBuf,
    interposer: PathBuf,
    driver_dir: PathBuf,
    nvml: PathBuf,
    dir: PathBuf,
}

/// Builds the program, the interposer (copied aside), the fake driver and
/// the fake NVML, once per test process.
fn staged() -> &'static Staged {
    static S: OnceLock<Staged> = OnceLock::new();
    S.get_or_init(|| {
        let dir = scratch("oom_abi");
        let program = dir.join("test_oom_driver");
        let src = [root().join("tests/c/test_oom_driver.c")];
        compile(&src, &program, Build::Plain, &["-ldl"]);
        let asan = dir.join("test_oom_driver-asan");
        compile(&src, &asan, Build::Sanitized, &["-ldl"]);
        let (interposer, driver_dir) = stage_interposer_and_driver(&dir);
        // One 16 GiB GPU, with this process and another one on it.
        let nvml = stage_fake_gpu(
            FakeGpu::Nvml,
            &[],
            "device 0 name Fake GPU\ndevice 0 total 17179869184\ndevice 0 used 9000000000\n\
             device 0 procs self:6442450944 4242:2000000000\n",
            &dir.join("nvml"),
        );
        Staged {
            program,
            asan,
            interposer,
            driver_dir,
            nvml,
            dir,
        }
    })
}

#[derive(Clone, Copy, PartialEq)]
enum How {
    Plain,
    Asan,
    Valgrind,
}

fn run_mode(mode: &str, interposed: bool, how: How, out: &Path) -> Output {
    let s = staged();
    let regions = s.dir.join(format!("regions-{mode}"));
    let owned: Vec<(String, String)> = vec![
        ("LD_LIBRARY_PATH".into(), s.driver_dir.display().to_string()),
        (
            "MEMPROBE_GPU_EXACT_DIR".into(),
            regions.display().to_string(),
        ),
        ("FAKE_CUDA_DEVICES".into(), "2".into()),
        ("MEMPROBE_NVML_LIBRARY".into(), s.nvml.display().to_string()),
        ("OOM_TEST_DIR".into(), out.display().to_string()),
        (
            "LD_PRELOAD".into(),
            if interposed {
                s.interposer.display().to_string()
            } else {
                String::new()
            },
        ),
        (
            "MEMPROBE_GPU_EXACT".into(),
            if mode == "off" { "off" } else { "" }.into(),
        ),
        // The interposed run keeps call paths of one frame: the report
        // names them beside the origins.
        (
            "MEMPROBE_GPU_ORIGINS".into(),
            if mode == "interposed" { "stacks:1" } else { "" }.into(),
        ),
    ];
    let mut env: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    match how {
        How::Plain => run(&s.program, &[mode], &env),
        How::Asan => {
            env.push((
                "ASAN_OPTIONS",
                "verify_asan_link_order=0:detect_leaks=1:abort_on_error=0",
            ));
            run(&s.asan, &[mode], &env)
        }
        How::Valgrind => run_valgrind(&s.program, &[mode], &env),
    }
}

/// Runs `mode` every way; returns the directory of the plain run's reports.
fn check(mode: &str, interposed: bool) -> PathBuf {
    let base = staged().dir.join(format!("out-{mode}"));
    let mut ways = vec![How::Plain, How::Asan];
    if have_valgrind(&format!("the valgrind run of {mode}")) {
        ways.push(How::Valgrind);
    }
    for how in ways {
        let label = match how {
            How::Plain => "plain",
            How::Asan => "asan",
            How::Valgrind => "valgrind",
        };
        let out = base.join(label);
        std::fs::create_dir_all(&out).unwrap();
        let o = run_mode(mode, interposed, how, &out);
        assert_ok(&format!("test_oom_driver {mode} ({label})"), &o);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains(" 0 failed"), "{text}");
    }
    base.join("plain")
}

fn report(dir: &Path, name: &str) -> serde_json::Value {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}\n{text}", path.display()));
    schema::assert_valid("docs/oom-report.schema.json", &doc);
    doc
}

#[test]
fn a_driver_failure_writes_one_complete_report_before_the_error_returns() {
    let dir = check("interposed", true);
    let doc = report(&dir, "driver.json");
    let failed = &doc["failed_allocation"];
    assert_eq!(failed["trigger"], "driver");
    assert_eq!(failed["reported_by"], "cuMemAllocManaged");
    assert_eq!(failed["requested_bytes"], 20u64 << 30);
    assert_eq!(doc["reports_before"], 1);
    // The fake NVML's process list, this process recognised.
    let gpu = &doc["gpus"]["devices"][0];
    assert_eq!(gpu["name"], "Fake GPU");
    let procs = gpu["processes"].as_array().unwrap();
    assert!(
        procs
            .iter()
            .any(|p| p["this_process"] == true && p["used_bytes"] == 6442450944u64),
        "{procs:?}"
    );
    assert!(procs
        .iter()
        .any(|p| p["pid"] == 4242 && p["this_process"] == false));
    // A failure inside a call on the tracker: no open phases, and why.
    let busy = report(&dir, "busy.json");
    assert_eq!(busy["open_phases"]["available"], false);
    assert_eq!(busy["failed_allocation"]["requested_bytes"], 64u64 << 30);
    let caller = report(&dir, "caller.json");
    assert_eq!(caller["failed_allocation"]["trigger"], "caller");
    assert_eq!(caller["open_phases"]["available"], true);
    assert!(!dir.join("freed.json").exists());
}

#[test]
fn counting_switched_off_is_unavailable() {
    let dir = check("off", true);
    report(&dir, "unavailable.json");
}

#[test]
fn without_the_interposer_the_driver_trigger_is_unavailable() {
    let dir = check("plain", false);
    let doc = report(&dir, "unavailable.json");
    assert_eq!(doc["driver_counts"]["available"], false);
}
