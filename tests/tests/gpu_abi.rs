//! The GPU part of the C ABI from C (tests/c/test_gpu.c), against the fake
//! NVML and CUDA runtime libraries of tests/fake-gpu: each scenario gets its
//! own copy of the fakes with its own script, its own environment, and runs
//! plainly, under AddressSanitizer + UBSan, and under valgrind.

use memprobe_tests::{
    assert_ok, compile, fresh_scratch, have_valgrind, root, run, run_valgrind, scratch,
    stage_fake_gpu, Build, FakeGpu,
};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const GIB: u64 = 1 << 30;

/// test_gpu.c built plainly and with sanitizers, once per test process.
fn programs() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = scratch("gpu_abi");
        let src = vec![root().join("tests/c/test_gpu.c")];
        let plain = dir.join("plain");
        let asan = dir.join("asan");
        compile(&src, &plain, Build::Plain, &["-ldl"]);
        compile(&src, &asan, Build::Sanitized, &["-ldl"]);
        (plain, asan)
    })
}

/// A fresh directory for one scenario's fakes.
fn fake_dir(name: &str) -> PathBuf {
    fresh_scratch("gpu_abi").join(name)
}

/// A fake NVML with `script` (built without the symbols in `omit`).
fn nvml(name: &str, omit: &[&str], script: &str) -> PathBuf {
    stage_fake_gpu(FakeGpu::Nvml, omit, script, &fake_dir(name).join("nvml"))
}

/// A fake CUDA runtime with `script`.
fn cudart(name: &str, script: &str) -> PathBuf {
    stage_fake_gpu(FakeGpu::Cudart, &[], script, &fake_dir(name).join("cudart"))
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 scratch path")
}

