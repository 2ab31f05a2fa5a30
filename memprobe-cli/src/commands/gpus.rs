//! `memprobe gpus`: every GPU with its memory and processes.
//!
//! With no GPU readable, the table form prints the reason on stderr; the
//! JSON form prints its document all the same (no devices, the reason in
//! `unavailable.gpus`). Either way the status is [`NO_GPU`].

use crate::args::GpusArgs;
use crate::commands::SCHEMA_VERSION;
use crate::exit;
use crate::gpu_readings::{self, GpuReading};
use crate::units;
use serde::Serialize;
use std::collections::BTreeMap;

/// The exit status when no GPU can be read.
pub(crate) const NO_GPU: i32 = exit::FAILURE;

/// The JSON document of `gpus` (schema: `docs/gpus-output.schema.json`).
#[derive(Debug, Serialize)]
struct GpusReport {
    schema_version: u32,
    kind: &'static str,
    memprobe_version: &'static str,
    taken_at_unix_s: f64,
    gpus: Vec<GpuReading>,
    /// `gpus` → why none could be read.
    unavailable: BTreeMap<String, String>,
}

pub(crate) fn main(args: GpusArgs) -> i32 {
    let taken_at_unix_s = units::unix_now_s();
    let (gpus, unavailable) = match gpu_readings::read_gpus() {
        Ok(mut g) => {
            gpu_readings::name_origins(&mut g);
            (g, BTreeMap::new())
        }
        Err(why) if args.json => (Vec::new(), BTreeMap::from([("gpus".to_string(), why)])),
        Err(why) => {
            crate::say::say!("memprobe: {why}");
            return NO_GPU;
        }
    };
    let none = !unavailable.is_empty();
    let doc = GpusReport {
        schema_version: SCHEMA_VERSION,
        kind: "gpus",
        memprobe_version: env!("CARGO_PKG_VERSION"),
        taken_at_unix_s,
        gpus,
        unavailable,
    };
    match super::print(args.json, &doc, || gpu_readings::table(&doc.gpus)) {
        0 if none => NO_GPU,
        status => status,
    }
}
