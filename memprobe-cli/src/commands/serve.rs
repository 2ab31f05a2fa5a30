//! `memprobe serve`: a per-node Prometheus exporter (host RAM, the
//! container's cgroup, every GPU and its processes) until SIGINT, SIGTERM
//! or SIGHUP; and the exporter `run --serve` starts for a job's tree.

use crate::args::ServeArgs;
use crate::exit;
use crate::signals::{self, SigSet};
use memprobe_core::ProcessTreeSampler;
use memprobe_core::{Error, Source};
use memprobe_gpu::Gpus;
use memprobe_metrics::{Exporter, ExporterOptions, WebConfigEvent, WebConfigHook};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

fn start(listen: SocketAddr) -> Result<Exporter, Error> {
    start_with(listen, None)
}

/// Says on stderr what became of each re-read of the web configuration.
fn say_reloads() -> WebConfigHook {
    WebConfigHook(Arc::new(|event: &WebConfigEvent| match event {
        WebConfigEvent::Reloaded { path } => {
            crate::say::say!("memprobe: web config {}: reloaded", path.display());
        }
        WebConfigEvent::Refused { error, .. } => {
            crate::say::say!(
                "memprobe: web config refused, the last good one stays in force: {}",
                error.message()
            );
        }
    }))
}

fn start_with(listen: SocketAddr, web_config: Option<PathBuf>) -> Result<Exporter, Error> {
    let on_web_config = web_config.as_ref().map(|_| say_reloads());
    Exporter::start(ExporterOptions {
        listen: Some(listen),
        web_config,
        on_web_config,
        ..ExporterOptions::default()
    })
}

/// The container's cgroup (its use and OOM kills) and every GPU with its processes.
fn add_machine(e: &Exporter) -> Result<(), Error> {
    if let Ok(cgroup) = Source::cgroup() {
        e.add_source(&cgroup)?;
    }
    if let Ok(location) = memprobe_core::internal::cgroup::discover() {
        e.set_oom_kills(Some(location))?;
    }
    e.set_gpus(Some(Gpus::shared()), true)
}

/// The exporter of `run --serve`: the tree rooted at `pid`, the container, the GPUs.
pub(crate) fn start_for_tree(listen: SocketAddr, pid: u32) -> Result<Exporter, Error> {
    let e = start(listen)?;
    let tree = Source::from_sampler(Box::new(ProcessTreeSampler::at(pid)?));
    e.add_source(&tree)?;
    add_machine(&e)?;
    crate::say::say!("memprobe: serving http://{}/metrics", e.local_addr());
    Ok(e)
}

pub(crate) fn main(args: ServeArgs) -> i32 {
    let set = SigSet::of(&signals::STOPPING);
    if let Err(e) = set.block() {
        crate::say::say!("memprobe: cannot block signals: {e}");
        return exit::FAILURE;
    }
    if !args.listen.ip().is_loopback() && args.web_config_file.is_none() {
        crate::say::say!(
            "memprobe: warning: serving {} beyond this machine without --web.config.file: \
             anyone who reaches the port reads process ids and memory figures (no TLS, no password)",
            args.listen
        );
    }
    let mut e = match start_with(args.listen, args.web_config_file) {
        Ok(e) => e,
        Err(err) => {
            crate::say::say!("memprobe: {}", err.message());
            return exit::FAILURE;
        }
    };
    let added = Source::system_ram().and_then(|ram| e.add_source(&ram));
    // Every process counted by the interposer on this machine: its GPU
    // memory by origin (MEMPROBE_GPU_EXACT_DIR, or the default directory
    // and every `memprobe run --gpu-exact`'s).
    let origins = memprobe_metrics::OriginsScope::AllRegions;
    let added = added.and_then(|()| e.set_gpu_origins(origins));
    if let Err(err) = added.and_then(|()| add_machine(&e)) {
        crate::say::say!("memprobe: warning: {}", err.message());
    }
    crate::say::say!(
        "memprobe: serving {}://{}/metrics",
        e.scheme(),
        e.local_addr()
    );
    while signals::wait(&set, None).is_none() {}
    let _ = e.stop();
    0
}
