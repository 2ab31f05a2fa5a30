//! Each process's high-water mark at its exit, from the kernel itself:
//! taskstats over generic netlink. Registered for a set of CPUs
//! (`TASKSTATS_CMD_ATTR_REGISTER_CPUMASK`), the socket receives, for every
//! task that exits on them, its `struct taskstats`, whose `hiwater_rss` is
//! its memory's `VmHWM` (the kernel fills it in `do_exit` before the memory
//! is released, so it holds every byte up to the end).
//!
//! Why: a process's status (`VmHWM`) can only be read while it lives, and
//! a zombie has none, so a worker that spikes in its last interval, or
//! whose spike rose and fell between two samples leaving `statm` as it was,
//! would end with a peak short of its real one. Its exit record closes that.
//!
//! Registering needs `CAP_NET_ADMIN` and memprobe in the initial PID and
//! user namespaces; where refused, the reason is kept (the run JSON's
//! `exit_hwm`) and peaks are what the samples read. The socket is read by
//! the sampling thread at each tick, non-blocking (one `recv` when no
//! process exited): a member the sampler finds gone at a tick has its
//! record already queued, since the kernel sends it before the memory the
//! sampler's `statm` read sees vanish is freed.

use serde::Serialize;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_GENERIC: libc::c_int = 16;
const GENL_ID_CTRL: u16 = 16;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const TASKSTATS_CMD_GET: u8 = 1;
const TASKSTATS_CMD_ATTR_REGISTER_CPUMASK: u16 = 3;
const TASKSTATS_CMD_ATTR_DEREGISTER_CPUMASK: u16 = 4;
const TASKSTATS_TYPE_PID: u16 = 1;
const TASKSTATS_TYPE_STATS: u16 = 3;
const TASKSTATS_TYPE_AGGR_PID: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLA_F_MASK: u16 = 0x3fff;
/// `struct nlmsghdr`, then `struct genlmsghdr`.
const NLMSG_HDR: usize = 16;
const GENL_HDR: usize = 4;
/// Offsets in `struct taskstats` (a versioned struct, fields only ever
/// appended): `ac_pid`, `hiwater_rss` (KiB), and `ac_tgid` from version 12.
const TS_PID: usize = 128;
/// `ac_comm`: the task's name when it exited (`TS_COMM_LEN` bytes).
const TS_COMM: usize = 80;
const TS_COMM_LEN: usize = 32;
const TS_HIWATER_RSS: usize = 200;
const TS_TGID: usize = 368;
const TS_TGID_VERSION: u16 = 12;
/// Room for bursts of exits on a busy machine between two ticks (about
/// 600 bytes each).
const RCVBUF: libc::c_int = 8 << 20;

/// One exited process (or thread) as the kernel reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exit {
    /// The process (thread group) it belonged to.
    pub(crate) tgid: u32,
    /// Its memory's high-water mark at exit, bytes.
    pub(crate) hwm: u64,
    /// The process's name when it ended, from its main thread's record
    /// (another thread's carries that thread's name: `None`).
    pub(crate) name: Option<String>,
}

/// The run JSON's `exit_hwm`: whether exit records were had, and what
/// they did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct ExitHwmReport {
    pub(crate) source: &'static str,
    pub(crate) available: bool,
    /// Why not, when not.
    pub(crate) reason: Option<String>,
    /// Processes of the tree whose record arrived.
    pub(crate) processes: u64,
    /// Of these, those whose exit record held a peak above every `VmHWM`
    /// and sample read while they lived.
    pub(crate) raised: u64,
    /// Times the socket overflowed (records lost; those processes keep
    /// what samples read).
    pub(crate) overflows: u64,
}

impl Default for ExitHwmReport {
    /// None had (a recording that never sampled).
    fn default() -> Self {
        ExitHwmReport {
            source: "taskstats",
            available: false,
            reason: None,
            processes: 0,
            raised: 0,
            overflows: 0,
        }
    }
}

/// The registered socket.
#[derive(Debug)]
pub(crate) struct ExitStats {
    sock: OwnedFd,
    family: u16,
    cpus: String,
    buf: Vec<u8>,
    pub(crate) overflows: u64,
}

