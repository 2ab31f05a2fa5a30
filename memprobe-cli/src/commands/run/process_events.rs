//! Every birth and death in the run's tree, not only those a sample sees:
//! the kernel's process events connector (netlink `NETLINK_CONNECTOR`,
//! `CN_IDX_PROC`) reports each `fork`, `exec`, name change and exit on the
//! machine as it happens, with the exit's wait status. A worker that starts
//! and is OOM-killed between two samples (`--interval 1s`) is a member of the
//! tree all the same, with its death by `SIGKILL`.
//!
//! Listening needs `CAP_NET_ADMIN` (root) before Linux 6.6, and nothing
//! since; where it is refused the reason is kept,
//! and the run falls back on what samples see, on the zombies they catch,
//! and on the orphans memprobe reaps as their subreaper
//! ([`crate::commands::run::orphans`]), and the OOM verdict says that a process living
//! between two samples could have been missed.
//!
//! The listener starts before the command is spawned, with memprobe itself
//! as the tree's root: the command's own `fork` is the first event of the
//! tree, so no early child of the command can be missed. Events arrive for
//! the whole machine; a socket that overflows (`ENOBUFS`) loses some, which
//! is counted, and the tracking is then no longer complete. A socket filter
//! ([`crate::commands::run::event_filter`]) has the kernel drop, before
//! waking the listener, the events of threads and the kinds it never reads;
//! where the kernel refuses the filter, every event is read as before.

use super::tree_sampler::Feed;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 0x0000_0001;
const PROC_EVENT_EXEC: u32 = 0x0000_0002;
const PROC_EVENT_COMM: u32 = 0x0000_0200;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// `struct nlmsghdr` then `struct cn_msg`: the event starts here.
const NLMSG_HDR: usize = 16;
const CN_MSG: usize = 20;

/// At most this many members are tracked (a fork bomb stays bounded).
const MAX_MEMBERS: usize = 1 << 16;

/// One process of the tree, from its birth to its death.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Life {
    pub(crate) pid: u32,
    pub(crate) ppid: u32,
    /// Its command name, where it could be read (at its birth, exec or
    /// rename).
    pub(crate) name: String,
    /// `CLOCK_MONOTONIC` at its birth, ns.
    pub(crate) born_ns: u64,
    /// `CLOCK_MONOTONIC` at its exit, ns.
    pub(crate) ended_ns: Option<u64>,
    /// How it ended, in `waitpid`'s encoding.
    pub(crate) wait_status: Option<i32>,
}

/// What the listener saw over the run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lifetimes {
    /// Every descendant of memprobe (the command and its tree).
    pub(crate) members: HashMap<u32, Life>,
    /// Overflows of the socket: events lost, tracking incomplete.
    pub(crate) overflows: u64,
    /// Members not tracked beyond [`MAX_MEMBERS`].
    pub(crate) dropped: u64,
    /// Events of threads read and discarded (the socket filter keeps them
    /// out where the kernel takes it).
    pub(crate) thread_events: u64,
    /// The sampler's queue of births and renames (no report of its own).
    feed: Feed,
}

