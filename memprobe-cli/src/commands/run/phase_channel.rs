//! `memprobe run`'s end of the run channel (memprobe-core's `run_channel`):
//! a Unix datagram socket bound in a private directory before the command
//! starts, named to it (and its children) by `MEMPROBE_RUN_CHANNEL`, and a
//! thread that decodes what the command's trackers send into a
//! [`PhaseLog`].
//!
//! The messages are decoded by the run channel's protocol module
//! (memprobe-core's `run_channel::protocol`, the one the senders encode
//! with). Anything can arrive on a socket: datagrams that are not messages
//! (not JSON, missing fields, names longer than a tracker allows), longer
//! than the largest message, or of a version this memprobe does not read
//! are counted and skipped, never a crash. The sender's pid is taken from the
//! kernel (`SCM_CREDENTIALS`, as this process's pid namespace sees it)
//! when it is there, so it matches the tree's pids even when the command
//! runs in a pid namespace of its own.
//!
//! The socket and its directory are removed when the receiver is finished
//! or dropped, on every path out of `run`.

use super::phase_log::PhaseLog;
use memprobe_core::internal::run_channel::protocol::{self, Unreadable};
use memprobe_core::internal::run_channel::{ENV, MAX_DATAGRAM};
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Datagrams up to this size are read (a little more than the largest
/// message); longer ones are counted as oversized.
const RECV_BUF: usize = MAX_DATAGRAM + 4096;
/// How often the receiving thread looks whether it should stop, when no
/// datagram comes: the end of the run wakes it at once with an empty one
/// (see [`Receiver::finish`]), so this is only the fallback, and long: an
/// idle wake-up costs memprobe's CPU at every run.
const POLL: Duration = Duration::from_millis(500);
/// At most this many datagrams are drained after the command ended (a
/// process left behind could keep sending forever).
const MAX_DRAIN: usize = 100_000;

/// The private directory and the socket in it, removed on drop.
#[derive(Debug)]
struct Place {
    dir: PathBuf,
    socket: PathBuf,
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Makes a fresh 0700 directory `memprobe-run-XXXXXX` in `base`.
fn private_dir(base: &Path) -> io::Result<PathBuf> {
    let template = base.join("memprobe-run-XXXXXX");
    let c = CString::new(template.into_os_string().into_vec())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in TMPDIR"))?;
    let mut bytes = c.into_bytes_with_nul();
    // SAFETY: a writable NUL-terminated template ending in XXXXXX.
    let p = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(io::Error::last_os_error());
    }
    bytes.pop();
    Ok(PathBuf::from(OsString::from_vec(bytes)))
}

/// A bound socket, before the command starts.
#[derive(Debug)]
pub(crate) struct PhaseChannel {
    place: Place,
    sock: UnixDatagram,
}

impl PhaseChannel {
    /// Binds the socket in a new private directory under `$TMPDIR` (or
    /// `/tmp` when that path would be too long for a socket address).
    pub(crate) fn bind() -> Result<PhaseChannel, String> {
        let mut base = std::env::temp_dir();
        // sun_path holds 107 bytes; the directory adds 20, the socket 7.
        if base.as_os_str().len() + 28 > 107 {
            base = PathBuf::from("/tmp");
        }
        let dir = private_dir(&base)
            .map_err(|e| format!("cannot make a directory in {}: {e}", base.display()))?;
        let place = Place {
            socket: dir.join("phases"),
            dir,
        };
        let sock = UnixDatagram::bind(&place.socket)
            .map_err(|e| format!("cannot bind {}: {e}", place.socket.display()))?;
        let on: libc::c_int = 1;
        // SAFETY: a valid socket and a c_int option value of its size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        sock.set_read_timeout(Some(POLL))
            .map_err(|e| format!("cannot set a read timeout: {e}"))?;
        Ok(PhaseChannel { place, sock })
    }

    /// The socket's path.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.place.socket
    }

    /// The command's environment entry naming the socket.
    pub(crate) fn env(&self) -> (OsString, Option<OsString>) {
        (
            OsString::from(ENV),
            Some(self.place.socket.clone().into_os_string()),
        )
    }

    /// Starts receiving; times count from `t0_mono_ns` (`CLOCK_MONOTONIC`
    /// at the timeline's zero).
    pub(crate) fn start(self, t0_mono_ns: u64) -> Result<Receiver, String> {
        let log = Arc::new(Mutex::new(PhaseLog::new(t0_mono_ns)));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s, sock) = (Arc::clone(&log), Arc::clone(&stop), self.sock);
        let handle = thread::Builder::new()
            .name("memprobe-phases".into())
            .spawn(move || receive(&sock, &l, &s))
            .map_err(|e| format!("cannot start the phase receiver: {e}"))?;
        Ok(Receiver {
            log,
            stop,
            handle,
            place: self.place,
        })
    }
}

/// The receiving thread, running.
#[derive(Debug)]
pub(crate) struct Receiver {
    log: Arc<Mutex<PhaseLog>>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
    place: Place,
}

fn lock(log: &Mutex<PhaseLog>) -> MutexGuard<'_, PhaseLog> {
    log.lock().unwrap_or_else(|e| e.into_inner())
}

