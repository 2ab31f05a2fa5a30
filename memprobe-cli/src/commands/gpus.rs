//! `memprobe gpus`: every GPU with its memory and processes.

use crate::args::GpusArgs;
use crate::exit;
use crate::gpu::{self, GpuReading};
use crate::proc_status;
use crate::snapshot::render_rows;
use crate::units;
use std::io::Write;

pub(crate) fn main(args: GpusArgs) -> i32 {
    let gpus = match gpu::read_gpus() {
        Ok(g) => g,
        Err(why) => {
            eprintln!("memprobe: {why}");
            return exit::FAILURE;
        }
    };
    let text = if args.json {
        match serde_json::to_string_pretty(&gpus) {
            Ok(s) => s + "\n",
            Err(e) => {
                eprintln!("memprobe: cannot encode JSON: {e}");
                return exit::FAILURE;
            }
        }
    } else {
        table(&gpus)
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

/// Devices, then each device's processes.
pub(crate) fn table(gpus: &[GpuReading]) -> String {
    if gpus.is_empty() {
        return "no GPUs\n".into();
    }
    let mut rows = vec![[
        "GPU".to_string(),
        "NAME".into(),
        "USED".into(),
        "TOTAL".into(),
        "FREE".into(),
        "RESERVED".into(),
        "UUID".into(),
    ]];
    for g in gpus {
        rows.push([
            g.index.to_string(),
            g.name.clone(),
            units::bytes(g.used_bytes),
            units::bytes(g.total_bytes),
            units::bytes(g.free_bytes),
            units::opt_bytes(g.reserved_bytes),
            g.uuid.clone(),
        ]);
    }
    let mut out = render_rows(&rows);
    let mut procs = vec![[
        "GPU".to_string(),
        "PID".into(),
        "NAME".into(),
        "USED".into(),
    ]];
    for g in gpus {
        for p in &g.processes {
            procs.push([
                g.index.to_string(),
                p.pid.to_string(),
                proc_status::comm(p.pid).unwrap_or_else(|| "?".into()),
                units::opt_bytes(p.used_bytes),
            ]);
        }
    }
    out.push('\n');
    if procs.len() > 1 {
        out.push_str(&render_rows(&procs));
    } else {
        out.push_str("no GPU processes\n");
    }
    out
}
