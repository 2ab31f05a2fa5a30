//! A classic BPF socket filter for the process events socket
//! ([`crate::commands::run::process_events`]): the kernel sends the events of
//! every process and thread on the machine, and without a filter memprobe
//! wakes for each one. The filter drops, in the kernel and before any
//! wake-up, what the listener would discard anyway: a thread's birth
//! (`fork` with `child_pid != child_tgid`), a thread's exit or rename
//! (`pid != tgid`), and every kind of event it never reads (uid, gid, sid,
//! ptrace, coredump, …). Process births, execs, process renames, process
//! exits and the connector's acknowledgements (`PROC_EVENT_NONE`) pass.
//!
//! Offsets: `struct nlmsghdr` (16 bytes), `struct cn_msg` (20 bytes), then
//! `struct proc_event` (`what` u32, `cpu` u32, `timestamp_ns` u64, then the
//! union at 16), as in `linux/netlink.h`, `linux/connector.h` and
//! `linux/cn_proc.h`. A `BPF_W|BPF_ABS` load reads the word big-endian (as
//! network order), while the kernel writes these fields in host order:
//! every constant compared is therefore the loaded image of the host-order
//! value ([`loaded`]). A message too short to hold the fields is passed (a
//! load beyond the end would drop it).
//!
//! `MEMPROBE_PROCEV_NO_FILTER=1` leaves the filter out: for measuring what
//! it saves, nothing else.

use std::io;
use std::os::fd::RawFd;

/// Turns the filter off (for measurement only).
pub(crate) const NO_FILTER_ENV: &str = "MEMPROBE_PROCEV_NO_FILTER";

const PROC_EVENT_NONE: u32 = 0x0000_0000;
const PROC_EVENT_FORK: u32 = 0x0000_0001;
const PROC_EVENT_EXEC: u32 = 0x0000_0002;
const PROC_EVENT_COMM: u32 = 0x0000_0200;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;

/// Where `struct proc_event` starts in the message.
const EVENT: u32 = 16 + 20;
/// `what`.
const WHAT: u32 = EVENT;
/// The union: `fork`'s `child_pid`, `child_tgid`.
const FORK_CHILD_PID: u32 = EVENT + 16 + 8;
const FORK_CHILD_TGID: u32 = EVENT + 16 + 12;
/// `exit`'s and `comm`'s `process_pid`, `process_tgid`.
const PROCESS_PID: u32 = EVENT + 16;
const PROCESS_TGID: u32 = EVENT + 16 + 4;
/// The shortest message every load above fits in.
const MIN_LEN: u32 = FORK_CHILD_TGID + 4;

/// The value a `BPF_W|BPF_ABS` load yields for a field the kernel wrote as
/// `v` in host order.
const fn loaded(v: u32) -> u32 {
    u32::from_be_bytes(v.to_ne_bytes())
}

const fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const LD_LEN: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_LEN;
const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE_K: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const JEQ_X: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_X;
const TAX: u32 = libc::BPF_MISC | libc::BPF_TAX;
const RET_K: u32 = libc::BPF_RET | libc::BPF_K;
/// Keep the whole message.
const KEEP: u32 = u32::MAX;

/// The program. Jump offsets count the instructions skipped; the indices
/// in the comments keep them checkable.
pub(crate) fn program() -> Vec<libc::sock_filter> {
    vec![
        /* 0 */ stmt(LD_LEN, 0),
        /* 1 */ jump(JGE_K, MIN_LEN, 0, 15), // short: 17 (keep)
        /* 2 */ stmt(LD_W_ABS, WHAT),
        /* 3 */ jump(JEQ_K, loaded(PROC_EVENT_FORK), 5, 0), // 9
        /* 4 */ jump(JEQ_K, loaded(PROC_EVENT_EXIT), 8, 0), // 13
        /* 5 */ jump(JEQ_K, loaded(PROC_EVENT_COMM), 7, 0), // 13
        /* 6 */ jump(JEQ_K, loaded(PROC_EVENT_EXEC), 10, 0), // 17
        /* 7 */ jump(JEQ_K, loaded(PROC_EVENT_NONE), 9, 0), // 17
        /* 8 */ stmt(RET_K, 0),
        /* 9 */ stmt(LD_W_ABS, FORK_CHILD_PID), // fork: a process's only
        /* 10 */ stmt(TAX, 0),
        /* 11 */ stmt(LD_W_ABS, FORK_CHILD_TGID),
        /* 12 */ jump(JEQ_X, 0, 4, 5), // 17 : 18
        /* 13 */ stmt(LD_W_ABS, PROCESS_PID), // exit, comm: a process's only
        /* 14 */ stmt(TAX, 0),
        /* 15 */ stmt(LD_W_ABS, PROCESS_TGID),
        /* 16 */ jump(JEQ_X, 0, 0, 1), // 17 : 18
        /* 17 */ stmt(RET_K, KEEP),
        /* 18 */ stmt(RET_K, 0),
    ]
}

