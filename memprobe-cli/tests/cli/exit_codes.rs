//! Exit statuses: passed through, signals, forwarding, and memprobe's own.

use crate::support::*;
use std::io::Read;
use std::time::{Duration, Instant};

fn sh(script: &str) -> std::process::Output {
    memprobe()
        .args(["run", "--", "sh", "-c", script])
        .output()
        .unwrap()
}

#[test]
fn exit_codes_pass_through() {
    for code in [0, 3, 42] {
        let out = sh(&format!("exit {code}"));
        assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
    }
}

#[test]
fn signal_death_is_128_plus_n() {
    let out = sh("kill -9 $$");
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("killed by SIGKILL"),
        "{}",
        stderr(&out)
    );
    let out = sh("kill -TERM $$");
    assert_eq!(out.status.code(), Some(143));
}

/// Children of memprobe, from /proc.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
            }
        }
    }
    out
}

#[test]
fn sigterm_is_forwarded_and_reported() {
    let dir = scratch("sigterm");
    let json = dir.join("run.json");
    let mut c = memprobe();
    c.arg("run")
        .arg("--json")
        .arg(&json)
        .args(["--", "sleep", "30"]);
    c.stderr(std::process::Stdio::piped());
    let mut mp = c.spawn().unwrap();
    let pid = mp.id();
    let start = Instant::now();
    let child = loop {
        if let Some(&c) = children_of(pid).first() {
            // Wait until it runs `sleep` itself.
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            if comm.trim() == "sleep" {
                break c;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "child never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // SAFETY: kill has no memory preconditions; pid is our child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let status = wait_timeout(&mut mp, Duration::from_secs(10));
    assert_eq!(status.code(), Some(143));
    let mut err = String::new();
    mp.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("killed by SIGTERM"), "{err}");
    assert!(err.contains("forwarded to the child"), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(u(&v["pid"]), u64::from(child));
    assert_eq!(v["exit"]["signal"], 15);
    assert_eq!(v["exit"]["signal_name"], "SIGTERM");
    assert_eq!(v["signals"][0]["name"], "SIGTERM");
    assert_eq!(v["signals"][0]["forwarded"], true);
    crate::schema::assert_valid("docs/run-output.schema.json", &v);
    std::fs::remove_dir_all(&dir).unwrap();
}

pub(crate) fn wait_timeout(
    c: &mut std::process::Child,
    limit: Duration,
) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > limit {
            let _ = c.kill();
            panic!("process {} did not end within {limit:?}", c.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn unknown_command_is_127() {
    let out = memprobe()
        .args(["run", "--", "memprobe-no-such-command-xyz"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr(&out).contains("command not found"),
        "{}",
        stderr(&out)
    );
    let out = memprobe()
        .args(["run", "--", "./no/such/path"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
}

/// An executable file named `name` in a fresh directory, holding `bytes`.
fn executable(tag: &str, name: &str, bytes: &[u8]) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch(tag);
    let f = dir.join(name);
    std::fs::write(&f, bytes).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, f)
}

/// What bash answers "cannot execute binary file" to is refused with 126,
/// never handed to /bin/sh (which would read it as commands).
fn assert_binary_refused(out: &std::process::Output) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains("cannot execute binary file"), "{err}");
    assert!(
        !err.contains("not found") && !err.contains("syntax error"),
        "run by a shell: {err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn elf_of_another_machine_is_126() {
    // A 64-bit little-endian ELF header for VAX (EM_VAX = 75): no kernel
    // this runs on executes it, and no emulator registers for it.
    let mut elf = vec![0u8; 64];
    elf[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    elf[16] = 2; // ET_EXEC
    elf[18] = 75; // e_machine
    elf[20] = 1; // e_version
    elf[52] = 64; // e_ehsize
    let (dir, f) = executable("elf-vax", "trainer", &elf);
    let out = memprobe().arg("run").arg("--").arg(&f).output().unwrap();
    assert_binary_refused(&out);
    // Found through PATH the same.
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = memprobe()
        .env("PATH", path)
        .args(["run", "--", "trainer"])
        .output()
        .unwrap();
    assert_binary_refused(&out);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn random_bytes_are_126() {
    // Bytes with a NUL in the first line, as bash's check reads them; the
    // rest would be a valid command line for sh.
    let (dir, f) = executable("random-bytes", "blob", b"\x13\x37\x00\xfe\xd4\nexit 3\n");
    let out = memprobe().arg("run").arg("--").arg(&f).output().unwrap();
    assert_binary_refused(&out);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn text_without_shebang_runs_through_sh() {
    // What execvp does with a text file the kernel cannot execute: /bin/sh
    // reads it (as every shell does).
    let (dir, f) = executable("no-shebang", "job", b"echo from-sh \"$1\"\nexit 7\n");
    let out = memprobe()
        .arg("run")
        .arg("--")
        .arg(&f)
        .arg("arg1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-sh arg1\n");
    // A native program that looks binary still runs (memprobe's own execve).
    let out = memprobe().args(["run", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn not_executable_is_126() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("noexec");
    let f = dir.join("script");
    std::fs::write(&f, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = memprobe().arg("run").arg("--").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("permission denied"),
        "{}",
        stderr(&out)
    );
    // A directory cannot be executed either.
    let out = memprobe().arg("run").arg("--").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(126));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_flags_are_2() {
    for args in [
        vec!["run", "--bogus", "--", "true"],
        vec!["--nope"],
        vec!["frobnicate"],
        vec!["run"],
        vec!["status", "--json=yes"],
    ] {
        let out = memprobe().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).to_lowercase().contains("usage"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn bad_intervals_are_2_with_a_reason() {
    for (value, reason) in [
        ("50us", "outside the accepted range 100us ..= 60s"),
        ("61s", "outside"),
        ("10", "no unit"),
        ("10 fortnights", "unknown unit"),
    ] {
        let out = memprobe()
            .args(["run", "--interval", value, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{value}");
        assert!(stderr(&out).contains(reason), "{value}: {}", stderr(&out));
    }
    let out = memprobe()
        .args(["watch", "--interval", "0s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Every example the messages suggest is accepted (`500us` was refused
/// while every message suggested it).
#[test]
fn the_suggested_intervals_are_accepted() {
    for value in ["500us", "10ms", "1s", "0.5s"] {
        let out = memprobe()
            .args(["run", "--interval", value, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{value}: {}", stderr(&out));
    }
}

/// Zero, with or without a unit, gets one message: the accepted range and
/// an example with a unit (not "no unit" for one and a range for the other).
#[test]
fn zero_interval_is_one_clear_message() {
    let mut reasons = Vec::new();
    for (cmd, value) in [
        ("run", "0"),
        ("run", "0ms"),
        ("watch", "0"),
        ("run", "0.0s"),
    ] {
        let mut c = memprobe();
        c.args([cmd, "--interval", value]);
        if cmd == "run" {
            c.args(["--", "true"]);
        }
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{value}");
        let err = stderr(&out);
        assert!(err.contains("100us ..= 60s"), "{value}: {err}");
        assert!(err.contains("e.g. 10ms"), "{value}: {err}");
        assert!(!err.contains("no unit"), "{value}: {err}");
        let reason = err
            .lines()
            .next()
            .unwrap()
            .rsplit(": ")
            .next()
            .unwrap()
            .to_string();
        reasons.push(reason);
    }
    assert!(reasons.windows(2).all(|w| w[0] == w[1]), "{reasons:?}");
}

/// `--plot` draws SVG only: any other name is refused before the command
/// runs, rather than writing SVG into a `.png`.
#[test]
fn plot_to_a_non_svg_name_is_refused_before_the_child_runs() {
    let dir = scratch("plotpng");
    let marker = dir.join("marker");
    for name in ["x.png", "x.PDF", "x"] {
        let plot = dir.join(name);
        let out = run_helper(
            &["--plot", plot.to_str().unwrap()],
            &["marker", marker.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("SVG only") && err.contains(".svg"), "{err}");
        assert!(!marker.exists(), "the child ran for {name}");
        assert!(listing(&dir).is_empty(), "{:?}", listing(&dir));
    }
    let plot = dir.join("x.SVG");
    let out = run_helper(
        &["--plot", plot.to_str().unwrap()],
        &["marker", marker.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An output that cannot be written stops memprobe before the command
/// starts: the command would have created the marker.
#[test]
fn unwritable_output_fails_before_the_child_runs() {
    let dir = scratch("unwritable");
    let marker = dir.join("marker");
    let marker_s = marker.to_str().unwrap();
    let missing = dir.join("no-such-dir").join("out.json");
    for opts in [
        vec!["--json".to_string(), missing.display().to_string()],
        vec!["--csv".to_string(), dir.display().to_string()],
        vec![
            "--json".to_string(),
            dir.join("ok.json").display().to_string(),
            "--plot".to_string(),
            missing.with_extension("svg").display().to_string(),
        ],
    ] {
        let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
        let out = run_helper(&opts, &["marker", marker_s]);
        assert_eq!(out.status.code(), Some(2), "{opts:?}: {}", stderr(&out));
        assert!(!marker.exists(), "the child ran: {opts:?}");
        let err = stderr(&out);
        assert!(
            err.contains("does not exist") || err.contains("is a directory"),
            "{err}"
        );
        assert!(listing(&dir).is_empty(), "leftovers: {:?}", listing(&dir));
    }
    // The same setup with a writable path runs the child.
    let ok = dir.join("ok.json");
    let out = run_helper(&["--json", ok.to_str().unwrap()], &["marker", marker_s]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(marker.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A command that cannot start leaves no output and no temporary file.
#[test]
fn failed_start_leaves_nothing() {
    let dir = scratch("nostart");
    let out = memprobe()
        .arg("run")
        .arg("--json")
        .arg(dir.join("a.json"))
        .arg("--csv")
        .arg(dir.join("a.csv"))
        .args(["--", "memprobe-no-such-command-xyz"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(listing(&dir).is_empty(), "{:?}", listing(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A pipe whose reading end is already closed: every write to the other end
/// fails with EPIPE.
fn broken_pipe() -> std::process::Stdio {
    let mut fds = [0; 2];
    // SAFETY: valid array of two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are ours; the reading end is closed at once.
    unsafe { libc::close(fds[0]) };
    // SAFETY: the writing end is ours and owned by the Stdio from here on.
    unsafe { <std::process::Stdio as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) }
}

/// `memprobe run --json f -- sh -c 'exit 4' 2>&1 | true`: the summary
/// cannot be delivered, yet the command's status passes through and the
/// JSON is written.
#[test]
fn a_closed_stdout_or_stderr_keeps_the_status_and_the_files() {
    for (out_broken, err_broken) in [(false, true), (true, true), (true, false)] {
        let dir = scratch("epipe");
        let json = dir.join("run.json");
        let mut c = memprobe();
        c.arg("run")
            .arg("--json")
            .arg(&json)
            .args(["--", "sh", "-c", "exit 4"]);
        c.stdout(if out_broken {
            broken_pipe()
        } else {
            std::process::Stdio::null()
        });
        c.stderr(if err_broken {
            broken_pipe()
        } else {
            std::process::Stdio::null()
        });
        let status = c.status().unwrap();
        assert_eq!(
            status.code(),
            Some(4),
            "stdout broken {out_broken}, stderr broken {err_broken}"
        );
        let text = std::fs::read_to_string(&json).expect("the JSON is written");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["exit"]["code"], 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
