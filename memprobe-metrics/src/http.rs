//! A minimal, bounded HTTP/1.1 server for `/metrics`.
//!
//! Hand-written on `std::net` and `poll(2)` because the small blocking
//! servers available (tiny_http) read request lines without a size limit,
//! set no read timeouts and start a thread per connection, so one slow or
//! malicious client could hold memory and threads without end. Here:
//!
//! - one thread serves every connection from one `poll` loop: it accepts,
//!   reads request heads without blocking, renders and writes answers
//!   without blocking. A connection that sends nothing, or a byte at a time,
//!   costs a slot in the poll set, not a thread, so it cannot delay anyone
//!   else's scrape (a pool of blocking workers can be stalled by as many
//!   silent clients as it has workers);
//! - at most [`Limits::max_connections`] connections are open at once; a new
//!   one beyond that closes the oldest connection still sending its head
//!   (a scraper sends its head at once, so the oldest is the idlest), and a
//!   process out of descriptors does the same;
//! - each connection answers one request and is closed;
//! - the request head must arrive whole within [`Limits::read_timeout`] and
//!   fit in [`Limits::max_head`] bytes (else 408 / 431), the body is
//!   ignored, and writing the answer has the same time limit;
//! - only `GET` is served (405 otherwise), only `/metrics` and `/` (404
//!   otherwise).
//!
//! Memory is bounded by `max_connections` × (`max_head` + one answer);
//! threads by one.

use memprobe_core::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
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
    /// Connections open at once. A new connection beyond it closes the
    /// oldest one still sending its head (or, when every one is taking an
    /// answer, the oldest).
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 8 * 1024,
            read_timeout: Duration::from_secs(2),
            max_connections: 256,
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
    /// Closed to stop the loop: its peer then reads end of file, which wakes
    /// `poll` at once. (Closing, not writing: a write after the loop ended
    /// would raise SIGPIPE in a C host that has not ignored it.)
    wake: UnixStream,
    thread: JoinHandle<()>,
}

/// Connections accepted per turn of the loop, so that a flood of connects
/// cannot starve the connections already open.
const ACCEPT_BURST: usize = 64;

/// How long accepting pauses when the process is out of descriptors and no
/// connection of ours can be closed to make room.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 4096;

impl Server {
    pub(crate) fn start(addr: SocketAddr, limits: Limits, render: Render) -> Result<Server> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("cannot listen on {addr}"), &e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", &e))?;
        // std listens with a backlog of 128: a burst of connects beyond it
        // has SYNs dropped and retried a second later. Linux lets a second
        // listen() raise it (capped by net.core.somaxconn); failing is harmless.
        // SAFETY: a valid listening socket.
        unsafe { libc::listen(listener.as_raw_fd(), libc::SOMAXCONN) };
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("local_addr", &e))?;
        let (wake, woken) =
            UnixStream::pair().map_err(|e| Error::io("cannot create the wake-up socket", &e))?;
        woken
            .set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", &e))?;
        let mut server = Loop {
            listener: Some(listener),
            woken,
            limits: Limits {
                max_head: limits.max_head.max(1),
                max_connections: limits.max_connections.max(1),
                ..limits
            },
            render,
            conns: Vec::new(),
            next_seq: 0,
            accept_paused_until: None,
        };
        let thread = std::thread::Builder::new()
            .name("memprobe-http".into())
            .spawn(move || server.run())
            .map_err(|e| Error::io("cannot start the HTTP thread", &e))?;
        Ok(Server { addr, wake, thread })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving: closes the listening socket and the connections that
    /// have not sent a whole request, lets answers in progress finish (each
    /// within the limits) and joins the thread (it wakes at once).
    pub(crate) fn stop(self) {
        drop(self.wake);
        let _ = self.thread.join();
    }
}

/// One connection and where it stands.
struct Conn {
    stream: TcpStream,
    /// Accept order: the smallest is the oldest.
    seq: u64,
    /// When the current stage (head, answer) runs out of time.
    deadline: Instant,
    stage: Stage,
}

enum Stage {
    /// Reading the request head: the bytes received so far.
    Head(Vec<u8>),
    /// Sending the answer: its bytes and how many are sent.
    Answer(Vec<u8>, usize),
}

