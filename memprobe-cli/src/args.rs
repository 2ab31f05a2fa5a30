//! The command line, as clap parses it.

use crate::interval::parse_interval;
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// memprobe: measure the memory of a training run (its process tree, the
/// container, the GPUs) with exact peaks.
#[derive(Debug, Parser)]
#[command(name = "memprobe", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command and record the memory of its process tree, the
    /// container and the GPUs; print a summary on stderr.
    ///
    /// memprobe passes the command's exit status through (128+N when a
    /// signal N killed it) and forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT,
    /// SIGUSR1 and SIGUSR2 sent to it. Exit statuses of its own: 127 command
    /// not found, 126 not executable, 2 bad options or unwritable output
    /// (before the command starts), 1 memprobe failed.
    Run(RunArgs),
    /// One reading of system RAM, the container's cgroup and the GPUs.
    Status(StatusArgs),
    /// A refreshing view of the host, the container, the GPUs and the
    /// processes using the most memory (Ctrl-C to quit). When stdout is not
    /// a terminal, one block is printed per interval instead.
    Watch(WatchArgs),
    /// The GPUs with their memory and processes. Exit status 1 when no GPU
    /// can be read (with --json the document still says why).
    Gpus(GpusArgs),
    /// A per-node Prometheus exporter: serves GET /metrics with the host's
    /// RAM, the container's cgroup, every GPU (DCGM-compatible gauges) and
    /// the processes on them, until SIGINT or SIGTERM. See docs/metrics.md.
    Serve(ServeArgs),
}

/// Options of `memprobe serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on, IP:PORT. Loopback by default; give
    /// 0.0.0.0:PORT to be scraped from other machines.
    #[arg(long, default_value = "127.0.0.1:9477", value_name = "ADDR")]
    pub(crate) listen: SocketAddr,
    /// TLS and basic auth from a web configuration file in Prometheus
    /// exporter-toolkit's format (node_exporter's --web.config.file);
    /// re-read when it changes. See docs/metrics.md.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub(crate) web_config_file: Option<PathBuf>,
}

/// Options of `memprobe run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Sampling interval, 100us ..= 60s, with a unit (e.g. 10ms, 1s, 500us).
    #[arg(
        long,
        short = 'i',
        default_value = "10ms",
        value_parser = parse_interval,
        value_name = "DURATION"
    )]
    pub(crate) interval: Duration,
    /// Keep memprobe's own CPU under PCT percent of one core (e.g. 1%):
    /// the sampling interval widens while it would cost more, and narrows
    /// back, never below --interval. The summary and the JSON's cpu_cap
    /// say how far it widened.
    #[arg(
        long,
        value_parser = crate::commands::run::cpu_cap::parse_max_cpu,
        value_name = "PCT"
    )]
    pub(crate) max_cpu: Option<f64>,
    /// Write the summary and the timeline as JSON to FILE
    /// (schema: docs/run-output.schema.json).
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Write the timeline as CSV to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) csv: Option<PathBuf>,
    /// Draw the timeline as an SVG chart to FILE (its name must end in
    /// .svg: no other format is drawn).
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// Write the report as one self-contained HTML page to FILE: the
    /// timeline zoomable down to single samples, the phases with their
    /// exact peaks on hover, processes to toggle, the container and each
    /// GPU in panels of their own. Nothing is fetched: it opens offline.
    #[arg(long, value_name = "FILE")]
    pub(crate) html: Option<PathBuf>,
    /// Do not draw the live status line (drawn only when stderr is a
    /// terminal, on its last row).
    #[arg(long)]
    pub(crate) no_live: bool,
    /// While the command runs, serve GET /metrics on ADDR (IP:PORT) in the
    /// Prometheus text format: its process tree, the container and the GPUs.
    #[arg(long, value_name = "ADDR")]
    pub(crate) serve: Option<SocketAddr>,
    /// Show the whole reason why a source (the GPUs, the container) could
    /// not be measured, instead of its first words.
    #[arg(long, short = 'v')]
    pub(crate) verbose: bool,
    /// Count the GPU memory of every process of the command exactly, at
    /// each allocation and free, with the driver-API interposer
    /// (libmemprobe_interpose.so, preloaded into the whole tree): exact
    /// per-process and tree peaks per device, however short the spike.
    /// Exit status 2, before the command starts, if the interposer is not
    /// found. `--gpu-exact=stacks[:N]` also keeps the call paths (N frames,
    /// default 8, at most 32) that held each process's peak: the summary
    /// shows the largest under its origins.
    #[arg(
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "on",
        value_name = "stacks[:N]",
        value_parser = gpu_exact_mode
    )]
    pub(crate) gpu_exact: Option<GpuExactMode>,
    /// Also sample the tree's PSS and USS (each process's smaps_rollup,
    /// summed): pages the command's workers share with it copy-on-write
    /// count once, where the summed RSS counts them in every process. The
    /// summary shows them beside the summed RSS. Costly: the kernel walks
    /// every mapping of every process at each read, milliseconds per read
    /// for processes of several GiB; raise --interval for big trees.
    #[arg(long)]
    pub(crate) pss: bool,
    /// Do not keep each peak's memory by kind (anon, file, shmem, and the
    /// largest mappings near each process's and the tree's RAM peak).
    #[arg(long)]
    pub(crate) no_host_kinds: bool,
    /// The command to run and its arguments; put them after `--` when an
    /// argument could be taken for one of memprobe's options.
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// Options of `memprobe status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print JSON (schema: docs/status-output.schema.json) instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Show the whole reason why a source (the GPUs, the container) could
    /// not be measured, instead of its first words.
    #[arg(long, short = 'v')]
    pub(crate) verbose: bool,
}

/// Options of `memprobe watch`.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// Refresh interval, 100us ..= 60s, with a unit (e.g. 500ms, 2s).
    #[arg(
        long,
        short = 'i',
        default_value = "1s",
        value_parser = parse_interval,
        value_name = "DURATION"
    )]
    pub(crate) interval: Duration,
    /// Show the whole reason why a source (the GPUs, the container) could
    /// not be measured, instead of its first words.
    #[arg(long, short = 'v')]
    pub(crate) verbose: bool,
}

/// Options of `memprobe gpus`.
#[derive(Debug, Args)]
pub(crate) struct GpusArgs {
    /// Print JSON (schema: docs/gpus-output.schema.json) instead of a
    /// table; with no GPU readable it lists no devices and says why.
    #[arg(long)]
    pub(crate) json: bool,
}

/// What `--gpu-exact` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuExactMode {
    /// Frames of the call paths kept (`stacks[:N]`); `None`: origins only.
    pub(crate) stacks: Option<usize>,
}

fn gpu_exact_mode(v: &str) -> Result<GpuExactMode, String> {
    crate::commands::run::gpu_stacks::parse_mode(v).map(|stacks| GpuExactMode { stacks })
}
