//! Scrape latency with 8 fake GPUs after a long run, alone and with 256 idle
//! and 256 dribbling connections open; a node of 8 fake GPUs and 64 GPU
//! processes scraped over plain HTTP and over TLS with basic auth, in the
//! same run; and what the exporter adds to a training step
//! (`Tracker::next`) while scraped in a loop.
//! `cargo bench -p memprobe-metrics --bench scrape`

#[path = "../../tests/src/fake_gpu.rs"]
#[allow(dead_code, unreachable_pub)]
mod fake_gpu;

#[path = "../tests/common/pki.rs"]
mod pki;
#[path = "../tests/common/tls_client.rs"]
mod tls_client;

use memprobe_core::{PhaseKind, Source, Tracker};
use memprobe_gpu::{GpuBackend, GpuConfig, Gpus};
use memprobe_metrics::{Exporter, ExporterOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 8 fake GPUs with `procs` processes each.
fn fake_gpus(procs: u32) -> &'static Gpus {
    let dir = std::env::temp_dir().join(format!(
        "memprobe-scrape-bench-{}-{procs}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libnvidia-ml.so.1");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-gpu");
    fake_gpu::compile_fake(&root, "fake_nvml.c", &[], &lib);
    let mut script = String::from("devices 8\n");
    for i in 0..8u64 {
        let list: Vec<String> = (0..u64::from(procs))
            .map(|p| format!("{}:{}", 1000 + 100 * i + p, (i + p + 1) << 20))
            .collect();
        script += &format!("device {i} procs {}\n", list.join(" "));
    }
    std::fs::write(dir.join("fake_nvml.script"), script).unwrap();
    let gpus = Gpus::open(GpuConfig {
        backend: GpuBackend::Nvml,
        nvml_path: Some(lib),
        ..GpuConfig::default()
    })
    .unwrap();
    Box::leak(Box::new(gpus))
}

fn scrape(addr: SocketAddr) -> usize {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut v = Vec::new();
    s.read_to_end(&mut v).unwrap();
    v.len()
}

/// Scrape latencies (µs) of `n` scrapes while 256 connections send nothing
/// and 256 send a byte every 100 ms (the open-file limit is raised for them).
fn scrapes_in_a_crowd(addr: SocketAddr, n: usize) -> Vec<f64> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit pointers; only the soft limit is raised.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
    let _idle: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let mut slow: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let dribbler = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            for c in &mut slow {
                let _ = c.write_all(b"G");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let lat = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            scrape(addr);
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    dribbler.join().unwrap();
    lat
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

/// Mean ns per `Tracker::next` over `n` steps.
fn steps(t: &mut Tracker, act: &Source, n: u64) -> f64 {
    let t0 = Instant::now();
    for i in 0..n {
        act.push(i & 0xffff).unwrap();
        t.next(PhaseKind::Step, None).unwrap();
    }
    t0.elapsed().as_nanos() as f64 / n as f64
}

/// Median and p99 of `n` timings (µs) of `f`.
fn timed(n: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    (pct(&mut v, 0.5), pct(&mut v, 0.99))
}

/// A node (8 GPUs, 64 processes on them, host RAM, cgroup-like sources)
/// scraped over plain HTTP and over TLS 1.3 with basic auth, interleaved in
/// rounds so that both see the same machine load. Every TLS scrape is a
/// new connection with a full handshake and no session resumption, as
/// Prometheus' scraper makes them; the password is verified once (bcrypt)
/// and then taken from the cache.
fn plain_vs_tls() {
    if !pki::openssl_installed() {
        println!("TLS scrape: skipped (no openssl to make the certificates)");
        return;
    }
    let gpus = fake_gpus(8);
    let dir =
        std::env::temp_dir().join(format!("memprobe-scrape-bench-tls-{}", std::process::id()));
    let p = pki::Pki::new(&dir);
    let hash = bcrypt::hash("right", 10).unwrap();
    std::fs::write(
        dir.join("web.yml"),
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n\
             basic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .unwrap();
    let node = |web: Option<std::path::PathBuf>| {
        let e = Exporter::start(ExporterOptions {
            web_config: web,
            ..ExporterOptions::default()
        })
        .unwrap();
        e.set_gpus(Some(gpus), true).unwrap();
        e.add_source(&Source::system_ram().unwrap()).unwrap();
        e.add_source(&Source::process().unwrap()).unwrap();
        e
    };
    let plain = node(None);
    let tls = node(Some(dir.join("web.yml")));
    let mut config = (*tls_client::config(&p.ca, None)).clone();
    config.resumption = rustls::client::Resumption::disabled();
    let config = Arc::new(config);
    let auth = tls_client::basic("prometheus", "right");
    let tls_scrape = || {
        let (status, text) = tls_client::get(tls.local_addr(), &config, "/metrics", &auth).unwrap();
        assert_eq!(status, 200);
        text.len()
    };
    let first = Instant::now();
    let bytes_tls = tls_scrape();
    let first = first.elapsed();
    let bytes_plain = scrape(plain.local_addr());
    let (mut p50s, mut t50s, mut p99s, mut t99s) = (vec![], vec![], vec![], vec![]);
    for _ in 0..5 {
        let (a, b) = timed(100, || {
            scrape(plain.local_addr());
        });
        let (c, d) = timed(100, || {
            tls_scrape();
        });
        p50s.push(a);
        p99s.push(b);
        t50s.push(c);
        t99s.push(d);
    }
    let (pm, tm) = (pct(&mut p50s, 0.5), pct(&mut t50s, 0.5));
    println!(
        "node of 8 GPUs and 64 GPU processes, median of 5 rounds x 100 scrapes, interleaved: \
         plain HTTP {bytes_plain} bytes p50 {pm:.0} us (p99 {:.0} us); \
         TLS 1.3 + basic auth (full handshake each, password cached) {bytes_tls} bytes \
         p50 {tm:.0} us (p99 {:.0} us); ratio {:.2}x; the first TLS scrape (bcrypt cost 10) {:.0} ms",
        pct(&mut p99s, 0.5),
        pct(&mut t99s, 0.5),
        tm / pm,
        first.as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    plain_vs_tls();
    let gpus = fake_gpus(2);
    let e = Exporter::start(ExporterOptions::default()).unwrap();
    e.set_gpus(Some(gpus), true).unwrap();
    let sources: Vec<Source> = (0..4)
        .map(|i| Source::pushed(&format!("s{i}")).unwrap())
        .collect();
    let mut t = Tracker::new(&sources).unwrap();
    e.watch(&mut t).unwrap();
    e.add_source(&Source::process().unwrap()).unwrap();
    e.add_source(&Source::system_ram().unwrap()).unwrap();
    // A long run: 100 epochs of 1000 steps.
    for _ in 0..100 {
        t.begin(PhaseKind::Epoch, None).unwrap();
        t.begin(PhaseKind::Step, None).unwrap();
        steps(&mut t, &sources[0], 1000);
        t.end(PhaseKind::Step, None).unwrap();
        t.end(PhaseKind::Epoch, None).unwrap();
    }
    let addr = e.local_addr();
    let bytes = scrape(addr);
    let mut lat: Vec<f64> = (0..300)
        .map(|_| {
            let t0 = Instant::now();
            scrape(addr);
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let render: Vec<f64> = (0..300)
        .map(|_| {
            let t0 = Instant::now();
            std::hint::black_box(e.render());
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let mut render = render;
    let mut crowd = scrapes_in_a_crowd(addr, 300);
    println!(
        "scrape over HTTP, 8 GPUs + processes, 4 tracked + 2 read sources, after 100k steps: \
         {bytes} bytes, p50 {:.0} us, p99 {:.0} us (render alone p50 {:.0} us); \
         with 256 idle + 256 dribbling connections open: p50 {:.0} us, p99 {:.0} us",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut render, 0.5),
        pct(&mut crowd, 0.5),
        pct(&mut crowd, 0.99)
    );

    // Tracker::next: no exporter / exporter not scraped / scraped in a loop.
    let act = Source::pushed("act").unwrap();
    let mut bare = Tracker::new(std::slice::from_ref(&act)).unwrap();
    bare.begin(PhaseKind::Step, None).unwrap();
    let mut watched = Tracker::new(std::slice::from_ref(&act)).unwrap();
    e.watch(&mut watched).unwrap();
    watched.begin(PhaseKind::Step, None).unwrap();
    const N: u64 = 200_000;
    let rounds = 7;
    let mut a = Vec::new();
    let mut b = Vec::new();
    let mut c = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicU64::new(0));
    for _ in 0..rounds {
        a.push(steps(&mut bare, &act, N));
        b.push(steps(&mut watched, &act, N));
    }
    let (s, n) = (Arc::clone(&stop), Arc::clone(&scrapes));
    let scraper = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            scrape(addr);
            n.fetch_add(1, Ordering::Relaxed);
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    for _ in 0..rounds {
        c.push(steps(&mut watched, &act, N));
    }
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    scraper.join().unwrap();
    let mut bare_scraped = Vec::new();
    let (s2, n2) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (s, n) = (Arc::clone(&s2), Arc::clone(&n2));
    let scraper = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            scrape(addr);
            n.fetch_add(1, Ordering::Relaxed);
        }
    });
    for _ in 0..rounds {
        bare_scraped.push(steps(&mut bare, &act, N));
    }
    s2.store(true, Ordering::Relaxed);
    scraper.join().unwrap();
    println!(
        "Tracker::next (1 pushed source, median of {rounds} x {N} steps): \
         no exporter {:.0} ns; watched, not scraped {:.0} ns; \
         watched, scraped in a loop ({:.0} scrapes/s) {:.0} ns; \
         no exporter while the same loop scrapes {:.0} ns",
        pct(&mut a, 0.5),
        pct(&mut b, 0.5),
        scrapes.load(Ordering::Relaxed) as f64 / secs,
        pct(&mut c, 0.5),
        pct(&mut bare_scraped, 0.5),
    );
}
