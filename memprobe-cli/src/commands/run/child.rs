//! The child: started like a shell starts a command, waited for with
//! `waitid` then reaped with `wait4` for its exact peak.

mod binary;

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Exit status when the command is not found (as shells do).
pub(crate) const NOT_FOUND: i32 = 127;
/// Exit status when the command was found but could not be executed.
pub(crate) const NOT_EXECUTABLE: i32 = 126;

/// A failed start: the exit status to use and the message to print.
#[derive(Debug)]
pub(crate) struct SpawnError {
    pub(crate) status: i32,
    pub(crate) message: String,
}

/// Starts `argv` with inherited stdio, environment and process group;
/// `oom_score_adj`: the value the child gets back when memprobe shielded
/// itself from the OOM killer (see [`crate::commands::run::oom_kill::shield_self`]);
/// `nofile`: the descriptor limit the child gets back when memprobe raised
/// its own (see [`crate::commands::run::fd_limit`]).
pub(crate) fn spawn(
    argv: &[OsString],
    env: &[(OsString, Option<OsString>)],
    oom_score_adj: Option<i32>,
    nofile: Option<libc::rlimit>,
) -> Result<u32, SpawnError> {
    let (program, args) = argv.split_first().ok_or_else(|| SpawnError {
        status: crate::exit::USAGE,
        message: "no command given".into(),
    })?;
    let shown = program.to_string_lossy();
    let mut cmd = Command::new(program);
    cmd.args(args);
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    // Formatted before the fork: the hook must not allocate.
    let adj = oom_score_adj.map(|v| {
        let text = v.to_string();
        let mut buf = [0u8; 16];
        buf[..text.len()].copy_from_slice(text.as_bytes());
        (buf, text.len())
    });
    // A binary file is executed by an execve of memprobe's own, so that a
    // binary the kernel refuses is not read by /bin/sh as a script (as
    // execvp would); any other file goes through execvp as before.
    let direct = binary::resolve(program, std::env::var_os("PATH").as_deref())
        .filter(|p| binary::file_looks_binary(p))
        .and_then(|p| binary::DirectExec::new(&p, argv, &binary::child_env(env)));
    // memprobe blocks the signals it forwards; a child inherits the mask
    // across exec and would never see them. Clear it between fork and exec.
    // SAFETY: the hook only calls sigemptyset, pthread_sigmask, open, write,
    // close, setrlimit and execve, which are async-signal-safe, and
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(l) = &nofile {
                // Lowering a soft limit is always allowed; were it refused,
                // the command would run with memprobe's, not fail to start.
                let _ = crate::commands::run::fd_limit::restore(l);
            }
            if let Some((buf, len)) = adj {
                let fd = libc::open(
                    c"/proc/self/oom_score_adj".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    libc::write(fd, buf.as_ptr().cast(), len);
                    libc::close(fd);
                }
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            match libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) {
                0 => {}
                e => return Err(io::Error::from_raw_os_error(e)),
            }
            match &direct {
                Some(d) => Err(d.exec()),
                None => Ok(()),
            }
        });
    }
    match cmd.spawn() {
        Ok(child) => Ok(child.id()),
        Err(e) => Err(spawn_error(&shown, &e)),
    }
}

fn spawn_error(program: &str, e: &io::Error) -> SpawnError {
    let has_slash = program.contains('/');
    match e.kind() {
        io::ErrorKind::NotFound if has_slash => SpawnError {
            status: NOT_FOUND,
            message: format!("{program}: no such file or directory"),
        },
        io::ErrorKind::NotFound => SpawnError {
            status: NOT_FOUND,
            message: format!("{program}: command not found"),
        },
        _ if e.raw_os_error() == Some(libc::ENOEXEC) => SpawnError {
            status: NOT_EXECUTABLE,
            message: format!(
                "{program}: cannot execute binary file: Exec format error (a program for another machine, or not a program)"
            ),
        },
        io::ErrorKind::PermissionDenied => SpawnError {
            status: NOT_EXECUTABLE,
            message: format!("{program}: permission denied (not executable, or a directory)"),
        },
        _ => SpawnError {
            status: NOT_EXECUTABLE,
            message: format!("{program}: cannot execute: {e}"),
        },
    }
}

/// Blocks until the child has terminated, without reaping it: its pid stays
/// reserved (a zombie) so nothing else can take it while memprobe finishes.
pub(crate) fn wait_terminated(pid: u32) -> io::Result<()> {
    loop {
        // SAFETY: siginfo_t is plain data, written by the kernel.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid info pointer; P_PID with our child's pid.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ExitInfo {
    /// The exit code, when it exited.
    pub(crate) code: Option<i32>,
    /// The signal that killed it, when one did.
    pub(crate) signal: Option<i32>,
    pub(crate) core_dumped: bool,
    /// `ru_maxrss` in bytes: the peak resident set of the child, or of a
    /// descendant it waited for if that was larger (the kernel folds reaped
    /// children's peaks in).
    pub(crate) maxrss_bytes: u64,
    /// CPU time (user + system) of the child and the descendants it waited
    /// for, seconds.
    pub(crate) cpu_s: f64,
}

impl ExitInfo {
    /// The status a shell would report: the code, or 128 + the signal.
    pub(crate) fn status(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => crate::exit::FAILURE,
        }
    }
}

/// Reaps the terminated child and returns its status and resource usage.
pub(crate) fn reap(pid: u32) -> io::Result<ExitInfo> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: rusage is plain data, written by the kernel.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid status and rusage pointers.
        let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut ru) };
        if rc == pid as libc::pid_t {
            let exited = libc::WIFEXITED(status);
            let signaled = libc::WIFSIGNALED(status);
            return Ok(ExitInfo {
                code: exited.then(|| libc::WEXITSTATUS(status)),
                signal: signaled.then(|| libc::WTERMSIG(status)),
                core_dumped: signaled && libc::WCOREDUMP(status),
                // Linux reports ru_maxrss in kibibytes.
                maxrss_bytes: u64::try_from(ru.ru_maxrss).unwrap_or(0) * 1024,
                cpu_s: timeval_s(ru.ru_utime) + timeval_s(ru.ru_stime),
            });
        }
        let e = io::Error::last_os_error();
        if rc < 0 && e.raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return Err(e);
    }
}

/// CPU time (user + system) this process has used so far, in seconds.
pub(crate) fn own_cpu_s() -> f64 {
    // SAFETY: rusage is plain data, written by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid rusage pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    timeval_s(ru.ru_utime) + timeval_s(ru.ru_stime)
}

fn timeval_s(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_statuses() {
        let e = |kind| spawn_error("x", &io::Error::from(kind)).status;
        assert_eq!(e(io::ErrorKind::NotFound), 127);
        assert_eq!(e(io::ErrorKind::PermissionDenied), 126);
        let m = spawn_error("nope", &io::Error::from(io::ErrorKind::NotFound)).message;
        assert_eq!(m, "nope: command not found");
        let enoexec = io::Error::from_raw_os_error(libc::ENOEXEC);
        assert_eq!(spawn_error("x", &enoexec).status, 126);
        assert!(spawn_error("x", &enoexec)
            .message
            .contains("cannot execute binary file"));
        let killed = ExitInfo {
            code: None,
            signal: Some(9),
            core_dumped: false,
            maxrss_bytes: 0,
            cpu_s: 0.0,
        };
        assert_eq!(killed.status(), 137);
    }
}
