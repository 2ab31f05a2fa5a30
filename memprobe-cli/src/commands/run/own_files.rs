//! The sampling thread's own file table.
//!
//! In a process of several threads, every system call that takes a
//! descriptor (each `statm` `pread`) takes and drops a reference on its
//! file, because another thread could close it meanwhile; a process with
//! one thread skips that. Measured here, a `statm` read costs a quarter
//! more once a second thread exists, which is a quarter of the floor that
//! `memprobe run` is held to per process. `unshare(CLONE_FILES)` gives the
//! sampling thread a table of its own, so that its reads take the
//! single-owner path while memprobe's other threads keep theirs.
//!
//! The private table starts as a copy of the shared one. A copy of a pipe
//! or of a Unix socket would keep it open after its owner closes it, and
//! its peer would wait for an end of file that never comes; those copies
//! are replaced at once by `/dev/null` under the same number (not closed:
//! a library that set up its descriptor before and uses it from this
//! thread must not find a file this thread opened later under that
//! number). Other descriptors (files, `/proc`, netlink, the kernel log,
//! devices) are kept: an extra reference to them changes nothing. The
//! standard three stay, so that the thread can still say something.
//! Threads started from the sampling thread afterwards share its table
//! (and undo the gain): the kinds reader starts before it.

use std::os::fd::AsRawFd;

/// Gives the calling thread a file table of its own, with `/dev/null` in
/// place of the copy's pipes and Unix sockets; `false` where the kernel
/// refused (the thread then keeps the shared one: slower, nothing else).
pub(crate) fn own_file_table() -> bool {
    // SAFETY: unshare with CLONE_FILES only affects the calling thread's
    // descriptor table.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        return false;
    }
    let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    else {
        return true;
    };
    for fd in held_by_others() {
        // SAFETY: replaces this thread's private copy only; dup3 closes
        // what was there.
        unsafe { libc::dup3(null.as_raw_fd(), fd, libc::O_CLOEXEC) };
    }
    true
}

/// The descriptors above the standard three in this thread's table that
/// are pipes or Unix sockets.
fn held_by_others() -> Vec<i32> {
    // /proc/thread-self is Linux 3.17's; before it, the thread's own path.
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let dir = std::fs::read_dir("/proc/thread-self/fd")
        .or_else(|_| std::fs::read_dir(format!("/proc/self/task/{tid}/fd")));
    let Ok(dir) = dir else {
        return Vec::new();
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    // The directory's own descriptor is closed by now: it fails fstat.
    fds.into_iter().filter(|&fd| pipe_or_unix(fd)).collect()
}

fn pipe_or_unix(fd: i32) -> bool {
    // SAFETY: stat is plain data, written by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid stat pointer; a closed fd only fails.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    let kind = st.st_mode & libc::S_IFMT;
    if kind == libc::S_IFIFO {
        return true;
    }
    if kind != libc::S_IFSOCK {
        return false;
    }
    let mut domain: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int-sized option into an int.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut domain as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    rc == 0 && domain == libc::AF_UNIX
}

/// Whether `fd` in the calling thread's table is a pipe (for the tests).
#[cfg(test)]
fn is_fifo(fd: i32) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(format!("/proc/thread-self/fd/{fd}"))
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    /// A pipe's write end closed by its owner while the sampling thread
    /// runs: the reader sees its end (the private copy was closed), and a
    /// plain file stays usable in the thread.
    #[test]
    fn copies_of_pipes_and_unix_sockets_do_not_keep_them_open() {
        let mut fds = [0; 2];
        // SAFETY: a two-int array for pipe's ends.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors, owned once each.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/statm").unwrap();
        let (wfd, afd, ffd) = (w.as_raw_fd(), a.as_raw_fd(), file.as_raw_fd());
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            assert!(own_file_table());
            let kept = std::fs::metadata(format!("/proc/thread-self/fd/{ffd}")).is_ok();
            let null = std::fs::read_link(format!("/proc/thread-self/fd/{wfd}"))
                .is_ok_and(|p| p == std::path::Path::new("/dev/null"));
            tx.send((is_fifo(wfd), kept && null, pipe_or_unix(afd)))
                .unwrap();
            // Stays alive (with its table) until the checks are done.
            let _ = done_rx.recv_timeout(Duration::from_secs(10));
        });
        let (fifo_left, file_kept, unix_left) = rx.recv().unwrap();
        assert!(
            !fifo_left && !unix_left,
            "the thread kept a pipe or a socket"
        );
        assert!(
            file_kept,
            "a plain file was closed, or the pipe's number not held by /dev/null"
        );
        drop(w);
        drop(a);
        let mut pipe_end = std::fs::File::from(r);
        let mut byte = [0u8; 1];
        assert_eq!(pipe_end.read(&mut byte).unwrap(), 0, "end of file");
        let mut b = b;
        assert_eq!(b.read(&mut byte).unwrap(), 0, "the socket's end too");
        drop(file);
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
