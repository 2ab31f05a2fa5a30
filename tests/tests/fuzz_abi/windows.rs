//! Peak windows: opened over live, freed and forged sources; peaks, measures,
//! resets and frees.

use crate::support::*;
use memprobe_ffi_impl::source::memprobe_source;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::window::{memprobe_delta, memprobe_window};
use memprobe_ffi_impl::*;

/// Makes the call `op` chooses (run_seed dispatches it here), with
/// arbitrary arguments and handles.
pub(crate) fn call(op: u64, rng: &mut Rng, p: &mut Pool, cx: &Seq) {
    let call = |what: &str, st: memprobe_status| {
        check(cx.seed, cx.step, what, st);
        st
    };
    match op {
        8 | 9 => {
            let n = rng.below(4) as usize;
            let list: Vec<*const memprobe_source> = (0..n)
                .map(|_| pick(rng, &p.sources, p) as *const memprobe_source)
                .collect();
            let count = if rng.chance(90) {
                n
            } else {
                rng.below(10_000) as usize % (n + 1)
            };
            let lp = if rng.chance(95) {
                list.as_ptr()
            } else {
                std::ptr::null()
            };
            let mut h = std::ptr::null_mut::<memprobe_window>();
            if call(
                "window_open",
                window::memprobe_window_open(lp, count, &mut h),
            ) == memprobe_status::Ok
            {
                p.windows.push(h as usize);
            }
        }
        10 => {
            let h = pick(rng, &p.windows, p);
            let mut v = 0u64;
            call(
                "window_peak",
                window::memprobe_window_peak(
                    h as *const memprobe_window,
                    rng.below(5) as usize,
                    &mut v,
                ),
            );
        }
        11 => {
            let h = pick(rng, &p.windows, p);
            let mut d = memprobe_delta::default();
            call(
                "window_measure",
                window::memprobe_window_measure(
                    h as *const memprobe_window,
                    rng.below(5) as usize,
                    &mut d,
                ),
            );
        }
        12 => {
            let h = pick(rng, &p.windows, p);
            let mut ended = vec![memprobe_delta::default(); 4];
            let (ptr, n) = if rng.chance(50) {
                (ended.as_mut_ptr(), rng.below(5) as usize)
            } else {
                (std::ptr::null_mut(), rng.next() as usize)
            };
            call(
                "window_reset",
                window::memprobe_window_reset(h as *mut memprobe_window, ptr, n),
            );
        }
        13 => {
            let h = pick(rng, &p.windows, p);
            if call(
                "window_free",
                window::memprobe_window_free(h as *mut memprobe_window),
            ) == memprobe_status::Ok
            {
                p.windows.retain(|&x| x != h);
            }
        }
        _ => unreachable!("op {op} is not a windows call"),
    }
}