impl ExitStats {
    /// Registers for every CPU's exits; `Err`: why they cannot be had.
    pub(crate) fn open() -> Result<ExitStats, String> {
        let sock = socket().map_err(|e| format!("taskstats socket: {e}"))?;
        let family = family(&sock).map_err(|e| format!("taskstats family: {e}"))?;
        let cpus = possible_cpus();
        let mut name = cpus.clone().into_bytes();
        name.push(0);
        let msg = genl(
            family,
            NLM_F_REQUEST | NLM_F_ACK,
            TASKSTATS_CMD_GET,
            &attr(TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, &name),
        );
        send(&sock, &msg).map_err(|e| format!("taskstats register: {e}"))?;
        match ack(&sock) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                return Err("taskstats refused: listening for exits needs CAP_NET_ADMIN".into())
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(
                    "taskstats refused: memprobe is not in the initial PID and user namespaces"
                        .into(),
                )
            }
            Err(e) => return Err(format!("taskstats register: {e}")),
        }
        Ok(ExitStats {
            sock,
            family,
            cpus,
            buf: vec![0; 64 << 10],
            overflows: 0,
        })
    }

    /// The socket, to poll for records.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// Hands every exit received since the last call to `f`.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(Exit)) {
        loop {
            // SAFETY: a valid descriptor and a buffer of that length.
            let n = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::ENOBUFS) => {
                        self.overflows += 1;
                        continue;
                    }
                    Some(libc::EINTR) => continue,
                    _ => return,
                }
            }
            let n = usize::try_from(n).unwrap_or(0);
            if n == 0 {
                return;
            }
            for_each_msg(&self.buf[..n], |typ, body| {
                if typ == self.family {
                    if let Some(e) = parse_exit(body) {
                        f(e);
                    }
                }
            });
        }
    }
}

impl Drop for ExitStats {
    fn drop(&mut self) {
        // The kernel also drops a listener whose socket is gone, at the
        // next exit it fails to deliver; saying so now is tidier.
        let mut name = self.cpus.clone().into_bytes();
        name.push(0);
        let msg = genl(
            self.family,
            NLM_F_REQUEST,
            TASKSTATS_CMD_GET,
            &attr(TASKSTATS_CMD_ATTR_DEREGISTER_CPUMASK, &name),
        );
        let _ = send(&self.sock, &msg);
    }
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain system calls on a descriptor owned here.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_GENERIC,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let sock = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        if libc::bind(fd, (&addr as *const libc::sockaddr_nl).cast(), len) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Replies must not wait forever on a kernel that never answers.
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        let tlen = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            tlen,
        );
        let size = RCVBUF;
        let ilen = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // FORCE passes the system's cap (registering needs the capability
        // that allows it anyway); the plain one is the fallback.
        if libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            ilen,
        ) != 0
        {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&size as *const libc::c_int).cast(),
                ilen,
            );
        }
        Ok(sock)
    }
}

/// The CPUs the kernel may ever run a task on, as the register attribute
/// wants them (`0-N`): exits are reported per CPU.
fn possible_cpus() -> String {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            // SAFETY: sysconf has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1);
            format!("0-{}", n - 1)
        })
}

fn attr(typ: u16, data: &[u8]) -> Vec<u8> {
    let len = 4 + data.len();
    let mut v = Vec::with_capacity(len.next_multiple_of(4));
    v.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
    v.extend_from_slice(&typ.to_ne_bytes());
    v.extend_from_slice(data);
    v.resize(len.next_multiple_of(4), 0);
    v
}

