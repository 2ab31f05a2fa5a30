//! Every metric the shipped Grafana dashboard and Prometheus rules query
//! (deploy/) is one the exporter emits, checked against a real scrape of
//! an exporter with everything on: 8 fake GPUs with their processes, the
//! host's RAM, a process, a limited cgroup, OOM kills, a tracker's ended
//! steps and epochs with releases and a leak policy, a process's GPU
//! memory by origin (a region as the interposer writes it). A name with a
//! colon must be a recording rule the rules file defines.

mod common;

#[path = "../../tests/src/fake_gpu.rs"]
#[allow(dead_code, unreachable_pub)]
mod fake_gpu;

use memprobe_core::{
    CgroupLocation, CgroupVersion, LeakPolicy, PeakFidelity, PhaseKind, Result, Sample, Sampler,
    Source, SourceInfo, SourceKind, Tracker,
};
use memprobe_gpu::{GpuBackend, GpuConfig, Gpus};
use memprobe_metrics::{Exporter, ExporterOptions, OriginsScope};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// PromQL's words that are not metric names: operators, and the
/// aggregations (they may stand before `by (...)`, not only before `(`).
const KEYWORDS: [&str; 26] = [
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
];

/// The metric names an expression selects. Label matchers, strings,
/// ranges, grouping lists and functions are cut first; what is left that
/// looks like an identifier is a metric name. `label_values(m, l)` keeps
/// only `m`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut s = String::new();
    let mut chars = expr.chars().peekable();
    // Cut strings, {...} and [...].
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                for d in chars.by_ref() {
                    if d == c {
                        break;
                    }
                }
            }
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace > 0 || depth_bracket > 0 => {}
            _ => s.push(c),
        }
    }
    // label_values(metric, label): the label is not a metric.
    let s = s.replace("label_values(", "label_values((");
    let mut out = BTreeSet::new();
    let bytes: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut skip_group = false;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric()
                    || bytes[i] == '_'
                    || bytes[i] == ':'
                    || bytes[i] == '$')
            {
                i += 1;
            }
            let word: String = bytes[start..i].iter().collect();
            let mut j = i;
            while j < bytes.len() && bytes[j] == ' ' {
                j += 1;
            }
            let call = j < bytes.len() && bytes[j] == '(';
            if matches!(
                word.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            ) {
                skip_group = true;
                continue;
            }
            if word.starts_with('$') || call || KEYWORDS.contains(&word.as_str()) {
                continue;
            }
            out.insert(word);
        } else if c == '(' && skip_group {
            // A grouping list: label names, not metrics.
            while i < bytes.len() && bytes[i] != ')' {
                i += 1;
            }
            skip_group = false;
            i += 1;
        } else {
            if !c.is_whitespace() {
                skip_group = false;
            }
            i += 1;
        }
    }
    // label_values((metric), label) → drop what follows a comma there.
    if expr.contains("label_values(") {
        let inside = expr.split_once("label_values(").unwrap().1;
        let label = inside
            .rsplit_once(',')
            .map(|(_, l)| l.trim().trim_end_matches(')').trim());
        if let Some(l) = label {
            out.remove(l);
        }
    }
    out
}

fn json_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => json_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| json_exprs(v, out)),
        _ => {}
    }
}

/// (every rule's expression, the recorded names) of the rules file.
fn rules() -> (Vec<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(deploy().join("prometheus/memprobe-rules.yml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).unwrap();
    let mut exprs = Vec::new();
    let mut records = BTreeSet::new();
    for group in docs[0]["groups"].as_vec().unwrap() {
        for rule in group["rules"].as_vec().unwrap() {
            exprs.push(rule["expr"].as_str().unwrap().to_owned());
            if let Yaml::String(r) = &rule["record"] {
                records.insert(r.clone());
            }
        }
    }
    (exprs, records)
}

/// A cgroup with a limit, as `memprobe serve` sees a limited container.
struct LimitedCgroup;

impl Sampler for LimitedCgroup {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "cgroup".into(),
            kind: SourceKind::Cgroup,
            fidelity: PeakFidelity::Sampled,
        }
    }
    fn read(&mut self) -> Result<Sample> {
        Ok(Sample {
            limit: Some(8 << 30),
            ..Sample::used(1 << 30)
        })
    }
}

