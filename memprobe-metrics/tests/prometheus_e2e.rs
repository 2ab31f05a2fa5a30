//! End to end with a real Prometheus: two processes acting as ranks 0 and 1
//! each run a tracker whose steps peak at a known value and export it;
//! Prometheus (Debian's `prometheus` package) scrapes both, and a query
//! through its HTTP API returns the larger peak. Skipped, saying why, when
//! the `prometheus` binary is absent.

mod common;

use common::local::{free_port, http_get, Kill};

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RANK_ENV: &str = "MEMPROBE_E2E_RANK";
const MIB: u64 = 1 << 20;

fn peak_of(rank: u64) -> u64 {
    (100 + 200 * rank) * MIB
}

/// The child's body: a rank exporting a tracker's steps until killed.
fn rank_main(rank: u64) {
    use memprobe_core::{PhaseKind, Source, Tracker};
    use memprobe_metrics::{Exporter, ExporterOptions};
    let e = Exporter::start(ExporterOptions::default()).unwrap();
    let act = Source::pushed("activations").unwrap();
    let mut t = Tracker::new(std::slice::from_ref(&act)).unwrap();
    e.watch(&mut t).unwrap();
    println!("port {}", e.port());
    std::io::stdout().flush().unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    loop {
        act.push(10 * MIB).unwrap();
        act.push(peak_of(rank)).unwrap();
        act.push(10 * MIB).unwrap();
        t.next(PhaseKind::Step, None).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn prometheus_scrapes_two_ranks() {
    if let Ok(rank) = std::env::var(RANK_ENV) {
        rank_main(rank.parse().unwrap());
        return;
    }
    let prometheus = "prometheus";
    if !common::required_tool::require(
        "prometheus_scrapes_two_ranks",
        &[prometheus],
        "apt-get install prometheus",
    ) {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut ranks = Vec::new();
    let mut ports = Vec::new();
    for rank in 0..2u64 {
        let mut child = Command::new(&exe)
            .args(["--exact", "prometheus_scrapes_two_ranks", "--nocapture"])
            .env(RANK_ENV, rank.to_string())
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", "2")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port: u16 = loop {
            let line = lines.next().expect("the rank printed its port").unwrap();
            if let Some(p) = line.strip_prefix("port ") {
                break p.trim().parse().unwrap();
            }
        };
        ranks.push(Kill(child));
        ports.push(port);
    }
    // Every rank serves what promtool accepts, with its rank label.
    for (rank, port) in ports.iter().enumerate() {
        let text = http_get(*port, "/metrics").unwrap();
        assert!(text.contains(&format!("rank=\"{rank}\"")), "{text}");
    }

    let dir = std::env::temp_dir().join(format!("memprobe-prom-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let targets: Vec<String> = ports.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: train\n    static_configs:\n      - targets: [{}]\n",
        targets.join(", ")
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let web = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prom = Kill(
        Command::new(prometheus)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let query = "/api/v1/query?query=max(memprobe_phase_peak_bytes%7Bphase%3D%22step%22%2Csource%3D%22activations%22%7D)";
    let count = "/api/v1/query?query=count(memprobe_phase_peak_bytes%7Bphase%3D%22step%22%2Csource%3D%22activations%22%7D)";
    let want = format!("\"{}\"", peak_of(1));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        if let (Some(max), Some(n)) = (http_get(web, query), http_get(web, count)) {
            if max.contains(&want) && n.contains("\"2\"]") {
                break;
            }
            last = format!("{max}\n{n}");
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
            panic!("Prometheus did not return {want} within 30 s; last answer:\n{last}\n--- log\n{log}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(_prom);
    let _ = std::fs::remove_dir_all(&dir);
}
