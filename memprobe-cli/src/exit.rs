//! memprobe's own exit statuses (the child's are passed through by `run`).

/// memprobe itself failed after starting its work (a thread could not be
/// started, an output could not be written after the child succeeded, a
/// reading failed).
pub(crate) const FAILURE: i32 = 1;
/// The command line is wrong (clap's usage errors, a bad `--interval`) or an
/// output file cannot be created; `run` reports this before starting the
/// child.
pub(crate) const USAGE: i32 = 2;
