//! Out-of-memory forensics: when an allocation fails for lack of memory, one
//! report of what the training loop was doing, so that "why did my job die at
//! epoch 3 of 40?" has an answer.
//!
//! A [`Tracker`](crate::Tracker) configured with [`OomReportOptions`] keeps
//! a bounded ring of its last ended phases. A *trigger* — the GPU driver
//! failing an allocation (seen by memprobe's interposer, wired up by
//! memprobe-gpu), or the caller reporting a framework's out-of-memory error
//! ([`Tracker::report_oom`](crate::Tracker::report_oom)) — builds an
//! [`OutOfMemoryReport`]: the failed allocation, the open phases with each source's
//! peak so far, the last ended phases, each GPU's per-process use and what
//! releasing caches would free (asked of an [`OomGpuProvider`] supplied from
//! above: the core has no GPU code). It is rendered as JSON
//! ([`OutOfMemoryReport::to_json`], schema `docs/oom-report.schema.json`) and as a
//! summary for people ([`OutOfMemoryReport::summary`]), and written to the chosen
//! destinations: a file (written whole, then renamed into place), a writer
//! for each rendering, a callback.
//!
//! **One report per arming.** The first trigger writes the report and
//! disarms; later triggers (a framework retrying a failed allocation a
//! thousand times) are only counted, with the last of them kept. When they
//! happened, the report file is written once more — with their count and
//! the last one — when the report is re-armed ([`OomReporter::rearm`]),
//! removed, or its tracker dropped; the other destinations receive the
//! first report only.
//!
//! Every figure that is not known is `null` in the JSON and "unknown" in
//! the summary, with the reason where there is one; never a 0 standing in.
//!
//! One file per concern: `model.rs` (the report), `arming.rs` (options and
//! the reporter's state machine), `destinations.rs` (where a report goes,
//! the caller's callback), `json.rs` and `summary.rs` (its two renderings,
//! each with its method of the report), `live_blocks.rs` (a framework's
//! table of what was live, checked and embedded).

mod arming;
mod destinations;
mod json;
mod live_blocks;
mod model;
mod summary;
#[cfg(test)]
mod tests;

pub(crate) use arming::{configure, report};
pub use arming::{OomOutcome, OomReportOptions, OomReporter, OomStatus};
pub use destinations::OomCallback;
pub use live_blocks::{
    Fragmentation, LiveBlock, LiveBlocks, LIVE_BLOCKS_SCHEMA, MAX_LIVE_BLOCKS_BYTES, TOP_BLOCKS,
};
pub use model::{
    CacheFigures, CacheLine, FailedAllocation, OomDriverCount, OomDriverCounts, OomGpuDevice,
    OomGpuMemory, OomGpuProcess, OomGpuProvider, OomHeldBasis, OomHeldByOrigin, OomLocation,
    OomOriginBytes, OomProcessList, OomStackBytes, OomTrigger, OomTriggers, OpenPhase, OpenSource,
    OutOfMemoryReport,
};

/// Ended phases kept for a report unless told otherwise.
pub const DEFAULT_KEEP_ENDED: usize = 8;

/// The most ended phases a report keeps.
pub const MAX_KEEP_ENDED: usize = 4096;

/// The `format` of the JSON document.
pub const FORMAT: &str = "memprobe-oom-report";

/// The `version` of the JSON document (bumped when a field changes meaning
/// or goes away; new fields may appear without a bump).
pub const FORMAT_VERSION: u32 = 1;

/// `CLOCK_REALTIME` in nanoseconds since the Unix epoch (0 before it).
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, crate::sample::duration_ns)
}
