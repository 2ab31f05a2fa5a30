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
    start_with(Limits {
        read_timeout,
        ..Limits::default()
    })
}

fn start_with(limits: Limits) -> Exporter {
    Exporter::start(ExporterOptions {
        limits,
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
    // A connection that never sends a request does not hold the stop up.
    let idle = TcpStream::connect(addr).unwrap();
    assert_eq!(get(addr, "/metrics").0, 200);
    let t = Instant::now();
    e.stop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(!e.is_running());
    assert_eq!(e.stop().unwrap_err().kind(), ErrorKind::WrongOrder);
    assert!(TcpStream::connect(addr).is_err());
    wait_closed(&idle, "the idle connection");
    // The port can be taken again.
    let again = Exporter::start(ExporterOptions {
        listen: Some(addr),
        ..ExporterOptions::default()
    });
    assert!(again.is_ok(), "{again:?}");
}

/// Raises the soft open-file limit to the hard one (512 client sockets and
/// their server ends exceed the common default of 1024) and returns it.
fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return 0;
    }
    if l.rlim_cur < l.rlim_max {
        l.rlim_cur = l.rlim_max;
        // SAFETY: a valid rlimit; raising the soft limit up to the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
            // SAFETY: as above.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) };
        }
    }
    l.rlim_cur
}

/// Hostile clients: `idle` connections that send nothing, and `dribbling`
/// ones that each send one byte of a request head that never ends every
/// 100 ms, until dropped.
struct Crowd {
    _idle: Vec<TcpStream>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    dribbler: Option<std::thread::JoinHandle<()>>,
}

impl Crowd {
    fn open(addr: SocketAddr, idle: usize, dribbling: usize) -> Crowd {
        use std::sync::atomic::{AtomicBool, Ordering};
        // A server that stops accepting lets the backlog fill, and then
        // connects hang: fail instead.
        let connect = |_| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .expect("connect: the server no longer accepts connections")
        };
        let idle: Vec<TcpStream> = (0..idle).map(connect).collect();
        let mut slow: Vec<TcpStream> = (0..dribbling).map(connect).collect();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let dribbler = std::thread::spawn(move || {
            let head = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
            let mut sent = 0usize;
            while !flag.load(Ordering::SeqCst) {
                let byte = head.get(sent).copied().unwrap_or(b'a');
                for s in &mut slow {
                    // A connection the server dropped fails here: fine.
                    let _ = s.write_all(&[byte]);
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Crowd {
            _idle: idle,
            stop,
            dribbler: Some(dribbler),
        }
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.dribbler.take() {
            let _ = t.join();
        }
    }
}

/// 256 idle and 256 dribbling connections are open while scrapes are timed.
/// Prometheus gives up on a scrape after 10 s by default; each must take
/// well under that (typically a few ms; 2 s leaves room for a loaded
/// machine).
fn scrapes_stay_prompt_in_a_crowd(limits: Limits) {
    // One crowd at a time: the descriptors of two would not fit a limit of
    // a few thousand.
    static ONE_CROWD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_CROWD.lock().unwrap_or_else(|e| e.into_inner());
    let fds = raise_fd_limit();
    assert!(
        fds >= 2048,
        "the open-file limit ({fds}) is too low for 512 connections and their server ends: raise it (ulimit -n)"
    );
    let e = start_with(limits);
    let addr = e.local_addr();
    let crowd = Crowd::open(addr, 256, 256);
    let mut took = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let (status, body) = get(addr, "/metrics");
        took.push(t.elapsed());
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("memprobe_cache_releases_total"), "{body}");
    }
    drop(crowd);
    eprintln!("scrapes in a crowd of 512 ({limits:?}): {took:?}");
    for t in took {
        assert!(t < Duration::from_secs(2), "a scrape took {t:?}");
    }
}

#[test]
fn idle_and_dribbling_crowds_do_not_delay_scrapes() {
    // Heads may take 30 s and the cap holds all 512: the whole crowd stays
    // open for the whole test, so only the way connections are served can
    // keep the scrapes prompt.
    scrapes_stay_prompt_in_a_crowd(Limits {
        read_timeout: Duration::from_secs(30),
        max_connections: 1024,
        ..Limits::default()
    });
}

#[test]
fn crowds_beyond_the_connection_cap_do_not_delay_scrapes() {
    // The default cap (256) is below the crowd (512): new connections close
    // the oldest idle ones, and the scrapes still get through.
    assert!(Limits::default().max_connections < 512);
    scrapes_stay_prompt_in_a_crowd(Limits {
        read_timeout: Duration::from_secs(30),
        ..Limits::default()
    });
}

/// Whether the server has closed `s` (end of file or an error), without
/// waiting for more than what is already there.
fn closed_by_server(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let closed = match std::io::Read::read(&mut &*s, &mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// Waits (5 s at most) for the server to close `s`.
fn wait_closed(s: &TcpStream, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !closed_by_server(s) {
        assert!(Instant::now() < deadline, "{what} is still open");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_connection_cap_closes_the_oldest_idle_connections() {
    let e = start_with(Limits {
        read_timeout: Duration::from_secs(30),
        max_connections: 8,
        ..Limits::default()
    });
    let addr = e.local_addr();
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // A ninth connection, the scrape, closes the oldest to be served; the
    // server accepts in order, so once it is answered all were accepted.
    assert_eq!(get(addr, "/metrics").0, 200);
    // The oldest is closed...
    wait_closed(&idle[0], "the oldest connection");
    // ...and the 7 younger ones are still waiting for their heads.
    for (i, s) in idle.iter().enumerate().skip(1) {
        assert!(!closed_by_server(s), "connection {i} was closed");
    }
    // 20 more: still at most 8 open (the scrapes above and below are closed
    // after their answers), and the youngest survive.
    let more: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    assert_eq!(get(addr, "/metrics").0, 200);
    let all: Vec<&TcpStream> = idle.iter().chain(&more).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let open: Vec<usize> = (0..all.len())
            .filter(|&i| !closed_by_server(all[i]))
            .collect();
        if open.len() <= 8 {
            // The scrape took one slot and left: the 7 youngest remain.
            assert_eq!(open, (21..28).collect::<Vec<_>>());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} connections open: {open:?}",
            open.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
