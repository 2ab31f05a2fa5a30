//! What every family of calls shares: the random source, the callbacks
//! handed to memprobe, arbitrary arguments (descriptors, paths, strings,
//! handles), the pool of live handles, the sequence's context, and the
//! check every call's status goes through.

use memprobe_ffi_impl::status::memprobe_status;
use memprobe_ffi_impl::tracker::memprobe_phase_record;
use memprobe_ffi_impl::window::memprobe_delta;
use std::ffi::{c_char, c_void, CString};

pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub(crate) unsafe extern "C" fn read_cb(data: *mut c_void, out: *mut u64) -> i32 {
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
pub(crate) unsafe extern "C" fn release_cb(_data: *mut c_void) -> i32 {
    0
}
pub(crate) unsafe extern "C" fn line_cb(_line: *const c_char, _data: *mut c_void) {}
pub(crate) unsafe extern "C" fn record_cb(
    _r: *const memprobe_phase_record,
    _d: *const memprobe_delta,
    _n: usize,
    _u: *mut c_void,
) {
}
pub(crate) unsafe extern "C" fn oom_cb(
    json: *const c_char,
    summary: *const c_char,
    _data: *mut c_void,
) {
    assert!(!json.is_null() && !summary.is_null());
}
pub(crate) unsafe extern "C" fn step_cb(data: *mut c_void) -> i32 {
    // SAFETY: a live u64 counter.
    let n = unsafe { &mut *(data as *mut u64) };
    *n += 1;
    (*n % 3) as i32
}

pub(crate) unsafe extern "C" fn mark_read_cb(
    data: *mut c_void,
    index: usize,
    out: *mut u64,
) -> i32 {
    // SAFETY: a live u64 counter; memprobe passes a valid out-pointer.
    let v = unsafe { *(data as *const u64) };
    // SAFETY: as above.
    unsafe { *out = v.wrapping_add(index as u64) };
    i32::from(v % 11 == 5)
}
pub(crate) unsafe extern "C" fn mark_read_many_cb(
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
pub(crate) unsafe extern "C" fn mark_reset_cb(data: *mut c_void) -> i32 {
    // SAFETY: a live u64 counter.
    let v = unsafe { *(data as *const u64) };
    i32::from(v % 17 == 9)
}

/// An out-pointer to hand memprobe: `slot`, or NULL when `give` is false.
pub(crate) fn out_ptr<T>(slot: &mut T, give: bool) -> *mut T {
    if give {
        slot
    } else {
        std::ptr::null_mut()
    }
}

/// A file descriptor to hand memprobe: /dev/null, or one that is not open.
pub(crate) fn fd(rng: &mut Rng, null_fd: i32) -> i32 {
    match rng.below(4) {
        0 => -1,
        1 => 1 << 20,
        _ => null_fd,
    }
}

/// A sink path: a file in the scratch directory, the directory itself, a
/// path under a missing directory, empty, invalid UTF-8 or NULL.
pub(crate) fn sink_path(rng: &mut Rng, dir: &std::path::Path) -> Option<CString> {
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
pub(crate) fn gpu_lib_path(rng: &mut Rng, fake_nvml: &std::path::Path) -> Option<CString> {
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
pub(crate) fn run_channel() -> &'static std::sync::Mutex<Option<std::os::unix::net::UnixDatagram>> {
    static RX: std::sync::OnceLock<std::sync::Mutex<Option<std::os::unix::net::UnixDatagram>>> =
        std::sync::OnceLock::new();
    RX.get_or_init(|| {
        let path =
            std::env::temp_dir().join(format!("memprobe-fuzz-run-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let rx = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the run channel");
        rx.set_nonblocking(true).unwrap();
        std::env::set_var(memprobe_core::internal::run_channel::ENV, &path);
        std::sync::Mutex::new(Some(rx))
    })
}

#[derive(Default)]
pub(crate) struct Pool {
    pub(crate) sources: Vec<usize>,
    pub(crate) windows: Vec<usize>,
    pub(crate) traces: Vec<usize>,
    pub(crate) trackers: Vec<usize>,
    pub(crate) marks: Vec<usize>,
    pub(crate) exporters: Vec<usize>,
    pub(crate) devices: Vec<usize>,
}

pub(crate) fn pick(rng: &mut Rng, live: &[usize], others: &Pool) -> usize {
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

pub(crate) fn text(rng: &mut Rng) -> Option<CString> {
    match rng.below(6) {
        0 => None,
        1 => Some(CString::new("").unwrap()),
        2 => Some(CString::new(vec![0xff, 0xfe]).unwrap()),
        3 => Some(CString::new("x".repeat(rng.below(200) as usize + 1)).unwrap()),
        _ => Some(CString::new(format!("n{}", rng.below(1000))).unwrap()),
    }
}

pub(crate) fn cptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

/// The highest status value this version knows.
pub(crate) const KNOWN: u32 = memprobe_status::OutOfMemory as u32;

/// Calls that succeeded, by entry point: the fuzzer must reach the states
/// behind them (a mark group to make sources from, a GPU that answers).
pub(crate) static SUCCEEDED: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

pub(crate) fn check(seed: u64, step: usize, what: &str, st: memprobe_status) {
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

pub(crate) fn last_error() -> String {
    // SAFETY: memprobe_last_error never returns NULL.
    unsafe { std::ffi::CStr::from_ptr(memprobe_ffi_impl::boundary::memprobe_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// What one sequence's calls share besides the random source and the pool.
pub(crate) struct Seq {
    pub(crate) seed: u64,
    pub(crate) step: usize,
    /// A callback source's counter.
    pub(crate) counter_ptr: *mut c_void,
    /// The OOM retry's step counter.
    pub(crate) step_counter: *mut c_void,
    /// Where OOM reports and sinks are written.
    pub(crate) oom_dir: std::path::PathBuf,
    pub(crate) oom_path: String,
    /// An open descriptor of /dev/null.
    pub(crate) null_fd: i32,
    /// The fake NVML the GPU module is configured with.
    pub(crate) fake_nvml: std::path::PathBuf,
}