impl Lifetimes {
    /// Folds in one event (`proc_event`'s bytes).
    fn event(&mut self, ev: &[u8], me: u32) {
        let u32_at = |o: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(ev.get(o..o + 4)?.try_into().ok()?))
        };
        let (Some(what), Some(ts)) = (
            u32_at(0),
            ev.get(8..16)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_ne_bytes),
        ) else {
            return;
        };
        // The union starts at 16.
        match what {
            PROC_EVENT_FORK => {
                let (Some(parent_tgid), Some(child_pid), Some(child_tgid)) =
                    (u32_at(20), u32_at(24), u32_at(28))
                else {
                    return;
                };
                // A new thread is no new process.
                if child_pid != child_tgid {
                    self.thread_events += 1;
                    return;
                }
                if parent_tgid != me && !self.members.contains_key(&parent_tgid) {
                    return;
                }
                if self.members.len() >= MAX_MEMBERS {
                    self.dropped += 1;
                    return;
                }
                let name = comm(child_pid)
                    .or_else(|| self.members.get(&parent_tgid).map(|p| p.name.clone()))
                    .unwrap_or_default();
                self.feed.born(child_pid, parent_tgid);
                self.members.insert(
                    child_pid,
                    Life {
                        pid: child_pid,
                        ppid: parent_tgid,
                        name,
                        born_ns: ts,
                        ended_ns: None,
                        wait_status: None,
                    },
                );
            }
            PROC_EVENT_EXEC => {
                if let Some(m) = u32_at(16).and_then(|p| self.members.get_mut(&p)) {
                    self.feed.renamed(m.pid);
                    if let Some(n) = comm(m.pid) {
                        m.name = n;
                    }
                }
            }
            PROC_EVENT_COMM => {
                let (Some(pid), Some(tgid)) = (u32_at(16), u32_at(20)) else {
                    return;
                };
                if pid != tgid {
                    self.thread_events += 1;
                    return;
                }
                if let (Some(m), Some(raw)) = (self.members.get_mut(&pid), ev.get(24..40)) {
                    self.feed.renamed(pid);
                    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                    m.name = String::from_utf8_lossy(&raw[..end]).into_owned();
                }
            }
            PROC_EVENT_EXIT => {
                let (Some(pid), Some(tgid), Some(code)) = (u32_at(16), u32_at(20), u32_at(24))
                else {
                    return;
                };
                // A thread's exit is no process's end.
                if pid != tgid {
                    self.thread_events += 1;
                    return;
                }
                if let Some(m) = self.members.get_mut(&pid) {
                    m.ended_ns = Some(ts);
                    m.wait_status = i32::try_from(code).ok();
                }
            }
            _ => {}
        }
    }

    /// Whether every birth and death of the run's tree was seen.
    pub(crate) fn complete(&self) -> bool {
        self.overflows == 0 && self.dropped == 0
    }
}

/// A process's command name from `/proc` (it may be gone already).
fn comm(pid: u32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(s.trim_end_matches('\n').to_string())
}

/// The listening thread.
pub(crate) struct ProcessEvents {
    stop: Arc<AtomicBool>,
    /// Written at the end, to wake the thread out of its wait at once.
    wake: Option<OwnedFd>,
    handle: JoinHandle<Lifetimes>,
    feed: Feed,
}

impl ProcessEvents {
    /// Subscribes to the kernel's process events and starts listening;
    /// `Err`: why not (no `CAP_NET_ADMIN` before Linux 6.6, no connector in
    /// the kernel).
    pub(crate) fn start() -> Result<ProcessEvents, String> {
        Self::start_with(super::event_filter::wanted())
    }

