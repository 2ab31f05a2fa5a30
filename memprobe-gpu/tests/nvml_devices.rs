//! The NVML backend on the fake NVML: devices, memory, errors, partial and
//! absent libraries.

mod common;

use common::{assert_child_ok, is_child, run_child, Fake, GIB, MIB};
use memprobe_core::ErrorKind;
use memprobe_gpu::{GpuBackend, GpuConfig, Gpus};

#[test]
fn zero_devices() {
    let fake = Fake::nvml("devices 0\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.backend(), GpuBackend::Nvml);
    assert!(gpus.unavailable_reason().is_none());
    assert_eq!(gpus.device_count().unwrap(), 0);
    let e = gpus.device(0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("NVML reports no GPU"), "{e}");
    assert!(gpus.device_infos().is_empty());
}

#[test]
fn one_device() {
    let fake = Fake::nvml(
        "device 0 name NVIDIA H100 80GB HBM3\n\
         device 0 uuid GPU-5f8a0c1e-1111-2222-3333-444455556666\n\
         device 0 total 85899345920\n\
         device 0 reserved 536870912\n\
         device 0 used 1073741824\n",
    );
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.device_count().unwrap(), 1);
    assert_eq!(gpus.library_path(), Some(fake.lib.to_str().unwrap()));
    let h = gpus.device(0).unwrap();
    assert_eq!(h.id(), 0);
    let info = h.info();
    assert_eq!(info.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(
        info.uuid.as_deref(),
        Some("GPU-5f8a0c1e-1111-2222-3333-444455556666")
    );
    assert_eq!(info.nvml_index, Some(0));
    let before = memprobe_core::monotonic_ns();
    let m = h.memory().unwrap();
    let after = memprobe_core::monotonic_ns();
    assert_eq!(m.total, 80 * GIB);
    assert_eq!(m.used, GIB);
    assert_eq!(m.reserved, Some(512 * MIB));
    // v2: total = used + free + reserved.
    assert_eq!(m.free, 80 * GIB - GIB - 512 * MIB);
    assert!(m.taken_at_ns >= before && m.taken_at_ns <= after);
    assert!(m.read_ns <= after - before);
    assert_eq!(fake.nvml_calls("memory_v2"), 1);
    assert_eq!(fake.nvml_calls("memory_v1"), 0);
    let e = gpus.device(1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidId);
}

#[test]
fn eight_devices() {
    let mut script = String::from("devices 8\n");
    for i in 0..8 {
        script += &format!(
            "device {i} total {}\ndevice {i} used {}\n",
            (i + 1) * GIB,
            i * MIB
        );
    }
    let fake = Fake::nvml(&script);
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.device_count().unwrap(), 8);
    let infos = gpus.device_infos();
    assert_eq!(infos.len(), 8);
    for (i, info) in infos.iter().enumerate() {
        assert_eq!(info.id, i as u32);
        assert_eq!(info.nvml_index, Some(i as u32));
        assert_eq!(info.name.as_deref(), Some(format!("Fake GPU {i}").as_str()));
        let m = gpus.device(i as u32).unwrap().memory().unwrap();
        assert_eq!(m.total, (i as u64 + 1) * GIB);
        assert_eq!(m.used, i as u64 * MIB);
    }
    let mut uuids: Vec<_> = infos.iter().map(|i| i.uuid.clone().unwrap()).collect();
    uuids.dedup();
    assert_eq!(uuids.len(), 8);
}

