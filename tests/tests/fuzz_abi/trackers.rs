//! Trackers: new, the phase boundaries, releases, leak policies, callback and
//! file sinks, the OOM retry, free.

use crate::support::*;
use memprobe_ffi_impl::source::memprobe_source;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::tracker::{memprobe_phase_record, memprobe_tracker};
use memprobe_ffi_impl::window::memprobe_delta;
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
            21 => {
                let n = rng.below(3) as usize;
                let list: Vec<*const memprobe_source> = (0..n)
                    .map(|_| pick(rng, &p.sources, p) as *const memprobe_source)
                    .collect();
                let mut h = std::ptr::null_mut::<memprobe_tracker>();
                if call(
                    "tracker_new",
                    tracker::memprobe_tracker_new(list.as_ptr(), n, &mut h),
                ) == memprobe_status::Ok
                {
                    p.trackers.push(h as usize);
                }
            }
            22..=24 => {
                let h = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                let kind = if rng.chance(90) {
                    rng.below(5) as u32
                } else {
                    rng.next() as u32
                };
                let name = if kind == 4 || rng.chance(10) {
                    text(rng)
                } else {
                    None
                };
                let mut rec = std::mem::zeroed::<memprobe_phase_record>();
                let mut deltas = vec![memprobe_delta::default(); 3];
                let n = rng.below(4) as usize;
                match op {
                    22 => call(
                        "tracker_begin",
                        tracker::memprobe_tracker_begin(h, kind, cptr(&name)),
                    ),
                    23 => call(
                        "tracker_end",
                        tracker::memprobe_tracker_end(
                            h,
                            kind,
                            cptr(&name),
                            &mut rec,
                            deltas.as_mut_ptr(),
                            n,
                        ),
                    ),
                    // The step boundaries: next, and the tail's three.
                    _ => match rng.below(6) {
                        4 => call(
                            "tracker_end_tail",
                            tracker::memprobe_tracker_end_tail(
                                h,
                                kind,
                                cptr(&name),
                                kind,
                                cptr(&name),
                                &mut rec,
                                deltas.as_mut_ptr(),
                                n,
                            ),
                        ),
                        0 => call(
                            "tracker_end_into",
                            tracker::memprobe_tracker_end_into(
                                h,
                                kind,
                                cptr(&name),
                                kind,
                                cptr(&name),
                                &mut rec,
                                deltas.as_mut_ptr(),
                                n,
                            ),
                        ),
                        1 => call(
                            "tracker_resume",
                            tracker::memprobe_tracker_resume(
                                h,
                                kind,
                                cptr(&name),
                                kind,
                                cptr(&name),
                            ),
                        ),
                        2 => call(
                            "tracker_mark_tail",
                            tracker::memprobe_tracker_mark_tail(h, kind, cptr(&name)),
                        ),
                        _ => call(
                            "tracker_next",
                            tracker::memprobe_tracker_next(
                                h,
                                kind,
                                cptr(&name),
                                std::ptr::null_mut(),
                                std::ptr::null_mut(),
                                0,
                            ),
                        ),
                    },
                };
            }
            25 => {
                let h = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                let name = text(rng);
                let kind = if rng.chance(90) {
                    rng.below(2) as u32
                } else {
                    rng.next() as u32
                };
                let cb = if rng.chance(90) {
                    Some(release_cb as _)
                } else {
                    None
                };
                call(
                    "tracker_add_release",
                    tracker::memprobe_tracker_add_release(
                        h,
                        cptr(&name),
                        kind,
                        cb,
                        std::ptr::null_mut(),
                    ),
                );
                call(
                    "tracker_release_every",
                    tracker::memprobe_tracker_release_every(
                        h,
                        rng.below(6) as u32,
                        rng.below(4),
                        rng.chance(50),
                    ),
                );
            }
            26 => {
                let h = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                call(
                    "tracker_set_leak_policy",
                    tracker::memprobe_tracker_set_leak_policy(
                        h,
                        rng.below(1 << 20),
                        rng.below(4) as u32,
                    ),
                );
                let (mut f, mut s, mut g) = (false, 0u32, 0i64);
                call(
                    "tracker_leak_status",
                    tracker::memprobe_tracker_leak_status(
                        h,
                        rng.below(4) as usize,
                        &mut f,
                        &mut s,
                        &mut g,
                    ),
                );
                call(
                    "tracker_release_below_free",
                    tracker::memprobe_tracker_release_below_free(
                        h,
                        rng.below(4) as usize,
                        rng.next(),
                        rng.chance(50),
                    ),
                );
            }
            27 => {
                let h = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                let cb = if rng.chance(90) {
                    Some(record_cb as _)
                } else {
                    None
                };
                call(
                    "tracker_add_callback_sink",
                    tracker::memprobe_tracker_add_callback_sink(h, cb, std::ptr::null_mut()),
                );
                let mut freed = [0u64; 4];
                call(
                    "tracker_release_now",
                    tracker::memprobe_tracker_release_now(
                        h,
                        rng.chance(50),
                        freed.as_mut_ptr(),
                        rng.below(5) as usize,
                    ),
                );
            }
            28 => {
                let h = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                let mut r = tracker::memprobe_oom_retry_result::default();
                let sc = cx.step_counter;
                call(
                    "tracker_run_oom_retry",
                    tracker::memprobe_tracker_run_oom_retry(
                        h,
                        Some(step_cb),
                        sc,
                        rng.below(4) as u32,
                        &mut r,
                        std::ptr::null_mut(),
                        0,
                    ),
                );
            }
            29 => {
                let h = pick(rng, &p.trackers, p);
                if call(
                    "tracker_free",
                    tracker::memprobe_tracker_free(h as *mut memprobe_tracker),
                ) == memprobe_status::Ok
                {
                    p.trackers.retain(|&x| x != h);
                }
            }
            41 => {
                // Tracker sinks into files, a descriptor, and their end.
                let h = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                let path = sink_path(rng, &cx.oom_dir);
                match rng.below(5) {
                    0 => call(
                        "tracker_add_csv_sink",
                        tracker::memprobe_tracker_add_csv_sink(h, cptr(&path)),
                    ),
                    1 => call(
                        "tracker_add_jsonl_sink",
                        tracker::memprobe_tracker_add_jsonl_sink(h, cptr(&path)),
                    ),
                    2 => {
                        let kind = if rng.chance(90) {
                            rng.below(5) as u32
                        } else {
                            rng.next() as u32
                        };
                        let fd = fd(rng, cx.null_fd);
                        call(
                            "tracker_add_table_sink",
                            tracker::memprobe_tracker_add_table_sink(h, kind, fd),
                        )
                    }
                    3 => call(
                        "tracker_finish_sinks",
                        tracker::memprobe_tracker_finish_sinks(h),
                    ),
                    _ => {
                        let mut n = 0u64;
                        call(
                            "tracker_releases_fired",
                            tracker::memprobe_tracker_releases_fired(h, &mut n),
                        )
                    }
                };
            }
            _ => unreachable!("op {op} is not a trackers call"),
        }
    }
}