/// The server's state, owned by its thread.
struct Loop {
    /// `None` once stopping: the port is free again.
    listener: Option<TcpListener>,
    woken: UnixStream,
    limits: Limits,
    render: Render,
    conns: Vec<Conn>,
    next_seq: u64,
    accept_paused_until: Option<Instant>,
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

impl Loop {
    fn run(&mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            let now = Instant::now();
            self.expire(now);
            let listening = self.accept_paused_until.map_or(true, |t| t <= now);
            if listening {
                self.accept_paused_until = None;
            }
            let stopping = self.listener.is_none();
            if stopping && self.conns.is_empty() {
                return;
            }
            fds.clear();
            // A negative descriptor is ignored by poll: once stopping,
            // neither the wake-up socket nor the listener is watched.
            let fd_or_skip = |fd: RawFd| if stopping { -1 } else { fd };
            fds.push(pollfd(fd_or_skip(self.woken.as_raw_fd()), libc::POLLIN));
            let listen_fd = self.listener.as_ref().map_or(-1, AsRawFd::as_raw_fd);
            let listen_events = if listening { libc::POLLIN } else { 0 };
            fds.push(pollfd(listen_fd, listen_events));
            fds.extend(self.conns.iter().map(|c| {
                let events = match c.stage {
                    Stage::Head(_) => libc::POLLIN,
                    Stage::Answer(..) => libc::POLLOUT,
                };
                pollfd(c.stream.as_raw_fd(), events)
            }));
            let timeout = self.timeout_ms(now);
            // SAFETY: `fds` is a valid array of `fds.len()` pollfds whose
            // descriptors stay open for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
                    // Not expected (EINVAL/ENOMEM): do not spin on it.
                    std::thread::sleep(ACCEPT_PAUSE);
                }
                continue;
            }
            if fds[0].revents != 0 {
                // `stop` closed the other end: free the port, drop
                // the connections without a request, finish the answers.
                self.listener = None;
                self.conns.retain(|c| matches!(c.stage, Stage::Answer(..)));
                continue;
            }
            let now = Instant::now();
            let (limits, render) = (self.limits, &self.render);
            let mut revents = fds[2..].iter().map(|p| p.revents);
            self.conns.retain_mut(|c| {
                let r = revents.next().unwrap_or(0);
                r == 0 || c.progress(limits, render, now)
            });
            if fds[1].revents != 0 {
                self.accept(now);
            }
        }
    }

    /// Answers heads that ran out of time with 408; closes connections
    /// whose answer ran out of time.
    fn expire(&mut self, now: Instant) {
        let timeout = self.limits.read_timeout;
        self.conns.retain_mut(|c| {
            if c.deadline > now {
                return true;
            }
            match c.stage {
                Stage::Head(_) => {
                    c.answer(&plain(408, ""), now + timeout);
                    true
                }
                Stage::Answer(..) => false,
            }
        });
    }

    /// Milliseconds until the next deadline (rounded up, so the loop wakes
    /// after it, not just before); -1 (no timeout) when nothing is due.
    fn timeout_ms(&self, now: Instant) -> libc::c_int {
        let next = self
            .conns
            .iter()
            .map(|c| c.deadline)
            .chain(self.accept_paused_until)
            .min();
        next.map_or(-1, |t| {
            let ms = t
                .saturating_duration_since(now)
                .as_nanos()
                .div_ceil(1_000_000);
            libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
        })
    }

    fn accept(&mut self, now: Instant) {
        let Some(listener) = self.listener.as_ref() else {
            return;
        };
        for _ in 0..ACCEPT_BURST {
            match listener.accept() {
                Ok((stream, _)) => {
                    // Accepted sockets do not inherit O_NONBLOCK on Linux.
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    if self.conns.len() >= self.limits.max_connections {
                        close_oldest(&mut self.conns);
                    }
                    self.conns.push(Conn {
                        stream,
                        seq: self.next_seq,
                        deadline: now + self.limits.read_timeout,
                        stage: Stage::Head(Vec::new()),
                    });
                    self.next_seq += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    // Out of descriptors or memory: make room by closing
                    // our oldest connection, else wait before trying again
                    // (the pending connection stays readable: no spinning).
                    if !close_oldest(&mut self.conns) {
                        self.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    }
                    return;
                }
                // The client gave up before it was accepted: the next one.
                Err(_) => {}
            }
        }
    }
}

