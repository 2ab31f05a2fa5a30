//! `memprobe status`: one reading, as a table or JSON.

use crate::args::StatusArgs;
use crate::exit;
use crate::snapshot::{self, Probes};
use std::io::Write;

pub(crate) fn main(args: StatusArgs) -> i32 {
    let reading = Probes::open().read();
    let text = if args.json {
        match serde_json::to_string_pretty(&reading) {
            Ok(s) => s + "\n",
            Err(e) => {
                eprintln!("memprobe: cannot encode JSON: {e}");
                return exit::FAILURE;
            }
        }
    } else {
        snapshot::table(&reading)
    };
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("memprobe: writing to stdout: {e}");
            exit::FAILURE
        }
    }
}
