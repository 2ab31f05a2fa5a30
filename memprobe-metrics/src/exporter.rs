//! The exporter: what it serves, and its HTTP endpoint's life.

use crate::http::{Limits, Render, Server};
use crate::labels::{hostname, Rank};
use crate::origins::OriginsScope;
use crate::render::{render, Inputs};
use crate::snapshot::{MetricsSink, Shared};
use crate::web_reload::WebConfigHook;
use memprobe_core::internal::lock::Lock;
use memprobe_core::CgroupLocation;
use memprobe_core::{Error, Result, Source, Tracker};
use memprobe_gpu::Gpus;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How an exporter starts.
#[derive(Debug, Clone, Default)]
pub struct ExporterOptions {
    /// Where to listen; `None`: `127.0.0.1`, a free port (see
    /// [`Exporter::port`]). Give `0.0.0.0:PORT` to be scraped from other
    /// machines.
    pub listen: Option<SocketAddr>,
    /// The rank labels; `None`: from `RANK`, `LOCAL_RANK`, `WORLD_SIZE`.
    pub rank: Option<Rank>,
    /// The `hostname` label; `None`: this machine's host name.
    pub hostname: Option<String>,
    /// Connection bounds.
    pub limits: Limits,
    /// A web configuration file in exporter-toolkit's format (TLS, basic
    /// auth; see [`WebConfig`](crate::WebConfig)): read at the start, where any problem is
    /// the start's error, and re-read when it or a file it names changes.
    pub web_config: Option<PathBuf>,
    /// Told of each re-read of `web_config` (a bad new file keeps the last
    /// good one); also seen through [`Exporter::web_config_error`].
    pub on_web_config: Option<WebConfigHook>,
}

#[derive(Clone, Default)]
struct Config {
    sources: Vec<Source>,
    rank: Rank,
    gpus: Option<&'static Gpus>,
    gpu_processes: bool,
    oom: Option<CgroupLocation>,
    origins: OriginsScope,
}

struct Inner {
    config: Lock<Config>,
    hostname: String,
    shared: Arc<Shared>,
    /// The web configuration's last refusal, when one is served.
    web_error: Option<Arc<Lock<Option<Error>>>>,
}

impl Inner {
    fn render(&self) -> String {
        let config = self.config.lock().map(|c| c.clone()).unwrap_or_default();
        let snapshot = self.shared.snapshot();
        render(&Inputs {
            sources: &config.sources,
            gpus: config.gpus,
            gpu_processes: config.gpu_processes,
            oom: config.oom.as_ref(),
            origins: &config.origins,
            hostname: &self.hostname,
            rank: &config.rank,
            snapshot: &snapshot,
            web_config_ok: self
                .web_error
                .as_ref()
                .map(|e| e.lock().is_ok_and(|e| e.is_none())),
        })
    }
}

/// An HTTP endpoint serving `/metrics` in the Prometheus text format: the
/// current readings of its sources and GPUs, and the last ended phases of
/// the trackers it watches. Scrapes are answered by the exporter's own
/// thread, from a snapshot: a training thread never waits on a scrape.
/// Stopped on drop.
pub struct Exporter {
    inner: Arc<Inner>,
    server: Option<Server>,
    addr: SocketAddr,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("addr", &self.addr)
            .field("running", &self.server.is_some())
            .finish()
    }
}

