//! The command's phases reaching `memprobe run` over the run channel:
//! datagrams that are not messages are counted, never a crash; a memprobe
//! that stops reading never stalls the command and loses no step; a burst
//! at exit arrives whole; under load every epoch arrives; the ranks a
//! launcher gave its workers name them, and bad ones are left out.
//! (The phases of C, Python and Go programs: tests/tests/run_phases.rs,
//! bindings/python/tests/test_run_phases.py, bindings/go/run_phases_test.go.)

use crate::schema::assert_valid;
use crate::support::*;
use memprobe_core::internal::run_channel::ranks::LAUNCHERS;
use memprobe_core::internal::run_channel::ENV;
use memprobe_core::RunChannel;
use memprobe_core::{PhaseKind, Source, Tracker};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

const FLOOD: u64 = 100_000;
/// Custom phases in the burst at exit (with the epoch around them: 44
/// messages, where the kernel queues 10).
const BURST: u64 = 21;
/// The load: processes, epochs each, steps per epoch.
const LOAD: (u64, u64, u64) = (4, 5, 10_000);

/// Spins for about `us` microseconds (a step of a few µs).
fn spin(us: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

/// One process of the load: epochs of steps, each epoch followed by a
/// validation; the tracker is dropped at the end.
fn load_one() {
    let (_mem, mut t) = tracker();
    for _ in 0..LOAD.1 {
        t.begin(PhaseKind::Epoch, None).unwrap();
        t.begin(PhaseKind::Step, None).unwrap();
        for _ in 1..LOAD.2 {
            spin(3);
            t.next(PhaseKind::Step, None).unwrap();
        }
        t.end(PhaseKind::Step, None).unwrap();
        t.end(PhaseKind::Epoch, None).unwrap();
        t.begin(PhaseKind::Custom, Some("validation")).unwrap();
        t.end(PhaseKind::Custom, Some("validation")).unwrap();
    }
}

fn tracker() -> (Source, Tracker) {
    let mem = Source::pushed("mem").unwrap();
    mem.push(64 << 20).unwrap();
    let t = Tracker::new(std::slice::from_ref(&mem)).unwrap();
    (mem, t)
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The helper child's phase modes.
pub(crate) fn child(words: &[&str]) {
    match words[0] {
        // Garbage first, then one epoch of three steps, the second spiking.
        "phase-garbage" => {
            let path = std::env::var_os(ENV).expect("memprobe run names a channel");
            let tx = UnixDatagram::unbound().unwrap();
            let begin = r#"{"v":1,"ev":"begin","pid":1,"tracker":9,"seq":0,"dropped":0,"kind":"epoch","name":"epoch","index":0,"depth":0,"t_ns":1}"#;
            for g in [
                b"not json".to_vec(),
                b"{\"v\":1}".to_vec(),
                vec![0xff; 100],
                begin.replace("\"v\":1", "\"v\":7").into_bytes(),
                vec![b' '; 200_000],
            ] {
                // The oversized one may be refused by the kernel: then it
                // never arrives, and is not counted.
                let _ = tx.send_to(&g, &path);
            }
            let (mem, mut t) = tracker();
            t.begin(PhaseKind::Epoch, None).unwrap();
            t.begin(PhaseKind::Step, None).unwrap();
            for i in 0..3 {
                std::thread::sleep(Duration::from_millis(20));
                if i == 1 {
                    mem.push(900 << 20).unwrap();
                    mem.push(64 << 20).unwrap();
                }
                t.next(PhaseKind::Step, None).unwrap();
            }
            t.end(PhaseKind::Step, None).unwrap();
            t.end(PhaseKind::Epoch, None).unwrap();
        }
        // Signals readiness, waits for the go, floods FLOOD step
        // boundaries, signals it is done, waits, then ends its phases.
        "phase-flood" => {
            let dir = Path::new(words[1]);
            let (_mem, mut t) = tracker();
            t.begin(PhaseKind::Epoch, None).unwrap();
            t.begin(PhaseKind::Step, None).unwrap();
            std::fs::write(dir.join("ready"), b"").unwrap();
            wait_for(&dir.join("go"));
            for _ in 0..FLOOD {
                t.next(PhaseKind::Step, None).unwrap();
            }
            let ch = RunChannel::from_env().unwrap();
            let (kept, batched) = ch.pending();
            // Written whole before it appears: the test reads it at once.
            std::fs::write(
                dir.join("flooded.tmp"),
                format!("{} {} {kept} {batched}", ch.sent(), ch.dropped()),
            )
            .unwrap();
            std::fs::rename(dir.join("flooded.tmp"), dir.join("flooded")).unwrap();
            wait_for(&dir.join("resume"));
            t.end(PhaseKind::Step, None).unwrap();
            t.end(PhaseKind::Epoch, None).unwrap();
        }
        // An epoch of custom phases sent in one burst just before the
        // process exits, its tracker never dropped: the exit sends them.
        "phase-burst" => {
            let (_mem, mut t) = tracker();
            t.begin(PhaseKind::Epoch, None).unwrap();
            for _ in 0..BURST {
                t.begin(PhaseKind::Custom, Some("save")).unwrap();
                t.end(PhaseKind::Custom, Some("save")).unwrap();
            }
            t.end(PhaseKind::Epoch, None).unwrap();
            std::mem::forget(t);
            std::process::exit(0);
        }
        // LOAD.0 processes (this one and children) of steps of a few µs.
        "phase-load" => {
            let (argv, (k, v)) = crate::helper::argv(&["phase-load-one"]);
            let kids: Vec<_> = (1..LOAD.0)
                .map(|_| {
                    std::process::Command::new(&argv[0])
                        .args(&argv[1..])
                        .env(k, &v)
                        .spawn()
                        .unwrap()
                })
                .collect();
            load_one();
            for mut k in kids {
                assert!(k.wait().unwrap().success());
            }
        }
        "phase-load-one" => load_one(),
        // Workers as a launcher starts them, each with the variables
        // given as `NAME=value` words (every launcher's others removed).
        "phase-ranks" => {
            let workers: Vec<Vec<&str>> = words[1..]
                .split(|w| *w == "--")
                .map(<[&str]>::to_vec)
                .collect();
            let kids: Vec<_> = workers
                .iter()
                .map(|vars| {
                    let spike = vars.contains(&"spike");
                    let (argv, (k, v)) =
                        crate::helper::argv(&["phase-rank-one", if spike { "spike" } else { "-" }]);
                    let mut c = std::process::Command::new(&argv[0]);
                    c.args(&argv[1..]).env(k, &v);
                    for (rank, local, size) in LAUNCHERS {
                        c.env_remove(rank).env_remove(size);
                        if let Some(l) = local {
                            c.env_remove(l);
                        }
                    }
                    for kv in vars.iter().filter_map(|w| w.split_once('=')) {
                        c.env(kv.0, kv.1);
                    }
                    c.spawn().unwrap()
                })
                .collect();
            for mut k in kids {
                assert!(k.wait().unwrap().success());
            }
        }
        // One worker: two epochs of three steps, a 900 MiB spike in the
        // second step of epoch 0 with `spike`.
        "phase-rank-one" => {
            let (mem, mut t) = tracker();
            for epoch in 0..2 {
                t.begin(PhaseKind::Epoch, None).unwrap();
                t.begin(PhaseKind::Step, None).unwrap();
                for step in 0..3 {
                    std::thread::sleep(Duration::from_millis(5));
                    if words[1] == "spike" && (epoch, step) == (0, 1) {
                        mem.push(900 << 20).unwrap();
                        mem.push(64 << 20).unwrap();
                    }
                    if step < 2 {
                        t.next(PhaseKind::Step, None).unwrap();
                    }
                }
                t.end(PhaseKind::Step, None).unwrap();
                t.end(PhaseKind::Epoch, None).unwrap();
            }
        }
        other => panic!("unknown helper mode {other}"),
    }
}

#[test]
fn garbage_datagrams_are_counted_and_the_phases_still_arrive() {
    let (out, json) = run_helper_json(&[], &["phase-garbage"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_valid("docs/run-output.schema.json", &json);
    let c = &json["phase_channel"];
    assert_eq!((u(&c["garbled"]), u(&c["unknown_version"])), (3, 1), "{c}");
    assert!(u(&c["oversized"]) <= 1, "{c}");
    assert_eq!(u(&c["dropped"]), 0, "{c}");
    assert_eq!(c["processes"], serde_json::json!([json["pid"]]));
    let phases = json["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 1, "{phases:?}");
    assert_eq!(phases[0]["label"], "epoch 0");
    assert_eq!(u(&phases[0]["steps"]["count"]), 4);
    assert_eq!(u(&phases[0]["steps"]["peaks"][0]["index"]), 1);
    assert_eq!(c["peaks"][0]["label"], "epoch 0 / step 1");
    assert_eq!(u(&c["peaks"][0]["peak_bytes"]), 900 << 20);
    let text = stderr(&out);
    assert!(
        text.contains("peak mem              900 MiB in epoch 0, step 1 (#1 of its epoch), pushed"),
        "{text}"
    );
    assert!(text.contains("datagrams unreadable"), "{text}");
}

#[test]
fn a_memprobe_that_stops_reading_never_stalls_the_command_and_loses_no_step() {
    let dir = scratch("flood");
    let json = dir.join("run.json");
    let (argv, (k, v)) = crate::helper::argv(&["phase-flood", dir.to_str().unwrap()]);
    let memprobe = memprobe()
        .arg("run")
        .arg("--json")
        .arg(&json)
        .arg("--")
        .args(&argv)
        .env(k, v)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mp = memprobe.id() as libc::pid_t;
    wait_for(&dir.join("ready"));
    // SAFETY: stopping and continuing our own child.
    assert_eq!(unsafe { libc::kill(mp, libc::SIGSTOP) }, 0);
    std::fs::write(dir.join("go"), b"").unwrap();
    // The flood must finish while memprobe reads nothing at all.
    wait_for(&dir.join("flooded"));
    let counts = std::fs::read_to_string(dir.join("flooded")).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(mp, libc::SIGCONT) }, 0);
    std::fs::write(dir.join("resume"), b"").unwrap();
    let out = memprobe.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Vec<u64> = counts.split(' ').map(|w| w.parse().unwrap()).collect();
    let (sent, dropped, kept, batched) = (v[0], v[1], v[2], v[3]);
    // The flood went out in batches of steps, which waited; none was lost.
    assert_eq!(dropped, 0, "{counts}");
    assert!(sent + kept < 200, "{counts}");
    assert!(batched < FLOOD, "{counts}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_valid("docs/run-output.schema.json", &v);
    let c = &v["phase_channel"];
    assert_eq!((u(&c["dropped"]), u(&c["dropped_steps"])), (0, 0), "{c}");
    assert_eq!(v["phases"][0]["ended"], true);
    assert_eq!(u(&v["phases"][0]["steps"]["count"]), FLOOD + 1);
    let text = stderr(&out);
    assert!(!text.contains("lost"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_burst_of_phases_at_exit_arrives_whole() {
    for _ in 0..3 {
        let (out, json) = run_helper_json(&[], &["phase-burst"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let c = &json["phase_channel"];
        assert_eq!(u(&c["received"]), 2 * BURST + 2, "{c}");
        assert_eq!(u(&c["dropped"]), 0, "{c}");
        let phases = json["phases"].as_array().unwrap();
        assert_eq!(phases.len() as u64, BURST + 1, "{phases:?}");
        assert!(phases.iter().all(|p| p["ended"] == true), "{phases:?}");
        assert_eq!(phases[0]["label"], "epoch 0");
        assert!(!stderr(&out).contains("lost"), "{}", stderr(&out));
    }
}

#[test]
fn under_load_every_epoch_arrives_and_only_steps_could_be_lost() {
    let (out, json) = run_helper_json(&[], &["phase-load"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_valid("docs/run-output.schema.json", &json);
    let c = &json["phase_channel"];
    assert_eq!(
        c["processes"].as_array().unwrap().len() as u64,
        LOAD.0,
        "{c}"
    );
    let phases = json["phases"].as_array().unwrap();
    let of = |name: &str| phases.iter().filter(|p| p["name"] == name).count() as u64;
    assert_eq!(of("epoch"), LOAD.0 * LOAD.1, "{c}");
    assert_eq!(of("validation"), LOAD.0 * LOAD.1, "{c}");
    assert!(phases.iter().all(|p| p["ended"] == true));
    // Every step is counted: received, or lost in a batch and said so.
    let steps = LOAD.0 * LOAD.1 * LOAD.2;
    assert_eq!(u(&c["steps"]) + u(&c["dropped_steps"]), steps, "{c}");
    for p in phases.iter().filter(|p| p["name"] == "epoch") {
        assert!(
            p["sources"].as_array().is_some_and(|s| !s.is_empty()),
            "{p}"
        );
    }
    // Batched: far fewer messages than steps.
    assert!(u(&c["received"]) < steps / 10, "{c}");
}

#[test]
fn a_launchers_ranks_name_its_workers_and_their_spread_is_shown() {
    let (out, json) = run_helper_json(
        &[],
        &[
            "phase-ranks",
            "RANK=0",
            "LOCAL_RANK=0",
            "WORLD_SIZE=2",
            "--",
            "RANK=1",
            "LOCAL_RANK=1",
            "WORLD_SIZE=2",
            "spike",
        ],
    );
    let text = stderr(&out);
    assert!(out.status.success(), "{text}");
    assert_valid("docs/run-output.schema.json", &json);
    let c = &json["phase_channel"];
    let ranks = c["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{c}");
    let pid_of = |rank: u64| u(&ranks.iter().find(|r| u(&r["rank"]) == rank).unwrap()["pid"]);
    let (p0, p1) = (pid_of(0), pid_of(1));
    assert_eq!(u(&ranks[0]["world_size"]), 2);
    for p in json["phases"].as_array().unwrap() {
        let want = if u(&p["pid"]) == p1 { 1 } else { 0 };
        assert_eq!(u(&p["rank"]), want, "{p}");
        assert_eq!(u(&p["local_rank"]), want, "{p}");
    }
    let spread = c["rank_spread"].as_array().unwrap();
    let e0 = spread.iter().find(|s| s["label"] == "epoch 0").unwrap();
    assert_eq!((u(&e0["max_rank"]), u(&e0["min_rank"])), (1, 0), "{e0}");
    assert_eq!((u(&e0["max_pid"]), u(&e0["min_pid"])), (p1, p0), "{e0}");
    assert_eq!(
        (u(&e0["max_bytes"]), u(&e0["min_bytes"])),
        (900 << 20, 64 << 20)
    );
    assert_eq!(e0["spread_percent"].as_f64().map(f64::round), Some(1306.0));
    let e1 = spread.iter().find(|s| s["label"] == "epoch 1").unwrap();
    assert_eq!(e1["spread_percent"].as_f64(), Some(0.0), "{e1}");
    let steps = spread.iter().find(|s| s["label"] == "steps").unwrap();
    assert_eq!(steps["max_step"], "epoch 0 / step 1", "{steps}");
    for needle in [
        format!("pid {p0} (rank 0), pid {p1} (rank 1)"),
        format!("(pid {p1}, rank 1), pushed"),
        "rank spread           epoch 0: max rank 1 900 MiB, min rank 0 64.0 MiB, spread +1306 % (mem, 2 ranks)".into(),
        "rank spread           steps: max rank 1 900 MiB (epoch 0, step 1)".into(),
    ] {
        assert!(text.contains(&needle), "no {needle:?} in\n{text}");
    }
}

#[test]
fn ranks_that_do_not_hold_are_left_out_and_the_run_looks_as_before() {
    let (out, json) = run_helper_json(
        &[],
        &[
            "phase-ranks",
            "RANK=one",
            "WORLD_SIZE=2",
            "--",
            "RANK=2",
            "WORLD_SIZE=2",
            "--",
            "RANK=-1",
            "WORLD_SIZE=2",
            "--",
            "RANK=1",
            "--",
            "OMPI_COMM_WORLD_RANK=0",
            "OMPI_COMM_WORLD_SIZE=",
            "spike",
        ],
    );
    let text = stderr(&out);
    assert!(out.status.success(), "{text}");
    assert_valid("docs/run-output.schema.json", &json);
    let c = &json["phase_channel"];
    assert_eq!(c["processes"].as_array().unwrap().len(), 5, "{c}");
    assert_eq!(json["phases"].as_array().unwrap().len(), 10, "{c}");
    // (A checkout's path may hold the word: keys and phrases only.)
    let all = json.to_string();
    for key in [
        r#""rank":"#,
        r#""ranks":"#,
        r#""world_size":"#,
        "rank_spread",
    ] {
        assert!(!all.contains(key), "{key} in {all}");
    }
    for phrase in ["(rank ", ", rank ", "rank spread", "RANK"] {
        assert!(!text.contains(phrase), "{phrase} in {text}");
    }
    assert!(text.contains("10 epochs, 30 steps from pids "), "{text}");
}
