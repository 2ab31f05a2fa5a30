//! A minimal, bounded HTTP/1.1 server for `/metrics`.
//!
//! Hand-written on `std::net` because the small blocking servers available
//! (tiny_http) read request lines without a size limit, set no read
//! timeouts and start a thread per connection, so one slow or malicious
//! client could hold memory and threads without end. Here:
//!
//! - a fixed number of worker threads accept from one listening socket;
//! - each connection answers one request and is closed;
//! - the request head must arrive whole within [`Limits::read_timeout`] and
//!   fit in [`Limits::max_head`] bytes (else 408 / 431), the body is
//!   ignored, and writing the answer has the same time limit;
//! - only `GET` is served (405 otherwise), only `/metrics` and `/` (404
//!   otherwise).

use memprobe_core::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The bounds a connection is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request head (request line and headers), bytes.
    pub max_head: usize,
    /// Time a client has to send its request head, and again to take the answer.
    pub read_timeout: Duration,
    /// Worker threads: connections served at once.
    pub workers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 8 * 1024,
            read_timeout: Duration::from_secs(2),
            workers: 4,
        }
    }
}

/// What a request is answered with.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) body: String,
    pub(crate) allow: bool,
}

/// Produces the body of `GET /metrics`.
pub(crate) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The running server.
pub(crate) struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// How often an idle worker looks at the stop flag.
const POLL_MS: i32 = 100;

impl Server {
    pub(crate) fn start(addr: SocketAddr, limits: Limits, render: Render) -> Result<Server> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("cannot listen on {addr}"), &e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", &e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("local_addr", &e))?;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for i in 0..limits.workers.max(1) {
            let (l, s, r) = (
                Arc::clone(&listener),
                Arc::clone(&stop),
                Arc::clone(&render),
            );
            let t = std::thread::Builder::new()
                .name(format!("memprobe-http{i}"))
                .spawn(move || worker(&l, &s, limits, &r));
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    stop.store(true, Ordering::SeqCst);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(Error::io("cannot start the HTTP worker threads", &e));
                }
            }
        }
        Ok(Server {
            addr,
            stop,
            threads,
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests in progress finish (each is bounded
    /// by the limits) and joins the workers.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn worker(listener: &TcpListener, stop: &AtomicBool, limits: Limits, render: &Render) {
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the listener outlives the call.
        let n = unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
        if n <= 0 {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => serve(stream, limits, render),
            // Another worker took it, or the client gave up: wait again.
            Err(_) => continue,
        }
    }
}

fn serve(mut stream: TcpStream, limits: Limits, render: &Render) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let deadline = Instant::now() + limits.read_timeout;
    let answer = match read_head(&mut stream, limits.max_head, deadline) {
        Ok(head) => route(&head, render),
        Err(Some(status)) => plain(status, ""),
        Err(None) => return,
    };
    let _ = stream.set_write_timeout(Some(limits.read_timeout));
    let reason = match answer.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let allow = if answer.allow { "Allow: GET\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        answer.status,
        answer.content_type,
        answer.body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(answer.body.as_bytes()))
        .and_then(|()| stream.flush());
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Reads the request head. `Err(Some(status))`: answer with that status;
/// `Err(None)`: the client went away.
fn read_head(
    stream: &mut TcpStream,
    max: usize,
    deadline: Instant,
) -> std::result::Result<String, Option<u16>> {
    let mut buf = vec![0u8; max];
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Some(408));
        }
        if stream.set_read_timeout(Some(left)).is_err() {
            return Err(None);
        }
        if len == max {
            return Err(Some(431));
        }
        match stream.read(&mut buf[len..]) {
            Ok(0) => return Err(None),
            Ok(n) => {
                let from = len.saturating_sub(3);
                len += n;
                if let Some(end) = find_end(&buf[from..len]) {
                    return String::from_utf8(buf[..from + end].to_vec()).map_err(|_| Some(400));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Some(408))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(None),
        }
    }
}

/// The end of a head (`\r\n\r\n`, or `\n\n` from lenient clients).
fn find_end(b: &[u8]) -> Option<usize> {
    b.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| b.windows(2).position(|w| w == b"\n\n"))
}

fn plain(status: u16, body: &str) -> Answer {
    Answer {
        status,
        content_type: "text/plain; charset=utf-8",
        body: body.to_owned(),
        allow: status == 405,
    }
}

const INDEX: &str = "<!DOCTYPE html>\n<html><head><title>memprobe exporter</title></head>\
<body><h1>memprobe exporter</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n";

fn route(head: &str, render: &Render) -> Answer {
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return plain(400, "malformed request line\n");
    };
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return plain(400, "malformed request line\n");
    }
    let path = target.split(['?', '#']).next().unwrap_or("");
    if path != "/metrics" && path != "/" {
        return plain(404, "not found: memprobe serves /metrics\n");
    }
    if method != "GET" {
        return plain(405, "only GET is allowed\n");
    }
    if path == "/" {
        return Answer {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: INDEX.to_owned(),
            allow: false,
        };
    }
    Answer {
        status: 200,
        content_type: crate::text::CONTENT_TYPE,
        body: render(),
        allow: false,
    }
}
