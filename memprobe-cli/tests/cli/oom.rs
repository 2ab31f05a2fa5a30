//! OOM kills explained by `memprobe run`: a SIGKILL that is not the
//! kernel's must not be called an OOM kill; a real one, in a cgroup with a
//! small memory limit, is named with its pid, time and peak.

use crate::support::*;
use memprobe_core::internal::cgroup;
use memprobe_core::CgroupVersion;
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Output;

/// The command kills itself with SIGKILL: status 137 passes through, and the
/// verdict names no OOM kill (the container's counter did not rise).
#[test]
fn a_sigkill_of_its_own_is_not_an_oom_kill() {
    let (out, json) = run_helper_json(&[], &["self-kill", "100"]);
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    assert_eq!(json["exit"]["signal_name"], "SIGKILL");
    let oom = &json["oom_kill"];
    assert_eq!(oom["verdict"], "none", "{oom}");
    assert_eq!(oom["victims"], Value::Array(Vec::new()));
    let err = stderr(&out);
    assert!(!err.contains("OOM killer killed"), "{err}");
    assert!(!err.contains("most likely"), "{err}");
    if oom["counters"].is_null() {
        eprintln!("no OOM counters readable here: the verdict rests on the SIGKILL alone");
    } else {
        assert_eq!(u(&oom["oom_kill_rise"]), 0, "{oom}");
        assert!(
            err.contains("was killed by SIGKILL, but not by the kernel's OOM killer"),
            "{err}"
        );
    }
}

