//! Traces (fastai's memory traces): new, silent, report-and-reset, data,
//! format, output callback and descriptor, free; and the remaining queries of
//! traces and windows.

use crate::support::*;
use memprobe_ffi_impl::source::memprobe_source;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::trace::memprobe_trace;
use memprobe_ffi_impl::window::{memprobe_delta, memprobe_window};
use memprobe_ffi_impl::*;
use std::ffi::c_char;

/// Makes the call `op` chooses (run_seed dispatches it here), with
/// arbitrary arguments and handles.
pub(crate) fn call(op: u64, rng: &mut Rng, p: &mut Pool, cx: &Seq) {
    let call = |what: &str, st: memprobe_status| {
        check(cx.seed, cx.step, what, st);
        st
    };
    match op {
        14 | 15 => {
            let n = rng.below(3) as usize;
            let list: Vec<*const memprobe_source> = (0..n)
                .map(|_| pick(rng, &p.sources, p) as *const memprobe_source)
                .collect();
            let ctx = text(rng);
            // Reports stay silent or go to a no-op callback: nothing printed.
            let flags = if rng.chance(85) {
                trace::MEMPROBE_TRACE_SILENT | (rng.below(2) as u32 * 2)
            } else {
                rng.next() as u32 | 1
            };
            let mut h = std::ptr::null_mut::<memprobe_trace>();
            if call(
                "trace_new",
                trace::memprobe_trace_new(list.as_ptr(), n, cptr(&ctx), flags, &mut h),
            ) == memprobe_status::Ok
            {
                p.traces.push(h as usize);
            }
        }
        16 => {
            let h = pick(rng, &p.traces, p) as *mut memprobe_trace;
            match rng.below(4) {
                0 => call("trace_start", trace::memprobe_trace_start(h)),
                1 => call("trace_stop", trace::memprobe_trace_stop(h)),
                2 => call("trace_reset", trace::memprobe_trace_reset(h)),
                _ => call(
                    "trace_set_silent",
                    trace::memprobe_trace_set_silent(h, true),
                ),
            };
        }
        17 => {
            let h = pick(rng, &p.traces, p) as *mut memprobe_trace;
            let note = text(rng);
            if rng.chance(50) {
                call("trace_report", trace::memprobe_trace_report(h, cptr(&note)));
            } else {
                call(
                    "trace_report_n_reset",
                    trace::memprobe_trace_report_n_reset(h, cptr(&note)),
                );
            }
        }
        18 => {
            let h = pick(rng, &p.traces, p) as *const memprobe_trace;
            let (mut u, mut pk) = (0i64, 0u64);
            call(
                "trace_data",
                trace::memprobe_trace_data(h, rng.below(3) as usize, &mut u, &mut pk),
            );
            let mut buf = vec![0 as c_char; rng.below(80) as usize];
            let mut need = 0usize;
            let bp = if buf.is_empty() {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr()
            };
            call(
                "trace_format",
                trace::memprobe_trace_format(h, std::ptr::null(), bp, buf.len(), &mut need),
            );
        }
        19 => {
            let h = pick(rng, &p.traces, p) as *mut memprobe_trace;
            let cb = if rng.chance(90) {
                Some(line_cb as _)
            } else {
                None
            };
            call(
                "trace_set_output_callback",
                trace::memprobe_trace_set_output_callback(h, cb, std::ptr::null_mut()),
            );
        }
        20 => {
            let h = pick(rng, &p.traces, p);
            if call(
                "trace_free",
                trace::memprobe_trace_free(h as *mut memprobe_trace),
            ) == memprobe_status::Ok
            {
                p.traces.retain(|&x| x != h);
            }
        }
        42 => {
            // Trace and window queries not covered above.
            let t = pick(rng, &p.traces, p) as *mut memprobe_trace;
            let mut running = false;
            call(
                "trace_is_running",
                trace::memprobe_trace_is_running(t, &mut running),
            );
            let mut d = memprobe_delta::default();
            call(
                "trace_measure",
                trace::memprobe_trace_measure(t, rng.below(4) as usize, &mut d),
            );
            let fd = fd(rng, cx.null_fd);
            call(
                "trace_set_output_fd",
                trace::memprobe_trace_set_output_fd(t, fd),
            );
            let w = pick(rng, &p.windows, p) as *const memprobe_window;
            let mut n = 0usize;
            call(
                "window_source_count",
                window::memprobe_window_source_count(w, &mut n),
            );
        }
        _ => unreachable!("op {op} is not a traces call"),
    }
}
