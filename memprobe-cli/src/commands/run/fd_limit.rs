//! The descriptor limit of `memprobe run` itself.
//!
//! The sampler keeps up to three descriptors open per process of the tree
//! (`statm`, `status`, `children`): under the common soft limit of 1,024
//! that stops near 340 processes, where a node's tree reaches hundreds.
//! memprobe raises its soft limit to the hard one at start, and gives the
//! command the limit it had (set back between fork and exec), so that the
//! program measured runs as it would without memprobe. Where even the hard
//! limit runs out, the sampler reads by path ([`super::tree_sampler`]).

/// This process's `RLIMIT_NOFILE` now.
pub(crate) fn current() -> Option<libc::rlimit> {
    // SAFETY: rlimit is plain data, written by the kernel.
    let mut l: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rlimit pointer.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0).then_some(l)
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit; the limit
/// before, for the command, when it changed.
pub(crate) fn raise() -> Option<libc::rlimit> {
    let before = current()?;
    if before.rlim_cur >= before.rlim_max {
        return None;
    }
    let raised = libc::rlimit {
        rlim_cur: before.rlim_max,
        rlim_max: before.rlim_max,
    };
    // SAFETY: a valid rlimit pointer.
    (unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0).then_some(before)
}

/// Sets `limit` back (in the child between fork and exec: one system call,
/// async-signal-safe).
pub(crate) fn restore(limit: &libc::rlimit) -> bool {
    // SAFETY: a valid rlimit pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, limit) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a child of the test (the limit is the process's): a soft limit
    /// below the hard one is raised, and set back.
    #[test]
    fn raises_to_the_hard_limit_and_sets_back() {
        // SAFETY: fork in a test; the child only makes system calls and
        // exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let now = || current().expect("getrlimit");
            let code = (|| {
                let l = now();
                if l.rlim_max < 64 {
                    return 0; // nothing to lower
                }
                let low = libc::rlimit {
                    rlim_cur: 32,
                    rlim_max: l.rlim_max,
                };
                if !restore(&low) {
                    return 1;
                }
                let Some(before) = raise() else { return 2 };
                if before.rlim_cur != 32 {
                    return 3;
                }
                let l = now();
                if l.rlim_cur != l.rlim_max {
                    return 4;
                }
                if raise().is_some() {
                    return 5; // already at the hard limit
                }
                if !restore(&before) {
                    return 6;
                }
                if now().rlim_cur != 32 {
                    return 7;
                }
                0
            })();
            // SAFETY: ends the forked child without running the test's
            // destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
