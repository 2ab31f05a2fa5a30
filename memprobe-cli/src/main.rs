//! The `memprobe` command: `run` a program and record the memory of its
//! process tree (exact per-process peaks), the container and the GPUs;
//! `status`, `watch` and `gpus` read the machine; `serve` exports it to
//! Prometheus. See docs/cli.md.

mod args;
mod columns;
mod commands;
mod exit;
mod gpu_process_origins;
mod gpu_readings;
mod interval;
mod machine;
mod say;
mod signals;
mod terminal;
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
