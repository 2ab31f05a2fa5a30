//! The GPU module (over the fake NVML the test configures): current device,
//! memory readings, device handles, cache release.

use crate::support::*;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::*;

/// Makes the call `op` chooses (run_seed dispatches it here), with
/// arbitrary arguments and handles.
pub(crate) fn call(op: u64, rng: &mut Rng, p: &mut Pool, cx: &Seq) {
    let call = |what: &str, st: memprobe_status| {
        check(cx.seed, cx.step, what, st);
        st
    };
    // SAFETY: for every arm, out-pointers are valid or NULL, strings
    // are NUL-terminated or NULL, arrays hold the lengths passed;
    // handles are arbitrary values, which is the point.
    unsafe {
        match op {
            39 => {
                // The GPU module: configured to the fake NVML, a bad
                // path or none; every query, the device handles.
                let id = if rng.chance(80) {
                    rng.below(3) as u32
                } else {
                    rng.next() as u32
                };
                let mut v = 0u64;
                let mut u = 0u32;
                let mut mem = std::mem::zeroed::<gpu::memprobe_gpu_memory>();
                match rng.below(12) {
                    0 => {
                        let backend = if rng.chance(80) {
                            rng.below(4) as u32
                        } else {
                            rng.next() as u32
                        };
                        let nvml = gpu_lib_path(rng, &cx.fake_nvml);
                        let cudart = gpu_lib_path(rng, &cx.fake_nvml);
                        call(
                            "gpu_configure",
                            gpu::memprobe_gpu_configure(backend, cptr(&nvml), cptr(&cudart)),
                        );
                    }
                    1 => {
                        call("gpu_preload", gpu::memprobe_gpu_preload());
                        call("gpu_count", gpu::memprobe_gpu_count(&mut u));
                        call("gpu_get_backend", gpu::memprobe_gpu_get_backend(&mut u));
                    }
                    2 => {
                        call(
                            "gpu_set_current_device",
                            gpu::memprobe_gpu_set_current_device(id),
                        );
                        call(
                            "gpu_get_current_device",
                            gpu::memprobe_gpu_get_current_device(&mut u),
                        );
                    }
                    3 => {
                        let mut info = std::mem::zeroed::<gpu::memprobe_gpu_info>();
                        call("gpu_get_info", gpu::memprobe_gpu_get_info(id, &mut info));
                    }
                    4 => {
                        let id = if rng.chance(80) {
                            rng.below(4) as i64 - 1
                        } else {
                            rng.next() as i64
                        };
                        call("gpu_mem_get", gpu::memprobe_gpu_mem_get(id, &mut mem));
                    }
                    5 => {
                        let mut all = vec![std::mem::zeroed::<gpu::memprobe_gpu_memory>(); 4];
                        let cap = rng.below(5) as usize;
                        let ptr = if rng.chance(90) {
                            all.as_mut_ptr()
                        } else {
                            std::ptr::null_mut()
                        };
                        let mut n = 0usize;
                        call(
                            "gpu_mem_get_all",
                            gpu::memprobe_gpu_mem_get_all(ptr, cap, &mut n),
                        );
                    }
                    6 => {
                        call("gpu_mem_get_free", gpu::memprobe_gpu_mem_get_free(&mut v));
                        call("gpu_mem_get_used", gpu::memprobe_gpu_mem_get_used(&mut v));
                        call(
                            "gpu_mem_get_free_no_cache",
                            gpu::memprobe_gpu_mem_get_free_no_cache(&mut v),
                        );
                        call(
                            "gpu_mem_get_used_no_cache",
                            gpu::memprobe_gpu_mem_get_used_no_cache(&mut v),
                        );
                    }
                    7 => {
                        let mut best = 0i64;
                        call(
                            "gpu_with_max_free_mem",
                            gpu::memprobe_gpu_with_max_free_mem(&mut best, &mut v),
                        );
                    }
                    8 => {
                        let cb = if rng.chance(70) {
                            Some(release_cb as _)
                        } else {
                            None
                        };
                        call(
                            "gpu_set_cache_release",
                            gpu::memprobe_gpu_set_cache_release(cb, std::ptr::null_mut()),
                        );
                    }
                    9 => {
                        let mut d = std::ptr::null_mut::<gpu::memprobe_gpu_device>();
                        if call("gpu_device_open", gpu::memprobe_gpu_device_open(id, &mut d))
                            == memprobe_status::Ok
                        {
                            p.devices.push(d as usize);
                        }
                    }
                    10 => {
                        let d = pick(rng, &p.devices, p) as *const gpu::memprobe_gpu_device;
                        call(
                            "gpu_device_mem_get",
                            gpu::memprobe_gpu_device_mem_get(d, &mut mem),
                        );
                        call(
                            "gpu_device_process_used",
                            gpu::memprobe_gpu_device_process_used(d, &mut v),
                        );
                        call(
                            "gpu_mem_get_used_fast",
                            gpu::memprobe_gpu_mem_get_used_fast(d, &mut v),
                        );
                        call(
                            "gpu_debug_live_devices",
                            gpu::memprobe_gpu_debug_live_devices(&mut v),
                        );
                        // Origins: no interposer here; any device, any buffer.
                        let dev = rng.below(67) as i32 - 2;
                        let mut buf = vec![std::mem::zeroed::<origins::memprobe_gpu_origin>(); 2];
                        let cap = rng.below(3) as usize;
                        let ptr = if rng.chance(90) {
                            buf.as_mut_ptr()
                        } else {
                            std::ptr::null_mut()
                        };
                        let mut n = 0usize;
                        call(
                            "gpu_origins_live",
                            origins::memprobe_gpu_origins_live(dev, ptr, cap, &mut n),
                        );
                        let mut at = 0u64;
                        call(
                            "gpu_origins_at_peak",
                            origins::memprobe_gpu_origins_at_peak(
                                dev, ptr, cap, &mut n, &mut v, &mut at,
                            ),
                        );
                        let mut failed_on = 0i32;
                        let on = if rng.chance(50) {
                            &mut failed_on as *mut i32
                        } else {
                            std::ptr::null_mut()
                        };
                        call(
                            "gpu_origins_at_oom",
                            origins::memprobe_gpu_origins_at_oom(
                                ptr, cap, &mut n, on, &mut v, &mut at,
                            ),
                        );
                    }
                    _ => {
                        let d = pick(rng, &p.devices, p);
                        if call(
                            "gpu_device_free",
                            gpu::memprobe_gpu_device_free(d as *mut gpu::memprobe_gpu_device),
                        ) == memprobe_status::Ok
                        {
                            p.devices.retain(|&x| x != d);
                        }
                    }
                }
            }
            _ => unreachable!("op {op} is not a gpu call"),
        }
    }
}
