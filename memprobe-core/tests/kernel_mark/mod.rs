//! What the kernel-mark tests (peak_bound.rs, boundary_bound.rs) share:
//! touched mappings, the kernel's own readings of this process's memory,
//! and reproducible random numbers.
#![allow(dead_code, missing_docs)]

/// A private anonymous mapping, every page touched; unmapped on drop.
pub(crate) struct Touched {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Touched {
    pub(crate) fn new(pages: usize) -> Touched {
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
pub(crate) fn vmhwm() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = text.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// The current RSS from `/proc/self/statm`, bytes.
pub(crate) fn statm_rss() -> u64 {
    let text = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap()
}

/// `getrusage`'s `ru_maxrss`, bytes.
pub(crate) fn maxrss() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    u64::try_from(ru.ru_maxrss).unwrap() * 1024
}

/// xorshift64*: reproducible windows, the seed printed on failure.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

pub(crate) fn seed() -> u64 {
    std::env::var("MEMPROBE_PEAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| memprobe_core::monotonic_ns() | 1)
}
