//! memprobe-core: the model of memprobe — exact memory peaks of a program
//! and of the phases of its training loop. Every item of the user API is
//! here, at the crate's root:
//!
//! - a [`Source`] reads one quantity through a [`Sampler`] (this process,
//!   [`Source::process`]; its process tree; system RAM; the container's
//!   cgroup; PSS/USS; a caller's function or marks, [`MarkGroup`]; GPU
//!   samplers live in memprobe-gpu) and keeps the peak of every window open
//!   over it;
//! - a [`Window`] is a concurrent, nestable, independently resettable peak
//!   interval: exact with no polling over a resettable high-water mark (the
//!   kernel's, or a caller's), polled by the [`monitor`] otherwise;
//! - a [`Trace`] is fastai's GPUMemTrace over any sources ([`SourceDelta`]:
//!   its delta used and delta peaked);
//! - a [`Tracker`] keeps the phases of a training loop ([`PhaseKind`]) as
//!   nested windows and makes a [`Record`] for each ended phase, given to
//!   its [`Sink`]s ([`TableSink`], [`JsonlSink`], [`CsvSink`]) and its
//!   [`PhaseObserver`]s; it releases caches by [`ReleasePolicy`], follows
//!   leak trends ([`LeakPolicy`]), retries a step that ran out of memory
//!   ([`Tracker::run_with_oom_retry`]), writes an [`oom_report`] when
//!   memory runs out, and sends its phases to `memprobe run`
//!   ([`RunChannel`]).
//!
//! Every quantity is in bytes. Fields a source cannot supply are `None`.
//! Errors are [`Error`]s with an [`ErrorKind`].
//!
//! ```
//! use memprobe_core::{PhaseKind, Source, Tracker, Window};
//!
//! # fn main() -> memprobe_core::Result<()> {
//! // This process's resident set, its peak exact (the kernel's high-water mark).
//! let rss = Source::process()?;
//!
//! // A window: the peak between two moments.
//! let window = Window::open(&[rss.clone()])?;
//! let buf = vec![1u8; 8 << 20];
//! let delta = window.close()?;
//! assert!(delta[0].peak >= delta[0].used_start);
//! drop(buf);
//!
//! // A tracker: one record per ended phase.
//! let mut tracker = Tracker::new(&[rss])?;
//! tracker.begin(PhaseKind::Epoch, None)?;
//! for _ in 0..3 {
//!     tracker.begin(PhaseKind::Step, None)?;
//!     tracker.end(PhaseKind::Step, None)?;
//! }
//! let epoch = tracker.end(PhaseKind::Epoch, None)?;
//! assert_eq!(epoch.sources.len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! What memprobe's other crates share with this one and users do not call
//! (its lock, the run channel's wire format, `/proc` readers) is in
//! `internal`, hidden from these docs and free to change in any release.

mod callback;
mod cgroup;
mod cohorts;
mod delta;
mod error;
mod fd_write;
mod fork;
#[doc(hidden)]
pub mod internal;
mod kernel_hwm;
mod leak;
mod leak_trends;
mod lock;
mod mark;
pub mod monitor;
mod observer;
pub mod oom_report;
mod oom_retry;
mod phase;
mod process;
mod process_tree;
mod procfs;
mod record;
mod release;
mod run_channel;
mod sample;
mod sampler;
mod sink;
mod sinks;
mod smaps;
mod source;
mod system;
mod trace;
mod tracker;
mod tree_smaps;
mod units;
mod window;

pub use callback::{CallbackSampler, ReadFn};
pub use cgroup::{CgroupLocation, CgroupOptions, CgroupSampler, CgroupVersion};
pub use delta::{b2mb, b2mb_signed, deltas, SourceDelta};
pub use error::{Error, ErrorKind, Result};
pub use kernel_hwm::{peak_error_bound, PeakErrorBound};
pub use leak::{LeakPolicy, LeakStatus};
pub use mark::{MarkGroup, MarkValue, Marks};
pub use observer::{PhaseBegun, PhaseObserver};
pub use oom_report::{OomReportOptions, OomStatus, OutOfMemoryReport};
#[allow(deprecated)]
pub use oom_retry::OomReport;
pub use oom_retry::{OomRetryResult, StepOutcome};
pub use phase::{PhaseInfo, PhaseKind};
pub use process::{HwmMode, ProcessSampler};
pub use process_tree::ProcessTreeSampler;
pub use record::Record;
pub use release::{ReleaseEvent, ReleaseFn, ReleaseKind, ReleasePolicy, ReleaseReason};
pub use run_channel::{Ranks, RunChannel};
pub use sample::{monotonic_ns, PeakFidelity, Sample, SourceInfo, SourceKind};
pub use sampler::Sampler;
pub use sink::{NoopSink, Sink, SnapshotSink};
pub use sinks::{CsvSink, JsonlSink, TableSink, CSV_HEADER};
pub use smaps::{SmapsMetric, SmapsSampler};
pub use source::{Source, PRESERVE_VMHWM_ENV};
pub use system::SystemRamSampler;
pub use trace::{Trace, TraceGuard, TraceOptions};
pub use tracker::Tracker;
pub use tree_smaps::TreeSmapsSampler;
pub use window::Window;
