//! `memprobe serve`: a per-node Prometheus exporter (host RAM, the
//! container's cgroup, every GPU and its processes) until SIGINT, SIGTERM
//! or SIGHUP; and the exporter `run --serve` starts for a job's tree.

use crate::args::ServeArgs;
use crate::exit;
use crate::signals::{self, SigSet};
use memprobe_core::ProcessTreeSampler;
use memprobe_core::{Error, Source};
use memprobe_gpu::Gpus;
use memprobe_metrics::{Exporter, ExporterOptions};
use std::net::SocketAddr;

fn start(listen: SocketAddr) -> Result<Exporter, Error> {
    Exporter::start(ExporterOptions {
        listen: Some(listen),
        ..ExporterOptions::default()
    })
}

/// The container's cgroup and every GPU with its processes.
fn add_machine(e: &Exporter) -> Result<(), Error> {
    if let Ok(cgroup) = Source::cgroup() {
        e.add_source(&cgroup)?;
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
    let mut e = match start(args.listen) {
        Ok(e) => e,
        Err(err) => {
            crate::say::say!("memprobe: {}", err.message());
            return exit::FAILURE;
        }
    };
    let added = Source::system_ram().and_then(|ram| e.add_source(&ram));
    if let Err(err) = added.and_then(|()| add_machine(&e)) {
        crate::say::say!("memprobe: warning: {}", err.message());
    }
    crate::say::say!("memprobe: serving http://{}/metrics", e.local_addr());
    while signals::wait(&set, None).is_none() {}
    let _ = e.stop();
    0
}
