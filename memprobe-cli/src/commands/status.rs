//! `memprobe status`: one reading, as a table or JSON.

use crate::args::StatusArgs;
use crate::machine::{self, Probes};

pub(crate) fn main(args: StatusArgs) -> i32 {
    let reading = Probes::open().read();
    super::print(args.json, &reading, || {
        machine::table(&reading, args.verbose)
    })
}
