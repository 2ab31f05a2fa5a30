//! Renders one scrape: the sources read now, the GPUs read now, and the
//! phase snapshot the tracker left.

use crate::labels::Rank;
use crate::origins::OriginsScope;
use crate::snapshot::{Snapshot, KINDS};
use crate::text::{Exposition, Type};
use memprobe_core::internal::cgroup::OomEvents;
use memprobe_core::CgroupLocation;
use memprobe_core::{Sample, Source};
use memprobe_gpu::Gpus;

/// Everything one scrape renders.
pub(crate) struct Inputs<'a> {
    pub(crate) sources: &'a [Source],
    pub(crate) gpus: Option<&'static Gpus>,
    pub(crate) gpu_processes: bool,
    /// The cgroup whose OOM kills are counted, when watched.
    pub(crate) oom: Option<&'a CgroupLocation>,
    pub(crate) hostname: &'a str,
    pub(crate) rank: &'a Rank,
    pub(crate) snapshot: &'a Snapshot,
    /// With a web configuration: whether its last read was taken.
    pub(crate) web_config_ok: Option<bool>,
    /// Whose GPU memory by origin is exported.
    pub(crate) origins: &'a OriginsScope,
}

/// One family's samples, collected before the family is written so that
/// families without samples are left out.
struct Rows<'a> {
    name: &'static str,
    help: &'static str,
    ty: Type,
    rows: Vec<(Vec<(&'static str, &'a str)>, f64)>,
}

impl<'a> Rows<'a> {
    fn new(name: &'static str, ty: Type, help: &'static str) -> Self {
        Rows {
            name,
            help,
            ty,
            rows: Vec::new(),
        }
    }

    fn push(&mut self, labels: Vec<(&'static str, &'a str)>, v: f64) {
        self.rows.push((labels, v));
    }

    fn write(self, e: &mut Exposition, common: &[(&str, &str)]) {
        if self.rows.is_empty() {
            return;
        }
        e.family(self.name, self.help, self.ty);
        for (labels, v) in &self.rows {
            e.sample(self.name, labels, common, *v);
        }
    }
}

pub(crate) fn render(i: &Inputs<'_>) -> String {
    let mut e = Exposition::new();
    let rank = i.rank.labels();
    let mut common: Vec<(&str, &str)> = vec![("hostname", i.hostname)];
    common.extend(rank.iter().map(|(k, v)| (*k, v.as_str())));

    sources(&mut e, i.sources, &common);
    phases(&mut e, i.snapshot, &common);
    if let Some(location) = i.oom {
        oom_kills(&mut e, location, &common);
    }
    if let Some(ok) = i.web_config_ok {
        let mut reload = Rows::new(
            "memprobe_web_config_last_reload_successful",
            Type::Gauge,
            "1 when the web configuration's last read was taken, 0 when a changed file was refused (the last good one is served).",
        );
        reload.push(Vec::new(), if ok { 1.0 } else { 0.0 });
        reload.write(&mut e, &common);
    }
    if let Some(gpus) = i.gpus {
        let mut dcgm_common: Vec<(&str, &str)> = vec![("Hostname", i.hostname)];
        dcgm_common.extend(rank.iter().map(|(k, v)| (*k, v.as_str())));
        gpu_families(&mut e, gpus, i.gpu_processes, &dcgm_common);
    }
    crate::origins::family(&mut e, &crate::origins::read(i.origins), &common);
    e.finish()
}

