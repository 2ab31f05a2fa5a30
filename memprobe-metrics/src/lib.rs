//! memprobe-metrics: memprobe's readings in the Prometheus text exposition
//! format, served over HTTP for Prometheus to scrape.
//!
//! An [`Exporter`] listens (on `127.0.0.1` unless told otherwise) and
//! answers `GET /metrics` with:
//!
//! - the current readings of the sources it was given
//!   (`memprobe_source_used_bytes`, `_total_bytes`, `_free_bytes`,
//!   `_limit_bytes`, `memprobe_source_up`);
//! - for each tracker it watches, the last ended step, epoch, experience
//!   and stream (`memprobe_phase_peak_bytes{phase="step",source=...}`, end
//!   use, delta used, delta peaked, index, duration), cache releases and
//!   leak flags;
//! - the GPUs as DCGM exporter names them (`DCGM_FI_DEV_FB_USED`,
//!   `DCGM_FI_DEV_FB_FREE`, `DCGM_FI_DEV_FB_TOTAL`, MiB, labels `gpu`,
//!   `UUID`, `device`, `modelName`, `Hostname`), so existing dashboards
//!   work, and optionally each process's GPU memory.
//!
//! Every series carries `hostname` (`Hostname` on the DCGM families) and,
//! when known, `rank`, `local_rank` and `world_size`. See docs/metrics.md.
//!
//! To be scraped from other machines, give
//! [`ExporterOptions::web_config`] a web configuration file in Prometheus
//! exporter-toolkit's format ([`WebConfig`]): TLS (rustls), client
//! certificates, bcrypt passwords; re-read when it changes.
//!
//! ```no_run
//! use memprobe_core::{PhaseKind, Source, Tracker};
//! use memprobe_metrics::{Exporter, ExporterOptions};
//!
//! let exporter = Exporter::start(ExporterOptions::default())?;
//! println!("scrape http://{}/metrics", exporter.local_addr());
//! let mut tracker = Tracker::new(&[Source::process()?])?;
//! exporter.watch(&mut tracker)?;
//! tracker.begin(PhaseKind::Step, None)?;
//! for _ in 0..100 {
//!     // ... one training step ...
//!     tracker.next(PhaseKind::Step, None)?;
//! }
//! # Ok::<(), memprobe_core::Error>(())
//! ```

mod basic_auth;
mod conn;
mod exporter;
mod http;
mod labels;
mod origins;
mod render;
mod route;
mod snapshot;
mod text;
mod tls;
mod web_config;
mod web_reload;

pub use exporter::{Exporter, ExporterOptions};
pub use http::Limits;
pub use labels::{hostname, Rank};
pub use origins::{OriginsScope, OTHER as OTHER_ORIGINS, TOP_ORIGINS};
pub use snapshot::MetricsSink;
pub use text::CONTENT_TYPE;
pub use web_config::WebConfig;
pub use web_reload::{WebConfigEvent, WebConfigHook};
