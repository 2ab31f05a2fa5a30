//! A property-based fuzzer over sequences of C ABI calls with arbitrary
//! arguments: handles that are live, freed, of another type or forged;
//! unknown enum values and flag bits; random strings, sizes and NULLs. It
//! drives the real `extern "C"` entry points (the same code as
//! libmemprobe.so) in this process: every function include/memprobe.h
//! declares (`every_exported_function_is_fuzzed` fails when one is left
//! out) — mark groups and their sources, the GPU module over a fake NVML,
//! exact GPU sources (without the interposer), the exporter, tracker sinks
//! — while every tracker boundary also goes to a run channel
//! (`MEMPROBE_RUN_CHANNEL`) whose receiver is drained, left full or closed.
//!
//! Properties: no call crashes or returns MEMPROBE_STATUS_PANIC; every status
//! is a known value with a message when not OK; after the sequence, freeing
//! every handle leaves none alive.
//!
//! CI runs the seeds in tests/fuzz/corpus.txt plus new random seeds for
//! MEMPROBE_FUZZ_SECONDS (default 10). A longer run:
//! `MEMPROBE_FUZZ_SECONDS=600 cargo test --release -p memprobe-tests --test fuzz_abi -- --nocapture`.
//! A failing seed is printed; add it to the corpus once fixed.

use memprobe_ffi_impl::source::{memprobe_sample, memprobe_source, memprobe_source_info};
use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::trace::memprobe_trace;
use memprobe_ffi_impl::tracker::{memprobe_phase_record, memprobe_tracker};
use memprobe_ffi_impl::window::{memprobe_delta, memprobe_window};
use std::ffi::{c_char, c_void, CString};
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

unsafe extern "C" fn read_cb(data: *mut c_void, out: *mut u64) -> i32 {
    // SAFETY: the fuzzer passes a pointer to a live u64 counter, and memprobe
    // a valid out-pointer.
    let v = unsafe { *(data as *const u64) };
    // SAFETY: as above.
    unsafe { *out = v };
    if v % 7 == 3 {
        5
    } else {
        0
    }
}
unsafe extern "C" fn release_cb(_data: *mut c_void) -> i32 {
    0
}
unsafe extern "C" fn line_cb(_line: *const c_char, _data: *mut c_void) {}
unsafe extern "C" fn record_cb(
    _r: *const memprobe_phase_record,
    _d: *const memprobe_delta,
    _n: usize,
    _u: *mut c_void,
) {
}
unsafe extern "C" fn oom_cb(json: *const c_char, summary: *const c_char, _data: *mut c_void) {
    assert!(!json.is_null() && !summary.is_null());
}
unsafe extern "C" fn step_cb(data: *mut c_void) -> i32 {
    // SAFETY: a live u64 counter.
    let n = unsafe { &mut *(data as *mut u64) };
    *n += 1;
    (*n % 3) as i32
}

unsafe extern "C" fn mark_read_cb(data: *mut c_void, index: usize, out: *mut u64) -> i32 {
    // SAFETY: a live u64 counter; memprobe passes a valid out-pointer.
    let v = unsafe { *(data as *const u64) };
    // SAFETY: as above.
    unsafe { *out = v.wrapping_add(index as u64) };
    i32::from(v % 11 == 5)
}
unsafe extern "C" fn mark_read_many_cb(
    data: *mut c_void,
    _what: u32,
    _indices: *const usize,
    count: usize,
    out: *mut u64,
) -> i32 {
    // SAFETY: a live u64 counter; `out` holds `count` values.
    let v = unsafe { *(data as *const u64) };
    for i in 0..count {
        // SAFETY: as above.
        unsafe { *out.add(i) = v };
    }
    i32::from(v % 13 == 4)
}
unsafe extern "C" fn mark_reset_cb(data: *mut c_void) -> i32 {
    // SAFETY: a live u64 counter.
    let v = unsafe { *(data as *const u64) };
    i32::from(v % 17 == 9)
}

/// A file descriptor to hand memprobe: /dev/null, or one that is not open.
fn fd(rng: &mut Rng, null_fd: i32) -> i32 {
    match rng.below(4) {
        0 => -1,
        1 => 1 << 20,
        _ => null_fd,
    }
}

/// A sink path: a file in the scratch directory, the directory itself, a
/// path under a missing directory, empty, invalid UTF-8 or NULL.
fn sink_path(rng: &mut Rng, dir: &std::path::Path) -> Option<CString> {
    match rng.below(8) {
        0 => None,
        1 => Some(CString::new("").unwrap()),
        2 => Some(CString::new(dir.display().to_string()).unwrap()),
        3 => Some(CString::new("/nonexistent-memprobe-dir/sink").unwrap()),
        4 => {
            let mut b = dir.display().to_string().into_bytes();
            b.extend_from_slice(b"/\xff\xfe");
            Some(CString::new(b).unwrap())
        }
        _ => Some(
            CString::new(
                dir.join(format!("sink{}", rng.below(4)))
                    .display()
                    .to_string(),
            )
            .unwrap(),
        ),
    }
}

/// What `memprobe_gpu_configure` is given as a library path: the fake NVML
/// (a GPU that answers), a missing file, a directory, NULL or garbage.
fn gpu_lib_path(rng: &mut Rng, fake_nvml: &std::path::Path) -> Option<CString> {
    match rng.below(6) {
        0 | 1 => Some(CString::new(fake_nvml.display().to_string()).unwrap()),
        2 => None,
        3 => Some(CString::new("/nonexistent/libnvidia-ml.so.1").unwrap()),
        4 => Some(CString::new("/").unwrap()),
        _ => text(rng),
    }
}