fn genl(family: u16, flags: u16, cmd: u8, attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDR + GENL_HDR + attrs.len();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    v.extend_from_slice(&family.to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    v.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel
    v.extend_from_slice(&[cmd, 1, 0, 0]); // command, version 1
    v.extend_from_slice(attrs);
    v
}

fn send(sock: &OwnedFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: a valid descriptor and buffer.
    let n = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one datagram (blocking, bounded by the socket's timeout).
fn recv(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a valid descriptor and buffer.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// The generic netlink id of the "TASKSTATS" family.
fn family(sock: &OwnedFd) -> io::Result<u16> {
    let msg = genl(
        GENL_ID_CTRL,
        NLM_F_REQUEST,
        CTRL_CMD_GETFAMILY,
        &attr(CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0"),
    );
    send(sock, &msg)?;
    let mut buf = vec![0u8; 8192];
    let n = recv(sock, &mut buf)?;
    let mut found = Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no TASKSTATS family (a kernel without CONFIG_TASKSTATS)",
    ));
    for_each_msg(&buf[..n], |typ, body| {
        if typ == NLMSG_ERROR {
            if let Some(code) = error_code(body).filter(|&c| c != 0) {
                found = Err(io::Error::from_raw_os_error(-code));
            }
            return;
        }
        for (t, data) in attrs(body.get(GENL_HDR..).unwrap_or_default()) {
            if t == CTRL_ATTR_FAMILY_ID {
                if let Some(id) = data.get(..2) {
                    found = Ok(u16::from_ne_bytes([id[0], id[1]]));
                }
            }
        }
    });
    found
}

/// Waits for the acknowledgement of a request: `Err` with the kernel's
/// error where it refused.
fn ack(sock: &OwnedFd) -> io::Result<()> {
    let mut buf = vec![0u8; 8192];
    // Exits may arrive before the acknowledgement: skip them.
    for _ in 0..1024 {
        let n = recv(sock, &mut buf)?;
        let mut code = None;
        for_each_msg(&buf[..n], |typ, body| {
            if typ == NLMSG_ERROR {
                code = error_code(body);
            }
        });
        match code {
            Some(0) => return Ok(()),
            Some(c) => return Err(io::Error::from_raw_os_error(-c)),
            None => {}
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "no acknowledgement",
    ))
}

fn error_code(body: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(body.get(..4)?.try_into().ok()?))
}

/// Calls `f(type, body)` for each netlink message in `buf`.
fn for_each_msg(mut buf: &[u8], mut f: impl FnMut(u16, &[u8])) {
    while buf.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDR || len > buf.len() {
            return;
        }
        f(u16::from_ne_bytes([buf[4], buf[5]]), &buf[NLMSG_HDR..len]);
        buf = buf.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
}

/// The attributes in `buf`, as (type, payload).
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let typ = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_F_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let data = &buf[4..len];
        buf = buf.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((typ, data))
    })
}

