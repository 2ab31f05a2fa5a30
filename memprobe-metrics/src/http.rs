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
//! - with a web configuration ([`crate::web_config`]): TLS through rustls
//!   in the same loop ([`crate::conn`]), basic authentication with bcrypt
//!   run on one worker thread behind a bounded queue
//!   ([`crate::basic_auth`]), the file re-read when it changes
//!   ([`crate::web_reload`]).
//!
//! Memory is bounded by `max_connections` × (`max_head` + one answer);
//! threads by two (the loop, and the password checker once needed).

use crate::basic_auth::{Check, Worker};
use crate::conn::{Conn, Stage, Step};
pub(crate) use crate::route::Render;
use crate::route::{self, Answer};
use crate::web_reload::{Watched, Web};
use memprobe_core::internal::lock::Lock;
use memprobe_core::{Error, Result};
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The bounds a connection is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request head (request line and headers), bytes.
    pub max_head: usize,
    /// Time a client has to send its request head (and finish the TLS
    /// handshake, and have its password checked), and again to take the answer.
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

/// What the exporter sees of a web configuration being served.
#[derive(Clone)]
pub(crate) struct WebShared {
    /// Whether new connections are served over TLS now.
    pub(crate) tls: Arc<AtomicBool>,
    /// The last refused re-read, until a good one.
    pub(crate) error: Arc<Lock<Option<Error>>>,
}

/// The running server.
pub(crate) struct Server {
    addr: SocketAddr,
    /// Closed to stop the loop: its peer then reads end of file, which wakes
    /// `poll` at once. (Closing, not writing: a write after the loop ended
    /// would raise SIGPIPE in a C host that has not ignored it.)
    wake: UnixStream,
    thread: JoinHandle<()>,
    web: Option<WebShared>,
}

/// Connections accepted per turn of the loop, so that a flood of connects
/// cannot starve the connections already open.
const ACCEPT_BURST: usize = 64;

/// How long accepting pauses when the process is out of descriptors and no
/// connection of ours can be closed to make room.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Fixed entries at the head of the poll set: the stop socket, the
/// listener, the password checker's wake-up socket.
const FIXED: usize = 3;

