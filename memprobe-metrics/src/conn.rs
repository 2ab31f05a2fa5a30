//! One connection of the server: its bytes in and out without blocking,
//! in plain TCP or through TLS, and where it stands.
//!
//! TLS is rustls' sans-I/O `ServerConnection` driven by the same poll loop:
//! the handshake, the request head and the answer move as the socket
//! allows, so a TLS client that stalls mid-handshake costs what a plain one
//! that stalls mid-head costs (a slot, bounded by the head's deadline),
//! never a thread.

use crate::route::{self, Answer};
use rustls::{ServerConfig, ServerConnection};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 4096;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// One connection and where it stands.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    /// `Some` on a TLS listener (until a plain-HTTP client is found there).
    tls: Option<Box<ServerConnection>>,
    /// Whether the first byte was looked at (TLS or a stray HTTP client).
    sniffed: bool,
    /// Accept order: the smallest is the oldest.
    pub(crate) seq: u64,
    /// When the current stage (head, answer) runs out of time.
    pub(crate) deadline: Instant,
    pub(crate) stage: Stage,
}

pub(crate) enum Stage {
    /// Reading the request head: the bytes received so far.
    Head(Vec<u8>),
    /// The head, waiting for its password's check.
    Verifying(String),
    /// Sending the answer: its bytes and how many are sent (through TLS,
    /// the bytes are in the TLS connection already).
    Answer(Vec<u8>, usize),
}

/// What moving a connection on came to.
pub(crate) enum Step {
    /// Waiting for the socket.
    Keep,
    /// Answered, or gone: close it.
    Done,
    /// A whole request head: the caller decides the answer.
    Head(String),
}

/// Where reading a head stands.
enum HeadRead {
    More,
    Gone,
    Head(String),
    Refuse(Answer),
}

impl Conn {
    /// `None` when rustls cannot start a connection (then it is closed).
    pub(crate) fn new(
        stream: TcpStream,
        tls: Option<&Arc<ServerConfig>>,
        seq: u64,
        deadline: Instant,
    ) -> Option<Conn> {
        let tls = match tls {
            Some(c) => Some(Box::new(ServerConnection::new(Arc::clone(c)).ok()?)),
            None => None,
        };
        Some(Conn {
            stream,
            tls,
            sniffed: false,
            seq,
            deadline,
            stage: Stage::Head(Vec::new()),
        })
    }

    /// The descriptor and events to poll for; -1 when nothing is awaited
    /// from the socket (a password being checked).
    pub(crate) fn poll_for(&self) -> (i32, libc::c_short) {
        let fd = self.stream.as_raw_fd();
        match &self.stage {
            Stage::Head(_) => {
                let out = self.tls.as_ref().is_some_and(|t| t.wants_write());
                (fd, libc::POLLIN | if out { libc::POLLOUT } else { 0 })
            }
            Stage::Verifying(_) => (-1, 0),
            Stage::Answer(..) => (fd, libc::POLLOUT),
        }
    }