#[test]
fn usage_steps_per_call() {
    let fake = Fake::nvml("device 0 used 100 200 300\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    let used: Vec<u64> = (0..5).map(|_| h.memory().unwrap().used).collect();
    assert_eq!(used, [100, 200, 300, 300, 300]);
}

#[test]
fn v1_fallback_when_v2_is_missing() {
    let fake = Fake::nvml_omitting(
        &["nvmlDeviceGetMemoryInfo_v2"],
        "device 0 total 1000000\ndevice 0 reserved 1000\ndevice 0 used 5000\n",
    );
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let m = gpus.device(0).unwrap().memory().unwrap();
    // v1: no reservation reported, `used` includes it.
    assert_eq!(m.reserved, None);
    assert_eq!(m.used, 6000);
    assert_eq!(m.free, 1000000 - 6000);
    assert_eq!(m.total, 1000000);
    assert_eq!(fake.nvml_calls("memory_v1"), 1);
}

#[test]
fn v1_fallback_when_v2_is_refused() {
    for code in [
        "NOT_SUPPORTED",
        "FUNCTION_NOT_FOUND",
        "ARGUMENT_VERSION_MISMATCH",
    ] {
        let fake = Fake::nvml(&format!(
            "device 0 total 1000000\ndevice 0 reserved 1000\ndevice 0 used 5000\n\
             device 0 memory_v2_error {code}\n"
        ));
        let gpus = Gpus::open(fake.nvml_config()).unwrap();
        let h = gpus.device(0).unwrap();
        for _ in 0..3 {
            let m = h.memory().unwrap();
            assert_eq!((m.used, m.reserved), (6000, None), "{code}");
        }
        // v2 is asked once, then remembered as refused.
        assert_eq!(fake.nvml_calls("memory_v2"), 1, "{code}");
        assert_eq!(fake.nvml_calls("memory_v1"), 3, "{code}");
    }
}

#[test]
fn not_supported() {
    let fake = Fake::nvml("devices 2\ndevice 1 memory_error NOT_SUPPORTED\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let e = gpus.device(1).unwrap().memory().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.message().contains("NVML_ERROR_NOT_SUPPORTED"), "{e}");
    gpus.device(0).unwrap().memory().unwrap();
}

#[test]
fn other_errors_map() {
    for (code, kind) in [
        ("NO_PERMISSION", ErrorKind::PermissionDenied),
        ("UNKNOWN", ErrorKind::Unavailable),
        ("TIMEOUT", ErrorKind::Io),
        ("RESET_REQUIRED", ErrorKind::GpuLost),
        ("12345", ErrorKind::Unavailable),
    ] {
        let fake = Fake::nvml(&format!("device 0 memory_error {code}\n"));
        let gpus = Gpus::open(fake.nvml_config()).unwrap();
        let e = gpus.device(0).unwrap().memory().unwrap_err();
        assert_eq!(e.kind(), kind, "{code}: {e}");
    }
}

#[test]
fn gpu_lost_at_call_k_and_other_devices_still_read() {
    let fake = Fake::nvml("devices 3\ndevice 1 lost_at 3\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let lost = gpus.device(1).unwrap();
    lost.memory().unwrap();
    lost.memory().unwrap();
    for _ in 0..3 {
        let e = lost.memory().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::GpuLost);
        assert!(e.message().contains("NVML_ERROR_GPU_IS_LOST"), "{e}");
    }
    assert_eq!(
        lost.process_memory().unwrap_err().kind(),
        ErrorKind::GpuLost
    );
    gpus.device(0).unwrap().memory().unwrap();
    gpus.device(2).unwrap().memory().unwrap();
}

#[test]
fn gpu_lost_before_opening() {
    let fake = Fake::nvml("devices 3\ndevice 1 lost\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    // Numbering is kept: device 1 is there but cannot be opened.
    assert_eq!(gpus.device_count().unwrap(), 3);
    assert_eq!(gpus.device(1).unwrap_err().kind(), ErrorKind::GpuLost);
    assert_eq!(gpus.device(2).unwrap().info().nvml_index, Some(2));
    assert_eq!(gpus.device_infos().len(), 2);
}

#[test]
fn init_failure() {
    let fake = Fake::nvml("init_error DRIVER_NOT_LOADED\n");
    let e = Gpus::open(fake.nvml_config()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("NVML_ERROR_DRIVER_NOT_LOADED"), "{e}");
    assert!(e.message().contains("MEMPROBE_NVML_LIBRARY"), "{e}");

    let fake = Fake::nvml("init_error NO_PERMISSION\n");
    let e = Gpus::open(fake.nvml_config()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied);

    // auto: no error, no devices, the reason kept.
    let fake = Fake::nvml("init_error DRIVER_NOT_LOADED\n");
    let gpus = Gpus::open(GpuConfig {
        backend: GpuBackend::Auto,
        ..fake.nvml_config()
    })
    .unwrap();
    assert_eq!(gpus.backend(), GpuBackend::None);
    let reason = gpus.unavailable_reason().unwrap();
    assert_eq!(reason.kind(), ErrorKind::Unavailable);
    assert!(reason.message().contains("DRIVER_NOT_LOADED"), "{reason}");
    assert!(
        reason.message().contains("MEMPROBE_GPU_BACKEND=cudart"),
        "{reason}"
    );
    assert_eq!(gpus.device_count().unwrap_err(), reason.clone());
    assert_eq!(gpus.device(0).unwrap_err(), reason.clone());
}

#[test]
fn script_errors_fail_init() {
    let fake = Fake::nvml("device 0 bogus 1\n");
    let e = Gpus::open(fake.nvml_config()).unwrap_err();
    assert!(e.message().contains("NVML_ERROR_UNKNOWN"), "{e}");
}

#[test]
fn library_absent() {
    let missing = std::env::temp_dir().join("memprobe-no-such-dir/libnvidia-ml.so.1");
    let config = GpuConfig {
        backend: GpuBackend::Nvml,
        nvml_path: Some(missing.clone()),
        ..GpuConfig::default()
    };
    let e = Gpus::open(config.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("cannot load the NVML library"), "{e}");
    assert!(e.message().contains(missing.to_str().unwrap()), "{e}");

    let gpus = Gpus::open(GpuConfig {
        backend: GpuBackend::Auto,
        ..config
    })
    .unwrap();
    assert_eq!(gpus.backend(), GpuBackend::None);
    assert_eq!(
        gpus.unavailable_reason().unwrap().kind(),
        ErrorKind::Unavailable
    );
}

#[test]
fn not_a_library() {
    let fake = Fake::nvml("");
    std::fs::write(&fake.lib, b"not an ELF file").unwrap();
    let e = Gpus::open(fake.nvml_config()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("cannot load the NVML library"), "{e}");
}

#[test]
fn backend_none() {
    let gpus = Gpus::open(GpuConfig {
        backend: GpuBackend::None,
        ..GpuConfig::default()
    })
    .unwrap();
    assert_eq!(gpus.backend(), GpuBackend::None);
    let e = gpus.unavailable_reason().unwrap();
    assert!(e.message().contains("disabled"), "{e}");
    assert_eq!(gpus.library_path(), None);
}

#[test]
fn the_same_library_is_loaded_once() {
    let fake = Fake::nvml("device 0 used 1 2 3 4\n");
    let a = Gpus::open(fake.nvml_config()).unwrap();
    let b = Gpus::open(fake.nvml_config()).unwrap();
    // One library instance: the stepping usage is shared.
    assert_eq!(a.device(0).unwrap().memory().unwrap().used, 1);
    assert_eq!(b.device(0).unwrap().memory().unwrap().used, 2);
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Gpus>();
    check::<memprobe_gpu::DeviceHandle>();
    let fake = Fake::nvml("devices 2\n");
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..100 {
                    gpus.device(1).unwrap().memory().unwrap();
                }
            });
        }
    });
    assert_eq!(fake.nvml_calls("memory_v2"), 400);
}

