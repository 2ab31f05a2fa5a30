//! A custom source read through a caller's function.

use crate::error::Result;
use crate::sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
use crate::sampler::Sampler;

/// The read function of a custom source: returns bytes in use now.
pub type ReadFn = Box<dyn FnMut() -> Result<u64> + Send>;

/// Reads a custom source by calling a function (polled by the monitor).
pub struct CallbackSampler {
    name: String,
    read: ReadFn,
}

impl CallbackSampler {
    /// A sampler named `name` (1 to 64 printable bytes) that calls `read`.
    pub fn new(name: &str, read: ReadFn) -> Result<Self> {
        crate::sample::check_name("a source name", name)?;
        Ok(CallbackSampler {
            name: name.to_owned(),
            read,
        })
    }
}

impl Sampler for CallbackSampler {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: self.name.clone(),
            kind: SourceKind::Custom,
            fidelity: PeakFidelity::Sampled,
        }
    }

    fn read(&mut self) -> Result<Sample> {
        let t0 = monotonic_ns();
        let used = (self.read)()?;
        Ok(Sample::timed(used, t0))
    }
}