impl Receiver {
    /// Stops receiving once what is queued has been read, removes the
    /// socket and its directory, and returns the log.
    pub(crate) fn finish(self) -> PhaseLog {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the receiver now rather than at its next poll (a run's end
        // would wait for it): an empty datagram, which carries nothing. Never
        // blocking: with the queue full (a receiver that stopped on an
        // error), the poll still ends it.
        if let Ok(waker) = UnixDatagram::unbound() {
            if waker.set_nonblocking(true).is_ok() {
                let _ = waker.send_to(&[], &self.place.socket);
            }
        }
        let _ = self.handle.join();
        // A copy: lookups handed out keep answering after the end.
        let log = lock(&self.log).clone();
        log
    }
}

/// One datagram as received.
struct Datagram {
    len: usize,
    /// Longer than the buffer (the rest was discarded by the kernel).
    truncated: bool,
    /// The sender's pid as the kernel saw it.
    pid: Option<u32>,
}

fn recv(sock: &UnixDatagram, buf: &mut [u8]) -> io::Result<Datagram> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at a valid buffer and control area for the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut pid = None;
    // SAFETY: the kernel filled msg's control area; the CMSG macros walk it
    // within msg_controllen, and the credentials are read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                pid = u32::try_from(cred.pid).ok().filter(|&p| p > 0);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Datagram {
        len: n as usize,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        pid,
    })
}

fn receive(sock: &UnixDatagram, log: &Mutex<PhaseLog>, stop: &AtomicBool) {
    let mut buf = vec![0u8; RECV_BUF];
    let mut drained = 0usize;
    let mut draining = false;
    loop {
        if !draining && stop.load(Ordering::SeqCst) {
            draining = sock.set_nonblocking(true).is_ok();
            if !draining {
                return;
            }
        }
        match recv(sock, &mut buf) {
            // The wake-up sent at the end (and any empty datagram): nothing.
            Ok(d) if d.len == 0 && !d.truncated => {}
            Ok(d) => {
                let decoded = if d.truncated {
                    Err(Unreadable::Oversized)
                } else {
                    // The kernel's pid, when known, over the one written.
                    protocol::decode(&buf[..d.len]).map(|mut m| {
                        m.pid = d.pid.unwrap_or(m.pid);
                        m
                    })
                };
                let mut l = lock(log);
                match decoded {
                    Ok(m) => l.add(m),
                    Err(Unreadable::Garbled) => l.garbled += 1,
                    Err(Unreadable::Oversized) => l.oversized += 1,
                    Err(Unreadable::Version) => l.unknown_version += 1,
                }
                if draining {
                    drained += 1;
                    if drained >= MAX_DRAIN {
                        return;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if draining {
                    return;
                }
            }
            // Nothing else is expected from a bound datagram socket; stop
            // rather than spin.
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = r#"{"v":1,"ev":"begin","pid":4242,"tracker":1,"seq":0,"dropped":0,"kind":"epoch","name":"epoch","index":0,"depth":0,"t_ns":81234567890}"#;
    const END: &str = r#"{"v":1,"ev":"end","pid":4242,"tracker":1,"seq":7,"dropped":2,"kind":"step","name":"step","index":3,"depth":1,"started_ns":81240000000,"ended_ns":81250000000,"next":true,"releases":0,"sources":[{"name":"rss","kind":"process","fidelity":"exact","used_start":104857600,"used_end":104857600,"peak":373293056,"delta_used":0,"delta_peaked":268435456}],"truncated":false}"#;

    #[test]
    fn the_receiver_counts_garbage_reads_what_is_queued_and_cleans_up() {
        let ch = PhaseChannel::bind().unwrap();
        let path = ch.path().to_path_buf();
        let dir = path.parent().unwrap().to_path_buf();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let rx = ch.start(81_000_000_000).unwrap();
        let tx = UnixDatagram::unbound().unwrap();
        tx.send_to(b"garbage", &path).unwrap();
        tx.send_to(&vec![b'{'; RECV_BUF + 10], &path).unwrap();
        tx.send_to(BEGIN.replace(r#""v":1"#, r#""v":9"#).as_bytes(), &path)
            .unwrap();
        tx.send_to(BEGIN.as_bytes(), &path).unwrap();
        tx.send_to(
            END.replace(
                r#""kind":"step","name":"step""#,
                r#""kind":"epoch","name":"epoch""#,
            )
            .replace(r#""depth":1"#, r#""depth":0"#)
            .replace(r#""index":3"#, r#""index":0"#)
            .replace(r#""next":true"#, r#""next":false"#)
            .as_bytes(),
            &path,
        )
        .unwrap();
        let log = rx.finish();
        assert_eq!(
            (
                log.garbled,
                log.oversized,
                log.unknown_version,
                log.received
            ),
            (1, 1, 1, 2)
        );
        // The kernel's pid, not the one written in the message.
        assert_eq!(log.phases.len(), 1);
        assert_eq!(log.phases[0].pid, std::process::id());
        // The record's start is the phase's (its begin message said 234.6 ms).
        assert_eq!(log.phases[0].start_ns, 240_000_000);
        assert_eq!(log.phases[0].end_ns, Some(250_000_000));
        assert!(!path.exists() && !dir.exists(), "left {}", dir.display());
    }

    #[test]
    fn a_receiver_dropped_on_an_error_path_cleans_up_too() {
        let ch = PhaseChannel::bind().unwrap();
        let dir = ch.path().parent().unwrap().to_path_buf();
        drop(ch);
        assert!(!dir.exists());
    }
}