fn sources(e: &mut Exposition, sources: &[Source], common: &[(&str, &str)]) {
    let readings: Vec<(&Source, Option<Sample>)> =
        sources.iter().map(|s| (s, s.read().ok())).collect();
    let mut used = Rows::new(
        "memprobe_source_used_bytes",
        Type::Gauge,
        "Bytes in use now, per source (RSS for processes, usage for cgroups, used for GPUs).",
    );
    let mut total = Rows::new(
        "memprobe_source_total_bytes",
        Type::Gauge,
        "Capacity of what a source measures (physical RAM, GPU memory), bytes; where known.",
    );
    let mut free = Rows::new(
        "memprobe_source_free_bytes",
        Type::Gauge,
        "Bytes still available to a source (MemAvailable, GPU free, cgroup headroom); where known.",
    );
    let mut limit = Rows::new(
        "memprobe_source_limit_bytes",
        Type::Gauge,
        "Enforced memory limit of a source (a cgroup's), bytes; absent when unlimited.",
    );
    let mut up = Rows::new(
        "memprobe_source_up",
        Type::Gauge,
        "1 when the source could be read at this scrape, 0 when the read failed.",
    );
    for (s, r) in &readings {
        let info = s.info();
        let l = || vec![("source", info.name.as_str()), ("kind", info.kind.as_str())];
        up.push(l(), if r.is_some() { 1.0 } else { 0.0 });
        let Some(r) = r else { continue };
        used.push(l(), r.used as f64);
        if let Some(v) = r.total {
            total.push(l(), v as f64);
        }
        if let Some(v) = r.free {
            free.push(l(), v as f64);
        }
        if let Some(v) = r.limit {
            limit.push(l(), v as f64);
        }
    }
    for rows in [used, total, free, limit, up] {
        rows.write(e, common);
    }
}

fn phases(e: &mut Exposition, snap: &Snapshot, common: &[(&str, &str)]) {
    let mut peak = Rows::new(
        "memprobe_phase_peak_bytes",
        Type::Gauge,
        "Highest use of a source during the last ended phase of a kind (step, epoch, ...), bytes.",
    );
    let mut used_end = Rows::new(
        "memprobe_phase_used_end_bytes",
        Type::Gauge,
        "Use of a source at the end of the last ended phase of a kind, bytes.",
    );
    let mut delta_used = Rows::new(
        "memprobe_phase_delta_used_bytes",
        Type::Gauge,
        "fastai's delta used over the last ended phase: end minus start, bytes (negative when freed).",
    );
    let mut delta_peaked = Rows::new(
        "memprobe_phase_delta_peaked_bytes",
        Type::Gauge,
        "fastai's delta peaked over the last ended phase: the temporary rise above the net growth, bytes.",
    );
    let mut index = Rows::new(
        "memprobe_phase_index",
        Type::Gauge,
        "0-based number of the last ended phase of a kind (the step or epoch number).",
    );
    let mut duration = Rows::new(
        "memprobe_phase_duration_seconds",
        Type::Gauge,
        "Duration of the last ended phase of a kind, seconds.",
    );
    for (kind, rec) in KINDS.iter().zip(&snap.last) {
        let Some(rec) = rec else { continue };
        let phase = kind.as_str();
        if let Some(p) = &rec.phase {
            index.push(vec![("phase", phase)], p.index as f64);
        }
        duration.push(vec![("phase", phase)], rec.duration_ns() as f64 / 1e9);
        for d in &rec.sources {
            let l = || {
                vec![
                    ("phase", phase),
                    ("source", d.name.as_str()),
                    ("kind", d.kind.as_str()),
                ]
            };
            peak.push(l(), d.peak as f64);
            used_end.push(l(), d.used_end as f64);
            delta_used.push(l(), d.delta_used as f64);
            delta_peaked.push(l(), d.delta_peaked as f64);
        }
    }
    for rows in [peak, used_end, delta_used, delta_peaked, index, duration] {
        rows.write(e, common);
    }

    let mut releases = Rows::new(
        "memprobe_cache_releases_total",
        Type::Counter,
        "Cache releases fired at the end of phases (release policies).",
    );
    releases.push(Vec::new(), snap.releases as f64);
    let mut released = Rows::new(
        "memprobe_cache_released_bytes_total",
        Type::Counter,
        "Bytes freed per source by the cache releases fired at phase ends.",
    );
    let mut flagged = Rows::new(
        "memprobe_leak_flagged",
        Type::Gauge,
        "1 when a source's end-of-epoch use grew for the leak policy's number of epochs in a row, else 0.",
    );
    let mut streak = Rows::new(
        "memprobe_leak_streak_epochs",
        Type::Gauge,
        "Current run of epochs over which a source's end-of-epoch use grew beyond the threshold.",
    );
    for t in &snap.sources {
        released.push(vec![("source", t.name.as_str())], t.released_bytes as f64);
        if let Some((f, s)) = t.leak {
            flagged.push(vec![("source", t.name.as_str())], if f { 1.0 } else { 0.0 });
            streak.push(vec![("source", t.name.as_str())], f64::from(s));
        }
    }
    for rows in [releases, released, flagged, streak] {
        rows.write(e, common);
    }
}