/// Whether the filter is wanted: unless [`NO_FILTER_ENV`] is set to
/// anything but `0`.
pub(crate) fn wanted() -> bool {
    !std::env::var_os(NO_FILTER_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Attaches [`program`] to `fd`. `Err`: the kernel refused it; the socket
/// then works as before, unfiltered.
pub(crate) fn attach(fd: RawFd) -> io::Result<()> {
    attach_program(fd, &program())
}

fn attach_program(fd: RawFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        // The kernel copies the program; it only reads through this pointer.
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: a valid sock_fprog pointing at `prog`, alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// A connector message as the kernel builds it: nlmsghdr, cn_msg, then
    /// `proc_event` (40 bytes) with `what` and the union's first words.
    fn message(what: u32, union: &[u32]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&76u32.to_ne_bytes());
        v.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        v.extend_from_slice(&[0; 2 + 4 + 4]);
        v.extend_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0]); // CN_IDX_PROC, CN_VAL_PROC
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(&40u16.to_ne_bytes());
        v.extend_from_slice(&[0; 2]);
        v.extend_from_slice(&what.to_ne_bytes());
        v.extend_from_slice(&3u32.to_ne_bytes()); // cpu
        v.extend_from_slice(&123_456_789u64.to_ne_bytes());
        for w in union {
            v.extend_from_slice(&w.to_ne_bytes());
        }
        v.resize(76, 0);
        v
    }

    fn pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        // SAFETY: two new descriptors owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// The kernel runs the program on each datagram sent to the filtered
    /// end: what passes is read back, in order; a marker (passed, being too
    /// short) ends each message's check.
    fn passes(msgs: &[Vec<u8>]) -> Vec<bool> {
        let (tx, rx) = pair();
        attach_program(rx.as_raw_fd(), &program()).expect("the kernel takes the program");
        let marker = vec![0xAB; 8];
        let mut out = Vec::new();
        for m in msgs {
            for d in [m, &marker] {
                // SAFETY: sending our buffer of its length.
                let n = unsafe { libc::send(tx.as_raw_fd(), d.as_ptr().cast(), d.len(), 0) };
                assert_eq!(n, d.len() as isize);
            }
            let mut buf = [0u8; 128];
            // SAFETY: receiving into our buffer of its length.
            let n = unsafe { libc::recv(rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let got = &buf[..usize::try_from(n).expect("recv")];
            if got == &marker[..] {
                out.push(false);
            } else {
                assert_eq!(got, &m[..]);
                out.push(true);
                // SAFETY: as above.
                let n =
                    unsafe { libc::recv(rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                assert_eq!(&buf[..usize::try_from(n).expect("recv")], &marker[..]);
            }
        }
        out
    }

    #[test]
    fn the_kernel_keeps_process_events_and_drops_threads_and_other_kinds() {
        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            // fork: parent_pid, parent_tgid, child_pid, child_tgid.
            (
                "process fork",
                message(PROC_EVENT_FORK, &[10, 10, 4000, 4000]),
                true,
            ),
            (
                "thread fork",
                message(PROC_EVENT_FORK, &[10, 10, 4001, 4000]),
                false,
            ),
            (
                "fork by a thread",
                message(PROC_EVENT_FORK, &[11, 10, 70_000, 70_000]),
                true,
            ),
            ("exec", message(PROC_EVENT_EXEC, &[4000, 4000]), true),
            (
                "process exit",
                message(PROC_EVENT_EXIT, &[4000, 4000, 9, 17]),
                true,
            ),
            (
                "thread exit",
                message(PROC_EVENT_EXIT, &[4001, 4000, 0, 0]),
                false,
            ),
            (
                "process rename",
                message(PROC_EVENT_COMM, &[4000, 4000]),
                true,
            ),
            (
                "thread rename",
                message(PROC_EVENT_COMM, &[4001, 4000]),
                false,
            ),
            ("ack", message(PROC_EVENT_NONE, &[0]), true),
            ("uid", message(0x4, &[4000, 4000, 0, 0]), false),
            ("gid", message(0x40, &[4000, 4000, 0, 0]), false),
            ("sid", message(0x80, &[4000, 4000]), false),
            ("ptrace", message(0x100, &[4000, 4000, 1, 1]), false),
            ("coredump", message(0x4000_0000, &[4000, 4000, 1, 1]), false),
            (
                "nonzero exit",
                message(0x2000_0000, &[4000, 4000, 9, 17]),
                false,
            ),
            // A pid whose bytes differ in each position: byte order matters.
            (
                "wide pids",
                message(PROC_EVENT_FORK, &[1, 1, 0x0102_0304, 0x0102_0304]),
                true,
            ),
            (
                "wide thread",
                message(PROC_EVENT_FORK, &[1, 1, 0x0102_0304, 0x0403_0201]),
                false,
            ),
            ("short", message(PROC_EVENT_FORK, &[])[..40].to_vec(), true),
        ];
        let got = passes(&cases.iter().map(|c| c.1.clone()).collect::<Vec<_>>());
        for ((name, _, want), got) in cases.iter().zip(got) {
            assert_eq!(got, *want, "{name}");
        }
    }

    /// A program the kernel refuses is an error, and the socket keeps
    /// receiving everything, as without a filter.
    #[test]
    fn a_refused_program_leaves_the_socket_unfiltered() {
        let (tx, rx) = pair();
        let bad = [jump(JEQ_K, 0, 7, 7), stmt(RET_K, 0)];
        let err = attach_program(rx.as_raw_fd(), &bad).expect_err("a jump out of the program");
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
        let m = message(PROC_EVENT_FORK, &[10, 10, 4001, 4000]);
        // SAFETY: sending our buffer of its length.
        let n = unsafe { libc::send(tx.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
        assert_eq!(n, m.len() as isize);
        let mut buf = [0u8; 128];
        // SAFETY: receiving into our buffer of its length.
        let n = unsafe { libc::recv(rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        assert_eq!(&buf[..usize::try_from(n).expect("recv")], &m[..]);
    }

    /// No jump leaves the program, and it ends in a return.
    #[test]
    fn every_jump_lands_inside_the_program() {
        let p = program();
        for (i, ins) in p.iter().enumerate() {
            if u32::from(ins.code) & 0x07 == libc::BPF_JMP {
                assert!(i + 1 + usize::from(ins.jt.max(ins.jf)) < p.len(), "{i}");
            }
        }
        assert_eq!(u32::from(p[p.len() - 1].code), RET_K);
    }
}
