//! The channel from a traced program to `memprobe run`: every
//! [`Tracker`](crate::Tracker) sends its phase boundaries and records to
//! the Unix datagram socket named by [`ENV`] (`MEMPROBE_RUN_CHANNEL`), one
//! JSON object per datagram, so the run's summary, JSON and chart can show
//! the program's epochs and steps.
//!
//! The training thread is never blocked or slowed for it:
//!
//! - the variable is read once per process, at the first phase boundary;
//!   unset, a boundary costs one atomic load;
//! - the socket is unbound and non-blocking (`SOCK_DGRAM | SOCK_CLOEXEC |
//!   SOCK_NONBLOCK`), connected to the receiver once when it exists (which
//!   spares the kernel a path lookup per message) and otherwise given the
//!   address at each send; each datagram goes out with one `send` (or
//!   `sendto`) with `MSG_DONTWAIT | MSG_NOSIGNAL`; when the receiver's
//!   queue is full or it is gone (`EAGAIN`, `ENOBUFS`, `ECONNREFUSED`,
//!   `ENOENT`, `ENOTCONN`) the message is dropped and counted, and the next
//!   one that gets through carries the count (`dropped`), so the receiver
//!   knows what it lost;
//! - once the receiver is gone (`ENOENT`, `ECONNREFUSED`, `ENOTCONN`), the
//!   next [`GONE_SKIP`] messages are counted as dropped without a system
//!   call; a receiver bound at the path later is reached by address;
//! - nothing is printed, nothing panics.
//!
//! A forked child keeps the socket (datagrams need no connection) and sends
//! with its own pid, taken at each send; its counters start again at 0.
//! The times are `CLOCK_MONOTONIC` nanoseconds, which the receiver shares.
//!
//! # Messages (version [`VERSION`])
//!
//! Every message has `"v"` (the version), `"ev"` (`"begin"` or `"end"`),
//! `"pid"`, `"tracker"` (the tracker's number in its process, from 1),
//! `"seq"` (the message's number in its process, from 0, dropped ones
//! included), `"dropped"` (messages of this process dropped before this
//! one), `"kind"` (`step`, `epoch`, `experience`, `stream`, `custom`),
//! `"name"` (the kind's name, or a custom phase's), `"index"` (the phase's
//! number among its kind and name, from 0) and `"depth"` (phases enclosing
//! it). Then:
//!
//! - `begin`: `"t_ns"`, when the phase began;
//! - `end`: `"started_ns"`, `"ended_ns"`, `"next"` (true when a phase of
//!   the same kind and name, numbered `index + 1`, began at `ended_ns`:
//!   [`Tracker::next`](crate::Tracker::next) sends one message per step
//!   boundary), `"releases"` (cache releases fired at its end), `"sources"`
//!   (per source: `name`, `kind`, `fidelity`, `used_start`, `used_end`,
//!   `peak`, `delta_used`, `delta_peaked`, in bytes) and `"truncated"` (true
//!   when sources were left out to keep the datagram under
//!   [`MAX_DATAGRAM`] bytes; at least 90 sources always fit, about 300 usually).
//!
//! ```text
//! {"v":1,"ev":"begin","pid":4242,"tracker":1,"seq":0,"dropped":0,"kind":"epoch","name":"epoch","index":0,"depth":0,"t_ns":81234567890}
//! {"v":1,"ev":"end","pid":4242,"tracker":1,"seq":7,"dropped":0,"kind":"step","name":"step","index":3,"depth":1,"started_ns":81240000000,"ended_ns":81250000000,"next":true,"releases":0,"sources":[{"name":"rss","kind":"process","fidelity":"exact","used_start":104857600,"used_end":104857600,"peak":373293056,"delta_used":0,"delta_peaked":268435456}],"truncated":false}
//! ```

use crate::error::{Error, Result};
use crate::fork::GateGuard;
use crate::phase::PhaseKind;
use crate::sink::Record;
use crate::sinks::json;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The environment variable naming the socket: set by `memprobe run` for
/// the command it runs (and so for that command's children).
pub const ENV: &str = "MEMPROBE_RUN_CHANNEL";

/// The version of the messages (`"v"`); bumped on incompatible changes
/// (fields may be added within a version).
pub const VERSION: u32 = 1;

/// No datagram is longer than this many bytes (sources beyond it are left
/// out and `"truncated"` says so).
pub const MAX_DATAGRAM: usize = 60 * 1024;