/// The kernel's OOM-kill counter of the cgroup, read at the scrape; absent
/// where the kernel keeps none (v1 before Linux 4.13) or it cannot be read.
fn oom_kills(e: &mut Exposition, location: &CgroupLocation, common: &[(&str, &str)]) {
    let mut kills = Rows::new(
        "memprobe_cgroup_oom_kills_total",
        Type::Counter,
        "Processes of the container's memory cgroup killed by an OOM killer (memory.events / memory.oom_control oom_kill).",
    );
    if let Some(n) = OomEvents::read(location).and_then(|ev| ev.oom_kill) {
        kills.push(vec![("cgroup", location.version.as_str())], n as f64);
    }
    kills.write(e, common);
}

struct GpuRow {
    gpu: String,
    uuid: String,
    device: String,
    model: String,
    memory: Option<(u64, u64, u64)>,
    processes: Vec<(String, u64)>,
}

fn gpu_families(e: &mut Exposition, gpus: &Gpus, processes: bool, common: &[(&str, &str)]) {
    let rows: Vec<GpuRow> = gpus
        .device_infos()
        .into_iter()
        .map(|info| {
            let handle = gpus.device_ref(info.id).ok();
            let memory = handle
                .and_then(|h| h.memory().ok())
                .map(|m| (m.used, m.free, m.total));
            let procs = match handle.filter(|_| processes) {
                Some(h) => h
                    .processes()
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|p| Some((p.pid.to_string(), p.used?)))
                    .collect(),
                None => Vec::new(),
            };
            let gpu = info.nvml_index.unwrap_or(info.id);
            GpuRow {
                gpu: gpu.to_string(),
                device: format!("nvidia{gpu}"),
                uuid: info.uuid.unwrap_or_default(),
                model: info.name.unwrap_or_default(),
                memory,
                processes: procs,
            }
        })
        .collect();
    let mut used = Rows::new(
        "DCGM_FI_DEV_FB_USED",
        Type::Gauge,
        "Framebuffer memory used (in MiB), as DCGM exporter names it.",
    );
    let mut free = Rows::new(
        "DCGM_FI_DEV_FB_FREE",
        Type::Gauge,
        "Framebuffer memory free (in MiB), as DCGM exporter names it.",
    );
    let mut total = Rows::new(
        "DCGM_FI_DEV_FB_TOTAL",
        Type::Gauge,
        "Framebuffer memory total (in MiB), as DCGM exporter names it.",
    );
    let mut procs = Rows::new(
        "memprobe_gpu_process_used_bytes",
        Type::Gauge,
        "GPU memory used by one process on one GPU, bytes (pid as the driver reports it).",
    );
    for r in &rows {
        let l = || {
            vec![
                ("gpu", r.gpu.as_str()),
                ("UUID", r.uuid.as_str()),
                ("device", r.device.as_str()),
                ("modelName", r.model.as_str()),
            ]
        };
        if let Some((u, f, t)) = r.memory {
            used.push(l(), (u / (1 << 20)) as f64);
            free.push(l(), (f / (1 << 20)) as f64);
            total.push(l(), (t / (1 << 20)) as f64);
        }
        for (pid, bytes) in &r.processes {
            procs.push(
                vec![
                    ("gpu", r.gpu.as_str()),
                    ("UUID", r.uuid.as_str()),
                    ("pid", pid.as_str()),
                ],
                *bytes as f64,
            );
        }
    }
    for rows in [used, free, total, procs] {
        rows.write(e, common);
    }
}