/// A library without nvmlShutdown: nvml-wrapper's Drop would panic. memprobe
/// never drops it; the process must exit cleanly.
#[test]
fn missing_shutdown_exits_cleanly() {
    const NAME: &str = "missing_shutdown_child";
    let fake = Fake::nvml_omitting(&["nvmlShutdown"], "devices 2\n");
    let out = run_child(
        NAME,
        &[("MEMPROBE_NVML_LIBRARY", fake.lib.to_str().unwrap())],
    );
    assert_child_ok(&out, "CHILD-DONE");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{out:?}"
    );
}

#[test]
fn missing_shutdown_child() {
    if !is_child("missing_shutdown_child") {
        return;
    }
    let path = std::env::var("MEMPROBE_NVML_LIBRARY").unwrap();
    let gpus = Gpus::open(GpuConfig {
        backend: GpuBackend::Nvml,
        nvml_path: Some(path.into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(gpus.device_count().unwrap(), 2);
    gpus.device(1).unwrap().memory().unwrap();
    gpus.device(1).unwrap().process_memory().unwrap();
    drop(gpus);
    // And through the environment, the process-wide instance.
    assert_eq!(memprobe_gpu::Gpus::shared().backend(), GpuBackend::Nvml);
    println!("CHILD-DONE");
}

#[test]
fn missing_process_queries() {
    let fake = Fake::nvml_omitting(
        &[
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses_v3",
        ],
        "device 0 procs self:100\n",
    );
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    h.memory().unwrap();
    let e = h.process_memory().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(
        e.message()
            .contains("lacks nvmlDeviceGetComputeRunningProcesses"),
        "{e}"
    );
    assert!(gpus.process_sampler(0).is_err());
}

#[test]
fn missing_memory_queries_entirely() {
    // A library with neither memory query: a clear error, no crash.
    let fake = Fake::nvml_omitting(
        &["nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"],
        "devices 1\ndevice 0 procs self:100\n",
    );
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    let e = h.memory().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(
        e.message()
            .contains("neither nvmlDeviceGetMemoryInfo_v2 nor nvmlDeviceGetMemoryInfo"),
        "{e}"
    );
    assert_eq!(h.process_memory().unwrap().used, 100);
}

/// Every other symbol memprobe touches, left out one at a time: a clear
/// `Unavailable` error where it is essential, a graceful loss where not,
/// never a crash.
#[test]
fn each_missing_symbol() {
    let script = "devices 2\ndevice 0 procs self:100\n";
    let essential = |omit: &str, needle: &str| {
        let fake = Fake::nvml_omitting(&[omit], script);
        let e = Gpus::open(fake.nvml_config()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{omit}: {e}");
        assert!(e.message().contains(needle), "{omit}: {e}");
    };
    essential("nvmlInit_v2", "nvmlInit_v2");
    essential("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount_v2");
    // Without handles, the devices are counted but each one says why it cannot be read.
    let fake = Fake::nvml_omitting(&["nvmlDeviceGetHandleByIndex_v2"], script);
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.device_count().unwrap(), 2);
    let e = gpus.device(1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("lacks a required function"), "{e}");
    assert_eq!(
        gpus.gpu_mem_get(None).error.unwrap().kind(),
        ErrorKind::Unavailable
    );

    for omit in [
        "nvmlInitWithFlags",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
    ] {
        let fake = Fake::nvml_omitting(&[omit], script);
        let gpus = Gpus::open(fake.nvml_config()).unwrap();
        assert_eq!(
            gpus.device(0).unwrap().process_memory().unwrap().used,
            100,
            "{omit}"
        );
    }

    let fake = Fake::nvml_omitting(&["nvmlDeviceGetName"], script);
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.device(0).unwrap().info().name, None);
    assert!(gpus.device(0).unwrap().info().uuid.is_some());
    gpus.device(0).unwrap().memory().unwrap();

    // Without UUIDs, indices still map; UUIDs and MIG instances cannot.
    let fake = Fake::nvml_omitting(&["nvmlDeviceGetUUID", "nvmlDeviceGetHandleByUUID"], script);
    let gpus = Gpus::open(fake.nvml_config()).unwrap();
    assert_eq!(gpus.device(1).unwrap().info().uuid, None);
    let config = |spec: &str| GpuConfig {
        visible_devices: Some(spec.into()),
        ..fake.nvml_config()
    };
    assert_eq!(Gpus::open(config("1")).unwrap().device_count().unwrap(), 1);
    assert_eq!(
        Gpus::open(config("GPU-2")).unwrap().device_count().unwrap(),
        0
    );
    assert_eq!(
        Gpus::open(config("MIG-x")).unwrap().device_count().unwrap(),
        0
    );
}