    /// [`ProcessEvents::start`], with the socket filter or without it.
    fn start_with(filter: bool) -> Result<ProcessEvents, String> {
        let (sock, filter) = subscribe(filter).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (needs CAP_NET_ADMIN before Linux 6.6)"
            } else {
                ""
            };
            format!("the kernel's process events are not readable{hint}: {e}")
        })?;
        if let Err(e) = filter {
            crate::say::say!(
                "memprobe: warning: process events unfiltered (every thread's events are read): {e}"
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let me = std::process::id();
        let feed = Feed::default();
        let f = feed.clone();
        // SAFETY: plain eventfd call.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        // SAFETY: a new descriptor owned by nobody else.
        let wake = (wake >= 0).then(|| unsafe { OwnedFd::from_raw_fd(wake) });
        let waiter = wake.as_ref().and_then(|w| w.try_clone().ok());
        let handle = thread::Builder::new()
            .name("memprobe-procev".into())
            .spawn(move || listen(&sock, waiter.as_ref(), &s, me, f))
            .map_err(|e| format!("cannot start the process events thread: {e}"))?;
        Ok(ProcessEvents {
            stop,
            wake,
            handle,
            feed,
        })
    }

    /// The births and renames of the tree, for the sampler.
    pub(crate) fn feed(&self) -> Feed {
        self.feed.clone()
    }

    /// Reads every event already sent, stops and returns what was seen.
    /// Call after the command was reaped: its exit was sent before.
    pub(crate) fn finish(self) -> Lifetimes {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = &self.wake {
            let one = 1u64.to_ne_bytes();
            // SAFETY: eight bytes to an eventfd we own.
            unsafe { libc::write(w.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
        self.handle.join().unwrap_or_else(|_| Lifetimes {
            overflows: 1,
            ..Lifetimes::default()
        })
    }
}

/// The subscribed socket, and whether its filter, where wanted, was
/// attached (`Err`: the kernel refused it; the socket works unfiltered).
fn subscribe(filter: bool) -> io::Result<(OwnedFd, io::Result<()>)> {
    // SAFETY: plain socket call.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_CONNECTOR,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // Before subscribing: no unfiltered event is ever queued.
    let filter = if filter {
        super::event_filter::attach(fd)
    } else {
        Ok(())
    };
    // A large buffer: events come for the whole machine. FORCE needs
    // CAP_NET_ADMIN, which a listener has; the plain one is the fallback.
    let size: libc::c_int = 8 << 20;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: a valid int option.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            break;
        }
    }
    // Without a wake-up descriptor, the listener looks at its stop flag
    // every 50 ms (see `listen`).
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    // SAFETY: a valid timeval option.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    // SAFETY: sockaddr_nl is plain data.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_groups = CN_IDX_PROC;
    // SAFETY: a valid sockaddr_nl of its size.
    let rc = unsafe {
        libc::bind(
            fd,
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // nlmsghdr + cn_msg + the operation.
    let mut msg = Vec::with_capacity(NLMSG_HDR + CN_MSG + 4);
    let total = (NLMSG_HDR + CN_MSG + 4) as u32;
    msg.extend_from_slice(&total.to_ne_bytes());
    msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&std::process::id().to_ne_bytes());
    msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&4u16.to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    // SAFETY: sending our buffer of its length.
    let sent = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((sock, filter))
}

fn listen(
    sock: &OwnedFd,
    wake: Option<&OwnedFd>,
    stop: &AtomicBool,
    me: u32,
    feed: Feed,
) -> Lifetimes {
    let mut seen = Lifetimes {
        feed,
        ..Lifetimes::default()
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Once asked to stop, read what is queued without waiting.
        let stopping = stop.load(Ordering::SeqCst);
        // Sleeps until an event or the end, rather than waking every 50 ms
        // (the socket's timeout, kept for a kernel without eventfd).
        if let (false, Some(w)) = (stopping, wake) {
            wait_readable(sock, w);
        }
        let flags = if stopping || wake.is_some() {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        // SAFETY: receiving into our buffer of its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
        if n < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::ENOBUFS) => {
                    seen.overflows += 1;
                    seen.feed.lost();
                    continue;
                }
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) if !stopping => continue,
                _ => return seen,
            }
        }
        let n = usize::try_from(n).unwrap_or(0);
        // One datagram may hold several netlink messages.
        let mut off = 0;
        while off + NLMSG_HDR <= n {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap_or([0; 4])) as usize;
            if len < NLMSG_HDR || off + len > n {
                break;
            }
            if let Some(ev) = buf.get(off + NLMSG_HDR + CN_MSG..off + len) {
                seen.event(ev, me);
            }
            off += (len + 3) & !3;
        }
    }
}

