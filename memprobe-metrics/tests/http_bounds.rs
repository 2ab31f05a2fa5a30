//! The endpoint's safety bounds: paths, methods, request size and time,
//! slow clients, a port in use, stopping.

mod common;

use common::{get, raw};
use memprobe_core::ErrorKind;
use memprobe_metrics::{Exporter, ExporterOptions, Limits};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn start(read_timeout: Duration) -> Exporter {
    Exporter::start(ExporterOptions {
        limits: Limits {
            read_timeout,
            ..Limits::default()
        },
        hostname: Some("testhost".into()),
        ..ExporterOptions::default()
    })
    .expect("start")
}

#[test]
fn binds_loopback_by_default_and_routes() {
    let e = start(Duration::from_secs(2));
    assert!(e.local_addr().ip().is_loopback());
    assert_ne!(e.port(), 0);
    let (status, body) = get(e.local_addr(), "/metrics");
    assert_eq!(status, 200);
    assert!(
        body.contains("# TYPE memprobe_cache_releases_total counter"),
        "{body}"
    );
    let (status, body) = get(e.local_addr(), "/metrics?x=1");
    assert_eq!(status, 200, "{body}");
    let (status, body) = get(e.local_addr(), "/");
    assert_eq!(status, 200);
    assert!(body.contains("/metrics"));
    assert_eq!(get(e.local_addr(), "/metricsx").0, 404);
    assert_eq!(get(e.local_addr(), "/../etc/passwd").0, 404);
    for m in ["POST", "PUT", "DELETE", "HEAD", "OPTIONS"] {
        let (status, _) = raw(
            e.local_addr(),
            format!("{m} /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").as_bytes(),
        );
        assert_eq!(status, 405, "{m}");
    }
    assert_eq!(raw(e.local_addr(), b"GARBAGE\r\n\r\n").0, 400);
    assert_eq!(raw(e.local_addr(), b"GET /metrics SPDY/9\r\n\r\n").0, 400);
}

#[test]
fn oversized_head_is_refused() {
    let e = start(Duration::from_secs(2));
    let mut req = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    req.extend(std::iter::repeat(b'a').take(64 * 1024));
    req.extend(b"\r\n\r\n");
    let mut s = TcpStream::connect(e.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The server may close before reading it all: a failed write is fine.
    let _ = s.write_all(&req);
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut s, &mut text);
    assert!(text.is_empty() || common::parse(&text).0 == 431, "{text}");
    // Just within the limit: served.
    let mut ok = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    ok.extend(std::iter::repeat(b'a').take(7 * 1024));
    ok.extend(b"\r\n\r\n");
    assert_eq!(raw(e.local_addr(), &ok).0, 200);
    // One byte over, sent slowly enough to be read in full: 431.
    let mut over = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    over.extend(std::iter::repeat(b'a').take(8 * 1024));
    let mut s = TcpStream::connect(e.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&over).unwrap();
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut s, &mut text);
    assert_eq!(common::parse(&text).0, 431, "{text}");
}

fn timed_get(addr: SocketAddr) -> Duration {
    let t = Instant::now();
    assert_eq!(get(addr, "/metrics").0, 200);
    t.elapsed()
}

#[test]
fn slow_clients_do_not_stall_others() {
    let e = start(Duration::from_millis(1500));
    let addr = e.local_addr();
    // Connects and sends nothing.
    let _idle = TcpStream::connect(addr).unwrap();
    // Trickles a byte at a time.
    let trickle = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        for b in b"GET /metrics HTTP/1.1\r\n" {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut text = String::new();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = std::io::Read::read_to_string(&mut s, &mut text);
        text
    });
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..5 {
        let took = timed_get(addr);
        assert!(took < Duration::from_millis(500), "took {took:?}");
    }
    // The trickling client runs out of time: 408, within the limit.
    let text = trickle.join().unwrap();
    assert_eq!(common::parse(&text).0, 408, "{text}");
}

#[test]
fn idle_connection_gets_408_after_the_timeout() {
    let e = start(Duration::from_millis(300));
    let mut s = TcpStream::connect(e.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut s, &mut text);
    let took = t.elapsed();
    assert_eq!(common::parse(&text).0, 408, "{text}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn port_in_use_is_a_clear_error() {
    let e = start(Duration::from_secs(2));
    let err = Exporter::start(ExporterOptions {
        listen: Some(e.local_addr()),
        ..ExporterOptions::default()
    })
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(
        err.message().contains("cannot listen on 127.0.0.1:"),
        "{err}"
    );
    assert!(err.message().to_lowercase().contains("in use"), "{err}");
}

#[test]
fn stop_frees_the_port_and_twice_is_wrong_order() {
    let mut e = start(Duration::from_secs(2));
    let addr = e.local_addr();
    let t = Instant::now();
    e.stop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(!e.is_running());
    assert_eq!(e.stop().unwrap_err().kind(), ErrorKind::WrongOrder);
    assert!(TcpStream::connect(addr).is_err());
    // The port can be taken again.
    let again = Exporter::start(ExporterOptions {
        listen: Some(addr),
        ..ExporterOptions::default()
    });
    assert!(again.is_ok(), "{again:?}");
}