/// The receiving end of the run channel (`MEMPROBE_RUN_CHANNEL`), bound once
/// per test process before any tracker exists, so every tracker boundary
/// the fuzzer makes also goes through the channel: sometimes drained,
/// sometimes left full, sometimes gone.
fn run_channel() -> &'static std::sync::Mutex<Option<std::os::unix::net::UnixDatagram>> {
    static RX: std::sync::OnceLock<std::sync::Mutex<Option<std::os::unix::net::UnixDatagram>>> =
        std::sync::OnceLock::new();
    RX.get_or_init(|| {
        let path =
            std::env::temp_dir().join(format!("memprobe-fuzz-run-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let rx = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the run channel");
        rx.set_nonblocking(true).unwrap();
        std::env::set_var(memprobe_core::run_channel::ENV, &path);
        std::sync::Mutex::new(Some(rx))
    })
}

#[derive(Default)]
struct Pool {
    sources: Vec<usize>,
    windows: Vec<usize>,
    traces: Vec<usize>,
    trackers: Vec<usize>,
    marks: Vec<usize>,
    exporters: Vec<usize>,
    devices: Vec<usize>,
}

fn pick(rng: &mut Rng, live: &[usize], others: &Pool) -> usize {
    match rng.below(10) {
        0 => 0,                   // NULL
        1 => rng.next() as usize, // forged
        2 => {
            // a handle of another type
            let all: Vec<usize> = others
                .sources
                .iter()
                .chain(&others.windows)
                .chain(&others.traces)
                .chain(&others.trackers)
                .chain(&others.marks)
                .chain(&others.exporters)
                .chain(&others.devices)
                .copied()
                .collect();
            if all.is_empty() {
                0x1234
            } else {
                all[rng.below(all.len() as u64) as usize]
            }
        }
        _ if live.is_empty() => rng.next() as usize,
        _ => live[rng.below(live.len() as u64) as usize],
    }
}

fn text(rng: &mut Rng) -> Option<CString> {
    match rng.below(6) {
        0 => None,
        1 => Some(CString::new("").unwrap()),
        2 => Some(CString::new(vec![0xff, 0xfe]).unwrap()),
        3 => Some(CString::new("x".repeat(rng.below(200) as usize + 1)).unwrap()),
        _ => Some(CString::new(format!("n{}", rng.below(1000))).unwrap()),
    }
}

fn cptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

/// The highest status value this version knows.
const KNOWN: u32 = memprobe_status::OutOfMemory as u32;

/// Calls that succeeded, by entry point: the fuzzer must reach the states
/// behind them (a mark group to make sources from, a GPU that answers).
static SUCCEEDED: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn check(seed: u64, step: usize, what: &str, st: memprobe_status) {
    if st == memprobe_status::Ok {
        SUCCEEDED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(what.to_owned());
    }
    let v = st as u32;
    assert!(
        v <= KNOWN,
        "seed {seed} step {step}: {what} returned unknown status {v}"
    );
    assert_ne!(
        st,
        memprobe_status::Panic,
        "seed {seed} step {step}: {what} panicked: {}",
        last_error()
    );
    if st != memprobe_status::Ok {
        assert!(
            !last_error().is_empty(),
            "seed {seed} step {step}: {what} failed without a message"
        );
    }
}