/// Waits until the socket or the wake-up descriptor can be read (or a
/// signal interrupts the wait).
fn wait_readable(sock: &OwnedFd, wake: &OwnedFd) {
    let mut fds = [sock.as_raw_fd(), wake.as_raw_fd()].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: two valid pollfd entries.
    unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork(ts: u64, parent: u32, child: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&PROC_EVENT_FORK.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&ts.to_ne_bytes());
        for x in [parent, parent, child, child] {
            v.extend_from_slice(&x.to_ne_bytes());
        }
        v
    }

    fn exit(ts: u64, pid: u32, tgid: u32, code: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&PROC_EVENT_EXIT.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&ts.to_ne_bytes());
        for x in [pid, tgid, code, 17, 1, 1] {
            v.extend_from_slice(&x.to_ne_bytes());
        }
        v
    }

    /// The tree grows from memprobe's own fork; other processes' forks and
    /// threads' exits are no members' business.
    #[test]
    fn the_tree_is_followed_from_memprobe() {
        let me = 10;
        let mut l = Lifetimes::default();
        l.event(&fork(1, me, 4000), me);
        l.event(&fork(2, 4000, 4001), me);
        l.event(&fork(3, 999, 5000), me);
        l.event(&exit(4, 4002, 4001, 0), me);
        assert!(l.members[&4001].ended_ns.is_none(), "a thread ended");
        l.event(&exit(5, 4001, 4001, libc::SIGKILL as u32), me);
        l.event(&exit(6, 5000, 5000, libc::SIGKILL as u32), me);
        assert_eq!(l.members.len(), 2);
        assert!(!l.members.contains_key(&5000));
        let w = &l.members[&4001];
        assert_eq!((w.ppid, w.born_ns, w.ended_ns), (4000, 2, Some(5)));
        assert_eq!(w.wait_status, Some(libc::SIGKILL));
        assert!(l.complete());
    }

    /// Where this machine lets memprobe listen (root), a short-lived
    /// grandchild is seen born and killed.
    #[test]
    fn a_grandchild_killed_at_once_is_seen() {
        let events = match ProcessEvents::start() {
            Ok(e) => e,
            Err(why) => {
                eprintln!("not listening here: {why}");
                assert!(!why.is_empty());
                return;
            }
        };
        let out = std::process::Command::new("sh")
            .args(["-c", "sh -c 'kill -9 $$'; exit 0"])
            .status()
            .unwrap();
        assert!(out.success());
        let seen = events.finish();
        let killed: Vec<&Life> = seen
            .members
            .values()
            .filter(|m| m.wait_status == Some(libc::SIGKILL) && m.name == "sh")
            .collect();
        assert_eq!(killed.len(), 1, "{seen:#?}");
        let parent = &seen.members[&killed[0].ppid];
        assert_eq!(parent.wait_status, Some(0));
    }

    /// Set in the child of [`a_child_with_200_threads_keeps_its_processes`].
    const THREADS_ENV: &str = "MEMPROBE_TEST_SPAWN_THREADS";

    /// Runs only as that child (re-executed test binary): spawns and joins
    /// the threads, then runs a process that exits with 3.
    #[test]
    fn helper_spawns_threads_then_a_process() {
        let Some(n) = std::env::var(THREADS_ENV).ok().and_then(|n| n.parse().ok()) else {
            return;
        };
        let threads: Vec<_> = (0..n).map(|_| thread::spawn(|| {})).collect();
        for t in threads {
            t.join().unwrap();
        }
        let st = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(3));
    }

    /// What was seen while the child ran, and the child's pid.
    fn run_threads(filter: bool) -> Option<(Lifetimes, u32)> {
        let events = match ProcessEvents::start_with(filter) {
            Ok(e) => e,
            Err(why) => {
                eprintln!("not listening here: {why}");
                return None;
            }
        };
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "commands::run::process_events::tests::helper_spawns_threads_then_a_process",
                "--test-threads=1",
                "-q",
            ])
            .env(THREADS_ENV, "200")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(child.wait().unwrap().success());
        Some((events.finish(), child.id()))
    }

    /// The members born of `pid`.
    fn children(seen: &Lifetimes, pid: u32) -> Vec<&Life> {
        seen.members.values().filter(|m| m.ppid == pid).collect()
    }

    /// With the filter, a child's 200 threads reach the listener not at
    /// all (nor any other thread's events on the machine), while the
    /// processes' births and exits still do; without it, at least those
    /// 400 thread events are read.
    #[test]
    fn a_child_with_200_threads_keeps_its_processes() {
        let Some((seen, pid)) = run_threads(true) else {
            return;
        };
        assert!(seen.complete(), "{seen:#?}");
        assert_eq!(seen.thread_events, 0, "{seen:#?}");
        let child = &seen.members[&pid];
        assert_eq!(child.wait_status, Some(0), "{seen:#?}");
        let grandchildren = children(&seen, pid);
        assert_eq!(grandchildren.len(), 1, "{seen:#?}");
        let g = grandchildren[0];
        assert_eq!(g.wait_status, Some(3 << 8), "{seen:#?}");
        assert!(g.ended_ns >= Some(g.born_ns));

        let (unfiltered, pid) = run_threads(false).expect("listening as before");
        assert!(
            unfiltered.thread_events >= 400,
            "{}",
            unfiltered.thread_events
        );
        assert_eq!(unfiltered.members[&pid].wait_status, Some(0));
        let grandchildren = children(&unfiltered, pid);
        assert_eq!(grandchildren.len(), 1, "{unfiltered:#?}");
        assert_eq!(grandchildren[0].wait_status, Some(3 << 8));
    }
}
