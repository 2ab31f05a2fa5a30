//! Signals: blocked in every thread of memprobe and taken synchronously
//! (`sigwaitinfo` / `sigtimedwait`), so no code runs in a signal handler.
//!
//! `run` forwards them to the child ([`Forwarder`]); `watch` waits for them
//! between refreshes ([`wait`]).
//!
//! Forwarding rule. The child stays in memprobe's process group, so a
//! terminal's Ctrl-C (or Ctrl-\, or a hangup) already reaches it: the kernel
//! sends those to the whole foreground group. Such signals carry
//! `si_code == SI_KERNEL` and are not forwarded, unless the child has moved
//! to a process group of its own (then the terminal's signal missed it).
//! Signals that a process sent with `kill` (`si_code <= 0`: `kill
//! <memprobe pid>`, a supervisor, `docker stop`) are forwarded once. A `kill`
//! aimed at the whole process group (`kill -TERM -<pgid>`) reaches the child
//! directly and once more through memprobe: siginfo names the sender, not
//! whether the target was a group, so that case cannot be told apart.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Signals `run` forwards to the child.
pub(crate) const FORWARDED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Signals that end `watch`.
pub(crate) const STOPPING: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// A set of signals.
#[derive(Clone, Copy)]
pub(crate) struct SigSet(libc::sigset_t);

impl SigSet {
    /// The set holding `signals`.
    pub(crate) fn of(signals: &[libc::c_int]) -> SigSet {
        // SAFETY: sigset_t is plain data; sigemptyset initializes it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
        unsafe {
            libc::sigemptyset(&mut set);
            for &s in signals {
                libc::sigaddset(&mut set, s);
            }
        }
        SigSet(set)
    }

    /// Blocks the set in the calling thread (threads spawned afterwards
    /// inherit the mask, and so would a child: [`crate::commands::run::child::spawn`]
    /// clears it between fork and exec).
    pub(crate) fn block(&self) -> io::Result<()> {
        // SAFETY: valid set pointer; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &self.0, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }
}

/// A signal taken from the pending set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) signal: libc::c_int,
    /// `si_code`: `SI_KERNEL` for terminal-generated signals, `<= 0` for
    /// signals sent by a process.
    pub(crate) code: libc::c_int,
    /// The sender's pid (0 for the kernel or a sender outside this PID
    /// namespace).
    pub(crate) sender: libc::pid_t,
}

/// Waits for one of the (blocked) signals in `set`, at most `timeout`
/// (forever with `None`). `None` on timeout.
pub(crate) fn wait(set: &SigSet, timeout: Option<Duration>) -> Option<Received> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        // SAFETY: siginfo_t is plain data, written by the kernel.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = match deadline {
            None => {
                // SAFETY: valid set and info pointers.
                unsafe { libc::sigwaitinfo(&set.0, &mut info) }
            }
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                let ts = libc::timespec {
                    tv_sec: left.as_secs() as libc::time_t,
                    tv_nsec: left.subsec_nanos() as libc::c_long,
                };
                // SAFETY: valid set, info and timespec pointers.
                unsafe { libc::sigtimedwait(&set.0, &mut info, &ts) }
            }
        };
        if rc > 0 {
            return Some(Received {
                signal: rc,
                code: info.si_code,
                // SAFETY: the kernel filled `info` for signal `rc`; si_pid is
                // the sender field of the kill/queue union member.
                sender: unsafe { info.si_pid() },
            });
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            _ => return None, // EAGAIN: timed out.
        }
    }
}

/// Whether `run` should pass `r` on to a child in process group
/// `child_pgid` when memprobe is in `own_pgid` (see the module docs).
pub(crate) fn should_forward(
    r: &Received,
    child_pgid: Option<libc::pid_t>,
    own_pgid: libc::pid_t,
) -> bool {
    if r.code == libc::SI_KERNEL {
        child_pgid.is_some_and(|g| g != own_pgid)
    } else {
        true
    }
}

/// A signal `run` received while the child ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SignalEvent {
    pub(crate) signal: libc::c_int,
    /// Nanoseconds since the child was spawned.
    pub(crate) at_ns: u64,
    /// Whether memprobe passed it on.
    pub(crate) forwarded: bool,
}

/// Forwards signals to the child from a dedicated thread.
pub(crate) struct Forwarder {
    /// The child's pid while it may be signalled; `None` once it is about to
    /// be reaped (a zombie's pid cannot be reused, a reaped one can).
    target: Arc<Mutex<Option<libc::pid_t>>>,
    events: Arc<Mutex<Vec<SignalEvent>>>,
}

impl Forwarder {
    /// Starts forwarding the (already blocked) signals of `set` to `child`.
    pub(crate) fn start(set: SigSet, child: libc::pid_t, t0: Instant) -> io::Result<Forwarder> {
        let target = Arc::new(Mutex::new(Some(child)));
        let events = Arc::new(Mutex::new(Vec::new()));
        let (t, e) = (Arc::clone(&target), Arc::clone(&events));
        // SAFETY: getpgrp has no preconditions.
        let own_pgid = unsafe { libc::getpgrp() };
        std::thread::Builder::new()
            .name("memprobe-signals".into())
            .spawn(move || loop {
                let Some(r) = wait(&set, None) else { continue };
                let at_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                let Ok(guard) = t.lock() else { return };
                let Some(pid) = *guard else {
                    // The child is gone: nothing to pass on; keep taking
                    // signals so they do not kill memprobe while it writes.
                    continue;
                };
                // SAFETY: getpgid has no memory preconditions.
                let pgid = unsafe { libc::getpgid(pid) };
                let forward = should_forward(&r, (pgid > 0).then_some(pgid), own_pgid);
                if forward {
                    // SAFETY: kill has no memory preconditions; `pid` is our
                    // unreaped child, so it names no other process.
                    unsafe { libc::kill(pid, r.signal) };
                }
                // Recorded before the target's lock is released: `disarm`
                // takes that lock first, so a signal that ended the child is
                // always in the list it returns.
                if let Ok(mut ev) = e.lock() {
                    ev.push(SignalEvent {
                        signal: r.signal,
                        at_ns,
                        forwarded: forward,
                    });
                }
                drop(guard);
            })?;
        Ok(Forwarder { target, events })
    }

    /// Stops forwarding: call before reaping the child. Returns what was
    /// received.
    pub(crate) fn disarm(&self) -> Vec<SignalEvent> {
        if let Ok(mut t) = self.target.lock() {
            *t = None;
        }
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

/// `SIGTERM`-style name of a signal number.
pub(crate) fn name(signal: libc::c_int) -> String {
    let n = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {signal}"),
    };
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_signals_are_not_forwarded_to_the_same_group() {
        let tty = Received {
            signal: libc::SIGINT,
            code: libc::SI_KERNEL,
            sender: 0,
        };
        assert!(!should_forward(&tty, Some(10), 10));
        assert!(should_forward(&tty, Some(11), 10), "child left the group");
        let killed = Received {
            signal: libc::SIGTERM,
            code: libc::SI_USER,
            sender: 1234,
        };
        assert!(should_forward(&killed, Some(10), 10));
        let from_outside_namespace = Received {
            sender: 0,
            ..killed
        };
        assert!(should_forward(&from_outside_namespace, Some(10), 10));
    }

    #[test]
    fn names() {
        assert_eq!(name(libc::SIGKILL), "SIGKILL");
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(64), "signal 64");
    }
}