/// Messages counted as dropped, without a system call, after the receiver
/// was found gone: a dead parent costs a training loop almost nothing.
pub const GONE_SKIP: u64 = 256;

/// One encoded source entry is at most this long (a 64-byte name with each
/// byte escaped as `\u00XX`, and eight numbers); the encoder stops adding
/// sources before it could pass [`MAX_DATAGRAM`].
const MAX_SOURCE_ENTRY: usize = 640;

/// A datagram socket aimed at a receiver (`memprobe run`), with the counts
/// of what this process sent and dropped.
///
/// [`RunChannel::from_env`] is the one every tracker uses unless told
/// otherwise ([`Tracker::set_run_channel`](crate::Tracker::set_run_channel)).
#[derive(Debug)]
pub struct RunChannel {
    fd: libc::c_int,
    addr: libc::sockaddr_un,
    addr_len: libc::socklen_t,
    /// Whether sends go to the socket connected at the start (else to the
    /// address, looked up at each send).
    connected: AtomicBool,
    /// The process the counters below belong to (a forked child resets them).
    pid: AtomicU32,
    seq: AtomicU64,
    dropped: AtomicU64,
    sent: AtomicU64,
    /// Messages numbered below this are dropped without a system call.
    skip_until: AtomicU64,
}

impl RunChannel {
    /// A channel to the datagram socket bound at `path` (nothing is sent
    /// yet; the receiver need not exist). Fails when the path cannot be a
    /// socket address (longer than 107 bytes, or holding a NUL byte) or no
    /// socket can be created.
    pub fn connect(path: &Path) -> Result<RunChannel> {
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
            return Err(Error::invalid(format!(
                "{ENV}: {} is not a usable socket path (1 to {} bytes, no NUL)",
                path.display(),
                addr.sun_path.len() - 1
            )));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, &s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = s as libc::c_char;
        }
        let addr_len =
            (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
        // SAFETY: plain socket(2) call.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return Err(Error::io(
                "creating the run channel's socket",
                &std::io::Error::last_os_error(),
            ));
        }
        // Connected once, a datagram socket skips the path lookup at every
        // send; without a receiver yet, each send names the address.
        // SAFETY: fd is our socket; addr is initialised for addr_len bytes.
        let connected =
            unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), addr_len) } == 0;
        Ok(RunChannel {
            fd,
            addr,
            addr_len,
            connected: AtomicBool::new(connected),
            pid: AtomicU32::new(0),
            seq: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            skip_until: AtomicU64::new(0),
        })
    }

    /// The channel named by [`ENV`], opened at the first call in this
    /// process; `None` when the variable is unset, empty or unusable.
    pub fn from_env() -> Option<&'static RunChannel> {
        static CHANNEL: OnceLock<Option<RunChannel>> = OnceLock::new();
        if let Some(c) = CHANNEL.get() {
            return c.as_ref();
        }
        // Held across the initialisation so that a fork never copies a
        // half-initialised cell into a child (it would wait on it forever).
        let _gate = GateGuard::enter();
        CHANNEL
            .get_or_init(|| {
                let path = std::env::var_os(ENV).filter(|p| !p.is_empty())?;
                RunChannel::connect(Path::new(&path)).ok()
            })
            .as_ref()
    }

    /// Messages this process has sent through the channel.
    pub fn sent(&self) -> u64 {
        self.counting_for(current_pid());
        self.sent.load(Ordering::Relaxed)
    }

    /// Messages this process has dropped (receiver slow, full or gone).
    pub fn dropped(&self) -> u64 {
        self.counting_for(current_pid());
        self.dropped.load(Ordering::Relaxed)
    }

    /// Resets the counters when `pid` is not the process they counted for
    /// (the first use after a fork).
    fn counting_for(&self, pid: u32) {
        if self.pid.load(Ordering::Relaxed) != pid && self.pid.swap(pid, Ordering::AcqRel) != pid {
            self.seq.store(0, Ordering::Relaxed);
            self.dropped.store(0, Ordering::Relaxed);
            self.sent.store(0, Ordering::Relaxed);
            self.skip_until.store(0, Ordering::Relaxed);
        }
    }

    /// Numbers, encodes and sends one event of `tracker` (never blocks).
    fn emit(&self, tracker: u64, buf: &mut String, event: &Event<'_>) {
        let pid = current_pid();
        self.counting_for(pid);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if seq < self.skip_until.load(Ordering::Relaxed) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let head = Head {
            pid,
            tracker,
            seq,
            dropped: self.dropped.load(Ordering::Relaxed),
        };
        encode(buf, &head, event);
        let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        let connected = self.connected.load(Ordering::Relaxed);
        let rc = if connected {
            // SAFETY: buf is valid for its length; the flags make the call
            // non-blocking.
            unsafe { libc::send(self.fd, buf.as_ptr().cast(), buf.len(), flags) }
        } else {
            // SAFETY: as above; addr is an initialised sockaddr_un of
            // addr_len bytes.
            unsafe {
                libc::sendto(
                    self.fd,
                    buf.as_ptr().cast(),
                    buf.len(),
                    flags,
                    (&self.addr as *const libc::sockaddr_un).cast(),
                    self.addr_len,
                )
            }
        };
        if rc >= 0 {
            self.sent.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        let errno = std::io::Error::last_os_error().raw_os_error();
        if connected && matches!(errno, Some(libc::ECONNREFUSED | libc::ENOTCONN)) {
            // The receiver closed: the kernel dropped the connection. A
            // receiver bound at the path later is reached by address.
            self.connected.store(false, Ordering::Relaxed);
        }
        if matches!(
            errno,
            Some(libc::ENOENT | libc::ECONNREFUSED | libc::ENOTCONN)
        ) {
            self.skip_until
                .fetch_max(seq.saturating_add(1 + GONE_SKIP), Ordering::Relaxed);
        }
    }
}

