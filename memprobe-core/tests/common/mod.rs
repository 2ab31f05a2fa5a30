//! Helpers shared by the core's integration tests.
#![allow(dead_code, missing_docs)]

use std::sync::{Mutex, MutexGuard};

pub(crate) const MIB: u64 = 1 << 20;
/// The kernel counts RSS in per-CPU batches (about 32 pages per CPU), so a
/// reading can trail the true value by a few hundred KiB.
pub(crate) const SLACK: u64 = 2 * MIB;

/// Tests that measure this process's memory run one at a time: the process
/// source is process-wide, so another test's allocation would show up.
static MEMORY: Mutex<()> = Mutex::new(());

pub(crate) fn serial() -> MutexGuard<'static, ()> {
    MEMORY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Maps `bytes`, touches every page, unmaps: a spike held for the time of one
/// munmap (well under 1 ms once the pages are in, on an idle machine; how
/// long is never asserted: exact peaks do not depend on it).
pub(crate) fn spike(bytes: usize) {
    // SAFETY: anonymous private mapping, touched within bounds, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let page = 4096;
        let base = p as *mut u8;
        let mut off = 0;
        while off < bytes {
            base.add(off).write_volatile(1);
            off += page;
        }
        assert_eq!(libc::munmap(p, bytes), 0);
    }
}

/// A writer that keeps what is written, for checking printed output.
#[derive(Clone, Default)]
pub(crate) struct Buf(pub(crate) std::sync::Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}