/// memprobe keeps the OOM killer off itself where it may, but the command
/// gets the value memprobe started with.
#[test]
fn the_command_keeps_its_oom_score_adj() {
    let dir = scratch("adj");
    let file = dir.join("adj");
    let out = memprobe()
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "cat /proc/self/oom_score_adj > \"$0\"",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mine = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cgroup with a small memory limit, made for one test and removed after.
struct SmallCgroup {
    dir: PathBuf,
    version: CgroupVersion,
}

impl SmallCgroup {
    /// Below this process's own memory cgroup, where the machine allows it:
    /// a writable v1 memory hierarchy, or a delegated v2 subtree with the
    /// memory controller. `Err` says why not.
    fn create(tag: &str, limit: u64) -> Result<SmallCgroup, String> {
        let loc = cgroup::discover().map_err(|e| format!("no memory cgroup: {e}"))?;
        let dir = loc
            .dir
            .join(format!("memprobe-oom-test-{}-{tag}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = SmallCgroup {
            dir,
            version: loc.version,
        };
        let (limit_file, swap_file) = match loc.version {
            CgroupVersion::V1 => ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
            CgroupVersion::V2 => ("memory.max", "memory.swap.max"),
        };
        std::fs::write(cg.dir.join(limit_file), limit.to_string()).map_err(|e| {
            format!(
                "cannot set {} in {} (is the memory controller delegated?): {e}",
                limit_file,
                cg.dir.display()
            )
        })?;
        // No swap to escape to, where the kernel offers the knob.
        let _ = std::fs::write(cg.dir.join(swap_file), limit.to_string());
        Ok(cg)
    }

    /// Runs `memprobe run --json FILE <opts> -- <helper mode>` inside the
    /// cgroup (the shell moves itself in, then becomes memprobe).
    fn run(&self, opts: &[&str], mode: &[&str]) -> (Output, Value) {
        self.run_under(&[], opts, mode)
    }

    /// [`run`](Self::run) with memprobe started through `prefix` (e.g.
    /// [`UNPRIVILEGED`]).
    fn run_under(&self, prefix: &[&str], opts: &[&str], mode: &[&str]) -> (Output, Value) {
        // Where memprobe may not lower its oom_score_adj (no
        // CAP_SYS_RESOURCE), an allocation of its own in the moment the
        // command's memory is being released can make the kernel end
        // memprobe too (docs/cli.md says so). That run tells nothing about
        // the verdict: run it again, a few times at most.
        for attempt in 1..=5 {
            match self.run_once(prefix, opts, mode) {
                Ok(r) => return r,
                Err(why) => eprintln!("attempt {attempt}: {why}"),
            }
        }
        panic!("memprobe itself was killed in every attempt")
    }

    fn run_once(
        &self,
        prefix: &[&str],
        opts: &[&str],
        mode: &[&str],
    ) -> Result<(Output, Value), String> {
        let dir = scratch("oom");
        let json = dir.join("run.json");
        let (argv, (k, v)) = crate::helper::argv(mode);
        let mut c = std::process::Command::new("sh");
        c.arg("-c")
            .arg("echo $$ > \"$1\" && shift && exec \"$@\"")
            .arg("sh")
            .arg(self.dir.join("cgroup.procs"))
            .args(prefix)
            .arg(env!("CARGO_BIN_EXE_memprobe"))
            .arg("run")
            .arg("--json")
            .arg(&json)
            .args(opts)
            .arg("--")
            .args(&argv)
            .env(k, v);
        let out = c.output().unwrap();
        let text = match std::fs::read_to_string(&json) {
            Ok(t) => t,
            Err(e) if out.status.signal() == Some(libc::SIGKILL) && stderr(&out).is_empty() => {
                std::fs::remove_dir_all(&dir).unwrap();
                return Err(format!("memprobe itself was killed, no JSON ({e})"));
            }
            Err(e) => panic!("no JSON ({e}); {:?}; stderr:\n{}", out.status, stderr(&out)),
        };
        std::fs::remove_dir_all(&dir).unwrap();
        Ok((out, serde_json::from_str(&text).unwrap()))
    }
}

impl Drop for SmallCgroup {
    fn drop(&mut self) {
        // Its processes have all ended; the kernel may take a moment to
        // release the cgroup.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

fn small_cgroup_or_skip(test: &str) -> Option<SmallCgroup> {
    match SmallCgroup::create(test, 128 * MIB) {
        Ok(cg) => {
            eprintln!(
                "{test}: in {} (cgroup {}), limit 128 MiB",
                cg.dir.display(),
                match cg.version {
                    CgroupVersion::V1 => "v1",
                    CgroupVersion::V2 => "v2",
                }
            );
            Some(cg)
        }
        Err(why) => {
            eprintln!(
                "{test}: SKIPPED, this machine does not let a test make a memory cgroup ({why}); \
                 the detector's tests over recorded counter transitions (oom_kill.rs) still run"
            );
            None
        }
    }
}

/// memprobe without the privileges to read the kernel's log
/// (`CAP_SYSLOG`) or its process events (`CAP_NET_ADMIN`): the fallbacks.
const UNPRIVILEGED: &[&str] = &["setpriv", "--bounding-set", "-syslog,-net_admin"];

/// Whether [`UNPRIVILEGED`] can be used here (root, with setpriv).
fn can_drop_privileges() -> bool {
    std::process::Command::new("setpriv")
        .args(["--bounding-set", "-syslog,-net_admin", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

fn container_counters(path: &Path) -> bool {
    path.join("memory.events").exists() || path.join("memory.oom_control").exists()
}

/// The command grows until the kernel's OOM killer ends it: memprobe names
/// it, with its exact peak, and passes its status through.
#[test]
fn a_real_oom_kill_of_the_command_is_confirmed() {
    let Some(cg) = small_cgroup_or_skip("a_real_oom_kill_of_the_command_is_confirmed") else {
        return;
    };
    assert!(container_counters(&cg.dir));
    let (out, json) = cg.run(&[], &["grow", "8", "5"]);
    let err = stderr(&out);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(137), "{err}");
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let oom = &json["oom_kill"];
    assert_eq!(oom["verdict"], "confirmed", "{oom}");
    assert!(u(&oom["oom_kill_rise"]) >= 1);
    let v = &oom["victims"][0];
    assert_eq!(u(&v["pid"]), u(&json["pid"]));
    assert_eq!(v["direct_child"], true);
    assert_eq!(v["sigkill_seen"], true);
    assert_eq!(v["peak_source"], "rusage");
    // Its exact peak is near the limit (it held most of the 128 MiB).
    assert!(u(&v["peak_bytes"]) >= 64 * MIB, "{v}");
    assert_eq!(u(&oom["container_limit_bytes"]), 128 * MIB);
    let line = format!(
        "memprobe: the kernel's OOM killer killed pid {} (",
        u(&json["pid"])
    );
    assert!(err.contains(&line), "{err}");
    assert!(err.contains("(exact); the container peaked at"), "{err}");
    assert!(err.contains("of its 128 MiB limit."), "{err}");
}

/// A training loop that sends its phases is killed in its second epoch:
/// the verdict and the paragraph name the phase.
#[test]
fn a_real_oom_kill_names_the_phase_it_happened_in() {
    let Some(cg) = small_cgroup_or_skip("a_real_oom_kill_names_the_phase_it_happened_in") else {
        return;
    };
    let (out, json) = cg.run(&[], &["grow-in-epochs", "8", "5"]);
    let err = stderr(&out);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(137), "{err}");
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let oom = &json["oom_kill"];
    assert_eq!(oom["verdict"], "confirmed", "{oom}");
    let phase = oom["victims"][0]["phase"].as_str().unwrap_or_default();
    assert!(phase.starts_with("epoch 1 / step "), "{oom}");
    assert!(err.contains(&format!(", in {phase};")), "{err}");
}

/// A worker (not memprobe's child) grows until the OOM killer ends it; its
/// parent notices only at its next poll, so a sample sees it as a zombie
/// killed by SIGKILL. The command then exits with 3, which passes through.
#[test]
fn a_real_oom_kill_of_a_worker_is_confirmed() {
    let Some(cg) = small_cgroup_or_skip("a_real_oom_kill_of_a_worker_is_confirmed") else {
        return;
    };
    let (out, json) = cg.run(&[], &["worker-grows", "8", "5"]);
    let err = stderr(&out);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(3), "{err}");
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let oom = &json["oom_kill"];
    assert_eq!(oom["verdict"], "confirmed", "{oom}");
    let v = &oom["victims"][0];
    assert_ne!(u(&v["pid"]), u(&json["pid"]));
    assert_eq!(v["direct_child"], false);
    assert_eq!(v["peak_source"], "last_rss");
    let worker = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == v["pid"])
        .expect("the victim is one of the run's processes");
    assert_eq!(worker["ppid"], json["pid"]);
    assert!(
        err.contains(&format!(
            "memprobe: the kernel's OOM killer killed pid {} (",
            u(&v["pid"])
        )),
        "{err}"
    );
    assert!(err.contains("its last RSS seen"), "{err}");
}

/// memprobe's direct child (the command), from /proc.
fn command_of(memprobe: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{memprobe}/task")).ok()?;
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|l| {
            l.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .next()
}

/// Item 7: an unrelated process of the same cgroup is OOM-killed; half a
/// second later the user `kill -9`s the command. The kill is not the
/// command's: "none" where the kernel's log names the other victim, never
/// "confirmed" on the time window alone.
#[test]
fn an_unrelated_oom_kill_then_a_users_kill_is_not_confirmed() {
    let Some(cg) = small_cgroup_or_skip("an_unrelated_oom_kill_then_a_users_kill_is_not_confirmed")
    else {
        return;
    };
    // memprobe may itself be killed where it cannot lower its
    // oom_score_adj (see SmallCgroup::run): such a try tells nothing.
    let mut prefixes: Vec<&[&str]> = vec![&[]];
    if can_drop_privileges() {
        prefixes.push(UNPRIVILEGED);
    }
    'prefix: for prefix in prefixes {
        for attempt in 1..=5 {
            match unrelated_kill_then_users_kill(&cg, prefix) {
                Ok(()) => continue 'prefix,
                Err(why) => eprintln!("attempt {attempt}: {why}"),
            }
        }
        panic!("memprobe itself was killed in every attempt");
    }
}

fn unrelated_kill_then_users_kill(cg: &SmallCgroup, prefix: &[&str]) -> Result<(), String> {
    let dir = scratch("oom-unrelated");
    let json = dir.join("run.json");
    let procs = cg.dir.join("cgroup.procs");
    let in_cgroup = "echo $$ > \"$1\" && shift && exec \"$@\"";
    // The command: waits to be killed.
    let (argv, (k, v)) = crate::helper::argv(&["sleep", "60000"]);
    let run = std::process::Command::new("sh")
        .arg("-c")
        .arg(in_cgroup)
        .arg("sh")
        .arg(&procs)
        .args(prefix)
        .arg(env!("CARGO_BIN_EXE_memprobe"))
        .arg("run")
        .arg("--json")
        .arg(&json)
        .arg("--")
        .args(&argv)
        .env(k, v)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let command = {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(c) = command_of(run.id()) {
                break c;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the command never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    // A bystander, not of the run: grows in the same cgroup until killed.
    let (argv, (k, v)) = crate::helper::argv(&["grow", "8", "5"]);
    let mut bystander = std::process::Command::new("sh")
        .arg("-c")
        .arg(in_cgroup)
        .arg("sh")
        .arg(&procs)
        .args(&argv)
        .env(k, v)
        .spawn()
        .unwrap();
    let st = bystander.wait().unwrap();
    assert_eq!(
        st.signal(),
        Some(libc::SIGKILL),
        "the bystander was OOM-killed"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: sending a signal to the command memprobe started (or to
    // nothing, if memprobe and its command were killed).
    unsafe { libc::kill(command as i32, libc::SIGKILL) };
    let out = run.wait_with_output().unwrap();
    let err = stderr(&out);
    eprintln!("{err}");
    if out.status.signal() == Some(libc::SIGKILL) && err.is_empty() {
        std::fs::remove_dir_all(&dir).unwrap();
        return Err("memprobe itself was killed".into());
    }
    assert_eq!(out.status.code(), Some(137), "{:?} {err}", out.status);
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let oom = &json["oom_kill"];
    assert_ne!(oom["verdict"], "confirmed", "{oom}");
    assert!(!err.contains("OOM killer killed pid"), "{err}");
    if oom["kernel_log"] == true {
        assert_eq!(oom["verdict"], "none", "{oom}");
        let others = oom["other_kills"].as_array().unwrap();
        assert!(
            others
                .iter()
                .any(|k| u(&k["pid"]) == u64::from(bystander.id())),
            "{oom}"
        );
        assert!(
            err.contains("was killed by SIGKILL, but not by the kernel's OOM killer: the kernel's log names pid"),
            "{err}"
        );
    } else {
        eprintln!("the kernel's log is not read: the verdict may only be likely");
        assert_eq!(oom["verdict"], "likely", "{oom}");
        assert!(err.contains("does not say which process"), "{err}");
    }
    if prefix == UNPRIVILEGED {
        assert_eq!(oom["kernel_log"], false, "{oom}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    Ok(())
}

/// Item 8: with `--interval 1s`, a worker starts and is OOM-killed between
/// two samples, its parent reaping it at once. It is the run's, and named
/// where the kernel's process events and log can be read; never "none of
/// them this run's".
#[test]
fn a_worker_killed_between_two_samples_is_not_missed() {
    let Some(cg) = small_cgroup_or_skip("a_worker_killed_between_two_samples_is_not_missed") else {
        return;
    };
    let (out, json) = cg.run(
        &["--interval", "1s"],
        &["short-worker-grows", "300", "16", "1"],
    );
    let err = stderr(&out);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(3), "{err}");
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let oom = &json["oom_kill"];
    assert!(!err.contains("none of them this run's"), "{err}");
    // No sample saw the worker: the samples came at 0, 1, 2 s.
    let worker_seen = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["pid"] != json["pid"]);
    eprintln!("a sample saw the worker: {worker_seen}");
    if oom["tracking"] == "process_events" && oom["kernel_log"] == true {
        assert_eq!(oom["verdict"], "confirmed", "{oom}");
        let v = &oom["victims"][0];
        assert_ne!(u(&v["pid"]), u(&json["pid"]));
        assert_eq!(v["evidence"], "kernel_log");
        assert_eq!(v["direct_child"], false);
        if !worker_seen {
            assert_eq!(v["peak_source"], "kernel_log", "{v}");
            assert!(u(&v["peak_bytes"]) >= 64 * MIB, "{v}");
        }
        assert!(
            err.contains(&format!(
                "memprobe: the kernel's OOM killer killed pid {} (",
                u(&v["pid"])
            )),
            "{err}"
        );
    } else {
        assert!(
            oom["verdict"] == "unknown" || oom["verdict"] == "likely",
            "{oom}"
        );
    }
}

/// Item 9: a DataLoader-like worker sends no phases, its trainer does: the
/// worker's OOM verdict carries the trainer's open epoch (was null), and
/// says whose phase it is.
#[test]
fn a_workers_oom_kill_names_its_trainers_phase() {
    let Some(cg) = small_cgroup_or_skip("a_workers_oom_kill_names_its_trainers_phase") else {
        return;
    };
    let (out, json) = cg.run(&[], &["worker-grows-in-epochs", "8", "5"]);
    let err = stderr(&out);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(3), "{err}");
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let v = &json["oom_kill"]["victims"][0];
    assert_ne!(u(&v["pid"]), u(&json["pid"]), "{v}");
    assert_eq!(v["phase"], "epoch 1", "{v}");
    assert_eq!(
        u(&v["phase_pid"]),
        u(&json["pid"]),
        "the trainer's phase: {v}"
    );
    assert!(err.contains("in epoch 1 (pid "), "{err}");
    assert!(err.contains("'s phase: it sent none of its own)"), "{err}");
}

/// Item 8 without the privileges to read the kernel's log (nor, before
/// Linux 6.6, its process events): the worker is "likely" where its death
/// was seen, else "unknown", never "none of them this run's".
#[test]
fn a_worker_killed_between_two_samples_unprivileged_is_unknown() {
    if !can_drop_privileges() {
        eprintln!("SKIPPED: cannot drop privileges here (not root, or no setpriv)");
        return;
    }
    let Some(cg) =
        small_cgroup_or_skip("a_worker_killed_between_two_samples_unprivileged_is_unknown")
    else {
        return;
    };
    let (out, json) = cg.run_under(
        UNPRIVILEGED,
        &["--interval", "1s"],
        &["short-worker-grows", "300", "16", "1"],
    );
    let err = stderr(&out);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(3), "{err}");
    crate::schema::assert_valid("docs/run-output.schema.json", &json);
    let oom = &json["oom_kill"];
    assert_eq!(oom["kernel_log"], false, "{oom}");
    assert!(!err.contains("none of them this run's"), "{err}");
    if oom["tracking"] == "process_events" {
        // Linux >= 6.6 lets anyone listen: the worker's birth and death by
        // SIGKILL were seen, and with the counter's rise it is likely.
        assert_eq!(oom["verdict"], "likely", "{oom}");
        let v = &oom["victims"][0];
        assert_eq!(v["evidence"], "counter_and_sigkill", "{v}");
        assert_ne!(u(&v["pid"]), u(&json["pid"]));
        assert!(err.contains("does not say which process"), "{err}");
    } else {
        assert_eq!(oom["verdict"], "unknown", "{oom}");
        assert!(
            err.contains("a process living between two samples is not seen"),
            "{err}"
        );
        assert!(oom["kills_outside_tree"].is_null(), "{oom}");
    }
}
