//! Trackers' OOM reports: configured with arbitrary options and destinations,
//! triggered by the caller (plain and with an event), their status, re-armed.

use crate::support::*;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::tracker::memprobe_tracker;
use memprobe_ffi_impl::*;
use std::ffi::CString;

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
            34 => {
                let h = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                let mut o: oom_report::memprobe_oom_report_options = std::mem::zeroed();
                o.struct_size = match rng.below(8) {
                    0 => rng.below(64) as u32,
                    _ => std::mem::size_of::<oom_report::memprobe_oom_report_options>() as u32,
                };
                o.triggers = match rng.below(6) {
                    0 => rng.next() as u32,
                    1 => oom_report::MEMPROBE_OOM_TRIGGER_DRIVER,
                    _ => oom_report::MEMPROBE_OOM_TRIGGER_CALLER,
                };
                // Random names stay inside the scratch directory.
                let path = match rng.below(5) {
                    0 => None,
                    1 => Some(CString::new(vec![0xff, 0xfe]).unwrap()),
                    2 => Some(
                        CString::new(format!("{}/{}", cx.oom_dir.display(), rng.below(4))).unwrap(),
                    ),
                    3 => Some(CString::new(cx.oom_dir.display().to_string()).unwrap()),
                    _ => Some(CString::new(cx.oom_path.clone()).unwrap()),
                };
                o.path = cptr(&path);
                o.json_fd = [0, -1, cx.null_fd, -3][rng.below(4) as usize];
                o.summary_fd = [0, -1, cx.null_fd, 12345][rng.below(4) as usize];
                o.callback = rng
                    .chance(50)
                    .then_some(oom_cb as unsafe extern "C" fn(_, _, _));
                o.keep_ended = match rng.below(4) {
                    0 => rng.next() as u32,
                    _ => rng.below(20) as u32,
                };
                let arg = if rng.chance(15) {
                    std::ptr::null()
                } else {
                    &o as *const _
                };
                call(
                    "tracker_set_oom_report",
                    oom_report::memprobe_tracker_set_oom_report(h, arg),
                );
            }
            35 => {
                let h = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                let device = match rng.below(4) {
                    0 => rng.next() as i32,
                    1 => -1,
                    _ => rng.below(8) as i32,
                };
                let detail = text(rng);
                match rng.below(4) {
                    0 => {
                        call(
                            "tracker_report_oom",
                            oom_report::memprobe_tracker_report_oom(
                                h,
                                device,
                                rng.next(),
                                cptr(&detail),
                            ),
                        );
                    }
                    1 => {
                        let caches = [oom_report::memprobe_oom_report_cache {
                            device: rng.below(70) as u32,
                            valid: rng.below(16) as u32,
                            reserved_bytes: rng.next(),
                            allocated_bytes: rng.next(),
                            releasable_bytes: rng.next(),
                        }];
                        let by = text(rng);
                        let mut e: oom_report::memprobe_oom_report_event = std::mem::zeroed();
                        // Ours, the header's before live_blocks_json (64 bytes),
                        // or too small.
                        e.struct_size = match rng.below(10) {
                            0..=7 => {
                                std::mem::size_of::<oom_report::memprobe_oom_report_event>() as u32
                            }
                            8 => 64,
                            _ => rng.below(48) as u32,
                        };
                        e.device = device;
                        e.requested_bytes = rng.next();
                        e.reported_by = cptr(&by);
                        e.detail = cptr(&detail);
                        // A record, a cut or garbled one, or text.
                        let live = match rng.below(4) {
                            0 => text(rng),
                            n => {
                                let record = format!(
                                    "{{\"schema\":\"memprobe.torch_attribution/1\",\"kind\":\"oom\",\
                                     \"requested_bytes\":{},\"blocks\":[{{\"bytes\":{},\"frames\":\
                                     [{{\"file\":\"t.py\",\"line\":{},\"function\":\"f\"}}]}}],\
                                     \"segments\":[{{\"bytes\":{},\"allocated\":{}}}]}}",
                                    rng.next(),
                                    rng.next(),
                                    rng.below(1000),
                                    rng.next(),
                                    rng.next()
                                );
                                let cut = match n {
                                    1 => record.len(),
                                    _ => rng.below(record.len() as u64) as usize,
                                };
                                Some(std::ffi::CString::new(&record[..cut]).unwrap())
                            }
                        };
                        if e.struct_size as usize
                            == std::mem::size_of::<oom_report::memprobe_oom_report_event>()
                        {
                            e.live_blocks_json = cptr(&live);
                        }
                        e.valid = rng.below(8) as u32;
                        e.n_caches = rng.below(3) as u32;
                        e.caches = if rng.chance(80) {
                            caches.as_ptr()
                        } else {
                            std::ptr::null()
                        };
                        if e.n_caches > 1 && !e.caches.is_null() {
                            e.n_caches = 1;
                        }
                        let arg = if rng.chance(10) {
                            std::ptr::null()
                        } else {
                            &e as *const _
                        };
                        call(
                            "tracker_report_oom_event",
                            oom_report::memprobe_tracker_report_oom_event(h, arg),
                        );
                    }
                    2 => {
                        let mut st = oom_report::memprobe_oom_report_status::default();
                        let out = out_ptr(&mut st, rng.chance(90));
                        call(
                            "tracker_oom_status",
                            oom_report::memprobe_tracker_oom_status(h, out),
                        );
                    }
                    _ => {
                        call(
                            "tracker_rearm_oom_report",
                            oom_report::memprobe_tracker_rearm_oom_report(h),
                        );
                    }
                }
            }
            _ => unreachable!("op {op} is not a oom_report call"),
        }
    }
}
