//! memprobe's hot paths against a floor and a peer, measured side by side in
//! one run: reading this process's RSS, and a window boundary (end + begin)
//! with 1 and 64 open windows.
//!
//! `cargo bench -p memprobe-tests --bench overhead` (release build). Cases
//! are interleaved round by round so machine noise hits them alike; each
//! figure is the median over rounds of the mean time per call in a round.

use memprobe_core::{Source, Window};
use std::ffi::{c_char, c_void, CString};
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

const ROUNDS: usize = 31;
const ITERS: usize = 2000;

#[repr(C)]
#[derive(Default)]
struct Sample {
    used: u64,
    total: u64,
    free: u64,
    limit: u64,
    reserved: u64,
    valid: u32,
    taken_at_ns: u64,
    read_ns: u64,
}

type NewProcess = unsafe extern "C" fn(u32, *mut *mut c_void) -> u32;
type Read = unsafe extern "C" fn(*const c_void, *mut Sample) -> u32;
type ReadUsed = unsafe extern "C" fn(*const c_void, *mut u64) -> u32;
type WindowOpen = unsafe extern "C" fn(*const *const c_void, usize, *mut *mut c_void) -> u32;
type WindowPeak = unsafe extern "C" fn(*const c_void, usize, *mut u64) -> u32;
type WindowFree = unsafe extern "C" fn(*mut c_void) -> u32;
type WindowReset = unsafe extern "C" fn(*mut c_void, *mut Delta, usize) -> u32;
type TrackerNew = unsafe extern "C" fn(*const *const c_void, usize, *mut *mut c_void) -> u32;
type TrackerBegin = unsafe extern "C" fn(*mut c_void, u32, *const c_char) -> u32;
type TrackerNext =
    unsafe extern "C" fn(*mut c_void, u32, *const c_char, *mut c_void, *mut Delta, usize) -> u32;

/// `MEMPROBE_PHASE_KIND_EPOCH` and `MEMPROBE_PHASE_KIND_STEP`.
const PHASE_EPOCH: u32 = 1;
const PHASE_STEP: u32 = 0;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Delta {
    used_start: u64,
    used_end: u64,
    peak: u64,
    delta_used: i64,
    delta_peaked: u64,
    kind: u32,
    fidelity: u32,
}

struct CAbi {
    read: Read,
    read_used: ReadUsed,
    open: WindowOpen,
    peak: WindowPeak,
    free: WindowFree,
    reset: WindowReset,
    tracker_new: TrackerNew,
    tracker_begin: TrackerBegin,
    tracker_next: TrackerNext,
    source: *mut c_void,
}

fn load_c_abi() -> CAbi {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or(root.join("target"));
    let lib = target.join("release/libmemprobe.so");
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args(["build", "-q", "--release", "-p", "memprobe-ffi"])
        .current_dir(&root)
        .status()
        .expect("cargo build");
    assert!(status.success());
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading our own library; symbols are looked up by their C names.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen {}", lib.display());
        let sym = |n: &str| {
            let c = CString::new(n).unwrap();
            let p = libc::dlsym(h, c.as_ptr() as *const c_char);
            assert!(!p.is_null(), "missing {n}");
            p
        };
        let new =
            std::mem::transmute::<*mut c_void, NewProcess>(sym("memprobe_source_new_process"));
        let mut source = std::ptr::null_mut();
        assert_eq!(new(0, &mut source), 0);
        CAbi {
            read: std::mem::transmute::<*mut c_void, Read>(sym("memprobe_source_read")),
            read_used: std::mem::transmute::<*mut c_void, ReadUsed>(sym(
                "memprobe_source_read_used",
            )),
            open: std::mem::transmute::<*mut c_void, WindowOpen>(sym("memprobe_window_open")),
            peak: std::mem::transmute::<*mut c_void, WindowPeak>(sym("memprobe_window_peak")),
            free: std::mem::transmute::<*mut c_void, WindowFree>(sym("memprobe_window_free")),
            reset: std::mem::transmute::<*mut c_void, WindowReset>(sym("memprobe_window_reset")),
            tracker_new: std::mem::transmute::<*mut c_void, TrackerNew>(sym(
                "memprobe_tracker_new",
            )),
            tracker_begin: std::mem::transmute::<*mut c_void, TrackerBegin>(sym(
                "memprobe_tracker_begin",
            )),
            tracker_next: std::mem::transmute::<*mut c_void, TrackerNext>(sym(
                "memprobe_tracker_next",
            )),
            source,
        }
    }
}

