//! What memprobe's own crates (memprobe-gpu, -metrics, -ffi-impl, -cli,
//! the interposer, the cross-language tests) share with the core and users
//! do not call: the one lock type, the fork gate, writing to a caller's
//! descriptor, the run channel's wire format, the `/proc` and cgroup
//! readers the `memprobe` command uses, the atomic file writer, the text of
//! numbers for people. Hidden from the docs, outside the semver promise:
//! any release may change it (docs/architecture.md, "The core's front
//! door").
//!
//! Each module here re-exports one private module of the crate whole, under
//! its own name; the user API's items are also at the crate's root, and
//! code outside the core imports them from there.

/// The one mutex type of what a host's fork can interrupt (`lock.rs`).
pub mod lock {
    pub use crate::lock::*;
}

/// The fork gate and the fork generation (`fork.rs`).
pub mod fork {
    pub use crate::fork::*;
}

/// Writing to a descriptor memprobe does not own without `SIGPIPE`.
pub mod fd_write {
    pub use crate::fd_write::*;
}

/// The run channel: its variable, limits, wire format (`protocol`, both
/// ends) and ranks.
pub mod run_channel {
    pub use crate::run_channel::*;
}

/// Numbers for people, the one text of each (the `memprobe` command's too).
pub mod units {
    pub use crate::units::*;
}

/// The container's cgroup: discovery and its OOM event counters.
pub mod cgroup {
    pub use crate::cgroup::*;
}

/// Processes by pid: `/proc/<pid>/status`, their names, how they ended.
pub mod process {
    pub use crate::process::*;
    pub use crate::procfs::ProcessStatus;
}

/// The one process-tree walker.
pub mod process_tree {
    pub use crate::process_tree::*;
}

/// `smaps_rollup`, of one process and of a tree.
pub mod smaps {
    pub use crate::smaps::*;
    pub use crate::tree_smaps::*;
}

/// The sinks' file writer: the one atomic file writer of the workspace.
pub mod sinks {
    pub use crate::sinks::AtomicFile;
}

/// The supertrait that lets a tracker find its observers by type.
pub use crate::observer::AsAny;
