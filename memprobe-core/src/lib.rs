//! memprobe-core: the model of memprobe.
//!
//! Samplers read sources (this process, its process tree, system RAM, the
//! container's cgroup, custom sources); [`Source`] wraps a sampler and keeps
//! its peak windows; [`Window`]s are concurrent, nestable, independently
//! resettable peak intervals; [`Trace`] is fastai's GPUMemTrace over any
//! sources; the [`monitor`] polls sampled sources in the background.
//!
//! Every quantity is in bytes. Fields a source cannot supply are `None`.

pub mod error;
pub mod fork;
mod lock;
mod procfs;
pub mod sample;
pub mod sampler;

pub use error::{Error, ErrorKind, Result};
pub use sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
pub use sampler::Sampler;
