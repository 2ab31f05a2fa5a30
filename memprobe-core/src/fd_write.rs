//! Writing to a file descriptor memprobe does not own (a caller's, or
//! standard error) without ever raising `SIGPIPE`.
//!
//! A write to a pipe or socket whose reader is gone raises `SIGPIPE`, which
//! kills a C host that has not ignored it (Rust programs ignore it; a
//! library cannot assume its host does). memprobe's writes must fail with
//! an I/O error instead, so each one blocks `SIGPIPE` on the writing
//! thread, and when the write fails with `EPIPE` takes the signal it raised
//! off the thread's pending set before unblocking — the way libraries that
//! write to descriptors they do not own do it. The host's handler, mask
//! and a `SIGPIPE` already pending are left as they were.

use std::io;

/// Writes `buf` to `fd` once (a short count is possible), `EPIPE` as an
/// error instead of a signal.
pub fn write_no_sigpipe(fd: i32, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: plain signal-set manipulation on stack values, and a write
    // from a valid buffer to a descriptor the caller named.
    unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        // A SIGPIPE already pending (blocked by the host) is the host's: one
        // our write raises merges with it, and must not be taken away.
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut pending);
        let already = libc::sigismember(&pending, libc::SIGPIPE) == 1;
        let mut old: libc::sigset_t = std::mem::zeroed();
        // Blocked by the host already: a signal raised stays pending on the
        // host's terms, as its own write would leave it.
        let blocked = !already
            && libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old) == 0
            && libc::sigismember(&old, libc::SIGPIPE) == 0;
        let n = libc::write(fd, buf.as_ptr().cast(), buf.len());
        let result = if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        };
        if blocked {
            if matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EPIPE)) {
                let zero = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                while libc::sigtimedwait(&pipe, std::ptr::null_mut(), &zero) < 0
                    && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                {
                }
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        result
    }
}

/// A writer to a descriptor memprobe does not own and never closes, whose
/// writes never raise `SIGPIPE` (a reader gone is an `EPIPE` error).
#[derive(Debug, Clone, Copy)]
pub struct FdWriter {
    fd: i32,
    /// Standard error's convention (Rust's `stderr()`): a closed descriptor
    /// swallows what is written instead of failing.
    closed_is_sink: bool,
}

impl FdWriter {
    /// A writer to `fd` (not checked: see the C ABI's check at the call that
    /// names it).
    pub fn new(fd: i32) -> FdWriter {
        FdWriter {
            fd,
            closed_is_sink: false,
        }
    }

    /// Standard error, as `std::io::stderr()` writes it (a closed one
    /// swallows the bytes), without `SIGPIPE`.
    pub fn stderr() -> FdWriter {
        FdWriter {
            fd: libc::STDERR_FILENO,
            closed_is_sink: true,
        }
    }
}

impl io::Write for FdWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match write_no_sigpipe(self.fd, buf) {
            Err(e) if self.closed_is_sink && e.raw_os_error() == Some(libc::EBADF) => Ok(buf.len()),
            r => r,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_pipe_without_reader_is_an_error_and_no_signal_stays_pending() {
        let mut fds = [0; 2];
        // SAFETY: a fresh pipe; both ends closed below.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            libc::close(fds[0]);
        }
        // The test harness ignores SIGPIPE; restore the default that would
        // kill a C host, so a signal raised here would end this test.
        // SAFETY: setting a standard disposition.
        let previous = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let r = FdWriter::new(fds[1]).write_all(b"lost");
        // SAFETY: a stack set filled by sigpending.
        let pending = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut set);
            libc::sigismember(&set, libc::SIGPIPE) == 1
        };
        // SAFETY: restoring the disposition saved above; closing our end.
        unsafe {
            libc::signal(libc::SIGPIPE, previous);
            libc::close(fds[1]);
        }
        let e = r.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
        assert!(!pending);
    }

    #[test]
    fn a_closed_descriptor_fails() {
        let mut fds = [0; 2];
        // SAFETY: a fresh pipe, closed at once: its numbers name nothing.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let e = FdWriter::new(fds[1]).write(b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }
}