impl Drop for RunChannel {
    fn drop(&mut self) {
        // SAFETY: fd is the socket this value owns.
        unsafe { libc::close(self.fd) };
    }
}

fn current_pid() -> u32 {
    // SAFETY: getpid has no preconditions (and is not cached by glibc, so a
    // forked child sees its own).
    unsafe { libc::getpid() as u32 }
}

/// The fields every message starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) pid: u32,
    pub(crate) tracker: u64,
    pub(crate) seq: u64,
    pub(crate) dropped: u64,
}

/// What a message says.
#[derive(Debug)]
pub(crate) enum Event<'a> {
    /// A phase began at `t_ns`.
    Begin {
        kind: PhaseKind,
        name: &'a str,
        index: u64,
        depth: u32,
        t_ns: u64,
    },
    /// A phase ended with `record`; with `next`, its successor began.
    End { record: &'a Record, next: bool },
}

/// Encodes `event` as one JSON object into `buf` (cleared first).
pub(crate) fn encode(buf: &mut String, head: &Head, event: &Event<'_>) {
    buf.clear();
    let ev = match event {
        Event::Begin { .. } => "begin",
        Event::End { .. } => "end",
    };
    let _ = write!(
        buf,
        r#"{{"v":{VERSION},"ev":"{ev}","pid":{},"tracker":{},"seq":{},"dropped":{},"kind":"#,
        head.pid, head.tracker, head.seq, head.dropped
    );
    match *event {
        Event::Begin {
            kind,
            name,
            index,
            depth,
            t_ns,
        } => {
            json::string(buf, kind.as_str());
            buf.push_str(",\"name\":");
            json::string(buf, name);
            let _ = write!(buf, r#","index":{index},"depth":{depth},"t_ns":{t_ns}}}"#);
        }
        Event::End { record, next } => {
            let (kind, name, index, depth) = match &record.phase {
                Some(p) => (p.kind, p.name.as_str(), p.index, p.depth),
                None => (PhaseKind::Custom, record.label.as_str(), 0, 0),
            };
            json::string(buf, kind.as_str());
            buf.push_str(",\"name\":");
            json::string(buf, name);
            let _ = write!(
                buf,
                r#","index":{index},"depth":{depth},"started_ns":{},"ended_ns":{},"next":{next},"releases":{},"sources":["#,
                record.started_at_ns,
                record.ended_at_ns,
                record.releases.len()
            );
            let mut truncated = false;
            for (i, d) in record.sources.iter().enumerate() {
                if buf.len() + MAX_SOURCE_ENTRY + 32 > MAX_DATAGRAM {
                    truncated = true;
                    break;
                }
                if i > 0 {
                    buf.push(',');
                }
                json::source(buf, d);
            }
            let _ = write!(buf, r#"],"truncated":{truncated}}}"#);
        }
    }
}

/// Where a tracker sends: the channel named by the environment, or one the
/// caller chose (or none).
#[derive(Debug)]
enum Target {
    Env,
    Chosen(Option<Arc<RunChannel>>),
}

/// A tracker's end of the channel: its number, where it sends, and the
/// buffer its messages are encoded in (reused: no allocation per message).
#[derive(Debug)]
pub(crate) struct Hook {
    tracker: u64,
    target: Target,
    buf: String,
}

impl Hook {
    /// The next tracker's hook, sending where [`ENV`] says.
    pub(crate) fn new() -> Hook {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Hook {
            tracker: NEXT.fetch_add(1, Ordering::Relaxed),
            target: Target::Env,
            buf: String::new(),
        }
    }

    /// Sends to `channel` from now on (`None`: nowhere).
    pub(crate) fn set(&mut self, channel: Option<Arc<RunChannel>>) {
        self.target = Target::Chosen(channel);
    }

    /// A phase began (`index` is asked only when a message is sent).
    pub(crate) fn begin(
        &mut self,
        kind: PhaseKind,
        name: &str,
        index: impl FnOnce() -> u64,
        depth: usize,
        t_ns: u64,
    ) {
        let Some(c) = channel(&self.target) else {
            return;
        };
        let event = Event::Begin {
            kind,
            name,
            index: index(),
            depth: u32::try_from(depth).unwrap_or(u32::MAX),
            t_ns,
        };
        c.emit(self.tracker, &mut self.buf, &event);
    }

    /// A phase ended with `record`; with `next`, the next one began.
    pub(crate) fn end(&mut self, record: &Record, next: bool) {
        if let Some(c) = channel(&self.target) {
            c.emit(self.tracker, &mut self.buf, &Event::End { record, next });
        }
    }
}

fn channel(target: &Target) -> Option<&RunChannel> {
    match target {
        Target::Env => RunChannel::from_env(),
        Target::Chosen(c) => c.as_deref(),
    }
}

impl Default for Hook {
    fn default() -> Self {
        Hook::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::SourceDelta;
    use crate::error::ErrorKind;
    use crate::phase::PhaseInfo;
    use crate::sample::{PeakFidelity, SourceKind};
    use std::os::unix::net::UnixDatagram;

    fn record(sources: usize, name: &str) -> Record {
        let deltas = (0..sources)
            .map(|i| {
                SourceDelta::new(
                    &format!("{name}{i}"),
                    SourceKind::Process,
                    PeakFidelity::Exact,
                    100,
                    120,
                    300 + i as u64,
                )
            })
            .collect();
        let mut r = Record::new("step", 1_000, 2_000, deltas);
        r.phase = Some(PhaseInfo {
            kind: PhaseKind::Step,
            name: "step".into(),
            index: 17,
            depth: 1,
        });
        r
    }

    const HEAD: Head = Head {
        pid: 4242,
        tracker: 3,
        seq: 9,
        dropped: 2,
    };

    #[test]
    fn begin_and_end_encode_exactly() {
        let mut buf = String::new();
        encode(
            &mut buf,
            &HEAD,
            &Event::Begin {
                kind: PhaseKind::Custom,
                name: "a \"quoted\"\\name\u{1}é",
                index: 4,
                depth: 2,
                t_ns: 123,
            },
        );
        assert_eq!(
            buf,
            r#"{"v":1,"ev":"begin","pid":4242,"tracker":3,"seq":9,"dropped":2,"kind":"custom","name":"a \"quoted\"\\name\u0001é","index":4,"depth":2,"t_ns":123}"#
        );
        encode(
            &mut buf,
            &HEAD,
            &Event::End {
                record: &record(1, "rss"),
                next: true,
            },
        );
        assert_eq!(
            buf,
            r#"{"v":1,"ev":"end","pid":4242,"tracker":3,"seq":9,"dropped":2,"kind":"step","name":"step","index":17,"depth":1,"started_ns":1000,"ended_ns":2000,"next":true,"releases":0,"sources":[{"name":"rss0","kind":"process","fidelity":"exact","used_start":100,"used_end":120,"peak":300,"delta_used":20,"delta_peaked":180}],"truncated":false}"#
        );
    }

    #[test]
    fn a_huge_record_is_cut_under_the_bound_and_says_so() {
        let long = "x".repeat(60);
        let mut buf = String::new();
        encode(
            &mut buf,
            &HEAD,
            &Event::End {
                record: &record(2000, &long),
                next: false,
            },
        );
        assert!(buf.len() <= MAX_DATAGRAM, "{}", buf.len());
        assert!(
            buf.ends_with(r#"],"truncated":true}"#),
            "{}",
            &buf[buf.len() - 40..]
        );
        let kept = buf.matches("\"fidelity\"").count();
        assert!(kept > 100 && kept < 2000, "{kept}");
        // The longest escaped name still fits one entry.
        let worst = "\u{1}".repeat(64);
        let mut one = String::new();
        encode(
            &mut one,
            &HEAD,
            &Event::End {
                record: &record(1, &worst[..63]),
                next: false,
            },
        );
        let entry_len = one.len() - one.find("[{").unwrap();
        assert!(entry_len < MAX_SOURCE_ENTRY, "{entry_len}");
    }

    fn bound(tag: &str) -> (std::path::PathBuf, UnixDatagram) {
        let dir =
            std::env::temp_dir().join(format!("memprobe-run-channel-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let sock = UnixDatagram::bind(&path).unwrap();
        (path, sock)
    }

    #[test]
    fn messages_arrive_numbered_and_drops_are_counted_then_reported() {
        let (path, sock) = bound("count");
        let ch = RunChannel::connect(&path).unwrap();
        let mut buf = String::new();
        let ev = Event::Begin {
            kind: PhaseKind::Epoch,
            name: "epoch",
            index: 0,
            depth: 0,
            t_ns: 1,
        };
        // Never read: the queue fills, later messages are dropped, no call blocks.
        for _ in 0..200 {
            ch.emit(1, &mut buf, &ev);
        }
        let (sent, dropped) = (ch.sent(), ch.dropped());
        assert_eq!(sent + dropped, 200);
        assert!(sent >= 1 && dropped > 0, "sent {sent}, dropped {dropped}");
        let mut got = vec![0u8; MAX_DATAGRAM];
        let n = sock.recv(&mut got).unwrap();
        let first = std::str::from_utf8(&got[..n]).unwrap();
        assert!(first.contains(r#""seq":0,"dropped":0,"#), "{first}");
        while sock.recv(&mut got).is_ok_and(|n| n > 0) {
            sock.set_nonblocking(true).unwrap();
        }
        // Read out: the next message gets through and carries the count.
        ch.emit(1, &mut buf, &ev);
        let n = sock.recv(&mut got).unwrap();
        let text = std::str::from_utf8(&got[..n]).unwrap();
        assert!(
            text.contains(&format!(r#""seq":200,"dropped":{dropped},"#)),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_gone_receiver_costs_no_system_call_for_a_while() {
        let (path, sock) = bound("gone");
        let ch = RunChannel::connect(&path).unwrap();
        drop(sock);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        let mut buf = String::new();
        let ev = Event::Begin {
            kind: PhaseKind::Step,
            name: "step",
            index: 0,
            depth: 0,
            t_ns: 1,
        };
        for _ in 0..1000 {
            ch.emit(1, &mut buf, &ev);
        }
        assert_eq!((ch.sent(), ch.dropped()), (0, 1000));
        // The first failure, and one try after each skip of GONE_SKIP.
        assert!(
            ch.skip_until.load(Ordering::Relaxed) > 1000 - GONE_SKIP - 2,
            "{:?}",
            ch
        );
    }

    #[test]
    fn a_receiver_bound_again_at_the_path_is_reached_again() {
        let (path, sock) = bound("again");
        let ch = RunChannel::connect(&path).unwrap();
        assert!(ch.connected.load(Ordering::Relaxed));
        let mut buf = String::new();
        let ev = Event::Begin {
            kind: PhaseKind::Step,
            name: "step",
            index: 0,
            depth: 0,
            t_ns: 1,
        };
        ch.emit(1, &mut buf, &ev);
        drop(sock);
        std::fs::remove_file(&path).unwrap();
        let again = UnixDatagram::bind(&path).unwrap();
        again.set_nonblocking(true).unwrap();
        // The first send finds the old receiver closed; the skipped ones
        // follow; then the address reaches the new one.
        for _ in 0..GONE_SKIP + 2 {
            ch.emit(1, &mut buf, &ev);
        }
        assert!(!ch.connected.load(Ordering::Relaxed));
        assert_eq!((ch.sent(), ch.dropped()), (2, GONE_SKIP + 1));
        let mut got = vec![0u8; 4096];
        let n = again.recv(&mut got).unwrap();
        let text = std::str::from_utf8(&got[..n]).unwrap();
        assert!(
            text.contains(&format!(r#""dropped":{},"#, GONE_SKIP + 1)),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn unusable_paths_are_refused() {
        assert!(RunChannel::connect(Path::new("")).is_err());
        let long = "/tmp/".to_string() + &"x".repeat(200);
        let e = RunChannel::connect(Path::new(&long)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
}