/// One exit message's (genl header and attributes) task: the process it
/// belonged to and its high-water mark. The thread group's aggregate
/// (`TASKSTATS_TYPE_AGGR_TGID`) carries no memory figures: skipped.
fn parse_exit(body: &[u8]) -> Option<Exit> {
    let (_, aggr) = attrs(body.get(GENL_HDR..)?).find(|(t, _)| *t == TASKSTATS_TYPE_AGGR_PID)?;
    let mut pid = None;
    let mut stats = None;
    for (t, data) in attrs(aggr) {
        match t {
            TASKSTATS_TYPE_PID => pid = data.get(..4).map(|b| u32_at(b, 0)),
            TASKSTATS_TYPE_STATS => stats = Some(data),
            _ => {}
        }
    }
    let stats = stats?;
    let version = u16::from_ne_bytes(stats.get(..2)?.try_into().ok()?);
    let kib = u64::from_ne_bytes(
        stats
            .get(TS_HIWATER_RSS..TS_HIWATER_RSS + 8)?
            .try_into()
            .ok()?,
    );
    // Zero: a kernel thread, or one without extended accounting.
    if kib == 0 {
        return None;
    }
    let tgid = if version >= TS_TGID_VERSION && stats.len() >= TS_TGID + 4 {
        u32_at(stats, TS_TGID)
    } else {
        // Older kernels: the thread's id; a process's main thread has the
        // process's, other threads are not matched to it.
        pid.or_else(|| Some(u32_at(stats.get(TS_PID..TS_PID + 4)?, 0)))?
    };
    let name = (pid == Some(tgid))
        .then(|| stats.get(TS_COMM..TS_COMM + TS_COMM_LEN))
        .flatten()
        .and_then(|raw| {
            let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
            (end > 0).then(|| String::from_utf8_lossy(&raw[..end]).into_owned())
        });
    Some(Exit {
        tgid,
        hwm: kib.checked_mul(1024)?,
        name,
    })
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn exit_message(family: u16, pid: u32, tgid: u32, version: u16, kib: u64) -> Vec<u8> {
        let mut stats = vec![0u8; 416];
        stats[..2].copy_from_slice(&version.to_ne_bytes());
        stats[TS_PID..TS_PID + 4].copy_from_slice(&pid.to_ne_bytes());
        stats[TS_HIWATER_RSS..TS_HIWATER_RSS + 8].copy_from_slice(&kib.to_ne_bytes());
        stats[TS_TGID..TS_TGID + 4].copy_from_slice(&tgid.to_ne_bytes());
        stats[TS_COMM..TS_COMM + 6].copy_from_slice(b"worker");
        let mut inner = attr(TASKSTATS_TYPE_PID, &pid.to_ne_bytes());
        inner.extend(attr(TASKSTATS_TYPE_STATS, &stats));
        genl(family, 0, 2, &attr(TASKSTATS_TYPE_AGGR_PID, &inner))
    }

    #[test]
    fn an_exit_message_gives_its_process_and_high_water_mark() {
        let m = exit_message(31, 1001, 1000, 13, 262_144);
        let mut got = Vec::new();
        for_each_msg(&m, |t, body| {
            assert_eq!(t, 31);
            got.extend(parse_exit(body));
        });
        // Another thread's record: its name is the thread's, not kept.
        assert_eq!(
            got,
            [Exit {
                tgid: 1000,
                hwm: 256 << 20,
                name: None,
            }]
        );
        // The main thread's: the process's name when it ended.
        let m = exit_message(31, 1000, 1000, 13, 4);
        for_each_msg(&m, |_, body| {
            assert_eq!(
                parse_exit(body).and_then(|e| e.name).as_deref(),
                Some("worker")
            );
        });
        // Before version 12 there is no tgid: the thread's own id.
        let m = exit_message(31, 1001, 1000, 11, 4);
        for_each_msg(&m, |_, body| {
            assert_eq!(parse_exit(body).map(|e| e.tgid), Some(1001));
        });
        // No memory figures (a kernel thread): nothing.
        let m = exit_message(31, 7, 7, 13, 0);
        for_each_msg(&m, |_, body| assert_eq!(parse_exit(body), None));
        // Truncated or garbage: nothing, no panic.
        for cut in 0..m.len() {
            for_each_msg(&m[..cut], |_, body| {
                let _ = parse_exit(body);
            });
        }
    }

    /// Where registering is allowed (root on the host), a child's record
    /// arrives with its exact high-water mark: 64 MiB touched and freed.
    #[test]
    fn a_real_exit_is_reported_with_its_high_water_mark() {
        let mut s = match ExitStats::open() {
            Ok(s) => s,
            Err(why) => {
                assert!(why.contains("taskstats"), "{why}");
                eprintln!("skipped: {why}");
                return;
            }
        };
        const LEN: usize = 64 << 20;
        // SAFETY: the child only maps, touches, unmaps and exits (system
        // calls and stores: nothing a fork of a threaded process forbids).
        let pid = unsafe {
            match libc::fork() {
                0 => {
                    let p = libc::mmap(
                        std::ptr::null_mut(),
                        LEN,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    );
                    if p != libc::MAP_FAILED {
                        for i in (0..LEN).step_by(4096) {
                            p.cast::<u8>().add(i).write_volatile(1);
                        }
                        libc::munmap(p, LEN);
                    }
                    libc::_exit(0)
                }
                pid => pid,
            }
        };
        assert!(pid > 0);
        // The child's name is the forking thread's.
        let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let pid = pid as u32;
        let t = Instant::now();
        let mut hwm = None;
        while hwm.is_none() && t.elapsed() < Duration::from_secs(5) {
            s.drain(|e| {
                if e.tgid == pid {
                    hwm = Some(e.hwm);
                    assert_eq!(e.name.as_deref(), Some(comm.trim_end()));
                }
            });
            std::thread::sleep(Duration::from_millis(5));
        }
        let hwm = hwm.expect("the exit of the child");
        // All of it, though freed before the exit and never sampled.
        assert!(hwm >= LEN as u64 && hwm % 1024 == 0, "{hwm}");
    }
}
