//! The metrics exporter: start, port, sources, watched trackers, rank, GPUs,
//! stop, free.

use crate::support::*;
use memprobe_ffi_impl::source::memprobe_source;
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::tracker::memprobe_tracker;
use memprobe_ffi_impl::*;
use std::ffi::CString;

/// A web configuration file with one user (no TLS: the fuzzer makes no
/// certificates), written once per process.
fn web_config_file() -> CString {
    static FILE: std::sync::OnceLock<CString> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("memprobe-fuzz-web-{}.yml", std::process::id()));
        std::fs::write(
            &path,
            "basic_auth_users:\n  u: '$2b$04$DLse4tY1yMwulgkiUjPoOuY7.3QEz2D0lKkl1cubv8IH8v4FRjdf2'\n",
        )
        .unwrap();
        CString::new(path.to_str().unwrap()).unwrap()
    })
    .clone()
}

/// Makes the call `op` chooses (run_seed dispatches it here), with
/// arbitrary arguments and handles.
pub(crate) fn call(op: u64, rng: &mut Rng, p: &mut Pool, cx: &Seq) {
    let call = |what: &str, st: memprobe_status| {
        check(cx.seed, cx.step, what, st);
        st
    };
    match op {
        40 => {
            // The Prometheus exporter, on an ephemeral local port.
            match rng.below(4) {
                0 => {
                    let addr = if rng.chance(80) {
                        Some(CString::new("127.0.0.1:0").unwrap())
                    } else {
                        text(rng)
                    };
                    let mut e = std::ptr::null_mut::<metrics::memprobe_exporter>();
                    let st = if rng.chance(75) {
                        call(
                            "exporter_start",
                            metrics::memprobe_exporter_start(cptr(&addr), &mut e),
                        )
                    } else {
                        // A good web configuration, or arbitrary text as its path.
                        let file = if rng.chance(70) {
                            Some(web_config_file())
                        } else {
                            text(rng)
                        };
                        call(
                            "exporter_start_with_web_config",
                            metrics::memprobe_exporter_start_with_web_config(
                                cptr(&addr),
                                cptr(&file),
                                &mut e,
                            ),
                        )
                    };
                    if st == memprobe_status::Ok {
                        p.exporters.push(e as usize);
                    }
                }
                1 => {
                    let e = pick(rng, &p.exporters, p) as *mut metrics::memprobe_exporter;
                    let mut port = 0u16;
                    call(
                        "exporter_port",
                        metrics::memprobe_exporter_port(e, &mut port),
                    );
                    let mut err = memprobe_status::Ok;
                    let mut buf = [0 as std::ffi::c_char; 16];
                    let len = rng.below(17) as usize;
                    let mut needed = 0usize;
                    call(
                        "exporter_get_web_config_error",
                        metrics::memprobe_exporter_get_web_config_error(
                            e,
                            if rng.chance(90) {
                                &mut err
                            } else {
                                std::ptr::null_mut()
                            },
                            if rng.chance(90) {
                                buf.as_mut_ptr()
                            } else {
                                std::ptr::null_mut()
                            },
                            len,
                            if rng.chance(50) {
                                &mut needed
                            } else {
                                std::ptr::null_mut()
                            },
                        ),
                    );
                    let s = pick(rng, &p.sources, p) as *const memprobe_source;
                    call(
                        "exporter_add_source",
                        metrics::memprobe_exporter_add_source(e, s),
                    );
                    let t = pick(rng, &p.trackers, p) as *mut memprobe_tracker;
                    call(
                        "exporter_watch_tracker",
                        metrics::memprobe_exporter_watch_tracker(e, t),
                    );
                }
                2 => {
                    let e = pick(rng, &p.exporters, p) as *mut metrics::memprobe_exporter;
                    let r = |rng: &mut Rng| {
                        if rng.chance(80) {
                            rng.below(4) as i64 - 1
                        } else {
                            rng.next() as i64
                        }
                    };
                    let (a, b, c) = (r(rng), r(rng), r(rng));
                    call(
                        "exporter_set_rank",
                        metrics::memprobe_exporter_set_rank(e, a, b, c),
                    );
                    call(
                        "exporter_add_gpus",
                        metrics::memprobe_exporter_add_gpus(e, rng.below(3) as i32 - 1),
                    );
                }
                _ => {
                    let e = pick(rng, &p.exporters, p);
                    if rng.chance(50) {
                        call(
                            "exporter_stop",
                            metrics::memprobe_exporter_stop(e as *mut metrics::memprobe_exporter),
                        );
                    }
                    if call(
                        "exporter_free",
                        metrics::memprobe_exporter_free(e as *mut metrics::memprobe_exporter),
                    ) == memprobe_status::Ok
                    {
                        p.exporters.retain(|&x| x != e);
                    }
                }
            }
        }
        _ => unreachable!("op {op} is not a exporter call"),
    }
}
