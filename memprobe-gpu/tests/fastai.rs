//! fastai `utils.mem` conventions: bytes, zeros plus a status, current device.

mod common;

use common::{assert_child_ok, is_child, run_child, Fake, GIB, MIB};
use memprobe_core::{Error, ErrorKind};
use memprobe_gpu::{b2mb, gpu_mem_get_used_fast, GpuBackend, GpuConfig, GpuMemory, Gpus, Outcome};
use std::sync::atomic::{AtomicU32, Ordering};

fn three_gpus() -> Fake {
    Fake::nvml(
        "devices 3\n\
         device 0 total 17179869184\ndevice 0 used 1073741824\n\
         device 1 total 17179869184\ndevice 1 used 536870912\ndevice 1 reserved 268435456\n\
         device 2 total 17179869184\ndevice 2 used 536870912\n",
    )
}

#[test]
fn gpu_mem_get() {
    let f = three_gpus();
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let m = gpus.gpu_mem_get(Some(1));
    assert!(m.is_ok());
    assert_eq!(
        (m.value.total, m.value.used, m.value.reserved),
        (16 * GIB, 512 * MIB, Some(256 * MIB))
    );
    assert_eq!(m.value.free, 16 * GIB - 512 * MIB - 256 * MIB);
    assert!(m.value.taken_at_ns > 0);
    // The current device: 0 by default.
    assert_eq!(gpus.gpu_mem_get(None).value.used, GIB);
    gpus.set_current_device(2).unwrap();
    assert_eq!(gpus.gpu_mem_get(None).value.used, 512 * MIB);
    assert_eq!(gpus.gpu_mem_get_used().value, 512 * MIB);
    assert_eq!(gpus.gpu_mem_get_free().value, 16 * GIB - 512 * MIB);
}

#[test]
fn invalid_id_is_zeros_and_invalid_id() {
    let f = three_gpus();
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let m = gpus.gpu_mem_get(Some(3));
    assert_eq!(m.value, GpuMemory::ZERO);
    assert_eq!(m.error.as_ref().unwrap().kind(), ErrorKind::InvalidId);
    assert_eq!(
        m.clone().into_result().unwrap_err().kind(),
        ErrorKind::InvalidId
    );
}

#[test]
fn no_gpu_is_zeros_and_unavailable() {
    let no_backend = Gpus::open(GpuConfig {
        backend: GpuBackend::None,
        ..GpuConfig::default()
    })
    .unwrap();
    let f = Fake::nvml("devices 0\n");
    let no_devices = Gpus::open(f.nvml_config()).unwrap();
    for gpus in [&no_backend, &no_devices] {
        let unavailable = |e: &Option<Error>| e.as_ref().unwrap().kind() == ErrorKind::Unavailable;
        let m = gpus.gpu_mem_get(None);
        assert_eq!(m.value, GpuMemory::ZERO);
        assert!(unavailable(&m.error), "{m:?}");
        let m = gpus.gpu_mem_get(Some(0));
        assert!(unavailable(&m.error), "{m:?}");
        let all = gpus.gpu_mem_get_all();
        assert!(all.value.is_empty());
        assert!(unavailable(&all.error), "{all:?}");
        let best = gpus.gpu_with_max_free_mem();
        assert_eq!(best.value, (None, 0));
        assert!(unavailable(&best.error), "{best:?}");
        // (The *_no_cache variants are checked in no_cache_variants_release_first.)
        for o in [gpus.gpu_mem_get_free(), gpus.gpu_mem_get_used()] {
            assert_eq!(o.value, 0);
            assert!(unavailable(&o.error), "{o:?}");
        }
        assert_eq!(gpus.preload().unwrap_err().kind(), ErrorKind::Unavailable);
    }
}

