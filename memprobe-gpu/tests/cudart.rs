//! The CUDA runtime backend on the fake libcudart.

mod common;

use common::{Fake, GIB, MIB};
use memprobe_core::ErrorKind;
use memprobe_gpu::{GpuBackend, GpuConfig, GpuMemory, Gpus};

#[test]
fn count_and_memory() {
    let f = Fake::cudart(
        "devices 2\ncontext 0\n\
         device 0 total 17179869184\ndevice 0 free 16106127360 15032385536\n\
         device 1 total 8589934592\ndevice 1 free 4294967296\ndevice 1 pci 00000000:3B:00.0\n",
    );
    let gpus = Gpus::open(f.cudart_config()).unwrap();
    assert_eq!(gpus.backend(), GpuBackend::Cudart);
    assert_eq!(gpus.library_path(), Some(f.lib.to_str().unwrap()));
    assert_eq!(gpus.device_count().unwrap(), 2);
    let h0 = gpus.device(0).unwrap();
    let m = h0.memory().unwrap();
    assert_eq!(
        (m.total, m.free, m.used, m.reserved),
        (16 * GIB, 15 * GIB, GIB, None)
    );
    assert!(m.taken_at_ns > 0);
    assert_eq!(h0.memory().unwrap().used, 2 * GIB);
    let h1 = gpus.device(1).unwrap();
    assert_eq!(h1.info().pci_bus_id.as_deref(), Some("00000000:3B:00.0"));
    assert_eq!(
        (h1.info().name.clone(), h1.info().uuid.clone()),
        (None, None)
    );
    assert_eq!(h1.memory().unwrap().used, 4 * GIB);
    // Reading device 1 does not change the calling thread's current device.
    assert_eq!(gpus.current_device().unwrap(), 0);
    assert_eq!(gpus.device(2).unwrap_err().kind(), ErrorKind::InvalidId);
}

#[test]
fn current_device_is_cuda_s() {
    let f = Fake::cudart("devices 3\ncontext 0\ndevice 2 free 1073741824\n");
    let gpus = Gpus::open(f.cudart_config()).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            gpus.set_current_device(2).unwrap();
            assert_eq!(gpus.current_device().unwrap(), 2);
            assert_eq!(gpus.gpu_mem_get(None).value.free, GIB);
        });
    });
    // cudaSetDevice is per thread: this thread is still on 0.
    assert_eq!(gpus.current_device().unwrap(), 0);
    assert_eq!(
        gpus.set_current_device(3).unwrap_err().kind(),
        ErrorKind::InvalidId
    );
}

#[test]
fn insufficient_driver_and_no_device_are_unavailable() {
    for (script, text) in [
        ("error 35\n", "cudaErrorInsufficientDriver"),
        ("devices 0\n", "cudaErrorNoDevice"),
        ("error 3\n", "cudaErrorInitializationError"),
    ] {
        let f = Fake::cudart(script);
        let e = Gpus::open(f.cudart_config()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{script}");
        assert!(e.message().contains(text), "{e}");
    }
}

#[test]
fn library_absent() {
    let config = GpuConfig {
        backend: GpuBackend::Cudart,
        cudart_path: Some("/nonexistent/libcudart.so".into()),
        ..GpuConfig::default()
    };
    let e = Gpus::open(config).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("/nonexistent/libcudart.so"), "{e}");
    assert!(e.message().contains("MEMPROBE_CUDART_LIBRARY"), "{e}");
}

#[test]
fn a_library_missing_symbols() {
    // The NVML fake is a library without any CUDA runtime symbol.
    let nvml = Fake::nvml("");
    let config = GpuConfig {
        backend: GpuBackend::Cudart,
        cudart_path: Some(nvml.lib.clone()),
        ..GpuConfig::default()
    };
    let e = Gpus::open(config).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("lacks cudaGetDeviceCount"), "{e}");
}

#[test]
fn preload_creates_the_context() {
    let f = Fake::cudart("devices 2\ncontext 314572800\ndevice 1 free 10737418240\n");
    let gpus = Gpus::open(f.cudart_config()).unwrap();
    assert_eq!(f.cudart_contexts(), 0);
    gpus.preload().unwrap();
    assert_eq!(f.cudart_contexts(), 1);
    gpus.preload().unwrap();
    assert_eq!(f.cudart_contexts(), 1);
    // The context's memory shows in the readings.
    let h = gpus.device(1).unwrap();
    assert_eq!(h.memory().unwrap().free, 10 * GIB - 300 * MIB);
    assert_eq!(f.cudart_contexts(), 2);
}

#[test]
fn no_process_figures() {
    let f = Fake::cudart("devices 1\n");
    let gpus = Gpus::open(f.cudart_config()).unwrap();
    let e = gpus.device(0).unwrap().process_memory().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(gpus.process_sampler(0).is_err());
    assert!(gpus.device_sampler(0).is_ok());
}

#[test]
fn auto_never_falls_back_to_cudart() {
    let cudart = Fake::cudart("devices 1\n");
    let gpus = Gpus::open(GpuConfig {
        backend: GpuBackend::Auto,
        nvml_path: Some("/nonexistent/libnvidia-ml.so.1".into()),
        cudart_path: Some(cudart.lib.clone()),
        visible_devices: None,
    })
    .unwrap();
    assert_eq!(gpus.backend(), GpuBackend::None);
    assert_eq!(gpus.gpu_mem_get(None).value, GpuMemory::ZERO);
    assert_eq!(cudart.cudart_contexts(), 0);
}

#[test]
fn preload_with_the_nvml_backend_loads_the_runtime() {
    let nvml = Fake::nvml("devices 2\n");
    let cudart = Fake::cudart("devices 2\n");
    let gpus = Gpus::open(GpuConfig {
        cudart_path: Some(cudart.lib.clone()),
        ..nvml.nvml_config()
    })
    .unwrap();
    assert_eq!(gpus.backend(), GpuBackend::Nvml);
    gpus.set_current_device(1).unwrap();
    gpus.preload().unwrap();
    assert_eq!(cudart.cudart_contexts(), 1);

    let gpus = Gpus::open(GpuConfig {
        cudart_path: Some("/nonexistent/libcudart.so".into()),
        ..nvml.nvml_config()
    })
    .unwrap();
    assert_eq!(gpus.preload().unwrap_err().kind(), ErrorKind::Unavailable);
}
