//! Mark groups (a caller's resettable high-water marks) and the sources made
//! from them.

use crate::support::*;
use memprobe_ffi_impl::source::memprobe_source;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::*;

/// Makes the call `op` chooses (run_seed dispatches it here), with
/// arbitrary arguments and handles.
pub(crate) fn call(op: u64, rng: &mut Rng, p: &mut Pool, cx: &Seq) {
    let call = |what: &str, st: memprobe_status| {
        check(cx.seed, cx.step, what, st);
        st
    };
    match op {
        36 => {
            // Mark groups: a caller's resettable marks, one or many
            // values per read, callbacks that fail now and then.
            let mut g = std::ptr::null_mut::<mark::memprobe_mark_group>();
            let out = out_ptr(&mut g, rng.chance(95));
            let cb = |rng: &mut Rng| rng.chance(90);
            let st = if rng.chance(50) {
                let (c, k, r) = (cb(rng), cb(rng), cb(rng));
                call(
                    "mark_group_new",
                    mark::memprobe_mark_group_new(
                        if c { Some(mark_read_cb as _) } else { None },
                        if k { Some(mark_read_cb as _) } else { None },
                        if r { Some(mark_reset_cb as _) } else { None },
                        cx.counter_ptr,
                        out,
                    ),
                )
            } else {
                let (m, r) = (cb(rng), cb(rng));
                call(
                    "mark_group_new_many",
                    mark::memprobe_mark_group_new_many(
                        if m {
                            Some(mark_read_many_cb as _)
                        } else {
                            None
                        },
                        if r { Some(mark_reset_cb as _) } else { None },
                        cx.counter_ptr,
                        out,
                    ),
                )
            };
            if st == memprobe_status::Ok && !out.is_null() {
                p.marks.push(g as usize);
            }
        }
        37 => {
            let g = pick(rng, &p.marks, p);
            if rng.chance(70) {
                let name = text(rng);
                let index = if rng.chance(80) {
                    rng.below(4) as usize
                } else {
                    rng.next() as usize
                };
                let mut h = std::ptr::null_mut::<memprobe_source>();
                if call(
                    "source_new_mark",
                    mark::memprobe_source_new_mark(
                        g as *const mark::memprobe_mark_group,
                        index,
                        cptr(&name),
                        &mut h,
                    ),
                ) == memprobe_status::Ok
                {
                    p.sources.push(h as usize);
                }
            } else if call(
                "mark_group_free",
                mark::memprobe_mark_group_free(g as *mut mark::memprobe_mark_group),
            ) == memprobe_status::Ok
            {
                // Sources made from it keep working (they hold it).
                p.marks.retain(|&x| x != g);
            }
        }
        _ => unreachable!("op {op} is not a marks call"),
    }
}
