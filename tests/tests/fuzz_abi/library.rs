//! Process-wide calls: the monitor's interval and stats, status names, version
//! and SONAME, unit helpers, and the run channel's receiver (drained, left
//! full or gone).

use crate::support::*;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::*;

/// Makes the call `op` chooses (run_seed dispatches it here), with
/// arbitrary arguments and handles.
pub(crate) fn call(op: u64, rng: &mut Rng, _p: &mut Pool, cx: &Seq) {
    let call = |what: &str, st: memprobe_status| {
        check(cx.seed, cx.step, what, st);
        st
    };
    match op {
        30 => {
            let v = match rng.below(3) {
                0 => rng.next(),
                1 => 100_000 + rng.below(10_000_000),
                _ => rng.below(200_000),
            };
            call(
                "monitor_set_interval_ns",
                monitor::memprobe_monitor_set_interval_ns(v),
            );
        }
        31 => {
            let mut s = monitor::memprobe_monitor_stats::default();
            call(
                "monitor_get_stats",
                monitor::memprobe_monitor_get_stats(&mut s),
            );
        }
        32 => {
            let name = status::memprobe_status_name(rng.next() as u32);
            assert!(!name.is_null());
            let _ = memprobe_b2mb(rng.next());
        }
        43 => {
            // The run channel's receiver: drained, left full, or gone
            // (trackers then count their messages as dropped).
            let mut rx = run_channel().lock().unwrap_or_else(|e| e.into_inner());
            match rng.below(10) {
                0 => *rx = None,
                1..=6 => {
                    if let Some(r) = rx.as_ref() {
                        let mut buf = [0u8; 65536];
                        while r.recv(&mut buf).is_ok() {}
                    }
                }
                _ => {}
            }
            assert!(!memprobe_version().is_null() && !memprobe_soname().is_null());
            let _ = memprobe_b2mb_signed(rng.next() as i64);
        }
        _ => unreachable!("op {op} is not a library call"),
    }
}