impl Server {
    pub(crate) fn start(
        addr: SocketAddr,
        limits: Limits,
        render: Render,
        web: Option<(Web, Watched)>,
    ) -> Result<Server> {
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
        let (shared, web) = match web {
            Some((current, watched)) => {
                let shared = WebShared {
                    tls: Arc::new(AtomicBool::new(current.tls.is_some())),
                    error: Arc::clone(&watched.error),
                };
                let runtime = WebRuntime {
                    current,
                    watched,
                    worker: None,
                    verdicts: None,
                    tls: Arc::clone(&shared.tls),
                };
                (Some(shared), Some(runtime))
            }
            None => (None, None),
        };
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
            web,
        };
        let thread = std::thread::Builder::new()
            .name("memprobe-http".into())
            .spawn(move || server.run())
            .map_err(|e| Error::io("cannot start the HTTP thread", &e))?;
        Ok(Server {
            addr,
            wake,
            thread,
            web: shared,
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The web configuration's state, when one is served.
    pub(crate) fn web(&self) -> Option<&WebShared> {
        self.web.as_ref()
    }

    /// Stops serving: closes the listening socket and the connections that
    /// have not sent a whole request, lets answers in progress finish (each
    /// within the limits) and joins the thread (it wakes at once).
    pub(crate) fn stop(self) {
        drop(self.wake);
        let _ = self.thread.join();
    }
}

/// The web configuration in force, its watch, and the password checker.
struct WebRuntime {
    current: Web,
    watched: Watched,
    /// Started at the first password that needs bcrypt.
    worker: Option<Worker>,
    /// The worker's wake-up socket, polled by the loop.
    verdicts: Option<UnixStream>,
    tls: Arc<AtomicBool>,
}

impl WebRuntime {
    /// Queues a password check for connection `seq`; false when it cannot
    /// be (the queue is full, or no worker could start).
    fn submit(&mut self, seq: u64, mut job: crate::basic_auth::Job, deadline: Instant) -> bool {
        if self.worker.is_none() {
            let Ok((theirs, ours)) = UnixStream::pair() else {
                return false;
            };
            if theirs.set_nonblocking(true).is_err() || ours.set_nonblocking(true).is_err() {
                return false;
            }
            match Worker::start(theirs) {
                Ok(w) => {
                    self.worker = Some(w);
                    self.verdicts = Some(ours);
                }
                Err(_) => return false,
            }
        }
        job.generation = self.current.generation;
        self.worker
            .as_ref()
            .is_some_and(|w| w.submit(seq, job, deadline))
    }
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
    web: Option<WebRuntime>,
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// The answer to a whole head, or `None` when it waits for its password's
/// check (queued for connection `seq`).
fn respond(
    head: &str,
    stray_http: bool,
    web: &mut Option<WebRuntime>,
    render: &Render,
    seq: u64,
    deadline: Instant,
) -> Option<Answer> {
    if stray_http {
        return Some(route::http_to_https());
    }
    let req = match route::parse(head) {
        Ok(r) => r,
        Err(answer) => return Some(answer),
    };
    if let Some(w) = web.as_mut() {
        let excluded = w.current.excluded_paths.iter().any(|p| p == req.path);
        if let Some(auth) = w.current.auth.as_ref().filter(|_| !excluded) {
            match auth.check(route::header(head, "authorization")) {
                Check::Allow => {}
                Check::Deny => return Some(route::unauthorized()),
                Check::Verify(job) => {
                    return if w.submit(seq, job, deadline) {
                        None
                    } else {
                        Some(route::busy())
                    };
                }
            }
        }
    }
    Some(route::route(&req, render))
}

fn headers(web: &Option<WebRuntime>) -> &[(&'static str, String)] {
    web.as_ref().map_or(&[], |w| w.current.headers.as_slice())
}

impl Loop {
    fn run(&mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            let now = Instant::now();
            self.expire(now);
            self.reload(now);
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
            let verdict_fd = self
                .web
                .as_ref()
                .and_then(|w| w.verdicts.as_ref())
                .map_or(-1, AsRawFd::as_raw_fd);
            fds.push(pollfd(verdict_fd, libc::POLLIN));
            fds.extend(self.conns.iter().map(|c| {
                let (fd, events) = c.poll_for();
                pollfd(fd, events)
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
            let (limits, render, web) = (self.limits, &self.render, &mut self.web);
            let mut revents = fds[FIXED..].iter().map(|p| p.revents);
            self.conns.retain_mut(|c| {
                let r = revents.next().unwrap_or(0);
                if r == 0 {
                    return true;
                }
                match c.progress(limits.max_head) {
                    Step::Keep => true,
                    Step::Done => false,
                    Step::Head(head) => {
                        let deadline = now + limits.read_timeout;
                        match respond(&head, c.stray_http(), web, render, c.seq, deadline) {
                            Some(answer) => {
                                c.answer(&answer, deadline, headers(web));
                                !matches!(c.write(), Step::Done)
                            }
                            None => {
                                c.stage = Stage::Verifying(head);
                                true
                            }
                        }
                    }
                }
            });
            if fds[2].revents != 0 {
                self.settle(now);
            }
            if fds[1].revents != 0 {
                self.accept(now);
            }
        }
    }

    /// Re-reads the web configuration when its files changed.
    fn reload(&mut self, now: Instant) {
        let Some(w) = self.web.as_mut() else {
            return;
        };
        if let Some(new) = w.watched.poll(now) {
            w.tls.store(new.tls.is_some(), Ordering::Relaxed);
            w.current = new;
        }
    }

    /// Answers the connections whose passwords were checked.
    fn settle(&mut self, now: Instant) {
        let Some(w) = self.web.as_mut() else {
            return;
        };
        if let Some(s) = w.verdicts.as_mut() {
            let mut sink = [0u8; 256];
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        }
        let Some(worker) = w.worker.as_ref() else {
            return;
        };
        let verdicts: Vec<_> = worker.verdicts().collect();
        for v in verdicts {
            if let (Some(ok), Some(auth)) = (v.ok, w.current.auth.as_mut()) {
                if v.generation == w.current.generation {
                    auth.settle(&v.user, v.tag, ok);
                }
            }
            let Some(c) = self
                .conns
                .iter_mut()
                .find(|c| c.seq == v.seq && matches!(c.stage, Stage::Verifying(_)))
            else {
                continue;
            };
            let Stage::Verifying(head) = std::mem::replace(&mut c.stage, Stage::Head(Vec::new()))
            else {
                continue;
            };
            let answer = match v.ok {
                Some(true) => match route::parse(&head) {
                    Ok(req) => route::route(&req, &self.render),
                    Err(a) => a,
                },
                Some(false) => route::unauthorized(),
                None => route::busy(),
            };
            c.answer(&answer, now + self.limits.read_timeout, &w.current.headers);
            // Sent when poll says the socket takes it.
        }
    }

    /// Answers heads that ran out of time with 408 (and password checks
    /// with 503); closes connections whose answer ran out of time.
    fn expire(&mut self, now: Instant) {
        let timeout = self.limits.read_timeout;
        let headers = headers(&self.web).to_vec();
        self.conns.retain_mut(|c| {
            if c.deadline > now {
                return true;
            }
            match c.stage {
                Stage::Head(_) => {
                    c.answer(&route::plain(408, ""), now + timeout, &headers);
                    true
                }
                Stage::Verifying(_) => {
                    c.answer(&route::busy(), now + timeout, &headers);
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
            .chain(self.web.as_ref().map(|w| w.watched.next_check))
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
        let tls = self.web.as_ref().and_then(|w| w.current.tls.as_ref());
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
                    let deadline = now + self.limits.read_timeout;
                    if let Some(c) = Conn::new(stream, tls, self.next_seq, deadline) {
                        self.conns.push(c);
                    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{Ipv4Addr, TcpStream};

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
        let server = Server::start(addr, Limits::default(), render, None).unwrap();
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
