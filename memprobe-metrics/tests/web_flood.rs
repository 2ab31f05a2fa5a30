//! The exporter behind TLS and basic auth under load: 1,000 requests with
//! wrong passwords and 64 slow clients, then a good scrape; no thread or
//! descriptor left behind; oversized headers refused. A test binary of its
//! own, so that the thread and descriptor counts are this test's alone.

mod common;

#[path = "common/pki.rs"]
mod pki;
#[path = "common/tls_client.rs"]
mod tls_client;

use memprobe_core::Source;
use memprobe_metrics::{Exporter, ExporterOptions};
use pki::Pki;
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls_client::{basic, config, get};

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn a_flood_of_wrong_passwords_and_slow_clients_leaves_scrapes_answered() {
    if !pki::openssl_installed() {
        common::required_tool::skip_or_fail(
            "flood",
            "openssl not installed (apt-get install openssl)",
        );
        return;
    }
    let p =
        Pki::new(&std::env::temp_dir().join(format!("memprobe-web-flood-{}", std::process::id())));
    let file = p.dir.join("web.yml");
    // Cost 10, as htpasswd -B makes it: each check ~50-100 ms here.
    let h = bcrypt::hash("right", 10).unwrap();
    std::fs::write(
        &file,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  prometheus: '{h}'\n"
        ),
    )
    .unwrap();
    let e = Exporter::start(ExporterOptions {
        web_config: Some(file),
        ..ExporterOptions::default()
    })
    .unwrap();
    e.add_source(&Source::system_ram().unwrap()).unwrap();
    let addr = e.local_addr();
    let c = config(&p.ca, None);
    let good = basic("prometheus", "right");
    // Prometheus' first scrape pays bcrypt once (and starts the checker).
    assert_eq!(get(addr, &c, "/metrics", &good).unwrap().0, 200);
    std::thread::sleep(Duration::from_millis(200));
    let (threads, fds) = (count("/proc/self/task"), count("/proc/self/fd"));

    // 64 slow clients: half send nothing, half dribble a TLS record.
    let mut slow: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for s in slow.iter_mut().skip(32) {
        let _ = s.write_all(&[0x16, 0x03]);
    }
    // 1,000 requests with wrong passwords (all different: no cache helps),
    // from 40 clients at once: more than the checker's queue holds.
    let t0 = Instant::now();
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..40)
            .map(|w| {
                let c = Arc::clone(&c);
                scope.spawn(move || {
                    (0..25)
                        .map(|i| {
                            let h = basic("prometheus", &format!("guess-{w}-{i}"));
                            get(addr, &c, "/metrics", &h).map_or(0, |(s, _)| s)
                        })
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        // A scrape in the middle of the flood: its password is cached.
        let c = Arc::clone(&c);
        let good = good.clone();
        let during = scope.spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            let t = Instant::now();
            let status = get(addr, &c, "/metrics", &good).map_or(0, |(s, _)| s);
            (status, t.elapsed())
        });
        let statuses = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        let (status, took) = during.join().unwrap();
        eprintln!(
            "flood: a good scrape during the flood: {status} in {:.1} ms",
            took.as_secs_f64() * 1e3
        );
        assert_eq!(status, 200, "a good scrape during the flood");
        assert!(
            took < Duration::from_secs(2),
            "a good scrape during the flood took {took:?}"
        );
        statuses
    });
    let flood = t0.elapsed();
    assert_eq!(statuses.len(), 1000);
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 503),
        "every wrong password is refused or deferred: {:?}",
        statuses
            .iter()
            .filter(|s| **s != 401 && **s != 503)
            .collect::<Vec<_>>()
    );
    let refused = statuses.iter().filter(|s| **s == 401).count();
    // The good scrape, with the slow clients still open.
    let t1 = Instant::now();
    let (status, _) = get(addr, &c, "/metrics", &good).unwrap();
    let took = t1.elapsed();
    eprintln!(
        "flood: 1000 wrong passwords in {:.1} s ({refused} checked by bcrypt and refused, {} deferred with 503), \
         64 slow clients open; then a good scrape over TLS in {:.1} ms",
        flood.as_secs_f64(),
        1000 - refused,
        took.as_secs_f64() * 1e3
    );
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(2), "a good scrape took {took:?}");

    // Oversized headers are refused over TLS too.
    let big = format!("X-Pad: {}\r\n", "a".repeat(9000));
    assert_eq!(
        get(addr, &c, "/metrics", &format!("{good}{big}"))
            .unwrap()
            .0,
        431
    );

    // No thread or descriptor left behind once the clients are gone.
    drop(slow);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = (count("/proc/self/task"), count("/proc/self/fd"));
        if now.0 <= threads && now.1 <= fds {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "threads {threads} -> {}, descriptors {fds} -> {}",
            now.0,
            now.1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
