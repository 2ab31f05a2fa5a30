//! One reading of the machine, no process in particular: system RAM, the
//! container's cgroup and the GPUs. `status` prints it; `watch` redraws it.
//! JSON schema: `docs/status-output.schema.json`.

use crate::columns::render_rows;
use crate::commands::SCHEMA_VERSION;
use crate::gpu_readings::{self, GpuReading};
use crate::unavailable;
use crate::units;
use memprobe_core::Sampler;
use memprobe_core::SystemRamSampler;
use memprobe_core::{CgroupOptions, CgroupSampler};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// System RAM (`/proc/meminfo`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SystemReading {
    pub(crate) total_bytes: u64,
    /// `MemTotal - MemAvailable`.
    pub(crate) used_bytes: u64,
    /// `MemAvailable`.
    pub(crate) available_bytes: u64,
}

/// The container's cgroup.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CgroupReading {
    pub(crate) version: &'static str,
    pub(crate) path: String,
    pub(crate) used_bytes: u64,
    pub(crate) limit_bytes: Option<u64>,
    /// The kernel's high-water mark since the cgroup was created (or last
    /// reset by someone), where readable.
    pub(crate) peak_bytes: Option<u64>,
}

/// The JSON document of `status` (and one frame of `watch`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StatusReport {
    pub(crate) schema_version: u32,
    pub(crate) kind: &'static str,
    pub(crate) memprobe_version: &'static str,
    pub(crate) taken_at_unix_s: f64,
    pub(crate) system: Option<SystemReading>,
    pub(crate) cgroup: Option<CgroupReading>,
    pub(crate) gpus: Vec<GpuReading>,
    pub(crate) unavailable: BTreeMap<String, String>,
}

/// Samplers kept open between readings (for `watch`).
pub(crate) struct Probes {
    system: Result<SystemRamSampler, String>,
    cgroup: Result<CgroupSampler, String>,
}

impl Probes {
    /// Opens system RAM and the cgroup; failures are kept as reasons.
    pub(crate) fn open() -> Probes {
        Probes {
            system: SystemRamSampler::new().map_err(|e| e.to_string()),
            cgroup: memprobe_core::internal::cgroup::discover()
                .and_then(|loc| CgroupSampler::at(loc, CgroupOptions { reset_peak: false }))
                .map_err(|e| e.message().to_string()),
        }
    }

    /// Takes one reading of everything.
    pub(crate) fn read(&mut self) -> StatusReport {
        let mut unavailable = BTreeMap::new();
        let system = match &mut self.system {
            Ok(s) => match s.read() {
                Ok(r) => Some(SystemReading {
                    total_bytes: r.total.unwrap_or(0),
                    used_bytes: r.used,
                    available_bytes: r.free.unwrap_or(0),
                }),
                Err(e) => {
                    unavailable.insert("system".to_string(), e.to_string());
                    None
                }
            },
            Err(why) => {
                unavailable.insert("system".to_string(), why.clone());
                None
            }
        };
        let cgroup = match &mut self.cgroup {
            Ok(c) => match c.read() {
                Ok(r) => {
                    let loc = c.location();
                    Some(CgroupReading {
                        version: loc.version.as_str(),
                        path: loc.dir.display().to_string(),
                        used_bytes: r.used,
                        limit_bytes: r.limit,
                        peak_bytes: c.lifetime_peak(),
                    })
                }
                Err(e) => {
                    unavailable.insert("cgroup".to_string(), e.to_string());
                    None
                }
            },
            Err(why) => {
                unavailable.insert("cgroup".to_string(), why.clone());
                None
            }
        };
        let gpus = gpu_readings::read_gpus().unwrap_or_else(|why| {
            unavailable.insert("gpus".to_string(), why);
            Vec::new()
        });
        StatusReport {
            schema_version: SCHEMA_VERSION,
            kind: "status",
            memprobe_version: env!("CARGO_PKG_VERSION"),
            taken_at_unix_s: units::unix_now_s(),
            system,
            cgroup,
            gpus,
            unavailable,
        }
    }
}

