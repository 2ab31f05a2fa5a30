//! Sources: the constructors of every kind (process, pushed, callback, tree,
//! cgroup, smaps, system RAM, GPU device and process, exact GPU), their
//! readings, pushes, infos, last errors and frees.

use crate::support::*;
use memprobe_ffi_impl::source::{memprobe_sample, memprobe_source, memprobe_source_info};
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::*;
use std::ffi::c_char;

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
            0 => {
                let mut h = std::ptr::null_mut::<memprobe_source>();
                let flags = if rng.chance(80) { 0 } else { rng.next() as u32 };
                if call(
                    "new_process",
                    source::memprobe_source_new_process(flags, &mut h),
                ) == memprobe_status::Ok
                {
                    p.sources.push(h as usize);
                }
            }
            1 => {
                let name = text(rng);
                let mut h = std::ptr::null_mut::<memprobe_source>();
                if call(
                    "new_pushed",
                    source::memprobe_source_new_pushed(cptr(&name), &mut h),
                ) == memprobe_status::Ok
                {
                    p.sources.push(h as usize);
                }
            }
            2 => {
                let mut h = std::ptr::null_mut::<memprobe_source>();
                let f = if rng.chance(90) {
                    Some(read_cb as _)
                } else {
                    None
                };
                let name = text(rng);
                if call(
                    "new_callback",
                    source::memprobe_source_new_callback(cptr(&name), f, cx.counter_ptr, &mut h),
                ) == memprobe_status::Ok
                {
                    p.sources.push(h as usize);
                }
            }
            3 => {
                let mut h = std::ptr::null_mut::<memprobe_source>();
                let st = if rng.chance(25) {
                    // The tree's PSS / USS: metrics 0 and 1, or any value.
                    let metric = if rng.chance(80) {
                        rng.below(2) as u32
                    } else {
                        rng.next() as u32
                    };
                    let out = out_ptr(&mut h, rng.chance(90));
                    call(
                        "new_process_tree_smaps",
                        source::memprobe_source_new_process_tree_smaps(metric, out),
                    )
                } else {
                    call(
                        "new_system_ram",
                        source::memprobe_source_new_system_ram(&mut h),
                    )
                };
                if st == memprobe_status::Ok {
                    p.sources.push(h as usize);
                }
            }
            4 => {
                let h = pick(rng, &p.sources, p);
                let give = rng.chance(90);
                if rng.chance(50) {
                    let mut s = memprobe_sample::default();
                    let out = out_ptr(&mut s, give);
                    call(
                        "source_read",
                        source::memprobe_source_read(h as *const memprobe_source, out),
                    );
                } else {
                    let mut used = 0u64;
                    let out = out_ptr(&mut used, give);
                    call(
                        "source_read_used",
                        source::memprobe_source_read_used(h as *const memprobe_source, out),
                    );
                }
            }
            5 => {
                let h = pick(rng, &p.sources, p);
                call(
                    "source_push",
                    source::memprobe_source_push(h as *const memprobe_source, rng.next()),
                );
            }
            6 => {
                let h = pick(rng, &p.sources, p);
                let mut i = std::mem::zeroed::<memprobe_source_info>();
                call(
                    "source_info",
                    source::memprobe_source_get_info(h as *const memprobe_source, &mut i),
                );
            }
            7 => {
                let h = pick(rng, &p.sources, p);
                if call(
                    "source_free",
                    source::memprobe_source_free(h as *mut memprobe_source),
                ) == memprobe_status::Ok
                {
                    p.sources.retain(|&x| x != h);
                }
            }
            38 => {
                // Other host sources and the GPU sources (exact ones
                // need the interposer, which this process lacks).
                let mut h = std::ptr::null_mut::<memprobe_source>();
                let id = if rng.chance(80) {
                    rng.below(3) as u32
                } else {
                    rng.next() as u32
                };
                let st = match rng.below(6) {
                    0 => call(
                        "source_new_cgroup",
                        source::memprobe_source_new_cgroup(&mut h),
                    ),
                    1 => call(
                        "source_new_process_tree",
                        source::memprobe_source_new_process_tree(&mut h),
                    ),
                    2 => call(
                        "source_new_smaps",
                        source::memprobe_source_new_smaps(
                            if rng.chance(80) {
                                rng.below(2) as u32
                            } else {
                                rng.next() as u32
                            },
                            &mut h,
                        ),
                    ),
                    3 => call(
                        "source_new_gpu_device",
                        gpu::memprobe_source_new_gpu_device(id, &mut h),
                    ),
                    4 => call(
                        "source_new_gpu_process",
                        gpu::memprobe_source_new_gpu_process(id, &mut h),
                    ),
                    _ => call(
                        "source_new_gpu_exact",
                        gpu_exact::memprobe_source_new_gpu_exact(id, &mut h),
                    ),
                };
                if st == memprobe_status::Ok {
                    p.sources.push(h as usize);
                }
            }
            _ => {
                let h = pick(rng, &p.sources, p);
                let mut err = memprobe_status::Ok;
                let mut buf = [0 as c_char; 16];
                call(
                    "source_get_last_error",
                    source::memprobe_source_get_last_error(
                        h as *const memprobe_source,
                        &mut err,
                        buf.as_mut_ptr(),
                        buf.len(),
                        std::ptr::null_mut(),
                    ),
                );
            }
        }
    }
}