/// Closes the oldest connection still sending its head, else the
/// oldest of all. False when there is none.
fn close_oldest(conns: &mut Vec<Conn>) -> bool {
    let oldest = |head_only: bool| {
        conns
            .iter()
            .enumerate()
            .filter(|(_, c)| !head_only || matches!(c.stage, Stage::Head(_)))
            .min_by_key(|(_, c)| c.seq)
            .map(|(i, _)| i)
    };
    match oldest(true).or_else(|| oldest(false)) {
        Some(i) => {
            conns.swap_remove(i);
            true
        }
        None => false,
    }
}

impl Conn {
    /// Moves the connection on after `poll` reported it ready; false when
    /// it is done (answered, or gone) and must be closed.
    fn progress(&mut self, limits: Limits, render: &Render, now: Instant) -> bool {
        if let Stage::Head(buf) = &mut self.stage {
            let answer = match read_head(&mut self.stream, buf, limits.max_head) {
                HeadRead::More => return true,
                HeadRead::Gone => return false,
                HeadRead::Head(head) => route(&head, render),
                HeadRead::Refuse(status) => plain(status, ""),
            };
            self.answer(&answer, now + limits.read_timeout);
        }
        self.write()
    }

    /// Switches to sending `answer`, due by `deadline`.
    fn answer(&mut self, answer: &Answer, deadline: Instant) {
        let reason = match answer.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            _ => "Error",
        };
        let allow = if answer.allow { "Allow: GET\r\n" } else { "" };
        let mut bytes = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
            answer.status,
            answer.content_type,
            answer.body.len()
        )
        .into_bytes();
        bytes.extend_from_slice(answer.body.as_bytes());
        self.stage = Stage::Answer(bytes, 0);
        self.deadline = deadline;
    }

    /// Sends what the socket takes; false when the answer is out (or the
    /// client gone): the connection is done.
    fn write(&mut self) -> bool {
        let Stage::Answer(bytes, sent) = &mut self.stage else {
            return true;
        };
        while *sent < bytes.len() {
            match self.stream.write(&bytes[*sent..]) {
                Ok(0) => return false,
                Ok(n) => *sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        false
    }
}

/// Where reading a head stands.
enum HeadRead {
    /// Not complete yet: wait for more.
    More,
    /// The client went away (or failed) before a whole head.
    Gone,
    /// The whole head.
    Head(String),
    /// Answer with this status.
    Refuse(u16),
}

/// Reads what has arrived of the request head into `buf` (at most `max`
/// bytes in all), without blocking.
fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>, max: usize) -> HeadRead {
    loop {
        let len = buf.len();
        if len >= max {
            return HeadRead::Refuse(431);
        }
        buf.resize(len + READ_CHUNK.min(max - len), 0);
        let got = stream.read(&mut buf[len..]);
        buf.truncate(len + *got.as_ref().unwrap_or(&0));
        match got {
            Ok(0) => return HeadRead::Gone,
            Ok(_) => {
                let from = len.saturating_sub(3);
                if let Some(end) = find_end(&buf[from..]) {
                    return match std::str::from_utf8(&buf[..from + end]) {
                        Ok(head) => HeadRead::Head(head.to_owned()),
                        Err(_) => HeadRead::Refuse(400),
                    };
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return HeadRead::More,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return HeadRead::Gone,
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
    // One thread serves every connection: a panic while reading a source
    // must cost this scrape (500), not the server.
    match catch_unwind(AssertUnwindSafe(|| render())) {
        Ok(body) => Answer {
            status: 200,
            content_type: crate::text::CONTENT_TYPE,
            body,
            allow: false,
        },
        Err(_) => plain(500, "rendering the metrics failed\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn get(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text
    }

    #[test]
    fn a_panic_while_rendering_costs_the_scrape_not_the_server() {
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c = Arc::clone(&calls);
        let render: Render = Arc::new(move || {
            if c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                panic!("a source panicked");
            }
            "up 1\n".to_owned()
        });
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let server = Server::start(addr, Limits::default(), render).unwrap();
        let first = get(server.local_addr());
        assert!(first.starts_with("HTTP/1.1 500 "), "{first}");
        let second = get(server.local_addr());
        assert!(
            second.starts_with("HTTP/1.1 200 ") && second.ends_with("up 1\n"),
            "{second}"
        );
        server.stop();
    }
}
