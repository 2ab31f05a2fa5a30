//! Per-process GPU memory on the fake NVML: this process among others,
//! API version fallback, retries, errors, and PID namespaces.

mod common;

use common::{assert_child_ok, is_child, run_child_with, Fake};
use memprobe_core::ErrorKind;
use memprobe_gpu::{GpuProcess, GpuProcessKind, Gpus};

#[test]
fn this_process_among_others() {
    let fake = Fake::nvml(
        "devices 2\ndevice 0 procs 1:5000 self:3000 999999:7000\ndevice 1 procs 1:5000\n",
    );
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h0 = gpus.device(0).unwrap();
    let list = h0.processes().unwrap();
    assert_eq!(list.len(), 3);
    assert!(list.contains(&GpuProcess {
        pid: std::process::id(),
        used: Some(3000),
        kind: GpuProcessKind::Compute
    }));
    assert_eq!(h0.process_memory().unwrap().used, 3000);
    // Not on device 1 at all: 0 bytes, not an error.
    assert_eq!(gpus.device(1).unwrap().process_memory().unwrap().used, 0);
    // The newest process query the library has.
    assert!(fake.nvml_calls("procs_v3") >= 2);
    assert_eq!(fake.nvml_calls("procs_v2") + fake.nvml_calls("procs_v1"), 0);
}

#[test]
fn empty_list() {
    let fake = Fake::nvml("device 0 procs\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    assert!(h.processes().unwrap().is_empty());
    assert_eq!(h.process_memory().unwrap().used, 0);
}

#[test]
fn graphics_processes_count_once() {
    let fake = Fake::nvml("device 0 procs self:3000\ndevice 0 gprocs self:3000 42:10\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    let list = h.processes().unwrap();
    assert_eq!(
        list.iter()
            .filter(|p| p.kind == GpuProcessKind::Graphics)
            .count(),
        2
    );
    assert_eq!(h.process_memory().unwrap().used, 3000);

    // A graphics-only process.
    let fake = Fake::nvml("device 0 gprocs self:800\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.device(0).unwrap().process_memory().unwrap().used, 800);
}

#[test]
fn graphics_not_supported_is_ignored() {
    let fake = Fake::nvml("device 0 procs self:3000\ndevice 0 gprocs_error NOT_SUPPORTED\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.device(0).unwrap().process_memory().unwrap().used, 3000);
}

#[test]
fn older_process_queries() {
    let fake = Fake::nvml_omitting(
        &[
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
        ],
        "device 0 procs 7:1 self:2048\n",
    );
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.device(0).unwrap().process_memory().unwrap().used, 2048);
    assert_eq!(fake.nvml_calls("procs_v2"), 1);

    let fake = Fake::nvml_omitting(
        &[
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v2",
        ],
        "device 0 procs 7:1 self:4096 8:2\n",
    );
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    assert_eq!(h.process_memory().unwrap().used, 4096);
    assert_eq!(h.processes().unwrap().len(), 3);
    assert_eq!(fake.nvml_calls("procs_v1"), 2);
}

#[test]
fn insufficient_size_is_retried() {
    let fake = Fake::nvml("device 0 procs 1:1 2:2 self:3 4:4\ndevice 0 procs_insufficient 2\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    assert_eq!(h.process_memory().unwrap().used, 3);
    assert_eq!(fake.nvml_calls("procs_v3"), 3);
    assert_eq!(h.processes().unwrap().len(), 4);

    // A list that never fits gives an error, not a hang.
    let fake = Fake::nvml("device 0 procs self:3\ndevice 0 procs_insufficient 1000\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let e = gpus.device(0).unwrap().process_memory().unwrap_err();
    assert!(e.message().contains("INSUFFICIENT_SIZE"), "{e}");
}

#[test]
fn more_processes_than_the_first_buffer() {
    let procs: Vec<String> = (1..=40).map(|p| format!("{}:{}", p + 100000, p)).collect();
    let fake = Fake::nvml(&format!("device 0 procs {} self:77\n", procs.join(" ")));
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    assert_eq!(h.processes().unwrap().len(), 41);
    assert_eq!(h.process_memory().unwrap().used, 77);
}

#[test]
fn not_supported() {
    let fake = Fake::nvml("device 0 procs_error NOT_SUPPORTED\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    let e = h.process_memory().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(
        e.message()
            .contains("nvmlDeviceGetComputeRunningProcesses_v3"),
        "{e}"
    );
    // The device itself still reads.
    h.memory().unwrap();
}

#[test]
fn value_not_available() {
    let fake = Fake::nvml("device 0 procs self:18446744073709551615\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    assert_eq!(h.processes().unwrap()[0].used, None);
    assert_eq!(
        h.process_memory().unwrap_err().kind(),
        ErrorKind::Unsupported
    );
}

/// Inside a new PID namespace, `getpid()` is 1 but the fake driver reports
/// host PIDs (like a real one): memprobe must find this process by the host
/// PID from `NSpid`, not by the namespace PID, which on the host belongs to
/// another process.
#[test]
fn pid_namespace() {
    const NAME: &str = "pid_namespace_child";
    let probe = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!("skipped: cannot create a PID namespace here (unshare --pid)");
        return;
    }
    let fake = Fake::nvml("device 0 procs self:111 hostself:3000 12345:5\n");
    let out = run_child_with(
        Some(&["unshare", "--pid", "--fork"]),
        NAME,
        &[("MEMPROBE_NVML_LIBRARY", fake.lib.to_str().unwrap())],
    );
    assert_child_ok(&out, "CHILD-DONE");
}

#[test]
fn pid_namespace_child() {
    if !is_child("pid_namespace_child") {
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .unwrap()
        .to_string();
    assert_eq!(std::process::id(), 1, "{nspid}");
    let pids: Vec<u32> = nspid[6..]
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{nspid}");
    assert_ne!(pids[0], 1);

    let gpus = Gpus::from_env().unwrap();
    let h = gpus.device(0).unwrap();
    let list = h.processes().unwrap();
    assert!(list.iter().any(|p| p.pid == 1 && p.used == Some(111)));
    assert!(list
        .iter()
        .any(|p| p.pid == pids[0] && p.used == Some(3000)));
    assert_eq!(h.process_memory().unwrap().used, 3000);
    println!("CHILD-DONE {nspid}");
}