/// Runs `test_gpu <args>` with `env` the three ways; every run must pass
/// all its checks and print nothing on stderr (plain run).
fn check(args: &[&str], env: &[(&str, &str)]) {
    let (plain, asan) = programs();
    let what = format!("test_gpu {}", args.join(" "));
    let o = run(plain, args, env);
    assert_ok(&what, &o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(" passed, 0 failed"), "{what}: {out}");
    assert!(
        o.stderr.is_empty(),
        "{what} printed to stderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );

    let mut env_asan = env.to_vec();
    env_asan.push(("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0"));
    assert_ok(&format!("{what} under ASan"), &run(asan, args, &env_asan));

    if have_valgrind(&format!("the valgrind run of {what}")) {
        assert_ok(
            &format!("{what} under valgrind"),
            &run_valgrind(plain, args, env),
        );
    }
}

#[test]
fn no_gpu_backend_none() {
    let lib = nvml("none", &[], "devices 2\n");
    check(
        &["nogpu", "none"],
        &[
            ("MEMPROBE_GPU_BACKEND", "none"),
            ("MEMPROBE_NVML_LIBRARY", path(&lib)),
        ],
    );
}

#[test]
fn no_gpu_library_absent() {
    check(
        &["nogpu", "absent"],
        &[("MEMPROBE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")],
    );
}

#[test]
fn no_gpu_partial_library() {
    let lib = nvml("partial", &["nvmlInit_v2"], "devices 2\n");
    check(
        &["nogpu", "partial"],
        &[("MEMPROBE_NVML_LIBRARY", path(&lib))],
    );
}

#[test]
fn no_gpu_driver_not_loaded() {
    let lib = nvml("nodriver", &[], "init_error DRIVER_NOT_LOADED\n");
    check(
        &["nogpu", "nodriver"],
        &[
            ("MEMPROBE_GPU_BACKEND", "nvml"),
            ("MEMPROBE_NVML_LIBRARY", path(&lib)),
        ],
    );
}

#[test]
fn no_gpu_unknown_backend_in_environment() {
    let lib = nvml("badenv", &[], "devices 2\n");
    check(
        &["nogpu", "badenv"],
        &[
            ("MEMPROBE_GPU_BACKEND", "rocm"),
            ("MEMPROBE_NVML_LIBRARY", path(&lib)),
        ],
    );
}

#[test]
fn zero_devices() {
    let lib = nvml("zero", &[], "devices 0\n");
    check(&["nogpu", "zero"], &[("MEMPROBE_NVML_LIBRARY", path(&lib))]);
}

#[test]
fn one_device_every_call() {
    let script = format!(
        "device 0 name NVIDIA H100 80GB HBM3\n\
         device 0 uuid GPU-5f8a1c2e-0000-4000-8000-00000000abcd\n\
         device 0 total {}\n\
         device 0 reserved {}\n\
         device 0 used {}\n\
         device 0 procs self:{} 4242:{}\n",
        80 * GIB,
        GIB / 2,
        10 * GIB,
        3 * GIB,
        GIB
    );
    let lib = nvml("one", &[], &script);
    let rt = cudart("one", "devices 1\n");
    check(
        &["one"],
        &[
            ("MEMPROBE_NVML_LIBRARY", path(&lib)),
            ("MEMPROBE_CUDART_LIBRARY", path(&rt)),
        ],
    );
}

#[test]
fn eight_devices() {
    let mut script = String::from("devices 8\n");
    for i in 0..8u64 {
        let used = if i == 3 { GIB / 2 } else { (i + 1) * GIB };
        script += &format!("device {i} used {used}\n");
    }
    let lib = nvml("eight", &[], &script);
    check(&["eight"], &[("MEMPROBE_NVML_LIBRARY", path(&lib))]);
}

#[test]
fn trace_over_host_and_gpu() {
    let lib = nvml(
        "trace",
        &[],
        &format!("device 0 used {} {}\n", GIB, 3 * GIB),
    );
    check(&["trace"], &[("MEMPROBE_NVML_LIBRARY", path(&lib))]);
}

#[test]
fn cuda_visible_devices() {
    let mut script = String::from("devices 4\n");
    for (k, uuid) in [
        "GPU-aaaaaaaa-0000-4000-8000-000000000000",
        "GPU-bbbbbbbb-0000-4000-8000-000000000001",
        "GPU-bbbccccc-0000-4000-8000-000000000002",
        "GPU-dddddddd-0000-4000-8000-000000000003",
    ]
    .iter()
    .enumerate()
    {
        script += &format!(
            "device {k} uuid {uuid}\ndevice {k} used {}\n",
            (k as u64 + 1) * GIB
        );
    }
    let mig = "MIG-eeeeeeee-0000-4000-8000-000000000004";
    script += &format!(
        "device 4 mig\ndevice 4 uuid {mig}\ndevice 4 used {}\n",
        7 * GIB
    );
    let lib = nvml("visible", &[], &script);
    let mig_then_2 = format!("{mig},2");
    // (CUDA_VISIBLE_DEVICES, or None for unset; the NVML indices CUDA ids 0.. map to)
    let cases: &[(Option<&str>, &str)] = &[
        (None, "0,1,2,3"),
        (Some("3,1"), "3,1"),
        (Some(" 2 , 0 "), "2,0"),
        (Some("GPU-dddddddd-0000-4000-8000-000000000003"), "3"),
        // Unique UUID prefixes, any case.
        (Some("GPU-ddd,gpu-AA"), "3,0"),
        (Some(mig), "m"),
        (Some(&mig_then_2), "m,2"),
        // The first invalid entry hides itself and the rest.
        (Some("1,9,2"), "1"),
        (Some("1,x,2"), "1"),
        (Some("0,GPU-bbb,3"), "0"), // ambiguous prefix
        (Some("2,2,1"), "2"),       // repeated
        (Some("MIG-nope,1"), "-"),
        (Some(""), "-"),
    ];
    for (visible, expected) in cases {
        let mut env = vec![("MEMPROBE_NVML_LIBRARY", path(&lib))];
        if let Some(v) = visible {
            env.push(("CUDA_VISIBLE_DEVICES", v));
        }
        check(&["visible", expected], &env);
    }
}

#[test]
fn gpu_lost_while_the_monitor_polls() {
    let lib = nvml("lost", &[], "devices 2\ndevice 0 lost_at 30\n");
    check(&["lost"], &[("MEMPROBE_NVML_LIBRARY", path(&lib))]);
}

#[test]
fn five_ms_spike_at_one_ms_interval() {
    let script = format!(
        "device 0 timeline 0:{base} 50:{spike} 55:{base}\ndevice 0 period_ms 100\n",
        base = GIB,
        spike = 3 * GIB
    );
    let lib = nvml("spike", &[], &script);
    check(&["spike"], &[("MEMPROBE_NVML_LIBRARY", path(&lib))]);
}

#[test]
fn configure_overrides_the_environment() {
    let lib = nvml("configure", &[], "devices 2\n");
    check(
        &["configure"],
        &[
            ("MEMPROBE_GPU_BACKEND", "rocm"),
            ("MEMPROBE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"),
            ("MEMPROBE_TEST_NVML", path(&lib)),
        ],
    );
}

#[test]
fn cuda_runtime_backend() {
    let rt = cudart(
        "cudart",
        &format!(
            "devices 2\ndevice 1 total {}\ndevice 1 free {}\ndevice 1 pci 00000000:3B:00.0\n",
            16 * GIB,
            15 * GIB
        ),
    );
    check(
        &["cudart"],
        &[
            ("MEMPROBE_GPU_BACKEND", "cudart"),
            ("MEMPROBE_CUDART_LIBRARY", path(&rt)),
        ],
    );
}

#[test]
fn fork_while_the_monitor_polls_a_gpu() {
    let lib = nvml(
        "fork",
        &[],
        &format!("devices 2\ndevice 0 used {}\n", 2 * GIB),
    );
    check(&["fork"], &[("MEMPROBE_NVML_LIBRARY", path(&lib))]);
}