#[test]
fn gpu_mem_get_all_and_max_free() {
    let f = three_gpus();
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let all = gpus.gpu_mem_get_all();
    assert!(all.is_ok());
    let used: Vec<u64> = all.value.iter().map(|m| m.used).collect();
    assert_eq!(used, [GIB, 512 * MIB, 512 * MIB]);
    // Devices 1 and 2 both have the most free memory? No: 1 has a reservation.
    assert_eq!(
        gpus.gpu_with_max_free_mem(),
        Outcome::ok((Some(2), 16 * GIB - 512 * MIB))
    );

    // Ties: the first device wins.
    let f = Fake::nvml("devices 3\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    assert_eq!(gpus.gpu_with_max_free_mem().value.0, Some(0));
}

#[test]
fn a_lost_device_reads_as_zeros_and_the_rest_still_count() {
    let f = Fake::nvml("devices 3\ndevice 0 used 9999999999\ndevice 1 lost_at 1\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let all = gpus.gpu_mem_get_all();
    assert_eq!(all.value.len(), 3);
    assert_eq!(all.value[1], GpuMemory::ZERO);
    assert_ne!(all.value[2], GpuMemory::ZERO);
    assert_eq!(all.error.as_ref().unwrap().kind(), ErrorKind::GpuLost);
    let best = gpus.gpu_with_max_free_mem();
    assert_eq!(best.value.0, Some(2));
    assert_eq!(best.error.unwrap().kind(), ErrorKind::GpuLost);
    let m = gpus.gpu_mem_get(Some(1));
    assert_eq!(
        (m.value, m.error.unwrap().kind()),
        (GpuMemory::ZERO, ErrorKind::GpuLost)
    );
}

#[test]
fn used_fast_on_a_handle() {
    let f = Fake::nvml("device 0 used 5 6\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let h = gpus.device(0).unwrap();
    assert_eq!(gpu_mem_get_used_fast(&h), Outcome::ok(5));
    assert_eq!(gpu_mem_get_used_fast(&h), Outcome::ok(6));
    let f = Fake::nvml("device 0 lost_at 1\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    let o = gpu_mem_get_used_fast(&gpus.device(0).unwrap());
    assert_eq!((o.value, o.error.unwrap().kind()), (0, ErrorKind::GpuLost));
}

/// The cache-release callback is process-wide, so this is the only test in
/// this binary that registers one.
#[test]
fn no_cache_variants_release_first() {
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let f = Fake::nvml("device 0 used 3000 1000 1000 1000\n");
    let gpus = Gpus::open(f.nvml_config()).unwrap();
    memprobe_gpu::set_cache_release(|| {
        CALLS.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    assert_eq!(gpus.gpu_mem_get_used_no_cache(), Outcome::ok(3000));
    assert_eq!(gpus.gpu_mem_get_free_no_cache().value, 16 * GIB - 1000);
    assert_eq!(CALLS.load(Ordering::SeqCst), 2);
    assert_eq!(gpus.gpu_mem_get_used(), Outcome::ok(1000));
    assert_eq!(CALLS.load(Ordering::SeqCst), 2);

    memprobe_gpu::set_cache_release(|| Err(Error::new(ErrorKind::Unsupported, "no allocator")));
    let o = gpus.gpu_mem_get_used_no_cache();
    assert_eq!((o.value, o.error.unwrap().message()), (0, "no allocator"));

    memprobe_gpu::set_cache_release(|| panic!("callback bug"));
    let o = gpus.gpu_mem_get_free_no_cache();
    assert_eq!((o.value, o.error.unwrap().kind()), (0, ErrorKind::Internal));

    memprobe_gpu::clear_cache_release();
    assert!(memprobe_gpu::release_caches().is_ok());
    assert!(gpus.gpu_mem_get_used_no_cache().is_ok());

    // No GPU: the callback still runs, then zeros and the reason.
    memprobe_gpu::set_cache_release(|| {
        CALLS.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let none = Gpus::open(GpuConfig {
        backend: GpuBackend::None,
        ..GpuConfig::default()
    })
    .unwrap();
    for o in [
        none.gpu_mem_get_free_no_cache(),
        none.gpu_mem_get_used_no_cache(),
    ] {
        assert_eq!(
            (o.value, o.error.unwrap().kind()),
            (0, ErrorKind::Unavailable)
        );
    }
    assert_eq!(CALLS.load(Ordering::SeqCst), 4);
    memprobe_gpu::clear_cache_release();
}

#[test]
fn b2mb_is_floor_mib() {
    assert_eq!(b2mb(161 * MIB + MIB - 1), 161);
    assert_eq!(b2mb(4 * GIB), 4096);
}

/// The free functions use the process-wide instance, opened from the environment.
#[test]
fn free_functions_use_the_shared_instance() {
    let f = three_gpus();
    let out = run_child(
        "free_functions_child",
        &[("MEMPROBE_NVML_LIBRARY", f.lib.to_str().unwrap())],
    );
    assert_child_ok(&out, "CHILD-DONE");
    // Without any GPU library: zeros and the reason.
    let out = run_child(
        "free_functions_no_gpu_child",
        &[("MEMPROBE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")],
    );
    assert_child_ok(&out, "CHILD-DONE");
}

#[test]
fn free_functions_child() {
    if !is_child("free_functions_child") {
        return;
    }
    use memprobe_gpu::*;
    assert_eq!(Gpus::shared().backend(), GpuBackend::Nvml);
    assert_eq!(gpu_mem_get(Some(0)).value.used, GIB);
    assert_eq!(gpu_mem_get(None).value.used, GIB);
    assert_eq!(gpu_mem_get_all().value.len(), 3);
    assert_eq!(gpu_mem_get_used(), Outcome::ok(GIB));
    assert_eq!(gpu_mem_get_free(), Outcome::ok(15 * GIB));
    assert_eq!(gpu_mem_get_used_no_cache(), Outcome::ok(GIB));
    assert_eq!(gpu_mem_get_free_no_cache(), Outcome::ok(15 * GIB));
    assert_eq!(gpu_with_max_free_mem().value.0, Some(2));
    assert_eq!(device_sampler(1).unwrap().info().name, "gpu1");
    assert_eq!(process_sampler(2).unwrap().info().name, "gpu2.proc");
    println!("CHILD-DONE");
}

#[test]
fn free_functions_no_gpu_child() {
    if !is_child("free_functions_no_gpu_child") {
        return;
    }
    use memprobe_gpu::*;
    assert_eq!(Gpus::shared().backend(), GpuBackend::None);
    let m = gpu_mem_get(None);
    assert_eq!(m.value, GpuMemory::ZERO);
    let e = m.error.unwrap();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(
        e.message().contains("/nonexistent/libnvidia-ml.so.1"),
        "{e}"
    );
    assert!(gpu_mem_get_all().value.is_empty());
    assert_eq!(gpu_with_max_free_mem().value, (None, 0));
    assert_eq!(preload().unwrap_err().kind(), ErrorKind::Unavailable);
    assert_eq!(
        device_sampler(0).err().unwrap().kind(),
        ErrorKind::Unavailable
    );
    println!("CHILD-DONE");
}