struct Case {
    name: &'static str,
    run: Box<dyn FnMut()>,
    rounds: Vec<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `Window::reset_into` with `open - 1` other windows open over the process
/// source, for open in 1, 64, 1024: the median per-call time of each.
fn window_scaling() -> Vec<(usize, f64)> {
    let rss = Source::process().unwrap();
    [1usize, 64, 1024]
        .into_iter()
        .map(|open| {
            let outer: Vec<Window> = (0..open - 1)
                .map(|_| Window::open(std::slice::from_ref(&rss)).unwrap())
                .collect();
            let mut w = Window::open(std::slice::from_ref(&rss)).unwrap();
            let mut ended = Vec::new();
            for _ in 0..ITERS / 4 {
                w.reset_into(&mut ended).unwrap();
            }
            let mut rounds: Vec<f64> = (0..ROUNDS)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..ITERS {
                        w.reset_into(&mut ended).unwrap();
                        black_box(&ended);
                    }
                    t.elapsed().as_nanos() as f64 / ITERS as f64
                })
                .collect();
            drop(outer);
            (open, median(&mut rounds))
        })
        .collect()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let statm = std::fs::File::open("/proc/self/statm").unwrap();
    // `exec` left this process the high-water mark of what it replaced (the
    // launcher: cargo, a shell, torchrun); it is a floor of getrusage that no
    // reset lowers. A trainer holds more than its launcher, which is what
    // this ballast models; run with MEMPROBE_BENCH_BALLAST_MIB=0 to measure
    // the slow, still exact, path taken below the floor.
    let ballast_mib: usize = std::env::var("MEMPROBE_BENCH_BALLAST_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let mut ballast = vec![0u8; ballast_mib << 20];
    for i in (0..ballast.len()).step_by(4096) {
        ballast[i] = 1;
    }
    black_box(&ballast);
    let rss = Source::process().unwrap();
    // How a step boundary scales with the windows open over the same source,
    // measured first and alone: the interleaved cases below keep windows of
    // their own open on this process's source for the whole run.
    let scaling = window_scaling();
    let mut buf = [0u8; 256];
    let c = load_c_abi();
    let mut sys = sysinfo::System::new().expect("sysinfo initialises");
    let pid = sysinfo::Pid::from_u32(std::process::id());

    let mut cases: Vec<Case> = Vec::new();
    let mut add = |name: &'static str, run: Box<dyn FnMut()>| {
        cases.push(Case {
            name,
            run,
            rounds: Vec::new(),
        })
    };

    add(
        "floor: bare pread /proc/self/statm",
        Box::new(move || {
            black_box(statm.read_at(&mut buf, 0).unwrap());
        }),
    );
    // The kernel work a step boundary cannot avoid, done bare: read the
    // high-water mark, reset it, read the RSS that starts the next step.
    let statm2 = std::fs::File::open("/proc/self/statm").unwrap();
    let clear_refs = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/clear_refs")
        .unwrap();
    let mut buf2 = [0u8; 256];
    add(
        "floor: bare getrusage + clear_refs + statm",
        Box::new(move || {
            // SAFETY: rusage is plain data filled by the kernel.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: valid out-pointer.
            unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
            black_box(ru.ru_maxrss);
            black_box(clear_refs.write_at(b"5", 0).unwrap());
            black_box(statm2.read_at(&mut buf2, 0).unwrap());
        }),
    );
    let r = rss.clone();
    add(
        "rss read, memprobe Rust",
        Box::new(move || {
            black_box(r.read().unwrap());
        }),
    );
    let src = c.source;
    let read = c.read;
    add(
        "rss read, memprobe C ABI",
        Box::new(move || {
            let mut s = Sample::default();
            // SAFETY: a live handle and a valid out-pointer.
            black_box(unsafe { read(src, &mut s) });
        }),
    );
    // The bytes alone (no clock read, no sample): the read for a hot loop.
    let r = rss.clone();
    add(
        "rss read (bytes only), memprobe Rust",
        Box::new(move || {
            black_box(r.read_used().unwrap());
        }),
    );
    let (src, read_used) = (c.source, c.read_used);
    add(
        "rss read (bytes only), memprobe C ABI",
        Box::new(move || {
            let mut used = 0u64;
            // SAFETY: a live handle and a valid out-pointer.
            black_box(unsafe { read_used(src, &mut used) });
        }),
    );
    add(
        "rss read, sysinfo refresh of one process",
        Box::new(move || {
            sys.refresh_processes_specifics(
                sysinfo::ProcessesToUpdate::Some(&[pid]),
                false,
                sysinfo::ProcessRefreshKind::nothing().with_memory(),
            );
            black_box(sys.process(pid).map(|p| p.memory()));
        }),
    );
    // A step boundary the way a training loop does it: `reset` ends the
    // step's interval (returning its peak) and starts the next, with
    // `open - 1` outer windows (epoch, experience, ...) open around it.
    {
        let r = rss.clone();
        let mut w = Window::open(&[r]).unwrap();
        let mut ended = Vec::new();
        add(
            "step boundary (reset), Rust, 1 window",
            Box::new(move || {
                w.reset_into(&mut ended).unwrap();
                black_box(&ended);
            }),
        );
        // Without the time (no clock read): what the C ABI's reset does.
        let mut w = Window::open(std::slice::from_ref(&rss)).unwrap();
        let mut ended = Vec::new();
        add(
            "step boundary (reset, untimed), Rust, 1 window",
            Box::new(move || {
                w.reset_untimed_into(&mut ended).unwrap();
                black_box(&ended);
            }),
        );
        // The same through `reset`, which returns a new vector each time.
        let mut w = Window::open(std::slice::from_ref(&rss)).unwrap();
        add(
            "step boundary (reset, new Vec), Rust, 1 window",
            Box::new(move || {
                black_box(w.reset().unwrap());
            }),
        );
    }
    for open in [1usize, 64] {
        let (o, reset, src) = (c.open, c.reset, c.source);
        let srcs = [src as *const c_void];
        let mut handles = Vec::new();
        for _ in 0..open {
            let mut h = std::ptr::null_mut();
            // SAFETY: valid array and out-pointer.
            assert_eq!(unsafe { o(srcs.as_ptr(), 1, &mut h) }, 0);
            handles.push(h);
        }
        let w = *handles.last().unwrap();
        let name: &'static str = if open == 1 {
            "step boundary (reset, untimed), C ABI, 1 window"
        } else {
            "step boundary (reset, untimed), C ABI, 64 windows"
        };
        add(
            name,
            Box::new(move || {
                let _keep = &handles;
                let mut ended = [Delta::default()];
                // SAFETY: a live handle and a one-element array.
                black_box(unsafe { reset(w, ended.as_mut_ptr(), 1) });
            }),
        );
    }
    // The tracker's step boundary over this process alone, whose kernel work
    // is the boundary floor's: from Rust and through the C ABI.
    {
        let mut t = memprobe_core::Tracker::new(std::slice::from_ref(&rss)).unwrap();
        t.begin(memprobe_core::PhaseKind::Epoch, None).unwrap();
        t.begin(memprobe_core::PhaseKind::Step, None).unwrap();
        add(
            "tracker step next, process, Rust",
            Box::new(move || {
                black_box(t.next(memprobe_core::PhaseKind::Step, None).unwrap());
            }),
        );
        let srcs = [c.source as *const c_void];
        let mut h = std::ptr::null_mut();
        let (new, begin, next) = (c.tracker_new, c.tracker_begin, c.tracker_next);
        // SAFETY: valid arrays and out-pointers; NULL names for built-in kinds.
        unsafe {
            assert_eq!(new(srcs.as_ptr(), 1, &mut h), 0);
            assert_eq!(begin(h, PHASE_EPOCH, std::ptr::null()), 0);
            assert_eq!(begin(h, PHASE_STEP, std::ptr::null()), 0);
        }
        add(
            "tracker step next, process, C ABI",
            Box::new(move || {
                let mut ended = [Delta::default()];
                // SAFETY: a live handle; the record is not asked for (NULL).
                black_box(unsafe {
                    next(
                        h,
                        PHASE_STEP,
                        std::ptr::null(),
                        std::ptr::null_mut(),
                        ended.as_mut_ptr(),
                        1,
                    )
                });
            }),
        );
    }
    // Separate windows: read one's peak and free it, then open the next.
    for open in [1usize, 64] {
        let (o, p, f, src) = (c.open, c.peak, c.free, c.source);
        let srcs = [src as *const c_void];
        let mut outer = Vec::new();
        for _ in 0..open - 1 {
            let mut h = std::ptr::null_mut();
            // SAFETY: valid array and out-pointer.
            assert_eq!(unsafe { o(srcs.as_ptr(), 1, &mut h) }, 0);
            outer.push(h);
        }
        let mut w = std::ptr::null_mut();
        // SAFETY: as above.
        assert_eq!(unsafe { o(srcs.as_ptr(), 1, &mut w) }, 0);
        let name: &'static str = if open == 1 {
            "close + open, C ABI, 1 window"
        } else {
            "close + open, C ABI, 64 windows"
        };
        add(
            name,
            Box::new(move || {
                let _keep = &outer;
                let mut peak = 0u64;
                // SAFETY: live handles, valid pointers.
                unsafe {
                    black_box(p(w, 0, &mut peak));
                    f(w);
                    o(srcs.as_ptr(), 1, &mut w);
                }
            }),
        );
    }

    // A training step boundary through the tracker (`next`), over this
    // process and the container's cgroup when there is one, with no sink and
    // with the PeakMemMetric table sink (rows only per epoch: a step record
    // passes it by). The window cost for the same sources is measured beside.
    let mut host: Vec<Source> = vec![rss.clone()];
    match Source::cgroup() {
        Ok(cg) => host.push(cg),
        Err(e) => eprintln!("no cgroup source ({e}); tracker cases use the process source alone"),
    }
    {
        let mut w = Window::open(&host).unwrap();
        add(
            "window reset, process + cgroup",
            Box::new(move || {
                black_box(w.reset().unwrap());
            }),
        );
    }
    for table in [false, true] {
        let mut t = memprobe_core::Tracker::new(&host).unwrap();
        if table {
            t.add_sink(std::sync::Arc::new(memprobe_core::TableSink::new(
                memprobe_core::PhaseKind::Epoch,
                Box::new(std::io::sink()),
            )));
        }
        t.begin(memprobe_core::PhaseKind::Epoch, None).unwrap();
        t.begin(memprobe_core::PhaseKind::Step, None).unwrap();
        let name: &'static str = if table {
            "tracker step next, process + cgroup, table sink"
        } else {
            "tracker step next, process + cgroup, no sink"
        };
        add(
            name,
            Box::new(move || {
                black_box(t.next(memprobe_core::PhaseKind::Step, None).unwrap());
            }),
        );
    }

    // Reading a process tree as it grows: 1, 8 and 64 children (sleeping
    // processes), summed RSS through the process-tree source.
    let mut children: Vec<std::process::Child> = Vec::new();
    for (n, name) in [
        (0usize, "process tree read, 1 process"),
        (7, "process tree read, 8 processes"),
        (63, "process tree read, 64 processes"),
    ] {
        // Each case reads a tree rooted at a shell holding `n` sleeping
        // children, in a process group of its own (killed whole at the end).
        use std::os::unix::process::CommandExt;
        let root = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("for i in $(seq {n}); do sleep 600 & done; wait"))
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        std::thread::sleep(std::time::Duration::from_millis(200));
        let tree = Source::from_sampler(Box::new(
            memprobe_core::ProcessTreeSampler::at(root.id()).unwrap(),
        ));
        children.push(root);
        add(
            name,
            Box::new(move || {
                black_box(tree.read().unwrap());
            }),
        );
    }
    // psutil's memory_info() in the same run, through python3, when psutil is
    // installed: the per-call time of a 20000-call loop, timed inside Python.
    let psutil_ns = std::process::Command::new("python3")
        .args(["-c", "import psutil,time\np=psutil.Process()\nfor _ in range(2000): p.memory_info()\nt=time.perf_counter_ns()\nfor _ in range(20000): p.memory_info()\nprint((time.perf_counter_ns()-t)/20000)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok());

    // MEMPROBE_BENCH_CASES=a,b keeps the floors and the cases whose names
    // contain one of the comma-separated parts (to profile a few).
    if let Ok(only) = std::env::var("MEMPROBE_BENCH_CASES") {
        cases.retain(|c| {
            c.name.starts_with("floor") || only.split(',').any(|part| c.name.contains(part))
        });
    }
    for case in &mut cases {
        for _ in 0..ITERS / 4 {
            (case.run)();
        }
    }
    for _ in 0..ROUNDS {
        for case in &mut cases {
            let t = Instant::now();
            for _ in 0..ITERS {
                (case.run)();
            }
            case.rounds
                .push(t.elapsed().as_nanos() as f64 / ITERS as f64);
        }
    }
    let floor = median(&mut cases[0].rounds.clone());
    println!("memprobe overhead benchmark: {ROUNDS} rounds x {ITERS} calls, cases interleaved, {ballast_mib} MiB held");
    println!("{:<50} {:>12} {:>10}", "case", "median ns", "x floor");
    for case in &mut cases {
        let m = median(&mut case.rounds);
        println!("{:<50} {:>12.0} {:>9.2}x", case.name, m, m / floor);
    }
    println!(
        "window scaling, measured alone before the table ({ROUNDS} rounds x {ITERS} calls each):"
    );
    for (open, m) in &scaling {
        println!(
            "{:<50} {:>12.0} {:>9.2}x",
            format!("step boundary (reset), Rust, {open} window(s) alone"),
            m,
            m / floor
        );
    }
    match psutil_ns {
        Some(ns) => println!(
            "{:<50} {:>12.0} {:>9.2}x  (one loop in python3, not interleaved)",
            "rss read, psutil memory_info() (Python)",
            ns,
            ns / floor
        ),
        None => println!(
            "rss read, psutil memory_info() (Python): skipped (python3 with psutil not found)"
        ),
    }
    for mut c in children {
        // SAFETY: kill(2) on the process group this bench created.
        unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
        let _ = c.wait();
    }
}
