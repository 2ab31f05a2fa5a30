//! Exact GPU memory counters kept by memprobe's CUDA driver-API interposer
//! (`libmemprobe_interpose.so`, loaded with `LD_PRELOAD`), and their reader.
//!
//! The interposer counts device memory at every allocation and free the
//! driver API sees, per device, plus pinned host memory, in a region of
//! shared memory per process ([`layout`]). This crate reads it: in the same
//! process ([`Region::in_process`]) or in another one ([`Region::open`]),
//! with high-water marks that belong to one reader each ([`Mark`]: claiming,
//! resetting or dropping one never disturbs another reader's), and finds and
//! reclaims the regions of processes that ended ([`processes`],
//! [`reclaim_dead`]). A run's directory may also hold a counter of the whole
//! process tree, the exact peak of the processes' sum ([`tree_counter`]). An
//! allocation that fails with out-of-memory can be reported, as it happens,
//! to a hook registered in the process ([`oom_report_hook`]). Every counted
//! byte is named by its origin, the library that asked for it, with the
//! breakdown at each counter's peak kept ([`origins`]).
//!
//! ```no_run
//! use memprobe_interpose_reader::{Counter, Region};
//! let region = Region::open(4242)?;          // a process run with LD_PRELOAD
//! let mark = region.mark()?;                 // this reader's own peaks
//! // ... a training step runs in process 4242 ...
//! let step_peak = mark.take(Counter::Device(0)); // peak of the step, reset
//! println!("now {} B, step peak {step_peak} B", region.current(Counter::Device(0)));
//! # Ok::<(), memprobe_interpose_reader::Error>(())
//! ```

pub mod layout;
pub mod liveness;
pub mod oom_report_hook;
pub mod origin_names;
pub mod origins;
mod reader;
mod reclaim;
mod region_dirs;
mod seqlock;
mod slot_claim;
pub mod stacks;
pub mod tree_counter;

pub use reader::{
    default_dir, processes, region_path, Counter, Entry, Error, Mark, NotCounted, Oom, Reading,
    Region, DIR_ENV, REGION_SYMBOL, SWITCH_ENV,
};
pub use reclaim::reclaim_dead;
pub use region_dirs::{all_region_dirs, run_dir_name};
