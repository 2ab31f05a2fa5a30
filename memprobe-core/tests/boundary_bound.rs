//! The exact RSS peak a window boundary (`Window::reset`) reports against
//! the kernel's own `VmHWM`: a boundary reads the mark, resets it and reads
//! the RSS that starts the next interval, and folds that reading into the
//! ended interval's peak in place of a reading of its own before the reset.
//! Over many random intervals of allocations still resident at the
//! boundary, no ended interval's peak, and no enclosing window's peak, is
//! below a `VmHWM` read inside it.

use memprobe_core::process::peak_error_bound;
use memprobe_core::{PeakFidelity, Source, Window};

/// A private anonymous mapping, every page touched; unmapped on drop.
struct Touched {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Touched {
    fn new(pages: usize) -> Touched {
        let len = pages * 4096;
        // SAFETY: a fresh anonymous mapping, written within its bounds.
        unsafe {
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(ptr, libc::MAP_FAILED);
            let base = ptr.cast::<u8>();
            for off in (0..len).step_by(4096) {
                base.add(off).write_volatile(1);
            }
            Touched { ptr, len }
        }
    }
}

impl Drop for Touched {
    fn drop(&mut self) {
        // SAFETY: mapped in `new`, unmapped once.
        assert_eq!(unsafe { libc::munmap(self.ptr, self.len) }, 0);
    }
}

/// `VmHWM` from `/proc/self/status`, bytes: the kernel's stored mark or the
/// exact current RSS, whichever is higher.
fn vmhwm() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = text.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// The current RSS from `/proc/self/statm`, bytes.
fn statm_rss() -> u64 {
    let text = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap()
}

/// `getrusage`'s `ru_maxrss`, bytes.
fn maxrss() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    u64::try_from(ru.ru_maxrss).unwrap() * 1024
}

/// xorshift64*: reproducible windows, the seed printed on failure.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn seed() -> u64 {
    std::env::var("MEMPROBE_PEAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| memprobe_core::monotonic_ns() | 1)
}

/// One test, run alone in its process, so no other test's allocation lands
/// inside an interval.
#[test]
fn no_boundary_reports_a_peak_below_a_vmhwm_read_inside_its_interval() {
    let bound = peak_error_bound();
    let rss = Source::process().unwrap();
    assert_eq!(rss.info().fidelity, PeakFidelity::Exact, "clear_refs works");
    let seed = seed();
    let mut rng = Rng(seed);
    let ctx = format!("seed {seed} (MEMPROBE_PEAK_SEED), {bound:?}");
    // Above the exec floor, where a boundary reads getrusage alone before
    // its reset (see kernel_hwm.rs).
    let floor = maxrss();
    let _ballast = Touched::new(((floor.saturating_sub(statm_rss()) + (16 << 20)) / 4096) as usize);
    assert!(statm_rss() > floor, "ballast above the exec floor");

    let mut epoch = Window::open(std::slice::from_ref(&rss)).unwrap();
    let mut step = Window::open(std::slice::from_ref(&rss)).unwrap();
    let mut epoch_inside = 0;
    let mut low = 0;
    for i in 0..700 {
        let mut held = Vec::new();
        let mut inside = 0;
        for _ in 0..=rng.below(5) {
            held.push(Touched::new(1 + rng.below(2000) as usize));
            if rng.below(2) == 0 {
                inside = inside.max(vmhwm());
            }
        }
        inside = inside.max(vmhwm());
        epoch_inside = epoch_inside.max(inside);
        let ended = step.reset().unwrap()[0].peak;
        if ended + bound.held < inside {
            low += 1;
            eprintln!(
                "interval {i}: peak {ended} < VmHWM {inside} by {} KiB",
                (inside - ended) / 1024
            );
        }
        drop(held);
        if i % 100 == 99 {
            let peak = epoch.reset().unwrap()[0].peak;
            assert!(
                peak + bound.held >= epoch_inside,
                "epoch ending at {i}: peak {peak} < VmHWM {epoch_inside}; {ctx}"
            );
            epoch_inside = 0;
        }
    }
    assert_eq!(low, 0, "{low} intervals read below VmHWM; {ctx}");
}
