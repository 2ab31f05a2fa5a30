//! Exact GPU sources: this process's device memory as the driver-API
//! interposer (`libmemprobe_interpose.so`, crate `memprobe-interpose-reader`)
//! counts it at every allocation and free.
//!
//! Each source claims one high-water mark of its own in the interposer's
//! region (one per reader, like a cgroup v2 `memory.peak` descriptor), so the
//! source is an exact source over a resettable mark ([`Source::mark`]):
//! windows, traces and trackers fold the mark at every boundary and restart
//! it, as they do with the kernel's `VmHWM`. A spike that allocates and frees
//! within microseconds is in the peak of every window open across it; a
//! `memprobe run` reading the same process from outside holds marks of its
//! own and never resets these.

use memprobe_core::internal::fork;
use memprobe_core::{Error, ErrorKind, Marks, Result, Source, SourceKind};
use memprobe_interpose_reader::{Counter, Mark, Region};

/// How to get the interposer loaded, for the errors below.
pub(crate) const HOW_TO_LOAD: &str =
    "run the program under `memprobe run --gpu-exact -- CMD`, or start it \
     with LD_PRELOAD=/path/to/libmemprobe_interpose.so";

/// An exact source of this process's memory on CUDA device `device` (the
/// ordinal as this process sees it), named `gpu_exact:<device>`, kind
/// [`SourceKind::GpuExact`], fidelity exact.
///
/// # Errors
/// [`ErrorKind::InvalidId`] for a device beyond the interposer's range
/// (0..64); [`ErrorKind::Unavailable`] when the interposer is not loaded in
/// this process or its counting is switched off (`MEMPROBE_GPU_EXACT=off`),
/// or when all its mark slots are held.
pub fn gpu_exact_source(device: u32) -> Result<Source> {
    if Counter::Device(device).index().is_none() {
        return Err(Error::new(
            ErrorKind::InvalidId,
            format!(
                "GPU device {device}: the interposer counts devices 0..{}",
                memprobe_interpose_reader::layout::MAX_DEVICES
            ),
        ));
    }
    exact_source(Counter::Device(device), &format!("gpu_exact:{device}"))
}

/// An exact source of this process's pinned (page-locked) host memory as the
/// interposer counts it (`cuMemHostAlloc`, `cuMemAllocHost`,
/// `cuMemHostRegister`), named `gpu_exact:host_pinned`, kind
/// [`SourceKind::GpuExact`].
///
/// # Errors
/// As [`gpu_exact_source`], [`ErrorKind::Unavailable`].
pub fn gpu_exact_host_pinned_source() -> Result<Source> {
    exact_source(Counter::HostPinned, "gpu_exact:host_pinned")
}

fn exact_source(counter: Counter, name: &str) -> Result<Source> {
    let mark = claim()?;
    Source::mark(
        name,
        SourceKind::GpuExact,
        Box::new(InterposerMark {
            mark: Some(mark),
            counter,
            generation: fork::generation(),
        }),
    )
}

/// A mark of this process's own in its region.
fn claim() -> Result<Mark> {
    let region = Region::in_process().map_err(|e| unavailable(&e))?;
    region.mark().map_err(|e| unavailable(&e))
}

pub(crate) fn unavailable(e: &memprobe_interpose_reader::Error) -> Error {
    match e {
        memprobe_interpose_reader::Error::NotLoaded
        | memprobe_interpose_reader::Error::Disabled => {
            Error::unavailable(format!("exact GPU counts: {e}; {HOW_TO_LOAD}"))
        }
        _ => Error::unavailable(format!("exact GPU counts: {e}")),
    }
}

/// One reader's mark on one counter, as the core's [`Marks`].
///
/// Across `fork` the child inherits the mark, which names the parent's
/// slot in the parent's region (a shared mapping): reading it would give
/// the child the parent's peaks, and a boundary's reset would restart the
/// parent's. In a forked child the mark is set aside untouched (never
/// released: the slot is the parent's) and a mark of the child's own is
/// claimed in the child's region, where its own allocations are counted.
struct InterposerMark {
    /// `None` while a forked child has not got a mark of its own yet.
    mark: Option<Mark>,
    counter: Counter,
    /// The fork generation the mark belongs to.
    generation: u64,
}

impl InterposerMark {
    /// This process's mark, claimed anew in a forked child.
    fn mark(&mut self) -> Result<&Mark> {
        let now = fork::generation();
        // memprobe's fork handler bumps the generation in the child (it is
        // registered before any source exists): no system call per read.
        if now != self.generation || self.mark.is_none() {
            // Dropping the parent's copy leaves its slot held (Mark's drop
            // releases only in the process that claimed it).
            self.mark = None;
            let own = claim().map_err(|e| {
                Error::new(
                    e.kind(),
                    format!(
                        "a forked child cannot get a GPU counter mark of its own: {}",
                        e.message()
                    ),
                )
            })?;
            self.mark = Some(own);
            self.generation = now;
        }
        self.mark
            .as_ref()
            .ok_or_else(|| Error::unavailable("exact GPU counts: no mark held"))
    }
}

impl Marks for InterposerMark {
    fn current(&mut self, _index: usize) -> Result<u64> {
        let counter = self.counter;
        Ok(self.mark()?.region().current(counter))
    }

    fn peak(&mut self, _index: usize) -> Result<u64> {
        let counter = self.counter;
        Ok(self.mark()?.peak(counter))
    }

    fn reset(&mut self) -> Result<()> {
        // Restarts the mark from the bytes held now, in one atomic swap.
        let counter = self.counter;
        self.mark()?.take(counter);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_interposer_the_error_says_how_to_load_it() {
        // The unit-test binary never has the interposer preloaded.
        let e = gpu_exact_source(0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.message().contains("--gpu-exact"), "{e}");
        assert!(e.message().contains("LD_PRELOAD"), "{e}");
        let e = gpu_exact_host_pinned_source().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn a_device_beyond_the_range_is_an_invalid_id() {
        let e = gpu_exact_source(64).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidId);
        assert!(e.message().contains("64"), "{e}");
        assert_eq!(
            gpu_exact_source(u32::MAX).unwrap_err().kind(),
            ErrorKind::InvalidId
        );
    }
}