/// The names in a scrape of an exporter with every family on.
fn scraped_names() -> BTreeSet<String> {
    let dir = std::env::temp_dir().join(format!("memprobe-deploy-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libnvidia-ml.so.1");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-gpu");
    fake_gpu::compile_fake(&root, "fake_nvml.c", &[], &lib);
    let mut script = String::from("devices 8\n");
    for i in 0..8 {
        script += &format!(
            "device {i} procs 1000:{} 2000:{}\n",
            (i + 1) << 20,
            (i + 2) << 20
        );
    }
    std::fs::write(dir.join("fake_nvml.script"), script).unwrap();
    let gpus = Gpus::open(GpuConfig {
        backend: GpuBackend::Nvml,
        nvml_path: Some(lib),
        ..GpuConfig::default()
    })
    .unwrap();
    let gpus: &'static Gpus = Box::leak(Box::new(gpus));
    std::fs::write(
        dir.join("memory.events"),
        "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n",
    )
    .unwrap();

    // A web configuration (empty: plain HTTP, no password) brings its gauge.
    std::fs::write(dir.join("web.yml"), "").unwrap();
    let e = Exporter::start(ExporterOptions {
        web_config: Some(dir.join("web.yml")),
        ..ExporterOptions::default()
    })
    .unwrap();
    e.set_gpus(Some(gpus), true).unwrap();
    e.set_oom_kills(Some(CgroupLocation {
        version: CgroupVersion::V2,
        dir: dir.clone(),
    }))
    .unwrap();
    let regions = dir.join("regions");
    let _region = origins_region(&regions);
    e.set_gpu_origins(OriginsScope::Regions(regions)).unwrap();
    e.add_source(&Source::system_ram().unwrap()).unwrap();
    e.add_source(&Source::process().unwrap()).unwrap();
    e.add_source(&Source::from_sampler(Box::new(LimitedCgroup)))
        .unwrap();
    let act = Source::pushed("act").unwrap();
    let mut t = Tracker::new(std::slice::from_ref(&act)).unwrap();
    t.set_leak_policy(Some(LeakPolicy {
        threshold: 0,
        epochs: 1,
    }))
    .unwrap();
    e.watch(&mut t).unwrap();
    for epoch in 0..2u64 {
        t.begin(PhaseKind::Epoch, None).unwrap();
        t.begin(PhaseKind::Step, None).unwrap();
        act.push((10 + epoch) << 20).unwrap();
        t.end(PhaseKind::Step, None).unwrap();
        t.end(PhaseKind::Epoch, None).unwrap();
    }
    let (status, text) = common::get(e.local_addr(), "/metrics");
    assert_eq!(status, 200, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

/// A region of this process in `dir`, as the interposer writes one, with
/// 3 MiB from NCCL on GPU 0; unmapped when dropped.
struct OriginsRegion(*mut libc::c_void);

impl Drop for OriginsRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `origins_region`.
        unsafe { libc::munmap(self.0, memprobe_interpose_reader::layout::LAYOUT_SIZE) };
    }
}

fn origins_region(dir: &Path) -> OriginsRegion {
    use memprobe_interpose_reader::layout::{
        Layout, FLAG_COUNTING, FLAG_ORIGINS, FLAG_SHARED, LAYOUT_SIZE,
    };
    use std::os::unix::io::AsRawFd;
    std::fs::create_dir_all(dir).unwrap();
    let pid = std::process::id();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join(pid.to_string()))
        .unwrap();
    f.set_len(LAYOUT_SIZE as u64).unwrap();
    // SAFETY: a shared mapping of the whole file, zero bytes: a valid
    // (empty) layout.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LAYOUT_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    // SAFETY: mapped above, atomics only.
    let l = unsafe { &*m.cast::<Layout>() };
    l.init(
        pid,
        memprobe_interpose_reader::liveness::start_time(pid),
        FLAG_COUNTING | FLAG_SHARED | FLAG_ORIGINS,
    );
    let o = l.claim_origin(b"/usr/lib/libnccl.so.2", b"ncclCommInitRank", 0, 0, false);
    l.add_from(o, 0, 3 << 20);
    OriginsRegion(m)
}

#[test]
fn the_extractor_finds_metrics_and_nothing_else() {
    let names = metric_names(
        r#"max by (job, source) (memprobe_phase_peak_bytes{phase="step", rank=~"$rank"}) / on (job) group_left(x) quantile(0.5, a:b:c[5m]) and count(foo) > 1"#,
    );
    let want: BTreeSet<String> = ["memprobe_phase_peak_bytes", "a:b:c", "foo"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, want);
    let lv = metric_names(r#"label_values(memprobe_source_up{job=~"$job"}, hostname)"#);
    assert_eq!(
        lv.into_iter().collect::<Vec<_>>(),
        vec!["memprobe_source_up"]
    );
}

#[test]
fn every_metric_the_dashboard_and_rules_query_is_emitted() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy().join("grafana/memprobe-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    json_exprs(&dashboard, &mut exprs);
    assert!(
        exprs.len() >= 15,
        "the dashboard's queries were not found: {exprs:?}"
    );
    let (rule_exprs, records) = rules();
    exprs.extend(rule_exprs);

    let emitted = scraped_names();
    let mut queried = BTreeSet::new();
    let mut missing = Vec::new();
    for expr in &exprs {
        for name in metric_names(expr) {
            let known = if name.contains(':') {
                records.contains(&name)
            } else {
                emitted.contains(&name)
            };
            if !known {
                missing.push(format!("{name} (in {expr:?})"));
            }
            queried.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "queried but not emitted (or not recorded):\n{}\nemitted: {emitted:?}",
        missing.join("\n")
    );
    // What the issue asks the dashboard to show is there.
    for needed in [
        "memprobe_source_used_bytes",
        "memprobe_source_limit_bytes",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_TOTAL",
        "memprobe_gpu_process_used_bytes",
        "memprobe_phase_peak_bytes",
        "memprobe_cgroup_oom_kills_total",
    ] {
        assert!(queried.contains(needed), "nothing queries {needed}");
    }
}
