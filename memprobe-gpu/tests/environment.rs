//! Backend selection from the environment. Each case runs in a child process
//! with its own environment: mutating this process's environment would race
//! with tests in other threads.

mod common;

use common::{assert_child_ok, is_child, run_child, Fake};
use memprobe_core::ErrorKind;
use memprobe_gpu::{GpuBackend, GpuConfig, Gpus};

const CASE: &str = "MEMPROBE_GPU_TEST_CASE";

#[test]
fn environment_cases() {
    let nvml = Fake::nvml("devices 2\n");
    let cudart = Fake::cudart("devices 3\n");
    let nvml_lib = nvml.lib.to_str().unwrap();
    let cudart_lib = cudart.lib.to_str().unwrap();
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("unknown", &[("MEMPROBE_GPU_BACKEND", "rocm")]),
        (
            "none",
            &[
                ("MEMPROBE_GPU_BACKEND", "none"),
                ("MEMPROBE_NVML_LIBRARY", nvml_lib),
            ],
        ),
        (
            "nvml",
            &[
                ("MEMPROBE_GPU_BACKEND", "nvml"),
                ("MEMPROBE_NVML_LIBRARY", nvml_lib),
            ],
        ),
        (
            "auto",
            &[
                ("MEMPROBE_NVML_LIBRARY", nvml_lib),
                ("MEMPROBE_CUDART_LIBRARY", cudart_lib),
            ],
        ),
        (
            "auto_empty",
            &[
                ("MEMPROBE_GPU_BACKEND", ""),
                ("MEMPROBE_NVML_LIBRARY", nvml_lib),
            ],
        ),
        (
            "cudart",
            &[
                ("MEMPROBE_GPU_BACKEND", "cudart"),
                ("MEMPROBE_CUDART_LIBRARY", cudart_lib),
            ],
        ),
        (
            "visible",
            &[
                ("MEMPROBE_NVML_LIBRARY", nvml_lib),
                ("CUDA_VISIBLE_DEVICES", "1"),
            ],
        ),
        (
            "hidden",
            &[
                ("MEMPROBE_NVML_LIBRARY", nvml_lib),
                ("CUDA_VISIBLE_DEVICES", ""),
            ],
        ),
        // The default library name: no NVIDIA driver on a test machine, or a real one.
        ("default_name", &[]),
        // configure_shared overrides the environment (here: invalid) ...
        (
            "configure",
            &[
                ("MEMPROBE_GPU_BACKEND", "rocm"),
                ("MEMPROBE_TEST_NVML", nvml_lib),
            ],
        ),
        // ... and only before the shared instance is open.
        (
            "configure_late",
            &[
                ("MEMPROBE_GPU_BACKEND", "none"),
                ("MEMPROBE_TEST_NVML", nvml_lib),
            ],
        ),
    ];
    for (case, env) in cases {
        let mut env = env.to_vec();
        env.push((CASE, case));
        let out = run_child("environment_child", &env);
        assert_child_ok(&out, &format!("CHILD-DONE {case}"));
    }
}

#[test]
fn environment_child() {
    if !is_child("environment_child") {
        return;
    }
    let case = std::env::var(CASE).unwrap();
    match case.as_str() {
        "unknown" => {
            let e = GpuConfig::from_env().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.message().contains("\"rocm\""), "{e}");
            assert_eq!(
                Gpus::from_env().unwrap_err().kind(),
                ErrorKind::InvalidArgument
            );
            // The shared instance keeps the error as its reason.
            let shared = Gpus::shared();
            assert_eq!(shared.backend(), GpuBackend::None);
            assert_eq!(
                shared.unavailable_reason().unwrap().kind(),
                ErrorKind::InvalidArgument
            );
            let m = memprobe_gpu::gpu_mem_get(None);
            assert_eq!(m.error.unwrap().kind(), ErrorKind::InvalidArgument);
        }
        "none" => {
            assert_eq!(Gpus::shared().backend(), GpuBackend::None);
            assert_eq!(
                Gpus::shared().device_count().unwrap_err().kind(),
                ErrorKind::Unavailable
            );
        }
        "nvml" | "auto" | "auto_empty" => {
            let c = GpuConfig::from_env().unwrap();
            let expected = if case == "nvml" {
                GpuBackend::Nvml
            } else {
                GpuBackend::Auto
            };
            assert_eq!(c.backend, expected);
            assert_eq!(c.visible_devices, None);
            assert_eq!(Gpus::shared().backend(), GpuBackend::Nvml);
            assert_eq!(Gpus::shared().device_count().unwrap(), 2);
        }
        "cudart" => {
            assert_eq!(Gpus::shared().backend(), GpuBackend::Cudart);
            assert_eq!(Gpus::shared().device_count().unwrap(), 3);
            memprobe_gpu::preload().unwrap();
        }
        "visible" => {
            assert_eq!(
                GpuConfig::from_env().unwrap().visible_devices.as_deref(),
                Some("1")
            );
            assert_eq!(Gpus::shared().device_count().unwrap(), 1);
            assert_eq!(Gpus::shared().device(0).unwrap().info().nvml_index, Some(1));
        }
        "hidden" => {
            assert_eq!(Gpus::shared().device_count().unwrap(), 0);
            let m = memprobe_gpu::gpu_mem_get(None);
            assert_eq!(m.error.unwrap().kind(), ErrorKind::Unavailable);
        }
        "default_name" => {
            let gpus = Gpus::shared();
            match gpus.unavailable_reason() {
                Some(e) => {
                    assert_eq!(gpus.backend(), GpuBackend::None);
                    assert!(e.message().contains("libnvidia-ml.so.1"), "{e}");
                }
                None => assert_eq!(gpus.backend(), GpuBackend::Nvml),
            }
        }
        "configure" => {
            let lib = std::env::var("MEMPROBE_TEST_NVML").unwrap();
            let config = |path: &str| GpuConfig {
                backend: GpuBackend::Nvml,
                nvml_path: Some(path.into()),
                ..GpuConfig::default()
            };
            // A failed configuration sets nothing: it can be repeated.
            let e = Gpus::configure_shared(config("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unavailable);
            let gpus = Gpus::configure_shared(config(&lib)).unwrap();
            assert!(std::ptr::eq(gpus, Gpus::shared()));
            assert_eq!(gpus.backend(), GpuBackend::Nvml);
            assert_eq!(gpus.device_count().unwrap(), 2);
            let e = Gpus::configure_shared(config(&lib)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::WrongOrder);
        }
        "configure_late" => {
            assert_eq!(Gpus::shared().backend(), GpuBackend::None);
            let lib = std::env::var("MEMPROBE_TEST_NVML").unwrap();
            let e = Gpus::configure_shared(GpuConfig {
                nvml_path: Some(lib.into()),
                ..GpuConfig::default()
            })
            .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::WrongOrder);
            assert_eq!(Gpus::shared().backend(), GpuBackend::None);
        }
        other => panic!("unknown case {other}"),
    }
    println!("CHILD-DONE {case}");
}
