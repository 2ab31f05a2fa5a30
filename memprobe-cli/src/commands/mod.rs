//! One module per subcommand; each `main` returns the exit status. `run`
//! is a folder: what only it uses lives there.

pub(crate) mod gpus;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod watch;

use crate::exit;
use serde::Serialize;
use std::io::Write;

/// The version of the JSON layout of every command (`run`'s document,
/// `status`, `gpus`); bumped on any incompatible change.
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// Prints a reading on stdout, as pretty JSON when `json` or else as the
/// text `table` makes; returns 0, or [`exit::FAILURE`] when it cannot be
/// written (a closed pipe, as with `| head`, is not a failure).
pub(crate) fn print(json: bool, doc: &impl Serialize, table: impl FnOnce() -> String) -> i32 {
    let text = if json {
        match serde_json::to_string_pretty(doc) {
            Ok(s) => s + "\n",
            Err(e) => {
                crate::say::say!("memprobe: cannot encode JSON: {e}");
                return exit::FAILURE;
            }
        }
    } else {
        table()
    };
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            crate::say::say!("memprobe: writing to stdout: {e}");
            exit::FAILURE
        }
    }
}
