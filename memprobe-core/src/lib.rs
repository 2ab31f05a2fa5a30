//! memprobe-core: the model of memprobe.
//!
//! - [`Sampler`]s read one source each: this process ([`process`]), its
//!   process tree ([`process_tree`]), system RAM ([`system`]), the container's
//!   [`cgroup`], PSS/USS of this process ([`smaps`]) and of its tree
//!   ([`tree_smaps`]), custom [`callback`]s; GPU samplers live
//!   in memprobe-gpu.
//! - A [`Source`] wraps a sampler (or takes pushed values) and keeps the peak
//!   state of every window open over it.
//! - [`Window`]s are concurrent, nestable, independently resettable peak
//!   intervals; for sources over a resettable high-water mark — the
//!   kernel's, or a caller's ([`MarkGroup`]) — their peaks are exact with no
//!   polling.
//! - The [`monitor`] polls sampled sources in the background.
//! - [`Trace`] is fastai's GPUMemTrace over any sources; [`delta`] holds its
//!   definitions; [`sink`]s receive samples and records.
//! - A [`Tracker`]'s phases also reach `memprobe run` when it runs the
//!   program ([`run_channel`]).
//!
//! Every quantity is in bytes. Fields a source cannot supply are `None`.

pub mod callback;
pub mod cgroup;
mod cohorts;
pub mod delta;
pub mod error;
pub mod fd_write;
pub mod fork;
mod kernel_hwm;
pub mod leak;
pub mod lock;
mod mark;
pub mod monitor;
pub mod observer;
pub mod oom_report;
pub mod oom_retry;
pub mod phase;
pub mod process;
pub mod process_tree;
mod procfs;
pub mod release;
pub mod run_channel;
pub mod sample;
pub mod sampler;
pub mod sink;
pub mod sinks;
pub mod smaps;
pub mod source;
pub mod system;
pub mod trace;
pub mod tracker;
pub mod tree_smaps;

/// The old name of [`process_tree`], renamed so that "tree" names one
/// thing per crate (the interposer reader's GPU tree counter is
/// `tree_counter`).
#[deprecated(since = "0.2.0", note = "renamed process_tree; removed in 0.3.0")]
pub mod tree {
    pub use crate::process_tree::*;
}
pub mod units;
mod window;

pub use delta::{b2mb, deltas, SourceDelta};
pub use error::{Error, ErrorKind, Result};
pub use mark::{MarkGroup, MarkValue, Marks};
pub use observer::{PhaseBegun, PhaseObserver};
#[allow(deprecated)]
pub use oom_retry::OomReport;
pub use oom_retry::{OomRetryResult, StepOutcome};
pub use phase::{PhaseInfo, PhaseKind};
pub use run_channel::RunChannel;
pub use sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
pub use sampler::Sampler;
pub use sink::{NoopSink, Record, Sink, SnapshotSink};
pub use source::Source;
pub use trace::{Trace, TraceGuard, TraceOptions};
pub use tracker::Tracker;
pub use window::Window;
