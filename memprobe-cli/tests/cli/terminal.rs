//! A terminal's Ctrl-C: memprobe and the command share the foreground
//! process group, so the kernel delivers it to both; memprobe must not
//! forward it again.

use crate::support::*;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

/// A new pseudo-terminal: (master, slave).
fn pty() -> (File, OwnedFd) {
    // SAFETY: plain libc calls on descriptors this function owns; the name
    // buffer is large enough and NUL-terminated by ptsname_r.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(master >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
        let slave = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        assert!(slave >= 0, "open the slave");
        (File::from_raw_fd(master), OwnedFd::from_raw_fd(slave))
    }
}

#[test]
fn terminal_ctrl_c_reaches_the_command_once() {
    let (mut master, slave) = pty();
    let (argv, env) = crate::helper::argv(&["count-sigint", "1500"]);
    let mut c = memprobe();
    c.args(["run", "--no-live", "--"])
        .args(&argv)
        .env(env.0, env.1)
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid and ioctl are async-signal-safe. memprobe becomes a
    // session leader with the pty (its stdin) as controlling terminal, its
    // process group in the foreground, as under an interactive shell.
    unsafe {
        c.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    drop(c); // closes the parent's copies of the slave

    let mut reader = master.try_clone().unwrap();
    let (tx, rx) = mpsc::channel();
    let collector = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once every slave descriptor is closed.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&all).contains("ready") {
                let _ = tx.send(());
            }
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the command got ready");
    master.write_all(b"\x03").unwrap(); // Ctrl-C: the line discipline sends SIGINT
    let status = crate::exit_codes::wait_timeout(&mut child, Duration::from_secs(10));
    let out = collector.join().unwrap();
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(out.contains("SIGINT count 1\r\n"), "delivered once: {out}");
    assert!(out.contains("SIGINT at"), "{out}");
    assert!(out.contains("from the terminal"), "{out}");
}