fn last_error() -> String {
    // SAFETY: memprobe_last_error never returns NULL.
    unsafe { std::ffi::CStr::from_ptr(memprobe_ffi_impl::boundary::memprobe_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Runs one sequence; returns the number of calls made.
fn run_seed(seed: u64, steps: usize, fake_nvml: &std::path::Path) -> usize {
    use memprobe_ffi_impl::*;
    let mut rng = Rng(seed | 1);
    let mut p = Pool::default();
    let counter = Box::new(0u64);
    let counter_ptr = &*counter as *const u64 as *mut c_void;
    let mut step_counter = Box::new(0u64);
    let oom_dir = std::env::temp_dir().join(format!("memprobe-fuzz-oom-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&oom_dir);
    let oom_path = oom_dir.join("report.json").display().to_string();
    let null_file = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let null_fd = std::os::fd::AsRawFd::as_raw_fd(&null_file);
    for step in 0..steps {
        let op = rng.below(44);
        macro_rules! call {
            ($name:expr, $e:expr) => {{
                let st = $e;
                check(seed, step, $name, st);
                st
            }};
        }
        // SAFETY: for every arm, out-pointers are valid or NULL, strings
        // are NUL-terminated or NULL, arrays hold the lengths passed;
        // handles are arbitrary values, which is the point.
        unsafe {
            match op {
                0 => {
                    let mut h = std::ptr::null_mut::<memprobe_source>();
                    let flags = if rng.chance(80) { 0 } else { rng.next() as u32 };
                    if call!(
                        "new_process",
                        source::memprobe_source_new_process(flags, &mut h)
                    ) == memprobe_status::Ok
                    {
                        p.sources.push(h as usize);
                    }
                }
                1 => {
                    let name = text(&mut rng);
                    let mut h = std::ptr::null_mut::<memprobe_source>();
                    if call!(
                        "new_pushed",
                        source::memprobe_source_new_pushed(cptr(&name), &mut h)
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
                    let name = text(&mut rng);
                    if call!(
                        "new_callback",
                        source::memprobe_source_new_callback(cptr(&name), f, counter_ptr, &mut h)
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
                        let out = if rng.chance(90) {
                            &mut h as *mut _
                        } else {
                            std::ptr::null_mut()
                        };
                        call!(
                            "new_process_tree_smaps",
                            source::memprobe_source_new_process_tree_smaps(metric, out)
                        )
                    } else {
                        call!(
                            "new_system_ram",
                            source::memprobe_source_new_system_ram(&mut h)
                        )
                    };
                    if st == memprobe_status::Ok {
                        p.sources.push(h as usize);
                    }
                }
                4 => {
                    let h = pick(&mut rng, &p.sources, &p);
                    let mut s = memprobe_sample::default();
                    let out = if rng.chance(90) {
                        &mut s as *mut _
                    } else {
                        std::ptr::null_mut()
                    };
                    call!(
                        "source_read",
                        source::memprobe_source_read(h as *const memprobe_source, out)
                    );
                }
                5 => {
                    let h = pick(&mut rng, &p.sources, &p);
                    call!(
                        "source_push",
                        source::memprobe_source_push(h as *const memprobe_source, rng.next())
                    );
                }
                6 => {
                    let h = pick(&mut rng, &p.sources, &p);
                    let mut i = std::mem::zeroed::<memprobe_source_info>();
                    call!(
                        "source_info",
                        source::memprobe_source_get_info(h as *const memprobe_source, &mut i)
                    );
                }
                7 => {
                    let h = pick(&mut rng, &p.sources, &p);
                    if call!(
                        "source_free",
                        source::memprobe_source_free(h as *mut memprobe_source)
                    ) == memprobe_status::Ok
                    {
                        p.sources.retain(|&x| x != h);
                    }
                }
                8 | 9 => {
                    let n = rng.below(4) as usize;
                    let list: Vec<*const memprobe_source> = (0..n)
                        .map(|_| pick(&mut rng, &p.sources, &p) as *const memprobe_source)
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
                    if call!(
                        "window_open",
                        window::memprobe_window_open(lp, count, &mut h)
                    ) == memprobe_status::Ok
                    {
                        p.windows.push(h as usize);
                    }
                }
                10 => {
                    let h = pick(&mut rng, &p.windows, &p);
                    let mut v = 0u64;
                    call!(
                        "window_peak",
                        window::memprobe_window_peak(
                            h as *const memprobe_window,
                            rng.below(5) as usize,
                            &mut v
                        )
                    );
                }
                11 => {
                    let h = pick(&mut rng, &p.windows, &p);
                    let mut d = memprobe_delta::default();
                    call!(
                        "window_measure",
                        window::memprobe_window_measure(
                            h as *const memprobe_window,
                            rng.below(5) as usize,
                            &mut d
                        )
                    );
                }
                12 => {
                    let h = pick(&mut rng, &p.windows, &p);
                    let mut ended = vec![memprobe_delta::default(); 4];
                    let (ptr, n) = if rng.chance(50) {
                        (ended.as_mut_ptr(), rng.below(5) as usize)
                    } else {
                        (std::ptr::null_mut(), rng.next() as usize)
                    };
                    call!(
                        "window_reset",
                        window::memprobe_window_reset(h as *mut memprobe_window, ptr, n)
                    );
                }
                13 => {
                    let h = pick(&mut rng, &p.windows, &p);
                    if call!(
                        "window_free",
                        window::memprobe_window_free(h as *mut memprobe_window)
                    ) == memprobe_status::Ok
                    {
                        p.windows.retain(|&x| x != h);
                    }
                }
                14 | 15 => {
                    let n = rng.below(3) as usize;
                    let list: Vec<*const memprobe_source> = (0..n)
                        .map(|_| pick(&mut rng, &p.sources, &p) as *const memprobe_source)
                        .collect();
                    let ctx = text(&mut rng);
                    // Reports stay silent or go to a no-op callback: nothing printed.
                    let flags = if rng.chance(85) {
                        trace::MEMPROBE_TRACE_SILENT | (rng.below(2) as u32 * 2)
                    } else {
                        rng.next() as u32 | 1
                    };
                    let mut h = std::ptr::null_mut::<memprobe_trace>();
                    if call!(
                        "trace_new",
                        trace::memprobe_trace_new(list.as_ptr(), n, cptr(&ctx), flags, &mut h)
                    ) == memprobe_status::Ok
                    {
                        p.traces.push(h as usize);
                    }
                }
                16 => {
                    let h = pick(&mut rng, &p.traces, &p) as *mut memprobe_trace;
                    match rng.below(4) {
                        0 => call!("trace_start", trace::memprobe_trace_start(h)),
                        1 => call!("trace_stop", trace::memprobe_trace_stop(h)),
                        2 => call!("trace_reset", trace::memprobe_trace_reset(h)),
                        _ => call!(
                            "trace_set_silent",
                            trace::memprobe_trace_set_silent(h, true)
                        ),
                    };
                }
                17 => {
                    let h = pick(&mut rng, &p.traces, &p) as *mut memprobe_trace;
                    let note = text(&mut rng);
                    if rng.chance(50) {
                        call!("trace_report", trace::memprobe_trace_report(h, cptr(&note)));
                    } else {
                        call!(
                            "trace_report_n_reset",
                            trace::memprobe_trace_report_n_reset(h, cptr(&note))
                        );
                    }
                }
                18 => {
                    let h = pick(&mut rng, &p.traces, &p) as *const memprobe_trace;
                    let (mut u, mut pk) = (0i64, 0u64);
                    call!(
                        "trace_data",
                        trace::memprobe_trace_data(h, rng.below(3) as usize, &mut u, &mut pk)
                    );
                    let mut buf = vec![0 as c_char; rng.below(80) as usize];
                    let mut need = 0usize;
                    let bp = if buf.is_empty() {
                        std::ptr::null_mut()
                    } else {
                        buf.as_mut_ptr()
                    };
                    call!(
                        "trace_format",
                        trace::memprobe_trace_format(h, std::ptr::null(), bp, buf.len(), &mut need)
                    );
                }
                19 => {
                    let h = pick(&mut rng, &p.traces, &p) as *mut memprobe_trace;
                    let cb = if rng.chance(90) {
                        Some(line_cb as _)
                    } else {
                        None
                    };
                    call!(
                        "trace_set_output_callback",
                        trace::memprobe_trace_set_output_callback(h, cb, std::ptr::null_mut())
                    );
                }
                20 => {
                    let h = pick(&mut rng, &p.traces, &p);
                    if call!(
                        "trace_free",
                        trace::memprobe_trace_free(h as *mut memprobe_trace)
                    ) == memprobe_status::Ok
                    {
                        p.traces.retain(|&x| x != h);
                    }
                }
                21 => {
                    let n = rng.below(3) as usize;
                    let list: Vec<*const memprobe_source> = (0..n)
                        .map(|_| pick(&mut rng, &p.sources, &p) as *const memprobe_source)
                        .collect();
                    let mut h = std::ptr::null_mut::<memprobe_tracker>();
                    if call!(
                        "tracker_new",
                        tracker::memprobe_tracker_new(list.as_ptr(), n, &mut h)
                    ) == memprobe_status::Ok
                    {
                        p.trackers.push(h as usize);
                    }
                }
                22..=24 => {
                    let h = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
                    let kind = if rng.chance(90) {
                        rng.below(5) as u32
                    } else {
                        rng.next() as u32
                    };
                    let name = if kind == 4 || rng.chance(10) {
                        text(&mut rng)
                    } else {
                        None
                    };
                    let mut rec = std::mem::zeroed::<memprobe_phase_record>();
                    let mut deltas = vec![memprobe_delta::default(); 3];
                    let n = rng.below(4) as usize;
                    match op {
                        22 => call!(
                            "tracker_begin",
                            tracker::memprobe_tracker_begin(h, kind, cptr(&name))
                        ),
                        23 => call!(
                            "tracker_end",
                            tracker::memprobe_tracker_end(
                                h,
                                kind,
                                cptr(&name),
                                &mut rec,
                                deltas.as_mut_ptr(),
                                n
                            )
                        ),
                        _ => call!(
                            "tracker_next",
                            tracker::memprobe_tracker_next(
                                h,
                                kind,
                                cptr(&name),
                                std::ptr::null_mut(),
                                std::ptr::null_mut(),
                                0
                            )
                        ),
                    };
                }
                25 => {
                    let h = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
                    let name = text(&mut rng);
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
                    call!(
                        "tracker_add_release",
                        tracker::memprobe_tracker_add_release(
                            h,
                            cptr(&name),
                            kind,
                            cb,
                            std::ptr::null_mut()
                        )
                    );
                    call!(
                        "tracker_release_every",
                        tracker::memprobe_tracker_release_every(
                            h,
                            rng.below(6) as u32,
                            rng.below(4),
                            rng.chance(50)
                        )
                    );
                }
                26 => {
                    let h = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
                    call!(
                        "tracker_set_leak_policy",
                        tracker::memprobe_tracker_set_leak_policy(
                            h,
                            rng.below(1 << 20),
                            rng.below(4) as u32
                        )
                    );
                    let (mut f, mut s, mut g) = (false, 0u32, 0i64);
                    call!(
                        "tracker_leak_status",
                        tracker::memprobe_tracker_leak_status(
                            h,
                            rng.below(4) as usize,
                            &mut f,
                            &mut s,
                            &mut g
                        )
                    );
                    call!(
                        "tracker_release_below_free",
                        tracker::memprobe_tracker_release_below_free(
                            h,
                            rng.below(4) as usize,
                            rng.next(),
                            rng.chance(50)
                        )
                    );
                }
                27 => {
                    let h = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
                    let cb = if rng.chance(90) {
                        Some(record_cb as _)
                    } else {
                        None
                    };
                    call!(
                        "tracker_add_callback_sink",
                        tracker::memprobe_tracker_add_callback_sink(h, cb, std::ptr::null_mut())
                    );
                    let mut freed = [0u64; 4];
                    call!(
                        "tracker_release_now",
                        tracker::memprobe_tracker_release_now(
                            h,
                            rng.chance(50),
                            freed.as_mut_ptr(),
                            rng.below(5) as usize
                        )
                    );
                }
                28 => {
                    let h = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
                    let mut r = tracker::memprobe_oom_retry_result::default();
                    let sc = &mut *step_counter as *mut u64 as *mut c_void;
                    call!(
                        "tracker_run_oom_retry",
                        tracker::memprobe_tracker_run_oom_retry(
                            h,
                            Some(step_cb),
                            sc,
                            rng.below(4) as u32,
                            &mut r,
                            std::ptr::null_mut(),
                            0
                        )
                    );
                }
                29 => {
                    let h = pick(&mut rng, &p.trackers, &p);
                    if call!(
                        "tracker_free",
                        tracker::memprobe_tracker_free(h as *mut memprobe_tracker)
                    ) == memprobe_status::Ok
                    {
                        p.trackers.retain(|&x| x != h);
                    }
                }
                30 => {
                    let v = match rng.below(3) {
                        0 => rng.next(),
                        1 => 100_000 + rng.below(10_000_000),
                        _ => rng.below(200_000),
                    };
                    call!(
                        "monitor_set_interval_ns",
                        monitor::memprobe_monitor_set_interval_ns(v)
                    );
                }
                31 => {
                    let mut s = monitor::memprobe_monitor_stats::default();
                    call!(
                        "monitor_get_stats",
                        monitor::memprobe_monitor_get_stats(&mut s)
                    );
                }
                34 => {
                    let h = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
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
                            CString::new(format!("{}/{}", oom_dir.display(), rng.below(4)))
                                .unwrap(),
                        ),
                        3 => Some(CString::new(oom_dir.display().to_string()).unwrap()),
                        _ => Some(CString::new(oom_path.clone()).unwrap()),
                    };
                    o.path = cptr(&path);
                    o.json_fd = [0, -1, null_fd, -3][rng.below(4) as usize];
                    o.summary_fd = [0, -1, null_fd, 12345][rng.below(4) as usize];
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
                    call!(
                        "tracker_set_oom_report",
                        oom_report::memprobe_tracker_set_oom_report(h, arg)
                    );
                }
                35 => {
                    let h = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
                    let device = match rng.below(4) {
                        0 => rng.next() as i32,
                        1 => -1,
                        _ => rng.below(8) as i32,
                    };
                    let detail = text(&mut rng);
                    match rng.below(4) {
                        0 => {
                            call!(
                                "tracker_report_oom",
                                oom_report::memprobe_tracker_report_oom(
                                    h,
                                    device,
                                    rng.next(),
                                    cptr(&detail)
                                )
                            );
                        }
                        1 => {
                            let caches = [oom_report::memprobe_oom_cache {
                                device: rng.below(70) as u32,
                                valid: rng.below(16) as u32,
                                reserved_bytes: rng.next(),
                                allocated_bytes: rng.next(),
                                releasable_bytes: rng.next(),
                            }];
                            let by = text(&mut rng);
                            let mut e: oom_report::memprobe_oom_event = std::mem::zeroed();
                            e.struct_size = if rng.chance(90) {
                                std::mem::size_of::<oom_report::memprobe_oom_event>() as u32
                            } else {
                                rng.below(48) as u32
                            };
                            e.device = device;
                            e.requested_bytes = rng.next();
                            e.reported_by = cptr(&by);
                            e.detail = cptr(&detail);
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
                            call!(
                                "tracker_report_oom_event",
                                oom_report::memprobe_tracker_report_oom_event(h, arg)
                            );
                        }
                        2 => {
                            let mut st = oom_report::memprobe_oom_status::default();
                            let out = if rng.chance(90) {
                                &mut st as *mut _
                            } else {
                                std::ptr::null_mut()
                            };
                            call!(
                                "tracker_oom_status",
                                oom_report::memprobe_tracker_oom_status(h, out)
                            );
                        }
                        _ => {
                            call!(
                                "tracker_rearm_oom_report",
                                oom_report::memprobe_tracker_rearm_oom_report(h)
                            );
                        }
                    }
                }
                36 => {
                    // Mark groups: a caller's resettable marks, one or many
                    // values per read, callbacks that fail now and then.
                    let mut g = std::ptr::null_mut::<mark::memprobe_mark_group>();
                    let out = if rng.chance(95) {
                        &mut g as *mut _
                    } else {
                        std::ptr::null_mut()
                    };
                    let cb = |rng: &mut Rng| rng.chance(90);
                    let st = if rng.chance(50) {
                        let (c, k, r) = (cb(&mut rng), cb(&mut rng), cb(&mut rng));
                        call!(
                            "mark_group_new",
                            mark::memprobe_mark_group_new(
                                if c { Some(mark_read_cb as _) } else { None },
                                if k { Some(mark_read_cb as _) } else { None },
                                if r { Some(mark_reset_cb as _) } else { None },
                                counter_ptr,
                                out
                            )
                        )
                    } else {
                        let (m, r) = (cb(&mut rng), cb(&mut rng));
                        call!(
                            "mark_group_new_many",
                            mark::memprobe_mark_group_new_many(
                                if m {
                                    Some(mark_read_many_cb as _)
                                } else {
                                    None
                                },
                                if r { Some(mark_reset_cb as _) } else { None },
                                counter_ptr,
                                out
                            )
                        )
                    };
                    if st == memprobe_status::Ok && !out.is_null() {
                        p.marks.push(g as usize);
                    }
                }
                37 => {
                    let g = pick(&mut rng, &p.marks, &p);
                    if rng.chance(70) {
                        let name = text(&mut rng);
                        let index = if rng.chance(80) {
                            rng.below(4) as usize
                        } else {
                            rng.next() as usize
                        };
                        let mut h = std::ptr::null_mut::<memprobe_source>();
                        if call!(
                            "source_new_mark",
                            mark::memprobe_source_new_mark(
                                g as *const mark::memprobe_mark_group,
                                index,
                                cptr(&name),
                                &mut h
                            )
                        ) == memprobe_status::Ok
                        {
                            p.sources.push(h as usize);
                        }
                    } else if call!(
                        "mark_group_free",
                        mark::memprobe_mark_group_free(g as *mut mark::memprobe_mark_group)
                    ) == memprobe_status::Ok
                    {
                        // Sources made from it keep working (they hold it).
                        p.marks.retain(|&x| x != g);
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
                        0 => call!(
                            "source_new_cgroup",
                            source::memprobe_source_new_cgroup(&mut h)
                        ),
                        1 => call!(
                            "source_new_process_tree",
                            source::memprobe_source_new_process_tree(&mut h)
                        ),
                        2 => call!(
                            "source_new_smaps",
                            source::memprobe_source_new_smaps(
                                if rng.chance(80) {
                                    rng.below(2) as u32
                                } else {
                                    rng.next() as u32
                                },
                                &mut h
                            )
                        ),
                        3 => call!(
                            "source_new_gpu_device",
                            gpu::memprobe_source_new_gpu_device(id, &mut h)
                        ),
                        4 => call!(
                            "source_new_gpu_process",
                            gpu::memprobe_source_new_gpu_process(id, &mut h)
                        ),
                        _ => call!(
                            "source_new_gpu_exact",
                            gpu_exact::memprobe_source_new_gpu_exact(id, &mut h)
                        ),
                    };
                    if st == memprobe_status::Ok {
                        p.sources.push(h as usize);
                    }
                }
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
                            let nvml = gpu_lib_path(&mut rng, fake_nvml);
                            let cudart = gpu_lib_path(&mut rng, fake_nvml);
                            call!(
                                "gpu_configure",
                                gpu::memprobe_gpu_configure(backend, cptr(&nvml), cptr(&cudart))
                            );
                        }
                        1 => {
                            call!("gpu_preload", gpu::memprobe_gpu_preload());
                            call!("gpu_count", gpu::memprobe_gpu_count(&mut u));
                            call!("gpu_get_backend", gpu::memprobe_gpu_get_backend(&mut u));
                        }
                        2 => {
                            call!(
                                "gpu_set_current_device",
                                gpu::memprobe_gpu_set_current_device(id)
                            );
                            call!(
                                "gpu_get_current_device",
                                gpu::memprobe_gpu_get_current_device(&mut u)
                            );
                        }
                        3 => {
                            let mut info = std::mem::zeroed::<gpu::memprobe_gpu_info>();
                            call!("gpu_get_info", gpu::memprobe_gpu_get_info(id, &mut info));
                        }
                        4 => {
                            let id = if rng.chance(80) {
                                rng.below(4) as i64 - 1
                            } else {
                                rng.next() as i64
                            };
                            call!("gpu_mem_get", gpu::memprobe_gpu_mem_get(id, &mut mem));
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
                            call!(
                                "gpu_mem_get_all",
                                gpu::memprobe_gpu_mem_get_all(ptr, cap, &mut n)
                            );
                        }
                        6 => {
                            call!("gpu_mem_get_free", gpu::memprobe_gpu_mem_get_free(&mut v));
                            call!("gpu_mem_get_used", gpu::memprobe_gpu_mem_get_used(&mut v));
                            call!(
                                "gpu_mem_get_free_no_cache",
                                gpu::memprobe_gpu_mem_get_free_no_cache(&mut v)
                            );
                            call!(
                                "gpu_mem_get_used_no_cache",
                                gpu::memprobe_gpu_mem_get_used_no_cache(&mut v)
                            );
                        }
                        7 => {
                            let mut best = 0i64;
                            call!(
                                "gpu_with_max_free_mem",
                                gpu::memprobe_gpu_with_max_free_mem(&mut best, &mut v)
                            );
                        }
                        8 => {
                            let cb = if rng.chance(70) {
                                Some(release_cb as _)
                            } else {
                                None
                            };
                            call!(
                                "gpu_set_cache_release",
                                gpu::memprobe_gpu_set_cache_release(cb, std::ptr::null_mut())
                            );
                        }
                        9 => {
                            let mut d = std::ptr::null_mut::<gpu::memprobe_gpu_device>();
                            if call!("gpu_device_open", gpu::memprobe_gpu_device_open(id, &mut d))
                                == memprobe_status::Ok
                            {
                                p.devices.push(d as usize);
                            }
                        }
                        10 => {
                            let d =
                                pick(&mut rng, &p.devices, &p) as *const gpu::memprobe_gpu_device;
                            call!(
                                "gpu_device_mem_get",
                                gpu::memprobe_gpu_device_mem_get(d, &mut mem)
                            );
                            call!(
                                "gpu_device_process_used",
                                gpu::memprobe_gpu_device_process_used(d, &mut v)
                            );
                            call!(
                                "gpu_mem_get_used_fast",
                                gpu::memprobe_gpu_mem_get_used_fast(d, &mut v)
                            );
                            call!(
                                "gpu_debug_live_devices",
                                gpu::memprobe_gpu_debug_live_devices(&mut v)
                            );
                        }
                        _ => {
                            let d = pick(&mut rng, &p.devices, &p);
                            if call!(
                                "gpu_device_free",
                                gpu::memprobe_gpu_device_free(d as *mut gpu::memprobe_gpu_device)
                            ) == memprobe_status::Ok
                            {
                                p.devices.retain(|&x| x != d);
                            }
                        }
                    }
                }
                40 => {
                    // The Prometheus exporter, on an ephemeral local port.
                    match rng.below(4) {
                        0 => {
                            let addr = if rng.chance(80) {
                                Some(CString::new("127.0.0.1:0").unwrap())
                            } else {
                                text(&mut rng)
                            };
                            let mut e = std::ptr::null_mut::<metrics::memprobe_exporter>();
                            if call!(
                                "exporter_start",
                                metrics::memprobe_exporter_start(cptr(&addr), &mut e)
                            ) == memprobe_status::Ok
                            {
                                p.exporters.push(e as usize);
                            }
                        }
                        1 => {
                            let e =
                                pick(&mut rng, &p.exporters, &p) as *mut metrics::memprobe_exporter;
                            let mut port = 0u16;
                            call!(
                                "exporter_port",
                                metrics::memprobe_exporter_port(e, &mut port)
                            );
                            let s = pick(&mut rng, &p.sources, &p) as *const memprobe_source;
                            call!(
                                "exporter_add_source",
                                metrics::memprobe_exporter_add_source(e, s)
                            );
                            let t = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
                            call!(
                                "exporter_watch_tracker",
                                metrics::memprobe_exporter_watch_tracker(e, t)
                            );
                        }
                        2 => {
                            let e =
                                pick(&mut rng, &p.exporters, &p) as *mut metrics::memprobe_exporter;
                            let r = |rng: &mut Rng| {
                                if rng.chance(80) {
                                    rng.below(4) as i64 - 1
                                } else {
                                    rng.next() as i64
                                }
                            };
                            let (a, b, c) = (r(&mut rng), r(&mut rng), r(&mut rng));
                            call!(
                                "exporter_set_rank",
                                metrics::memprobe_exporter_set_rank(e, a, b, c)
                            );
                            call!(
                                "exporter_add_gpus",
                                metrics::memprobe_exporter_add_gpus(e, rng.below(3) as i32 - 1)
                            );
                        }
                        _ => {
                            let e = pick(&mut rng, &p.exporters, &p);
                            if rng.chance(50) {
                                call!(
                                    "exporter_stop",
                                    metrics::memprobe_exporter_stop(
                                        e as *mut metrics::memprobe_exporter
                                    )
                                );
                            }
                            if call!(
                                "exporter_free",
                                metrics::memprobe_exporter_free(
                                    e as *mut metrics::memprobe_exporter
                                )
                            ) == memprobe_status::Ok
                            {
                                p.exporters.retain(|&x| x != e);
                            }
                        }
                    }
                }
                41 => {
                    // Tracker sinks into files, a descriptor, and their end.
                    let h = pick(&mut rng, &p.trackers, &p) as *mut memprobe_tracker;
                    let path = sink_path(&mut rng, &oom_dir);
                    match rng.below(5) {
                        0 => call!(
                            "tracker_add_csv_sink",
                            tracker::memprobe_tracker_add_csv_sink(h, cptr(&path))
                        ),
                        1 => call!(
                            "tracker_add_jsonl_sink",
                            tracker::memprobe_tracker_add_jsonl_sink(h, cptr(&path))
                        ),
                        2 => {
                            let kind = if rng.chance(90) {
                                rng.below(5) as u32
                            } else {
                                rng.next() as u32
                            };
                            let fd = fd(&mut rng, null_fd);
                            call!(
                                "tracker_add_table_sink",
                                tracker::memprobe_tracker_add_table_sink(h, kind, fd)
                            )
                        }
                        3 => call!(
                            "tracker_finish_sinks",
                            tracker::memprobe_tracker_finish_sinks(h)
                        ),
                        _ => {
                            let mut n = 0u64;
                            call!(
                                "tracker_releases_fired",
                                tracker::memprobe_tracker_releases_fired(h, &mut n)
                            )
                        }
                    };
                }
                42 => {
                    // Trace and window queries not covered above.
                    let t = pick(&mut rng, &p.traces, &p) as *mut memprobe_trace;
                    let mut running = false;
                    call!(
                        "trace_is_running",
                        trace::memprobe_trace_is_running(t, &mut running)
                    );
                    let mut d = memprobe_delta::default();
                    call!(
                        "trace_measure",
                        trace::memprobe_trace_measure(t, rng.below(4) as usize, &mut d)
                    );
                    let fd = fd(&mut rng, null_fd);
                    call!(
                        "trace_set_output_fd",
                        trace::memprobe_trace_set_output_fd(t, fd)
                    );
                    let w = pick(&mut rng, &p.windows, &p) as *const memprobe_window;
                    let mut n = 0usize;
                    call!(
                        "window_source_count",
                        window::memprobe_window_source_count(w, &mut n)
                    );
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
                32 => {
                    let name = status::memprobe_status_name(rng.next() as u32);
                    assert!(!name.is_null());
                    let _ = memprobe_b2mb(rng.next());
                }
                _ => {
                    let h = pick(&mut rng, &p.sources, &p);
                    let mut err = memprobe_status::Ok;
                    let mut buf = [0 as c_char; 16];
                    call!(
                        "source_get_last_error",
                        source::memprobe_source_get_last_error(
                            h as *const memprobe_source,
                            &mut err,
                            buf.as_mut_ptr(),
                            buf.len(),
                            std::ptr::null_mut()
                        )
                    );
                }
            }
        }
    }
    // Clean up: every live handle frees; nothing leaks.
    {
        for h in p.trackers.drain(..) {
            check(
                seed,
                steps,
                "final tracker_free",
                tracker::memprobe_tracker_free(h as *mut memprobe_tracker),
            );
        }
        for h in p.traces.drain(..) {
            check(
                seed,
                steps,
                "final trace_free",
                trace::memprobe_trace_free(h as *mut memprobe_trace),
            );
        }
        for h in p.windows.drain(..) {
            check(
                seed,
                steps,
                "final window_free",
                window::memprobe_window_free(h as *mut memprobe_window),
            );
        }
        for h in p.sources.drain(..) {
            check(
                seed,
                steps,
                "final source_free",
                source::memprobe_source_free(h as *mut memprobe_source),
            );
        }
        for h in p.marks.drain(..) {
            check(
                seed,
                steps,
                "final mark_group_free",
                mark::memprobe_mark_group_free(h as *mut mark::memprobe_mark_group),
            );
        }
        for h in p.exporters.drain(..) {
            check(
                seed,
                steps,
                "final exporter_free",
                metrics::memprobe_exporter_free(h as *mut metrics::memprobe_exporter),
            );
        }
        for h in p.devices.drain(..) {
            check(
                seed,
                steps,
                "final gpu_device_free",
                gpu::memprobe_gpu_device_free(h as *mut gpu::memprobe_gpu_device),
            );
        }
    }
    drop(counter);
    drop(step_counter);
    let _ = std::fs::remove_dir_all(&oom_dir);
    steps
}

fn live_handles() -> (u64, u64, u64, u64) {
    let (mut s, mut w, mut t, mut k) = (0, 0, 0, 0);
    assert_eq!(
        memprobe_ffi_impl::memprobe_debug_live_handles(&mut s, &mut w, &mut t, &mut k),
        memprobe_status::Ok
    );
    (s, w, t, k)
}

#[test]
fn fuzz_c_abi_call_sequences() {
    let corpus =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus.txt")).unwrap();
    let seeds: Vec<u64> = corpus
        .lines()
        .filter_map(|l| l.split('#').next()?.trim().parse().ok())
        .collect();
    assert!(!seeds.is_empty(), "the corpus has seeds");
    // Before any tracker: every phase boundary also goes to the run channel.
    let _ = run_channel();
    let fake_nvml = memprobe_tests::stage_fake_gpu(
        memprobe_tests::FakeGpu::Nvml,
        &[],
        "devices 2\ndevice 0 procs self:1000\n",
        &memprobe_tests::scratch("fuzz-abi-nvml"),
    );
    // Configuring is once per process, before any other GPU call (later
    // calls, which the sequences also make, answer WRONG_ORDER): a GPU
    // that answers, so the GPU entry points get past "no GPU".
    let nvml = CString::new(fake_nvml.display().to_string()).unwrap();
    check(
        0,
        0,
        "gpu_configure",
        memprobe_ffi_impl::gpu::memprobe_gpu_configure(1, nvml.as_ptr(), std::ptr::null()),
    );
    let budget = Duration::from_secs(
        std::env::var("MEMPROBE_FUZZ_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    let start = Instant::now();
    let mut calls = 0;
    for &seed in &seeds {
        calls += run_seed(seed, 300, &fake_nvml);
    }
    let mut seed =
        0x9E37_79B9_7F4A_7C15u64 ^ std::process::id() as u64 ^ start.elapsed().as_nanos() as u64;
    let mut extra = 0;
    while start.elapsed() < budget {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        calls += run_seed(seed, 300, &fake_nvml);
        extra += 1;
    }
    memprobe_ffi_impl::monitor::memprobe_monitor_stop();
    assert_eq!(live_handles(), (0, 0, 0, 0), "handles leaked");
    let mut devices = u64::MAX;
    assert_eq!(
        memprobe_ffi_impl::gpu::memprobe_gpu_debug_live_devices(&mut devices),
        memprobe_status::Ok
    );
    assert_eq!(devices, 0, "GPU device handles leaked");
    let succeeded = SUCCEEDED.lock().unwrap_or_else(|e| e.into_inner());
    for deep in [
        "mark_group_new",
        "mark_group_new_many",
        "source_new_mark",
        "gpu_configure",
        "gpu_device_open",
        "gpu_mem_get_all",
        "source_new_gpu_device",
        "exporter_start",
        "exporter_add_source",
        "tracker_add_csv_sink",
        "tracker_next",
    ] {
        assert!(succeeded.contains(deep), "no call of {deep} ever succeeded");
    }
    eprintln!(
        "fuzz: {} corpus seeds + {extra} random seeds, {calls} calls, {:?}, 0 crashes",
        seeds.len(),
        start.elapsed()
    );
}

/// The fuzzer calls every function include/memprobe.h declares, so the ABI
/// cannot grow an entry point that no sequence ever reaches.
#[test]
fn every_exported_function_is_fuzzed() {
    use memprobe_tests::c_header::{calls, declared_functions};
    let header =
        std::fs::read_to_string(memprobe_tests::root().join("include/memprobe.h")).unwrap();
    let declared = declared_functions(&header);
    assert!(declared.len() > 90, "the header parses: {declared:?}");
    let fuzzer = include_str!("fuzz_abi.rs");
    let missing: Vec<&String> = declared.iter().filter(|f| !calls(fuzzer, f)).collect();
    assert!(
        missing.is_empty(),
        "exported but never called by tests/tests/fuzz_abi.rs: {missing:?}"
    );
}