    /// Moves the connection on after `poll` reported it ready.
    pub(crate) fn progress(&mut self, max_head: usize) -> Step {
        let Stage::Head(buf) = &mut self.stage else {
            return match self.stage {
                Stage::Answer(..) => self.write(),
                _ => Step::Keep,
            };
        };
        if !self.sniffed && self.tls.is_some() {
            let mut first = [0u8; 1];
            match self.stream.peek(&mut first) {
                Ok(0) => return Step::Done,
                Ok(_) => {
                    self.sniffed = true;
                    if first[0] != TLS_HANDSHAKE {
                        // A plain-HTTP client: read its head in plain
                        // HTTP, to tell it so (see `stray_http`).
                        self.tls = None;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Keep,
                Err(_) => return Step::Done,
            }
        }
        let read = match self.tls.as_deref_mut() {
            Some(tls) => read_head_tls(&mut self.stream, tls, buf, max_head),
            None => read_head(&mut self.stream, buf, max_head),
        };
        match read {
            HeadRead::More => self.flush_tls(),
            HeadRead::Gone => Step::Done,
            HeadRead::Head(h) => Step::Head(h),
            HeadRead::Refuse(answer) => {
                let deadline = self.deadline;
                self.answer(&answer, deadline, &[]);
                self.write()
            }
        }
    }

    /// Whether this connection turned out to be plain HTTP on a TLS port.
    pub(crate) fn stray_http(&self) -> bool {
        self.sniffed && self.tls.is_none()
    }

    /// Switches to sending `answer`, due by `deadline`.
    pub(crate) fn answer(
        &mut self,
        answer: &Answer,
        deadline: Instant,
        headers: &[(&'static str, String)],
    ) {
        let bytes = route::bytes(answer, headers);
        self.deadline = deadline;
        match self.tls.as_deref_mut() {
            Some(tls) => {
                // The answer is in memory already: let rustls hold it whole.
                tls.set_buffer_limit(None);
                let _ = tls.writer().write_all(&bytes);
                tls.send_close_notify();
                self.stage = Stage::Answer(Vec::new(), 0);
            }
            None => self.stage = Stage::Answer(bytes, 0),
        }
    }

    /// Sends what the socket takes; `Done` when the answer is out (or
    /// the client gone).
    pub(crate) fn write(&mut self) -> Step {
        if self.tls.is_some() {
            return match self.flush_tls() {
                Step::Keep if self.tls.as_ref().is_some_and(|t| t.wants_write()) => Step::Keep,
                Step::Keep => {
                    let _ = self.stream.shutdown(std::net::Shutdown::Both);
                    Step::Done
                }
                other => other,
            };
        }
        let Stage::Answer(bytes, sent) = &mut self.stage else {
            return Step::Keep;
        };
        while *sent < bytes.len() {
            match self.stream.write(&bytes[*sent..]) {
                Ok(0) => return Step::Done,
                Ok(n) => *sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Step::Done,
            }
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        Step::Done
    }

    /// Writes what TLS has to send, as far as the socket takes it.
    fn flush_tls(&mut self) -> Step {
        let Some(tls) = self.tls.as_deref_mut() else {
            return Step::Keep;
        };
        while tls.wants_write() {
            match tls.write_tls(&mut self.stream) {
                Ok(0) => return Step::Done,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Step::Done,
            }
        }
        Step::Keep
    }
}

/// A head that ends in `buf` (new bytes from `from`), checked as UTF-8.
fn complete(buf: &[u8], from: usize) -> Option<HeadRead> {
    let from = from.saturating_sub(3);
    let end = find_end(&buf[from..])?;
    Some(match std::str::from_utf8(&buf[..from + end]) {
        Ok(head) => HeadRead::Head(head.to_owned()),
        Err(_) => HeadRead::Refuse(route::plain(400, "")),
    })
}

/// Reads what has arrived of the request head into `buf` (at most `max`
/// bytes in all), without blocking.
fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>, max: usize) -> HeadRead {
    read_available(stream, buf, max).unwrap_or(HeadRead::More)
}

/// The same through TLS: records in from the socket, plaintext out of
/// rustls into `buf`.
fn read_head_tls(
    stream: &mut TcpStream,
    tls: &mut ServerConnection,
    buf: &mut Vec<u8>,
    max: usize,
) -> HeadRead {
    loop {
        if let Some(h) = read_available(&mut tls.reader(), buf, max) {
            return h;
        }
        match tls.read_tls(stream) {
            Ok(0) => return HeadRead::Gone,
            Ok(_) => {
                if tls.process_new_packets().is_err() {
                    // Send the alert that says why, if the socket takes it.
                    let _ = tls.write_tls(stream);
                    return HeadRead::Gone;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return HeadRead::More,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return HeadRead::Gone,
        }
    }
}

/// Reads from `from` into `buf` (at most `max` bytes in all) until a head
/// is complete, refused or gone; `None` when `from` has nothing more now.
fn read_available(from: &mut impl Read, buf: &mut Vec<u8>, max: usize) -> Option<HeadRead> {
    loop {
        let len = buf.len();
        if len >= max {
            return Some(HeadRead::Refuse(route::plain(431, "")));
        }
        buf.resize(len + READ_CHUNK.min(max - len), 0);
        let got = from.read(&mut buf[len..]);
        buf.truncate(len + *got.as_ref().unwrap_or(&0));
        match got {
            Ok(0) => return Some(HeadRead::Gone),
            Ok(_) => {
                if let Some(h) = complete(buf, len) {
                    return Some(h);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Some(HeadRead::Gone),
        }
    }
}

/// The end of a head (`\r\n\r\n`, or `\n\n` from lenient clients).
fn find_end(b: &[u8]) -> Option<usize> {
    b.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| b.windows(2).position(|w| w == b"\n\n"))
}
