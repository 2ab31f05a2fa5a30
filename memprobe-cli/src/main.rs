//! The `memprobe` command: `run` a program and record the memory of its
//! process tree (exact per-process peaks), the container and the GPUs;
//! `status`, `watch` and `gpus` read the machine; `serve` exports it to
//! Prometheus. See docs/cli.md.

mod args;
mod child;
mod columns;
mod commands;
mod exit;
mod gpu_exact;
mod gpu_readings;
mod interval;
mod kernel_log;
mod live;
mod machine;
mod oom_kill;
mod orphans;
mod phase_channel;
mod phase_log;
mod phase_report;
mod plot;
mod process_events;
mod process_lines;
mod recording;
mod report;
mod sampling;
mod say;
mod signals;
mod timeline;
mod timeline_csv;
mod tree_pss;
mod unavailable;
mod units;

#[cfg(test)]
#[path = "../tests/cli/schema.rs"]
mod schema_check;

use clap::Parser;

fn main() {
    let cli = match args::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to
            // stderr with status 2.
            let _ = e.print();
            std::process::exit(e.exit_code());
        }
    };
    let status = match cli.command {
        args::Command::Run(a) => commands::run::main(a),
        args::Command::Status(a) => commands::status::main(a),
        args::Command::Watch(a) => commands::watch::main(a),
        args::Command::Gpus(a) => commands::gpus::main(a),
        args::Command::Serve(a) => commands::serve::main(a),
    };
    std::process::exit(status);
}
