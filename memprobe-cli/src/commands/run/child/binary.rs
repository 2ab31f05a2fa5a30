//! A command that is a binary file is executed without `/bin/sh` behind it.
//!
//! `execvp` (what `std::process::Command` calls) hands any file the kernel
//! refuses with `ENOEXEC` to `/bin/sh`: right for a text script without a
//! `#!` line, wrong for a binary (an ELF built for another machine, random
//! bytes), which the shell then reads as commands (`ELF: not found`, status
//! 127; garbage run as a script). Shells tell the two apart by the file's
//! first bytes (bash's `check_binary_file`: ELF's magic, or a NUL in the
//! first line) and answer "cannot execute binary file" (status 126) for a
//! binary. memprobe does the same: for a file that looks binary it calls
//! `execve` itself, so the kernel's `ENOEXEC` comes back as an error.

use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// How many bytes shells look at (bash's sample).
const SAMPLE: usize = 80;

/// bash's rule: ELF's magic, or a NUL in the first line (the first two
/// lines after a `#!`).
pub(crate) fn looks_binary(sample: &[u8]) -> bool {
    if sample.starts_with(b"\x7fELF") {
        return true;
    }
    let mut lines = if sample.starts_with(b"#!") { 2 } else { 1 };
    for &c in sample {
        if c == b'\n' {
            lines -= 1;
            if lines == 0 {
                return false;
            }
        }
        if c == 0 {
            return true;
        }
    }
    false
}

/// The file `execvp` would execute for `program`: itself when it names a
/// path, else the first executable regular file of that name along `PATH`
/// (unset: `/bin:/usr/bin`, glibc's default; an empty entry is the current
/// directory).
pub(crate) fn resolve(program: &OsStr, path_var: Option<&OsStr>) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    if program.is_empty() {
        return None;
    }
    let dirs = path_var.unwrap_or(OsStr::new("/bin:/usr/bin"));
    dirs.as_bytes()
        .split(|&b| b == b':')
        .map(|dir| {
            let dir = if dir.is_empty() { b"." as &[u8] } else { dir };
            Path::new(OsStr::from_bytes(dir)).join(program)
        })
        .find(|p| is_executable_file(p))
}

fn is_executable_file(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path.
    let executable = unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0;
    executable && p.metadata().is_ok_and(|m| m.is_file())
}

/// Whether the file at `path` looks binary; false when it cannot be read
/// (then `execvp` decides, as before).
pub(crate) fn file_looks_binary(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut sample = Vec::with_capacity(SAMPLE);
    match f.take(SAMPLE as u64).read_to_end(&mut sample) {
        Ok(_) => looks_binary(&sample),
        Err(_) => false,
    }
}

/// An `execve` prepared before the fork: the child only calls it, with no
/// allocation (after `fork` in a threaded process only async-signal-safe
/// calls are allowed).
pub(crate) struct DirectExec {
    _path: CString,
    _strings: Vec<CString>,
    path_ptr: *const libc::c_char,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into the CStrings the struct owns, which are
// never changed nor moved (a CString's buffer is on the heap).
unsafe impl Send for DirectExec {}
// SAFETY: as above; `exec` only reads them.
unsafe impl Sync for DirectExec {}

impl DirectExec {
    /// `argv` as given (argv[0] the program as typed, as `execvp` keeps it)
    /// and `env`: the full environment the command gets.
    pub(crate) fn new(
        path: &Path,
        argv: &[OsString],
        env: &[(OsString, OsString)],
    ) -> Option<Self> {
        let path = CString::new(path.as_os_str().as_bytes()).ok()?;
        let mut strings = Vec::with_capacity(argv.len() + env.len());
        for a in argv {
            strings.push(CString::new(a.as_bytes()).ok()?);
        }
        for (k, v) in env {
            let mut kv = k.clone().into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            strings.push(CString::new(kv).ok()?);
        }
        let ptrs: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        let mut argv_ptrs = ptrs[..argv.len()].to_vec();
        argv_ptrs.push(std::ptr::null());
        let mut envp = ptrs[argv.len()..].to_vec();
        envp.push(std::ptr::null());
        Some(Self {
            path_ptr: path.as_ptr(),
            _path: path,
            _strings: strings,
            argv: argv_ptrs,
            envp,
        })
    }

    /// Replaces the process image; returns only on failure, with the error.
    /// Async-signal-safe: `execve`, then reading `errno`.
    pub(crate) fn exec(&self) -> io::Error {
        // SAFETY: NUL-terminated strings and NULL-terminated arrays of them,
        // alive as long as `self`.
        unsafe { libc::execve(self.path_ptr, self.argv.as_ptr(), self.envp.as_ptr()) };
        io::Error::last_os_error()
    }
}

/// The environment `std::process::Command` would give the command: this
/// process's, with `changes` applied (None removes a variable).
pub(crate) fn child_env(changes: &[(OsString, Option<OsString>)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (k, v) in changes {
        env.retain(|(name, _)| name != k);
        if let Some(v) = v {
            env.push((k.clone(), v.clone()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_rule_for_binary_files() {
        assert!(looks_binary(b"\x7fELF\x02\x01\x01"));
        assert!(looks_binary(b"abc\0def\n"));
        assert!(!looks_binary(b"echo hi\n\0after the first line"));
        assert!(looks_binary(b"#!/bin/sh\necho \0\n"));
        assert!(!looks_binary(b"#!/bin/sh\necho hi\n\0"));
        assert!(!looks_binary(b"exit 3\n"));
        assert!(!looks_binary(b""));
    }

    #[test]
    fn resolution_follows_path_as_execvp() {
        let found = resolve(
            OsStr::new("sh"),
            Some(OsStr::new("/nonexistent:/bin:/usr/bin")),
        );
        assert!(found.is_some_and(|p| p.ends_with("sh")));
        assert_eq!(resolve(OsStr::new("./x"), None), Some(PathBuf::from("./x")));
        assert_eq!(
            resolve(OsStr::new("memprobe-no-such-xyz"), Some(OsStr::new("/bin"))),
            None
        );
        assert_eq!(resolve(OsStr::new(""), None), None);
    }

    #[test]
    fn environment_changes_apply_in_order() {
        let env = child_env(&[
            ("MEMPROBE_TEST_A".into(), Some("1".into())),
            ("MEMPROBE_TEST_A".into(), Some("2".into())),
            ("PATH".into(), None),
        ]);
        let a: Vec<_> = env.iter().filter(|(k, _)| k == "MEMPROBE_TEST_A").collect();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].1, "2");
        assert!(!env.iter().any(|(k, _)| k == "PATH"));
    }
}