/// The human table of a reading: one row per source, then a line per
/// source that could not be read (the whole reason with `verbose`).
pub(crate) fn table(r: &StatusReport, verbose: bool) -> String {
    let why = |name: &str| {
        unavailable::shown(r.unavailable.get(name).map_or("", String::as_str), verbose)
    };
    let mut rows: Vec<[String; 5]> = vec![[
        "SOURCE".into(),
        "USED".into(),
        "TOTAL/LIMIT".into(),
        "FREE".into(),
        "PEAK".into(),
    ]];
    let mut notes = Vec::new();
    match &r.system {
        Some(s) => rows.push([
            "system RAM".into(),
            units::bytes(s.used_bytes),
            units::bytes(s.total_bytes),
            units::bytes(s.available_bytes),
            "-".into(),
        ]),
        None => notes.push(format!("system RAM: unavailable: {}", why("system"))),
    }
    match &r.cgroup {
        Some(c) => rows.push([
            format!("container ({})", c.version),
            units::bytes(c.used_bytes),
            c.limit_bytes
                .map_or_else(|| "no limit".into(), units::bytes),
            c.limit_bytes.map_or_else(
                || "-".into(),
                |l| units::bytes(l.saturating_sub(c.used_bytes)),
            ),
            units::opt_bytes(c.peak_bytes),
        ]),
        None => notes.push(format!("container: unavailable: {}", why("cgroup"))),
    }
    for g in &r.gpus {
        rows.push([
            format!("GPU {}", g.index),
            units::bytes(g.used_bytes),
            units::bytes(g.total_bytes),
            units::bytes(g.free_bytes),
            "-".into(),
        ]);
    }
    if r.gpus.is_empty() {
        notes.push(if r.unavailable.contains_key("gpus") {
            format!("GPUs: unavailable: {}", why("gpus"))
        } else {
            "GPUs: none".into()
        });
    }
    let mut out = render_rows(&rows);
    for g in &r.gpus {
        let _ = writeln!(
            out,
            "GPU {}: {} ({}){}",
            g.index,
            g.name,
            g.uuid,
            g.reserved_bytes
                .map(|v| format!(", {} reserved by the driver", units::bytes(v)))
                .unwrap_or_default()
        );
    }
    if let Some(c) = &r.cgroup {
        let _ = writeln!(out, "container cgroup: {}", c.path);
    }
    for n in notes {
        let _ = writeln!(out, "{n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_a_row_per_source() {
        let r = Probes::open().read();
        let t = table(&r, false);
        assert!(t.starts_with("SOURCE"), "{t}");
        assert!(t.contains("system RAM"), "{t}");
        assert!(t.contains("GPUs"), "{t}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["kind"], "status");
    }

    #[test]
    fn gpus_render_and_match_the_schema() {
        let mut r = Probes::open().read();
        r.unavailable.remove("gpus");
        r.gpus = vec![GpuReading {
            index: 0,
            name: "Test GPU".into(),
            uuid: "GPU-0".into(),
            total_bytes: 80 << 30,
            used_bytes: 10 << 30,
            free_bytes: 70 << 30,
            reserved_bytes: Some(512 << 20),
            processes: vec![
                gpu_readings::GpuProcessReading {
                    pid: 1,
                    used_bytes: Some(9 << 30),
                    origins: None,
                },
                gpu_readings::GpuProcessReading {
                    pid: 2,
                    used_bytes: None,
                    origins: None,
                },
            ],
        }];
        let json = serde_json::to_value(&r).unwrap();
        let errors = crate::schema_check::check(
            &crate::schema_check::load("docs/status-output.schema.json"),
            &json,
        );
        assert!(errors.is_empty(), "{errors:#?}");
        let t = table(&r, false);
        assert!(t.contains("GPU 0"), "{t}");
        assert!(t.contains("512 MiB reserved"), "{t}");
        let g = gpu_readings::table(&r.gpus);
        assert!(g.contains("Test GPU") && g.contains("9.00 GiB"), "{g}");
    }
}