impl Exporter {
    /// Binds and starts serving.
    ///
    /// # Errors
    /// [`ErrorKind::Io`](memprobe_core::ErrorKind::Io) with "cannot listen
    /// on ADDR: Address already in use" when the port is taken, and
    /// similar messages for other bind failures; the errors of
    /// [`WebConfig::load`](crate::WebConfig::load) and of reading the files it names (an
    /// unreadable certificate, a key that does not match it) when
    /// `web_config` is given: never a fallback to plain HTTP.
    pub fn start(options: ExporterOptions) -> Result<Exporter> {
        let web = options
            .web_config
            .as_deref()
            .map(|p| crate::web_reload::load(p, options.on_web_config.clone()))
            .transpose()?;
        let hostname = match options.hostname {
            Some(h) => h,
            None => hostname()?,
        };
        let inner = Arc::new(Inner {
            config: Lock::new(Config {
                rank: options.rank.unwrap_or_else(Rank::from_env),
                // This process's GPU memory by origin, whenever the
                // interposer is loaded in it.
                origins: OriginsScope::InProcess,
                ..Config::default()
            }),
            hostname,
            shared: Arc::new(Shared::new()),
            web_error: web.as_ref().map(|(_, w)| Arc::clone(&w.error)),
        });
        let listen = options
            .listen
            .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
        let weak = Arc::downgrade(&inner);
        let render: Render =
            Arc::new(move || weak.upgrade().map_or_else(String::new, |i| i.render()));
        let server = Server::start(listen, options.limits, render, web)?;
        let addr = server.local_addr();
        Ok(Exporter {
            inner,
            server: Some(server),
            addr,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `"https"` when new connections are served over TLS (the web
    /// configuration in force has `tls_server_config`), else `"http"`.
    pub fn scheme(&self) -> &'static str {
        let tls = self
            .server
            .as_ref()
            .and_then(Server::web)
            .is_some_and(|w| w.tls.load(Ordering::Relaxed));
        if tls {
            "https"
        } else {
            "http"
        }
    }

    /// Why the last re-read of the web configuration was refused (the last
    /// good configuration is still in force); `None` when there is no web
    /// configuration or the last read was good.
    pub fn web_config_error(&self) -> Option<Error> {
        let web = self.server.as_ref().and_then(Server::web)?;
        web.error.lock().ok()?.clone()
    }

    /// The port it listens on (the one chosen when port 0 was asked for).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Exports `source`'s readings (read at each scrape). A source already
    /// exported is not added twice.
    pub fn add_source(&self, source: &Source) -> Result<()> {
        let mut c = self.inner.config.lock()?;
        if !c.sources.iter().any(|s| s.id() == source.id()) {
            c.sources.push(source.clone());
        }
        Ok(())
    }

    /// Exports the GPUs of `gpus` as DCGM-compatible gauges, with the
    /// memory of each process on them when `processes`; `None` stops.
    pub fn set_gpus(&self, gpus: Option<&'static Gpus>, processes: bool) -> Result<()> {
        let mut c = self.inner.config.lock()?;
        c.gpus = gpus;
        c.gpu_processes = processes;
        Ok(())
    }

    /// Exports the GPU memory held now by origin
    /// (`memprobe_gpu_origin_bytes`) of `scope`: this process's by default
    /// (when memprobe's driver-API interposer is loaded in it), every
    /// process with a region in a directory (`memprobe serve`), or none.
    pub fn set_gpu_origins(&self, scope: OriginsScope) -> Result<()> {
        self.inner.config.lock()?.origins = scope;
        Ok(())
    }

    /// Exports the OOM kills the kernel counted in the cgroup at
    /// `location` (`memprobe_cgroup_oom_kills_total`, read at each
    /// scrape); `None` stops.
    pub fn set_oom_kills(&self, location: Option<CgroupLocation>) -> Result<()> {
        self.inner.config.lock()?.oom = location;
        Ok(())
    }

    /// Replaces the rank labels.
    pub fn set_rank(&self, rank: Rank) -> Result<()> {
        self.inner.config.lock()?.rank = rank;
        Ok(())
    }

    /// A sink that publishes a tracker's ended phases to this exporter.
    pub fn sink(&self) -> Arc<MetricsSink> {
        Arc::new(MetricsSink {
            shared: Arc::clone(&self.inner.shared),
        })
    }

    /// Exports `tracker`'s sources and the records of its ended phases.
    pub fn watch(&self, tracker: &mut Tracker) -> Result<()> {
        for s in tracker.sources() {
            self.add_source(s)?;
        }
        tracker.add_sink(self.sink());
        Ok(())
    }

    /// The exposition a scrape would get now.
    pub fn render(&self) -> String {
        self.inner.render()
    }

    /// Stops serving (requests in progress finish, within the limits) and
    /// frees the port.
    ///
    /// # Errors
    /// [`ErrorKind::WrongOrder`](memprobe_core::ErrorKind::WrongOrder) when
    /// already stopped.
    pub fn stop(&mut self) -> Result<()> {
        match self.server.take() {
            Some(s) => {
                s.stop();
                Ok(())
            }
            None => Err(Error::wrong_order("the exporter is already stopped")),
        }
    }

    /// Whether it is serving.
    pub fn is_running(&self) -> bool {
        self.server.is_some()
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }
}
