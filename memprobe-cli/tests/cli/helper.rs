//! Child programs for the tests: the test binary re-executes itself with
//! `MEMPROBE_TEST_CHILD` set and runs only the `helper::child` test, which
//! then behaves as asked and exits. Forked children use only raw system
//! calls (the test harness has other threads).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const ENV: &str = "MEMPROBE_TEST_CHILD";

/// The argv that runs this test binary as a helper child doing `mode`.
pub(crate) fn argv(mode: &[&str]) -> (Vec<OsString>, (&'static str, String)) {
    let exe: PathBuf = std::env::current_exe().expect("current_exe");
    let argv = vec![
        exe.into_os_string(),
        "helper::child".into(),
        "--exact".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
        "-q".into(),
    ];
    (argv, (ENV, mode.join(" ")))
}

fn touch(mib: usize) -> (*mut libc::c_void, usize) {
    let len = mib << 20;
    // SAFETY: an anonymous private mapping with no address hint.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED);
    for off in (0..len).step_by(4096) {
        // SAFETY: inside the mapping.
        unsafe { p.cast::<u8>().add(off).write_volatile(1) };
    }
    (p, len)
}

fn release((p, len): (*mut libc::c_void, usize)) {
    // SAFETY: the mapping made by `touch`.
    unsafe { libc::munmap(p, len) };
}

fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: valid timespec; the remainder pointer may be null.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// Forks a process that runs `f` and `_exit`s.
fn fork(f: impl FnOnce()) -> libc::pid_t {
    // SAFETY: the child only makes raw system calls, then _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        f();
        // SAFETY: ends the child without running the parent's handlers.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0, "fork failed");
    pid
}

static LEADER_EXITS: AtomicU32 = AtomicU32::new(0);
static LEADER_EXITS_RUN: AtomicU32 = AtomicU32::new(0);

/// The thread that outlives its process's main thread (`leader-exits`).
extern "C" fn lives_on(_: *mut libc::c_void) -> *mut libc::c_void {
    sleep_ms(300);
    let _b = touch(LEADER_EXITS.load(Ordering::SeqCst) as usize);
    sleep_ms(u64::from(LEADER_EXITS_RUN.load(Ordering::SeqCst)));
    // SAFETY: ends the whole process.
    unsafe { libc::_exit(0) }
}

fn wait_all(pids: &[libc::pid_t]) {
    for &p in pids {
        let mut st = 0;
        // SAFETY: valid pointer; p is our child.
        unsafe { libc::waitpid(p, &mut st, 0) };
    }
}

#[test]
fn child() {
    let Ok(mode) = std::env::var(ENV) else {
        return; // An ordinary test run: nothing to do.
    };
    let words: Vec<&str> = mode.split(' ').collect();
    let num = |i: usize| -> u64 { words[i].parse().expect("number") };
    match words[0] {
        // Spike right before exiting: the whole spike lasts less than the
        // time it takes to exit.
        "spike-exit" => {
            let _ = touch(num(1) as usize);
            // SAFETY: exit at once.
            unsafe { libc::_exit(0) };
        }
        // Spike, free it, keep running.
        "spike-then-run" => {
            let b = touch(num(1) as usize);
            release(b);
            sleep_ms(num(2));
        }
        // A worker spikes early, frees it and keeps running.
        "worker-spike" => {
            let (mib, run) = (num(1) as usize, num(2));
            let w = fork(|| {
                sleep_ms(50);
                let b = touch(mib);
                release(b);
                sleep_ms(run);
            });
            wait_all(&[w]);
        }
        // A worker whose main thread ends (as with pthread_exit) at once while a
        // second thread lives on: after 300 ms it touches MiB and holds it
        // RUN ms, then ends the process.
        "leader-exits" => {
            LEADER_EXITS.store(num(1) as u32, Ordering::SeqCst);
            LEADER_EXITS_RUN.store(num(2) as u32, Ordering::SeqCst);
            let w = fork(|| {
                // SAFETY: pthread_t is plain data; a thread with default
                // attributes running `lives_on`, which takes no argument.
                unsafe {
                    let mut t: libc::pthread_t = std::mem::zeroed();
                    if libc::pthread_create(
                        &mut t,
                        std::ptr::null(),
                        lives_on,
                        std::ptr::null_mut(),
                    ) != 0
                    {
                        libc::_exit(3);
                    }
                    // Ends this thread only, as pthread_exit would, without
                    // its unwinding through the test harness's frames.
                    libc::syscall(libc::SYS_exit, 0);
                }
            });
            wait_all(&[w]);
        }
        // A worker sleeps DELAY ms, spikes by MiB and exits at once (the
        // spike is in its last interval); the command stays STAY ms more.
        "worker-spike-exit" => {
            let (mib, delay, stay) = (num(1) as usize, num(2), num(3));
            let w = fork(|| {
                sleep_ms(delay);
                let _ = touch(mib);
            });
            wait_all(&[w]);
            sleep_ms(stay);
        }
        // PyTorch's DataLoader buffers as the kernel sees them: a file of
        // SHM MiB in /dev/shm named torch_<pid>_..., mapped shared and
        // touched, 2 workers that map the buffer too, then ANON MiB of the
        // command's own; all held HOLD ms.
        "shm-buffers" => {
            let (shm, anon, hold) = (num(1) as usize, num(2) as usize, num(3));
            let path = format!("/dev/shm/torch_{}_memprobe_test_0", std::process::id());
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .expect("a file in /dev/shm");
            let len = shm << 20;
            file.set_len(len as u64).expect("set_len");
            use std::os::fd::AsRawFd;
            // SAFETY: a shared mapping of a file of that length.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            assert!(p != libc::MAP_FAILED);
            let map_all = move || {
                for off in (0..len).step_by(4096) {
                    // SAFETY: inside the mapping.
                    unsafe { p.cast::<u8>().add(off).write_volatile(1) };
                }
            };
            map_all();
            let pids: Vec<_> = (0..2)
                .map(|_| {
                    fork(|| {
                        map_all();
                        sleep_ms(hold + 300);
                    })
                })
                .collect();
            // The workers have mapped the buffer: the tree's peak (the
            // command's own memory on top) comes after.
            sleep_ms(300);
            let _own = touch(anon);
            sleep_ms(hold);
            wait_all(&pids);
            let _ = std::fs::remove_file(&path);
        }
        // N workers hold MiB each for MS.
        "workers" => {
            let (n, mib, hold) = (num(1), num(2) as usize, num(3));
            let pids: Vec<_> = (0..n)
                .map(|_| {
                    fork(|| {
                        let _b = touch(mib);
                        sleep_ms(hold);
                    })
                })
                .collect();
            wait_all(&pids);
        }
        // The parent touches MiB, then N workers only read it (sharing its
        // pages copy-on-write, as DataLoader workers do), all for MS.
        "shared-workers" => {
            let (n, mib, hold) = (num(1), num(2) as usize, num(3));
            let (p, len) = touch(mib);
            let pids: Vec<_> = (0..n)
                .map(|_| {
                    fork(|| {
                        let mut sum = 0u64;
                        for off in (0..len).step_by(4096) {
                            // SAFETY: inside the inherited mapping.
                            sum += u64::from(unsafe { p.cast::<u8>().add(off).read_volatile() });
                        }
                        assert!(sum > 0);
                        sleep_ms(hold);
                    })
                })
                .collect();
            sleep_ms(hold);
            wait_all(&pids);
            release((p, len));
        }
        // N workers and the command share one MAP_SHARED buffer of MiB:
        // the command touches every page of it, then the workers do, one
        // page every US microseconds (0: at full speed), the pages becoming
        // shared while readings go on; then all hold it for MS.
        "mapshared-workers" => {
            let (n, mib, us, hold) = (num(1), num(2) as usize, num(3), num(4));
            let len = mib << 20;
            // SAFETY: a shared anonymous mapping with no address hint.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert!(p != libc::MAP_FAILED);
            let walk = move || {
                for off in (0..len).step_by(4096) {
                    // SAFETY: inside the shared mapping.
                    unsafe { p.cast::<u8>().add(off).write_volatile(1) };
                    if us > 0 && off % (64 * 4096) == 0 {
                        sleep_ms(0);
                        let ts = libc::timespec {
                            tv_sec: 0,
                            tv_nsec: (us * 64 * 1000) as libc::c_long,
                        };
                        // SAFETY: valid timespec.
                        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
                    }
                }
            };
            // The command's pages first: each worker's faults then turn
            // pages of the command's alone into shared ones.
            walk();
            let pids: Vec<_> = (0..n)
                .map(|_| {
                    fork(move || {
                        walk();
                        sleep_ms(hold);
                    })
                })
                .collect();
            sleep_ms(hold);
            wait_all(&pids);
        }
        // Kills itself with SIGKILL (not the OOM killer: no counter rises).
        "self-kill" => {
            sleep_ms(num(1));
            // SAFETY: raising a signal on this process.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        // Touches MiB more every MS milliseconds, forever: in a cgroup with
        // a small limit, until the OOM killer ends it.
        "grow" => {
            let (mib, ms) = (num(1) as usize, num(2));
            loop {
                let _ = touch(mib);
                sleep_ms(ms);
            }
        }
        // A training loop that reports its phases: epoch 0 of three steps,
        // then epoch 1, whose steps each touch MiB more every MS
        // milliseconds until the OOM killer ends it.
        "grow-in-epochs" => {
            use memprobe_core::{PhaseKind, Source, Tracker};
            let (mib, ms) = (num(1) as usize, num(2));
            let mut t = Tracker::new(&[Source::process().unwrap()]).unwrap();
            t.begin(PhaseKind::Epoch, None).unwrap();
            t.begin(PhaseKind::Step, None).unwrap();
            for _ in 0..3 {
                sleep_ms(ms);
                t.next(PhaseKind::Step, None).unwrap();
            }
            t.end(PhaseKind::Step, None).unwrap();
            t.end(PhaseKind::Epoch, None).unwrap();
            t.begin(PhaseKind::Epoch, None).unwrap();
            t.begin(PhaseKind::Step, None).unwrap();
            loop {
                let _ = touch(mib);
                sleep_ms(ms);
                t.next(PhaseKind::Step, None).unwrap();
            }
        }
        // A worker grows as above; the parent, like a busy trainer, notices
        // its end only at its next poll (300 ms), then exits with 3 if a
        // signal ended it.
        "worker-grows" => {
            let (mib, ms) = (num(1) as usize, num(2));
            let w = fork(|| loop {
                let _ = touch(mib);
                sleep_ms(ms);
            });
            let mut st = 0;
            loop {
                sleep_ms(300);
                // SAFETY: valid pointer; w is our child.
                if unsafe { libc::waitpid(w, &mut st, libc::WNOHANG) } == w {
                    break;
                }
            }
            std::process::exit(if libc::WIFSIGNALED(st) { 3 } else { 0 });
        }
        // After DELAY ms, a worker grows by MiB every MS ms until the OOM
        // killer ends it; the parent reaps it at once (it lives between two
        // samples of a 1 s interval), stays until 2.5 s, and exits with 3
        // if a signal ended the worker.
        "short-worker-grows" => {
            let (delay, mib, ms) = (num(1), num(2) as usize, num(3));
            let started = std::time::Instant::now();
            sleep_ms(delay);
            let w = fork(|| loop {
                let _ = touch(mib);
                sleep_ms(ms);
            });
            let mut st = 0;
            // SAFETY: valid pointer; w is our child.
            unsafe { libc::waitpid(w, &mut st, 0) };
            let left = 2500u64.saturating_sub(started.elapsed().as_millis() as u64);
            sleep_ms(left);
            std::process::exit(if libc::WIFSIGNALED(st) { 3 } else { 0 });
        }
        // A trainer that reports its phases opens epoch 0 then epoch 1 and
        // forks a worker (which reports none) that grows by MiB every MS ms
        // until the OOM killer ends it; exits with 3 after that.
        "worker-grows-in-epochs" => {
            use memprobe_core::{PhaseKind, Source, Tracker};
            let (mib, ms) = (num(1) as usize, num(2));
            let mut t = Tracker::new(&[Source::process().unwrap()]).unwrap();
            t.begin(PhaseKind::Epoch, None).unwrap();
            sleep_ms(ms);
            t.next(PhaseKind::Epoch, None).unwrap();
            let w = fork(|| loop {
                let _ = touch(mib);
                sleep_ms(ms);
            });
            let mut st = 0;
            // SAFETY: valid pointer; w is our child.
            unsafe { libc::waitpid(w, &mut st, 0) };
            t.end(PhaseKind::Epoch, None).unwrap();
            drop(t);
            std::process::exit(if libc::WIFSIGNALED(st) { 3 } else { 0 });
        }
        "exit" => std::process::exit(num(1) as i32),
        "marker" => {
            std::fs::write(words[1], b"ran").expect("marker");
        }
        "sleep" => std::thread::sleep(Duration::from_millis(num(1))),
        // Count SIGINTs for MS milliseconds, then report.
        "count-sigint" => {
            static COUNT: AtomicU32 = AtomicU32::new(0);
            extern "C" fn on_sigint(_: libc::c_int) {
                COUNT.fetch_add(1, Ordering::SeqCst);
            }
            // SAFETY: the handler only touches an atomic.
            unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
            println!("ready");
            let end = std::time::Instant::now() + Duration::from_millis(num(1));
            while std::time::Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            println!("SIGINT count {}", COUNT.load(Ordering::SeqCst));
        }
        m if m.starts_with("phase-") => crate::phases::child(&words),
        other => panic!("unknown helper mode {other}"),
    }
    std::process::exit(0);
}
