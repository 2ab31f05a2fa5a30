//! `memprobe serve` and `memprobe run --serve`: /metrics over HTTP, clean exit.

use crate::support::memprobe;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The response to `GET path` from the server at `addr`, whole.
pub(crate) fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// The address a `memprobe serve` child says it listens on (its stderr
/// piped).
pub(crate) fn announced(child: &mut Child) -> String {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("serve announces its address").unwrap();
        if let Some(rest) = line.strip_prefix("memprobe: serving http://") {
            break rest.trim_end_matches("/metrics").to_owned();
        }
    }
}

#[test]
fn serve_exports_the_node_and_stops_on_sigterm() {
    let mut child = memprobe()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("MEMPROBE_GPU_BACKEND", "none")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = announced(&mut child);
    let text = get(&addr, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("kind=\"system_ram\""), "{text}");
    assert!(
        text.contains("# TYPE memprobe_source_used_bytes gauge"),
        "{text}"
    );
    assert!(get(&addr, "/x").starts_with("HTTP/1.1 404"));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let t = Instant::now();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn serve_reports_a_port_in_use() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = memprobe()
        .args(["serve", "--listen", &addr])
        .env("MEMPROBE_GPU_BACKEND", "none")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot listen on") && err.contains("in use"),
        "{err}"
    );
}

#[test]
fn run_serve_exports_the_tree() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = memprobe()
        .args(["run", "--no-live", "--serve", &addr, "--", "sleep", "3"])
        .env("MEMPROBE_GPU_BACKEND", "none")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let text = loop {
        if let Ok(mut s) = TcpStream::connect(&addr) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(s, "GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            break text;
        }
        assert!(Instant::now() < deadline, "run --serve did not listen");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text.contains("kind=\"process_tree\""), "{text}");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
